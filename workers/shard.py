"""The shard: the jobs and queues one worker owns, as a pure state machine.

Time comes in (``now_ms``, wall clock), effects go out (``take_effects()``),
replies are ``workers/replies.py`` values. Nothing here reads a clock, touches a
socket or uses global randomness: the same calls give the same results, which
is what lets tests run many shards in one process.

Data structures
- jobs: ``job_buckets`` fixed dicts keyed by job ID; the bucket comes from two
  random characters of the ID. Fixed buckets give JSCAN a stable cursor (a
  bucket index): a job never moves, so a scan never skips one that exists for
  the whole scan.
- queues: ``dict`` name -> ``Queue`` (``workers/queue.py``) plus a QSCAN table
  (list with a free list; a queue keeps its position while it exists).
- timers: ONE heap of due times with a bucket of targets each
  (``workers/timers.py``, a ``Timers`` the shard owns and drains in ``tick``).

Timer kinds (a target is re-examined as a whole when its bucket fires):
- job TTL: any state, the job is deleted at ``ctime + ttl``;
- job qtime: an active job is queued again (DELAY elapsed, or RETRY elapsed
  after the last queueing without an ACK: additional-deliveries + 1);
- queue idle: an empty queue with no waiter and no pause is evicted after
  ``queue_idle_evict_ms``.
"""

from __future__ import annotations

import heapq
import random
from bisect import bisect_left
from collections.abc import Set as AbstractSet
from typing import Any, Final, cast

from workers.ackgc import AckGc
from workers.effects import QUEUED_INCR_DELIVERIES, QUEUED_INCR_NACKS, AofAppend, Effect, Wake
from workers.extensions import Extensions, Gather, past_maxdeliver
from workers.federation import Fed, Federation
from workers.ids import JobIdGen, slot_of
from workers.invariant import InvariantError, invariant
from workers.job import (
    ACKED,
    ACTIVE,
    DEL_RECORD_TAG,
    DELETED,
    FLAG_DELIVERED,
    FLAG_NACK_DELAYED,
    FLAG_QUEUED_ONCE,
    FLAG_REQUEUE_COUNTS,
    FLAG_WILLQUEUE_SENT,
    FLAGS_DELAY_MASK,
    FLAGS_MAXDELIVER_MIN,
    QUEUED,
    STATE_NAMES,
    US_PER_MS,
    WAIT_REPL,
    Job,
    body_bytes_max,
    del_record,
    delay_max_s,
    job_id_of_record,
    maxdeliver_max,
    queue_name_bytes_max,
    retry_max_s,
    ttl_max_s,
)
from workers.queue import PAUSE_NAMES, PAUSED_IN, PAUSED_OUT, Queue
from workers.replication import ERR_NOREPL_TIMEOUT, ClusterOps, ReplWait
from workers.replies import (
    ERR_LEAVING,
    ERR_NOJOB,
    ERR_NOREPL,
    ERR_PAUSED,
    NULL_ARRAY,
    Error,
    Status,
)
from workers.timers import Timers
from workers.views import check, jscan, metrics, qscan

# Defaults and limits of the spec (ADDJOB section).
ttl_default_s: Final = 24 * 3600
retry_default_max_s: Final = 300  # default RETRY is TTL/10, at most 5 minutes, at least 1 s
replicate_default_max: Final = 3  # default REPLICATE: the cluster size, at most 3
time_error_ms: Final = 500  # Disque's DISQUE_TIME_ERR: requeue jitter; WILLQUEUE fires this early

# Disque evicts idle empty queues from its cron; the spec only says "after some time".
queue_idle_evict_ms = 30_000

# Bound on timer targets handled by one tick(): a tick never stalls the event
# loop for long (about 10 ms of work); the rest is due again immediately.
timer_work_per_tick_max = 10_000

job_buckets: Final = 4096  # JSCAN cursor space; power of two
_JOB_BUCKET_MASK: Final = job_buckets - 1
qscan_count_default = 100
jscan_count_default = 100

ERR_RETRY0: Final = Error(
    "ERR With RETRY set to 0 please explicitly set  REPLICATE to 1 (at-most-once delivery)"
)
ERR_DELAY_TTL: Final = Error(
    "ERR The specified DELAY is greater than TTL. Job refused since would never be delivered"
)
# Past the named maxima of workers/job.py: the reference has no bound (its 32-bit
# fields wrap); ours refuses with the bound in the text, so every job encodes.
ERR_TTL_MAX: Final = Error(f"ERR TTL must be at most {ttl_max_s} seconds")
ERR_RETRY_MAX: Final = Error(f"ERR RETRY time must be at most {retry_max_s} seconds")
ERR_DELAY_MAX: Final = Error(f"ERR DELAY time must be at most {delay_max_s} seconds")
ERR_MAXDELIVER: Final = Error(f"ERR MAXDELIVER must be between 1 and {maxdeliver_max}")
ERR_QUEUE_NAME_MAX: Final = Error(f"ERR queue name too long (at most {queue_name_bytes_max} bytes)")
ERR_BODY_MAX: Final = Error(f"ERR job body too large (at most {body_bytes_max} bytes)")
ERR_NOREPL_LEAVING: Final = Error(
    "NOREPL Not enough reachable nodes for the requested replication level, since I'm "
    "unable to hold a copy of the message for the following reason: I'm leaving the cluster"
)
# Past 75 % of maxmemory (disque_mp/node/memory.py); Disque's text for that reason.
ERR_NOREPL_MEMORY: Final = Error(
    "NOREPL Not enough reachable nodes for the requested replication level, since I'm "
    "unable to hold a copy of the message for the following reason: I'm out of memory"
)
ERR_MAXLEN_REACHED: Final = Error("MAXLEN Queue is already longer than the specified MAXLEN count")
ERR_TOOLATE: Final = Error(
    "TOOLATE Half of job TTL already elapsed, you are no longer allowed to postpone "
    "the next delivery."
)

# Observability (/metrics, disque_mp/node/http/): histogram bounds in ms of a job's wait
# (ADDJOB to its first delivery) and processing (a delivery to its ACK); one extra
# bucket past the last bound. The shard only counts; the HTTP side exports seconds.
latency_bounds_ms: Final = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000,
                            60_000, 300_000, 900_000, 3_600_000)
# Queueing a job ends a WILLQUEUE round and any NACK ... DELAY wait.
_FLAGS_QUEUE_CLEARS: Final = FLAG_WILLQUEUE_SENT | FLAG_NACK_DELAYED

_K_NACKS: Final = b"nacks"
_K_ADD_DELIV: Final = b"additional-deliveries"


def _over_bounds(queue: bytes, body: bytes, ttl_s: int, delay_s: int, retry_s: int | None,
                 maxdeliver: int) -> Error | None:
    """ADDJOB past a bound of workers/job.py (the job could not be encoded)."""
    if not 0 <= maxdeliver <= maxdeliver_max:
        return ERR_MAXDELIVER
    if len(queue) > queue_name_bytes_max or len(body) > body_bytes_max:
        return ERR_QUEUE_NAME_MAX if len(queue) > queue_name_bytes_max else ERR_BODY_MAX
    if ttl_s > ttl_max_s or delay_s > delay_max_s or (retry_s is not None and retry_s > retry_max_s):
        return ERR_TTL_MAX if ttl_s > ttl_max_s else (
            ERR_DELAY_MAX if delay_s > delay_max_s else ERR_RETRY_MAX)
    return None


def job_bucket(job_id: str) -> int:
    """JSCAN bucket: two characters of the random part of the ID (deterministic)."""
    return (ord(job_id[14]) * 97 + ord(job_id[15])) & _JOB_BUCKET_MASK


class Waiter:
    """A blocked GETJOB registered on this shard."""

    __slots__ = ("token", "queues", "count", "withcounters")

    def __init__(self, token: int, queues: list[bytes], count: int, withcounters: bool) -> None:
        self.token = token
        self.queues = queues
        self.count = count
        self.withcounters = withcounters


class Shard(ClusterOps):
    def __init__(
        self,
        node_id: str,
        index: int,
        workers: int,
        seed: bytes,
        rng: random.Random,
        now_ms: int,
        *,
        queue_idle_ms: int = queue_idle_evict_ms,
    ) -> None:
        self.node_id = node_id
        self.index = index
        self.workers = workers
        # Every worker mints IDs from its own stream: mix the index into the seed.
        self._seed = seed + index.to_bytes(4, "big")
        self._ids = JobIdGen(node_id, self._seed)
        self._rng = rng
        self._queue_idle_ms = queue_idle_ms
        self._me: tuple[str, ...] = (node_id,)
        self._peers: tuple[str, ...] = ()  # replication targets: reachable, not leaving
        self._known: tuple[str, ...] = ()  # every other known node (cluster size - 1)
        self._reach = None  # reachable nodes, leaving too (set_view)
        self._leaving: bool = False
        self._memory_level = 0  # set_memory_level(): 0 ok, 1 >= 75 %, 2 >= 95 %, 3 >= 100 %
        self._effects: list[Effect] = []
        self._last_ctime_us = 0
        self._now_ms = now_ms
        # Emit AofAppend effects (job records, deletions): the worker sets this
        # while appendonly is on, so the records cost nothing otherwise.
        self.aof = False
        # Totals for /metrics: monotonic over the process (FLUSHALL keeps them).
        self.stat_added = 0  # jobs created by ADDJOB here
        self.stat_delivered = 0  # jobs taken from a queue for a GETJOB
        self.stat_acked = 0  # known jobs acknowledged by ACKJOB / FASTACK
        self.stat_nacked = 0  # requeued by NACK
        self.stat_requeued_retry = 0  # requeued because RETRY elapsed without an ACK
        self.stat_requeued_enqueue = 0  # requeued by ENQUEUE
        self.stat_expired = 0  # deleted because their TTL elapsed
        self.stat_dead_lettered = 0  # moved to dead:<queue> by MAXDELIVER
        self.wait_counts = [0] * (len(latency_bounds_ms) + 1)
        self.wait_sum_ms = 0
        self.proc_counts = [0] * (len(latency_bounds_ms) + 1)
        self.proc_sum_ms = 0
        self.gc = AckGc(self)  # SETACK / GOTACK / DELJOB, dummy ACKs, gone IDs
        self.fed = Federation(self)  # NEEDJOBS / YOURJOBS
        self.ext = Extensions(self)  # NACK DELAY, MAXDELIVER, WAITJOB, GLOBALQLEN, DELQUEUE
        self._reset_state()

    def _reset_state(self) -> None:
        self._jobs: list[dict[str, Job] | None] = [None] * job_buckets
        self._njobs = 0
        self.body_bytes = 0  # sum of len(body) of registered jobs (memory accounting)
        self._queues: dict[bytes, Queue] = {}
        self._qscan: list[Queue | None] = []
        self._qscan_free: list[int] = []
        self.timers = Timers()
        self._waiters: dict[int, Waiter] = {}
        self._repl: dict[str, ReplWait] = {}  # wait-repl jobs -> the blocked ADDJOB
        self.gc.reset()
        self.fed.reset()
        # /metrics: delivered and not acked jobs (their count, and per queue; each
        # job keeps its delivery ms), jobs waiting for their DELAY per queue. The
        # per-queue entries exist only while non-zero.
        self._outstanding = 0  # jobs delivered and not acked (Job.dtime_ms >= 0)
        self._active: dict[bytes, int] = {}
        self._delayed: dict[bytes, int] = {}

    # ------------------------------------------------------------------ plumbing

    def take_effects(self) -> list[Effect]:
        eff = self._effects
        if eff:
            self._effects = []
        return eff

    def set_peers(self, reachable_node_ids: list[str] | tuple[str, ...]) -> None:
        """Other nodes, all reachable (``set_view`` gives the full picture). Empty: single node."""
        self._peers = tuple(n for n in reachable_node_ids if n != self.node_id)
        self._known = self._peers
        self._reach = None

    def has_peers(self) -> bool:
        """Other reachable nodes can take copies: a default ADDJOB then waits for
        replication (PENDING) instead of answering at once."""
        return bool(self._peers)

    def _set_node_id(self, node_id: str) -> None:
        """CLUSTER RESET HARD gave the node a new ID: new jobs carry it."""
        self.node_id = node_id
        self._me = (node_id,)
        self._ids = JobIdGen(node_id, self._seed)

    def set_memory_level(self, level: int) -> None:
        """Memory warning level from disque_mp/node/memory.py: from 1 (75 % of maxmemory) on,
        ADDJOB replicates externally only, like a leaving node."""
        self._memory_level = level

    def lookup(self, job_id: str) -> Job | None:
        b = self._jobs[job_bucket(job_id)]
        return None if b is None else b.get(job_id)

    def _register(self, job: Job) -> None:
        jid = job.id
        i = job_bucket(jid)
        b = self._jobs[i]
        if b is None:
            b = self._jobs[i] = {}
        elif jid in b:
            raise InvariantError(f"job {jid} registered twice")
        b[jid] = job
        self._njobs += 1
        self.body_bytes += len(job.body)
        if job.flags & FLAGS_DELAY_MASK and not job.flags & FLAG_QUEUED_ONCE:
            self._delayed[job.queue] = self._delayed.get(job.queue, 0) + 1

    def _unregister(self, job: Job, now_ms: int) -> None:
        jid = job.id
        b = self._jobs[job_bucket(jid)]
        if b is None or b.pop(jid, None) is not job:
            raise InvariantError(f"unregister of unknown job {jid}")
        self._njobs -= 1
        self.body_bytes -= len(job.body)
        if self.aof:
            self._effects.append(AofAppend(del_record(jid)))
        if self._repl:
            rw = self._repl.pop(jid, None)
            if rw is not None:
                self._effects.append(Wake(rw.token, ERR_NOREPL_TIMEOUT))
        gc = self.gc
        if gc.tries:
            gc.tries.pop(jid, None)
        ext = self.ext
        if ext.waits:
            ext.job_done(jid)
        self._forget_delivery(job)
        if job.flags & FLAGS_DELAY_MASK and not job.flags & FLAG_QUEUED_ONCE:
            self._undelay(job)
        was = job.state
        job.state = DELETED
        # Stale timer-bucket and deque entries keep the record until purged (up to
        # its TTL): they must not keep the body, which memory accounting no longer counts.
        job.body = b""
        if was == QUEUED:
            q = self._queues[job.queue]
            q.remove(job)
            self._maybe_idle(q, now_ms)
        self.timers.unschedule(job)

    def _queue(self, name: bytes, now_ms: int) -> Queue:
        q = self._queues.get(name)
        if q is None:
            q = self._create_queue(name, now_ms)
        return q

    def _create_queue(self, name: bytes, now_ms: int) -> Queue:
        name = bytes(name)  # the canonical name object every job of the queue shares
        q = Queue(name, slot_of(name), now_ms)
        self._queues[name] = q
        if self._qscan_free:
            q.scan_idx = self._qscan_free.pop()
            self._qscan[q.scan_idx] = q
        else:
            q.scan_idx = len(self._qscan)
            self._qscan.append(q)
        self._maybe_idle(q, now_ms)
        return q

    def _maybe_idle(self, q: Queue, now_ms: int) -> None:
        """Arm the eviction check of a queue that has become empty and unwatched."""
        if not q.live and q.waiters is None and not q.paused:
            self.timers.schedule(q, q.atime_ms + self._queue_idle_ms)

    def op_evict_queue(self, name: bytes) -> bool:
        """Memory pressure (workers/evict.py): drop an empty queue nobody waits on and
        nobody paused now, as the idle timer would later. False if it must stay."""
        q = self._queues.get(name)
        if q is None or q.live or q.waiters is not None or q.paused:
            return False
        self._evict(q)
        return True

    def _evict(self, q: Queue) -> None:
        del self._queues[q.name]
        self._qscan[q.scan_idx] = None
        self._qscan_free.append(q.scan_idx)
        q.drop_all()
        self.timers.unschedule(q)
        if self.fed.feds:
            fed = self.fed.feds.pop(q.name, None)
            if fed is not None:
                self.timers.unschedule(fed)

    # ------------------------------------------------------------------ timers

    def tick(self, now_ms: int) -> int | None:
        """Do the timer work due at ``now_ms`` (bounded); return the next due time."""
        self._now_ms = now_ms
        timers = self.timers
        heap = timers.heap
        work = 0
        while heap and heap[0] <= now_ms:
            key = heap[0]
            b = timers.buckets[key]
            timers.firing_key = key
            while b.items:
                if work >= timer_work_per_tick_max:
                    timers.firing_key = 0
                    return now_ms
                t = b.items.pop()
                work += 1
                if t.awake_ms != key:
                    continue  # stale entry: moved to another bucket or deleted
                t.awake_ms = 0
                if type(t) is Job:
                    self._fire_job(t, now_ms)
                elif type(t) is Queue:
                    self._fire_queue(t, now_ms)
                elif type(t) is Gather:
                    self.ext.fire_gather(t, now_ms)
                else:
                    self.fed.fire_fed(cast(Fed, t), now_ms)
            timers.firing_key = 0
            invariant(heapq.heappop(heap) == key, "timer heap top changed while firing")
            del timers.buckets[key]
        return heap[0] if heap else None

    def _due(self, job: Job) -> int:
        """The job's next deadline: TTL; requeue (WILLQUEUE 500 ms earlier when other
        nodes may have a copy); next replication step (wait-repl); next GC (acked)."""
        etime = job.ctime_us // US_PER_MS + job.ttl_s * 1000
        qt = job.qtime_ms
        if qt and job.state != QUEUED:
            if (job.state == ACTIVE and not job.flags & FLAG_WILLQUEUE_SENT
                    and job.nodes[0] is not self._me):
                qt -= time_error_ms
            if qt < etime:
                return qt
        return etime

    def _fire_job(self, job: Job, now_ms: int) -> None:
        if job.ctime_us // US_PER_MS + job.ttl_s * 1000 <= now_ms:
            if job.state == WAIT_REPL:
                self._repl_failed(job, now_ms)
            else:
                self.stat_expired += 1
                self._unregister(job, now_ms)
            return
        if job.state == WAIT_REPL:
            self._fire_wait_repl(job, now_ms)
            return
        if job.state == ACKED:
            if job.qtime_ms and job.qtime_ms <= now_ms:
                self.gc.start_gc(job, now_ms)  # re-arms itself (or drops the job)
            else:
                self.timers.schedule(job, self._due(job))
            return
        if (job.state == ACTIVE and job.qtime_ms and not job.flags & FLAG_WILLQUEUE_SENT
                and job.qtime_ms - time_error_ms <= now_ms and job.nodes[0] is not self._me):
            job.flags |= FLAG_WILLQUEUE_SENT
            others = self._others(job)
            if others:
                self._send_job(others, "WILLQUEUE", job)
        if job.state == ACTIVE and job.qtime_ms and job.qtime_ms <= now_ms:
            q = self._queue(job.queue, now_ms)
            if q.paused & PAUSED_IN:
                # paused in input: never requeue now, try again after another retry period
                job.qtime_ms = now_ms + max(job.retry_s, 1) * 1000 + self._jitter()
            else:
                self._requeue_due(job, q, now_ms)
        if job.state != DELETED:
            self.timers.schedule(job, self._due(job))

    def _requeue_due(self, job: Job, q: Queue, now_ms: int) -> None:
        """The requeue time of an active job came: RETRY elapsed, the end of its
        DELAY or of a NACK's DELAY (counted by the NACK already)."""
        incr = 0
        if job.flags & FLAG_NACK_DELAYED:
            job.flags &= ~FLAG_NACK_DELAYED
        else:
            if job.flags & FLAG_REQUEUE_COUNTS:
                job.additional_deliveries += 1
                incr = QUEUED_INCR_DELIVERIES
            if job.flags & FLAG_QUEUED_ONCE:  # not the end of a DELAY
                self.stat_requeued_retry += 1
            if job.flags >= FLAGS_MAXDELIVER_MIN and past_maxdeliver(job):
                self.ext.dead_letter(job, now_ms, incr)
                return
        self._requeue(job, q, now_ms, incr)

    def _fire_queue(self, q: Queue, now_ms: int) -> None:
        if self._queues.get(q.name) is not q:
            return
        if q.live or q.waiters is not None or q.paused:
            return  # re-armed when it becomes idle again
        if q.atime_ms + self._queue_idle_ms <= now_ms:
            self._evict(q)
        else:
            self.timers.schedule(q, q.atime_ms + self._queue_idle_ms)

    def _jitter(self) -> int:
        return int(self._rng.random() * time_error_ms)

    # ------------------------------------------------------------------ queue moves

    def _requeue(self, job: Job, q: Queue, now_ms: int, incr: int = 0) -> None:
        """Queue a known job again (retry timer, NACK, ENQUEUE): QUEUED to the
        other holders as the re-queueing state machine says, and log the state.
        ``incr`` (QUEUED_INCR_*): the counter this requeue incremented here, which
        the other holders increment too."""
        self._enqueue(job, q, now_ms)
        if job.nodes[0] is not self._me and job.state == QUEUED:
            self._send_queued(job, incr)
        if self.aof:
            self._effects.append(AofAppend(job.to_record()))

    def _enqueue(self, job: Job, q: Queue, now_ms: int, serve: bool = True) -> None:
        """Disque's enqueueJob minus its checks: the job becomes QUEUED in ``q``.
        ``serve=False``: the caller queues a batch and serves waiters after it."""
        job.state = QUEUED
        flags = job.flags
        if flags & FLAGS_DELAY_MASK and not flags & FLAG_QUEUED_ONCE:
            self._undelay(job)
        self._forget_delivery(job)  # queued again (retry, NACK, ENQUEUE, a peer's QUEUED)
        job.flags = (flags & ~_FLAGS_QUEUE_CLEARS) | FLAG_QUEUED_ONCE
        if job.retry_s:
            job.qtime_ms = now_ms + job.retry_s * 1000 + int(self._rng.random() * time_error_ms)
        else:
            job.qtime_ms = 0  # at-most-once: never queued again
        q.push(job)
        q.atime_ms = now_ms
        q.jobs_in += 1
        self.timers.schedule(job, job.ctime_us // US_PER_MS + job.ttl_s * 1000)
        if not serve:
            return
        if q.waiters is not None and not q.paused & PAUSED_OUT:
            self._serve_waiters(q, now_ms)
        elif self.fed.asks and q.live == 1 and q.waiters is None:
            self.fed.push_to_asker(q, now_ms)

    def _dequeue(self, job: Job, q: Queue, now_ms: int) -> None:
        """A QUEUED job goes back to ACTIVE without being delivered."""
        job.state = ACTIVE
        q.remove(job)
        self._maybe_idle(q, now_ms)
        if job.qtime_ms:
            self.timers.schedule(job, job.qtime_ms)

    def _deliver(self, job: Job, q: Queue, now_ms: int, withcounters: bool) -> list[Any]:
        """``job`` was just popped from ``q`` for a client: make it ACTIVE, build its entry."""
        job.state = ACTIVE
        if not job.flags & FLAG_DELIVERED:
            wait_ms = now_ms - job.ctime_us // US_PER_MS
            self.wait_counts[bisect_left(latency_bounds_ms, wait_ms)] += 1
            self.wait_sum_ms += wait_ms
            job.flags |= FLAG_DELIVERED
        self.stat_delivered += 1
        if job.dtime_ms < 0:
            self._active[q.name] = self._active.get(q.name, 0) + 1
            self._outstanding += 1
        job.dtime_ms = now_ms
        q.jobs_out += 1
        q.atime_ms = now_ms
        if job.qtime_ms:
            if job.qtime_ms <= now_ms:
                # It waited in the queue longer than RETRY: counting RETRY from the
                # queueing would requeue it at once, a certain duplicate delivery.
                job.qtime_ms = now_ms + job.retry_s * 1000 + self._jitter()
            self.timers.schedule(job, job.qtime_ms)
        if withcounters:
            return [q.name, job.id, job.body, _K_NACKS, job.nacks,
                    _K_ADD_DELIV, job.additional_deliveries]
        return [q.name, job.id, job.body]

    def _serve_waiters(self, q: Queue, now_ms: int) -> None:
        while q.live and q.waiters:
            token = next(iter(q.waiters))
            w = self._waiters[token]
            self._drop_waiter(w, now_ms)
            entries: list[list[Any]] = []
            while len(entries) < w.count:
                job = q.pop()
                if job is None:
                    break
                entries.append(self._deliver(job, q, now_ms, w.withcounters))
            self._effects.append(Wake(token, entries))
        self._maybe_idle(q, now_ms)
        if not q.live and self.fed.feds:
            self.fed.needjobs(q, True, now_ms)  # drained: ask the recent sources at once

    def _drop_waiter(self, w: Waiter, now_ms: int) -> None:
        del self._waiters[w.token]
        for name in w.queues:
            q = self._queues.get(name)
            if q is not None and q.waiters is not None:
                q.waiters.pop(w.token, None)
                if not q.waiters:
                    q.waiters = None
                    self._maybe_idle(q, now_ms)

    # ------------------------------------------------------------------ ADDJOB / GETJOB

    def op_addjob(self, queue: bytes, body: bytes, *, timeout_ms: int, replicate: int | None,
                  delay_s: int, retry_s: int | None, ttl_s: int, maxlen: int, async_: bool,
                  token: int, now_ms: int, maxdeliver: int = 0) -> Any:
        """ADDJOB after argument parsing; checks in the reference's order (maxdeliver 0: none)."""
        if (maxdeliver or len(queue) > queue_name_bytes_max or len(body) > body_bytes_max
                or ttl_s > ttl_max_s or delay_s > delay_max_s
                or (retry_s is not None and retry_s > retry_max_s)):
            err = _over_bounds(queue, body, ttl_s, delay_s, retry_s, maxdeliver)
            if err is not None:
                return err
        peers = len(self._peers)  # reachable nodes that can take a copy
        flexible = replicate is None
        if replicate is None:
            # The cluster size up to 3, counting the nodes we can reach (Disque counts
            # every known node: a dead one would make default ADDJOBs fail or hang).
            size = peers + 1
            replicate = size if size < replicate_default_max else replicate_default_max
        if replicate > 1 and retry_s == 0:
            return ERR_RETRY0
        if delay_s >= ttl_s:
            return ERR_DELAY_TTL
        if retry_s is None:
            retry_s = ttl_s // 10
            if retry_s > retry_default_max_s:
                retry_s = retry_default_max_s
            elif retry_s == 0:
                retry_s = 1
        # A leaving node, or one past 75 % of maxmemory, holds no copy itself:
        # every replica must be external (Disque's extrepl).
        extrepl = self._leaving or self._memory_level > 0
        additional = replicate if extrepl else replicate - 1
        if additional > peers:
            if extrepl and additional - 1 == peers:
                return ERR_NOREPL_LEAVING if self._leaving else ERR_NOREPL_MEMORY
            return ERR_NOREPL
        q = self._queues.get(queue)
        if q is None:
            q = self._create_queue(queue, now_ms)
        elif maxlen and q.live >= maxlen:
            return ERR_MAXLEN_REACHED
        elif q.paused & PAUSED_IN:
            return ERR_PAUSED
        ctime_us = now_ms * US_PER_MS
        if ctime_us <= self._last_ctime_us:
            ctime_us = self._last_ctime_us + 1
        self._last_ctime_us = ctime_us
        job_id = self._ids.make(q.slot, ttl_s, retry_s)
        job = Job(job_id, q.name, body, ACTIVE, replicate, ttl_s, ctime_us, delay_s, retry_s,
                  0, self._me)
        if maxdeliver:
            job.set_maxdeliver(maxdeliver)
        self.stat_added += 1
        if additional:
            return self._addjob_cluster(job, q, additional, extrepl, timeout_ms, async_, token,
                                        now_ms, flexible)
        self._register(job)
        if delay_s:
            job.qtime_ms = now_ms + delay_s * 1000
            self.timers.schedule(job, job.qtime_ms)
        else:
            self._enqueue(job, q, now_ms)
        if self.aof:
            self._effects.append(AofAppend(job.to_record()))
        return Status(job_id)

    def op_take(
        self, queues: list[bytes], count: int, withcounters: bool, now_ms: int
    ) -> list[list[Any]]:
        """Non-blocking GETJOB on this shard: one job per queue per pass, left to right."""
        if len(queues) == 1:
            q = self._queues.get(queues[0])
            if q is None:
                q = self._create_queue(queues[0], now_ms)
            out: list[list[Any]] = []
            if q.paused & PAUSED_OUT:
                return out
            while len(out) < count:
                job = q.pop()
                if job is None:
                    break
                out.append(self._deliver(job, q, now_ms, withcounters))
            if not q.live:
                self._maybe_idle(q, now_ms)
                if out and self.fed.feds:
                    self.fed.needjobs(q, True, now_ms)
            return out
        return self._take_many(queues, count, withcounters, now_ms)

    def _take_many(
        self, queues: list[bytes], count: int, withcounters: bool, now_ms: int
    ) -> list[list[Any]]:
        qs = []
        for name in queues:
            q = self._queue(name, now_ms)
            if not q.paused & PAUSED_OUT:
                qs.append(q)
        out: list[list[Any]] = []
        while len(out) < count:
            before = len(out)
            for q in qs:
                job = q.pop()
                if job is not None:
                    out.append(self._deliver(job, q, now_ms, withcounters))
                    if len(out) >= count:
                        break
            if len(out) == before:
                break
        for q in qs:
            if not q.live:
                self._maybe_idle(q, now_ms)
        return out

    def op_block(
        self, token: int, queues: list[bytes], count: int, withcounters: bool, now_ms: int
    ) -> None:
        """Register a blocked GETJOB; it is answered later by ``Wake(token, entries)``.

        If a job is already available (it arrived while the coordinator was asking
        other owners), the waiter is served at once, still through ``Wake``.
        """
        if token in self._waiters:
            self.op_unblock(token, now_ms)
        entries = self.op_take(queues, count, withcounters, now_ms)
        if entries:
            self._effects.append(Wake(token, entries))
            return
        if self._leaving:
            self._effects.append(Wake(token, ERR_LEAVING))  # spec: a leaving node never blocks
            return
        w = Waiter(token, list(queues), count, withcounters)
        self._waiters[token] = w
        for name in queues:
            q = self._queue(name, now_ms)
            if q.waiters is None:
                q.waiters = {}
                fed = self.fed.feds.get(q.name) if self.fed.feds else None
                if fed is not None:
                    fed.bcast_attempt = 0  # a new wait starts with short delays
            q.waiters[token] = w
            self.timers.unschedule(q)  # a watched queue is not evicted
            if self._known:
                self.fed.needjobs(q, False, now_ms)

    def op_unblock(self, token: int, now_ms: int | None = None,
                   forget_queues: bool = False) -> None:
        """Drop a waiter. ``forget_queues``: it was released by a flush of the node
        (DEBUG FLUSHALL, CLUSTER RESET) that this shard ran before the waiter came
        (another worker's BLOCK, sent before that flush); the queues it waited on
        that are empty and idle now go at once, as the flush would have taken them."""
        w = self._waiters.get(token)
        if w is None:
            return
        self._drop_waiter(w, self._now_ms if now_ms is None else now_ms)
        if forget_queues:
            for name in w.queues:
                q = self._queues.get(name)
                if q is not None and not q.live and q.waiters is None and not q.paused:
                    self._evict(q)

    def op_return(self, job_ids: list[str], now_ms: int) -> None:
        """Give back jobs a multi-owner GETJOB took but did not send: no delivery counted."""
        for job_id in job_ids:
            job = self.lookup(job_id)
            if job is None or job.state != ACTIVE:
                continue
            q = self._queue(job.queue, now_ms)
            if not job.nacks and not job.additional_deliveries:
                job.flags &= ~FLAG_DELIVERED  # that take was its only delivery
            self._forget_delivery(job)
            if q.jobs_out:
                q.jobs_out -= 1
            job.state = QUEUED
            q.push(job)
            self.timers.schedule(job, job.ctime_us // US_PER_MS + job.ttl_s * 1000)
            if q.waiters is not None and not q.paused & PAUSED_OUT:
                self._serve_waiters(q, now_ms)

    # ------------------------------------------------------------------ job-addressed ops

    def op_ackjob(self, job_ids: list[str], now_ms: int) -> int:
        known = 0
        for job_id in job_ids:
            job = self.lookup(job_id)
            if job is None:
                if self._known:
                    self.gc.ackjob_unknown(job_id, now_ms)  # dummy ACK (not counted, as Disque)
                continue
            known += 1
            self._observe_processing(job, now_ms)
            self._ack(job, now_ms)
        self.stat_acked += known
        return known

    def _ack(self, job: Job, now_ms: int) -> None:
        d = job.delivered
        if d is self._me or (d and all(n == self.node_id for n in d)):
            # Nobody else may have a copy: the ACK is final, the job goes at once.
            if job.state == QUEUED:
                self._dequeue(job, self._queues[job.queue], now_ms)
            self._unregister(job, now_ms)
            return
        if self._ack_cluster(job, now_ms):
            self.gc.start_gc(job, now_ms)

    def op_fastack(self, job_ids: list[str], now_ms: int) -> int:
        """Delete, and a best-effort DELJOB to the nodes that may have a copy (to
        every node when we do not know the job)."""
        known = 0
        for job_id in job_ids:
            job = self.lookup(job_id)
            if job is not None:
                known += 1
                self._observe_processing(job, now_ms)
                if job.nodes[0] is not self._me:
                    self.gc.fastack_cluster(job_id, job)
                self._unregister(job, now_ms)
            elif self._known:
                self.gc.fastack_cluster(job_id, None)
        self.stat_acked += known
        return known

    def op_deljob(self, job_ids: list[str], now_ms: int) -> int:
        known = 0
        for job_id in job_ids:
            job = self.lookup(job_id)
            if job is not None:
                known += 1
                self._unregister(job, now_ms)
        return known

    def op_nack(self, job_ids: list[str], now_ms: int, delay_s: int = 0) -> int:
        """NACK [DELAY s]: queued again (after the delay), or dead-lettered when the
        job's MAXDELIVER is reached."""
        return self._requeue_cmd(job_ids, now_ms, nack=True, delay_ms=delay_s * 1000)

    def op_enqueue(self, job_ids: list[str], now_ms: int) -> int:
        return self._requeue_cmd(job_ids, now_ms, nack=False)

    def _requeue_cmd(self, job_ids: list[str], now_ms: int, *, nack: bool,
                     delay_ms: int = 0) -> int:
        done = 0
        for job_id in job_ids:
            job = self.lookup(job_id)
            # Disque's enqueueJob refuses queued jobs and at-most-once jobs queued once.
            if job is None or job.state != ACTIVE or not job.qtime_ms:
                continue
            q = self._queue(job.queue, now_ms)
            incr = 0
            if nack:
                job.nacks += 1
                self.stat_nacked += 1
                incr = QUEUED_INCR_NACKS
            else:
                self.stat_requeued_enqueue += 1
                if job.flags & FLAG_DELIVERED:  # ENQUEUE of a job never served here: no delivery
                    job.additional_deliveries += 1
                    incr = QUEUED_INCR_DELIVERIES
            if nack and job.flags >= FLAGS_MAXDELIVER_MIN and past_maxdeliver(job):
                self.ext.dead_letter(job, now_ms, incr)
            elif delay_ms:
                self.ext.nack_later(job, delay_ms, now_ms)
            else:
                self._requeue(job, q, now_ms, incr)
            done += 1
        return done

    def op_dequeue(self, job_ids: list[str], now_ms: int) -> int:
        done = 0
        for job_id in job_ids:
            job = self.lookup(job_id)
            if job is not None and job.state == QUEUED:
                self._dequeue(job, self._queues[job.queue], now_ms)
                if self.aof:
                    self._effects.append(AofAppend(job.to_record()))
                done += 1
        return done

    def op_working(self, job_id: str, now_ms: int) -> Any:
        job = self.lookup(job_id)
        if job is None or job.state == ACKED:
            return ERR_NOJOB
        if (now_ms - job.ctime_us // US_PER_MS) > job.ttl_s * 1000 // 2:
            return ERR_TOOLATE
        if job.state == QUEUED:
            self._dequeue(job, self._queues[job.queue], now_ms)
        if job.retry_s and job.state != WAIT_REPL:
            job.qtime_ms = now_ms + job.retry_s * 1000 + self._jitter()
            job.flags &= ~FLAG_WILLQUEUE_SENT
            self.timers.unschedule(job)
            self.timers.schedule(job, self._due(job))
            if job.nodes[0] is not self._me:
                self._send_working(job)  # the other copies must not requeue it either
        if self.aof:
            self._effects.append(AofAppend(job.to_record()))
        return job.retry_s

    def op_show(self, job_id: str, now_ms: int) -> Any:
        job = self.lookup(job_id)
        if job is None:
            return None
        return self._show(job, now_ms)

    def _show(self, job: Job, now_ms: int) -> list[Any]:
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
        ] + ([b"maxdeliver", job.maxdeliver] if job.flags >= FLAGS_MAXDELIVER_MIN else [])  # fmt: skip

    # ------------------------------------------------------------------ queue-addressed ops

    def op_qlen(self, queue: bytes) -> int:
        q = self._queues.get(queue)
        return 0 if q is None else q.live

    def op_qpeek(self, queue: bytes, count: int) -> list[list[Any]]:
        q = self._queues.get(queue)
        if q is None:
            return []
        jobs = q.oldest(count) if count >= 0 else q.newest(-count)
        return [[q.name, j.id, j.body] for j in jobs]

    def op_qstat(self, queue: bytes, now_ms: int) -> Any:
        q = self._queues.get(queue)
        if q is None:
            return NULL_ARRAY  # the reference answers *-1 here (SHOW answers $-1)
        imports, rate = self.fed.qstat_import(q, now_ms) if self.fed.feds else ([], 0)
        return [
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
        ]  # fmt: skip

    def op_pause(self, queue: bytes, opts: list[str], now_ms: int) -> Status:
        """PAUSE with validated lowercase options; replies the resulting state.

        As in Disque the new state is built from the options alone (``in`` then
        ``out`` in two commands leaves ``out``); ``bcast`` sends the resulting state
        to every reachable node.
        """
        flags = 0
        update = False
        for opt in opts:
            if opt == "none":
                flags = 0
                update = True
            elif opt == "in":
                flags |= PAUSED_IN
                update = True
            elif opt == "out":
                flags |= PAUSED_OUT
                update = True
            elif opt == "all":
                flags |= PAUSED_IN | PAUSED_OUT
                update = True
        q = self._set_pause(queue, flags, now_ms) if update else self._queues.get(queue)
        state = q.paused if q is not None else 0
        if "bcast" in opts:
            # Every reachable node gets the resulting state (spec: PAUSE ... bcast).
            self._send("*", "PAUSE", slot_of(queue), {"f": state}, [bytes(queue)])
        return Status(PAUSE_NAMES[state])

    def _set_pause(self, queue: bytes, flags: int, now_ms: int) -> Queue | None:
        q = self._queues.get(queue)
        if q is None and not flags:
            return None
        q = self._queue(queue, now_ms)
        was_out = q.paused & PAUSED_OUT
        q.paused = flags
        if flags:
            self.timers.unschedule(q)  # paused queues are never evicted
        elif not q.live:
            self._maybe_idle(q, now_ms)
        if was_out and not flags & PAUSED_OUT and q.waiters is not None:
            self._serve_waiters(q, now_ms)
        return q

    # ------------------------------------------------------------------ scans

    def op_qscan(
        self, cursor: int, count: int, minlen: int, maxlen: int, importrate: int
    ) -> tuple[int, list[bytes]]:
        """Queues from table position ``cursor``; next cursor 0 means done (views.py)."""
        return qscan(self, cursor, count, minlen, maxlen, importrate)

    def op_jscan(
        self,
        cursor: int,
        count: int,
        queue: bytes | None,
        states: AbstractSet[int] | None,
        reply_all: bool,
        now_ms: int,
    ) -> tuple[int, list[Any]]:
        """Jobs from bucket ``cursor``; items are ``Status(id)`` or SHOW arrays (views.py)."""
        return jscan(self, cursor, count, queue, states, reply_all, now_ms)

    # ------------------------------------------------------------------ extensions

    def op_waitjob(self, token: int, job_ids: list[str], timeout_ms: int, now_ms: int) -> Any:
        return self.ext.op_waitjob(token, job_ids, timeout_ms, now_ms)

    def op_globalqlen(self, token: int, queue: bytes, now_ms: int) -> Any:
        return self.ext.op_globalqlen(token, queue, now_ms)

    def op_delqueue(self, token: int, queue: bytes, local: bool, now_ms: int) -> Any:
        return self.ext.op_delqueue(token, queue, local, now_ms)

    def yourjobs_unsent(self, bodies: list[bytes], now_ms: int) -> None:
        self.fed.yourjobs_unsent(bodies, now_ms)

    def _is_gone(self, job_id: str, now_ms: int) -> bool:
        """Acked or deleted cluster-wide lately (workers/ackgc.py): a copy must not come back."""
        gc = self.gc
        return bool(gc.gone) and gc.is_gone(job_id, now_ms)

    # ------------------------------------------------------------------ persistence

    def load_record(self, record: bytes, enqueue: bool, now_ms: int) -> None:
        """Replay one AOF record (docs/persistence.md): a job record registers or
        replaces its job, a deletion record removes it. Raises ``ValueError`` on a
        malformed record. Emits nothing (the record is already in a file).

        A loaded job is ``active`` with its retry timer, unless it was queued and
        ``enqueue`` (controlled restart) asks to queue it again; at-most-once jobs
        queued once keep qtime 0 and so are never queued again; ``acked`` stays
        acked unless no other node has a copy (then it is simply gone).
        """
        if record[:1] == bytes((DEL_RECORD_TAG,)):
            gone = self.lookup(job_id_of_record(record))
            if gone is not None:
                self._unregister_quiet(gone, now_ms)
            return
        job = Job.from_record(record)
        old = self.lookup(job.id)
        if old is not None:
            self._unregister_quiet(old, now_ms)  # a later record of the same job wins
        if job.etime_ms <= now_ms:
            return
        if job.state == ACKED and all(n == self.node_id for n in job.delivered):
            return
        if job.delivered == self._me:
            job.delivered = self._me  # the same tuple object as jobs created here
        job.queue = self._queue(job.queue, now_ms).name
        self._register(job)
        if job.state == QUEUED and enqueue:
            self._enqueue(job, self._queues[job.queue], now_ms)
        else:
            if job.state != ACKED:
                job.state = ACTIVE
                if job.retry_s and job.qtime_ms <= now_ms:
                    job.qtime_ms = now_ms + job.retry_s * 1000 + self._jitter()
            self.timers.schedule(job, self._due(job))
        self._last_ctime_us = max(self._last_ctime_us, job.ctime_us)

    def _unregister_quiet(self, job: Job, now_ms: int) -> None:
        aof, self.aof = self.aof, False
        try:
            self._unregister(job, now_ms)
        finally:
            self.aof = aof

    # ------------------------------------------------------------------ node-wide

    def op_flushall(self, keep_waiters: bool = True) -> None:
        """DEBUG FLUSHALL: forget every job and queue. Blocked clients stay blocked
        unless ``keep_waiters`` is False: the node's front end then answers every
        blocked GETJOB itself (as the reference's flushServerData) and the queues
        they waited on go too."""
        for rw in self._repl.values():
            self._effects.append(Wake(rw.token, ERR_NOREPL_TIMEOUT))  # their jobs are gone
        self.ext.finish_all()  # WAITJOBs: every job is gone
        waiters = list(self._waiters.values()) if keep_waiters else []
        for q in self._queues.values():
            q.drop_all()
        self._reset_state()
        for w in waiters:
            self._waiters[w.token] = w
            for name in w.queues:
                q = self._queue(name, self._now_ms)
                if q.waiters is None:
                    q.waiters = {}
                q.waiters[w.token] = w
                self.timers.unschedule(q)

    def info(self) -> dict[str, int]:
        return {
            "registered_jobs": self._njobs,
            "registered_queues": len(self._queues),
            "blocked_clients": len(self._waiters),
        }

    # ------------------------------------------------------------------ observability

    def _forget_delivery(self, job: Job) -> int:
        """The job is no longer delivered-and-unacked: its delivery ms, or -1."""
        at = job.dtime_ms
        if at >= 0:
            job.dtime_ms = -1
            self._outstanding -= 1
            n = self._active.get(job.queue, 0) - 1
            if n > 0:
                self._active[job.queue] = n
            else:
                self._active.pop(job.queue, None)
        return at

    def _observe_processing(self, job: Job, now_ms: int) -> None:
        at = self._forget_delivery(job)
        if at >= 0:
            took_ms = now_ms - at if now_ms > at else 0
            self.proc_counts[bisect_left(latency_bounds_ms, took_ms)] += 1
            self.proc_sum_ms += took_ms

    def _undelay(self, job: Job) -> None:
        n = self._delayed.get(job.queue, 0) - 1
        if n > 0:
            self._delayed[job.queue] = n
        else:
            self._delayed.pop(job.queue, None)

    def metrics(self, queues_max: int, now_ms: int) -> dict[str, Any]:
        """Counters, histograms and the largest queues for /metrics (views.py)."""
        return metrics(self, queues_max, now_ms)

    def jobs(self) -> list[Job]:
        """Every registered job (tests, AOF rewrite)."""
        return [j for b in self._jobs if b for j in b.values()]

    def queue_names(self) -> list[bytes]:
        return list(self._queues)

    def check(self) -> None:
        """Check every cross-structure invariant (tests; O(jobs); views.py)."""
        check(self)
