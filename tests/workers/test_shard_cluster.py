"""The shard's cluster state machine, several nodes in one process (tests/sim/net.py)
on a network without faults unless a test adds some."""

from __future__ import annotations

from typing import Any

import pytest

from bus.messages import BadMessage, check_job
from tests.sim.net import Net
from workers import federation as fed
from workers import replication as repl
from workers.job import ACKED, ACTIVE, QUEUED, WAIT_REPL
from workers.replies import ERR_LEAVING, ERR_NOREPL, NULL_ARRAY, Error, Status
from workers.shard import ERR_NOREPL_LEAVING


def _added(net: Net, node: str, **kw: Any) -> str:
    return net.added(node, 100, **kw)


def test_replicate_3_waits_for_two_gotjobs_then_queues_on_the_creator() -> None:
    net = Net(3, seed=1)
    a, b, c = net.ids
    r = net.addjob(a, replicate=3)
    assert r[0] == "pending"
    jid = next(iter(net.nodes[a].shard.jobs())).id
    assert net.holders(jid) == {a: WAIT_REPL}
    net.run(10)
    assert net.reply(a, r) == Status(jid)
    assert net.holders(jid) == {a: QUEUED, b: ACTIVE, c: ACTIVE}
    for n in (a, b, c):
        assert set(net.nodes[n].shard.lookup(jid).delivered) == {a, b, c}  # type: ignore[union-attr]
    net.check()


def test_default_replicate_is_cluster_size_up_to_3() -> None:
    net = Net(2, seed=2)
    a, b = net.ids
    jid = _added(net, a)
    assert net.holders(jid) == {a: QUEUED, b: ACTIVE}
    net = Net(5, seed=2)
    jid = _added(net, net.ids[0])
    assert len(net.holders(jid)) == 3


def test_norepl_when_not_enough_reachable_nodes() -> None:
    net = Net(3, seed=3)
    a, b, c = net.ids
    net.crash(c)
    net.refresh_views()
    assert net.addjob(a, replicate=3) == ERR_NOREPL
    jid = _added(net, a)  # default REPLICATE: the reachable cluster size (2 here)
    assert len(net.holders(jid)) == 2
    assert isinstance(_added(net, a, replicate=2), str)


def test_default_replicate_follows_a_node_found_dead_while_waiting() -> None:
    net = Net(3, seed=3)
    a, b, c = net.ids
    net.crash(c)  # not detected yet: the default goal is 3
    r = net.addjob(a)
    net.run(500)
    assert net.reply(a, r) is None
    net.refresh_views()  # failure detected: the goal becomes 2, already reached
    net.run(100)
    rep = net.reply(a, r)
    assert isinstance(rep, Status)
    assert net.nodes[a].shard.op_show(str(rep), net.now)[7] == 2  # SHOW repl
    r = net.addjob(a, replicate=3, timeout_ms=300)  # explicit: no lowering
    net.run(400)
    assert net.reply(a, r) == ERR_NOREPL  # not enough reachable nodes (checked at once)


def test_one_more_node_every_50_ms_when_the_first_choice_is_down() -> None:
    net = Net(4, seed=4)
    a = net.ids[0]
    dead = net.ids[1]
    net.crash(dead)  # not detected yet: still a replication target
    for _ in range(10):  # whichever nodes the shuffle picks first
        r = net.addjob(a, replicate=3)
        net.run(400)
        rep = net.reply(a, r)
        assert isinstance(rep, Status), rep
        assert len(net.holders(str(rep))) == 3
    net.check()


def test_timeout_answers_norepl_and_deletes_the_copies() -> None:
    net = Net(3, seed=5)
    a, b, c = net.ids
    net.crash(c)  # undetected: REPLJOBs to it are lost
    r = net.addjob(a, replicate=3, timeout_ms=300)
    net.run(50)
    jid = next(iter(net.nodes[a].shard.jobs())).id
    assert net.holders(jid) == {a: WAIT_REPL, b: ACTIVE}
    net.run(400)
    assert net.reply(a, r) == repl.ERR_NOREPL_TIMEOUT
    assert str(repl.ERR_NOREPL_TIMEOUT) == (
        "NOREPL Timeout reached before replicating to the requested number of nodes")
    assert net.holders(jid) == {}


def test_async_replies_at_once_and_replicates_in_background() -> None:
    net = Net(3, seed=6)
    a = net.ids[0]
    r = net.addjob(a, replicate=3, async_=True)
    assert isinstance(r, Status)
    assert net.holders(str(r)) == {a: QUEUED}
    net.run(10)
    assert len(net.holders(str(r))) == 3


def test_repljob_refused_by_a_queue_paused_in_input() -> None:
    net = Net(2, seed=7)
    a, b = net.ids
    net.nodes[b].shard.op_pause(b"q", ["in"], net.now)
    r = net.addjob(a, replicate=2, timeout_ms=200)
    net.run(300)
    assert net.reply(a, r) == repl.ERR_NOREPL_TIMEOUT


def test_consumed_elsewhere_and_ack_gc_removes_every_copy() -> None:
    net = Net(3, seed=8)
    a, b, c = net.ids
    jid = _added(net, a, replicate=3)
    (entry,) = net.take(a)
    assert entry[1] == jid
    assert net.ack(b, [jid]) == 1  # acked on a node where it is only active
    net.run(50)
    assert net.holders(jid) == {}
    assert net.sent.get("SETACK") and net.sent.get("GOTACK") and net.sent.get("DELJOB")


def test_ack_gc_retries_after_a_partition_heals() -> None:
    net = Net(3, seed=9)
    a, b, c = net.ids
    jid = _added(net, a, replicate=3)
    net.take(a)
    net.partition({c})
    net.ack(a, [jid])
    net.run(200)
    assert net.holders(jid) == {a: ACKED, b: ACKED, c: ACTIVE}  # a waits for c's GOTACK
    net.heal()
    net.run(5000)  # the next GC attempt (backoff from 1 s)
    assert net.holders(jid) == {}


def test_memory_returns_to_baseline_after_add_get_ack_run() -> None:
    net = Net(3, seed=10)
    for i in range(300):
        src = net.ids[i % 3]
        _added(net, src, body=b"%d" % i, replicate=1 + i % 3)
        for n in net.ids:
            for e in net.take(n, count=10):
                net.ack(net.ids[(i + 1) % 3], [e[1]])
        net.run(20)
    net.run(120_000)
    for n in net.nodes.values():
        assert n.shard.info()["registered_jobs"] == 0
        assert not n.shard.gc.tries and not n.shard.core.repl
    net.check()


def test_dummy_ack_for_an_unknown_at_least_once_id() -> None:
    net = Net(3, seed=11)
    a, b, c = net.ids
    jid = _added(net, a, replicate=2)
    holders = net.holders(jid)
    stranger = next(n for n in net.ids if n not in holders)
    assert net.ack(stranger, [jid]) == 0  # not counted, as Disque
    net.run(100)
    assert net.holders(jid) == {}
    # A wrong ID: the dummy goes once every node answered it does not know it.
    wrong = jid[:-4] + "0e11"  # odd TTL field: at-least-once
    net.ack(a, [wrong])
    assert net.holders(wrong) == {a: ACKED}
    net.run(100)
    assert net.holders(wrong) == {}
    # At-most-once IDs get no dummy ACK.
    net.ack(a, [jid[:-4] + "0e10"])
    assert net.holders(jid[:-4] + "0e10") == {}


def test_single_node_ackjob_of_unknown_id_keeps_nothing() -> None:
    net = Net(1, seed=12)
    (a,) = net.ids
    assert net.ack(a, ["D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"]) == 0
    assert net.nodes[a].shard.info()["registered_jobs"] == 0


def test_fastack_deletes_everywhere() -> None:
    net = Net(3, seed=13)
    a, b, c = net.ids
    jid = _added(net, a, replicate=3)
    assert net.fastack(b, [jid]) == 1
    net.run(10)
    assert net.holders(jid) == {}
    # Unknown on the node that gets FASTACK: DELJOB to everyone.
    jid = _added(net, a, replicate=1)
    assert net.fastack(c, [jid]) == 0
    net.run(10)
    assert net.holders(jid) == {}


def test_requeue_after_retry_happens_on_one_node_only() -> None:
    net = Net(3, seed=14)
    a = net.ids[0]
    jid = _added(net, a, replicate=3, retry_s=2)
    assert net.take(a)[0][1] == jid  # delivered, never acked
    net.run(2600)
    states = net.holders(jid)
    assert list(states.values()).count(QUEUED) == 1, states
    assert net.sent.get("WILLQUEUE") and net.sent.get("QUEUED")
    net.check()


def test_queued_tie_break_greater_sender_keeps_it() -> None:
    net = Net(2, seed=15)
    lo, hi = net.ids  # sorted: hi > lo
    jid = _added(net, lo, replicate=2)
    job_hi = net.nodes[hi].shard.lookup(jid)
    assert job_hi is not None
    net.nodes[hi].shard.op_enqueue([jid], net.now)  # both queued now
    net.drain(hi)
    net.run(10)
    assert net.holders(jid) == {lo: ACTIVE, hi: QUEUED}


def test_federation_moves_a_job_to_the_blocked_consumer() -> None:
    net = Net(3, seed=16)
    a, b, c = net.ids
    tok = net.block(b)
    assert net.sent.get("NEEDJOBS")
    net.run(10)
    jid = _added(net, a, replicate=1)
    net.run(10)
    rep = net.wakes.get((b, tok))
    assert rep is not None and rep[0][1] == jid
    assert net.holders(jid) == {a: ACTIVE, b: ACTIVE}
    qs = net.nodes[b].shard.op_qstat(b"q", net.now)
    d = dict(zip(qs[::2], qs[1::2], strict=True))
    assert d[b"import-from"] == [a] and d[b"import-rate"] >= 1
    net.check()


def test_federation_broadcast_finds_jobs_queued_before_the_consumer_came() -> None:
    net = Net(3, seed=17)
    a, b, c = net.ids
    ids = [_added(net, a, replicate=1, retry_s=0) for _ in range(3)]  # at-most-once
    tok = net.block(b, count=1)
    net.run(10)
    rep = net.wakes.get((b, tok))
    assert rep is not None and rep[0][1] == ids[0]
    # Jobs left the source queue as they were sent; the rest waits queued at b.
    assert net.nodes[a].shard.op_qlen(b"q") == 0
    assert net.nodes[b].shard.op_qlen(b"q") == 2
    net.run(60_000)
    assert sum(net.nodes[n].shard.op_qlen(b"q") for n in net.ids) == 2  # never requeued


def _reachable_without_our_link() -> Net:
    """Two nodes a, x: a's link to x is down, yet a's view says x is reachable
    (restarted, peers from nodes.conf: no PONG on the link yet)."""
    net = Net(2, seed=19)
    a, x = net.ids
    net.cut_one_way(a, x)
    net.refresh_views()
    net.nodes[a].shard.set_view(a, [(x, True, False, False)], False)  # reachable, no link
    net.drain(a)
    return net


def _at_most_once_job_stays_until_the_link_is_back(net: Net) -> None:
    """x blocks on a queue where a holds an at-most-once job: x's NEEDJOBS reach a,
    the job stays queued at a until a's link to x is back, then x gets it."""
    a, x = net.ids
    jid = _added(net, a, replicate=1, retry_s=0)
    tok = net.block(x)
    net.run(1000)
    assert net.sent.get("NEEDJOBS") and (x, tok) not in net.wakes
    assert net.holders(jid) == {a: QUEUED}
    _link_back_then_x_gets_it(net, tok, jid)


def _link_back_then_x_gets_it(net: Net, tok: int, jid: str) -> None:
    """Once a's link to x is back (the first PONG on it), x's blocked GETJOB gets the
    job (x asks again: its NEEDJOBS backoff) and both nodes hold it active."""
    a, x = net.ids
    net.heal()
    net.refresh_views()
    net.run(5000)
    rep = net.wakes.get((x, tok))
    assert rep is not None and rep[0][1] == jid
    assert net.holders(jid) == {a: ACTIVE, x: ACTIVE}
    net.check()


def test_needjobs_from_a_node_we_cannot_reach_moves_no_at_most_once_job() -> None:
    """Right after a peer restarts (or a partition heals) its outbound link to us may be
    up while ours to it is still down: its NEEDJOBS reaches us, our YOURJOBS would be
    dropped. The job must stay queued here until we see the asker again, or an
    at-most-once job is lost (popped here, never queued there) with no fault left."""
    net = Net(2, seed=19)
    a, x = net.ids
    net.cut_one_way(a, x)
    net.refresh_views()  # a sees x unreachable (no PONG on its link); x sees a
    _at_most_once_job_stays_until_the_link_is_back(net)


def test_needjobs_from_a_reachable_node_without_our_link_moves_no_at_most_once_job() -> None:
    """A restarted node loads its peers from nodes.conf: reachable (no flag says
    otherwise) before its outbound links to them have carried a PONG. The view
    says so (linked False); a NEEDJOBS then must not move an at-most-once job
    that the bus would drop."""
    _at_most_once_job_stays_until_the_link_is_back(_reachable_without_our_link())


def test_late_yourjobs_to_a_reachable_asker_without_our_link_waits_for_the_link() -> None:
    """The remembered ask (a NEEDJOBS for a queue we had nothing in) gets a late
    YOURJOBS when a job arrives: not while our link to the asker has no PONG."""
    net = _reachable_without_our_link()
    a, x = net.ids
    tok = net.block(x)
    net.run(300)  # x's NEEDJOBS reaches a, which remembers the ask
    assert net.sent.get("NEEDJOBS")
    jid = _added(net, a, replicate=1, retry_s=0)
    net.run(50)
    assert (x, tok) not in net.wakes and net.holders(jid) == {a: QUEUED}
    _link_back_then_x_gets_it(net, tok, jid)


def test_needjobs_backoff_while_nothing_arrives() -> None:
    net = Net(2, seed=18)
    a, b = net.ids
    net.block(b)
    net.run(60_000)
    bcasts = net.sent["NEEDJOBS"]
    # 100 ms doubling up to 30 s: about log2(300) + 1 sends in a minute, not 600.
    assert 5 <= bcasts <= 12, bcasts


def test_leaving_node_releases_waiters_and_replicates_externally() -> None:
    net = Net(3, seed=19)
    a, b, c = net.ids
    tok = net.block(a)
    net.refresh_views(leaving={a})
    assert net.wakes[(a, tok)] == ERR_LEAVING
    sent = net.sent.get("NEEDJOBS", 0)
    tok2 = net.block(a)
    assert net.wakes[(a, tok2)] == ERR_LEAVING and net.sent.get("NEEDJOBS", 0) == sent
    jid = _added(net, a, replicate=2)  # external: b and c hold it, one queues it
    states = net.holders(jid)
    assert a not in states and sorted(states.values()) == [ACTIVE, QUEUED]
    assert net.addjob(a, replicate=3) == ERR_NOREPL_LEAVING  # only 2 other nodes
    # Not leaving nodes see a as not a target.
    assert a not in net.nodes[b].shard.core.view().peers
    net.ack(a, [jid[:-4] + "0e11"])
    assert net.holders(jid[:-4] + "0e11") == {}  # no dummy ACK while leaving


def test_leaving_with_one_peer_answers_the_reference_text() -> None:
    net = Net(2, seed=20)
    a, b = net.ids
    net.refresh_views(leaving={a})
    assert net.addjob(a) == ERR_NOREPL_LEAVING  # default REPLICATE 2 needs 2 other nodes


def test_leaving_drains_through_federation() -> None:
    net = Net(2, seed=21)
    a, b = net.ids
    ids = [_added(net, a, replicate=1) for _ in range(5)]
    net.refresh_views(leaving={a})
    got: list[str] = []
    for _ in range(10):
        tok = net.block(b, count=5)
        net.run(200)
        rep = net.wakes.get((b, tok))
        if isinstance(rep, list):
            got += [e[1] for e in rep]
            net.ack(b, [e[1] for e in rep])
        if len(got) == 5:
            break
        net.nodes[b].shard.op_unblock(tok, net.now)
    assert sorted(got) == sorted(ids)
    net.run(1000)
    assert net.nodes[a].shard.info()["registered_jobs"] == 0


def test_pause_bcast_sets_the_state_everywhere() -> None:
    net = Net(3, seed=22)
    a, b, c = net.ids
    assert net.nodes[a].shard.op_pause(b"q", ["in", "bcast"], net.now) == Status("in")
    net.drain(a)
    net.run(10)
    for n in (b, c):
        assert net.nodes[n].shard.op_pause(b"q", ["state"], net.now) == Status("in")
    net.nodes[a].shard.op_pause(b"q", ["none", "bcast"], net.now)
    net.drain(a)
    net.run(10)
    assert net.nodes[b].shard.op_pause(b"q", ["state"], net.now) == Status("none")


def test_malformed_messages_are_dropped() -> None:
    """Shapes are refused at the edge (bus/messages.py); the shard only parses the
    job records inside and drops the ones it cannot read."""
    net = Net(2, seed=23)
    a, b = net.ids
    s = net.nodes[a].shard
    for kind, meta, bodies in [("GOTJOB", {}, []), ("SETACK", {"j": 5}, []),
                               ("NEEDJOBS", {"c": "x"}, [b"q"]), ("PAUSE", {}, []),
                               ("REPLJOB", {}, []), ("NOSUCH", {}, [b"x"])]:
        with pytest.raises(BadMessage):
            check_job({"k": kind, "s": 0, "m": meta}, bodies)
    for kind, meta, bodies in [("REPLJOB", {}, [b"junk"]), ("YOURJOBS", {}, [b"\x01"]),
                               ("NOSUCH", {}, [])]:
        check_job({"k": kind, "s": 0, "m": meta}, bodies)
        s.on_message(b, kind, meta, bodies, net.now)
    s.check()
    assert s.op_take([b"q"], 1, False, net.now) == []
    assert s.op_qstat(b"zz", net.now) is NULL_ARRAY
    assert not isinstance(s.op_pause(b"q", ["state"], net.now), Error)


def test_reset_hard_new_id_is_used_for_new_jobs() -> None:
    net = Net(2, seed=24)
    a, b = net.ids
    s = net.nodes[a].shard
    new_id = "ff" + a[2:]
    s.set_view(new_id, [(b, True, False)], False)
    jid = str(net.addjob(a, replicate=1))
    assert jid.startswith("D-" + new_id[:8] + "-")


def test_willqueue_to_a_node_holding_the_ack_gets_setack_back() -> None:
    net = Net(2, seed=25)
    a, b = net.ids
    jid = _added(net, a, replicate=2, retry_s=5)
    net.partition({b})
    net.take(a)
    net.ack(a, [jid])  # b does not hear about it
    net.heal()
    net.nodes[b].shard.on_message(a, "WILLQUEUE", {"j": jid}, [], net.now)  # as if from a
    net.drain(b)
    # b has the job active: nothing to say. The other way round: a has it acked.
    net.nodes[a].shard.on_message(b, "WILLQUEUE", {"j": jid}, [], net.now)
    net.drain(a)
    net.run(20)
    assert net.holders(jid) == {}  # SETACK -> b acks -> GOTACK -> DELJOB


def test_yourjobs_never_sends_more_than_asked_or_out_of_a_paused_queue() -> None:
    net = Net(2, seed=26)
    a, b = net.ids
    for _ in range(300):
        net.addjob(a, replicate=1)
    s = net.nodes[a].shard
    s.on_message(b, "NEEDJOBS", {"c": 7}, [b"q"], net.now)
    (msg,) = s.take_effects()
    assert msg.kind == "YOURJOBS" and len(msg.bodies) == 7
    s.on_message(b, "NEEDJOBS", {"c": 10**9}, [b"q"], net.now)
    (msg,) = s.take_effects()
    assert len(msg.bodies) == fed.needjobs_count_max
    s.op_pause(b"q", ["out"], net.now)
    s.on_message(b, "NEEDJOBS", {"c": 7}, [b"q"], net.now)
    assert s.take_effects() == []
    s.check()


def test_setack_from_a_node_that_knows_fewer_holders_makes_us_run_the_gc() -> None:
    net = Net(3, seed=27)
    a, b, c = net.ids
    jid = _added(net, a, replicate=3)
    sb = net.nodes[b].shard
    sb.on_message(c, "SETACK", {"j": jid, "m": 1}, [], net.now)  # c claims 1 holder
    sent = {e.kind for e in sb.take_effects()}
    assert sent == {"SETACK"}  # b knows 3 holders: it runs the GC, no GOTACK
    assert sb.lookup(jid).state == ACKED  # type: ignore[union-attr]


def test_a_node_near_its_memory_limit_takes_no_copies_but_replicates_externally() -> None:
    net = Net(3, seed=28)
    a, b, c = net.ids
    net.nodes[b].shard.set_memory_level(1)
    r = net.addjob(a, replicate=3, timeout_ms=300)
    net.run(400)
    assert net.reply(a, r) == repl.ERR_NOREPL_TIMEOUT  # b never answers GOTJOB
    jid = _added(net, b, replicate=2)  # b's own ADDJOB: copies on a and c only
    states = net.holders(jid)
    assert b not in states and sorted(states.values()) == [ACTIVE, QUEUED]


def test_importing_queue_asks_its_source_at_once_when_drained_and_qscan_importrate() -> None:
    net = Net(2, seed=29)
    a, b = net.ids
    for _ in range(10):
        net.addjob(a, replicate=1)
    tok = net.block(b, count=5)
    net.run(10)
    assert len(net.wakes[(b, tok)]) == 5  # YOURJOBS brought 5 (NEEDJOBS count min)
    assert net.nodes[b].shard.op_qlen(b"q") == 0
    sent = net.sent["NEEDJOBS"]
    # b has an import rate now: a queue drained by a GETJOB asks the source at once.
    net.nodes[b].shard.op_qscan(0, 10, 0, 0, 1)
    assert net.nodes[b].shard.op_qscan(0, 10, 0, 0, 1)[1] == [b"q"]
    assert net.nodes[b].shard.op_qscan(0, 10, 0, 0, 1000)[1] == []
    assert net.nodes[a].shard.op_qscan(0, 10, 0, 0, 1)[1] == []
    net.nodes[b].shard.op_enqueue([e[1] for e in net.wakes[(b, tok)]][:1], net.now)
    net.drain(b)
    assert net.take(b)  # drained again -> ad hoc NEEDJOBS without waiting
    assert net.sent["NEEDJOBS"] == sent + 1
    net.run(10)
    assert net.nodes[b].shard.op_qlen(b"q") == 5  # the other 5 arrived


def test_working_postpones_the_requeue_on_every_copy() -> None:
    net = Net(3, seed=30)
    a = net.ids[0]
    jid = _added(net, a, replicate=3, retry_s=2)
    assert net.take(a)[0][1] == jid
    for _ in range(4):  # a worker keeps saying WORKING for 6 s: nobody requeues
        net.run(1500)
        assert net.nodes[a].shard.op_working(jid, net.now) == 2
        net.drain(a)
    net.run(1000)
    assert QUEUED not in net.holders(jid).values()
    net.run(3000)  # it stopped: some node requeues (once)
    assert list(net.holders(jid).values()).count(QUEUED) == 1


def test_a_copy_arriving_after_its_ack_is_not_kept() -> None:
    """A REPLJOB (or YOURJOBS) overtaken by the ACK's SETACK or DELJOB (it took worker
    0's relay while the ACK took a just-ready direct data link) used to create a copy
    that was queued again RETRY later: an acknowledged job delivered twice."""
    net = Net(3, seed=7)
    a, b, c = net.ids
    jid = _added(net, a, replicate=3, retry_s=2)
    rec = net.nodes[a].shard.lookup(jid).to_record()  # type: ignore[union-attr]
    assert net.take(a)
    net.ack(a, [jid])
    net.run(3000)
    assert net.holders(jid) == {}
    for late_after in ("DELJOB", "SETACK"):
        node = b if late_after == "DELJOB" else c
        shard = net.nodes[node].shard
        shard.on_message(a, late_after, {"j": jid, "m": 3}, [], net.now)  # the ACK first...
        shard.on_message(a, "REPLJOB", {}, [rec], net.now)  # ...then the late replica
        shard.on_message(a, "YOURJOBS", {}, [rec], net.now)
        net.drain(node)
        assert shard.lookup(jid) is None, late_after
    net.run(10_000)  # past RETRY: nobody queues it again
    assert all(net.nodes[n].shard.op_qlen(b"q") == 0 for n in (a, b, c))
    assert net.holders(jid) == {}
    net.check()


def test_a_peer_cannot_make_a_job_unencodable() -> None:
    """Node lists from a peer's ENQUEUE are bounded, so the job record (AOF,
    REPLJOB, YOURJOBS) still encodes."""
    net = Net(2, seed=9)
    a, b = net.ids
    jid = _added(net, a, replicate=2)
    shard = net.nodes[b].shard
    shard.on_message(a, "ENQUEUE", {"j": jid, "d": ["x" * 70_000]}, [], net.now)
    shard.on_message(a, "ENQUEUE", {"j": jid, "d": [f"{i:040x}" for i in range(70_000)]}, [],
                     net.now)
    job = shard.lookup(jid)
    assert job is not None and len(job.delivered) == 2
    assert job.to_record()
