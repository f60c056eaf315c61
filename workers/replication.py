"""Job replication and the holders' re-queueing agreement (spec: "Job
replication strategy", "Disque state machine"): ADDJOB's copies (REPLJOB /
GOTJOB), ENQUEUE, WILLQUEUE, QUEUED and WORKING between the nodes holding a job.

``Replication`` is an object the shard owns (``Shard.repl``) and calls; it
changes jobs through the shard's ``Core`` (workers/core.py). The ack GC
(SETACK / GOTACK / DELJOB) is ``AckGc`` (workers/ackgc.py), federation
(NEEDJOBS / YOURJOBS) ``Federation`` (workers/federation.py), PAUSE's broadcast
workers/pause.py; ``Shard.on_message`` dispatches every kind to its part.
Messages come in as ``(sender, meta, bodies, now_ms)`` and leave as ``Send``
effects; every kind, its fields, its check and its handler are in the catalogue,
workers/messages.py.

Timers reuse the shard's one heap: a job's single timer entry also covers its
cluster deadlines (``qtime_ms`` is the next 50 ms replication step for a
``wait-repl`` job, WILLQUEUE fires ``time_error_ms`` before the requeue of an
active job, and it is the next GC attempt of an ``acked`` one); a federation
``Fed`` (one per queue that asked for jobs) sits in the heap as its own target.
"""

from __future__ import annotations

from typing import Any

from workers import messages as msg
from workers.ackgc import AckGc, setack_meta
from workers.core import ERR_NOREPL_TIMEOUT, Core, ReplWait
from workers.effects import QUEUED_INCR_DELIVERIES, QUEUED_INCR_NACKS
from workers.extensions import Extensions
from workers.federation import peer_job
from workers.ids import slot_of_job_id
from workers.invariant import InvariantError
from workers.job import (
    ACKED,
    ACTIVE,
    QUEUED,
    WAIT_REPL,
    Job,
    job_nodes_max,
    node_id_bytes_max,
    union,
)
from workers.queue import PAUSED_IN, Queue
from workers.replies import PENDING, Status

# Replication (spec "Job replication strategy"): one more node every 50 ms.
repl_step_ms = 50



class Replication:
    """A new job's copies on other nodes, and the messages that keep its holders
    agreed on who queues it."""

    def __init__(self, core: Core, gc: AckGc, ext: Extensions) -> None:
        self.core = core
        self.gc = gc
        self.ext = ext

    # ------------------------------------------------------------------ ADDJOB

    def addjob_cluster(self, job: Job, q: Queue, need: int, external: bool, timeout_ms: int,
                       async_: bool, token: int, now_ms: int, flexible: bool = False) -> Any:
        """Replicate a new job to ``need`` shuffled reachable peers (spec step 1);
        ``job`` is not registered yet. ``external``: we keep no copy (leaving, or
        past 75 % of maxmemory)."""
        s = self.core
        targets = list(s.view().peers)
        s.random().shuffle(targets)
        chosen = tuple(targets[:need])
        job.delivered = chosen if external else (s.view().node_id, *chosen)
        if async_:
            return self._addjob_async(job, q, chosen, external, now_ms)
        job.enter(WAIT_REPL)
        job.confirmed = () if external else (s.view().node_id,)
        s.register(job)
        deadline = now_ms + timeout_ms if timeout_ms else 0
        s.wait_repl(job.id, ReplWait(token, deadline, flexible))
        job.qtime_ms = now_ms + repl_step_ms
        s.arm(job)
        self._send_repljob(job, chosen)
        return PENDING

    def _addjob_async(self, job: Job, q: Queue, chosen: tuple[str, ...], external: bool,
                      now_ms: int) -> Any:
        """ASYNC: reply at once, queue at once, replicate in the background (best effort)."""
        s = self.core
        self._send_repljob(job, chosen)
        if external:
            if chosen:
                s.send_job([chosen[0]], msg.ENQUEUE, job, msg.enqueue_meta(job.id, chosen))
            return Status(job.id)
        s.register(job)
        self._activate(job, q, now_ms)
        return Status(job.id)

    def _send_repljob(self, job: Job, nodes: tuple[str, ...] | list[str]) -> None:
        if not nodes:
            return
        rec = job.to_record()
        slot = slot_of_job_id(job.id)
        s = self.core
        for n in nodes:
            s.send(n, msg.REPLJOB, slot, msg.records_meta(), [rec])

    def _activate(self, job: Job, q: Queue, now_ms: int) -> None:
        """A job of ours reached its replication: queue it (or wait for its DELAY)."""
        if job.state == WAIT_REPL:  # (an ASYNC job is active already)
            job.move(ACTIVE)
        self.core.activate(job, q, now_ms)

    def fire_wait_repl(self, job: Job, now_ms: int) -> None:
        """The timer of a job in ``wait-repl``: its deadline, or the next replication step."""
        s = self.core
        rw = s.repl_wait(job.id)
        if rw is None:
            s.unregister(job, now_ms)
            return
        if rw.deadline_ms and rw.deadline_ms <= now_ms:
            self.repl_failed(job, now_ms)
            return
        if job.qtime_ms <= now_ms:
            # Spec: one more node every 50 ms, and REPLJOB again to everyone in
            # delivered so each can refresh its list of nodes that may have a copy.
            have = job.delivered
            fresh = [n for n in s.view().peers if n not in have]
            if fresh:
                job.delivered = (*have, s.random().choice(fresh))
            self._send_repljob(job, s.others(job))
            job.qtime_ms = now_ms + repl_step_ms
            if rw.flexible and self._flexible_done(job):
                return
        s.arm(job)

    def _flexible_done(self, job: Job) -> bool:
        s = self.core
        v = s.view()
        external = v.node_id not in job.delivered
        reach = len(v.peers) + (0 if external else 1)
        goal = max(1, min(job.repl, reach))
        if len(job.confirmed) < goal:
            return False
        job.repl = len(job.confirmed)
        self._repl_done(job, s.now_ms())
        return True

    def repl_failed(self, job: Job, now_ms: int) -> None:
        """Timeout: error to the client, best-effort DELJOB of the copies made."""
        s = self.core
        rw = s.end_repl_wait(job.id)
        s.send_job(s.others(job), msg.DELJOB, job)
        s.unregister(job, now_ms)
        if rw is not None:
            s.wake(rw.token, ERR_NOREPL_TIMEOUT)

    def _repl_done(self, job: Job, now_ms: int) -> None:
        s = self.core
        rw = s.end_repl_wait(job.id)
        if rw is None:
            raise InvariantError(f"job {job.id}: no ADDJOB waits for its copies")
        if s.view().node_id not in job.delivered:
            # External replication: one node that got the job queues it; we keep no copy.
            # The list of every node that may have a copy goes along: we forget the
            # job now, so the holder must know them all for the ACK GC.
            me = s.view().node_id
            holder = s.random().choice([n for n in job.confirmed if n != me])
            s.send_job([holder], msg.ENQUEUE, job, msg.enqueue_meta(job.id, job.delivered))
            s.unregister_quiet(job, now_ms)
        else:
            self._activate(job, s.queue(job.queue, now_ms), now_ms)
        s.wake(rw.token, Status(job.id))

    # ------------------------------------------------------------------ messages

    def on_repljob(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                   now_ms: int) -> None:
        s = self.core
        job = peer_job(bodies[0])
        if job is None:
            return
        if self.gc.gone and self.gc.is_gone(job.id, now_ms):
            return  # acknowledged or deleted already: a late copy would be queued again
        old = s.lookup(job.id)
        if old is not None:
            old.delivered = union(old.delivered, job.delivered)
            s.send_job([sender], msg.GOTJOB, old)
            return
        if job.etime_ms <= now_ms:
            return
        if s.view().memory_level > 0:
            return  # spec: a node near its memory limit takes no copies (no GOTJOB)
        q = s.find_queue(job.queue)
        if q is not None and q.paused & PAUSED_IN:
            return  # a queue paused in input takes no copies (spec, PAUSE)
        job.mark_replica()
        job.qtime_ms = s.retry_at(job, now_ms, job.delay_s * 1000)
        s.arrive(job, s.queue(job.queue, now_ms), now_ms, sender)
        # Disque answers a duplicate REPLJOB too: a lost GOTJOB is then re-sent.
        s.send_job([sender], msg.GOTJOB, job)

    def on_gotjob(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                  now_ms: int) -> None:
        job = self.core.job_of(meta)
        if job is None or job.state != WAIT_REPL:
            return
        job.delivered = union(job.delivered, (sender,))
        job.confirmed = union(job.confirmed, (sender,))
        if len(job.confirmed) >= job.repl:
            self._repl_done(job, now_ms)

    def on_enqueue(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                   now_ms: int) -> None:
        s = self.core
        job = s.job_of(meta)
        if job is None:
            return
        nodes = meta.get("d")
        if (type(nodes) is list and len(nodes) <= job_nodes_max
                and all(type(n) is str and len(n) <= node_id_bytes_max for n in nodes)):
            job.delivered = union(job.delivered, nodes)  # bounded: the record must encode
        if job.state != ACTIVE:
            return
        if not job.retry_s and job.queued_once():
            return  # at-most-once: queued once already (a duplicate ENQUEUE)
        q = s.queue(job.queue, now_ms)
        if q.paused & PAUSED_IN:
            return  # spec: a queue paused in input accepts no ENQUEUE messages
        s.enqueue(job, q, now_ms)

    def on_willqueue(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                     now_ms: int) -> None:
        job = self._held_job(sender, meta, now_ms)
        if job is None:
            return
        s = self.core
        job.delivered = union(job.delivered, (sender,))
        if job.state == QUEUED:
            s.send_job(s.others(job), msg.QUEUED, job)
        elif job.state == ACKED:
            s.send_job([sender], msg.SETACK, job, setack_meta(job))

    def _held_job(self, sender: str, meta: dict[str, Any], now_ms: int) -> Job | None:
        """The job a WILLQUEUE or QUEUED names, if we hold it. If not and we saw it
        acknowledged or deleted cluster-wide, the holder about to queue it (or that
        queued it) is told, so that it acks its copy and runs the GC over the nodes
        it knows (a copy the GC we took part in did not reach)."""
        job = self.core.job_of(meta)
        if job is None:
            jid = meta["j"]
            if self.gc.gone and type(jid) is str and self.gc.is_gone(jid, now_ms):
                self.core.send(sender, msg.SETACK, slot_of_job_id(jid), msg.setack_meta(jid, 0))
        return job

    def on_queued(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                  now_ms: int) -> None:
        job = self._held_job(sender, meta, now_ms)
        if job is None or job.state == WAIT_REPL:
            return
        s = self.core
        if job.state == ACKED:
            s.send_job([sender], msg.SETACK, job, setack_meta(job))
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
        redrive = meta.get("rd", 0)
        if job.state == QUEUED and (sender > s.view().node_id or wait_ms or dead or redrive):
            s.dequeue(job, now_ms)  # the greater ID keeps it
        if dead:
            self.ext.follow_dead_letter(job, meta.get("why"), now_ms)
        elif redrive:
            self.ext.follow_redrive(job, now_ms)
        if job.retry_s:
            qtime = s.retry_at(job, now_ms, wait_ms)
            # a QUEUED that crossed our NACK's DELAY never cuts it short
            s.postpone(job, qtime if not job.nack_delayed() or qtime > job.qtime_ms
                       else job.qtime_ms)

    def on_working(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                   now_ms: int) -> None:
        """A client said WORKING on another node: postpone our requeue as well
        (and leave the queue, the job is being processed elsewhere)."""
        s = self.core
        job = s.job_of(meta)
        if job is None or job.state in (ACKED, WAIT_REPL) or not job.retry_s:
            return
        job.delivered = union(job.delivered, (sender,))
        if job.state == QUEUED:
            s.dequeue(job, now_ms)
        s.postpone(job, s.retry_at(job, now_ms))
