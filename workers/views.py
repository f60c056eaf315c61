"""Read-only views of a shard: SHOW, QSTAT, QPEEK, QSCAN / JSCAN pages, the
/metrics counters and largest queues (the cross-structure invariant check is the
core's own, ``Core.check``).

The per-queue load signals (QSTAT's fields after the reference's, /metrics'
queue rows) read what the core keeps anyway: ``Queue.live``, the tally's
per-queue active and delayed counts, the head of the queue's ctime order and
``dead:<queue>``'s ``live`` (the same slot, so the same worker). Nothing is
counted for them on the per-job path.

Functions over the shard's ``Core`` (workers/core.py), through its read-only
methods; the shard's ``op_show``, ``op_qstat``, ``op_qscan``, ``op_jscan`` and
``metrics`` call them.
None of them is on the per-job path.
"""

from __future__ import annotations

import heapq
from collections.abc import Set as AbstractSet
from operator import attrgetter
from typing import Any

from workers.core import Core, time_error_ms
from workers.federation import Federation
from workers.ids import DEAD_PREFIX
from workers.job import (
    ACTIVE,
    QUEUED,
    STATE_NAMES,
    US_PER_MS,
    Job,
    JobExt,
)
from workers.queue import PAUSE_NAMES, Queue
from workers.replies import NULL_ARRAY, Status

scan_empty_steps_per_count = 10  # a scan call visits at most count*10 empty positions
_live = attrgetter("live")  # a queue's queued jobs: the key of the largest queues


def show(job: Job, now_ms: int) -> list[Any]:
    """SHOW's reply for a job we hold."""
    etime = job.ctime_us // US_PER_MS + job.ttl_s * 1000
    qtime = job.qtime_ms if job.state in (ACTIVE, QUEUED) else 0
    requeue_in = max(0, qtime - now_ms) if qtime else 0
    awake_in = max(0, qtime - time_error_ms - now_ms) if qtime else 0
    return [
        b"id", job.id,
        b"queue", job.queue,
        b"state", STATE_NAMES[job.state],
        b"repl", job.repl,
        b"ttl", max(0, -(-(etime - now_ms) // 1000)),
        b"ctime", job.ctime_ns,
        b"delay", job.delay_s,
        b"retry", job.retry_s,
        b"nacks", job.nacks,
        b"additional-deliveries", job.additional_deliveries,
        b"nodes-delivered", list(job.delivered),
        b"nodes-confirmed", list(job.confirmed),
        b"next-requeue-within", requeue_in,
        b"next-awake-within", awake_in,
        b"body", job.body,
    ] + ([b"maxdeliver", job.maxdeliver] if job.has_maxdeliver() else []) + (
        [] if job.ext is None else _show_ext(job.ext))  # fmt: skip


def _show_ext(ext: JobExt) -> list[Any]:
    """SHOW's extension fields, each only when set (a job without them shows none)."""
    out: list[Any] = []
    for name, value in ((b"group", ext.group), (b"dedup", ext.dedup),
                        (b"dead-reason", ext.reason)):
        if value:
            out += [name, value]
    if ext.priority:
        out += [b"priority", ext.priority]
    return out


def qstat(s: Core, fed: Federation, queue: bytes, now_ms: int) -> Any:
    """QSTAT's reply: the reference answers *-1 for an unknown queue (SHOW answers $-1)."""
    q = s.find_queue(queue)
    if q is None:
        return NULL_ARRAY
    imports, rate = fed.qstat_import(q, now_ms) if fed.feds else ([], 0)
    reply = [
        b"name", q.name,
        b"len", q.live,
        b"age", max(0, (now_ms - q.ctime_ms) // 1000),
        b"idle", max(0, (now_ms - q.atime_ms) // 1000),
        b"blocked", 0 if q.waiters is None else len(q.waiters),
        b"import-from", imports,
        b"import-rate", rate,
        b"jobs-in", q.jobs_in,
        b"jobs-out", q.jobs_out,
        b"pause", PAUSE_NAMES[q.paused],
    ] + qstat_signals(s, q, now_ms)  # fmt: skip
    if q.has_named_groups():  # extension (GROUP): a plain queue's reply is the reference's
        reply += [b"groups", q.groups()]
    levels = q.priority_counts()
    if levels:  # extension (PRIORITY): queued jobs per priority, highest first
        reply += [b"priorities", [x for level in levels for x in level]]
    return reply


def qstat_signals(s: Core, q: Queue, now_ms: int) -> list[Any]:
    """QSTAT's fields after the reference's ones: jobs delivered and not acked
    (``active``), waiting for their DELAY (``delayed``), the age in seconds of the
    oldest queued job (``oldest-age``, 0 when empty) and the jobs queued in
    ``dead:<queue>`` (``dead-len``). ``len`` is the queued count."""
    t = s.tally()
    age_ms = oldest_age_ms(q, now_ms)
    return [
        b"active", t.active.get(q.name, 0),
        b"delayed", t.delayed.get(q.name, 0),
        b"oldest-age", max(age_ms, 0) // 1000,
        b"dead-len", dead_len(s, q.name),
    ]  # fmt: skip


def qgroups(s: Core, queue: bytes, count: int) -> list[list[Any]]:
    """QGROUPS: up to ``count`` groups of a queue with their queued jobs, largest
    first (ties by name); the jobs added without GROUP are the group ``b""``."""
    q = s.find_queue(queue)
    if q is None or count <= 0:
        return []
    return [[group, n] for group, n in q.largest_groups(count)]


def groups_full(s: Core, queue: bytes, group: bytes, groups_max: int) -> bool:
    """A job of ``group`` would make ``queue`` hold more than ``groups_max`` groups
    with queued jobs (ADDJOB ... GROUP, config queue-groups-max)."""
    q = s.find_queue(queue)
    return q is not None and q.groups() >= groups_max and q.adds_group(group)


def oldest_age_ms(q: Queue, now_ms: int) -> int:
    """Milliseconds since the creation of the oldest queued job (the head of the
    queue's ctime order: stale entries before it are skipped, as GETJOB's pop
    does), -1 when none is queued. A job made on a node whose clock is ahead
    counts 0."""
    oldest = q.oldest(1)
    return max(0, now_ms - oldest[0].ctime_us // US_PER_MS) if oldest else -1


def dead_len(s: Core, name: bytes) -> int:
    """Jobs queued in ``dead:<name>`` (its slot is ``name``'s: this shard owns it)."""
    dq = s.find_queue(DEAD_PREFIX + name)
    return 0 if dq is None else dq.live


def qpeek(s: Core, queue: bytes, count: int) -> list[list[Any]]:
    """QPEEK: the oldest ``count`` jobs, or the newest ``-count``."""
    q = s.find_queue(queue)
    if q is None:
        return []
    jobs = q.oldest(count) if count >= 0 else q.newest(-count)
    return [[q.name, j.id, j.body] for j in jobs]


def qscan(
    s: Core, fed: Federation, cursor: int, count: int, minlen: int, maxlen: int,
    importrate: int,
) -> tuple[int, list[bytes]]:
    """Queues from table position ``cursor``; next cursor 0 means done.

    ``maxlen`` 0 means no upper bound; ``importrate`` > 0 keeps queues importing
    at least that many jobs/s.
    """
    table = s.queue_scan_table()
    pos = cursor
    names: list[bytes] = []
    seen = 0
    steps_max = max(count, 1) * scan_empty_steps_per_count
    steps = 0
    while pos < len(table) and seen < count and steps < steps_max:
        q = table[pos]
        pos += 1
        steps += 1
        if q is None:
            continue
        seen += 1
        if q.live < minlen or (maxlen and q.live > maxlen):
            continue
        if importrate > 0 and fed.qstat_import(q, s.now_ms())[1] < importrate:
            continue
        names.append(q.name)
    return (pos if pos < len(table) else 0), names


def jscan(
    s: Core,
    cursor: int,
    count: int,
    queue: bytes | None,
    states: AbstractSet[int] | None,
    reply_all: bool,
    now_ms: int,
) -> tuple[int, list[Any]]:
    """Jobs from bucket ``cursor``; items are ``Status(id)`` or SHOW arrays."""
    pos = cursor
    items: list[Any] = []
    seen = 0
    steps_max = max(count, 1) * scan_empty_steps_per_count
    steps = 0
    buckets = s.job_table()
    while pos < len(buckets) and seen < count and steps < steps_max:
        b = buckets[pos]
        pos += 1
        steps += 1
        if not b:
            continue
        for job in b.values():
            seen += 1
            if queue is not None and job.queue != queue:
                continue
            if states is not None and job.state not in states:
                continue
            items.append(show(job, now_ms) if reply_all else Status(job.id))
    return (pos if pos < len(buckets) else 0), items


def metrics(s: Core, fed: Federation, queues_max: int, now_ms: int) -> dict[str, Any]:
    """Counters, histograms and the ``queues_max`` largest queues (by queued jobs)
    for /metrics and the HTTP API; a queue row is [name, queued, active, delayed,
    oldest queued age ms (-1: empty), jobs in, jobs out, blocked clients, pause
    state, import rate, jobs queued in dead:<name>]. O(queues) to find the
    largest: read once per scrape."""
    queues = s.queue_table()
    t = s.tally()
    rows: list[list[Any]] = []
    if queues_max > 0:
        if len(queues) > queues_max:
            names = [q.name for q in heapq.nlargest(queues_max, queues.values(), key=_live)]
        else:  # room for all, and for evicted queues that still have jobs out
            names = list(queues)
            names += [n for n in {*t.active, *t.delayed} if n not in queues]
            names = names[:queues_max]
        rows = [_queue_row(s, fed, name, now_ms) for name in names]
    st = t.stats
    return {
        "added": st.added, "delivered": st.delivered,
        "acked": st.acked, "nacked": st.nacked,
        "requeued_retry": st.requeued_retry,
        "requeued_nack": st.nacked,
        "requeued_enqueue": st.requeued_enqueue, "expired": st.expired,
        "dead_lettered": st.dead_lettered,
        "jobs": s.job_count(), "queues": len(queues),
        "queued": sum(q.live for q in queues.values()),
        "active": t.outstanding, "delayed": sum(t.delayed.values()),
        "blocked": s.waiter_count(),
        "wait_counts": list(st.wait_counts), "wait_sum_ms": st.wait_sum_ms,
        "proc_counts": list(st.proc_counts), "proc_sum_ms": st.proc_sum_ms,
        "queue_rows": rows,
    }  # fmt: skip


def _queue_row(s: Core, fed: Federation, name: bytes, now_ms: int) -> list[Any]:
    q = s.find_queue(name)
    t = s.tally()
    if q is None:  # evicted while some of its jobs are delivered or delayed
        return [name, 0, t.active.get(name, 0), t.delayed.get(name, 0), -1,
                0, 0, 0, "none", 0, dead_len(s, name)]
    rate = fed.qstat_import(q, now_ms)[1] if fed.feds else 0
    return [name, q.live, t.active.get(name, 0), t.delayed.get(name, 0),
            oldest_age_ms(q, now_ms), q.jobs_in, q.jobs_out,
            0 if q.waiters is None else len(q.waiters), PAUSE_NAMES[q.paused], rate,
            dead_len(s, name)]

