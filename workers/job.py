"""The job record and its persisted form.

A job is the unit of work a shard keeps: about a million of them may be
queued at once, so the record is a plain slotted class whose fields point at
shared objects wherever possible:

- ``queue`` is the canonical name object of the queue (not the command's copy),
- ``delivered``/``confirmed`` are tuples shared between jobs (the shard keeps
  one ``(my_node_id,)`` tuple for every job it created),
- ``awake_ms`` is the key object of the timer bucket the job sits in,
- ``nodes`` is the pair (delivered, confirmed), shared between jobs with the
  same pair (every job created here starts with ``((my_id,), ())``),
- DELAY and MAXDELIVER live in the high bits of ``flags`` (0 for nearly every
  job, so flags stay a cached small int),
- the extension fields a few jobs carry (GROUP, DEDUP, a dead-letter reason) sit
  in one ``ext`` object, None for every other job,
- states, counters and flags are small ints (cached by CPython),
- the creation time is kept in microseconds (``ctime_us``): below 2**60 it is a
  2-digit int (32 bytes) where nanoseconds need 3 digits (48 bytes with
  pymalloc's rounding). ``ctime_ns`` (SHOW, records) is derived.

The expire time is not stored: it is ``ctime_ms + ttl_s * 1000`` (the creator's
clock, so every copy of a job expires at the same instant).
"""

from __future__ import annotations

import struct
from typing import Final

from workers.invariant import InvariantError

# Job states (the spec's state machine). Small ints: compared on hot paths.
WAIT_REPL: Final = 0
ACTIVE: Final = 1
QUEUED: Final = 2
ACKED: Final = 3
DELETED: Final = 4  # unregistered: any stale reference to the record must ignore it

STATE_NAMES = ("wait-repl", "active", "queued", "acked", "deleted")
STATE_BY_NAME = {name: i for i, name in enumerate(STATE_NAMES[:4])}

# Disque's state machine: the states a job enters a shard's table in, and the
# moves it may make there (``Job.move`` checks each one; any other is a bug).
# wait-repl: an ADDJOB waiting for its copies; active: created, copied here from
# another node, loaded from the AOF; acked: a dummy ACK (an ACK of an unknown job).
ENTRY_STATES: Final = (WAIT_REPL, ACTIVE, ACKED)
MOVES: Final = (
    # wait-repl: replicated (queued next, or waits its DELAY); acknowledged before
    # its copies were confirmed; deleted (timeout, TTL, DELJOB, FLUSHALL)
    (ACTIVE, ACKED, DELETED),
    # active: queued (DELAY or RETRY elapsed, NACK, ENQUEUE, a peer's ENQUEUE,
    # YOURJOBS, a GETJOB giving it back); acknowledged; deleted (TTL, FASTACK, DELJOB)
    (QUEUED, ACKED, DELETED),
    # queued: delivered, or taken out of the queue (DEQUEUE, WORKING, a peer's
    # QUEUED or WORKING, moved by YOURJOBS, an ACK: active first); deleted
    (ACTIVE, DELETED),
    # acked: deleted (the GC completed or gave up, TTL)
    (DELETED,),
    # deleted: final (a stale timer or queue entry may still point at the record)
    (),
)
# The table as bits of one small int, tested on the per-job path: bit 8*from + to
# is a move, bit 8*state + 7 an entry state.
_MOVE_BITS: Final = sum((1 << (8 * src + to)) for src, tos in enumerate(MOVES) for to in tos) \
    + sum(1 << (8 * state + 7) for state in ENTRY_STATES)

# Flags
FLAG_DELIVERED: Final = 1  # served to a client at least once (at-most-once jobs never requeue then)
FLAG_IN_DEQUE: Final = 2  # the record sits in its queue's deque (possibly as a stale entry)
FLAG_WILLQUEUE_SENT: Final = 4  # WILLQUEUE went out for the current requeue time (cluster)
FLAG_QUEUED_ONCE: Final = 8  # was queued at least once (an at-most-once job is never queued again)
# A copy from REPLJOB: its creator queues the job, so a requeue here is a further
# delivery (Disque's JOB_FLAG_BCAST_QUEUED, set on REPLJOB copies).
FLAG_REPLICA: Final = 16
# A requeue counts as an additional delivery when the job was delivered or queued
# before (here, or by its creator for a replica), as Disque's enqueueJob does.
FLAG_REQUEUE_COUNTS: Final = 1 | 8 | 16  # FLAG_DELIVERED | FLAG_QUEUED_ONCE | FLAG_REPLICA
# The pending requeue is a NACK ... DELAY's (already counted in ``nacks``): when it
# fires it is no further delivery.
FLAG_NACK_DELAYED: Final = 32
_FLAG_TRANSIENT: Final = FLAG_IN_DEQUE | FLAG_WILLQUEUE_SENT  # never persisted nor sent
_FLAG_BITS: Final = 8  # flags above this hold delay_s, then maxdeliver
_FLAG_MASK: Final = (1 << _FLAG_BITS) - 1
_DELAY_BITS: Final = 40  # delay_max_s fits, and the larger values a record check refuses
_MAXDELIVER_SHIFT: Final = _FLAG_BITS + _DELAY_BITS
FLAGS_DELAY_MASK: Final = ((1 << _DELAY_BITS) - 1) << _FLAG_BITS  # job.flags & this: a DELAY was given
FLAGS_MAXDELIVER_MIN: Final = 1 << _MAXDELIVER_SHIFT  # job.flags at or above this: MAXDELIVER set

NodePair = tuple[tuple[str, ...], tuple[str, ...]]
# Shared (delivered, confirmed) pairs: jobs with the same pair point at one tuple.
# Bounded: cleared when full (only sharing is lost, never correctness).
_node_pairs: dict[NodePair, NodePair] = {}
node_pairs_cache_max = 4096


_last_pair: NodePair = ((), ())


def node_pair(delivered: tuple[str, ...], confirmed: tuple[str, ...]) -> NodePair:
    global _last_pair
    last = _last_pair
    if delivered is last[0] and confirmed is last[1]:
        return last  # ADDJOB: the same (my_id,) tuple every time, no hashing
    key = (delivered, confirmed)
    pair = _node_pairs.get(key)
    if pair is None:
        if len(_node_pairs) >= node_pairs_cache_max:
            _node_pairs.clear()
        pair = _node_pairs[key] = key
    _last_pair = pair
    return pair

# Bounds that keep every job encodable (``to_record``: AOF, REPLJOB, YOURJOBS,
# rewrite). ADDJOB refuses more with a clear error and ``from_record`` refuses a
# record past them, so a job the shard holds can always be written. Ten years of
# TTL, RETRY or DELAY keeps qtime_ms = now + (DELAY + RETRY) * 1000 far inside the
# record's 64-bit fields; the queue name and body lengths are its 16- and 32-bit
# length fields.
ttl_max_s: Final = 10 * 365 * 24 * 3600
retry_max_s: Final = ttl_max_s
delay_max_s: Final = ttl_max_s
queue_name_bytes_max: Final = 0xFFFF
body_bytes_max: Final = 0xFFFF_FFFF
# Nodes a job record may name (delivered + confirmed): the cluster is far smaller
# (membership keeps at most 1000 nodes); the record's count fields are 16-bit.
job_nodes_max: Final = 4096
node_id_bytes_max: Final = 64  # node IDs are 40 hex characters
# ADDJOB ... MAXDELIVER n: deliveries before the job goes to its dead-letter queue
# (a 16-bit record field; ten thousand redeliveries is already a hot loop).
maxdeliver_max: Final = 10_000
# ADDJOB ... GROUP name / DEDUP key, and DEADLETTER ... REASON text: carried with the
# job's copies and records (16-bit length fields); the caps keep a job record small.
group_bytes_max: Final = 256
dedup_bytes_max: Final = 256
dead_reason_bytes_max: Final = 1024

US_PER_MS: Final = 1_000


def times_1000(n: int) -> int:
    """``n * 1000`` for a time (ms -> us, us -> ns). Compiled, an int product takes
    mypyc's inline path only when both factors are below 2**30, which a time since
    the epoch is not: the product is then a Python long multiplication, some 700
    instructions with an allocation. Three shifts are exact and stay inline."""
    return (n << 10) - (n << 4) - (n << 3)


class Timed:
    """Anything the shard's timers examine (a job, a queue, a queue's federation
    state): ``awake_ms`` is the key of the timer bucket holding it, 0 = none. One
    base class, so the shard reads and writes it natively whatever the target."""

    __slots__ = ("awake_ms",)

    awake_ms: int


# What a job's extension fields cost beyond its body (the memory estimate, counted
# with the body in the shard's ``body_bytes``; measured with tracemalloc,
# docs/memory.md, "Extension fields"): the JobExt record, each field's bytes object
# header plus its length, and for a DEDUP key the dedup table's key tuple and slot.
# Computed when the job is registered and when a field changes, never when read.
ext_record_bytes: Final = 64
ext_field_overhead_bytes: Final = 40
dedup_entry_bytes: Final = 140


def ext_mem_bytes(ext: JobExt | None) -> int:
    """The estimate of what ``ext`` costs (0 for a job without extension fields)."""
    if ext is None:
        return 0
    n = ext_record_bytes
    for value in (ext.group, ext.dedup, ext.reason):
        if value:
            n += ext_field_overhead_bytes + len(value)
    if ext.dedup:
        n += dedup_entry_bytes
    return n


class JobExt:
    """A job's extension fields (b"" = not set): the fairness group it belongs to in
    its queue, its deduplication key, why it was dead-lettered. Shared by nothing:
    each job that has one owns it."""

    __slots__ = ("group", "dedup", "reason")

    group: bytes
    dedup: bytes
    reason: bytes

    def __init__(self, group: bytes = b"", dedup: bytes = b"", reason: bytes = b"") -> None:
        self.group = group
        self.dedup = dedup
        self.reason = reason

    def __bool__(self) -> bool:
        return bool(self.group or self.dedup or self.reason)


class Job(Timed):
    __slots__ = (
        "id",
        "queue",
        "body",
        "state",
        "repl",
        "ttl_s",
        "ctime_us",
        "retry_s",
        "nacks",
        "additional_deliveries",
        "qtime_ms",
        "nodes",
        "flags",
        "dtime_ms",
        "ext",
    )

    id: str
    queue: bytes
    body: bytes
    state: int
    repl: int
    ttl_s: int
    ctime_us: int  # creation time (us); jobs created in the same us get +1 each
    retry_s: int
    nacks: int
    additional_deliveries: int
    qtime_ms: int  # when an active job is queued again; 0 = never (at-most-once, queued once)
    nodes: NodePair  # (delivered: may have a copy, confirmed: GOTJOB / GOTACK)
    flags: int  # FLAG_* bits, delay_s above _FLAG_BITS
    # /metrics: when a client got it and has not acknowledged it since (ms); -1 = not
    # outstanding. Never persisted nor sent: it is this node's view of its clients.
    dtime_ms: int
    ext: JobExt | None  # GROUP, DEDUP, dead-letter reason; None for nearly every job

    def __init__(
        self,
        job_id: str,
        queue: bytes,
        body: bytes,
        state: int,
        repl: int,
        ttl_s: int,
        ctime_us: int,
        delay_s: int,
        retry_s: int,
        qtime_ms: int,
        delivered: tuple[str, ...],
        confirmed: tuple[str, ...] = (),
    ) -> None:
        self.id = job_id
        self.queue = queue
        self.body = body
        self.state = state
        self.repl = repl
        self.ttl_s = ttl_s
        self.ctime_us = ctime_us
        self.retry_s = retry_s
        self.nacks = 0
        self.additional_deliveries = 0
        self.qtime_ms = qtime_ms
        self.nodes = node_pair(delivered, confirmed)
        self.flags = delay_s << _FLAG_BITS
        self.awake_ms = 0
        self.dtime_ms = -1
        self.ext = None

    def move(self, to: int) -> None:
        """Change the job's state by one of the state machine's ``MOVES``."""
        if not _MOVE_BITS >> (8 * self.state + to) & 1:
            raise InvariantError(f"job {self.id}: {STATE_NAMES[self.state]} -> "
                                 f"{STATE_NAMES[to]} is not a move of the state machine")
        self.state = to

    def enter(self, state: int) -> None:
        """The state a job that is not in a shard's table yet enters it in, one of
        ``ENTRY_STATES`` (made here and waiting for its copies, copied from another
        node, loaded): not a move, whatever state the record it came in says."""
        if not _MOVE_BITS >> (8 * state + 7) & 1:
            raise InvariantError(f"job {self.id} cannot enter a table {STATE_NAMES[state]}")
        self.state = state

    def check_entry(self) -> None:
        """The job is about to be registered: its state must be one of ``ENTRY_STATES``."""
        if not _MOVE_BITS >> (8 * self.state + 7) & 1:
            raise InvariantError(f"job {self.id} registered {STATE_NAMES[self.state]}")

    # ---- flags: every move reads and sets them through these names, never the bits
    # (a shape test keeps raw FLAG_* operations inside this module)

    def was_delivered(self) -> bool:
        """Served to a client at least once (an at-most-once job never requeues then)."""
        return bool(self.flags & FLAG_DELIVERED)

    def mark_delivered(self) -> None:
        self.flags |= FLAG_DELIVERED

    def unmark_delivered(self) -> None:
        """A take given back unsent (multi-owner GETJOB): it was no delivery."""
        self.flags &= ~FLAG_DELIVERED

    def in_deque(self) -> bool:
        """The record sits in its queue's deque (possibly as a stale entry)."""
        return bool(self.flags & FLAG_IN_DEQUE)

    def mark_in_deque(self) -> None:
        self.flags |= FLAG_IN_DEQUE

    def unmark_in_deque(self) -> None:
        self.flags &= ~FLAG_IN_DEQUE

    def willqueue_sent(self) -> bool:
        """WILLQUEUE went out for the current requeue time."""
        return bool(self.flags & FLAG_WILLQUEUE_SENT)

    def mark_willqueue_sent(self) -> None:
        self.flags |= FLAG_WILLQUEUE_SENT

    def new_requeue_time(self) -> None:
        """The requeue time moved: a WILLQUEUE is due again before it."""
        self.flags &= ~FLAG_WILLQUEUE_SENT

    def queued_once(self) -> bool:
        """Was queued at least once (not the end of its ADDJOB DELAY)."""
        return bool(self.flags & FLAG_QUEUED_ONCE)

    def waits_delay(self) -> bool:
        """Created with a DELAY and not queued yet (counted in the per-queue delayed)."""
        flags = self.flags
        return bool(flags & FLAGS_DELAY_MASK) and not flags & FLAG_QUEUED_ONCE

    def end_delay(self) -> None:
        """The job leaves its DELAY without being queued (moved to a dead-letter queue)."""
        self.flags |= FLAG_QUEUED_ONCE

    def mark_queued(self) -> None:
        """Queued: the WILLQUEUE round and any NACK ... DELAY wait end."""
        self.flags = (self.flags & ~(FLAG_WILLQUEUE_SENT | FLAG_NACK_DELAYED)) | FLAG_QUEUED_ONCE

    def mark_replica(self) -> None:
        """A REPLJOB copy: its first requeue counts a delivery (JOB_FLAG_BCAST_QUEUED)."""
        self.flags |= FLAG_REPLICA

    def requeue_counts(self) -> bool:
        """A requeue now counts an additional delivery (delivered, queued or a copy)."""
        return bool(self.flags & FLAG_REQUEUE_COUNTS)

    def nack_delayed(self) -> bool:
        """Waits for the end of a NACK ... DELAY (already counted by the NACK)."""
        return bool(self.flags & FLAG_NACK_DELAYED)

    def mark_nack_delayed(self) -> None:
        """NACK ... DELAY: the wait starts, a new requeue time (WILLQUEUE due again)."""
        self.flags = (self.flags & ~FLAG_WILLQUEUE_SENT) | FLAG_NACK_DELAYED

    def unmark_nack_delayed(self) -> None:
        self.flags &= ~FLAG_NACK_DELAYED

    def has_maxdeliver(self) -> bool:
        """ADDJOB ... MAXDELIVER was given (cheaper than ``maxdeliver``)."""
        return self.flags >= FLAGS_MAXDELIVER_MIN

    @property
    def delay_s(self) -> int:
        return (self.flags & FLAGS_DELAY_MASK) >> _FLAG_BITS

    @property
    def maxdeliver(self) -> int:
        """Deliveries before the job is dead-lettered (ADDJOB MAXDELIVER); 0 = no cap."""
        return self.flags >> _MAXDELIVER_SHIFT

    def set_maxdeliver(self, n: int) -> None:
        self.flags = (self.flags & ((1 << _MAXDELIVER_SHIFT) - 1)) | (n << _MAXDELIVER_SHIFT)

    # ---- extension fields (b"" = not set)

    @property
    def group(self) -> bytes:
        ext = self.ext
        return b"" if ext is None else ext.group

    @property
    def dedup(self) -> bytes:
        ext = self.ext
        return b"" if ext is None else ext.dedup

    @property
    def dead_reason(self) -> bytes:
        ext = self.ext
        return b"" if ext is None else ext.reason

    def set_ext(self, group: bytes | None = None, dedup: bytes | None = None,
                reason: bytes | None = None) -> int:
        """Set the given extension fields (None: leave as is; b"": clear); returns how
        the memory estimate changed (``ext_mem_bytes``), for a registered job's shard."""
        ext = self.ext
        before = ext_mem_bytes(ext)
        if ext is None:
            ext = JobExt()
        if group is not None:
            ext.group = group
        if dedup is not None:
            ext.dedup = dedup
        if reason is not None:
            ext.reason = reason
        self.ext = ext if ext else None
        return ext_mem_bytes(self.ext) - before

    @property
    def delivered(self) -> tuple[str, ...]:
        return self.nodes[0]

    @delivered.setter
    def delivered(self, value: tuple[str, ...]) -> None:
        self.nodes = node_pair(value, self.nodes[1])

    @property
    def confirmed(self) -> tuple[str, ...]:
        return self.nodes[1]

    @confirmed.setter
    def confirmed(self, value: tuple[str, ...]) -> None:
        self.nodes = node_pair(self.nodes[0], value)

    @property
    def etime_ms(self) -> int:
        return self.ctime_us // US_PER_MS + self.ttl_s * 1000

    @property
    def ctime_ns(self) -> int:
        return times_1000(self.ctime_us)

    def __repr__(self) -> str:
        return f"Job({self.id} {self.queue!r} {STATE_NAMES[self.state]})"

    # --- persisted form (AOF; also usable for REPLJOB) ---

    def to_record(self) -> bytes:
        """Serialize: a version byte, fixed fields, then length-prefixed strings.

        A job with no extension is written in version 1 (what nodes and AOF files
        without the extensions read); one with MAXDELIVER alone in version 2 (one more
        field); one with GROUP, DEDUP or a dead-letter reason in version 3 (version 2's
        fields, their three lengths, the strings after the body)."""
        jid = self.id.encode()
        queue = self.queue
        body = self.body
        delivered, confirmed = self.nodes
        flags = self.flags
        maxdeliver = flags >> _MAXDELIVER_SHIFT
        ext = self.ext
        version = RECORD_VERSION_EXT if ext is not None else (
            RECORD_VERSION_MAXDELIVER if maxdeliver else RECORD_VERSION)
        # one bound pack with the fields as arguments (a tuple of them through *args
        # was a generic call); versions 2 and 3 add their fields after version 1's
        head = _pack_head(version, self.state, flags & _FLAG_MASK & ~_FLAG_TRANSIENT, self.repl,
                          self.ttl_s, times_1000(self.ctime_us),  # ns on disk and on the wire, as Disque
                          (flags & FLAGS_DELAY_MASK) >> _FLAG_BITS, self.retry_s, self.nacks,
                          self.additional_deliveries, self.qtime_ms, len(delivered),
                          len(confirmed), len(jid), len(queue), len(body))
        if ext is not None:
            parts = [head, _pack_ext(maxdeliver, len(ext.group), len(ext.dedup), len(ext.reason)),
                     jid, queue, body, ext.group, ext.dedup, ext.reason]
        elif maxdeliver:
            parts = [head, _pack_u16(maxdeliver), jid, queue, body]
        else:
            parts = [head, jid, queue, body]
        for node in delivered:
            _append_node(parts, node)
        for node in confirmed:
            _append_node(parts, node)
        return b"".join(parts)

    @staticmethod
    def from_record(rec: bytes) -> Job:
        """Inverse of ``to_record``; raises ``ValueError`` on a malformed record."""
        size = len(rec)
        if size < _REC_HEAD.size:
            raise ValueError("job record too short")
        # Typed: compiled, the fields are machine integers (unpacked untyped, every sum
        # and comparison below was a generic call, most of a replica's REPLJOB parsing)
        version: int
        state: int
        flags: int
        repl: int
        ttl_s: int
        ctime_ns: int
        delay_s: int
        retry_s: int
        nacks: int
        add_deliv: int
        qtime_ms: int
        n_deliv: int
        n_conf: int
        id_len: int
        q_len: int
        body_len: int
        (version, state, flags, repl, ttl_s, ctime_ns, delay_s, retry_s, nacks, add_deliv,
         qtime_ms, n_deliv, n_conf, id_len, q_len, body_len) = _REC_HEAD.unpack_from(rec)
        at, maxdeliver, ext_lens = _extended_head(rec, version)
        if state > ACKED:
            raise ValueError(f"bad job state {state}")
        if ttl_s > ttl_max_s or retry_s > retry_max_s or delay_s > delay_max_s:
            raise ValueError("job record TTL, RETRY or DELAY out of range")
        if n_deliv + n_conf > job_nodes_max:
            raise ValueError("job record names too many nodes")
        end = at + id_len + q_len + body_len + ext_lens[0] + ext_lens[1] + ext_lens[2]
        if end > size:
            raise ValueError("job record truncated")
        jid = rec[at : at + id_len].decode()
        at += id_len
        queue = rec[at : at + q_len]
        at += q_len
        body = rec[at : at + body_len]
        at += body_len
        ext: JobExt | None = None
        if version == RECORD_VERSION_EXT:
            strs = []
            for ln in ext_lens:
                strs.append(rec[at : at + ln])
                at += ln
            ext = JobExt(strs[0], strs[1], strs[2])
        nodes: list[str] = []
        for _ in range(n_deliv + n_conf):
            if at + 2 > size:
                raise ValueError("job record truncated")
            ln = (rec[at] << 8) | rec[at + 1]  # _NODE_LEN, big endian u16
            at += 2
            if at + ln > size:
                raise ValueError("job record truncated")
            nodes.append(rec[at : at + ln].decode())
            at += ln
        if at != size:
            raise ValueError("trailing bytes after job record")
        job = Job(jid, queue, body, state, repl, ttl_s, ctime_ns // 1000, delay_s, retry_s, qtime_ms,
                  tuple(nodes[:n_deliv]), tuple(nodes[n_deliv:]))
        job.flags |= flags & ~_FLAG_TRANSIENT
        if maxdeliver:
            job.set_maxdeliver(maxdeliver)
        job.ext = ext if ext else None
        job.nacks = nacks
        job.additional_deliveries = add_deliv
        return job


RECORD_VERSION: Final = 1
RECORD_VERSION_MAXDELIVER: Final = 2  # version 1's fields, then maxdeliver (u16)
# Version 2's fields (maxdeliver may be 0), then the lengths of GROUP, DEDUP and the
# dead-letter reason (u16 each); the three strings follow the body.
RECORD_VERSION_EXT: Final = 3
# A deletion record (AOF): this tag, never a job record version, then the job ID.
DEL_RECORD_TAG: Final = 0x80
# version, state, flags, repl, ttl_s, ctime_ns, delay_s, retry_s, nacks, additional
# deliveries, qtime_ms, #delivered, #confirmed, len(id), len(queue), len(body)
_REC_HEAD: Final = struct.Struct(">BBBHQQQQQQQHHHII")
_REC_HEAD_V2: Final = struct.Struct(">BBBHQQQQQQQHHHIIH")
_REC_HEAD_V3: Final = struct.Struct(">BBBHQQQQQQQHHHIIHHHH")
_HEADS: Final = {RECORD_VERSION: _REC_HEAD, RECORD_VERSION_MAXDELIVER: _REC_HEAD_V2,
                 RECORD_VERSION_EXT: _REC_HEAD_V3}
_NODE_LEN: Final = struct.Struct(">H")
# Bound once: big-endian packs have no padding, so version 2's head is version 1's
# and a u16, version 3's version 1's and four u16 (maxdeliver, then the lengths of
# GROUP, DEDUP and the reason).
_pack_head: Final = _REC_HEAD.pack
_pack_u16: Final = _NODE_LEN.pack
_pack_ext: Final = struct.Struct(">HHHH").pack


def _append_node(parts: list[bytes], node: str) -> None:
    raw = node.encode()
    parts.append(_pack_u16(len(raw)))
    parts.append(raw)


def _extended_head(rec: bytes, version: int) -> tuple[int, int, tuple[int, int, int]]:
    """Where a record's strings start, its MAXDELIVER (0: none) and the lengths of
    its GROUP, DEDUP and reason, from the head its version has."""
    if version == RECORD_VERSION:
        return _REC_HEAD.size, 0, (0, 0, 0)
    if version == RECORD_VERSION_MAXDELIVER:
        if len(rec) < _REC_HEAD_V2.size:
            raise ValueError("job record too short")
        maxdeliver = _REC_HEAD_V2.unpack_from(rec)[-1]
        if not 1 <= maxdeliver <= maxdeliver_max:
            raise ValueError("job record MAXDELIVER out of range")
        return _REC_HEAD_V2.size, maxdeliver, (0, 0, 0)
    if version != RECORD_VERSION_EXT:
        raise ValueError(f"unsupported job record version {version}")
    if len(rec) < _REC_HEAD_V3.size:
        raise ValueError("job record too short")
    maxdeliver, group_len, dedup_len, reason_len = _REC_HEAD_V3.unpack_from(rec)[-4:]
    if maxdeliver > maxdeliver_max:
        raise ValueError("job record MAXDELIVER out of range")
    if group_len > group_bytes_max or dedup_len > dedup_bytes_max \
            or reason_len > dead_reason_bytes_max:
        raise ValueError("job record GROUP, DEDUP or reason too long")
    return _REC_HEAD_V3.size, maxdeliver, (group_len, dedup_len, reason_len)


def del_record(job_id: str) -> bytes:
    return bytes((DEL_RECORD_TAG,)) + job_id.encode()


def job_id_of_record(rec: bytes) -> str:
    """The job a record (job or deletion) is about, without decoding the rest.

    Raises ``ValueError`` when it is neither form."""
    if rec[:1] == bytes((DEL_RECORD_TAG,)):
        return rec[1:].decode("ascii", "strict") if len(rec) > 1 else _bad("empty deletion record")
    head = _HEADS.get(rec[0]) if rec else None
    if head is None or len(rec) < head.size:
        return _bad("not a job record")
    id_len = head.unpack_from(rec)[13]
    if head.size + id_len > len(rec):
        return _bad("job record truncated")
    return rec[head.size : head.size + id_len].decode("ascii", "strict")


def _bad(why: str) -> str:
    raise ValueError(why)


def union(a: tuple[str, ...], b: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Ordered union of two node lists (first occurrence wins)."""
    if all(n in a for n in b):
        return a
    return tuple(dict.fromkeys((*a, *b)))


def merge_nodes(job: Job, nodes: tuple[str, ...] | list[str]) -> None:
    """Add a peer's node list to ``job.delivered``, unless the record would then name
    more nodes than it can encode (no real cluster comes near: a broken peer)."""
    merged = union(job.delivered, nodes)
    if len(merged) + len(job.confirmed) <= job_nodes_max:
        job.delivered = merged
