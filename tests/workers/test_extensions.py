"""The extensions on the shard, in memory: NACK ... DELAY, MAXDELIVER (one shard
and the seeded simulation of several nodes)."""

from __future__ import annotations

from typing import Any

import pytest

from bus.messages import BadMessage, check_job
from tests.sim.net import Net
from tests.workers.test_shard import Env
from workers import extensions as ext
from workers.effects import Wake
from workers.ids import slot_of, slot_of_job_id
from workers.job import ACKED, ACTIVE, QUEUED, Job, maxdeliver_max
from workers.replies import PENDING, Status
from workers.shard import ERR_MAXDELIVER


@pytest.fixture
def env() -> Env:
    return Env()


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
    show = env.show_all(jid)
    assert show[b"queue"] == b"dead:q" and show[b"nacks"] == 3 and show[b"maxdeliver"] == 3
    got = env.take(b"dead:q", wc=True)[0]
    assert got[:2] == [b"dead:q", jid] and got[4] == 3
    env.s.op_nack([jid], env.now)  # a dead letter stays in the dead-letter queue
    assert env.s.op_qlen(b"dead:q") == 1 and env.s.metrics(0, env.now)["dead_lettered"] == 1


def test_maxdeliver_by_retry_moves_to_dead_queue(env: Env) -> None:
    jid = env.add(maxdeliver=2, retry_s=1)
    for _ in range(2):
        assert env.take()[0][1] == jid
        env.advance(1600)  # RETRY elapses without an ACK
    env.s.check()
    assert env.s.op_qlen(b"q") == 0 and env.s.op_qlen(b"dead:q") == 1
    assert env.show_all(jid)[b"additional-deliveries"] == 2


def test_show_has_no_maxdeliver_field_without_the_option(env: Env) -> None:
    jid = env.add()
    assert b"maxdeliver" not in env.show_all(jid) and len(env.s.op_show(jid, env.now)) == 30


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


# ------------------------------------------------------------------ WAITJOB


def test_waitjob_counts_acked_deleted_expired_and_unknown(env: Env) -> None:
    a, b, c = env.add(), env.add(ttl_s=10), env.add()
    gone = "D-739317b2-" + "A" * 24 + "-05a1"
    assert env.s.op_waitjob(1, [a, b, c, gone], 0, env.now) is PENDING
    env.s.check()
    env.s.op_ackjob([a], env.now)
    env.s.op_deljob([c], env.now)
    assert not [e for e in env.s.take_effects() if isinstance(e, Wake)]
    env.advance(10_100)  # b expires
    wakes = [e for e in env.s.take_effects() if isinstance(e, Wake)]
    assert [(w.token, w.reply) for w in wakes] == [(1, 4)]
    assert env.s.op_waitjob(2, [a, b, gone], 0, env.now) == 3  # all done: at once


def test_waitjob_timeout_replies_how_many_are_done(env: Env) -> None:
    a, b = env.add(), env.add()
    assert env.s.op_waitjob(5, [a, b, b], 300, env.now) is PENDING
    env.s.op_ackjob([a], env.now)
    env.advance(200)
    assert not [e for e in env.s.take_effects() if isinstance(e, Wake)]
    env.advance(200)
    wakes = [(e.token, e.reply) for e in env.s.take_effects() if isinstance(e, Wake)]
    assert wakes == [(5, 1)]
    env.s.op_ackjob([b], env.now)  # the finished wait is not woken again
    assert not [e for e in env.s.take_effects() if isinstance(e, Wake)]


def test_waitjob_flushall_releases_waiters(env: Env) -> None:
    a = env.add()
    env.s.op_waitjob(9, [a], 0, env.now)
    env.s.op_flushall()
    assert [(e.token, e.reply) for e in env.s.take_effects() if isinstance(e, Wake)] == [(9, 1)]


def test_waitjob_in_a_cluster_the_ack_elsewhere_ends_the_wait() -> None:
    net = Net(3, seed=13)
    a, b, c = net.ids
    ids = [_added_id(net, a) for _ in range(5)]
    tok = net.token()
    assert net.nodes[a].shard.op_waitjob(tok, ids, 0, net.now) is PENDING
    net.ack(b, ids[:4])  # acknowledged on another node: SETACK reaches a
    net.run(100)
    assert net.wakes.get((a, tok)) is None
    net.ack(c, ids[4:])
    net.run(100)
    assert net.wakes.get((a, tok)) == 5
    net.check()


def _added_id(net: Net, node: str, **kw: Any) -> str:
    return net.added(node, 20, **kw)


# ------------------------------------------------------------------ GLOBALQLEN / DELQUEUE


def test_globalqlen_single_node_is_qlen(env: Env) -> None:
    env.add(replicate=1)
    env.add(replicate=1)
    assert env.s.op_globalqlen(1, b"q", env.now) == 2


def test_globalqlen_sums_reachable_nodes_and_times_out_without_an_answer() -> None:
    net = Net(3, seed=14)
    a, b, c = net.ids
    for node, n in ((a, 2), (b, 3), (c, 1)):
        for _ in range(n):
            _added_id(net, node, replicate=1)
    tok = net.token()
    assert net.nodes[a].shard.op_globalqlen(tok, b"q", net.now) is PENDING
    net.drain(a)
    net.run(50)
    assert net.wakes[(a, tok)] == 6
    net.crash(c)  # not detected yet: asked, never answers
    tok = net.token()
    net.nodes[a].shard.op_globalqlen(tok, b"q", net.now)
    net.drain(a)
    net.run(500)
    assert (a, tok) not in net.wakes
    net.run(600)
    assert net.wakes[(a, tok)] == 5


def test_delqueue_local_and_cluster_wide_counts_distinct_jobs() -> None:
    net = Net(3, seed=15)
    a, b, c = net.ids
    ids = [_added_id(net, a, replicate=3, retry_s=1) for _ in range(4)]
    ids.append(_added_id(net, b, replicate=1))
    _added_id(net, b, queue=b"other", replicate=1)
    assert net.take(a)[0][1] == ids[0]  # one active, the others queued
    net.nodes[a].shard.op_nack([ids[1]], net.now, 60)  # one delayed
    net.drain(a)
    tok = net.token()
    assert net.nodes[a].shard.op_delqueue(tok, b"q", False, net.now) is PENDING
    net.drain(a)
    net.run(100)
    assert net.wakes[(a, tok)] == 5
    net.run(5000)  # past RETRY: no copy comes back
    for n in (a, b, c):
        assert net.nodes[n].shard.op_qlen(b"q") == 0
        assert all(j.queue != b"q" or j.state == ACKED for j in net.nodes[n].shard.jobs())
    assert net.nodes[b].shard.op_qlen(b"other") == 1
    _added_id(net, c, replicate=1)
    assert net.nodes[c].shard.op_delqueue(net.token(), b"q", True, net.now) == 1
    net.check()


def test_extension_messages_are_validated_at_the_edge() -> None:
    slot = slot_of(b"q")
    check_job({"k": "QLENASK", "s": slot, "m": {"r": 1}}, [b"q"])
    check_job({"k": "QLENIS", "s": slot, "m": {"r": 1, "n": 3}}, [])
    check_job({"k": "DELQDONE", "s": slot, "m": {"r": 1}}, [b"x" * 80])
    for kind, inner, bodies in (("QLENASK", {"r": 1}, [b"other"]), ("QLENASK", {"r": -1}, [b"q"]),
                                ("QLENIS", {"r": 1, "n": -1}, []),
                                ("DELQ", {"r": "1"}, [b"q"]),
                                ("DELQDONE", {"r": 1}, [b"x" * 41])):
        with pytest.raises(BadMessage):
            check_job({"k": kind, "s": slot, "m": inner}, bodies)


def test_a_queued_crossing_the_nack_delay_does_not_cut_it_short() -> None:
    net = Net(2, seed=16)
    a, b = net.ids
    r = net.addjob(a, replicate=2, retry_s=5)
    net.run(20)
    jid = str(net.reply(a, r))
    net.take(a)
    net.nodes[a].shard.op_nack([jid], net.now, 60)
    net.drain(a)
    job = net.nodes[a].shard.lookup(jid)
    assert job is not None
    due = job.qtime_ms
    # b requeued the job just before the NACK reached it: its QUEUED arrives now
    net.nodes[a].shard.on_message(b, "QUEUED", {"j": jid, "f": 4}, [], net.now + 1)
    assert job.qtime_ms == due
    net.run(30_000)
    assert all(st == ACTIVE for st in net.holders(jid).values())
    net.check()


def test_enqueue_ends_a_nack_delay_and_later_retries_count(env: Env) -> None:
    jid = env.add(retry_s=1, maxdeliver=2)
    env.take()
    env.s.op_nack([jid], env.now, 60)
    assert env.s.op_enqueue([jid], env.now) == 1  # the operator queues it now
    env.take()
    env.advance(1600)  # RETRY: counted, and the cap (nacks 1 + deliveries 2) applies
    assert env.s.op_qlen(b"dead:q") == 1


def test_federation_carries_maxdeliver_and_the_moved_copy_dead_letters() -> None:
    net = Net(2, seed=17)
    a, b = net.ids
    jid = _added_id(net, a, replicate=1, retry_s=30, maxdeliver=1)
    tok = net.block(b)  # a consumer on b: NEEDJOBS, then YOURJOBS from a
    net.run(500)
    wake = net.wakes.get((b, tok))
    assert wake is not None and wake[0][1] == jid
    copy = net.nodes[b].shard.lookup(jid)
    assert copy is not None and copy.maxdeliver == 1
    net.nodes[b].shard.op_nack([jid], net.now)
    net.drain(b)
    net.run(100)
    assert net.nodes[b].shard.op_qlen(b"dead:q") == 1
    assert net.nodes[a].shard.lookup(jid).queue == b"dead:q"  # type: ignore[union-attr]
    net.check()


def test_waitjob_entries_are_bounded(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ext, "waitjob_entries_max", 3)
    ids = [env.add() for _ in range(4)]
    assert env.s.op_waitjob(1, ids, 0, env.now) == ext.ERR_WAITJOB_MAX
    assert env.s.op_waitjob(2, ids[:3], 0, env.now) is PENDING
    assert env.s.op_waitjob(3, ids[3:], 0, env.now) == ext.ERR_WAITJOB_MAX
    env.s.op_ackjob(ids[:1], env.now)  # its entry goes with the job
    assert env.s.op_waitjob(4, ids[3:], 0, env.now) is PENDING


def test_one_client_holds_only_its_share_of_the_waitjob_entries(env: Env) -> None:
    ids = [env.add() for _ in range(4)]
    assert env.s.op_waitjob(1, ids[:2], 10, env.now, b"a", 2) is PENDING
    assert env.s.op_waitjob(2, ids[2:3], 10, env.now, b"a", 2) == \
        ext.err_waitjob_client_max(2)
    assert env.s.op_waitjob(3, ids[1:4], 10, env.now, b"b", 3) is PENDING  # its own
    env.s.op_ackjob(ids[:1], env.now)  # the job is done: its entry leaves a's share
    assert env.s.op_waitjob(4, ids[2:3], 10, env.now, b"a", 2) is PENDING
    assert env.s.op_waitjob(5, ids[3:], 10, env.now, b"a", 2) == ext.err_waitjob_client_max(2)
    assert env.s.ext.client_entries == {b"a": 2, b"b": 3}
