"""Membership, gossip and failure detection (bus/membership.py) with a fake clock and
an in-memory network: every PING is answered at once by the node at that address."""

from __future__ import annotations

import copy
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus import membership as mb
from bus import nodes_conf
from bus.membership import Broadcast, DropLink, Membership, Ping

TIMEOUT_MS = 2000


class Net:
    """Nodes on 127.0.0.1 ports 7001.., a fake clock, nodes that can be down."""

    def __init__(self, n: int, seed: int = 1) -> None:
        self.now_ms = 1_000_000
        self.rng = random.Random(seed)
        self.nodes: dict[int, Membership] = {}
        self.down: set[int] = set()
        for i in range(n):
            self.add(7001 + i)

    def add(self, port: int, node_id: str | None = None) -> Membership:
        rng = random.Random(self.rng.random())
        m = Membership(node_id or mb.new_node_id(rng), "127.0.0.1", port, rng, self.now_ms,
                       TIMEOUT_MS)
        self.nodes[port] = m
        return m

    def run(self, ms: int, step_ms: int = 50) -> None:
        for _ in range(ms // step_ms):
            self.now_ms += step_ms
            for port, m in list(self.nodes.items()):
                if port not in self.down:
                    self.carry_out(m, m.tick(self.now_ms))

    def carry_out(self, m: Membership, actions: list[mb.Action]) -> None:
        for a in actions:
            if isinstance(a, Ping):
                self.deliver_ping(m, a)
            elif isinstance(a, Broadcast):
                for node in list(m.others()):
                    peer = self.nodes.get(node.port)
                    if peer is not None and self.can_reach(m, node.port) and not node.handshake:
                        peer.on_fail(m.my_id, a.meta, self.now_ms)
            elif isinstance(a, DropLink):
                m.link_lost(a.node)

    def can_reach(self, m: Membership, port: int) -> bool:
        return port not in self.down

    def deliver_ping(self, m: Membership, a: Ping) -> None:
        peer = self.nodes.get(a.node.port)
        if peer is None or not self.can_reach(m, a.node.port):
            m.link_lost(a.node)
            return
        if not a.node.link_up:
            m.link_connected(a.node, self.now_ms)
        m.stats_sent += 1
        pong = peer.on_ping(m.make_ping(a.node), a.meet, "127.0.0.1", "127.0.0.1", self.now_ms)
        if pong is not None:
            self.carry_out(m, m.on_pong(a.node, pong, self.now_ms))

    def meet(self, a: int, b: int) -> None:
        assert self.nodes[a].meet("127.0.0.1", b, self.now_ms) is not None

    def ids(self, port: int) -> set[str]:
        return {n.node_id for n in self.nodes[port].nodes.values() if not n.handshake}


def test_meet_handshake_learns_real_id_on_both_sides() -> None:
    net = Net(2)
    a, b = net.nodes[7001], net.nodes[7002]
    node = a.meet("127.0.0.1", 7002, net.now_ms)
    assert node is not None and node.handshake and node.node_id != b.my_id
    assert "handshake" in mb.nodes_text(mb.snapshot(a))
    net.run(1000)
    assert net.ids(7001) == net.ids(7002) == {a.my_id, b.my_id}
    assert a.nodes[b.my_id] is node and not node.handshake
    assert not any(n.handshake for n in b.nodes.values())


def test_meet_twice_to_same_address_runs_one_handshake() -> None:
    net = Net(2)
    a = net.nodes[7001]
    assert a.meet("127.0.0.1", 7002, net.now_ms) is not None
    assert a.meet("127.0.0.1", 7002, net.now_ms) is None


def test_meet_known_node_drops_the_duplicate_handshake() -> None:
    net = Net(2)
    net.meet(7001, 7002)
    net.run(1000)
    net.meet(7001, 7002)
    net.run(1000)
    assert len(net.nodes[7001].nodes) == 2


def test_meet_myself_is_dropped() -> None:
    net = Net(1)
    net.meet(7001, 7001)
    net.run(1000)
    assert list(net.nodes[7001].nodes) == [net.nodes[7001].my_id]


def test_gossip_closes_the_mesh() -> None:
    net = Net(5)
    for a, b in ((7001, 7002), (7002, 7003), (7004, 7003), (7005, 7001)):
        net.meet(a, b)
    net.run(3000)
    everyone = {m.my_id for m in net.nodes.values()}
    for port in net.nodes:
        assert net.ids(port) == everyone, port
        info = mb.info_text(mb.snapshot(net.nodes[port]))
        assert "cluster_known_nodes:5\r\n" in info
        assert "cluster_reachable_nodes:4\r\n" in info
        assert "cluster_size:5\r\n" in info


def joined(n: int) -> Net:
    net = Net(n)
    for port in range(7002, 7001 + n):
        net.meet(7001, port)
    net.run(3000)
    return net


def flags_of(m: Membership, node_id: str) -> list[str]:
    return m.nodes[node_id].flags()


def test_pfail_after_timeout_then_fail_by_majority() -> None:
    net = joined(3)
    dead = net.nodes[7003]
    net.down.add(7003)
    net.run(TIMEOUT_MS - 200)
    assert flags_of(net.nodes[7001], dead.my_id) == []
    net.run(600)  # the last PONG was < one ping interval before it went down
    states = {tuple(flags_of(net.nodes[p], dead.my_id)) for p in (7001, 7002)}
    assert states <= {("fail?",), ("fail",)} and states
    net.run(TIMEOUT_MS)  # gossip carries the PFAIL reports: majority (2 of 3)
    for p in (7001, 7002):
        assert flags_of(net.nodes[p], dead.my_id) == ["fail"]
        view = mb.snapshot(net.nodes[p])
        assert "cluster_reachable_nodes:1\r\n" in mb.info_text(view)
        hello = mb.hello_reply(view)
        prio = {entry[0].decode(): entry[3] for entry in hello[2:]}
        assert prio[dead.my_id] == b"10"
        line = [ln for ln in mb.nodes_text(view).splitlines() if ln.startswith(dead.my_id)]
        assert line[0].split()[2] == "fail"


def last_down_three_timeouts(n: int) -> tuple[Net, Membership]:
    """``n`` joined nodes, the last one (port 7000 + n) down for three node timeouts:
    the net and that node."""
    net = joined(n)
    last = net.nodes[7000 + n]
    net.down.add(7000 + n)
    net.run(TIMEOUT_MS * 3)
    return net, last


def test_two_nodes_never_reach_fail_quorum() -> None:
    net, b = last_down_three_timeouts(2)
    assert flags_of(net.nodes[7001], b.my_id) == ["fail?"]


def test_fail_clears_when_node_answers_again() -> None:
    net, c = last_down_three_timeouts(3)
    assert flags_of(net.nodes[7001], c.my_id) == ["fail"]
    net.down.discard(7003)
    net.run(2000)
    for p in (7001, 7002):
        assert flags_of(net.nodes[p], c.my_id) == []


def test_runtime_node_timeout_change() -> None:
    net = joined(2)
    b = net.nodes[7002]
    net.nodes[7001].set_node_timeout(500)
    net.down.add(7002)
    net.run(800)
    assert flags_of(net.nodes[7001], b.my_id) == ["fail?"]


def test_leaving_propagates_and_sets_hello_priority() -> None:
    net = joined(3)
    a = net.nodes[7001]
    actions = a.set_leaving(True, net.now_ms)
    assert len(actions) == 2
    net.carry_out(a, actions)
    for m in net.nodes.values():
        hello = mb.hello_reply(mb.snapshot(m))
        prio = {entry[0].decode(): entry[3] for entry in hello[2:]}
        assert prio[a.my_id] == b"100"
        assert [v for k, v in prio.items() if k != a.my_id] == [b"1", b"1"]
    assert "leaving" in mb.nodes_text(mb.snapshot(net.nodes[7002]))
    net.carry_out(a, a.set_leaving(False, net.now_ms))
    assert all(p.leaving is False for p in mb.peers(mb.snapshot(net.nodes[7003])))


def test_a_pong_that_crossed_leaving_on_the_other_link_does_not_undo_it() -> None:
    """B hears A's header on two links: A's PINGs on A's link, A's PONGs on B's. A PONG
    A wrote before CLUSTER LEAVING yes, read by B after the PING that carries it, is
    older (same incarnation, fewer flag changes): B keeps A leaving."""
    net = joined(2)
    a, b = net.nodes[7001], net.nodes[7002]
    a_at_b = b.nodes[a.my_id]
    b_at_a = a.nodes[b.my_id]
    stale_pong = a.on_ping(b.make_ping(a_at_b), False, "127.0.0.1", "127.0.0.1", net.now_ms)
    assert stale_pong is not None and stale_pong["leaving"] is False
    net.carry_out(a, a.set_leaving(True, net.now_ms))
    assert a_at_b.leaving
    b.on_pong(a_at_b, stale_pong, net.now_ms)
    assert a_at_b.leaving, "an older header undid LEAVING"
    # a newer one is taken (LEAVING no), and so is any header of a new incarnation
    net.carry_out(a, a.set_leaving(False, net.now_ms))
    assert not a_at_b.leaving
    restarted = dict(a.make_ping(b_at_a), leaving=True, hv=[a.myself.header_version[0] + 1, 0])
    b.on_ping(restarted, False, "127.0.0.1", "127.0.0.1", net.now_ms)
    assert a_at_b.leaving


def test_forget_bans_the_id_from_gossip_for_a_minute() -> None:
    net = joined(3)
    a, c = net.nodes[7001], net.nodes[7003]
    assert a.forget(c.my_id, net.now_ms) is None
    net.run(5000)  # B still gossips C, and C keeps pinging A
    assert c.my_id not in a.nodes
    net.run(mb.forget_ban_ms)
    assert c.my_id in a.nodes  # the ban expired and gossip brought it back


def test_forget_errors() -> None:
    net = joined(2)
    a = net.nodes[7001]
    assert a.forget(a.my_id, net.now_ms) == "I tried hard but I can't forget myself..."
    assert a.forget("0" * 40, net.now_ms) == "Unknown node " + "0" * 40


def test_reset_soft_and_hard() -> None:
    net = joined(3)
    a = net.nodes[7001]
    old = a.my_id
    a.reset(hard=False, now_ms=net.now_ms)
    assert list(a.nodes) == [old]
    a.reset(hard=True, now_ms=net.now_ms)
    assert a.my_id != old and list(a.nodes) == [a.my_id] and mb.is_node_id(a.my_id)


def test_hard_reset_peer_is_marked_noaddr_by_the_others() -> None:
    net = joined(2)
    a, b = net.nodes[7001], net.nodes[7002]
    old_b = b.my_id
    b.reset(hard=True, now_ms=net.now_ms)
    net.run(2000)
    assert "noaddr" in a.nodes[old_b].flags()
    assert b.my_id not in a.nodes


def test_nodes_conf_round_trip(tmp_path) -> None:
    net = joined(3)
    a = net.nodes[7001]
    net.carry_out(a, a.set_leaving(True, net.now_ms))
    path = str(tmp_path / "nodes.conf")
    nodes_conf.save(path, a.to_conf())
    nc = nodes_conf.load(path)
    assert nc is not None and nc.node_id == a.my_id and len(nc.peers) == 2
    back = Membership(a.my_id, "127.0.0.1", 7001, random.Random(5), net.now_ms, TIMEOUT_MS)
    back.load_conf(nc, net.now_ms)
    assert set(back.nodes) == set(a.nodes)
    assert back.myself.leaving
    assert {(n.ip, n.port) for n in back.others()} == {("127.0.0.1", 7002), ("127.0.0.1", 7003)}


def three_with_7003_failed_and_gone() -> tuple[Net, nodes_conf.NodesConf, str]:
    """Three joined nodes, then 7003 down long enough to be failed, then removed (still
    in ``net.down``): the net, 7003's conf and its ID, for a restart."""
    net = joined(3)
    c = net.nodes[7003]
    conf, c_id = c.to_conf(), c.my_id
    net.down.add(7003)
    net.run(TIMEOUT_MS * 3)
    del net.nodes[7003]
    return net, conf, c_id


def test_restarted_node_with_its_conf_rejoins() -> None:
    net, conf, c_id = three_with_7003_failed_and_gone()
    net.down.discard(7003)
    c2 = net.add(7003, c_id)
    c2.load_conf(nodes_conf.parse(nodes_conf.render(conf)), net.now_ms)
    net.run(2000)
    for p in (7001, 7002):
        assert flags_of(net.nodes[p], c_id) == []
    assert net.ids(7003) == {m.my_id for m in net.nodes.values()}


def linked_peers(m: Membership) -> set[str]:
    return {p.node_id for p in mb.peers(mb.snapshot(m)) if p.linked}


def test_peer_loaded_from_conf_is_linked_only_after_a_pong_on_our_link() -> None:
    """A restarted node's peers from nodes.conf are reachable (no flag says
    otherwise) before its own links to them are up; the bus drops a message for
    a node without a link, so they count as linked only after a PONG on it."""
    net = joined(3)
    c = net.nodes[7003]
    conf, c_id = c.to_conf(), c.my_id
    c2 = Membership(c_id, "127.0.0.1", 7003, random.Random(9), net.now_ms, TIMEOUT_MS)
    c2.load_conf(nodes_conf.parse(nodes_conf.render(conf)), net.now_ms)
    others = {m.my_id for p, m in net.nodes.items() if p != 7003}
    view = mb.snapshot(c2)
    assert {p.node_id for p in mb.peers(view) if p.reachable} == others
    assert linked_peers(c2) == set()
    a = c2.nodes[net.nodes[7001].my_id]
    c2.link_connected(a, net.now_ms)
    assert linked_peers(c2) == set()  # connected, no PONG yet
    c2.dirty = False
    pong = net.nodes[7001].on_ping(c2.make_ping(a), False, "127.0.0.1", "127.0.0.1",
                                   net.now_ms)
    assert pong is not None
    c2.on_pong(a, pong, net.now_ms + 1)
    assert linked_peers(c2) == {a.node_id} and c2.dirty  # republished to the workers
    c2.dirty = False
    c2.link_lost(a)
    assert linked_peers(c2) == set() and c2.dirty
    assert a.node_id in {p.node_id for p in mb.peers(mb.snapshot(c2)) if p.reachable}


def test_lost_link_unlinks_until_a_pong_on_the_new_one() -> None:
    """A peer that restarts within the node timeout stays reachable, but the
    PONGs of the old link do not count for the new one."""
    net = joined(2)
    a, b = net.nodes[7001], net.nodes[7002]
    assert linked_peers(a) == {b.my_id}
    node = a.nodes[b.my_id]
    a.link_lost(node)
    net.now_ms += 10
    a.link_connected(node, net.now_ms)
    assert node.reachable and linked_peers(a) == set()
    net.run(2000)
    assert linked_peers(a) == {b.my_id}


def test_hand_built_view_counts_reachable_peers_as_linked() -> None:
    view = {"myid": "a" * 40, "nodes": [["a" * 40, "127.0.0.1", 7001, ["myself"], 0, 0, True],
                                        ["b" * 40, "127.0.0.1", 7002, [], 0, 0, False],
                                        ["c" * 40, "127.0.0.1", 7003, ["fail?"], 0, 0, True]]}
    assert [(p.reachable, p.linked) for p in mb.peers(view)] == [(True, True), (False, False)]


def test_gossip_ignores_garbage() -> None:
    net = joined(2)
    a, b = net.nodes[7001], net.nodes[7002]
    meta = b.make_ping()
    meta["gossip"] = [1, "x", ["zz", "127.0.0.1", 1, []], ["a" * 40, "not-an-ip", 7009, []],
                      ["b" * 40, "127.0.0.1", 70000, []], ["c" * 40, "127.0.0.1", 7009, "x"]]
    assert a.on_ping(meta, False, "127.0.0.1", "127.0.0.1", net.now_ms) is not None
    assert len(a.nodes) == 2
    assert a.on_ping({"id": "nope"}, True, "127.0.0.1", "127.0.0.1", net.now_ms) is None


@pytest.mark.parametrize("seed", range(5))
def test_random_meets_always_converge(seed: int) -> None:
    rng = random.Random(seed)
    net = Net(6, seed)
    ports = list(net.nodes)
    for i in range(1, len(ports)):  # a random spanning tree of MEETs, random direction
        a, b = ports[i], ports[rng.randrange(i)]
        net.meet(*((a, b) if rng.random() < 0.5 else (b, a)))
    net.run(5000)
    everyone = {m.my_id for m in net.nodes.values()}
    for port in ports:
        assert net.ids(port) == everyone, f"seed {seed} port {port}"


class PartitionNet(Net):
    """Net where a PING crosses only inside its side of a partition."""

    def __init__(self, n: int, seed: int = 1) -> None:
        super().__init__(n, seed)
        self.side: dict[int, int] = {}

    def can_reach(self, m: Membership, port: int) -> bool:
        same_side = self.side.get(m.myself.port, 0) == self.side.get(port, 0)
        return same_side and super().can_reach(m, port)


def test_partition_minority_sees_pfail_majority_sees_fail_and_heal_clears() -> None:
    net = PartitionNet(5)
    for port in range(7002, 7006):
        net.meet(7001, port)
    net.run(3000)
    minority, majority = (7001, 7002), (7003, 7004, 7005)
    for p in majority:
        net.side[p] = 1
    net.run(TIMEOUT_MS * 3)
    ids = {p: net.nodes[p].my_id for p in net.nodes}
    for p in majority:  # 3 of 5 agree: FAIL
        assert {tuple(flags_of(net.nodes[p], ids[q])) for q in minority} == {("fail",)}
    for p in minority:  # 2 of 5 cannot: PFAIL only
        assert {tuple(flags_of(net.nodes[p], ids[q])) for q in majority} == {("fail?",)}
    net.side.clear()
    net.run(2000)
    for p in net.nodes:
        assert all(not n.pfail and not n.fail for n in net.nodes[p].others()), p
        assert "cluster_reachable_nodes:4\r\n" in mb.info_text(mb.snapshot(net.nodes[p]))


def test_node_restarted_on_another_port_is_followed() -> None:
    net, conf, c_id = three_with_7003_failed_and_gone()
    c2 = net.add(7009, c_id)  # same ID and peers, new port
    c2.load_conf(conf, net.now_ms)
    net.run(3000)
    for p in (7001, 7002):
        node = net.nodes[p].nodes[c_id]
        assert (node.port, node.flags()) == (7009, []), p


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 70000) | st.text(max_size=45)
    | st.sampled_from(["a" * 40, "fail?", "fail", "noaddr", "127.0.0.1"]),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=6),
    max_leaves=30)
metas = st.dictionaries(st.sampled_from(["id", "port", "leaving", "gossip", "x"]), json_values,
                        max_size=5)


_JOINED_2 = joined(2)  # copied for every example: building it is most of the cost


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["ping", "meet", "pong", "fail"]), metas), max_size=8))
def test_any_message_is_handled_without_exception(msgs: list[tuple[str, dict]]) -> None:
    net = copy.deepcopy(_JOINED_2)
    a, b = net.nodes[7001], net.nodes[7002]
    node_b = a.nodes[b.my_id]
    for kind, meta in msgs:
        if kind in ("ping", "meet"):
            a.on_ping(meta, kind == "meet", "127.0.0.1", "127.0.0.1", net.now_ms)
        elif kind == "pong":
            a.on_pong(node_b, meta, net.now_ms)
        else:
            a.on_fail(b.my_id, meta, net.now_ms)
    a.tick(net.now_ms + 10_000)
    view = mb.snapshot(a)
    mb.nodes_text(view), mb.info_text(view), mb.hello_reply(view)
    assert a.myself.node_id in a.nodes and len(a.nodes) <= mb.nodes_max


def test_explicit_meet_lifts_the_forget_ban() -> None:
    net = joined(3)
    a, c = net.nodes[7001], net.nodes[7003]
    assert a.forget(c.my_id, net.now_ms) is None
    net.run(1000)
    assert c.my_id not in a.nodes
    net.meet(7001, 7003)
    net.run(1000)
    assert c.my_id in a.nodes and not a.nodes[c.my_id].handshake
