"""Loading the shard from the AOF (docs/persistence.md): one record at a time,
through the shard's ``Core`` (workers/core.py). Writing is the core's
``AofAppend`` effects, carried out by the worker."""

from __future__ import annotations

from workers.core import Core
from workers.job import ACKED, DEL_RECORD_TAG, QUEUED, Job, job_id_of_record

_DEL_TAG = bytes((DEL_RECORD_TAG,))


def load_record(s: Core, record: bytes, enqueue: bool, now_ms: int) -> None:
    """Replay one AOF record: a job record registers or replaces its job, a
    deletion record removes it. Raises ``ValueError`` on a malformed record.
    Emits nothing (the record is already in a file).

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
    job = Job.from_record(record)
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
    s.saw_ctime(job.ctime_us)
