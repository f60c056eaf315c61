"""Loading the shard from the AOF (docs/persistence.md): one record at a time,
through the shard's ``Core`` (workers/core.py). Writing is the core's
``AofAppend`` effects, carried out by the worker."""

from __future__ import annotations

from typing import Final

from workers.core import Core
from workers.dedup import Dedup
from workers.ids import slot_of, slot_of_valid_id
from workers.job import (
    ACKED,
    DEL_RECORD_TAG,
    KEPT_KEY_RECORD_TAG,
    QUEUED,
    RESULT_RECORD_TAG,
    Job,
    job_id_of_record,
    node_id_bytes_max,
)
from workers.limit import LIMIT_RECORD_TAG, parse_limit_record
from workers.results import Results, parse_result_record

_DEL_TAG = bytes((DEL_RECORD_TAG,))
_LIMIT_TAG = bytes((LIMIT_RECORD_TAG,))
_RESULT_TAG = bytes((RESULT_RECORD_TAG,))
_KEPT_TAG = bytes((KEPT_KEY_RECORD_TAG,))
# A loaded job's creation time may be ahead of our clock by the other nodes' clock
# skew; past this it does not move the creation time of the jobs made here after it
# (their queue order and TTL would follow a clock that lies).
ctime_ahead_ms_max: Final = 24 * 3600 * 1000


# The slots of the queue names lie_of saw last (a blake3 each otherwise: as much as
# the rest of a peer's record); cleared when full.
_queue_slots: dict[bytes, int] = {}
queue_slots_cached_max: Final = 4096


def lie_of(job: Job) -> str | None:
    """Why a job record that decodes cannot be a job (None: it can): an ID of another
    shape or whose slot is not its queue's (the job would sit in a queue another
    worker owns), no replication level, no node or a node name no node has. The AOF
    loader refuses such a record before it touches the shard, and a peer's record is
    dropped for the same reasons (``federation.peer_job``), so whatever a node keeps
    it can load again."""
    slot = slot_of_valid_id(job.id.encode())
    if slot < 0:
        return f"bad job ID {job.id!r}"
    queue = job.queue
    qslot = _queue_slots.get(queue)
    if qslot is None:
        if len(_queue_slots) >= queue_slots_cached_max:
            _queue_slots.clear()
        qslot = _queue_slots[queue] = slot_of(queue)
    if slot != qslot:
        return f"job {job.id}: its ID's slot {slot} is not its queue's slot {qslot}"
    if job.repl < 1:
        return f"job {job.id}: replication level {job.repl}"
    delivered, confirmed = job.nodes
    if not delivered:
        return f"job {job.id}: no node"
    for node in delivered + confirmed:
        if not 0 < len(node) <= node_id_bytes_max:
            return f"job {job.id}: a node name of {len(node)} bytes"
    return None


def load_record(s: Core, record: bytes, enqueue: bool, now_ms: int,
                results: Results | None = None, dedup: Dedup | None = None) -> None:
    """Replay one AOF record: a job record registers or replaces its job, a
    deletion record removes it, a limit record sets a queue's limits, a result record
    stores the result again (until its expire time: one past it stores nothing), a kept
    key record keeps a DEDUP key. Raises ``ValueError`` on a malformed record.
    Emits nothing (the record is already in a file). A record that lies
    (``check_loaded``) is refused before it changes anything.

    A loaded job is ``active`` with its retry timer, unless it was queued and
    ``enqueue`` (controlled restart) asks to queue it again; at-most-once jobs
    queued once keep qtime 0 and so are never queued again; ``acked`` stays
    acked unless no other node has a copy (then it is simply gone).
    """
    if record[:1] == _DEL_TAG:
        gone = s.lookup(job_id_of_record(record))
        if gone is not None:
            s.unregister_quiet(gone, now_ms)
        return
    if record[:1] == _LIMIT_TAG:  # a queue's QLIMIT limits (workers/limits.py)
        queue, active, rate, group_active = parse_limit_record(record)
        s.set_limit(queue, active, rate, group_active, now_ms, log=False)
        return
    if record[:1] == _RESULT_TAG:
        if results is not None:
            job_id, value, expire_ms = parse_result_record(record)
            if slot_of_valid_id(job_id.encode()) < 0:
                raise ValueError(f"bad job ID {job_id!r} in a result record")
            results.store(job_id, value, now_ms, expire_ms, log=False)
        return
    if record[:1] == _KEPT_TAG:
        if dedup is not None:
            dedup.load_kept(record, now_ms)
        return
    job = Job.from_record(record)
    lie = lie_of(job)
    if lie is not None:
        raise ValueError(lie)
    old = s.lookup(job.id)
    if old is not None:
        s.unregister_quiet(old, now_ms)  # a later record of the same job wins
    if job.etime_ms <= now_ms:
        return
    v = s.view()
    if job.state == ACKED and all(n == v.node_id for n in job.delivered):
        return
    requeue = job.state == QUEUED and enqueue
    if not requeue and job.state != ACKED and job.retry_s and job.qtime_ms <= now_ms:
        job.qtime_ms = s.retry_at(job, now_ms)  # it enters active: its RETRY from now
    s.arrive(job, s.queue(job.queue, now_ms), now_ms, queued=requeue)  # active or acked
    if job.ctime_us // 1000 <= now_ms + ctime_ahead_ms_max:
        s.saw_ctime(job.ctime_us)
