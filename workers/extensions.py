"""The shard's side of the extensions beyond the reference (docs/extensions.md):
NACK ... DELAY, dead letters (ADDJOB ... MAXDELIVER, DEADLETTER, REDRIVE: the
moves are the core's verbs ``Core.dead_letter`` / ``Core.redrive``), WAITJOB,
GLOBALQLEN and DELQUEUE.

``Extensions`` is a collaborator the shard owns (``Shard.ext``) and calls: the
extensions change the same job records and timers as the reference's commands,
so they reach them through the shard's ``Core`` (workers/core.py, whose
events it hears: a job acknowledged or leaving the table is done for WAITJOB) and ACK
through its ``AckGc``. Keeping them here keeps the reference's state machine
readable on its own. Their cluster messages (QLENASK, QLENIS, DELQ, DELQDONE, and
the fields they add to QUEUED) are in the catalogue, workers/messages.py.
"""

from __future__ import annotations

from typing import Any, Final

from workers import messages as msg
from workers.ackgc import AckGc
from workers.core import Core, Events
from workers.ids import DEAD_PREFIX, slot_of
from workers.job import (
    ACKED,
    ACTIVE,
    DELETED,
    QUEUED,
    Job,
    Timed,
)
from workers.queue import PAUSED_IN
from workers.replies import ERR_PAUSED, PENDING, Error

# GLOBALQLEN / DELQUEUE: how long the asking node waits for the other nodes'
# answers; a node that has not answered by then is left out of the reply (it
# is reachable but slow, or the message was lost).
cluster_request_timeout_ms = 1000
# WAITJOB: (job, wait) pairs one shard keeps (about 100 bytes each); a WAITJOB that
# would go past it is refused. An entry lives until its job is done (at the
# latest its TTL), even when its wait timed out or its client left.
waitjob_entries_max = 1_000_000
ERR_WAITJOB_MAX: Final = Error(
    f"ERR too many jobs waited on: at most {waitjob_entries_max} per worker, try later")


def err_waitjob_client_max(share_max: int) -> Error:
    """A client past its share of the table (config waitjob-entries-per-client-max)."""
    return Error(f"ERR too many jobs waited on by this client: at most {share_max} "
                 f"per worker, try later")

JOB_ID_BYTES: Final = 40


def dead_queue_of(queue: bytes) -> bytes:
    return DEAD_PREFIX + queue


class Gather(Timed):
    """A client command waiting on this shard: a WAITJOB (``need`` jobs, ``count``
    done), or a GLOBALQLEN / DELQUEUE gathering the other nodes' answers
    (``waiting``: nodes not answered yet; ``count`` the QLEN sum; ``ids`` the
    distinct jobs removed). It sits in the shard's timer heap for its timeout."""

    __slots__ = ("token", "count", "need", "waiting", "ids", "finished", "client")

    def __init__(self, token: int, count: int, need: int = 0, client: bytes = b"") -> None:
        self.token = token
        self.client = client  # WAITJOB: whose share of the table its entries count in
        self.count = count
        self.need = need
        self.waiting: set[str] = set()
        self.ids: set[str] | None = None
        self.finished = False
        self.awake_ms = 0

    def reply(self) -> int:
        return self.count if self.ids is None else len(self.ids)


def past_maxdeliver(job: Job) -> bool:
    """The job was delivered ``maxdeliver`` times (first delivery, then one per
    NACK or redelivery, as this node counts them) and is not a dead letter yet."""
    cap = job.maxdeliver
    return bool(cap) and job.nacks + job.additional_deliveries >= cap \
        and not job.queue.startswith(DEAD_PREFIX)


class Extensions(Events):
    """The extensions' state (WAITJOBs, gathers) and operations on one shard."""

    def __init__(self, core: Core, gc: AckGc) -> None:
        self.core = core
        self.gc = gc
        core.subscribe(self, "after_ack", "after_job_gone")
        # WAITJOBs by the jobs they wait on, GLOBALQLEN / DELQUEUE gathering the
        # other nodes' answers by token.
        self.waits: dict[str, list[Gather]] = {}
        self.wait_entries = 0  # sum of the lists' lengths (waitjob_entries_max)
        # the entries of each client that has some (its share: the node's
        # waitjob-entries-per-client-max); a client's entries outlive its connection
        self.client_entries: dict[bytes, int] = {}
        self.gathers: dict[int, Gather] = {}

    # ------------------------------------------------------------------ dead letters

    def op_deadletter(self, job_ids: list[str], reason: bytes | None, now_ms: int) -> int:
        """DEADLETTER: move the jobs (queued or active here) to their dead-letter
        queues now; how many moved. A job this shard does not hold, one still
        waiting for its copies, an acknowledged one, one already dead, and an
        at-most-once job already delivered (queued again it would be delivered
        twice: Disque's ENQUEUE refuses it too) are left as they are, not counted."""
        s = self.core
        done = 0
        for jid in job_ids:
            job = s.lookup(jid)
            if job is None or job.queue.startswith(DEAD_PREFIX) or not (
                    job.state == QUEUED or (job.state == ACTIVE and job.qtime_ms)):
                continue
            s.dead_letter(job, now_ms, 0, reason)
            done += 1
        return done

    def op_redrive(self, queue: bytes, count: int, now_ms: int) -> int | Error:
        """REDRIVE: the oldest ``count`` jobs queued here in the dead-letter queue
        ``queue`` back to the queue they came from; how many moved. A queue paused
        in input refuses them as it refuses ADDJOB."""
        q = self.core.find_queue(queue)
        if q is None or not queue.startswith(DEAD_PREFIX):
            return 0
        if self._target_paused(queue):
            return ERR_PAUSED
        jobs = q.oldest(count)
        for job in jobs:
            self.core.redrive(job, now_ms)
        return len(jobs)

    def op_redrive_ids(self, queue: bytes, job_ids: list[str], now_ms: int) -> int | Error:
        """REDRIVE ... ID: those jobs, each if it is queued here in the dead-letter
        queue ``queue``, back to the queue they came from; how many moved."""
        if not queue.startswith(DEAD_PREFIX):
            return 0
        if self._target_paused(queue):
            return ERR_PAUSED
        done = 0
        for jid in job_ids:
            job = self.core.lookup(jid)
            if job is None or job.queue != queue or job.state != QUEUED:
                continue
            self.core.redrive(job, now_ms)
            done += 1
        return done

    def _target_paused(self, dead: bytes) -> bool:
        """The queue ``dead`` drains into is paused in input: it refuses them as ADDJOB."""
        target = self.core.find_queue(dead[len(DEAD_PREFIX):])
        return target is not None and bool(target.paused & PAUSED_IN)

    def follow_dead_letter(self, job: Job, reason: Any, now_ms: int) -> None:
        """Another holder dead-lettered the job (QUEUED "dl", its reason "why"):
        our copy (active) belongs to the dead-letter queue from now on."""
        if job.queue.startswith(DEAD_PREFIX):
            return
        why = reason.encode("latin-1") if type(reason) is str else None
        self.core.dead_letter(job, now_ms, 0, why, follow=True)

    def follow_redrive(self, job: Job, now_ms: int) -> None:
        """Another holder redrove the job (QUEUED "rd"): our copy goes back too."""
        if job.queue.startswith(DEAD_PREFIX):
            self.core.redrive(job, now_ms, follow=True)

    # ------------------------------------------------------------------ WAITJOB

    def op_waitjob(self, token: int, job_ids: list[str], timeout_ms: int,
                   now_ms: int, client: bytes = b"", share_max: int = 0) -> Any:
        """How many of the jobs are done (acknowledged, deleted, expired; a job this
        shard does not hold counts as done), at once when all are, else PENDING and
        ``Wake(token, count)`` when the last one is or at the timeout (0: none).
        ``client`` holds at most ``share_max`` entries (0: no share)."""
        pending: list[str] = []
        for jid in job_ids:
            job = self.core.lookup(jid)
            if job is not None and job.state != ACKED:
                pending.append(jid)
        done = len(job_ids) - len(pending)
        if not pending:
            return done
        if self.wait_entries + len(pending) > waitjob_entries_max:
            return ERR_WAITJOB_MAX
        if share_max:
            held = self.client_entries.get(client, 0) + len(pending)
            if held > share_max:
                return err_waitjob_client_max(share_max)
            self.client_entries[client] = held
        self.wait_entries += len(pending)
        w = Gather(token, done, len(job_ids), client if share_max else b"")
        waits = self.waits
        for jid in pending:
            ws = waits.get(jid)
            if ws is None:
                waits[jid] = [w]
            else:
                ws.append(w)
        if timeout_ms:
            self.core.schedule(w, now_ms + timeout_ms)
        return PENDING

    def after_ack(self, job_id: str) -> None:
        if self.wait_entries:
            self.job_done(job_id)

    def after_job_gone(self, job_id: str) -> None:
        if self.wait_entries:
            self.job_done(job_id)

    def job_done(self, job_id: str) -> None:
        """The job was acknowledged or left this shard: the WAITJOBs on it count it."""
        ws = self.waits.pop(job_id, None)
        if ws is None:
            return
        self.wait_entries -= len(ws)
        entries = self.client_entries
        for w in ws:
            if w.client:
                left = entries[w.client] - 1
                if left:
                    entries[w.client] = left
                else:
                    del entries[w.client]
            if not w.finished:
                w.count += 1
                if w.count >= w.need:
                    self._finish(w)

    def _finish(self, g: Gather) -> None:
        g.finished = True
        self.core.unschedule(g)
        self.gathers.pop(g.token, None)
        self.core.wake(g.token, g.reply())

    def fire_gather(self, g: Gather, now_ms: int) -> None:
        """Timeout: reply with what is known (WAITJOB's stale entries go with
        their jobs)."""
        if not g.finished:
            self._finish(g)

    def finish_all(self) -> None:
        """FLUSHALL: every job is gone (so done) and no answer will be counted;
        the state starts empty."""
        for ws in self.waits.values():
            for w in ws:
                if not w.finished:
                    w.count = w.need
                    self._finish(w)
        for g in list(self.gathers.values()):
            self._finish(g)
        self.waits = {}
        self.wait_entries = 0
        self.client_entries = {}
        self.gathers = {}

    # ------------------------------------------------------------------ GLOBALQLEN / DELQUEUE

    def _ask_all(self, g: Gather, kind: str, queue: bytes, now_ms: int) -> Any:
        """Send the request to every reachable node; PENDING, or the reply at once
        when there is no other node."""
        s = self.core
        v = s.view()
        nodes = v.reach if v.reach is not None else v.peers
        if not nodes:
            return g.reply()
        g.waiting = set(nodes)
        self.gathers[g.token] = g
        slot = slot_of(queue)
        for n in nodes:
            s.send(n, kind, slot, msg.request_meta(g.token), [bytes(queue)])
        s.schedule(g, now_ms + cluster_request_timeout_ms)
        return PENDING

    def _answered(self, sender: str, meta: dict[str, Any]) -> Gather | None:
        g = self.gathers.get(meta["r"])
        if g is None or sender not in g.waiting:
            return None
        g.waiting.discard(sender)
        return g

    def op_globalqlen(self, token: int, queue: bytes, now_ms: int) -> Any:
        return self._ask_all(Gather(token, self.core.qlen(queue)), msg.QLENASK, queue, now_ms)

    def on_qlenask(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                    now_ms: int) -> None:
        self.core.send(sender, msg.QLENIS, slot_of(bodies[0]),
                       msg.qlenis_meta(meta["r"], self.core.qlen(bodies[0])))

    def on_qlenis(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                   now_ms: int) -> None:
        g = self._answered(sender, meta)
        if g is not None:
            g.count += int(meta["n"])
            if not g.waiting:
                self._finish(g)

    def op_delqueue(self, token: int, queue: bytes, local: bool, now_ms: int) -> Any:
        """Acknowledge every job of the queue held here (queued, delayed, active),
        and with ``local`` False on every reachable node; replies the number of
        distinct jobs removed."""
        g = Gather(token, 0)
        g.ids = set(self._delqueue_here(queue, now_ms))
        if local:
            return g.reply()
        return self._ask_all(g, msg.DELQ, queue, now_ms)

    def _delqueue_here(self, queue: bytes, now_ms: int) -> list[str]:
        """O(jobs of this shard): delayed and active jobs are not indexed by queue."""
        victims = [j for b in self.core.job_table() if b for j in b.values()
                   if j.queue == queue and j.state != ACKED]
        for job in victims:
            if job.state != DELETED:
                self.gc.ack(job, now_ms)  # the ACK reaches every holder (SETACK, GC)
        return [j.id for j in victims]

    def on_delq(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                 now_ms: int) -> None:
        ids = self._delqueue_here(bytes(bodies[0]), now_ms)
        self.core.send(sender, msg.DELQDONE, slot_of(bodies[0]), msg.request_meta(meta["r"]),
                       ["".join(ids).encode()])

    def on_delqdone(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                     now_ms: int) -> None:
        g = self._answered(sender, meta)
        if g is None or g.ids is None:
            return
        raw = bodies[0] if bodies else b""
        for at in range(0, len(raw) - JOB_ID_BYTES + 1, JOB_ID_BYTES):
            g.ids.add(raw[at : at + JOB_ID_BYTES].decode("ascii", "replace"))
        if not g.waiting:
            self._finish(g)
