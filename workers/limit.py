"""One queue's QLIMIT limits and what they count (workers/limits.py says what
QLIMIT does; the core, workers/core.py, applies them). Pure data and arithmetic:
time comes in as ``now_ms``."""

from __future__ import annotations

import struct
from typing import Final

from workers.ids import slot_of
from workers.job import Job, queue_name_bytes_max

# The largest value a limit may take at all: config qlimit-value-max is at most
# this, and a peer's QLIMIT message past it is malformed (a u32 in the AOF record).
limit_value_limit: Final = 1_000_000_000
# An AOF record of a queue's limits starts with this tag (a job record starts with
# its version, a deletion record with 0x80).
LIMIT_RECORD_TAG: Final = 0x81
_MILLI: Final = 1000  # tokens are counted in thousandths, so refills stay integers


# tag, version, ACTIVE, RATE, GROUP-ACTIVE (u32 each), then the queue name
_RECORD: Final = struct.Struct(">BBIII")
_RECORD_VERSION: Final = 1


def limit_record(queue: bytes, active: int, rate: int, group_active: int) -> bytes:
    """A queue's limits as an AOF record (all 0: the limits were reset)."""
    return _RECORD.pack(LIMIT_RECORD_TAG, _RECORD_VERSION, active, rate, group_active) + queue


def parse_limit_record(rec: bytes) -> tuple[bytes, int, int, int]:
    """(queue, ACTIVE, RATE, GROUP-ACTIVE) of a limit record; ValueError when malformed."""
    if len(rec) < _RECORD.size or rec[0] != LIMIT_RECORD_TAG:
        raise ValueError("not a limit record")
    _, version, active, rate, group_active = _RECORD.unpack_from(rec)
    if version != _RECORD_VERSION:
        raise ValueError(f"unsupported limit record version {version}")
    queue = bytes(rec[_RECORD.size:])
    if not queue or len(queue) > queue_name_bytes_max:
        raise ValueError("limit record: bad queue name")
    if max(active, rate, group_active) > limit_value_limit:
        raise ValueError("limit record: a limit out of range")
    return queue, active, rate, group_active


def slot_of_limit_record(rec: bytes) -> int:
    """The slot of a limit record's queue (the AOF loader keeps its own slots' only)."""
    return slot_of(parse_limit_record(rec)[0])


class Limit:
    """ACTIVE, RATE and GROUP-ACTIVE of one queue on this node (0: none), the token
    bucket of RATE (``milli_tokens`` as of ``refill_ms``) and, per group, the jobs
    delivered while the queue had limits and not yet done (``counted``, ``groups``)."""

    __slots__ = ("active", "rate", "group_active", "milli_tokens", "refill_ms",
                 "groups", "counted", "over")

    def __init__(self, now_ms: int) -> None:
        self.active = 0
        self.rate = 0
        self.group_active = 0
        self.milli_tokens = 0
        self.refill_ms = now_ms
        self.groups: dict[bytes, int] = {}  # group -> jobs counted
        self.counted: dict[Job, bytes] = {}  # job -> its group
        # Jobs delivered past ACTIVE before it was lowered to its value (the check
        # allows them until the next delivery, which needs room below ACTIVE).
        self.over = 0

    def change(self, active: int, rate: int, group_active: int, in_use: int, now_ms: int) -> None:
        """New limits; ``in_use``: the queue's jobs delivered and not done now."""
        if rate != self.rate:
            self.milli_tokens = rate * _MILLI  # a new RATE starts with a full bucket
            self.refill_ms = now_ms
        self.active = active
        self.rate = rate
        self.group_active = group_active
        self.over = in_use - active if active and in_use > active else 0

    def _refill(self, now_ms: int) -> None:
        elapsed = now_ms - self.refill_ms
        if elapsed > 0:
            full = self.rate * _MILLI
            t = self.milli_tokens + elapsed * self.rate
            self.milli_tokens = t if t < full else full
            self.refill_ms = now_ms

    def tokens(self, now_ms: int) -> int:
        """Whole tokens now (-1: no RATE)."""
        if not self.rate:
            return -1
        self._refill(now_ms)
        return self.milli_tokens // _MILLI

    def room(self, in_use: int, now_ms: int) -> int:
        """How many deliveries ACTIVE and RATE allow now (GROUP-ACTIVE apart)."""
        n = limit_value_limit
        if self.active:
            n = self.active - in_use
        if self.rate:
            t = self.tokens(now_ms)
            if t < n:
                n = t
        return n

    def next_token_ms(self, now_ms: int) -> int:
        """When the next whole token is due (RATE set, the bucket short of one)."""
        missing = _MILLI - self.milli_tokens % _MILLI
        return now_ms + (missing + self.rate - 1) // self.rate

    def full_groups(self) -> set[bytes]:
        """The groups at GROUP-ACTIVE (none without it)."""
        g = self.group_active
        if not g:
            return set()
        return {name for name, n in self.groups.items() if n >= g}

    def took(self, job: Job, group: bytes) -> bool:
        """``job`` of ``group`` was delivered; True when its group is now full."""
        self.counted[job] = group
        n = self.groups.get(group, 0) + 1
        self.groups[group] = n
        if self.rate:
            self.milli_tokens -= _MILLI
        self.over = 0  # a delivery had room: the queue is within ACTIVE from now on
        return bool(self.group_active) and n >= self.group_active

    def release(self, job: Job) -> None:
        """``job``'s delivery ended (acked, queued again, gone, moved)."""
        group = self.counted.pop(job, None)
        if group is not None:
            n = self.groups[group] - 1
            if n:
                self.groups[group] = n
            else:
                del self.groups[group]

    def counts(self, job: Job) -> bool:
        return job in self.counted
