"""An answered ACK is final without faults: the GC reaches every copy, a copy it
missed hears of the ACK before it is queued again, and a job given away by a
YOURJOBS that could not be written comes back to its queue (several shards in
one process, tests/sim/net.py)."""

from __future__ import annotations

from typing import Any

from tests.sim.net import Net
from workers.effects import Send
from workers.job import ACKED, ACTIVE, QUEUED


def _added(net: Net, node: str, **kw: Any) -> str:
    r = net.addjob(node, **kw)
    net.run(100)
    rep = net.reply(node, r)
    return str(rep)


def test_setack_with_as_many_nodes_but_one_we_do_not_know_makes_us_run_the_gc() -> None:
    net = Net(4, seed=31)
    a, b, c, d = net.ids
    jid = _added(net, a, replicate=3, retry_s=2)
    holders = set(net.holders(jid))
    x = next(n for n in net.ids if n not in holders)
    y = next(n for n in holders if n != a)
    sa = net.nodes[a].shard
    sa.lookup(jid).delivered += (x,)  # type: ignore[union-attr]  # we gave x a copy
    # y's list has as many nodes as ours but not x: the count alone (the spec's
    # SETACK) would make us confirm, and x's copy would be queued again after RETRY.
    theirs = [n for n in sa.lookup(jid).delivered if n != x][:3] + [y]  # type: ignore[union-attr]
    theirs = list(dict.fromkeys(theirs))
    sa.on_message(y, "SETACK", {"j": jid, "m": 4, "d": theirs}, [], net.now)
    sent = [e for e in sa.take_effects() if type(e) is Send]
    assert not [e for e in sent if e.kind == "GOTACK"]
    assert x in {e.node_id for e in sent if e.kind == "SETACK"}
    assert sa.lookup(jid).state == ACKED  # type: ignore[union-attr]
    assert y in sa.lookup(jid).confirmed  # type: ignore[union-attr]  # it sent SETACK: acked


def test_setack_whose_list_covers_ours_is_confirmed_at_once() -> None:
    net = Net(3, seed=32)
    a, b, c = net.ids
    jid = _added(net, a, replicate=3, retry_s=2)
    sb = net.nodes[b].shard
    sb.on_message(a, "SETACK", {"j": jid, "m": 3, "d": [a, b, c]}, [], net.now)
    assert [e.kind for e in sb.take_effects() if type(e) is Send] == ["GOTACK"]


def test_willqueue_for_a_job_acked_and_collected_here_gets_setack() -> None:
    """A copy the GC did not reach (no other node lists its holder): its holder's
    WILLQUEUE, 500 ms before it would queue the job again, meets nodes that forgot
    the job; those that remember it was acknowledged tell the holder, which acks
    its copy instead of queueing it."""
    net = Net(3, seed=33)
    a = net.ids[0]
    jid = _added(net, a, replicate=2, retry_s=2)
    c = next(n for n in net.ids if n not in net.holders(jid))
    rec = net.nodes[a].shard.lookup(jid).to_record()  # type: ignore[union-attr]
    net.nodes[c].shard.on_message(a, "REPLJOB", {}, [rec], net.now)  # a copy nobody lists
    net.nodes[c].shard.take_effects()  # its GOTJOB is lost
    assert net.take(a)[0][1] == jid
    net.ack(a, [jid])
    net.run(200)
    assert net.holders(jid) == {c: ACTIVE}  # the GC over a and b is done
    net.run(30_000)
    assert not net.holders(jid)
    assert net.nodes[c].shard.stats.requeued_retry == 0


def test_yourjobs_brings_back_the_senders_node_list() -> None:
    net = Net(4, seed=34)
    a, b, c, d = net.ids
    jid = _added(net, a, replicate=2, retry_s=5)
    holder = next(n for n in net.holders(jid) if n != a)
    rec_job = net.nodes[holder].shard.lookup(jid)
    assert rec_job is not None
    far = next(n for n in net.ids if n not in net.holders(jid))
    rec_job.delivered += (far,)
    rec = rec_job.to_record()
    sa = net.nodes[a].shard
    sa.on_message(holder, "YOURJOBS", {}, [rec], net.now)
    assert far in sa.lookup(jid).delivered  # type: ignore[union-attr]


def test_a_job_a_client_holds_here_is_not_queued_again_by_a_yourjobs() -> None:
    net = Net(2, seed=35)
    a, b = net.ids
    jid = _added(net, a, replicate=2, retry_s=5)
    assert net.take(a)[0][1] == jid  # a client of a holds it now
    rec = net.nodes[b].shard.lookup(jid).to_record()  # type: ignore[union-attr]
    net.nodes[a].shard.on_message(b, "YOURJOBS", {}, [rec], net.now)
    net.drain(a)
    assert net.holders(jid)[a] == ACTIVE
    assert net.take(a) == []


def test_yourjobs_not_written_puts_its_jobs_back_in_the_queue() -> None:
    """The worker could not write the YOURJOBS (no link to the asker, nor to worker
    0 to relay it): an at-most-once job would be queued nowhere."""
    net = Net(2, seed=36)
    a, b = net.ids
    jid = _added(net, a, replicate=1, retry_s=0)
    sa = net.nodes[a].shard
    sa.on_message(b, "NEEDJOBS", {"c": 5}, [b"q"], net.now)
    sends = [e for e in sa.take_effects() if type(e) is Send and e.kind == "YOURJOBS"]
    assert len(sends) == 1 and net.holders(jid) == {a: ACTIVE}
    sa.yourjobs_unsent(sends[0].bodies, net.now)
    assert net.holders(jid) == {a: QUEUED}
    assert net.take(a)[0][1] == jid
    sa.check()


def test_a_peers_node_list_never_makes_a_job_unencodable() -> None:
    net = Net(2, seed=37)
    a, b = net.ids
    jid = _added(net, a, replicate=2, retry_s=5)
    theirs = net.nodes[b].shard.lookup(jid)
    assert theirs is not None
    theirs.delivered = tuple(f"{i:040x}" for i in range(4000))  # a broken peer's list
    rec = theirs.to_record()
    sa = net.nodes[a].shard
    sa.on_message(b, "YOURJOBS", {}, [rec], net.now)
    sa.on_message(b, "SETACK", {"j": jid, "m": 1000, "d": list(theirs.delivered[:1000])}, [],
                  net.now)
    assert sa.lookup(jid).to_record()  # type: ignore[union-attr]
