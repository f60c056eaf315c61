"""A job's life after ADDJOB on its timers and requeues: ``tick`` drains the
shard's one timer heap (``workers/timers.py``) and fires each target: a job's
TTL, its requeue (RETRY or DELAY elapsed; WILLQUEUE first when other nodes may
hold a copy), its next replication step (``wait-repl``) or GC attempt
(``acked``); an idle queue's eviction; a federation state's next NEEDJOBS; a
gathering command's timeout. NACK and ENQUEUE requeue a job by hand (NACK ...
DELAY and WORKING are the core's moves: ``Core.nack_later``, ``Core.working``).

Timer kinds (a target is re-examined as a whole when its bucket fires):
- job TTL: any state, the job is deleted at ``ctime + ttl``;
- job qtime: an active job is queued again (DELAY elapsed, or RETRY elapsed
  after the last queueing without an ACK: additional-deliveries + 1);
- queue idle: an empty queue with no waiter and no pause is evicted after
  ``queue_idle_evict_ms`` (workers/core.py).

``Lifecycle`` is an object the shard owns (``Shard.life``); it changes jobs
through the shard's ``Core`` and hands cluster deadlines to the parts that own
them (replication, the ack GC, federation, the extensions).
"""

from __future__ import annotations

from typing import cast

from workers import messages as msg
from workers.ackgc import AckGc
from workers.core import Core, time_error_ms
from workers.effects import QUEUED_INCR_DELIVERIES, QUEUED_INCR_NACKS
from workers.extensions import Extensions, Gather, past_maxdeliver
from workers.federation import Federation
from workers.job import (
    ACKED,
    ACTIVE,
    DELETED,
    US_PER_MS,
    WAIT_REPL,
    Job,
)
from workers.queue import PAUSED_IN, Fed, Queue
from workers.replication import Replication
from workers.results import Results, ResultWait, Sweep

# Bound on timer targets handled by one tick(): a tick never stalls the event
# loop for long (about 10 ms of work); the rest is due again immediately.
timer_work_per_tick_max = 10_000


class Lifecycle:
    """The shard's timers firing, and the requeue commands."""

    def __init__(self, core: Core, repl: Replication, gc: AckGc, fed: Federation,
                 ext: Extensions, results: Results) -> None:
        self.core = core
        self.results = results
        self.repl = repl
        self.gc = gc
        self.fed = fed
        self.ext = ext

    def tick(self, now_ms: int) -> int | None:
        """Do the timer work due at ``now_ms`` (bounded); return the next due time."""
        c = self.core
        c.set_now(now_ms)
        c.start_firing()
        while True:
            t = c.next_fired(now_ms, timer_work_per_tick_max)
            if t is None:
                break
            if type(t) is Job:
                self._fire_job(t, now_ms)
            elif type(t) is Queue:
                c.fire_queue(t, now_ms)
            elif type(t) is Gather:
                self.ext.fire_gather(t, now_ms)
            elif type(t) is ResultWait:
                self.results.fire_wait(t, now_ms)
            elif type(t) is Sweep:
                self.results.fire_sweep(now_ms)
            else:
                self.fed.fire_fed(cast(Fed, t), now_ms)
        return c.next_deadline(now_ms)

    def _fire_job(self, job: Job, now_ms: int) -> None:
        s = self.core
        if job.ctime_us // US_PER_MS + job.ttl_s * 1000 <= now_ms:
            if job.state == WAIT_REPL:
                self.repl.repl_failed(job, now_ms)
            else:
                s.tally().count_expired()
                s.unregister(job, now_ms)
            return
        if job.state == WAIT_REPL:
            self.repl.fire_wait_repl(job, now_ms)
            return
        if job.state == ACKED:
            if job.qtime_ms and job.qtime_ms <= now_ms:
                self.gc.start_gc(job, now_ms)  # re-arms itself (or drops the job)
            else:
                s.arm(job)
            return
        if (job.state == ACTIVE and job.qtime_ms and not job.willqueue_sent()
                and job.qtime_ms - time_error_ms <= now_ms and job.nodes[0] is not s.view().me):
            job.mark_willqueue_sent()
            others = s.others(job)
            if others:
                s.send_job(others, msg.WILLQUEUE, job)
        if job.state == ACTIVE and job.qtime_ms and job.qtime_ms <= now_ms:
            q = s.queue(job.queue, now_ms)
            if q.paused & PAUSED_IN:
                # paused in input: never requeue now, try again after another retry period
                job.qtime_ms = s.retry_at(job, now_ms, retry_min_s=1)
            else:
                self._requeue_due(job, q, now_ms)
        if job.state != DELETED:
            s.arm(job)

    def _requeue_due(self, job: Job, q: Queue, now_ms: int) -> None:
        """The requeue time of an active job came: RETRY elapsed, the end of its
        DELAY or of a NACK's DELAY (counted by the NACK already)."""
        incr = 0
        if job.nack_delayed():
            job.unmark_nack_delayed()
        else:
            if job.requeue_counts():
                job.additional_deliveries += 1
                incr = QUEUED_INCR_DELIVERIES
            if job.queued_once():  # not the end of a DELAY
                self.core.tally().count_retry()
            if job.has_maxdeliver() and past_maxdeliver(job):
                self.core.dead_letter(job, now_ms, incr)
                return
        self.core.requeue(job, q, now_ms, incr)

    # ------------------------------------------------------------------ by hand

    def requeue(self, job_ids: list[str], now_ms: int, nack: bool, delay_ms: int) -> int:
        """NACK [DELAY] (``nack``) or ENQUEUE: queue active jobs again (after the
        delay), or dead-letter them when a NACK reaches their MAXDELIVER."""
        s = self.core
        tally = s.tally()
        done = 0
        for job_id in job_ids:
            job = s.lookup(job_id)
            # Disque's enqueueJob refuses queued jobs and at-most-once jobs queued once.
            if job is None or job.state != ACTIVE or not job.qtime_ms:
                continue
            q = s.queue(job.queue, now_ms)
            incr = 0
            if nack:
                job.nacks += 1
                tally.count_nack()
                incr = QUEUED_INCR_NACKS
            else:
                tally.count_enqueue()
                if job.was_delivered():  # ENQUEUE of a job never served here: no delivery
                    job.additional_deliveries += 1
                    incr = QUEUED_INCR_DELIVERIES
            if nack and job.has_maxdeliver() and past_maxdeliver(job):
                self.core.dead_letter(job, now_ms, incr)
            elif delay_ms:
                s.nack_later(job, delay_ms, now_ms)
            else:
                s.requeue(job, q, now_ms, incr)
            done += 1
        return done
