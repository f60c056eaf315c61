"""Random command sequences keep the shard consistent (hypothesis state machine).

After every step: ``Shard.check()`` (every queued job sits once in its queue,
every live queue entry is a queued job, counts, timers, waiters), plus a model
of which jobs must exist (created, not yet acked/deleted, TTL not passed) and
of the replies' counts.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from workers import shard as shard_mod
from workers.effects import Wake
from workers.job import ACTIVE, QUEUED, JobExt
from workers.replies import Error, Status
from workers.shard import Shard
from workers.timers import timer_resolution_ms

NODE = "739317b21b9046a3454204425426c55a12ccc07a"
T0 = 1_795_301_808_328
QUEUES = [b"a", b"b", b"c"]
RES = timer_resolution_ms
# No shrinking in CI: a failure prints its steps; shrinking them can take minutes.
PHASES = [Phase.explicit, Phase.reuse, Phase.generate]


class ShardMachine(RuleBasedStateMachine):
    @initialize(seed=st.integers(0, 2**32))
    def setup(self, seed: int) -> None:
        self.now = T0
        self.s = Shard(NODE, 0, 1, b"seed", random.Random(seed), T0, queue_idle_ms=5_000)
        self.etime: dict[str, int] = {}  # model: job -> expire time, while it must exist
        self.all_ids: list[str] = ["D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"]
        self.blocked: set[int] = set()
        self.next_token = 1

    def _ids(self, data: Any) -> list[str]:
        return data.draw(st.lists(st.sampled_from(self.all_ids), min_size=1, max_size=3))

    def _handle_effects(self, requeued: bool = False) -> None:
        # requeued: a repeated ID in ENQUEUE/NACK may requeue a job a waiter just got
        states = (ACTIVE, QUEUED) if requeued else (ACTIVE,)
        for eff in self.s.take_effects():
            assert isinstance(eff, Wake)
            assert eff.token in self.blocked
            self.blocked.discard(eff.token)
            assert eff.reply, "a waiter is only woken with jobs"
            for entry in eff.reply:
                job = self.s.lookup(entry[1])
                assert job is not None and job.state in states

    @rule(queue=st.sampled_from(QUEUES), ttl=st.sampled_from([2, 30, 3600]),
          retry=st.sampled_from([None, 0, 1, 5]), delay=st.sampled_from([0, 0, 1]),
          maxlen=st.sampled_from([0, 0, 3]), priority=st.sampled_from([0, 0, 0, 4, 9]))
    def add(self, queue: bytes, ttl: int, retry: int | None, delay: int, maxlen: int,
            priority: int) -> None:
        before = self.s.op_qlen(queue)
        r = self.s.op_addjob(queue, b"body", timeout_ms=0, replicate=1 if retry == 0 else None,
                             delay_s=delay, retry_s=retry, ttl_s=ttl, maxlen=maxlen,
                             async_=False, token=0, now_ms=self.now,
                             ext=JobExt(priority=priority) if priority else None)
        if isinstance(r, Error):
            assert r in (shard_mod.ERR_MAXLEN_REACHED, shard_mod.ERR_PAUSED,
                         shard_mod.ERR_DELAY_TTL)
            if r == shard_mod.ERR_MAXLEN_REACHED:
                assert before >= maxlen
            return
        assert isinstance(r, Status)
        self.all_ids.append(str(r))
        self.etime[str(r)] = self.now + ttl * 1000
        self._handle_effects()

    @rule(queues=st.lists(st.sampled_from(QUEUES), min_size=1, max_size=3, unique=True),
          count=st.integers(1, 4), surplus=st.integers(0, 2))
    def take(self, queues: list[bytes], count: int, surplus: int) -> None:
        got = self.s.op_take(queues, count, True, self.now)
        assert len(got) <= count
        for entry in got:
            assert entry[0] in queues
            job = self.s.lookup(entry[1])
            assert job is not None and job.state == ACTIVE
            q = self.s.core.find_queue(entry[0])  # none left of a higher priority
            assert q is None or job.priority >= max((j.priority for j in q), default=0)
        if surplus and got:
            # a multi-owner GETJOB hands back what it did not send, right away
            back = [e[1] for e in got[-surplus:]]
            self.s.op_return(back, self.now)
            for jid in back:
                job = self.s.lookup(jid)
                assert job is not None and job.state in (QUEUED, ACTIVE)  # ACTIVE: a waiter got it
            self._handle_effects()

    @rule(queues=st.lists(st.sampled_from(QUEUES), min_size=1, max_size=2, unique=True))
    def block(self, queues: list[bytes]) -> None:
        token = self.next_token
        self.next_token += 1
        self.blocked.add(token)
        self.s.op_block(token, queues, 2, False, self.now)
        self._handle_effects()

    @rule()
    def unblock(self) -> None:
        if self.blocked:
            token = min(self.blocked)
            self.blocked.discard(token)
            self.s.op_unblock(token, self.now)

    @rule(data=st.data(), op=st.sampled_from(["ack", "fastack", "deljob"]))
    def remove(self, data: Any, op: str) -> None:
        ids = self._ids(data)
        known = {j for j in ids if self.s.lookup(j) is not None}
        n = getattr(self.s, "op_ackjob" if op == "ack" else f"op_{op}")(ids, self.now)
        assert n == len(known)  # a repeated ID counts once: it is gone after the first
        for j in known:
            assert self.s.lookup(j) is None
            self.etime.pop(j, None)

    @rule(data=st.data(), nack=st.booleans())
    def requeue(self, data: Any, nack: bool) -> None:
        ids = self._ids(data)
        eligible = {j for j in ids if (job := self.s.lookup(j)) is not None
                    and job.state == ACTIVE and job.qtime_ms}
        waiting = bool(self.blocked)
        n = self.s.op_nack(ids, self.now) if nack else self.s.op_enqueue(ids, self.now)
        if waiting:  # a waiter may take a job at once, and a repeated ID requeue it again
            assert len(eligible) <= n <= len(ids)
        else:
            assert n == len(eligible)
            for j in eligible:
                assert self.s.lookup(j).state == QUEUED  # type: ignore[union-attr]
        self._handle_effects(requeued=True)

    @rule(data=st.data())
    def dequeue(self, data: Any) -> None:
        ids = self._ids(data)
        queued = {j for j in ids if (job := self.s.lookup(j)) is not None and job.state == QUEUED}
        assert self.s.op_dequeue(ids, self.now) == len(queued)

    @rule(data=st.data())
    def working(self, data: Any) -> None:
        (jid,) = data.draw(st.lists(st.sampled_from(self.all_ids), min_size=1, max_size=1))
        r = self.s.op_working(jid, self.now)
        if self.s.lookup(jid) is None:
            assert isinstance(r, Error)
        else:
            assert isinstance(r, int) or r == shard_mod.ERR_TOOLATE

    @rule(queue=st.sampled_from(QUEUES), opt=st.sampled_from(["in", "out", "none", "all"]))
    def pause(self, queue: bytes, opt: str) -> None:
        assert self.s.op_pause(queue, [opt], self.now) == opt
        self._handle_effects()

    @rule(ms=st.sampled_from([1, 10, 500, 1_000, 3_000, 6_000, 40_000]))
    def advance(self, ms: int) -> None:
        self.now += ms
        nxt = self.s.tick(self.now)
        while nxt is not None and nxt <= self.now:
            nxt = self.s.tick(self.now)
        assert nxt is None or nxt > self.now
        self._handle_effects()
        for jid, et in list(self.etime.items()):
            if self.now < et:
                assert self.s.lookup(jid) is not None, f"{jid} vanished before its TTL"
            elif self.now >= et + RES:
                assert self.s.lookup(jid) is None, f"{jid} outlived its TTL"
                del self.etime[jid]

    @rule()
    def flushall(self) -> None:
        if self.s.info()["registered_jobs"] > 20:
            self.s.op_flushall()
            self.etime.clear()

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "s"):
            return
        self.s.check()
        info = self.s.info()
        jobs = self.s.jobs()
        assert info["registered_jobs"] == len(jobs)
        queued = sum(1 for j in jobs if j.state == QUEUED)
        assert queued == sum(self.s.op_qlen(q) for q in self.s.core.queues)
        assert info["blocked_clients"] == len(self.blocked)
        for jid, et in self.etime.items():
            if et > self.now:
                assert self.s.lookup(jid) is not None


ShardMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=60, deadline=None, phases=PHASES,
    suppress_health_check=[HealthCheck.too_slow], derandomize=True,
)
TestShardMachine = ShardMachine.TestCase
