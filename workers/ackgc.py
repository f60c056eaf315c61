"""Acknowledgement garbage collection (spec "ACKs and garbage collection"): an
acknowledged job is kept until every node that may hold a copy confirmed the
ACK (SETACK / GOTACK), then deleted everywhere (DELJOB); an ACK of a job this
node does not know is kept as a dummy ACK so it survives a partition.

``AckGc`` is an object the shard owns (``Shard.gc``) and calls: it keeps the
GC attempts of acked jobs and the IDs of jobs known gone cluster-wide, and
reaches the jobs through the shard, typed by the ``GcCore`` protocol (this
module imports neither workers/shard.py nor workers/replication.py). Marking a
job acked (``_ack_cluster``) stays with replication: it is on the ACKJOB path.
The GC of an acked job shares the job's one timer entry (its ``qtime_ms`` is
the next attempt).
"""

from __future__ import annotations

import random
from typing import Any, Protocol

from workers.ids import is_at_most_once_id, slot_of_job_id
from workers.job import ACKED, US_PER_MS, WAIT_REPL, Job, merge_nodes, union

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


class GcCore(Protocol):
    """What the ack GC uses of the shard (``workers.shard.Shard`` is one)."""

    node_id: str
    _known: tuple[str, ...]
    _leaving: bool
    _rng: random.Random

    def _register(self, job: Job) -> None: ...
    def _unregister(self, job: Job, now_ms: int) -> None: ...
    def _job_of(self, meta: dict[str, Any]) -> Job | None: ...
    def _ack_cluster(self, job: Job, now_ms: int) -> bool: ...
    def _reschedule(self, job: Job) -> None: ...
    def _others(self, job: Job) -> list[str]: ...
    def _setack_meta(self, job: Job) -> dict[str, Any]: ...
    def _send(self, node: str, kind: str, slot: int, meta: dict[str, Any],
              bodies: list[bytes] | None = None) -> None: ...
    def _send_job(self, nodes: list[str] | tuple[str, ...], kind: str, job: Job,
                  meta: dict[str, Any] | None = None) -> None: ...


class AckGc:
    """GC attempts of acked jobs and the recently gone job IDs of one shard."""

    def __init__(self, shard: GcCore) -> None:
        self.shard = shard
        self.tries: dict[str, int] = {}  # acked jobs -> GC attempts made
        self.gone: dict[str, int] = {}  # acked/deleted job IDs -> kept until (ms)

    def reset(self) -> None:
        """FLUSHALL: every job is gone."""
        self.tries = {}
        self.gone = {}

    def start_gc(self, job: Job, now_ms: int) -> None:
        """START-GC, then arm the next attempt (exponential backoff, random error)."""
        s = self.shard
        if not job.delivered:
            s._send("*", "SETACK", slot_of_job_id(job.id), {"j": job.id, "m": 0})
        else:
            conf = job.confirmed
            todo = [n for n in job.delivered if n != s.node_id and n not in conf]
            if not todo:
                # Every other holder already confirmed (a dummy ACK that learnt its
                # holders later, ourselves among them or not): the GC is complete.
                s._send_job(s._others(job), "DELJOB", job)
                s._unregister(job, now_ms)
                self.remember_gone(job.id, now_ms)
                return
            s._send_job(todo, "SETACK", job, s._setack_meta(job))
        self.arm_gc(job, now_ms)

    def arm_gc(self, job: Job, now_ms: int) -> bool:
        """Next GC attempt: exponential backoff with random error; False when the
        attempts are used up and the job was dropped."""
        s = self.shard
        tries = self.tries.get(job.id, 0)
        if tries >= gc_attempts_max:
            s._unregister(job, now_ms)  # reclaim memory (spec: GC "after some time")
            return False
        self.tries[job.id] = tries + 1
        delay = min(gc_first_ms << min(tries, 16), gc_backoff_max_ms)
        job.qtime_ms = now_ms + delay + int(s._rng.random() * delay / 2)
        s._reschedule(job)
        return True

    def _dummy_ack(self, job_id: str, now_ms: int) -> None:
        """ACKJOB of a job we do not know: keep the ACK (empty ``acked`` job) so it
        survives a partition; its TTL comes from the ID."""
        s = self.shard
        ttl_s = max(int(job_id[36:40], 16) * 60, 60)
        job = Job(job_id, b"", b"", ACKED, 0, ttl_s, now_ms * US_PER_MS, 0, 1, 0, ())
        s._register(job)
        self.start_gc(job, now_ms)

    def ackjob_unknown(self, job_id: str, now_ms: int) -> None:
        s = self.shard
        if s._known and not s._leaving and not is_at_most_once_id(job_id):
            self._dummy_ack(job_id, now_ms)

    def on_setack(self, sender: str, meta: dict[str, Any], now_ms: int) -> None:
        s = self.shard
        jid = meta["j"]
        may_have = int(meta["m"])
        job = s._job_of(meta)
        slot = slot_of_job_id(jid)
        if job is not None and not s._ack_cluster(job, now_ms):
            # We knew it and dropped it at once (GC attempts used up): known.
            s._send(sender, "GOTACK", slot, {"j": jid, "k": 1})
            return
        if job is None:
            s._send(sender, "GOTACK", slot, {"j": jid, "k": 0})
            if type(jid) is str and len(jid) == 40:
                self.remember_gone(jid, now_ms)  # acked elsewhere before its copy came
            return
        nodes = meta.get("d")
        if may_have == 0:
            s._send(sender, "GOTACK", slot, {"j": jid, "k": 1})
            self.start_gc(job, now_ms)
        elif nodes is None:  # a count only (spec): compare counts
            if len(job.delivered) <= may_have:
                s._send(sender, "GOTACK", slot, {"j": jid, "k": 1})
            else:
                self.start_gc(job, now_ms)  # we know more holders: we run the GC
        elif all(n in nodes for n in job.delivered):
            s._send(sender, "GOTACK", slot, {"j": jid, "k": 1})
        else:
            # We know a node the sender does not: we run the GC over both lists (the
            # sender has the job acked, so it counts as confirmed).
            merge_nodes(job, nodes)
            job.confirmed = union(job.confirmed, (sender,))
            self.start_gc(job, now_ms)

    def on_gotack(self, sender: str, meta: dict[str, Any], now_ms: int) -> None:
        s = self.shard
        job = s._job_of(meta)
        if job is None:
            return
        known = bool(meta["k"])
        if not s._ack_cluster(job, now_ms):
            return
        if not job.delivered:  # a dummy ACK
            if known:
                s._unregister(job, now_ms)  # a node that knows the job runs the GC
                return
            job.confirmed = union(job.confirmed, (sender,))
            if all(n in job.confirmed for n in s._known):
                s._unregister(job, now_ms)  # nobody knows the job (a wrong ID)
            return
        if known or sender in job.delivered:
            job.delivered = union(job.delivered, (sender,))
            job.confirmed = union(job.confirmed, (sender,))
            me, conf = s.node_id, job.confirmed
            if all(n in conf or n == me for n in job.delivered):  # we hold it acked
                s._send_job(s._others(job), "DELJOB", job)
                s._unregister(job, now_ms)
                self.remember_gone(job.id, now_ms)

    def on_deljob(self, meta: dict[str, Any], now_ms: int) -> None:
        s = self.shard
        job = s._job_of(meta)
        if job is not None and job.state == WAIT_REPL:
            return  # our own pending ADDJOB: its timer decides
        jid = meta["j"]
        if type(jid) is str and len(jid) == 40:
            self.remember_gone(jid, now_ms)
        if job is not None:
            s._unregister(job, now_ms)

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
        s = self.shard
        if job is None:
            if s._known:
                s._send("*", "DELJOB", slot_of_job_id(job_id), {"j": job_id})
            return
        s._send_job(s._others(job), "DELJOB", job)
