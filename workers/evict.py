"""What a shard may evict under memory pressure without breaking a guarantee.

The spec ("What happens when a node runs out of memory?", and "Special
handling of messages with RETRY set to 0"): past 95 % of maxmemory a node
evicts data whose loss violates no safety guarantee:

- stored results (workers/results.py), first, oldest first: a result is kept for a
  client that may never ask; losing one costs a RESULT that answers null;
- acknowledged jobs: an ACK kept here only helps garbage-collect copies on
  other nodes; dropping it early costs at most a late duplicate GC round;
- at-most-once jobs (RETRY 0) already delivered: they will never be delivered
  again, so nobody can miss them (observability only);
- empty queues nobody waits on: recreated on next use. Paused ones too, unlike
  the spec (which never evicts a paused queue): PAUSEs of new names would
  otherwise fill the budget for good (workers/pause.py).

Never evicted: queued jobs, active at-least-once jobs, at-most-once jobs not
delivered yet. Pure: works through the shard's public ops (JSCAN, QSCAN,
DELJOB, op_evict_queue), takes the time as an argument, does no I/O.
"""

from __future__ import annotations

from typing import Any

from workers.job import ACKED, ACTIVE, Job

# Jobs an eviction pass looks at per call: a pass stays around 1-10 ms even when
# every job it visits goes (~1 us per job visited, ~5-10 us per job evicted); the
# caller repeats passes under its own time budget while memory is high.
evict_visit_jobs_max = 1_000
# Queues looked at per call (a look is a dict probe, an eviction a few dict ops).
evict_visit_queues_max = 200

_JSCAN_STATES = frozenset((ACKED, ACTIVE))


def job_evictable(job: Job) -> bool:
    """True when dropping ``job`` breaks no delivery guarantee."""
    if job.state == ACKED:
        return True
    return job.state == ACTIVE and job.retry_s == 0 and job.was_delivered()


class EvictCursor:
    """Where the next pass resumes (JSCAN / QSCAN cursors of this shard)."""

    __slots__ = ("jobs", "queues")

    def __init__(self) -> None:
        self.jobs = 0
        self.queues = 0


def select_jobs(shard: Any, cursor: int, visit_max: int, now_ms: int) -> tuple[int, list[str]]:
    """IDs of evictable jobs among about ``visit_max`` jobs from ``cursor``; next cursor
    (0 = wrapped around)."""
    nxt, items = shard.op_jscan(cursor, visit_max, None, _JSCAN_STATES, False, now_ms)
    ids = []
    for item in items:
        job = shard.lookup(str(item))
        if job is not None and job_evictable(job):
            ids.append(job.id)
    return nxt, ids


def select_queues(shard: Any, cursor: int, visit_max: int) -> tuple[int, list[bytes]]:
    """Names of empty queues among ``visit_max`` queues from ``cursor`` (the shard
    still checks waiters when asked to evict one)."""
    nxt, names = shard.op_qscan(cursor, visit_max, 0, 0, 0)
    return nxt, [name for name in names if shard.op_qlen(name) == 0]


def evict_step(
    shard: Any,
    cursor: EvictCursor,
    now_ms: int,
    visit_jobs_max: int = evict_visit_jobs_max,
    visit_queues_max: int = evict_visit_queues_max,
) -> tuple[int, int]:
    """One bounded eviction pass; returns (jobs evicted, queues evicted).

    Results go first: while some are stored a pass drops only results (up to
    ``visit_jobs_max``, counted with the jobs). Jobs go through DELJOB, so the AOF
    records their removal like any other."""
    results = shard.op_evict_results(visit_jobs_max)
    if results:
        return results, 0
    cursor.jobs, ids = select_jobs(shard, cursor.jobs, visit_jobs_max, now_ms)
    jobs = shard.op_deljob(ids, now_ms) if ids else 0
    cursor.queues, names = select_queues(shard, cursor.queues, visit_queues_max)
    queues = 0
    for name in names:
        if shard.op_evict_queue(name):
            queues += 1
    return jobs, queues
