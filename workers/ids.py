"""Slots and job IDs (docs/architecture.md, "Invariants").

Job ID: ``D-`` + 8 hex of the node ID + ``-`` + 24 chars base64 of 18 bytes + ``-``
+ 4 hex of the TTL in minutes (odd when RETRY > 0, even for at-most-once jobs).
The first 2 of the 18 bytes carry the slot, so the owner of any job-addressed
command is found from the ID alone.
"""

from __future__ import annotations

import binascii
from typing import Final

from blake3 import blake3

SLOTS = 16384
JOB_ID_LEN = 40
# MAXDELIVER's dead-letter queue of queue q is dead:q (clients and brokers read it
# through disque_mp/client/limits.py).
DEAD_PREFIX: Final = b"dead:"
_DEAD_PREFIX_LEN: Final = len(DEAD_PREFIX)

# A job ID is checked a byte at a time against two 256-entry tables (every ACKJOB
# checks each of its IDs, and a regex match cost ten times this loop): _CLASS gives
# each byte's classes, _SHAPE the class each of the 40 positions needs.
_HEX: Final = 1  # [0-9a-fA-F]
_B64: Final = 2  # [A-Za-z0-9+/], standard base64 without padding
_DASH: Final = 4
_D: Final = 8


def _classes() -> bytes:
    table = bytearray(256)
    for c in b"0123456789abcdefABCDEF":
        table[c] |= _HEX
    for c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/":
        table[c] |= _B64
    table[ord("-")] |= _DASH
    table[ord("D")] |= _D
    return bytes(table)


def _b64_values() -> bytes:
    """Each base64 character's 6-bit value (0 for any other byte: never read)."""
    table = bytearray(256)
    for i, c in enumerate(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"):
        table[c] = i
    return bytes(table)


_CLASS: Final = _classes()
_B64_VALUE: Final = _b64_values()
_SHAPE: Final = bytes([_D, _DASH] + [_HEX] * 8 + [_DASH] + [_B64] * 24 + [_DASH] + [_HEX] * 4)


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
    """``D-`` + 8 hex + ``-`` + 24 base64 + ``-`` + 4 hex, nothing else (-BADID otherwise)."""
    raw = job_id.encode() if isinstance(job_id, str) else job_id
    return slot_of_valid_id(raw) >= 0


def slot_of_valid_id(raw: bytes) -> int:
    """The slot of a well-formed job ID, or -1 when ``raw`` is not one: the check and
    the owner of an ACKJOB's ID in one pass over its bytes."""
    if len(raw) != JOB_ID_LEN:
        return -1
    for i in range(JOB_ID_LEN):
        if not _CLASS[raw[i]] & _SHAPE[i]:
            return -1
    return _slot_bits(_B64_VALUE[raw[11]], _B64_VALUE[raw[12]], _B64_VALUE[raw[13]])


def _slot_bits(c0: int, c1: int, c2: int) -> int:
    """The first 16 bits of the decoded part (6 + 6 + the top 4 of the third
    character's 6), mod SLOTS."""
    return ((c0 << 10) | (c1 << 4) | (c2 >> 2)) % SLOTS


def slot_of_job_id(job_id: str) -> int:
    """Slot carried by a valid job ID (IDs minted elsewhere may carry any 16 bits).

    The answer for any string is the first 2 bytes of the strict base64 decoding
    of ``job_id[11:35]`` (0 where it does not decode): when those are 24 base64
    characters, read from the first three through a table; any other string takes
    the decoder (tests/workers/test_ids_props.py holds both to the decoder)."""
    if len(job_id) >= 35:
        for i in range(11, 35):
            c = ord(job_id[i])
            if c > 127 or not _CLASS[c] & _B64:
                return _slot_decoded(job_id)
        return _slot_bits(_B64_VALUE[ord(job_id[11])], _B64_VALUE[ord(job_id[12])],
                          _B64_VALUE[ord(job_id[13])])
    return _slot_decoded(job_id)


def _slot_decoded(job_id: str) -> int:
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
