"""Slots and job IDs (DESIGN.md, "Ownership: slots and job IDs").

Job ID: ``D-`` + 8 hex of the node ID + ``-`` + 24 chars base64 of 18 bytes + ``-``
+ 4 hex of the TTL in minutes (odd when RETRY > 0, even for at-most-once jobs).
The first 2 of the 18 bytes carry the slot, so the owner of any job-addressed
command is found from the ID alone.
"""

from __future__ import annotations

import base64
import binascii
import re

from blake3 import blake3

SLOTS = 16384
JOB_ID_LEN = 40
_ID_RE = re.compile(rb"\AD-[0-9a-fA-F]{8}-[A-Za-z0-9+/]{24}-[0-9a-fA-F]{4}\Z")


def slot_of(queue: bytes) -> int:
    """The slot of a queue name: first 2 bytes of blake3(name), mod 16384."""
    return int.from_bytes(blake3(queue).digest()[:2], "big") % SLOTS


def owner_of_slot(slot: int, workers: int) -> int:
    return slot % workers


def owner_of_queue(queue: bytes, workers: int) -> int:
    return slot_of(queue) % workers


def is_valid_job_id(job_id: bytes | str) -> bool:
    raw = job_id.encode() if isinstance(job_id, str) else job_id
    return len(raw) == JOB_ID_LEN and _ID_RE.match(raw) is not None


def slot_of_job_id(job_id: str) -> int:
    """Slot carried by a valid job ID (IDs minted elsewhere may carry any 16 bits)."""
    try:
        raw = base64.b64decode(job_id[11:35], validate=True)
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


class JobIdGen:
    """Mints job IDs: 16 pseudo-random bytes are blake3(seed || counter)."""

    __slots__ = ("_prefix", "_seed", "_counter")

    def __init__(self, node_id: str, seed: bytes) -> None:
        self._prefix = "D-" + node_id[:8] + "-"
        self._seed = seed
        self._counter = 0

    def make(self, slot: int, ttl_s: int, retry_s: int) -> str:
        self._counter += 1
        rand = blake3(self._seed + self._counter.to_bytes(8, "big")).digest()[:16]
        mid = base64.b64encode(slot.to_bytes(2, "big") + rand).decode()
        return f"{self._prefix}{mid}-{ttl_minutes_field(ttl_s, retry_s):04x}"
