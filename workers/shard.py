"""The shard: the jobs and queues one worker owns, as a pure state machine.

Time comes in (``now_ms``, wall clock), effects go out (``take_effects()``),
replies are ``workers/replies.py`` values. Nothing here reads a clock, touches a
socket or uses global randomness: the same calls give the same results, which
is what lets tests run many shards in one process.

``Shard`` is what the worker calls (the ``op_*`` commands, ``tick``,
``on_message``, ``load_record``, ...); it is made of parts it owns and calls,
each in its own file:

- ``core`` (workers/core.py): the job table, queues, blocked GETJOBs, the timer
  heap, the effects, and the moves of a job between them;
- ``gc`` (workers/ackgc.py): ACKs and their garbage collection across nodes;
- ``fed`` (workers/federation.py): NEEDJOBS / YOURJOBS between nodes;
- ``ext`` (workers/extensions.py): the extensions beyond the reference;
- ``repl`` (workers/replication.py): ADDJOB's copies and the holders' requeue
  messages;
- ``life`` (workers/lifecycle.py): the timers firing, NACK / ENQUEUE;
- ``pause`` (workers/pause.py): PAUSE and its broadcast;
- ``dedup`` (workers/dedup.py): the DEDUP keys the jobs hold (idempotent adds);
- ``limits`` (workers/limits.py): QLIMIT, its broadcast and records (the core
  applies the limits: ``Core.take_limited``);
- ``results`` (workers/results.py): the results of acknowledged jobs (ACKJOB ...
  RESULT), progress (WORKING ... PROGRESS) and the RESULT commands waiting;
- read-only views (workers/views.py) and AOF loading (workers/persistence.py)
  are functions over the core.

ADDJOB, GETJOB and ACKJOB (the per-job path) run here over the core directly.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Final

from workers import messages as msg
from workers.ackgc import AckGc
from workers.core import (
    ERR_NOREPL_TIMEOUT,
    Core,
    Stats,
    Waiter,
    latency_bounds_ms,
    queue_idle_evict_ms,
)
from workers.dedup import Dedup, dedup_keys_max_default
from workers.effects import Effect
from workers.extensions import Extensions
from workers.federation import Federation
from workers.job import (
    ACKED,
    ACTIVE,
    QUEUED,
    US_PER_MS,
    Job,
    JobExt,
    body_bytes_max,
    delay_max_s,
    maxdeliver_max,
    queue_name_bytes_max,
    retry_max_s,
    ttl_max_s,
)
from workers.lifecycle import Lifecycle
from workers.limits import Limits
from workers.pause import Pause
from workers.persistence import load_record
from workers.queue import LIMITED, PAUSED_IN, PAUSED_OUT, Cells
from workers.replication import Replication
from workers.replies import (
    ERR_LEAVING,
    ERR_NOJOB,
    ERR_NOREPL,
    ERR_PAUSED,
    Error,
    Status,
)
from workers.results import ERR_PROGRESS_SIZE_FMT, ERR_RESULT_SIZE_FMT, Results, result_record
from workers.views import groups_full, jscan, metrics, qgroups, qpeek, qscan, qstat, show

__all__ = ["Shard", "latency_bounds_ms"]  # latency_bounds_ms: the /metrics histogram bounds

# Defaults and limits of the spec (ADDJOB section).
ttl_default_s: Final = 24 * 3600
retry_default_max_s: Final = 300  # default RETRY is TTL/10, at most 5 minutes, at least 1 s
replicate_default_max: Final = 3  # default REPLICATE: the cluster size, at most 3
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


_Handler = Callable[[str, dict[str, Any], list[bytes], int], None]


class Shard:
    """One worker's shard: the API the worker calls, over the parts it owns."""

    def __init__(self, node_id: str, index: int, workers: int, seed: bytes, rng: random.Random,
                 now_ms: int, *, queue_idle_ms: int = queue_idle_evict_ms,
                 dedup_keys_max: int = dedup_keys_max_default, cells: Cells | None = None) -> None:
        """``cells``: the host's per-slot cells (workers/queue.py), private when None."""
        self.index = index
        self.workers = workers
        self.core = c = Core(node_id, index, seed, rng, now_ms, queue_idle_ms, cells, workers)
        # The parts hear the core's events they subscribe to (workers/core.py's Events).
        self.results = Results(c)  # ACKJOB ... RESULT, WORKING ... PROGRESS, RESULT
        self.gc = AckGc(c, self.results)  # ACKs, SETACK / GOTACK / DELJOB, dummy ACKs, gone IDs
        self.ext = Extensions(c, self.gc)  # NACK DELAY, MAXDELIVER, WAITJOB, ...
        self.fed = Federation(c, self.gc)  # NEEDJOBS / YOURJOBS
        self.repl = Replication(c, self.gc, self.ext)  # REPLJOB ... WORKING
        self.life = Lifecycle(c, self.repl, self.gc, self.fed, self.ext, self.results)
        self.pause = Pause(c)
        self.dedup = Dedup(c, dedup_keys_max)  # ADDJOB ... DEDUP: the keys held
        self.limits = Limits(c)  # QLIMIT
        # the queues with limits where a delivery ended: the core's set, read here
        # after each command that may end one (its waiters are served then)
        self._ended = c.tally().ended
        self._handlers = self.handlers()

    def handlers(self) -> dict[str, _Handler]:
        """Each kind of the catalogue (workers/messages.py) with its handler, a
        method of the part that owns the kind, bound by reference."""
        repl, gc, fed, ext = self.repl, self.gc, self.fed, self.ext
        return {
            msg.REPLJOB: repl.on_repljob, msg.GOTJOB: repl.on_gotjob,
            msg.ENQUEUE: repl.on_enqueue, msg.WILLQUEUE: repl.on_willqueue,
            msg.QUEUED: repl.on_queued, msg.WORKING: repl.on_working,
            msg.SETACK: gc.on_setack, msg.GOTACK: gc.on_gotack, msg.DELJOB: gc.on_deljob,
            msg.NEEDJOBS: fed.on_needjobs, msg.YOURJOBS: fed.on_yourjobs,
            msg.PAUSE: self.pause.on_pause, msg.QLIMIT: self.limits.on_qlimit,
            msg.QLENASK: ext.on_qlenask, msg.QLENIS: ext.on_qlenis,
            msg.DELQ: ext.on_delq, msg.DELQDONE: ext.on_delqdone,
            msg.RESULTASK: self.results.on_resultask, msg.RESULTIS: self.results.on_resultis,
        }

    # ------------------------------------------------------------------ plumbing

    @property
    def node_id(self) -> str:
        return self.core.view().node_id

    @property
    def aof(self) -> bool:
        """Emit AofAppend effects (job records, deletions): the worker sets this
        while appendonly is on, so the records cost nothing otherwise."""
        return self.core.aof_on()

    @aof.setter
    def aof(self, on: bool) -> None:
        self.core.set_aof(on)

    @property
    def body_bytes(self) -> int:
        """Sum of len(body) of the registered jobs (memory accounting)."""
        return self.core.body_bytes_held()

    def next_due(self) -> int | None:
        """When a timer of the shard is due next (None: none): the worker's next tick."""
        return self.core.next_due()

    @property
    def stats(self) -> Stats:
        return self.core.tally().stats

    def take_effects(self) -> list[Effect]:
        return self.core.take_effects()

    def set_peers(self, reachable_node_ids: list[str] | tuple[str, ...]) -> None:
        """Other nodes, all reachable (``set_view`` gives the full picture). Empty: single node."""
        self.core.set_peers(reachable_node_ids)

    def set_view(self, myid: str, peers: Sequence[tuple[Any, ...]],
                 leaving: bool) -> None:
        """The membership view (workers/core.py's ``Core.set_view``)."""
        self.core.set_view(myid, peers, leaving)

    def set_leaving(self, leaving: bool) -> None:
        self.core.set_leaving(leaving)

    def has_peers(self) -> bool:
        """Other reachable nodes can take copies: a default ADDJOB then waits for
        replication (PENDING) instead of answering at once."""
        return bool(self.core.view().peers)

    def set_memory_level(self, level: int) -> None:
        self.core.set_memory_level(level)

    def lookup(self, job_id: str) -> Job | None:
        return self.core.lookup(job_id)

    def on_message(self, sender: str, kind: str, meta: dict[str, Any], bodies: list[bytes],
                   now_ms: int) -> None:
        """One cluster message from node ``sender`` (malformed input is dropped).
        Shapes and values were checked at the edge (bus/messages.py, by the rules of
        the catalogue, workers/messages.py, whose handlers this dispatches to); only
        the job records inside are parsed by the parts (``federation.peer_job``)."""
        self.core.set_now(now_ms)
        handler = self._handlers.get(kind)
        if handler is not None:  # a kind of a newer peer's is dropped
            handler(sender, meta, bodies, now_ms)
            if self._ended:
                self.core.serve_ended(now_ms)

    def tick(self, now_ms: int) -> int | None:
        """Do the timer work due at ``now_ms`` (bounded); return the next due time."""
        due = self.life.tick(now_ms)
        if self._ended:
            self.core.serve_ended(now_ms)
            due = self.core.next_deadline(now_ms)
        return due

    # ------------------------------------------------------------------ ADDJOB / GETJOB

    def op_addjob(self, queue: bytes, body: bytes, *, timeout_ms: int, replicate: int | None,
                  delay_s: int, retry_s: int | None, ttl_s: int, maxlen: int, async_: bool,
                  token: int, now_ms: int, maxdeliver: int = 0, ext: JobExt | None = None,
                  status: bool = True) -> Any:
        """ADDJOB after argument parsing; checks in the reference's order (maxdeliver 0:
        none; ``ext``: the GROUP / DEDUP extensions, the job's own from then on).
        ``status=False``: a job added here and now is answered by its ID as a plain str
        (the fast path writes the reply's bytes from it; a Status is a Python-level
        str subclass, ~700 instructions to make)."""
        if (maxdeliver or len(queue) > queue_name_bytes_max or len(body) > body_bytes_max
                or ttl_s > ttl_max_s or delay_s > delay_max_s
                or (retry_s is not None and retry_s > retry_max_s)):
            err = _over_bounds(queue, body, ttl_s, delay_s, retry_s, maxdeliver)
            if err is not None:
                return err
        c = self.core
        view = c.view()
        peers = len(view.peers)  # reachable nodes that can take a copy
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
        if ext is not None and ext.dedup:
            held = self.dedup.held(queue, ext.dedup, now_ms)
            if held is not None:
                return Status(held)  # nothing added (even where it would wait for copies)
        if retry_s is None:
            retry_s = ttl_s // 10
            if retry_s > retry_default_max_s:
                retry_s = retry_default_max_s
            elif retry_s == 0:
                retry_s = 1
        # A leaving node, or one past 75 % of maxmemory, holds no copy itself:
        # every replica must be external (Disque's extrepl).
        extrepl = view.leaving or view.memory_level > 0
        additional = replicate if extrepl else replicate - 1
        if additional > peers:
            if extrepl and additional - 1 == peers:
                return ERR_NOREPL_LEAVING if view.leaving else ERR_NOREPL_MEMORY
            return ERR_NOREPL
        q = c.queue(queue, now_ms)
        if maxlen and q.live >= maxlen:
            return ERR_MAXLEN_REACHED
        if q.paused & PAUSED_IN:
            return ERR_PAUSED
        ctime_us = c.next_ctime_us(now_ms)
        job_id = c.new_job_id(q.slot, ttl_s, retry_s)
        job = Job(job_id, q.name, body, ACTIVE, replicate, ttl_s, ctime_us, delay_s, retry_s,
                  0, view.me)
        if maxdeliver:
            job.set_maxdeliver(maxdeliver)
        if ext is not None:
            job.ext = ext
        c.tally().count_added()
        if additional:
            return self.repl.addjob_cluster(job, q, additional, extrepl, timeout_ms, async_,
                                            token, now_ms, flexible)
        c.register(job)
        c.activate(job, q, now_ms)
        return Status(job_id) if status else job_id

    def op_take(
        self, queues: list[bytes], count: int, withcounters: bool, now_ms: int
    ) -> list[list[Any]]:
        """Non-blocking GETJOB on this shard: one job per queue per pass, left to right."""
        if len(queues) != 1:
            return self._take_many(queues, count, withcounters, now_ms)
        c = self.core
        q = c.queue(queues[0], now_ms)
        out: list[list[Any]] = []
        if q.paused:
            if q.paused & PAUSED_OUT:
                return out
            if q.paused & LIMITED:
                return self._take_limited(q, count, withcounters, now_ms)
        while len(out) < count:
            job = q.pop()
            if job is None:
                break
            out.append(c.deliver(job, q, now_ms, withcounters))
        if not q.live:
            c.maybe_idle(q, now_ms)  # arms nothing when the check is armed already
            if out:
                c.drained(q, now_ms)
        return out

    def _take_limited(self, q: Any, count: int, withcounters: bool,
                      now_ms: int) -> list[list[Any]]:
        """``op_take`` of one queue with limits (workers/limits.py)."""
        c = self.core
        out = c.take_limited(q, count, withcounters, now_ms)
        if not q.live:
            c.maybe_idle(q, now_ms)
            if out:
                c.drained(q, now_ms)
        return out

    def _take_many(
        self, queues: list[bytes], count: int, withcounters: bool, now_ms: int
    ) -> list[list[Any]]:
        c = self.core
        qs = []
        limited = False
        for name in queues:
            q = c.queue(name, now_ms)
            if not q.paused:
                qs.append(q)
            elif not q.paused & PAUSED_OUT:
                qs.append(q)
                limited = limited or bool(q.paused & LIMITED)
        out: list[list[Any]] = []
        while len(out) < count:
            before = len(out)
            for q in qs:
                if limited and q.paused & LIMITED:  # plain queues: one local's test
                    out += c.take_limited(q, 1, withcounters, now_ms)
                    if len(out) >= count:
                        break
                    continue
                job = q.pop()
                if job is not None:
                    out.append(c.deliver(job, q, now_ms, withcounters))
                    if len(out) >= count:
                        break
            if len(out) == before:
                break
        for q in qs:
            if not q.live:
                c.maybe_idle(q, now_ms)  # arms nothing when the check is armed already
        return out

    def op_block(
        self, token: int, queues: list[bytes], count: int, withcounters: bool, now_ms: int
    ) -> None:
        """Register a blocked GETJOB; it is answered later by ``Wake(token, entries)``.

        If a job is already available (it arrived while the coordinator was asking
        other owners), the waiter is served at once, still through ``Wake``.
        """
        c = self.core
        if c.blocked(token):
            self.op_unblock(token, now_ms)
        entries = self.op_take(queues, count, withcounters, now_ms)
        if entries:
            c.wake(token, entries)
            return
        if c.view().leaving:
            c.wake(token, ERR_LEAVING)  # spec: a leaving node never blocks
            return
        fresh = c.block(Waiter(token, list(queues), count, withcounters), now_ms)
        feds = self.fed.feds
        if feds:
            for q in fresh:
                fed = feds.get(q.name)
                if fed is not None:
                    fed.bcast_attempt = 0  # a new wait starts with short delays
        if c.view().known:
            for name in queues:
                q = c.queue(name, now_ms)
                if not (q.paused & LIMITED and q.live):  # at its limit: more would wait too
                    self.fed.needjobs(q, False, now_ms)

    def op_unblock(self, token: int, now_ms: int | None = None,
                   forget_queues: bool = False) -> None:
        """Drop a waiter (workers/core.py's ``Core.unblock``)."""
        self.core.unblock(token, now_ms, forget_queues)

    def op_return(self, job_ids: list[str], now_ms: int) -> None:
        """Give back jobs a multi-owner GETJOB took but did not send: no delivery counted."""
        c = self.core
        for job_id in job_ids:
            job = c.lookup(job_id)
            if job is None or job.state != ACTIVE:
                continue
            q = c.queue(job.queue, now_ms)
            c.tally().undo_take(job)
            if q.jobs_out:
                q.jobs_out -= 1
            job.move(QUEUED)
            q.push(job)
            c.arm_ttl(job)
            if q.waiters is not None and not q.paused & PAUSED_OUT:
                c.serve_waiters(q, now_ms)

    # ------------------------------------------------------------------ job-addressed ops

    def op_ackjob(self, job_ids: list[str], now_ms: int) -> int:
        n = self.gc.acks(job_ids, now_ms, False)
        if self._ended:
            self.core.serve_ended(now_ms)
        return n

    def op_fastack(self, job_ids: list[str], now_ms: int) -> int:
        """Delete, and a best-effort DELJOB to the nodes that may have a copy (to
        every node when we do not know the job)."""
        n = self.gc.acks(job_ids, now_ms, True)
        if self._ended:
            self.core.serve_ended(now_ms)
        return n

    def op_deljob(self, job_ids: list[str], now_ms: int) -> int:
        c = self.core
        known = 0
        for job_id in job_ids:
            job = c.lookup(job_id)
            if job is not None:
                known += 1
                c.unregister(job, now_ms)
        if self._ended:
            c.serve_ended(now_ms)
        return known

    def op_nack(self, job_ids: list[str], now_ms: int, delay_s: int = 0) -> int:
        """NACK [DELAY s]: queued again (after the delay), or dead-lettered when the
        job's MAXDELIVER is reached."""
        n = self.life.requeue(job_ids, now_ms, True, delay_s * 1000)
        if self._ended:
            self.core.serve_ended(now_ms)
        return n

    def op_enqueue(self, job_ids: list[str], now_ms: int) -> int:
        return self.life.requeue(job_ids, now_ms, False, 0)

    def op_dequeue(self, job_ids: list[str], now_ms: int) -> int:
        c = self.core
        done = 0
        for job_id in job_ids:
            job = c.lookup(job_id)
            if job is not None and job.state == QUEUED:
                c.dequeue(job, now_ms, record=True)
                done += 1
        return done

    def op_working(self, job_id: str, now_ms: int, progress: bytes | None = None) -> Any:
        """WORKING [PROGRESS value]: ``progress`` is recorded once the job is postponed
        (workers/results.py); SHOW and RESULT show it."""
        if progress is not None and len(progress) > self.results.progress_bytes_max:
            return Error(ERR_PROGRESS_SIZE_FMT.format(self.results.progress_bytes_max))
        job = self.core.lookup(job_id)
        if job is None or job.state == ACKED:
            return ERR_NOJOB
        if (now_ms - job.ctime_us // US_PER_MS) > job.ttl_s * 1000 // 2:
            return ERR_TOOLATE
        reply = self.core.working(job, now_ms)
        if progress is not None:
            self.results.set_progress(job_id, progress)
        return reply

    def op_ack_result(self, job_id: str, value: bytes, now_ms: int) -> int | Error:
        """ACKJOB id RESULT value: the result is stored (and travels with the ACK's
        SETACK to the other holders), then the job is acknowledged as by ACKJOB. A job
        unknown here on a node alone stores nothing (ACKJOB's 0: nobody holds it); a
        job with a result already keeps it (a task run twice keeps its first result)."""
        if len(value) > self.results.value_bytes_max:
            return Error(ERR_RESULT_SIZE_FMT.format(self.results.value_bytes_max))
        if self.core.lookup(job_id) is None and not self.core.view().known:
            return 0
        if self.results.value_of(job_id, now_ms) is None:  # the first result stays
            self.results.store(job_id, value, now_ms)
        return self.gc.acks([job_id], now_ms, False)

    def op_result(self, token: int, job_id: str, timeout_ms: int | None, now_ms: int) -> Any:
        """RESULT id [TIMEOUT ms] (workers/results.py)."""
        return self.results.op_result(token, job_id, timeout_ms, now_ms)

    # ------------------------------------------------------------------ views, queues

    def op_show(self, job_id: str, now_ms: int) -> Any:
        job = self.core.lookup(job_id)
        if job is None:
            return None
        reply = show(job, now_ms)
        progress = self.results.progress_of(job_id)
        return reply if progress is None else reply + [b"progress", progress]

    def op_qlen(self, queue: bytes) -> int:
        return self.core.qlen(queue)

    def op_takeable(self, queues: list[bytes], now_ms: int | None = None) -> list[int]:
        """Read-only: how many jobs a take could get from each queue now (its QLEN; 0
        while paused for output or when it does not exist; what its limits allow of
        it, groups apart); creates nothing."""
        c = self.core
        get = c.find_queue
        out: list[int] = []
        for name in queues:
            q = get(name)
            if q is None:
                out.append(0)
            elif not q.paused:
                out.append(q.live)
            elif q.paused & PAUSED_OUT:
                out.append(0)
            elif q.paused & LIMITED:
                lim = c.limit_of(name)
                at = c.now_ms() if now_ms is None else now_ms
                room = 0 if lim is None else lim.room(c.tally().active.get(name, 0), at)
                out.append(max(0, min(q.live, room)))
            else:
                out.append(q.live)
        return out

    def op_groups_full(self, queue: bytes, group: bytes, groups_max: int) -> bool:
        return groups_full(self.core, queue, group, groups_max)

    def op_qpeek(self, queue: bytes, count: int) -> list[list[Any]]:
        return qpeek(self.core, queue, count)

    def op_qstat(self, queue: bytes, now_ms: int) -> Any:
        return qstat(self.core, self.fed, queue, now_ms)

    def op_qgroups(self, queue: bytes, count: int) -> list[list[Any]]:
        return qgroups(self.core, queue, count)

    def op_pause(self, queue: bytes, opts: list[str], now_ms: int) -> Status | Error:
        """PAUSE with validated lowercase options (workers/pause.py)."""
        return self.pause.op_pause(queue, opts, now_ms)

    def op_qlimit(self, queue: bytes, values: tuple[int | None, int | None, int | None] | None,
                  bcast: bool, queues_max: int, now_ms: int) -> list[Any] | Error:
        """QLIMIT with validated values (workers/limits.py)."""
        return self.limits.op_qlimit(queue, values, bcast, queues_max, now_ms)

    def limit_records(self) -> list[bytes]:
        """Every queue's limits as AOF records (a rewrite writes them)."""
        return self.limits.records()

    def op_evict_queue(self, name: bytes) -> bool:
        """Memory pressure (workers/evict.py): drop an empty queue nobody waits on, as
        the idle timer would later, paused or not (workers/pause.py says why). False
        if it must stay."""
        c = self.core
        q = c.find_queue(name)
        if q is None or q.live or q.waiters is not None:
            return False
        c.evict(q)
        return True

    def op_qscan(self, cursor: int, count: int, minlen: int, maxlen: int,
                 importrate: int) -> tuple[int, list[bytes]]:
        """Queues from table position ``cursor``; next cursor 0 means done (views.py)."""
        return qscan(self.core, self.fed, cursor, count, minlen, maxlen, importrate)

    def op_jscan(self, cursor: int, count: int, queue: bytes | None,
                 states: AbstractSet[int] | None, reply_all: bool,
                 now_ms: int) -> tuple[int, list[Any]]:
        """Jobs from bucket ``cursor``; items are ``Status(id)`` or SHOW arrays (views.py)."""
        return jscan(self.core, cursor, count, queue, states, reply_all, now_ms)

    # ------------------------------------------------------------------ extensions

    def op_waitjob(self, token: int, job_ids: list[str], timeout_ms: int, now_ms: int,
                   client: bytes = b"", share_max: int = 0) -> Any:
        return self.ext.op_waitjob(token, job_ids, timeout_ms, now_ms, client, share_max)

    def op_globalqlen(self, token: int, queue: bytes, now_ms: int) -> Any:
        return self.ext.op_globalqlen(token, queue, now_ms)

    def op_delqueue(self, token: int, queue: bytes, local: bool, now_ms: int) -> Any:
        return self.ext.op_delqueue(token, queue, local, now_ms)

    def op_deadletter(self, job_ids: list[str], reason: bytes | None, now_ms: int) -> int:
        n = self.ext.op_deadletter(job_ids, reason, now_ms)
        if self._ended:
            self.core.serve_ended(now_ms)
        return n

    def op_redrive(self, queue: bytes, count: int, now_ms: int) -> int | Error:
        return self.ext.op_redrive(queue, count, now_ms)

    def op_redrive_ids(self, queue: bytes, job_ids: list[str], now_ms: int) -> int | Error:
        return self.ext.op_redrive_ids(queue, job_ids, now_ms)

    def yourjobs_unsent(self, bodies: list[bytes], now_ms: int) -> None:
        self.fed.yourjobs_unsent(bodies, now_ms)

    # ------------------------------------------------------------------ node-wide

    def load_record(self, record: bytes, enqueue: bool, now_ms: int) -> None:
        """Replay one AOF record (workers/persistence.py)."""
        load_record(self.core, record, enqueue, now_ms, self.results, self.dedup)

    def op_flushall(self, keep_waiters: bool = True) -> None:
        """DEBUG FLUSHALL: forget every job and queue. Blocked clients stay blocked
        unless ``keep_waiters`` is False: the node's front end then answers every
        blocked GETJOB itself (as the reference's flushServerData) and the queues
        they waited on go too."""
        c = self.core
        for rw in c.repl_waits():
            c.wake(rw.token, ERR_NOREPL_TIMEOUT)  # their jobs are gone
        self.ext.finish_all()  # WAITJOBs: every job is gone
        waiters = c.waiter_list() if keep_waiters else []
        for q in c.queue_list():
            q.drop_all()
        c.reset()
        self.gc.reset()
        self.fed.reset()
        self.dedup.reset()
        self.results.reset()
        for w in waiters:
            c.block(w, c.now_ms())

    def info(self) -> dict[str, int]:
        c = self.core
        return {
            "registered_jobs": c.job_count(),
            "registered_queues": c.queue_count(),
            "blocked_clients": c.waiter_count(),
            # draining a host waits for these two to reach 0 (docs/admin.md)
            # O(queues), for INFO only (the memory sample reads the core's counts)
            "queued_jobs": sum(q.live for q in c.queue_table().values()),
            "wait_repl_jobs": len(c.repl_waits()),
        }

    def dedup_info(self) -> dict[str, int]:
        """INFO's DEDUP figures (workers/dedup.py)."""
        d = self.dedup
        return {"dedup_keys": d.count(), "dedup_hits": d.hits,
                "dedup_keys_forgotten": d.forgotten}

    def configure_results(self, cfg: Any) -> None:
        """config result-ttl, result-bytes-max, result-store-bytes-max,
        progress-bytes-max, dedup-keep-max (``cfg``: the node's Config, read only)."""
        r = self.results
        r.ttl_s = int(cfg.result_ttl)
        r.value_bytes_max = int(cfg.result_bytes_max)
        r.store_bytes_max = int(cfg.result_store_bytes_max)
        r.progress_bytes_max = int(cfg.progress_bytes_max)
        self.dedup.keep_max_s = int(cfg.dedup_keep_max)

    def results_info(self) -> dict[str, int]:
        """INFO's result figures (workers/results.py)."""
        return {**self.results.info(), "dedup_keys_kept": len(self.dedup.kept)}

    @property
    def extra_bytes(self) -> int:
        """What the results, progress values and kept DEDUP keys cost (the memory
        estimate adds it to the jobs')."""
        return self.results.held_bytes + self.dedup.kept_bytes

    def result_keys(self) -> list[str]:
        """The stored results and kept DEDUP keys, as the AOF rewrite lists them
        (``r:<job id>``, ``k:<job id>``)."""
        return ["r:" + jid for jid in self.results.values] + [
            "k:" + jid for jid in self.dedup.kept_by_job]

    def result_record_of(self, key: str) -> bytes | None:
        """The AOF record of an entry ``result_keys`` listed (None: gone since)."""
        job_id = key[2:]
        if key[:2] == "k:":
            return self.dedup.kept_record_of(job_id)
        got = self.results.values.get(job_id)
        return None if got is None else result_record(job_id, got[0], got[1])

    def op_evict_results(self, count: int) -> int:
        """Memory pressure: the oldest results go first (workers/evict.py)."""
        return self.results.evict(count)

    def set_dedup_keys_max(self, n: int) -> None:
        """config dedup-keys-max (workers/dedup.py)."""
        self.dedup.set_keys_max(n)

    def metrics(self, queues_max: int, now_ms: int) -> dict[str, Any]:
        """Counters, histograms and the largest queues for /metrics (views.py)."""
        return metrics(self.core, self.fed, queues_max, now_ms)

    def jobs(self) -> list[Job]:
        """Every registered job (tests, AOF rewrite)."""
        return self.core.jobs()

    def check(self) -> None:
        """Check every cross-structure invariant (tests; O(jobs); views.py)."""
        self.core.check()
        self.dedup.check()
