# mypy: disable-error-code="misc"
# (Mixin methods take ``self: Shard`` so their bodies are checked against the
# real class; mypy flags such self types with "misc" unless they are protocols.)
"""The distributed half of the shard: Disque's replication, re-queueing, ack GC
and PAUSE broadcast (spec: "Implementation details", "Disque state machine" and
"Gracefully removal of nodes"); federation (NEEDJOBS / YOURJOBS) is the
``Federation`` object of workers/federation.py, dispatched from here.

``ClusterOps`` is a mixin of ``Shard``; it keeps the shard pure: messages come
in through ``on_message(sender, kind, meta, bodies, now_ms)`` and leave as
``Send`` effects. Message kinds and payloads (``meta`` is JSON, job records
and queue names travel in ``bodies`` as raw bytes):

=========  =====================================  ==========================
kind       meta                                   bodies
=========  =====================================  ==========================
REPLJOB    {}                                     [job record]
GOTJOB     {"j": id}
ENQUEUE    {"j": id, "d": [node, ...]}
WILLQUEUE  {"j": id}
QUEUED     {"j": id[, "f": 2|4 (increment nacks|deliveries)]
            [, "w": ms (NACK DELAY), "dl": 1 (moved to dead:<queue>)]}
WORKING    {"j": id}
SETACK     {"j": id, "m": may-have[, "d": [node, ...]]}
GOTACK     {"j": id, "k": 0|1 (known)}
DELJOB     {"j": id}
NEEDJOBS   {"c": count}                           [queue name]
YOURJOBS   {}                                     [job record, ...]
PAUSE      {"f": pause flags}                     [queue name]
=========  =====================================  ==========================

Every message about a job is sent to the job's slot (carried by its ID), so on
the receiving host it reaches the worker owning the same slot; queue messages
use the queue's slot.

Timers reuse the shard's one heap: a job's single timer entry also covers its
cluster deadlines (``qtime_ms`` is the next 50 ms replication step for a
``wait-repl`` job, WILLQUEUE fires ``time_error_ms`` before the requeue of an
active job, and it is the next GC attempt of an ``acked`` one); a federation
``Fed`` (one per queue that asked for jobs) sits in the heap as its own target.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workers.effects import QUEUED_INCR_DELIVERIES, QUEUED_INCR_NACKS, AofAppend, Send, Wake
from workers.federation import peer_job
from workers.ids import slot_of_job_id
from workers.job import (
    ACKED,
    ACTIVE,
    FLAG_NACK_DELAYED,
    FLAG_QUEUED_ONCE,
    FLAG_REPLICA,
    FLAG_WILLQUEUE_SENT,
    QUEUED,
    WAIT_REPL,
    Job,
    job_nodes_max,
    node_id_bytes_max,
    union,
)
from workers.queue import PAUSED_IN, PAUSED_OUT, Queue
from workers.replies import ERR_LEAVING, PENDING, Error, Status

if TYPE_CHECKING:
    from workers.shard import Shard

ERR_NOREPL_TIMEOUT = Error(
    "NOREPL Timeout reached before replicating to the requested number of nodes"
)

# Replication (spec "Job replication strategy"): one more node every 50 ms.
repl_step_ms = 50



class ReplWait:
    """A synchronous ADDJOB waiting for GOTJOBs (the job is in ``wait-repl``)."""

    __slots__ = ("token", "deadline_ms", "flexible")

    def __init__(self, token: int, deadline_ms: int, flexible: bool) -> None:
        self.token = token
        self.deadline_ms = deadline_ms  # 0 = no timeout (ms-timeout 0): until the TTL
        # REPLICATE was not given: "the cluster size when smaller" follows the
        # reachable nodes while we wait (a node found dead lowers the goal).
        self.flexible = flexible


class ClusterOps:
    """Cluster messages and the cluster side of client commands (mixin of Shard)."""

    # reachable peers our bus link has no PONG on yet (set_view): not sent YOURJOBS
    _unlinked: frozenset[str] = frozenset()
    # every reachable node, leaving ones too (set_view); None: set_peers's list
    _reach: tuple[str, ...] | None = None

    # ------------------------------------------------------------------ view

    def set_view(self: Shard, myid: str, peers: list[tuple[str, bool, bool]] | list[Any],
                 leaving: bool) -> None:
        """The membership view: our ID, every other known node as (id, reachable,
        leaving[, linked]), our own LEAVING flag. Replication targets are the
        reachable nodes that are not leaving. ``linked`` (default: reachable) is
        False while our bus link to the node has not carried a PONG: a message
        to it would be dropped (membership.Node.linked)."""
        if myid and myid != self.node_id:
            self._set_node_id(myid)
        known = tuple(p[0] for p in peers if p[0] != self.node_id)
        self._known = known
        self._peers = tuple(p[0] for p in peers if p[1] and not p[2] and p[0] != self.node_id)
        self._unlinked = frozenset(p[0] for p in peers if p[1] and len(p) > 3 and not p[3])
        # Every reachable node, leaving or not: they still hold jobs (GLOBALQLEN, DELQUEUE).
        self._reach = tuple(p[0] for p in peers if p[1] and p[0] != self.node_id)
        self.set_leaving(leaving)

    def set_leaving(self: Shard, leaving: bool) -> None:
        """CLUSTER LEAVING: no new local copies, no NEEDJOBS, no dummy ACKs, and
        blocked clients are released with -LEAVING (spec, "Gracefully removal")."""
        was = self._leaving
        self._leaving = leaving
        if leaving and not was:
            for w in list(self._waiters.values()):
                self._drop_waiter(w, self._now_ms)
                self._effects.append(Wake(w.token, ERR_LEAVING))

    def _send(self: Shard, node: str, kind: str, slot: int, meta: dict[str, Any],
              bodies: list[bytes] | None = None) -> None:
        self._effects.append(Send(node, kind, slot, meta, bodies if bodies is not None else []))

    def _others(self: Shard, job: Job) -> list[str]:
        me = self.node_id
        return [n for n in job.delivered if n != me]

    def _send_job(self: Shard, nodes: list[str] | tuple[str, ...], kind: str, job: Job,
                  meta: dict[str, Any] | None = None) -> None:
        slot = slot_of_job_id(job.id)
        m = {"j": job.id} if meta is None else meta
        for n in nodes:
            self._effects.append(Send(n, kind, slot, m, []))

    def _reschedule(self: Shard, job: Job) -> None:
        self.timers.unschedule(job)
        self.timers.schedule(job, self._due(job))

    # ------------------------------------------------------------------ ADDJOB

    def _addjob_cluster(self: Shard, job: Job, q: Queue, need: int, external: bool,
                        timeout_ms: int, async_: bool, token: int, now_ms: int,
                        flexible: bool = False) -> Any:
        """Replicate a new job to ``need`` shuffled reachable peers (spec step 1);
        ``job`` is not registered yet. ``external``: we keep no copy (leaving, or
        past 75 % of maxmemory)."""
        targets = list(self._peers)
        self._rng.shuffle(targets)
        chosen = tuple(targets[:need])
        job.delivered = chosen if external else (self.node_id, *chosen)
        if async_:
            return self._addjob_async(job, q, chosen, external, now_ms)
        job.state = WAIT_REPL
        job.confirmed = () if external else (self.node_id,)
        self._register(job)
        deadline = now_ms + timeout_ms if timeout_ms else 0
        self._repl[job.id] = ReplWait(token, deadline, flexible)
        job.qtime_ms = now_ms + repl_step_ms
        self.timers.schedule(job, self._due(job))
        self._send_repljob(job, chosen)
        return PENDING

    def _addjob_async(self: Shard, job: Job, q: Queue, chosen: tuple[str, ...],
                      external: bool, now_ms: int) -> Any:
        """ASYNC: reply at once, queue at once, replicate in the background (best effort)."""
        self._send_repljob(job, chosen)
        if external:
            if chosen:
                self._send_job([chosen[0]], "ENQUEUE", job, {"j": job.id, "d": list(chosen)})
            return Status(job.id)
        self._register(job)
        self._activate(job, q, now_ms)
        return Status(job.id)

    def _send_repljob(self: Shard, job: Job, nodes: tuple[str, ...] | list[str]) -> None:
        if not nodes:
            return
        rec = job.to_record()
        slot = slot_of_job_id(job.id)
        for n in nodes:
            self._effects.append(Send(n, "REPLJOB", slot, {}, [rec]))

    def _activate(self: Shard, job: Job, q: Queue, now_ms: int) -> None:
        """A job of ours reached its replication: queue it (or wait for its DELAY)."""
        job.state = ACTIVE
        if job.delay_s:
            job.qtime_ms = now_ms + job.delay_s * 1000
            self._reschedule(job)
        else:
            job.qtime_ms = 0
            self.timers.unschedule(job)
            self._enqueue(job, q, now_ms)
        if self.aof:
            self._effects.append(AofAppend(job.to_record()))

    def _fire_wait_repl(self: Shard, job: Job, now_ms: int) -> None:
        rw = self._repl.get(job.id)
        if rw is None:
            self._unregister(job, now_ms)
            return
        if rw.deadline_ms and rw.deadline_ms <= now_ms:
            self._repl_failed(job, now_ms)
            return
        if job.qtime_ms <= now_ms:
            # Spec: one more node every 50 ms, and REPLJOB again to everyone in
            # delivered so each can refresh its list of nodes that may have a copy.
            have = job.delivered
            fresh = [n for n in self._peers if n not in have]
            if fresh:
                job.delivered = (*have, self._rng.choice(fresh))
            self._send_repljob(job, self._others(job))
            job.qtime_ms = now_ms + repl_step_ms
            if rw.flexible and self._flexible_done(job):
                return
        self.timers.schedule(job, self._due(job))

    def _flexible_done(self: Shard, job: Job) -> bool:
        external = self.node_id not in job.delivered
        reach = len(self._peers) + (0 if external else 1)
        goal = max(1, min(job.repl, reach))
        if len(job.confirmed) < goal:
            return False
        job.repl = len(job.confirmed)
        self._repl_done(job, self._now_ms)
        return True

    def _repl_failed(self: Shard, job: Job, now_ms: int) -> None:
        """Timeout: error to the client, best-effort DELJOB of the copies made."""
        rw = self._repl.pop(job.id, None)
        self._send_job(self._others(job), "DELJOB", job)
        self._unregister(job, now_ms)
        if rw is not None:
            self._effects.append(Wake(rw.token, ERR_NOREPL_TIMEOUT))

    def _repl_done(self: Shard, job: Job, now_ms: int) -> None:
        rw = self._repl.pop(job.id)
        if self.node_id not in job.delivered:
            # External replication: one node that got the job queues it; we keep no copy.
            # The list of every node that may have a copy goes along: we forget the
            # job now, so the holder must know them all for the ACK GC.
            holder = self._rng.choice([n for n in job.confirmed if n != self.node_id])
            self._send_job([holder], "ENQUEUE", job, {"j": job.id, "d": list(job.delivered)})
            self._unregister_quiet(job, now_ms)
        else:
            self._activate(job, self._queue(job.queue, now_ms), now_ms)
        self._effects.append(Wake(rw.token, Status(job.id)))

    # ------------------------------------------------------------------ messages

    def on_message(self: Shard, sender: str, kind: str, meta: dict[str, Any],
                   bodies: list[bytes], now_ms: int) -> None:
        """One cluster message from node ``sender`` (malformed input is dropped)."""
        self._now_ms = now_ms
        handler = _HANDLERS.get(kind)
        if handler is None:
            self.ext.on_message(sender, kind, meta, bodies, now_ms)
            return
        # Shapes and values were checked at the edge (bus/messages.py); only the job
        # records inside are parsed here (``peer_job``).
        handler(self, sender, meta, bodies, now_ms)

    def _job_of(self: Shard, meta: dict[str, Any]) -> Job | None:
        jid = meta["j"]
        if type(jid) is not str or len(jid) != 40:
            return None
        return self.lookup(jid)

    def _on_repljob(self: Shard, sender: str, meta: dict[str, Any], bodies: list[bytes],
                    now_ms: int) -> None:
        job = peer_job(bodies[0])
        if job is None:
            return
        if self.gc.gone and self.gc.is_gone(job.id, now_ms):
            return  # acknowledged or deleted already: a late copy would be queued again
        old = self.lookup(job.id)
        if old is not None:
            old.delivered = union(old.delivered, job.delivered)
            self._send_job([sender], "GOTJOB", old)
            return
        if job.etime_ms <= now_ms:
            return
        if self._memory_level > 0:
            return  # spec: a node near its memory limit takes no copies (no GOTJOB)
        q = self._queues.get(job.queue)
        if q is not None and q.paused & PAUSED_IN:
            return  # a queue paused in input takes no copies (spec, PAUSE)
        q = self._queue(job.queue, now_ms)
        job.queue = q.name
        job.state = ACTIVE
        job.delivered = union(job.delivered, (self.node_id, sender))
        job.confirmed = ()
        job.flags |= FLAG_REPLICA
        if job.retry_s:
            job.qtime_ms = (now_ms + (job.delay_s + job.retry_s) * 1000
                            + self._jitter())
        else:
            job.qtime_ms = 0
        self._register(job)
        self.timers.schedule(job, self._due(job))
        if self.aof:
            self._effects.append(AofAppend(job.to_record()))
        # Disque answers a duplicate REPLJOB too: a lost GOTJOB is then re-sent.
        self._send_job([sender], "GOTJOB", job)

    def _on_gotjob(self: Shard, sender: str, meta: dict[str, Any], bodies: list[bytes],
                   now_ms: int) -> None:
        job = self._job_of(meta)
        if job is None or job.state != WAIT_REPL:
            return
        job.delivered = union(job.delivered, (sender,))
        job.confirmed = union(job.confirmed, (sender,))
        if len(job.confirmed) >= job.repl:
            self._repl_done(job, now_ms)

    def _on_enqueue(self: Shard, sender: str, meta: dict[str, Any], bodies: list[bytes],
                    now_ms: int) -> None:
        job = self._job_of(meta)
        if job is None:
            return
        nodes = meta.get("d")
        if (type(nodes) is list and len(nodes) <= job_nodes_max
                and all(type(n) is str and len(n) <= node_id_bytes_max for n in nodes)):
            job.delivered = union(job.delivered, nodes)  # bounded: the record must encode
        if job.state != ACTIVE:
            return
        if not job.retry_s and job.flags & FLAG_QUEUED_ONCE:
            return  # at-most-once: queued once already (a duplicate ENQUEUE)
        q = self._queue(job.queue, now_ms)
        if q.paused & PAUSED_IN:
            return  # spec: a queue paused in input accepts no ENQUEUE messages
        self._enqueue(job, q, now_ms)

    def _on_willqueue(self: Shard, sender: str, meta: dict[str, Any], bodies: list[bytes],
                      now_ms: int) -> None:
        job = self._job_of(meta)
        if job is None:
            self._setack_if_gone(sender, meta, now_ms)
            return
        job.delivered = union(job.delivered, (sender,))
        if job.state == QUEUED:
            self._send_job(self._others(job), "QUEUED", job)
        elif job.state == ACKED:
            self._send_job([sender], "SETACK", job, self._setack_meta(job))

    def _setack_if_gone(self: Shard, sender: str, meta: dict[str, Any], now_ms: int) -> None:
        """A holder is about to queue (or queued) a job we saw acknowledged or deleted
        cluster-wide: tell it, so that it acks its copy and runs the GC over the nodes
        it knows (a copy the GC we took part in did not reach)."""
        jid = meta["j"]
        if self.gc.gone and type(jid) is str and self.gc.is_gone(jid, now_ms):
            self._send(sender, "SETACK", slot_of_job_id(jid), {"j": jid, "m": 0})

    def _setack_meta(self: Shard, job: Job) -> dict[str, Any]:
        """SETACK's meta: the count the spec asks for, and the nodes themselves, so that
        a receiver that knows a node we do not runs the GC itself (equal counts of
        different node lists would otherwise confirm a GC that misses a copy)."""
        return {"j": job.id, "m": len(job.delivered), "d": list(job.delivered)}

    def _on_queued(self: Shard, sender: str, meta: dict[str, Any], bodies: list[bytes],
                   now_ms: int) -> None:
        job = self._job_of(meta)
        if job is None:
            self._setack_if_gone(sender, meta, now_ms)
            return
        if job.state == WAIT_REPL:
            return
        if job.state == ACKED:
            self._send_job([sender], "SETACK", job, self._setack_meta(job))
            return
        job.delivered = union(job.delivered, (sender,))
        incr = meta.get("f", 0)
        if incr == QUEUED_INCR_DELIVERIES:  # the sender counted a further delivery
            job.additional_deliveries += 1
        elif incr == QUEUED_INCR_NACKS:
            job.nacks += 1
        # Extensions (workers/extensions.py): a NACK's DELAY, or the move to the
        # dead-letter queue: the sender's copy wins whatever the IDs.
        wait_ms = meta.get("w", 0)
        dead = meta.get("dl", 0)
        if job.state == QUEUED and (sender > self.node_id or wait_ms or dead):
            self._dequeue(job, self._queues[job.queue], now_ms)  # the greater ID keeps it
        if dead:
            self.ext.follow_dead_letter(job, now_ms)
        if job.retry_s:
            qtime = now_ms + wait_ms + job.retry_s * 1000 + self._jitter()
            if not job.flags & FLAG_NACK_DELAYED or qtime > job.qtime_ms:
                job.qtime_ms = qtime  # a QUEUED that crossed our NACK's DELAY never cuts it short
            job.flags &= ~FLAG_WILLQUEUE_SENT
            self._reschedule(job)

    def _send_working(self: Shard, job: Job) -> None:
        others = self._others(job)
        if others:
            self._send_job(others, "WORKING", job)

    def _on_working(self: Shard, sender: str, meta: dict[str, Any], bodies: list[bytes],
                    now_ms: int) -> None:
        """A client said WORKING on another node: postpone our requeue as well
        (and leave the queue, the job is being processed elsewhere)."""
        job = self._job_of(meta)
        if job is None or job.state in (ACKED, WAIT_REPL) or not job.retry_s:
            return
        job.delivered = union(job.delivered, (sender,))
        if job.state == QUEUED:
            self._dequeue(job, self._queues[job.queue], now_ms)
        job.qtime_ms = now_ms + job.retry_s * 1000 + self._jitter()
        job.flags &= ~FLAG_WILLQUEUE_SENT
        self._reschedule(job)

    def _send_queued(self: Shard, job: Job, incr: int = 0) -> None:
        others = self._others(job)
        if others:
            self._send_job(others, "QUEUED", job, {"j": job.id, "f": incr} if incr else None)

    # ------------------------------------------------------------------ acks and GC

    def _ack_cluster(self: Shard, job: Job, now_ms: int) -> bool:
        """ACK-JOB: mark acked; returns False when the job was dropped at once
        (nobody else may have a copy)."""
        if job.state == ACKED:
            return True
        if job.state == QUEUED:
            self._dequeue(job, self._queues[job.queue], now_ms)
        elif job.state == WAIT_REPL:
            rw = self._repl.pop(job.id, None)
            if rw is not None:
                self._effects.append(Wake(rw.token, Status(job.id)))
        job.state = ACKED
        job.flags &= ~FLAG_WILLQUEUE_SENT
        if self.ext.waits:
            self.ext.job_done(job.id)  # WAITJOB (workers/extensions.py)
        if job.delivered and not self._others(job):
            self._unregister(job, now_ms)
            return False
        job.confirmed = (self.node_id,) if self.node_id in job.delivered else ()
        self.gc.tries.pop(job.id, None)
        if self.aof:
            self._effects.append(AofAppend(job.to_record()))
        # Every acked job has a GC timer, also where another node runs the GC: if
        # that node's DELJOB is lost, our own attempt finds the copies gone.
        return self.gc.arm_gc(job, now_ms)

    def _on_setack(self: Shard, sender: str, meta: dict[str, Any], bodies: list[bytes],
                   now_ms: int) -> None:
        self.gc.on_setack(sender, meta, now_ms)

    def _on_gotack(self: Shard, sender: str, meta: dict[str, Any], bodies: list[bytes],
                   now_ms: int) -> None:
        self.gc.on_gotack(sender, meta, now_ms)

    def _on_deljob(self: Shard, sender: str, meta: dict[str, Any], bodies: list[bytes],
                   now_ms: int) -> None:
        self.gc.on_deljob(meta, now_ms)

    # ------------------------------------------------------------------ federation

    def _on_needjobs(self: Shard, sender: str, meta: dict[str, Any], bodies: list[bytes],
                     now_ms: int) -> None:
        self.fed.on_needjobs(sender, meta, bodies, now_ms)

    def _on_yourjobs(self: Shard, sender: str, meta: dict[str, Any], bodies: list[bytes],
                     now_ms: int) -> None:
        self.fed.on_yourjobs(sender, meta, bodies, now_ms)

    # ------------------------------------------------------------------ PAUSE bcast

    def _on_pause(self: Shard, sender: str, meta: dict[str, Any], bodies: list[bytes],
                  now_ms: int) -> None:
        flags = int(meta["f"]) & (PAUSED_IN | PAUSED_OUT)
        self._set_pause(bytes(bodies[0]), flags, now_ms)


_HANDLERS: dict[str, Any] = {
    "REPLJOB": ClusterOps._on_repljob,
    "GOTJOB": ClusterOps._on_gotjob,
    "ENQUEUE": ClusterOps._on_enqueue,
    "WILLQUEUE": ClusterOps._on_willqueue,
    "QUEUED": ClusterOps._on_queued,
    "WORKING": ClusterOps._on_working,
    "SETACK": ClusterOps._on_setack,
    "GOTACK": ClusterOps._on_gotack,
    "DELJOB": ClusterOps._on_deljob,
    "NEEDJOBS": ClusterOps._on_needjobs,
    "YOURJOBS": ClusterOps._on_yourjobs,
    "PAUSE": ClusterOps._on_pause,
}
