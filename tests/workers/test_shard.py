"""The shard in memory with a fake clock: every op and every timer."""

from __future__ import annotations

import random
from typing import Any

import pytest

from workers import core as core_mod
from workers import lifecycle as lifecycle_mod
from workers import shard as shard_mod
from workers.effects import Wake
from workers.job import ACKED, ACTIVE, QUEUED
from workers.replies import ERR_NOJOB, ERR_NOREPL, ERR_PAUSED, NULL_ARRAY, Error, Status
from workers.shard import Shard
from workers.timers import resolution_for, timer_resolution_ms

NODE = "739317b21b9046a3454204425426c55a12ccc07a"
T0 = 1_795_301_808_328
IDLE_MS = core_mod.queue_idle_evict_ms
RES = timer_resolution_ms
IDLE_RES = resolution_for(IDLE_MS)  # an idle queue's check is rounded as far as it is set


class Env:
    """A shard plus a fake clock; helpers keep tests short and check invariants."""

    def __init__(self, now: int = T0) -> None:
        self.now = now
        self.s = Shard(NODE, 0, 1, b"seed", random.Random(7), now)

    def add(self, queue: bytes = b"q", body: bytes = b"x", **kw: Any) -> Any:
        args: dict[str, Any] = dict(timeout_ms=0, replicate=None, delay_s=0, retry_s=None,
                                    ttl_s=86400, maxlen=0, async_=False, token=0)
        args.update(kw)
        r = self.s.op_addjob(queue, body, now_ms=self.now, **args)
        self.s.check()
        return r

    def take(self, *queues: bytes, count: int = 1, wc: bool = False) -> list[list[Any]]:
        r = self.s.op_take(list(queues or [b"q"]), count, wc, self.now)
        self.s.check()
        return r

    def advance(self, ms: int) -> int | None:
        """Move the clock and run every timer due by then (ticks until idle)."""
        self.now += ms
        nxt = self.s.tick(self.now)
        while nxt is not None and nxt <= self.now:
            nxt = self.s.tick(self.now)
        self.s.check()
        return nxt

    def state(self, job_id: str) -> int | None:
        j = self.s.lookup(job_id)
        return None if j is None else j.state

    def show(self, job_id: str) -> dict[bytes, Any]:
        """SHOW of a job without extension fields: the reference's 15 pairs."""
        r = self.s.op_show(job_id, self.now)
        assert isinstance(r, list) and len(r) == 30
        return self.show_all(job_id)

    def show_all(self, job_id: str) -> dict[bytes, Any]:
        """SHOW as a dict, the extensions' fields (maxdeliver, group, ...) included."""
        r = self.s.op_show(job_id, self.now)
        return dict(zip(r[::2], r[1::2], strict=True))


@pytest.fixture
def env() -> Env:
    return Env()


def test_addjob_queues_and_replies_status(env: Env) -> None:
    jid = env.add(b"q", b"hello")
    assert isinstance(jid, Status) and len(jid) == 40 and jid.endswith("-05a1")
    assert env.s.op_qlen(b"q") == 1
    assert env.state(jid) == QUEUED
    assert env.s.info() == {"registered_jobs": 1, "registered_queues": 1, "blocked_clients": 0,
                          "queued_jobs": 1, "wait_repl_jobs": 0}


def test_job_id_ttl_field_parity(env: Env) -> None:
    assert env.add(retry_s=0, replicate=1).endswith("-05a0")
    assert env.add(ttl_s=100, delay_s=1).endswith("-0001")
    assert env.add(ttl_s=3600, retry_s=30).endswith("-003d")


def test_job_id_carries_queue_slot(env: Env) -> None:
    from workers.ids import slot_of, slot_of_job_id

    for name in (b"a", b"queue-2", b"\xff\x00"):
        assert slot_of_job_id(env.add(name)) == slot_of(name)


def test_addjob_defaults(env: Env) -> None:
    sh = env.show(env.add())
    assert (sh[b"ttl"], sh[b"retry"], sh[b"repl"], sh[b"delay"]) == (86400, 300, 1, 0)
    assert env.show(env.add(ttl_s=100))[b"retry"] == 10
    assert env.show(env.add(ttl_s=5))[b"retry"] == 1
    assert env.show(env.add(ttl_s=4000))[b"retry"] == 300  # TTL/10 = 400, capped


def test_addjob_errors_in_disque_order(env: Env) -> None:
    assert env.add(retry_s=0, replicate=2) == shard_mod.ERR_RETRY0
    assert env.add(delay_s=200, ttl_s=100) == shard_mod.ERR_DELAY_TTL
    assert env.add(delay_s=100, ttl_s=100) == shard_mod.ERR_DELAY_TTL
    assert env.add(replicate=5) is ERR_NOREPL
    assert env.add(replicate=2) is ERR_NOREPL
    assert env.s.info()["registered_queues"] == 0  # refused ADDJOBs create nothing


def test_addjob_maxlen(env: Env) -> None:
    env.add(maxlen=2)
    env.add(maxlen=2)
    assert env.add(maxlen=2) == shard_mod.ERR_MAXLEN_REACHED
    assert env.s.op_qlen(b"q") == 2
    assert isinstance(env.add(maxlen=3), Status)


def test_ctime_increases_within_one_ms(env: Env) -> None:
    ids = [env.add() for _ in range(5)]
    ctimes = [env.show(i)[b"ctime"] for i in ids]
    assert ctimes == sorted(ctimes) and len(set(ctimes)) == 5
    assert ctimes[0] == T0 * 1_000_000


def test_take_fifo_and_counters(env: Env) -> None:
    a, b = env.add(body=b"1"), env.add(body=b"2")
    assert env.take() == [[b"q", a, b"1"]]
    assert env.take(wc=True) == [[b"q", b, b"2", b"nacks", 0, b"additional-deliveries", 0]]
    assert env.take() == []
    assert env.state(a) == ACTIVE
    st = dict(zip(*[iter(env.s.op_qstat(b"q", env.now))] * 2, strict=True))
    assert (st[b"jobs-in"], st[b"jobs-out"], st[b"len"]) == (2, 2, 0)


def test_take_round_robin_left_to_right(env: Env) -> None:
    for i in range(3):
        env.add(b"a", b"a%d" % i)
        env.add(b"b", b"b%d" % i)
    got = env.take(b"a", b"b", count=5)
    assert [e[2] for e in got] == [b"a0", b"b0", b"a1", b"b1", b"a2"]
    assert env.take(b"nosuch", b"b", count=10)[0][2] == b"b2"


def test_take_creates_queues_like_the_reference(env: Env) -> None:
    assert env.take(b"nosuch") == []
    assert b"nosuch" in env.s.core.queues
    assert env.s.op_qstat(b"nosuch", env.now)[:4] == [b"name", b"nosuch", b"len", 0]


def test_block_then_addjob_wakes_oldest_waiter(env: Env) -> None:
    env.s.op_block(1, [b"q", b"r"], 2, False, env.now)
    env.s.op_block(2, [b"q"], 1, False, env.now)
    assert env.s.info()["blocked_clients"] == 2
    assert env.s.take_effects() == []
    jid = env.add(b"q", b"x")
    eff = env.s.take_effects()
    assert eff == [Wake(1, [[b"q", jid, b"x"]])]
    # waiter 1 left every queue it waited on; waiter 2 still waits
    assert env.s.info()["blocked_clients"] == 1
    env.add(b"r")
    assert env.s.take_effects() == []
    jid2 = env.add(b"q", b"y")
    assert env.s.take_effects() == [Wake(2, [[b"q", jid2, b"y"]])]
    env.s.check()


def test_block_serves_count_jobs_and_withcounters(env: Env) -> None:
    env.s.op_block(5, [b"q"], 3, True, env.now)
    jid = env.add()
    (w,) = env.s.take_effects()
    assert w.token == 5 and w.reply == [[b"q", jid, b"x", b"nacks", 0, b"additional-deliveries", 0]]


def test_block_answers_at_once_when_jobs_exist(env: Env) -> None:
    jid = env.add()
    env.s.op_block(9, [b"q"], 1, False, env.now)
    assert env.s.take_effects() == [Wake(9, [[b"q", jid, b"x"]])]
    assert env.s.info()["blocked_clients"] == 0


def test_unblock_removes_waiter(env: Env) -> None:
    env.s.op_block(3, [b"q"], 1, False, env.now)
    env.s.op_unblock(3, env.now)
    env.s.op_unblock(3, env.now)  # twice is harmless
    env.add()
    assert env.s.take_effects() == []
    assert env.s.op_qlen(b"q") == 1
    env.s.check()


def test_return_requeues_without_counting(env: Env) -> None:
    a = env.add(body=b"1")
    b = env.add(body=b"2")
    got = env.take(count=2)
    env.s.op_return([e[1] for e in got], env.now)
    env.s.check()
    assert env.state(a) == QUEUED and env.state(b) == QUEUED
    assert [e[1] for e in env.take(count=2, wc=True)] == [a, b]
    st = env.s.op_qstat(b"q", env.now)
    assert st[st.index(b"jobs-out") + 1] == 2
    assert env.s.lookup(a).additional_deliveries == 0  # type: ignore[union-attr]


def test_return_undoes_the_takes_count_in_metrics(env: Env) -> None:
    """A scatter's surplus given back was never delivered: /metrics' delivered total
    and the wait histogram are as if it had not been taken; a job's later delivery
    counts once."""
    a = env.add(body=b"1")
    b = env.add(body=b"2")
    before = env.s.metrics(0, env.now)
    got = env.take(count=2)
    assert env.s.metrics(0, env.now)["delivered"] == before["delivered"] + 2
    env.s.op_return([got[1][1]], env.now)
    m = env.s.metrics(0, env.now)
    assert m["delivered"] == before["delivered"] + 1
    assert sum(m["wait_counts"]) == sum(before["wait_counts"]) + 1
    assert m["active"] == 1
    assert [e[1] for e in env.take(count=1)] == [b]
    m = env.s.metrics(0, env.now)
    assert m["delivered"] == before["delivered"] + 2 and sum(m["wait_counts"]) == 2
    assert env.s.lookup(a) is not None


def test_return_serves_waiter(env: Env) -> None:
    a = env.add()
    env.take()
    env.s.op_block(4, [b"q"], 1, False, env.now)
    env.s.op_return([a], env.now)
    assert env.s.take_effects() == [Wake(4, [[b"q", a, b"x"]])]


def test_ackjob_counts_known(env: Env) -> None:
    a = env.add()
    unknown = "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"
    assert env.s.op_ackjob([a, unknown], env.now) == 1
    assert env.s.lookup(a) is None
    assert env.s.op_ackjob([a], env.now) == 0
    assert env.s.op_qlen(b"q") == 0
    assert env.s.info()["registered_jobs"] == 0
    env.s.check()


def test_ack_of_active_job(env: Env) -> None:
    a = env.add()
    env.take()
    assert env.s.op_ackjob([a], env.now) == 1
    assert env.s.info()["registered_jobs"] == 0
    env.advance(400_000)  # its requeue timer must not resurrect it
    assert env.s.op_qlen(b"q") == 0


def test_fastack_and_deljob(env: Env) -> None:
    a, b = env.add(), env.add()
    assert env.s.op_fastack([a, a], env.now) == 1
    env.take()
    assert env.s.op_deljob([b], env.now) == 1
    assert env.s.op_deljob([b], env.now) == 0
    assert env.s.info()["registered_jobs"] == 0


def test_nack_requeues_asap_with_counter(env: Env) -> None:
    a = env.add(retry_s=30, ttl_s=3600)
    env.take()
    env.now += 5000
    assert env.s.op_nack([a], env.now) == 1
    assert env.s.op_nack([a], env.now) == 0  # already queued
    sh = env.show(a)
    assert sh[b"state"] == "queued" and sh[b"nacks"] == 1 and sh[b"additional-deliveries"] == 0
    assert 30_000 <= sh[b"next-requeue-within"] < 30_000 + core_mod.time_error_ms
    assert sh[b"next-awake-within"] == sh[b"next-requeue-within"] - 500


def test_enqueue_dequeue_like_reference(env: Env) -> None:
    a = env.add()
    env.take()
    assert env.s.op_dequeue([a], env.now) == 0
    assert env.s.op_enqueue([a], env.now) == 1
    assert env.s.op_enqueue([a], env.now) == 0
    assert env.s.op_qlen(b"q") == 1
    assert env.show(a)[b"additional-deliveries"] == 1
    assert env.s.op_dequeue([a], env.now) == 1
    assert env.s.op_qlen(b"q") == 0
    assert env.state(a) == ACTIVE
    env.s.check()


def test_enqueue_of_never_delivered_job_counts_nothing(env: Env) -> None:
    a = env.add()
    env.s.op_dequeue([a], env.now)
    assert env.s.op_enqueue([a], env.now) == 1
    assert env.show(a)[b"additional-deliveries"] == 0


def test_at_most_once_job_never_queued_again(env: Env) -> None:
    a = env.add(retry_s=0, replicate=1)
    env.take()
    assert env.s.op_nack([a], env.now) == 0
    assert env.s.op_enqueue([a], env.now) == 0
    env.advance(3_600_000)
    assert env.state(a) == ACTIVE and env.s.op_qlen(b"q") == 0
    assert env.s.op_working(a, env.now) == 0


def test_working_postpones_and_refuses_late(env: Env) -> None:
    a = env.add(retry_s=30, ttl_s=100)
    env.take()
    env.now += 20_000
    assert env.s.op_working(a, env.now) == 30
    assert env.show(a)[b"next-requeue-within"] >= 30_000
    env.advance(29_000)  # 49 s after creation: the job is still active
    assert env.state(a) == ACTIVE
    env.now += 2_000  # 51 s: more than half the TTL
    assert env.s.op_working(a, env.now) == shard_mod.ERR_TOOLATE
    assert shard_mod.ERR_TOOLATE.startswith("TOOLATE ")


def test_working_dequeues_queued_job(env: Env) -> None:
    a = env.add()
    assert env.s.op_working(a, env.now) == 300
    assert env.state(a) == ACTIVE and env.s.op_qlen(b"q") == 0


def test_working_unknown(env: Env) -> None:
    assert env.s.op_working("D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1", env.now) is ERR_NOJOB


def test_show_fields_and_order(env: Env) -> None:
    a = env.add(b"q2", b"hello", retry_s=30, ttl_s=3600)
    r = env.s.op_show(a, env.now)
    assert r[::2] == [b"id", b"queue", b"state", b"repl", b"ttl", b"ctime", b"delay", b"retry",
                      b"nacks", b"additional-deliveries", b"nodes-delivered", b"nodes-confirmed",
                      b"next-requeue-within", b"next-awake-within", b"body"]
    sh = env.show(a)
    assert sh[b"nodes-delivered"] == [NODE] and sh[b"nodes-confirmed"] == []
    assert sh[b"ttl"] == 3600 and sh[b"body"] == b"hello" and sh[b"queue"] == b"q2"
    env.now += 1500
    assert env.show(a)[b"ttl"] == 3599  # remaining TTL, rounded up
    assert env.s.op_show("D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1", env.now) is None


# ------------------------------------------------------------------ timers


def test_delay_makes_job_deliverable_when_due(env: Env) -> None:
    a = env.add(delay_s=1, ttl_s=100)
    assert env.s.op_qlen(b"q") == 0 and env.state(a) == ACTIVE
    env.advance(999)
    assert env.s.op_qlen(b"q") == 0
    env.advance(RES)
    assert env.s.op_qlen(b"q") == 1
    assert env.show(a)[b"additional-deliveries"] == 0


def test_retry_requeues_delivered_job(env: Env) -> None:
    a = env.add(retry_s=10, ttl_s=3600)
    env.take()
    env.advance(9_000)
    assert env.state(a) == ACTIVE
    env.advance(1_000 + core_mod.time_error_ms + RES)
    assert env.state(a) == QUEUED
    assert env.show(a)[b"additional-deliveries"] == 1
    env.take()
    env.advance(10_600)
    assert env.show(a)[b"additional-deliveries"] == 2


def test_retry_counts_from_queue_time(env: Env) -> None:
    """RETRY elapses since the job was last queued, not since it was delivered."""
    a = env.add(retry_s=10, ttl_s=3600)
    env.now += 8_000
    env.take()
    env.advance(2_600)
    assert env.state(a) == QUEUED


def test_requeued_job_takes_its_ctime_place(env: Env) -> None:
    a = env.add(body=b"old", retry_s=5, ttl_s=3600)
    env.take()
    env.now += 1
    b = env.add(body=b"new1")
    env.now += 1
    env.add(body=b"new2")
    env.advance(5_600)
    assert env.state(a) == QUEUED
    assert [e[1] for e in env.s.op_qpeek(b"q", 3)][:2] == [a, b]


def test_ttl_deletes_in_any_state(env: Env) -> None:
    q = env.add(ttl_s=10)
    act = env.add(b"r", ttl_s=10)
    env.take(b"r")
    d = env.add(b"d", ttl_s=10, delay_s=5)
    env.advance(9_000)
    assert env.s.info()["registered_jobs"] == 3
    env.advance(1_000 + resolution_for(10_000))  # a TTL's timer is rounded as far as it is set
    assert all(env.s.lookup(j) is None for j in (q, act, d))
    assert env.s.op_qlen(b"q") == 0
    assert env.s.info()["registered_jobs"] == 0


def test_paused_in_queue_postpones_requeue(env: Env) -> None:
    a = env.add(retry_s=5, ttl_s=3600)
    env.take()
    env.s.op_pause(b"q", ["in"], env.now)
    env.advance(6_000)
    assert env.state(a) == ACTIVE
    env.s.op_pause(b"q", ["none"], env.now)
    env.advance(6_000)
    assert env.state(a) == QUEUED


def test_idle_empty_queue_is_evicted(env: Env) -> None:
    a = env.add()
    env.take()
    env.s.op_ackjob([a], env.now)
    env.advance(IDLE_MS - 1_000)
    assert env.s.info()["registered_queues"] == 1
    env.advance(1_000 + IDLE_RES)
    assert env.s.info()["registered_queues"] == 0
    assert env.s.op_qstat(b"q", env.now) is NULL_ARRAY


def test_queue_with_waiter_or_pause_or_jobs_not_evicted(env: Env) -> None:
    env.add(b"withjob")
    env.s.op_block(1, [b"watched"], 1, False, env.now)
    env.s.op_pause(b"paused", ["out"], env.now)
    env.take(b"empty")
    env.advance(IDLE_MS * 3)
    assert sorted(env.s.core.queues) == [b"paused", b"watched", b"withjob"]
    env.s.op_unblock(1, env.now)
    env.s.op_pause(b"paused", ["none"], env.now)
    env.advance(IDLE_MS + IDLE_RES)
    assert list(env.s.core.queues) == [b"withjob"]


def test_activity_delays_eviction(env: Env) -> None:
    env.take(b"q")
    env.advance(IDLE_MS // 2)
    a = env.add()
    env.take()
    env.s.op_ackjob([a], env.now)
    env.advance(IDLE_MS // 2 + IDLE_RES)
    assert list(env.s.core.queues) == [b"q"]
    env.advance(IDLE_MS // 2 + IDLE_RES)
    assert list(env.s.core.queues) == []


def test_evicted_queue_with_active_jobs_comes_back(env: Env) -> None:
    a = env.add(retry_s=60, ttl_s=3600)
    env.take()
    env.advance(IDLE_MS + IDLE_RES)
    assert list(env.s.core.queues) == []
    env.advance(31_000)
    assert env.state(a) == QUEUED and env.s.op_qlen(b"q") == 1


def test_tick_returns_next_deadline_and_caps_work(env: Env, monkeypatch: Any) -> None:
    assert env.s.tick(env.now) is None
    env.add(ttl_s=10)
    nxt = env.s.tick(env.now)
    assert nxt is not None and env.now + 10_000 <= nxt <= env.now + 10_000 + resolution_for(10_000)
    monkeypatch.setattr(lifecycle_mod, "timer_work_per_tick_max", 3)
    for _ in range(7):
        env.add(ttl_s=10)
    later = env.now + 20_000
    assert env.s.tick(later) == later  # capped: more work is due right away
    assert env.s.info()["registered_jobs"] == 5
    env.s.tick(later)
    env.s.tick(later)
    assert env.s.info()["registered_jobs"] == 0


# ------------------------------------------------------------------ queue ops


def test_qpeek_positive_negative(env: Env) -> None:
    ids = [env.add(body=b"%d" % i) for i in range(4)]
    assert [e[1] for e in env.s.op_qpeek(b"q", 2)] == ids[:2]
    assert [e[1] for e in env.s.op_qpeek(b"q", -3)] == ids[::-1][:3]
    assert env.s.op_qpeek(b"q", 0) == []
    assert env.s.op_qpeek(b"nosuch", 5) == []
    env.s.op_dequeue([ids[0]], env.now)
    assert env.s.op_qpeek(b"q", 1)[0][1] == ids[1]


def test_qstat_fields(env: Env) -> None:
    env.add()
    env.now += 2_500
    env.s.op_block(1, [b"other", b"q2"], 1, False, env.now)
    r = env.s.op_qstat(b"q", env.now)
    assert r == [b"name", b"q", b"len", 1, b"age", 2, b"idle", 2, b"blocked", 0,
                 b"import-from", [], b"import-rate", 0, b"jobs-in", 1, b"jobs-out", 0,
                 b"pause", "none", b"active", 0, b"delayed", 0, b"oldest-age", 2,
                 b"dead-len", 0]
    assert env.s.op_qstat(b"q2", env.now)[9] == 1


def test_pause_semantics(env: Env) -> None:
    assert env.s.op_pause(b"q3", ["in"], env.now) == Status("in")
    assert env.add(b"q3") is ERR_PAUSED
    assert env.s.op_pause(b"q3", ["state"], env.now) == "in"
    assert env.s.op_pause(b"q3", ["out"], env.now) == "out"
    assert env.s.op_pause(b"q3", ["in", "out"], env.now) == "all"
    assert env.s.op_pause(b"q3", ["all"], env.now) == "all"
    assert env.s.op_pause(b"q3", ["none"], env.now) == "none"
    assert env.s.op_pause(b"q3", ["bcast"], env.now) == "none"
    assert env.s.op_pause(b"unknown", ["state"], env.now) == "none"
    assert b"unknown" not in env.s.core.queues
    assert isinstance(env.add(b"q3"), Status)


def test_pause_out_blocks_getjob_until_cleared(env: Env) -> None:
    a = env.add()
    env.s.op_pause(b"q", ["out"], env.now)
    assert env.take() == []
    env.s.op_block(8, [b"q"], 1, False, env.now)
    assert env.s.take_effects() == []
    b = env.add()
    assert env.s.take_effects() == []
    env.s.op_pause(b"q", ["none"], env.now)
    assert env.s.take_effects() == [Wake(8, [[b"q", a, b"x"]])]
    assert env.s.op_qlen(b"q") == 1 and env.state(b) == QUEUED
    env.s.check()


# ------------------------------------------------------------------ scans


def _qscan_all(s: Shard, count: int = 2, **kw: int) -> list[bytes]:
    cursor, out = 0, []
    args = dict(minlen=0, maxlen=0, importrate=0)
    args.update(kw)
    while True:
        cursor, names = s.op_qscan(cursor, count, **args)
        out += names
        if cursor == 0:
            return out


def test_qscan_filters(env: Env) -> None:
    for i, n in enumerate((0, 1, 3)):
        env.take(b"q%d" % i)
        for _ in range(n):
            env.add(b"q%d" % i)
    assert sorted(_qscan_all(env.s)) == [b"q0", b"q1", b"q2"]
    assert sorted(_qscan_all(env.s, minlen=1)) == [b"q1", b"q2"]
    assert sorted(_qscan_all(env.s, maxlen=1)) == [b"q0", b"q1"]
    assert _qscan_all(env.s, importrate=1) == []


def test_qscan_never_skips_under_churn(env: Env) -> None:
    keep = [b"keep%d" % i for i in range(20)]
    for k in keep:
        env.take(k)
    cursor, seen, n = 0, set(), 0
    while True:
        cursor, names = env.s.op_qscan(cursor, 3, 0, 0, 0)
        seen.update(names)
        n += 1
        env.take(b"new%d" % n)  # queues come and go during the scan
        if n % 2:
            env.advance(IDLE_MS + IDLE_RES)
            for k in keep:
                env.s.op_pause(k, ["in"], env.now)
        if cursor == 0:
            break
    assert set(keep) <= seen


def test_jscan_filters_and_reply_kinds(env: Env) -> None:
    a = env.add(b"q4", b"a")
    b = env.add(b"q5", b"b")
    c = env.add(b"q5", b"c")
    env.take(b"q5")
    cursor, items = env.s.op_jscan(0, 1000, None, None, False, env.now)
    assert cursor == 0 and sorted(items) == sorted([a, b, c])
    assert all(isinstance(i, Status) for i in items)
    _, items = env.s.op_jscan(0, 1000, b"q5", {QUEUED}, False, env.now)
    assert items == [c]
    _, items = env.s.op_jscan(0, 1000, b"q4", None, True, env.now)
    assert len(items) == 1 and items[0][:2] == [b"id", a] and len(items[0]) == 30
    _, items = env.s.op_jscan(0, 1000, None, {ACKED}, False, env.now)
    assert items == []


def test_jscan_cursor_never_skips_under_churn(env: Env) -> None:
    keep = {env.add(body=b"k%d" % i) for i in range(300)}
    cursor, seen, n = 0, set(), 0
    while True:
        cursor, items = env.s.op_jscan(cursor, 7, None, None, False, env.now)
        seen.update(items)
        for _ in range(5):
            env.add(b"churn")
        env.take(b"churn", count=3)
        n += 1
        if cursor == 0:
            break
    assert keep <= seen and n > 1


# ------------------------------------------------------------------ misc


def test_flushall_keeps_waiters(env: Env) -> None:
    env.add()
    env.take(b"other")
    env.s.op_block(1, [b"w"], 1, False, env.now)
    env.s.op_flushall()
    env.s.check()
    assert env.s.info() == {"registered_jobs": 0, "registered_queues": 1, "blocked_clients": 1,
                          "queued_jobs": 0, "wait_repl_jobs": 0}
    jid = env.add(b"w")
    assert env.s.take_effects() == [Wake(1, [[b"w", jid, b"x"]])]


def test_workers_mint_distinct_ids() -> None:
    s0 = Shard(NODE, 0, 2, b"seed", random.Random(1), T0)
    s1 = Shard(NODE, 1, 2, b"seed", random.Random(1), T0)
    kw: dict[str, Any] = dict(timeout_ms=0, replicate=None, delay_s=0, retry_s=None,
                              ttl_s=60, maxlen=0, async_=False, token=0, now_ms=T0)
    assert s0.op_addjob(b"q", b"x", **kw) != s1.op_addjob(b"q", b"x", **kw)


def test_same_inputs_same_outputs() -> None:
    """Determinism: two shards fed the same calls agree on every reply."""
    def run() -> list[Any]:
        e = Env()
        out: list[Any] = [e.add(body=b"%d" % i, retry_s=2, ttl_s=60) for i in range(5)]
        out.append(e.take(count=3))
        e.advance(2_600)
        out.append(e.s.op_jscan(0, 100, None, None, True, e.now))
        return out

    assert run() == run()


def test_errors_are_error_replies() -> None:
    for err in (shard_mod.ERR_RETRY0, shard_mod.ERR_DELAY_TTL, shard_mod.ERR_MAXLEN_REACHED,
                shard_mod.ERR_TOOLATE):
        assert isinstance(err, Error)


def test_job_waiting_longer_than_retry_is_not_requeued_on_delivery(env: Env) -> None:
    a = env.add(retry_s=5, ttl_s=3600)
    env.now += 60_000  # sat queued for 12 retry periods (no tick needed: queued jobs wait)
    env.take()
    sh = env.show(a)
    assert 5_000 <= sh[b"next-requeue-within"] < 5_000 + core_mod.time_error_ms
    env.advance(1_000)
    assert env.state(a) == ACTIVE


def test_timer_scheduled_in_the_past_during_tick_fires(env: Env) -> None:
    """A waiter woken by a requeue takes an older job whose qtime has passed."""
    old = env.add(retry_s=1, ttl_s=3600)
    env.s.op_dequeue([old], env.now)  # active, never delivered: requeued at qtime
    env.s.op_block(1, [b"q"], 2, False, env.now)
    env.advance(60_000)
    (wake,) = env.s.take_effects()
    assert [e[1] for e in wake.reply] == [old]
    assert env.state(old) == ACTIVE


def test_peers_make_addjob_replicate(env: Env) -> None:
    """With one peer the default REPLICATE is 2: the job waits for a GOTJOB
    (tests/workers/test_shard_cluster.py runs the whole exchange)."""
    from workers.replies import PENDING

    env.s.set_peers(["dcb833cf8f42fbb7924d92335ff6d67d3cea6e3d", NODE])
    assert env.add() is PENDING
    assert env.add(replicate=3) is ERR_NOREPL
    assert env.add(retry_s=0) == shard_mod.ERR_RETRY0


def test_leaving_node_refuses_new_copies(env: Env) -> None:
    env.s.set_leaving(True)
    assert env.add() == shard_mod.ERR_NOREPL_LEAVING
    assert env.add(replicate=3) is ERR_NOREPL
    assert env.add(delay_s=5, ttl_s=5) == shard_mod.ERR_DELAY_TTL  # option checks come first
    assert env.s.info()["registered_jobs"] == 0
    env.s.set_leaving(False)
    assert isinstance(env.add(), Status)
