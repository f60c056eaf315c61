"""Slots and job IDs (docs/architecture.md, "Invariants").

Job ID: ``D-`` + 8 hex of the node ID + ``-`` + 24 chars base64 of 18 bytes + ``-``
+ 4 hex of the TTL in minutes (odd when RETRY > 0, even for at-most-once jobs).
The first 2 of the 18 bytes carry the slot, so the owner of any job-addressed
command is found from the ID alone.
"""

from __future__ import annotations

import binascii
import re
from typing import Final

from blake3 import blake3

SLOTS = 16384
JOB_ID_LEN = 40
# MAXDELIVER's dead-letter queue of queue q is dead:q (clients and brokers read it
# through disque_mp/client/limits.py).
DEAD_PREFIX: Final = b"dead:"
_DEAD_PREFIX_LEN: Final = len(DEAD_PREFIX)
_ID_RE = re.compile(rb"\AD-[0-9a-fA-F]{8}-[A-Za-z0-9+/]{24}-[0-9a-fA-F]{4}\Z")
_id_match = _ID_RE.match  # bound once: IDs are checked on every ACKJOB


def slot_of(queue: bytes) -> int:
    """The slot of a queue name: first 2 bytes of blake3(name), mod 16384.

    A dead-letter queue ``dead:<q>`` has the slot of ``<q>``: MAXDELIVER moves a
    job there with its ID (which carries ``<q>``'s slot), so both queues must have
    one owner (as a Redis Cluster hash tag does)."""
    if queue[:_DEAD_PREFIX_LEN] == DEAD_PREFIX:
        queue = queue[_DEAD_PREFIX_LEN:]
    return int.from_bytes(blake3(queue).digest()[:2], "big") % SLOTS


def owner_of_slot(slot: int, workers: int) -> int:
    return slot % workers


def owner_of_queue(queue: bytes, workers: int) -> int:
    return slot_of(queue) % workers


def is_valid_job_id(job_id: bytes | str) -> bool:
    raw = job_id.encode() if isinstance(job_id, str) else job_id
    return len(raw) == JOB_ID_LEN and _id_match(raw) is not None


def slot_of_job_id(job_id: str) -> int:
    """Slot carried by a valid job ID (IDs minted elsewhere may carry any 16 bits)."""
    try:  # base64.b64decode(validate=True) in C: the same answers, a third of the time
        raw = binascii.a2b_base64(job_id[11:35], strict_mode=True)
    except binascii.Error:
        return 0
    return int.from_bytes(raw[:2], "big") % SLOTS


def owner_of_job_id(job_id: str, workers: int) -> int:
    return slot_of_job_id(job_id) % workers


def is_at_most_once_id(job_id: str) -> bool:
    """TTL field is even for RETRY 0 jobs (spec, "Job IDs")."""
    return int(job_id[36:40], 16) % 2 == 0


def ttl_minutes_field(ttl_s: int, retry_s: int) -> int:
    minutes = min(ttl_s // 60, 0xFFFF)
    if retry_s > 0:
        minutes |= 1
    else:
        minutes &= ~1
    return minutes & 0xFFFF


# Random parts drawn per blake3 call: ADDJOB is hot and one hash costs about as
# much as the rest of make(), so the XOF output of blake3(seed || block) gives
# the 16-byte parts of 64 consecutive IDs (still unique and seed-determined).
id_batch = 64
id_suffix_cache_max = 1024  # distinct (TTL, at-most-once) suffixes kept; cleared when full


class JobIdGen:
    """Mints job IDs: 16 pseudo-random bytes per ID from blake3(seed || counter // 64)."""

    __slots__ = ("_prefix", "_seed", "_counter", "_pool", "_suffix")

    def __init__(self, node_id: str, seed: bytes) -> None:
        self._prefix = "D-" + node_id[:8] + "-"
        self._seed = seed
        self._counter = 0
        self._pool = b""
        self._suffix: dict[int, str] = {}

    def make(self, slot: int, ttl_s: int, retry_s: int) -> str:
        c = self._counter
        self._counter = c + 1
        i = (c % id_batch) * 16
        if i == 0:
            block = (c // id_batch).to_bytes(8, "big")
            self._pool = blake3(self._seed + block).digest(16 * id_batch)
        mid = binascii.b2a_base64(slot.to_bytes(2, "big") + self._pool[i : i + 16], newline=False)
        key = ttl_s if retry_s else -ttl_s
        suffix = self._suffix.get(key)
        if suffix is None:
            if len(self._suffix) >= id_suffix_cache_max:
                self._suffix.clear()
            suffix = self._suffix[key] = f"-{ttl_minutes_field(ttl_s, retry_s):04x}"
        return self._prefix + mid.decode() + suffix
