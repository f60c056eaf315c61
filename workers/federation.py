"""Federation (spec FAQ "federation"): a queue with consumers and no jobs asks
the other nodes for jobs (NEEDJOBS), a node with jobs moves some (YOURJOBS).

``Federation`` is an object the shard owns (``Shard.fed``) and calls; it keeps
the per-queue federation state (``Fed`` in workers/queue.py: recent sources,
NEEDJOBS backoff, import rate) and the NEEDJOBS we could not serve yet, and
reaches the jobs, queues and timers through the shard's ``Core``
(workers/core.py), whose queue events it hears. Its messages, NEEDJOBS and
YOURJOBS, are in the catalogue (workers/messages.py).

A ``Fed`` sits in the shard's timer heap as its own target (the next NEEDJOBS).
"""

from __future__ import annotations

from typing import Any

from workers import messages as msg
from workers.ackgc import AckGc
from workers.core import Core, Events
from workers.job import ACTIVE, Job, merge_nodes, union
from workers.persistence import lie_of
from workers.queue import PAUSED_IN, PAUSED_OUT, Fed, Queue

# Federation (spec FAQ): ad hoc NEEDJOBS to recent sources 25 ms .. 2 s apart,
# broadcast to everyone 100 ms .. 30 s apart, doubling while nothing arrives.
needjobs_adhoc_min_ms = 25
needjobs_adhoc_max_ms = 2000
needjobs_bcast_min_ms = 100
needjobs_bcast_max_ms = 30_000
needjobs_count_min = 5  # Disque's NEEDJOBS_MIN_REQUEST
needjobs_count_max = 100  # Disque's NEEDJOBS_MAX_REQUEST: a YOURJOBS is at most this many jobs
# A YOURJOBS frame carries at most this many body bytes (at least one job): a
# reply never holds the bus for long.
yourjobs_bytes_max = 4 << 20
# A NEEDJOBS we could not serve (queue empty) is remembered this long: a job
# queued here meanwhile, with no local consumer waiting, goes to the asker at
# once instead of waiting for the asker's next (backed off) NEEDJOBS. Longer
# than the broadcast cap, so a consumer that keeps waiting is always known.
needjobs_ask_ttl_ms = needjobs_bcast_max_ms + 2000
needjobs_asks_max = 65536  # queues with a remembered ask (cleared when full)
fed_queues_max = 65536  # bound on queues with federation state (evicted with their queue)



class Federation(Events):
    """Federation state and messages of one shard."""

    def __init__(self, core: Core, gc: AckGc) -> None:
        self.core = core
        self.gc = gc
        self.feds: dict[bytes, Fed] = {}  # queues with federation state
        self.asks: dict[bytes, tuple[str, int]] = {}  # queue -> (asker, until ms)
        core.subscribe(self, "after_queue_evicted", "after_queued_unwatched",
                       "after_queue_drained")

    def after_queue_evicted(self, q: Queue) -> None:
        if self.feds:
            fed = self.feds.pop(q.name, None)
            if fed is not None:
                self.core.unschedule(fed)

    def after_queued_unwatched(self, q: Queue, now_ms: int) -> None:
        if self.asks:
            self.push_to_asker(q, now_ms)

    def after_queue_drained(self, q: Queue, now_ms: int) -> None:
        if self.feds:
            self.needjobs(q, True, now_ms)  # drained: ask the recent sources at once

    def qstat_import(self, q: Queue, now_ms: int) -> tuple[list[str], int]:
        """QSTAT's import-from and import-rate of ``q``."""
        fed = self.feds.get(q.name)
        if fed is None:
            return [], 0
        fed.expire(now_ms)
        return list(fed.responders), fed.import_rate(now_ms)

    def reset(self) -> None:
        """FLUSHALL: every queue is gone."""
        self.feds = {}
        self.asks = {}

    def _fed_of(self, q: Queue) -> Fed | None:
        fed = self.feds.get(q.name)
        if fed is None:
            if len(self.feds) >= fed_queues_max:
                return None
            fed = self.feds[q.name] = Fed(q)
        return fed

    def needjobs(self, q: Queue, reached_zero: bool, now_ms: int) -> None:
        """Disque's needJobsForQueue: ad hoc to recent sources, else broadcast."""
        s = self.core
        if s.view().leaving or not s.view().known:
            return
        fed = self.feds.get(q.name)
        if reached_zero and (fed is None or not fed.import_rate(now_ms)):
            return
        if fed is None:
            fed = self._fed_of(q)
            if fed is None:
                return
        fed.expire(now_ms)
        rate = fed.import_rate(now_ms)
        nodes = len(fed.responders) or len(s.view().known)
        want = max(needjobs_count_min, min(needjobs_count_max, rate // max(nodes, 1)))
        name = [q.name]
        # Broadcast on its own (slow) schedule even while we have recent sources:
        # that is how new sources are found (spec FAQ); ad hoc to the sources in
        # between, at once when the queue was just drained.
        if now_ms - fed.bcast_ms >= self._bcast_delay(fed):
            fed.bcast_ms = now_ms
            fed.bcast_attempt += 1
            s.send("*", msg.NEEDJOBS, q.slot, msg.needjobs_meta(want), name)
        elif fed.responders and (reached_zero or now_ms - fed.adhoc_ms >= self._adhoc_delay(fed)):
            fed.adhoc_ms = now_ms
            fed.adhoc_attempt += 1
            for n in fed.responders:
                s.send(n, msg.NEEDJOBS, q.slot, msg.needjobs_meta(want), name)
        self._arm_fed(fed, now_ms)

    def _bcast_delay(self, fed: Fed) -> int:
        return min(needjobs_bcast_min_ms << min(fed.bcast_attempt, 20), needjobs_bcast_max_ms)

    def _adhoc_delay(self, fed: Fed) -> int:
        return min(needjobs_adhoc_min_ms << min(fed.adhoc_attempt, 20), needjobs_adhoc_max_ms)

    def _arm_fed(self, fed: Fed, now_ms: int) -> None:
        q = fed.queue
        s = self.core
        if q.waiters is None or s.view().leaving:
            return
        nxt = fed.bcast_ms + self._bcast_delay(fed)
        if fed.responders:
            nxt = min(nxt, fed.adhoc_ms + self._adhoc_delay(fed))
        s.unschedule(fed)
        s.schedule(fed, max(nxt, now_ms + 1))

    def fire_fed(self, fed: Fed, now_ms: int) -> None:
        q = fed.queue
        s = self.core
        if self.feds.get(q.name) is not fed or s.find_queue(q.name) is not q:
            return
        if q.waiters is None or s.view().leaving:
            return
        if not q.live or q.paused & PAUSED_OUT:
            self.needjobs(q, False, now_ms)
        else:
            self._arm_fed(fed, now_ms)

    def on_needjobs(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                    now_ms: int) -> None:
        name = bytes(bodies[0])
        s = self.core
        count = int(meta["c"])
        q = s.find_queue(name)
        if q is not None and q.paused & PAUSED_OUT:
            return  # spec: no jobs for other nodes out of a queue paused in output
        if q is None or not q.live:
            if len(self.asks) >= needjobs_asks_max:
                self.asks.clear()  # only latency is lost: askers ask again
            self.asks[name] = (sender, now_ms + needjobs_ask_ttl_ms)
            return
        if not self._can_move_jobs_to(sender):
            # No PONG on our own link to it yet: it is not reachable from here (a
            # partition has just healed and its link to us came back first), or it
            # is but our link is not up (we or it have just restarted: a peer from
            # nodes.conf, or one whose link broke within the node timeout). The bus
            # would drop our YOURJOBS after the jobs left the queue, losing an
            # at-most-once job outright. It asks again; we answer then.
            return
        self._send_yourjobs(q, sender, min(max(count, 1), needjobs_count_max), now_ms)

    def _can_move_jobs_to(self, node: str) -> bool:
        """A YOURJOBS to ``node`` would be written: reachable, and our bus link to it
        has carried a PONG (set_view)."""
        s = self.core
        v = s.view()
        return node in v.peers and node not in v.unlinked

    def _send_yourjobs(self, q: Queue, node: str, count: int, now_ms: int) -> None:
        """Move up to ``count`` queued jobs to ``node``. Each leaves the queue as it is
        serialized for the wire; we keep an active copy of at-least-once jobs (they
        are queued again after RETRY if the message is lost) and an active copy
        with no requeue time of at-most-once ones (so an ACK still finds them)."""
        s = self.core
        recs: list[bytes] = []
        size = 0
        while len(recs) < count and size < yourjobs_bytes_max:
            job = q.pop()
            if job is None:
                break
            job.move(ACTIVE)
            job.delivered = union(job.delivered, (node,))
            s.postpone(job, s.retry_at(job, now_ms))
            recs.append(job.to_record())
            size += len(job.body)
        if recs:
            q.atime_ms = now_ms
            s.send(node, msg.YOURJOBS, q.slot, msg.records_meta(), recs)
        s.maybe_idle(q, now_ms)

    def on_yourjobs(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                    now_ms: int) -> None:
        q: Queue | None = None
        s = self.core
        n = 0
        touched: list[Queue] = []  # served once the whole batch is queued (COUNT > 1)
        for rec in bodies:
            job = peer_job(rec)
            if job is None or job.etime_ms <= now_ms or (
                    self.gc.gone and self.gc.is_gone(job.id, now_ms)):
                continue
            q = s.queue(job.queue, now_ms)
            if not touched or touched[-1] is not q:
                touched.append(q)
            old = s.lookup(job.id)
            if old is not None:
                # The sender's list too: a node it gave the job to must hear of the ACK.
                old.delivered = union(old.delivered, (sender,))
                merge_nodes(old, job.delivered)
                # An at-most-once job we already hold comes back: we gave it away by
                # YOURJOBS and the node that queued it since popped it to send it, so
                # it is queued nowhere; dropping it would lose it with no fault at all.
                # Queue it again unless we served it to a client (a second delivery).
                # An at-least-once job a client of ours holds now (delivered, not
                # acked: its RETRY runs here) is not queued again either: that client
                # may be about to ACK it, and our own timer requeues it if not.
                if old.state == ACTIVE and old.dtime_ms < 0 and (
                        old.retry_s or not old.was_delivered()):
                    s.unschedule(old)
                    # in its own queue: a dead-letter move or REDRIVE our copy did
                    # not hear of leaves it in another queue than the sender's
                    oq = q if old.queue == q.name else s.queue(old.queue, now_ms)
                    if oq is not q:
                        touched.append(oq)
                    s.enqueue(old, oq, now_ms, False)
                    self._tell_queued(old)
                    n += 1
                continue
            s.arrive(job, q, now_ms, sender, queued=True)  # QUEUED to its holders
            n += 1
        for tq in touched:
            if tq.waiters is not None and not tq.paused & PAUSED_OUT:
                s.serve_waiters(tq, now_ms)
        if q is None:
            return
        fed = self._fed_of(q)
        if fed is not None:
            fed.responders[sender] = now_ms
            fed.count_import(n, now_ms)
            fed.adhoc_attempt = 0  # sources answer: ask them often again

    def yourjobs_unsent(self, bodies: list[bytes], now_ms: int) -> None:
        """The worker could not write a YOURJOBS of ours (no link to the asker, nor to
        worker 0 to relay it): its jobs left the queue when it was built. Queue again
        each one still active here and not delivered since (the asker stays in its
        node list: a GC asks it, it answers it does not know the job)."""
        s = self.core
        s.set_now(now_ms)
        touched: list[Queue] = []
        for rec in bodies:
            job = peer_job(rec)
            old = s.lookup(job.id) if job is not None else None
            if old is None or old.state != ACTIVE or old.dtime_ms >= 0:
                continue
            q = s.queue(old.queue, now_ms)
            if q.paused & PAUSED_IN and old.retry_s:
                continue  # its RETRY timer brings it back
            s.unschedule(old)
            s.enqueue(old, q, now_ms, False)
            if not touched or touched[-1] is not q:
                touched.append(q)
        for tq in touched:
            if tq.waiters is not None and not tq.paused & PAUSED_OUT:
                s.serve_waiters(tq, now_ms)

    def _tell_queued(self, job: Job) -> None:
        """A job moved here by YOURJOBS is queued here now: QUEUED to its other holders,
        so that their RETRY timers count from now. Without it a holder whose timer
        was set by an older QUEUED requeued the job while it was being delivered
        here, and could deliver it again after the ACK was answered here."""
        s = self.core
        if job.retry_s:
            s.send_queued(job)

    def push_to_asker(self, q: Queue, now_ms: int) -> None:
        """A job was queued in an otherwise empty queue with no local consumer: if a
        node asked for this queue recently, it gets the job now (a late YOURJOBS)."""
        ask = self.asks.pop(q.name, None)  # one push per NEEDJOBS: askers ask again
        if ask is None or ask[1] < now_ms or not self._can_move_jobs_to(ask[0]):
            return
        self._send_yourjobs(q, ask[0], needjobs_count_min, now_ms)


def peer_job(rec: bytes) -> Job | None:
    """A job record from a peer, or None when it is malformed (dropped, as Disque
    drops a message it cannot parse)."""
    try:
        job = Job.from_record(rec)
    except ValueError:  # also UnicodeDecodeError: the record's documented failures
        return None
    return job if lie_of(job) is None else None  # what the AOF loader would refuse
