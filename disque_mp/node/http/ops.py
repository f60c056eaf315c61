"""What every worker contributes to an HTTP request, and how the serving worker gathers it.

The worker that holds the HTTP connection asks every worker (itself inline, the
others over the local mesh, as INFO does) for ``local_op("http.<name>", arg)``;
values cross the mesh packed like any reply (JSON, bytes moved to frame bodies).
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from bus.clock import wall_ms
from disque_mp.node.scatter import on_every_worker
from workers.job import ACTIVE
from workers.replies import Error

job_kinds_ids_max = 10_000  # job IDs one http.job_kinds request classifies (a queue view's page)

if TYPE_CHECKING:
    from disque_mp.node.view import NodeView


def local_op(w: NodeView, op: str, arg: Any) -> Any:
    """This worker's part (``commands.server.local_op`` calls it for ``http.*`` ops)."""
    if op == "http.metrics":
        return worker_snapshot(w, int(arg))
    if op == "http.health":  # /readyz: this worker answers (health.py)
        return {"worker": w.index, "pid": os.getpid()}
    if op == "http.job_kinds":
        return job_kinds(w, list(arg))
    return Error(f"ERR unknown node operation '{op}'")


def job_kinds(w: NodeView, job_ids: list[str]) -> dict[str, str]:
    """What each active job of ``job_ids`` held by this worker waits for, which SHOW's
    ``state active`` does not tell: ``delivered`` (to a client, not acknowledged yet),
    ``delayed`` (its ADDJOB DELAY is not over), ``waiting`` (not queued here for another
    reason: a NACK ... DELAY, or a copy waiting for its RETRY). Read only; O(len(job_ids))."""
    kinds: dict[str, str] = {}
    for job_id in job_ids[:job_kinds_ids_max]:
        job = w.shard.lookup(job_id)
        if job is None or job.state != ACTIVE:
            continue
        kinds[job_id] = ("delivered" if job.dtime_ms >= 0 else
                         "delayed" if job.waits_delay() else "waiting")
    return kinds


def worker_snapshot(w: NodeView, queues_max: int) -> dict[str, Any]:
    """Counters of this worker's shard and process: one scrape's worth."""
    stats = w.local_stats()
    stats.pop("shard", None)
    now_ms = wall_ms()
    stats["metrics"] = w.shard.metrics(queues_max, now_ms)
    stats["slowlog_len"] = len(w.slowlog.entries)
    stats["now_ms"] = now_ms
    return stats


def gather(w: NodeView, op: str, arg: Any) -> asyncio.Future[list[Any]]:
    """``local_op(op, arg)`` of every worker, by index; an ``Error`` for a worker that
    is down (the mesh answers for it), so one dead worker never hangs a scrape."""
    fut: asyncio.Future[list[Any]] = w.loop.create_future()

    def done(results: list[Any]) -> None:
        if not fut.done():
            fut.set_result(results)

    on_every_worker(w, op, arg, done)
    return fut
