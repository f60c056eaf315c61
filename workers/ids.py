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

SLOTS: Final = 16384
JOB_ID_LEN: Final = 40
# MAXDELIVER's dead-letter queue of queue q is dead:q (clients and brokers read it
# through disque_mp/client/limits.py).
DEAD_PREFIX: Final = b"dead:"
_DEAD_PREFIX_LEN: Final = len(DEAD_PREFIX)

# A job ID is checked through two 256-entry byte tables with bytes.translate (C; every
# ACKJOB checks each of its IDs: 1.4k instructions compiled, where a regex match or a
# compiled loop over the 40 bytes took 3.1k): _AS_B64 writes each base64 character as
# b"b" and a dash as b"-", _AS_HEX each hex digit as b"h"; anything else becomes b".".
# The slot comes from the first three base64 characters through _B64_VALUE.
_B64_ALPHABET: Final = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _table(*classes: tuple[bytes, bytes]) -> bytes:
    """A bytes.translate table: each member of a class written as its code, any other
    byte as b"."."""
    table = bytearray(b"." * 256)
    for members, code in classes:
        for c in members:
            table[c] = code[0]
    return bytes(table)


def _b64_values() -> bytes:
    """Each base64 character's 6-bit value (0 for any other byte: never read)."""
    table = bytearray(256)
    for i, c in enumerate(_B64_ALPHABET):
        table[c] = i
    return bytes(table)


_AS_B64: Final = _table((_B64_ALPHABET, b"b"), (b"-", b"-"))
_AS_HEX: Final = _table((b"0123456789abcdefABCDEF", b"h"))
_B64_VALUE: Final = _b64_values()
_SHAPE_B64: Final = b"b-bbbbbbbb-" + b"b" * 24 + b"-bbbb"  # a valid ID through _AS_B64
_SHAPE_MID: Final = b"b" * 24


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
    the owner of an ACKJOB's ID in one call on its bytes."""
    if len(raw) != JOB_ID_LEN or raw[0] != 68 or raw.translate(_AS_B64) != _SHAPE_B64:
        return -1  # not D, a dash out of place, or not base64 (a hex digit is base64)
    hexes = raw.translate(_AS_HEX)
    if not hexes.endswith(b"hhhh") or hexes[2:10] != b"hhhhhhhh":
        return -1
    return _slot_bits(raw)


def _slot_bits(raw: bytes) -> int:
    """The first 16 bits of an ID's base64 part (characters 11-13: 6 + 6 + the top 4
    of the third's 6), mod SLOTS; the caller has checked they are base64."""
    return ((_B64_VALUE[raw[11]] << 10) | (_B64_VALUE[raw[12]] << 4) | (_B64_VALUE[raw[13]] >> 2)) % SLOTS


def slot_of_job_id(job_id: str) -> int:
    """Slot carried by a valid job ID (IDs minted elsewhere may carry any 16 bits).

    The answer for any string is the first 2 bytes of the strict base64 decoding
    of ``job_id[11:35]`` (0 where it does not decode): when those are 24 base64
    characters, read from the first three through a table; any other string takes
    the decoder (tests/workers/test_ids_props.py holds both to the decoder)."""
    if len(job_id) >= 35 and job_id.isascii():
        raw = job_id.encode()
        if raw[11:35].translate(_AS_B64) == _SHAPE_MID:
            return _slot_bits(raw)
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
# the random parts of 64 consecutive IDs (still unique and seed-determined).
ID_BATCH: Final = 64
# Distinct (TTL, at-most-once) suffixes kept; cleared when full. The last one is held
# apart too: most producers send one TTL, and a compare of two native ints is cheaper
# than a dict's lookup of a boxed one.
ID_SUFFIX_CACHE_MAX: Final = 1024
_NO_KEY: Final = -(1 << 60)  # no (TTL, at-most-once) key: the first make() looks it up
_B64_CHARS: Final = _B64_ALPHABET.decode()
# The first two base64 characters of an ID's middle part are the top 12 bits of its slot.
_SLOT_PAIRS: Final = [_B64_CHARS[i >> 6] + _B64_CHARS[i & 63] for i in range(4096)]
_TAIL_BYTES: Final = 15  # random bytes per ID encoded with the block: 20 characters
_TAIL_CHARS: Final = 20


class JobIdGen:
    """Mints job IDs: 128 pseudo-random bits per ID from blake3(seed || counter // 64).

    The middle part is the base64 of 18 bytes, the slot's 2 and 16 random ones; written
    as characters it is the slot's top 12 bits (2 characters), its low 4 bits with 2
    random ones (1), then 21 random characters. Per block of 64 IDs one XOF output: 15
    bytes an ID encoded at once into the last 20 characters of each (15 bytes are 20
    characters exactly, so each ID's share is aligned), and 1 byte an ID for the 8 bits
    of its third and fourth characters."""

    __slots__ = ("_prefix", "_seed", "_counter", "_tails", "_heads", "_suffix", "_last_key",
                 "_last_suffix")

    def __init__(self, node_id: str, seed: bytes) -> None:
        self._prefix = "D-" + node_id[:8] + "-"
        self._seed = seed
        self._counter = 0
        self._tails = ""
        self._heads = b""
        self._suffix: dict[int, str] = {}
        self._last_key = _NO_KEY
        self._last_suffix = ""

    def make(self, slot: int, ttl_s: int, retry_s: int) -> str:
        c = self._counter
        self._counter = c + 1
        i = c % ID_BATCH
        if i == 0:
            block = (c // ID_BATCH).to_bytes(8, "big")
            pool = blake3(self._seed + block).digest((_TAIL_BYTES + 1) * ID_BATCH)
            tail_end = _TAIL_BYTES * ID_BATCH
            self._tails = binascii.b2a_base64(pool[:tail_end], newline=False).decode()
            self._heads = pool[tail_end:]
        r = self._heads[i]
        t = i * _TAIL_CHARS
        key = ttl_s if retry_s else -ttl_s
        if key == self._last_key:
            suffix = self._last_suffix
        else:
            suffix = self._suffix_of(key, ttl_s, retry_s)
        return (f"{self._prefix}{_SLOT_PAIRS[slot >> 4]}{_B64_CHARS[((slot & 15) << 2) | (r >> 6)]}"
                f"{_B64_CHARS[r & 63]}{self._tails[t:t + _TAIL_CHARS]}{suffix}")

    def _suffix_of(self, key: int, ttl_s: int, retry_s: int) -> str:
        suffix = self._suffix.get(key)
        if suffix is None:
            if len(self._suffix) >= ID_SUFFIX_CACHE_MAX:
                self._suffix.clear()
            suffix = self._suffix[key] = f"-{ttl_minutes_field(ttl_s, retry_s):04x}"
        self._last_key = key
        self._last_suffix = suffix
        return suffix
