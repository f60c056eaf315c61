"""Acknowledgement garbage collection (spec "ACKs and garbage collection"): an
acknowledged job is kept until every node that may hold a copy confirmed the
ACK (SETACK / GOTACK), then deleted everywhere (DELJOB); an ACK of a job this
node does not know is kept as a dummy ACK so it survives a partition.

``AckGc`` is an object the shard owns (``Shard.gc``) and calls: it marks jobs
acked (ACKJOB, SETACK, GOTACK), keeps the GC attempts of acked jobs and the
IDs of jobs known gone cluster-wide, and reaches the jobs through the shard's
``Core`` (workers/core.py). The GC of an acked job shares the job's one timer
entry (its ``qtime_ms`` is the next attempt).
"""

from __future__ import annotations

from typing import Any

from workers import messages as msg
from workers.core import Core, Events
from workers.ids import is_at_most_once_id, slot_of_job_id
from workers.job import (
    ACKED,
    QUEUED,
    WAIT_REPL,
    Job,
    merge_nodes,
    times_1000,
    union,
)
from workers.replies import Status

# Ack GC retries: first retry after 1 s, doubling, with up to +50 % random error,
# at most 60 s apart; after gc_attempts_max retries the job is dropped anyway
# (the spec allows GC "after some time ... in order to reclaim memory").
gc_first_ms = 1000
gc_backoff_max_ms = 60_000
gc_attempts_max = 30
# IDs of jobs this node saw acknowledged or deleted cluster-wide (DELJOB, a
# SETACK for a job it did not hold, a GC it completed) are kept this long: a
# REPLJOB or YOURJOBS for one arriving later (a message that took worker 0's relay
# while a newer one took the just-ready direct data link, or a replication step
# re-sent before the ACK) must not bring back a copy that would be queued again
# after RETRY. Bounded: the oldest are forgotten first.
gone_ids_keep_ms = 30_000
gone_ids_max = 100_000


class AckGc(Events):
    """ACKs, GC attempts of acked jobs and the recently gone job IDs of one shard."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.tries: dict[str, int] = {}  # acked jobs -> GC attempts made
        self.gone: dict[str, int] = {}  # acked/deleted job IDs -> kept until (ms)
        core.subscribe(self, "after_job_gone")

    def after_job_gone(self, job_id: str) -> None:
        if self.tries:
            self.tries.pop(job_id, None)

    def reset(self) -> None:
        """FLUSHALL: every job is gone."""
        self.tries = {}
        self.gone = {}

    def acks(self, job_ids: list[str], now_ms: int, fast: bool) -> int:
        """ACKJOB, or FASTACK (``fast``: delete at once, best-effort DELJOB to the
        nodes that may have a copy, to every node for a job we do not know).
        Replies the number of jobs known here."""
        s = self.core
        view = s.view()  # one object for the shard's life: fetched once, not per ID
        tally = s.tally()
        known = 0
        for job_id in job_ids:
            job = s.lookup(job_id)
            if job is None:
                if not view.known:
                    continue
                if fast:
                    self.fastack_cluster(job_id, None)
                else:
                    self.ackjob_unknown(job_id, now_ms)  # dummy ACK (not counted, as Disque)
                continue
            known += 1
            tally.observe_processing(job, now_ms)
            if not fast:
                self.ack(job, now_ms)
                continue
            if job.nodes[0] is not view.me:
                self.fastack_cluster(job_id, job)
            s.unregister(job, now_ms)
        tally.count_acked(known)
        return known

    def ack(self, job: Job, now_ms: int) -> None:
        """ACKJOB of a job we hold: final at once when nobody else may have a copy,
        else acked here and the GC started."""
        s = self.core
        d = job.delivered
        v = s.view()
        if d is v.me or (d and all(n == v.node_id for n in d)):
            # Nobody else may have a copy: the ACK is final, the job goes at once.
            if job.state == QUEUED:
                s.dequeue(job, now_ms)
            s.unregister(job, now_ms)
            return
        if self.ack_cluster(job, now_ms):
            self.start_gc(job, now_ms)

    def ack_cluster(self, job: Job, now_ms: int) -> bool:
        """ACK-JOB: mark acked; returns False when the job was dropped at once
        (nobody else may have a copy)."""
        if job.state == ACKED:
            return True
        s = self.core
        if job.state == QUEUED:
            s.dequeue(job, now_ms)
        elif job.state == WAIT_REPL:
            rw = s.end_repl_wait(job.id)
            if rw is not None:
                s.wake(rw.token, Status(job.id))
        job.move(ACKED)
        job.new_requeue_time()
        s.acked(job.id)  # WAITJOB (workers/extensions.py)
        if job.delivered and not s.others(job):
            s.unregister(job, now_ms)
            return False
        me = s.view().node_id
        job.confirmed = (me,) if me in job.delivered else ()
        self.tries.pop(job.id, None)
        s.log_job(job)
        # Every acked job has a GC timer, also where another node runs the GC: if
        # that node's DELJOB is lost, our own attempt finds the copies gone.
        return self.arm_gc(job, now_ms)

    def start_gc(self, job: Job, now_ms: int) -> None:
        """START-GC, then arm the next attempt (exponential backoff, random error)."""
        s = self.core
        if not job.delivered:
            s.send("*", msg.SETACK, slot_of_job_id(job.id), msg.setack_meta(job.id, 0))
        else:
            conf = job.confirmed
            me = s.view().node_id
            todo = [n for n in job.delivered if n != me and n not in conf]
            if not todo:
                # Every other holder already confirmed (a dummy ACK that learnt its
                # holders later, ourselves among them or not): the GC is complete.
                s.send_job(s.others(job), msg.DELJOB, job)
                s.unregister(job, now_ms)
                self.remember_gone(job.id, now_ms)
                return
            s.send_job(todo, msg.SETACK, job, setack_meta(job))
        self.arm_gc(job, now_ms)

    def arm_gc(self, job: Job, now_ms: int) -> bool:
        """Next GC attempt: exponential backoff with random error; False when the
        attempts are used up and the job was dropped."""
        s = self.core
        tries = self.tries.get(job.id, 0)
        if tries >= gc_attempts_max:
            s.unregister(job, now_ms)  # reclaim memory (spec: GC "after some time")
            return False
        self.tries[job.id] = tries + 1
        delay = min(gc_first_ms << min(tries, 16), gc_backoff_max_ms)
        job.qtime_ms = now_ms + delay + int(s.random().random() * delay / 2)
        s.reschedule(job)
        return True

    def _dummy_ack(self, job_id: str, now_ms: int) -> None:
        """ACKJOB of a job we do not know: keep the ACK (empty ``acked`` job) so it
        survives a partition; its TTL comes from the ID."""
        s = self.core
        ttl_s = max(int(job_id[36:40], 16) * 60, 60)
        job = Job(job_id, b"", b"", ACKED, 0, ttl_s, times_1000(now_ms), 0, 1, 0, ())
        s.register(job)
        self.start_gc(job, now_ms)

    def ackjob_unknown(self, job_id: str, now_ms: int) -> None:
        s = self.core
        if s.view().known and not s.view().leaving and not is_at_most_once_id(job_id):
            self._dummy_ack(job_id, now_ms)

    def on_setack(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                  now_ms: int) -> None:
        s = self.core
        jid = meta["j"]
        may_have = int(meta["m"])
        job = s.job_of(meta)
        slot = slot_of_job_id(jid)
        if job is not None and not self.ack_cluster(job, now_ms):
            # We knew it and dropped it at once (GC attempts used up): known.
            s.send(sender, msg.GOTACK, slot, msg.gotack_meta(jid, True))
            return
        if job is None:
            s.send(sender, msg.GOTACK, slot, msg.gotack_meta(jid, False))
            if type(jid) is str and len(jid) == 40:
                self.remember_gone(jid, now_ms)  # acked elsewhere before its copy came
            return
        nodes = meta.get("d")
        if may_have == 0:
            s.send(sender, msg.GOTACK, slot, msg.gotack_meta(jid, True))
            self.start_gc(job, now_ms)
        elif nodes is None:  # a count only (spec): compare counts
            if len(job.delivered) <= may_have:
                s.send(sender, msg.GOTACK, slot, msg.gotack_meta(jid, True))
            else:
                self.start_gc(job, now_ms)  # we know more holders: we run the GC
        elif all(n in nodes for n in job.delivered):
            s.send(sender, msg.GOTACK, slot, msg.gotack_meta(jid, True))
        else:
            # We know a node the sender does not: we run the GC over both lists (the
            # sender has the job acked, so it counts as confirmed).
            merge_nodes(job, nodes)
            job.confirmed = union(job.confirmed, (sender,))
            self.start_gc(job, now_ms)

    def on_gotack(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                  now_ms: int) -> None:
        job = self.core.job_of(meta)
        if job is None:
            return
        s = self.core
        known = bool(meta["k"])
        if not self.ack_cluster(job, now_ms):
            return
        if not job.delivered:  # a dummy ACK
            if known:
                s.unregister(job, now_ms)  # a node that knows the job runs the GC
                return
            job.confirmed = union(job.confirmed, (sender,))
            if all(n in job.confirmed for n in s.view().known):
                s.unregister(job, now_ms)  # nobody knows the job (a wrong ID)
            return
        if known or sender in job.delivered:
            job.delivered = union(job.delivered, (sender,))
            job.confirmed = union(job.confirmed, (sender,))
            me, conf = s.view().node_id, job.confirmed
            if all(n in conf or n == me for n in job.delivered):  # we hold it acked
                s.send_job(s.others(job), msg.DELJOB, job)
                s.unregister(job, now_ms)
                self.remember_gone(job.id, now_ms)

    def on_deljob(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                  now_ms: int) -> None:
        s = self.core
        job = s.job_of(meta)
        if job is not None and job.state == WAIT_REPL:
            return  # our own pending ADDJOB: its timer decides
        jid = meta["j"]
        if type(jid) is str and len(jid) == 40:
            self.remember_gone(jid, now_ms)
        if job is not None:
            s.unregister(job, now_ms)

    def remember_gone(self, job_id: str, now_ms: int) -> None:
        gone = self.gone
        gone.pop(job_id, None)  # keep insertion order = time order
        while gone:
            first = next(iter(gone))
            if gone[first] > now_ms and len(gone) < gone_ids_max:
                break
            del gone[first]
        gone[job_id] = now_ms + gone_ids_keep_ms

    def is_gone(self, job_id: str, now_ms: int) -> bool:
        until = self.gone.get(job_id)
        return until is not None and until > now_ms

    def fastack_cluster(self, job_id: str, job: Job | None) -> None:
        s = self.core
        if job is None:
            if s.view().known:
                s.send("*", msg.DELJOB, slot_of_job_id(job_id), msg.job_meta(job_id))
            return
        s.send_job(s.others(job), msg.DELJOB, job)


def setack_meta(job: Job) -> dict[str, Any]:
    """SETACK's meta: the count the spec asks for, and the nodes themselves, so that
    a receiver that knows a node we do not runs the GC itself (equal counts of
    different node lists would otherwise confirm a GC that misses a copy)."""
    return msg.setack_meta(job.id, len(job.delivered), job.delivered)
