"""The extensions on the shard, in memory: NACK ... DELAY, MAXDELIVER (one shard
and the seeded simulation of several nodes)."""

from __future__ import annotations

from typing import Any

import pytest

from bus.messages import BadMessage, check_job
from tests.sim.net import Net
from tests.workers.test_shard import Env
from workers.ids import slot_of, slot_of_job_id
from workers.job import ACTIVE, QUEUED, Job, maxdeliver_max
from workers.replies import Status
from workers.shard import ERR_MAXDELIVER


@pytest.fixture
def env() -> Env:
    return Env()


def _show(env: Env, jid: str) -> dict[bytes, Any]:
    r = env.s.op_show(jid, env.now)
    return dict(zip(r[::2], r[1::2], strict=True))


# ------------------------------------------------------------------ NACK DELAY


def test_nack_delay_queues_after_the_delay_same_id_one_nack(env: Env) -> None:
    jid = env.add(retry_s=60)
    assert env.take()[0][1] == jid
    assert env.s.op_nack([jid], env.now, 5) == 1
    env.s.check()
    assert env.state(jid) == ACTIVE and env.s.op_qlen(b"q") == 0
    env.advance(4900)
    assert env.state(jid) == ACTIVE
    env.advance(200)
    assert env.state(jid) == QUEUED
    got = env.take(wc=True)[0]
    assert got[1] == jid and got[4] == 1 and got[6] == 0  # nacks 1, no extra delivery counted


def test_nack_delay_0_is_plain_nack(env: Env) -> None:
    jid = env.add()
    env.take()
    assert env.s.op_nack([jid], env.now, 0) == 1
    assert env.state(jid) == QUEUED


def test_nack_delay_survives_a_record_round_trip(env: Env) -> None:
    jid = env.add(retry_s=60)
    env.take()
    env.s.op_nack([jid], env.now, 30)
    job = env.s.lookup(jid)
    assert job is not None
    again = Job.from_record(job.to_record())
    assert again.qtime_ms == job.qtime_ms and again.flags == job.flags & ~2


def test_nack_delay_in_a_cluster_no_copy_queues_it_earlier() -> None:
    net = Net(3, seed=11)
    a, b, c = net.ids
    r = net.addjob(a, replicate=3, retry_s=2)
    net.run(50)
    jid = str(net.reply(a, r))
    assert net.take(a)[0][1] == jid
    net.nodes[a].shard.op_nack([jid], net.now, 20)
    net.drain(a)
    for _ in range(19):
        net.run(1000)  # RETRY is 2 s: without the delay a copy would queue it
        assert all(st == ACTIVE for st in net.holders(jid).values()), net.holders(jid)
    net.run(1500)
    assert QUEUED in net.holders(jid).values()
    for n in (a, b, c):
        assert net.nodes[n].shard.lookup(jid).nacks == 1  # type: ignore[union-attr]
    net.check()


def test_queued_with_wait_is_validated_at_the_edge() -> None:
    jid = "D-739317b2-" + "A" * 24 + "-05a1"
    slot = slot_of_job_id(jid)
    check_job({"k": "QUEUED", "s": slot, "m": {"j": jid, "f": 2, "w": 5000}}, [])
    for bad in ({"w": -1}, {"w": "5"}, {"dl": 2}, {"f": 1 << 40}):
        with pytest.raises(BadMessage):
            check_job({"k": "QUEUED", "s": slot, "m": {"j": jid, **bad}}, [])


# ------------------------------------------------------------------ MAXDELIVER


def test_dead_letter_queue_shares_the_slot() -> None:
    for q in (b"q", b"orders", b"x" * 100):
        assert slot_of(b"dead:" + q) == slot_of(q)


def test_maxdeliver_bounds(env: Env) -> None:
    assert env.add(maxdeliver=maxdeliver_max + 1) == ERR_MAXDELIVER
    assert env.add(maxdeliver=-1) == ERR_MAXDELIVER
    assert isinstance(env.add(maxdeliver=maxdeliver_max), Status)


def test_maxdeliver_by_nack_moves_to_dead_queue_with_id_and_counters(env: Env) -> None:
    jid = env.add(maxdeliver=3, retry_s=60)
    for _ in range(2):
        assert env.take()[0][1] == jid
        assert env.s.op_nack([jid], env.now) == 1
        assert env.state(jid) == QUEUED and env.s.op_qlen(b"q") == 1
    assert env.take()[0][1] == jid  # third delivery
    assert env.s.op_nack([jid], env.now) == 1
    env.s.check()
    assert env.s.op_qlen(b"q") == 0 and env.s.op_qlen(b"dead:q") == 1
    show = _show(env, jid)
    assert show[b"queue"] == b"dead:q" and show[b"nacks"] == 3 and show[b"maxdeliver"] == 3
    got = env.take(b"dead:q", wc=True)[0]
    assert got[:2] == [b"dead:q", jid] and got[4] == 3
    env.s.op_nack([jid], env.now)  # a dead letter stays in the dead-letter queue
    assert env.s.op_qlen(b"dead:q") == 1 and env.s.stat_dead_lettered == 1


def test_maxdeliver_by_retry_moves_to_dead_queue(env: Env) -> None:
    jid = env.add(maxdeliver=2, retry_s=1)
    for _ in range(2):
        assert env.take()[0][1] == jid
        env.advance(1600)  # RETRY elapses without an ACK
    env.s.check()
    assert env.s.op_qlen(b"q") == 0 and env.s.op_qlen(b"dead:q") == 1
    assert _show(env, jid)[b"additional-deliveries"] == 2


def test_show_has_no_maxdeliver_field_without_the_option(env: Env) -> None:
    jid = env.add()
    assert b"maxdeliver" not in _show(env, jid) and len(env.s.op_show(jid, env.now)) == 30


def test_maxdeliver_record_versions() -> None:
    env = Env()
    plain = env.s.lookup(env.add())
    capped = env.s.lookup(env.add(maxdeliver=7))
    assert plain is not None and capped is not None
    assert plain.to_record()[0] == 1  # what a node without the extension reads
    rec = capped.to_record()
    assert rec[0] == 2 and Job.from_record(rec).maxdeliver == 7
    with pytest.raises(ValueError):
        Job.from_record(rec[:60])  # truncated


def test_maxdeliver_in_a_cluster_every_copy_follows_to_the_dead_queue() -> None:
    net = Net(3, seed=12)
    a, b, c = net.ids
    r = net.addjob(a, replicate=3, retry_s=30, maxdeliver=1)
    net.run(50)
    jid = str(net.reply(a, r))
    for n in (b, c):  # REPLJOB carried the cap
        assert net.nodes[n].shard.lookup(jid).maxdeliver == 1  # type: ignore[union-attr]
    assert net.take(a)[0][1] == jid
    net.nodes[a].shard.op_nack([jid], net.now)
    net.drain(a)
    net.run(100)
    for n in (a, b, c):
        assert net.nodes[n].shard.lookup(jid).queue == b"dead:q"  # type: ignore[union-attr]
    assert net.take(a, b"dead:q")[0][1] == jid
    net.check()
