"""Results by a key of the caller's (a Celery, Dramatiq or Taskiq task ID), over
disque-mp's RESULT extensions (docs/extensions.md, "Results"): what the brokers'
result backends use.

A node keeps a result by job ID (``ACKJOB id RESULT value``, ``RESULT id``), and a
framework asks by its own task ID. The key finds its job through an idempotent add:
``ADDJOB <results queue> "" 0 DEDUP <key> DEDUP-KEEP <ttl>`` answers the ID of the
job that holds the key (held until its ACK, kept ``ttl`` seconds after it), and adds
that job when none does: a *result slot*, a job nobody consumes (DELAY and RETRY
past its TTL), made by whichever of the worker and the waiting client asks first.
So:

- ``set(key, value)``: ACKJOB slot RESULT value (the slot is done, the value kept
  ``result-ttl`` on every node that holds the slot, and its key keeps naming it);
- ``progress(key, value)``: WORKING slot PROGRESS value (a pending slot);
- ``get(key, timeout_ms)``: RESULT slot [TIMEOUT ms]: the value, ``Progress``, None;
  with a timeout it blocks on the node until ``set`` acknowledges the slot.

Cluster-wide as DEDUP is: every node that holds a copy of the slot knows its key
(the slot is replicated as any job, by default to min(3, cluster size) nodes), so
clients that use nodes holding no copy may make two slots for one key: then a
``get`` there answers null until its own slot is done. With up to three nodes, or
clients of one node, one key has one slot.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

from disque_mp.client.core import DisqueError, NoJobError, Progress, TooLateError
from disque_mp.client.limits import DEDUP_BYTES_MAX

results_queue_default: Final = "disque-mp.results"
# A slot's TTL when the framework names none: a day (Celery's result_expires).
slot_ttl_default_s: Final = 24 * 3600
# DEDUP-KEEP at most this (the node's dedup-keep-max default, 7 days).
slot_keep_max_s: Final = 7 * 24 * 3600


def slot_key(key: str) -> str:
    """The DEDUP key of ``key`` (its SHA-256 past DEDUP's 256 bytes)."""
    if len(key.encode()) > DEDUP_BYTES_MAX:
        return "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    return key


def slot_args(queue: str, key: str, ttl_s: int) -> list[Any]:
    """The ADDJOB that answers the slot of ``key`` (adds it when none holds the key):
    never queued (DELAY one second short of its TTL), never requeued (RETRY its TTL),
    kept after its ACK as long as its TTL (DEDUP-KEEP)."""
    ttl_s = max(2, int(ttl_s))
    return ["ADDJOB", queue, b"", 0, "TTL", ttl_s, "DELAY", ttl_s - 1, "RETRY", ttl_s,
            "DEDUP", slot_key(key), "DEDUP-KEEP", min(ttl_s, slot_keep_max_s)]


def value_of(reply: Any) -> bytes | Progress | None:
    """A RESULT answer as ``get`` gives it (``parse_result``'s)."""
    if isinstance(reply, Progress) or reply is None or isinstance(reply, bytes):
        return reply
    return bytes(reply)


class Slots:
    """What both forms hold: the client, the slots' queue, a new slot's TTL."""

    def __init__(self, client: Any, queue: str = results_queue_default,
                 ttl_s: int = slot_ttl_default_s) -> None:
        self.client = client
        self.queue = queue
        self.ttl_s = ttl_s

    def slot_command(self, key: str) -> list[Any]:
        return slot_args(self.queue, key, self.ttl_s)


def _text(reply: Any) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)


class KeyedResults(Slots):
    """Results by key over a sync client (``disque_mp.client.Disque``)."""

    def job_of(self, key: str) -> str:
        """The result slot's job ID (added when no job holds the key)."""
        return _text(self.client.execute(*self.slot_command(key)))

    def set(self, key: str, value: bytes) -> bool:
        """Store the final value; False when the slot was done already (the first
        value stays: a task run twice does not overwrite its result)."""
        return bool(self.client.ack(self.job_of(key), result=value))

    def progress(self, key: str, value: bytes) -> bool:
        """Record a pending key's progress; False when it is done already."""
        try:
            self.client.working(self.job_of(key), progress=value)
        except (NoJobError, TooLateError):
            return False
        return True

    def get(self, key: str, timeout_ms: int | None = None) -> bytes | Progress | None:
        """The value, ``Progress(value)`` while pending with progress, or None;
        ``timeout_ms``: wait for a pending key (0: until it is done)."""
        return value_of(self.client.result(self.job_of(key), timeout_ms=timeout_ms))


class AsyncKeyedResults(Slots):
    """``KeyedResults`` over the asyncio client (``disque_mp.aclient.AsyncDisque``)."""

    async def job_of(self, key: str) -> str:
        return _text(await self.client.execute(*self.slot_command(key)))

    async def set(self, key: str, value: bytes) -> bool:
        return bool(await self.client.ack(await self.job_of(key), result=value))

    async def progress(self, key: str, value: bytes) -> bool:
        try:
            await self.client.working(await self.job_of(key), progress=value)
        except (NoJobError, TooLateError):
            return False
        return True

    async def get(self, key: str, timeout_ms: int | None = None) -> bytes | Progress | None:
        return value_of(await self.client.result(await self.job_of(key), timeout_ms=timeout_ms))


__all__ = ["AsyncKeyedResults", "DisqueError", "KeyedResults", "Progress", "slot_args"]
