"""The cluster bus over real loopback sockets.

First part: three ``ClusterBus`` instances in one event loop (real TCP, real
nodes.conf files), which checks the bus on its own. Second part: real disque-mp
node processes (tests/nodeproc.py) joined with CLUSTER MEET.
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hiredis
import pytest
import redis
import uvloop

from bus import frames, nodes_conf
from bus import membership as mb
from bus.agent import AGENT_CMD, AGENT_HELLO
from bus.agent import socket_name as agent_socket_name
from bus.hostbus import K_HANDSHAKE, K_PING, ClusterBus
from disque_mp.node import errors
from disque_mp.node.commands import cluster as cmd_cluster
from disque_mp.node.config import Config
from tests.nodeproc import NodeProc, free_port, port_free
from workers.ids import slot_of
from workers.replies import ERR_SYNTAX, OK, Error, Status

pytestmark = pytest.mark.integration


def job_id_for(slot: int) -> str:
    """A well-formed job ID carrying ``slot`` (the bus checks job messages' shapes)."""
    return "D-00000000-" + base64.b64encode(slot.to_bytes(2, "big") + bytes(16)).decode() + "-0001"


wait_s = 20.0  # generous: other engineers' tests share the 2 cores


async def until(cond: Callable[[], bool], what: str, timeout_s: float = wait_s) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class Host:
    def __init__(self, tmp: Path, name: str, timeout_ms: int = 1000, workers: int = 3) -> None:
        self.cfg = Config(port=free_port(), bind="127.0.0.1",
                          cluster_config_file=str(tmp / f"{name}.conf"),
                          cluster_node_timeout=timeout_ms)
        nc, _ = nodes_conf.load_or_create(self.cfg.cluster_config_file, "127.0.0.1", self.cfg.port)
        self.received: list[tuple[int, str, str, int, dict[str, Any], list[bytes]]] = []
        self.views: list[dict[str, Any]] = []
        self.bus = ClusterBus(self.cfg, nc.node_id, self.deliver, self.views.append, workers,
                              random.Random(name))

    def deliver(self, index: int, sender: str, kind: str, slot: int, meta: dict[str, Any],
                bodies: list[bytes]) -> None:
        self.received.append((index, sender, kind, slot, meta, bodies))

    def knows(self, *others: Host) -> bool:
        m = self.bus.m
        return all(o.bus.my_id in m.nodes and not m.nodes[o.bus.my_id].handshake
                   and m.nodes[o.bus.my_id].reachable for o in others)

    def flags(self, other: Host) -> list[str]:
        return self.bus.m.nodes[other.bus.my_id].flags()


LOOPS = ["uvloop", "asyncio"]  # workers run uvloop; plain asyncio keeps us portable


def run_in(loop_kind: str, coro: Any) -> None:
    if loop_kind == "uvloop":
        uvloop.run(coro)
    else:
        asyncio.run(coro)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_bus_mesh_jobs_failure_and_restart(tmp_path: Path, loop_kind: str) -> None:
    run_in(loop_kind, _bus_scenario(tmp_path))


async def _bus_scenario(tmp: Path) -> None:
    a, b, c = Host(tmp, "a"), Host(tmp, "b"), Host(tmp, "c")
    for h in (a, b, c):
        await h.bus.start()
    try:
        a.bus.meet("127.0.0.1", b.cfg.port)
        c.bus.meet("127.0.0.1", b.cfg.port)  # the other direction for C
        await until(lambda: a.knows(b, c) and b.knows(a, c) and c.knows(a, b), "full mesh")
        info = mb.info_text(a.bus.view())
        assert "cluster_known_nodes:3\r\n" in info and "cluster_reachable_nodes:2\r\n" in info
        assert a.views[-1]["myid"] == a.bus.my_id and len(a.views[-1]["nodes"]) == 3
        # the workers learn which peers our links have a PONG on (jobs sent are written)
        await until(lambda: set(a.views[-1]["linked"]) == {b.bus.my_id, c.bus.my_id}, "linked")

        # a job message lands at the owner of its slot, with raw bodies
        body = bytes(range(256)) * 10
        assert a.bus.send(c.bus.my_id, "REPLJOB", 7, {"id": "x"}, [body]) == 1
        await until(lambda: len(c.received) == 1, "REPLJOB at C")
        assert c.received[0] == (7 % 3, a.bus.my_id, "REPLJOB", 7, {"id": "x"}, [body])
        assert a.bus.send("*", "PAUSE", slot_of(b"q"), {"f": 0}, [b"q"]) == 2
        await until(lambda: len(b.received) == 1 and len(c.received) == 2, "broadcast")
        assert a.bus.send("f" * 40, "GOTJOB", 1, {}) == 0  # unknown node: dropped

        # nodes.conf on disk follows the table
        saved = nodes_conf.load(a.cfg.cluster_config_file)
        assert saved is not None
        assert {p.node_id for p in saved.peers} == {b.bus.my_id, c.bus.my_id}

        # C goes away: PFAIL then FAIL (majority of 3) on A and B
        c_id, c_port = c.bus.my_id, c.cfg.port
        await c.bus.close()
        # the link is gone: unlinked at once, before failure detection says anything
        seen = len(a.views)
        await until(lambda: c_id not in a.views[-1]["linked"], "C unlinked")
        unlinked = next(v for v in a.views[seen:] if c_id not in v["linked"])
        assert [p.reachable for p in mb.peers(unlinked) if p.node_id == c_id] == [True]
        await until(lambda: a.flags(c) == ["fail"] and b.flags(c) == ["fail"], "C failing")

        # C comes back with its nodes.conf: same ID, flags cleared everywhere
        c2 = Host(tmp, "c")
        assert c2.cfg.cluster_config_file == c.cfg.cluster_config_file
        c2.cfg.port = c_port
        nc, created = nodes_conf.load_or_create(c2.cfg.cluster_config_file, "127.0.0.1", c_port)
        assert not created and nc.node_id == c_id
        c2.bus = ClusterBus(c2.cfg, nc.node_id, c2.deliver, c2.views.append, 3)
        c = c2
        await c.bus.start()
        # its peers from nodes.conf: reachable in its first view, linked only after a PONG
        first = mb.peers(c.views[0])
        assert [(p.reachable, p.linked) for p in first] == [(True, False), (True, False)]
        await until(lambda: a.flags(c) == [] and b.flags(c) == [] and c.knows(a, b), "C back")
        await until(lambda: set(c.views[-1]["linked"]) == {a.bus.my_id, b.bus.my_id},
                    "C linked")

        # FORGET on A: gone and stays gone although B and C still know A and it
        assert a.bus.forget(c_id) is None
        await asyncio.sleep(1.0)
        assert c_id not in a.bus.m.nodes

        # LEAVING on B reaches the others
        b.bus.set_leaving(True)
        await until(lambda: a.flags(b) == ["leaving"] and c.flags(b) == ["leaving"], "leaving")
    finally:
        for h in (a, b, c):
            await h.bus.close()


class AgentHost:
    """One host of 2 workers: two ClusterAgents (worker 0 owns the bus) in this loop."""

    def __init__(self, tmp: Path, name: str, secret: str = "") -> None:
        self.cfg = Config(port=free_port(), bind="127.0.0.1", workers=2,
                          cluster_config_file=str(tmp / f"{name}.conf"),
                          cluster_node_timeout=1000, cluster_secret_file=secret)
        nc, _ = nodes_conf.load_or_create(self.cfg.cluster_config_file, "127.0.0.1", self.cfg.port)
        self.node_id = nc.node_id
        self.got: list[list[tuple[str, str, int, dict[str, Any], list[bytes]]]] = [[], []]
        self.agents = [
            cmd_cluster.make_agent(self.cfg, i, nc.node_id, 2, self._on_message(i))
            for i in range(2)
        ]

    def _on_message(self, i: int) -> Callable[..., None]:
        return lambda *msg: self.got[i].append(msg)

    async def start(self) -> None:
        for agent in self.agents:
            await agent.start()

    async def close(self) -> None:
        for agent in reversed(self.agents):
            await agent.close()


async def run_cluster(agent: Any, *words: str) -> Any:
    fut = asyncio.get_running_loop().create_future()
    cmd_cluster.cluster(agent, [w.encode() for w in words], fut.set_result)
    return await asyncio.wait_for(fut, wait_s)


@pytest.mark.parametrize("loop_kind", LOOPS)
@pytest.mark.parametrize("secret", [False, True], ids=["open", "secret"])
def test_agents_route_commands_views_and_job_messages(tmp_path: Path, loop_kind: str,
                                                      secret: bool) -> None:
    path = ""
    if secret:  # the same scenario with authenticated bus and data links
        (tmp_path / "secret").write_text("the secret of both hosts of this test\n")
        path = str(tmp_path / "secret")
    run_in(loop_kind, _agent_scenario(tmp_path, path))


async def _agent_scenario(tmp: Path, secret: str) -> None:
    a, b = AgentHost(tmp, "a", secret), AgentHost(tmp, "b", secret)
    await a.start()
    await b.start()
    try:
        a1 = a.agents[1]
        await until(lambda: a1.to_owner is not None, "worker 1 linked to worker 0")
        assert await run_cluster(a1, "MEET", "127.0.0.1", "notaport") == Error(
            "ERR Invalid TCP port specified: notaport")
        assert await run_cluster(a1, "MEET", "localhost", "7711") == Error(
            "ERR Invalid node address specified: localhost:7711")
        assert await run_cluster(a1, "BOGUS") == errors.ERR_CLUSTER
        assert await run_cluster(a1, "NODES", "x") == errors.ERR_CLUSTER
        assert await run_cluster(a1, "MYID") == a.node_id.encode()
        assert await run_cluster(a1, "MEET", "127.0.0.1", str(b.cfg.port)) == OK

        def both_know() -> bool:
            return all(len([n for n in ag.view["nodes"] if "handshake" not in n[3]]) == 2
                       for h in (a, b) for ag in h.agents)

        await until(both_know, "views on every worker")
        hello = cmd_cluster.hello(a1)
        assert hello[:2] == [1, a.node_id.encode()]
        assert [e[0].decode() for e in hello[2:]] == [a.node_id, b.node_id]
        assert all(e[3] == b"1" for e in hello[2:])
        text = (await run_cluster(a1, "NODES")).decode()
        assert f"{a.node_id} 127.0.0.1:{a.cfg.port} myself 0 0 connected\n" in text
        info = (await run_cluster(a1, "INFO")).decode()
        assert "cluster_known_nodes:2\r\ncluster_reachable_nodes:1\r\ncluster_size:2\r\n" in info

        # a Send from worker 1 of A reaches the owner of the slot on B, bodies intact
        a1.send(b.node_id, "REPLJOB", 3, {"j": 1}, [b"\x00body\xff"])
        a.agents[0].send(b.node_id, "GOTJOB", 8, {"j": job_id_for(8)})
        await until(lambda: len(b.got[1]) == 1 and len(b.got[0]) == 1, "job messages at B")
        assert b.got[1][0] == (a.node_id, "REPLJOB", 3, {"j": 1}, [b"\x00body\xff"])
        assert b.got[0][0] == (a.node_id, "GOTJOB", 8, {"j": job_id_for(8)}, [])

        # once A's worker 1 has its own data link to B, its messages skip both worker 0s:
        # B's worker 1 reads them (slot 5) and passes on what is not its own (slot 10)
        assert a1.data_out is not None
        await until(lambda: a1.data_out is not None and a1.data_out.usable(b.node_id) is not None,
                    "data link ready")
        assert len(b.agents[1].data_in) == 1 and not b.agents[0].data_in
        assert b.agents[0].bus is not None
        relayed_before = b.agents[0].bus.job_frames_received
        for i in range(100):
            a1.send(b.node_id, "REPLJOB", 5, {"i": i}, [b"x" * i])
        a1.send(b.node_id, "GOTJOB", 10, {"j": job_id_for(10), "i": -1})
        await until(lambda: len(b.got[1]) == 101 and len(b.got[0]) == 2, "direct messages")
        assert [m[3]["i"] for m in b.got[1][1:]] == list(range(100))  # in order
        assert b.got[1][-1][4] == [b"x" * 99]
        assert b.got[0][1] == (a.node_id, "GOTJOB", 10, {"j": job_id_for(10), "i": -1}, [])
        assert b.agents[0].bus.job_frames_received == relayed_before  # none via B's bus link

        # LEAVING set through worker 1 of B: HELLO on every worker of A shows 100
        assert await run_cluster(b.agents[1], "LEAVING") == Status("no")
        assert await run_cluster(b.agents[1], "LEAVING", "maybe") == ERR_SYNTAX
        assert await run_cluster(b.agents[1], "LEAVING", "yes") == OK
        assert await run_cluster(b.agents[0], "LEAVING") == Status("yes")

        def a_sees_leaving() -> bool:
            return all({e[0]: e[3] for e in cmd_cluster.hello(ag)[2:]}.get(b.node_id.encode())
                       == b"100" for ag in a.agents)

        await until(a_sees_leaving, "leaving priority on A")
        assert await run_cluster(a1, "FORGET", a.node_id) == Error(
            "ERR I tried hard but I can't forget myself...")
        assert await run_cluster(a1, "FORGET", "0" * 40) == Error("ERR Unknown node " + "0" * 40)
        assert await run_cluster(a1, "RESET", "medium") == ERR_SYNTAX
        assert await run_cluster(a1, "FORGET", b.node_id) == OK
        await until(lambda: len(a1.view["nodes"]) == 1, "forget seen by worker 1")
        assert await run_cluster(a1, "RESET", "HARD") == OK
        new_id = (await run_cluster(a1, "MYID")).decode()
        assert new_id != a.node_id and mb.is_node_id(new_id)
        saved = nodes_conf.load(a.cfg.cluster_config_file)
        assert saved is not None and saved.node_id == new_id
    finally:
        await a.close()
        await b.close()


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_job_messages_of_one_turn_travel_in_one_frame(tmp_path: Path, loop_kind: str) -> None:
    run_in(loop_kind, _batch_scenario(tmp_path))


async def _batch_scenario(tmp: Path) -> None:
    a, b = Host(tmp, "a"), Host(tmp, "b")
    for h in (a, b):
        await h.bus.start()
    try:
        a.bus.meet("127.0.0.1", b.cfg.port)
        await until(lambda: a.knows(b) and b.knows(a), "A and B")
        await until(lambda: b.bus.my_id in a.views[-1]["linked"], "A linked to B")
        link = next(iter(a.bus.out.values()))
        assert link.batch_jobs  # B's handshake answer said it reads JOBS frames
        frames_before = b.bus.m.stats_received
        marks: list[Any] = []  # the worker's hook around a frame's messages
        b.bus.batch = lambda begin: marks.append(("begin" if begin else "end", len(b.received)))
        meta = {"j": "x"}
        for i in range(50):  # one loop turn; the caller may reuse its dict
            meta["n"] = i
            assert a.bus.send(b.bus.my_id, "REPLJOB", i, meta, [b"%d" % i]) == 1
        await until(lambda: len(b.received) == 50, "50 messages at B")
        assert [(m[2], m[3], m[4]["n"], m[5]) for m in b.received] == \
            [("REPLJOB", i, i, [b"%d" % i]) for i in range(50)]
        assert b.bus.m.stats_received - frames_before <= 3  # one JOBS frame (and a PING or two)
        assert marks[0] == ("begin", 0) and marks[-1] == ("end", 50) and len(marks) <= 4
        b.bus.batch = None
        # to a peer that does not read them (an older node), one JOB frame a message
        link.batch_jobs = False
        frames_before = b.bus.m.stats_received
        for i in range(10):
            a.bus.send(b.bus.my_id, "REPLJOB", i, {}, [b"r"])
        await until(lambda: len(b.received) == 60, "10 more at B")
        assert b.bus.m.stats_received - frames_before >= 10
    finally:
        for h in (a, b):
            await h.bus.close()


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_bus_port_survives_garbage(tmp_path: Path, loop_kind: str) -> None:
    run_in(loop_kind, _garbage_scenario(tmp_path))


async def _closed_after(port: int, data: bytes) -> bool:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        while await asyncio.wait_for(reader.read(65536), wait_s):
            pass  # the handshake frame it sends first, then EOF
        return True
    finally:
        writer.close()


async def _garbage_scenario(tmp: Path) -> None:
    a, b = Host(tmp, "a"), Host(tmp, "b")
    await a.bus.start()
    await b.bus.start()
    try:
        bus_port = a.cfg.port + 10000
        assert await _closed_after(bus_port, b"GET / HTTP/1.0\r\n\r\n")
        assert await _closed_after(bus_port, frames.encode(K_HANDSHAKE, {"proto": 99}))
        assert await _closed_after(bus_port, frames.encode(K_PING, {"id": "x"}))  # no handshake
        hs = frames.encode(K_HANDSHAKE, {"proto": 1, "id": "e" * 40, "port": 1})
        assert await _closed_after(bus_port, hs + b"DQ\x01\x63" + b"\x00" * 6)  # kind 99
        bad_meta = hs + b"DQ\x01\x02\x00\x00\x00\x02\x00\x00[]"  # meta is a list
        assert await _closed_after(bus_port, bad_meta)
        a.bus.meet("127.0.0.1", b.cfg.port)
        await until(lambda: a.knows(b) and b.knows(a), "bus still works")
        assert "e" * 40 not in a.bus.m.nodes
    finally:
        await a.bus.close()
        await b.bus.close()


# ---- real node processes --------------------------------------------------------------

NODE_TIMEOUT_MS = 2000
real_wait_s = 30.0  # 3 nodes x 2 workers starting on 2 busy cores


def cluster(node: NodeProc, *words: str) -> Any:
    r = node.client(protocol=2)
    try:
        return r.execute_command("CLUSTER", *words)
    finally:
        r.close()


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nodes_table(node: NodeProc) -> dict[str, list[str]]:
    """CLUSTER NODES as {id: [addr, flags, ping, pong, link]}."""
    out = {}
    for line in text(cluster(node, "NODES")).splitlines():
        words = line.split()
        assert len(words) == 6, line
        out[words[0]] = words[1:]
    return out


def info(node: NodeProc) -> dict[str, str]:
    lines = text(cluster(node, "INFO")).split("\r\n")
    assert lines[-1] == ""
    return dict(line.split(":", 1) for line in lines[:-1])


def hellos(node: NodeProc, connections: int = 4) -> list[dict[str, str]]:
    """HELLO on several connections (the kernel spreads them over the workers):
    {id: priority} per connection."""
    out = []
    for _ in range(connections):
        r = node.client(protocol=2)
        try:
            reply = r.execute_command("HELLO")
        finally:
            r.close()
        assert reply[0] == 1 and len(reply[1]) == 40
        out.append({text(e[0]): text(e[3]) for e in reply[2:]})
    return out


def test_three_real_nodes(tmp_path: Path) -> None:
    conf = {"cluster-node-timeout": NODE_TIMEOUT_MS}
    nodes = [NodeProc(tmp_path / name, workers=2, conf=conf) for name in "abc"]
    try:
        for n in nodes:
            n.start()
        _three_real_nodes(*nodes)
    finally:
        for n in nodes:
            n.stop()


def _three_real_nodes(a: NodeProc, b: NodeProc, c: NodeProc) -> None:
    ids = {n.port: text(cluster(n, "MYID")) for n in (a, b, c)}
    assert cluster(a, "MEET", "127.0.0.1", str(b.port)) in (b"OK", True, "OK")
    assert cluster(c, "MEET", "127.0.0.1", str(b.port)) in (b"OK", True, "OK")

    def meshed(n: NodeProc) -> bool:
        i = info(n)
        table = nodes_table(n)
        return (i["cluster_known_nodes"] == "3" and i["cluster_reachable_nodes"] == "2"
                and all(v[1] in ("myself", "noflags") for v in table.values()))

    for n in (a, b, c):
        n.wait_for(lambda n=n: meshed(n), real_wait_s, "full mesh")
        assert set(nodes_table(n)) == set(ids.values())
        assert info(n)["cluster_size"] == "3" and info(n)["cluster_state"] == "ok"
        table = nodes_table(n)
        assert table[ids[n.port]] == [f"127.0.0.1:{n.port}", "myself", "0", "0", "connected"]
        for node_id, (addr, _flags, _ping, pong, link) in table.items():
            if node_id != ids[n.port]:  # epoch ms, as the reference shows them
                assert int(pong) > 1_600_000_000_000 and link == "connected", addr
        n.wait_for(lambda n=n: all(h == dict.fromkeys(ids.values(), "1") for h in hellos(n)),
                   real_wait_s, "HELLO on every worker")
    saved = nodes_conf.load(str(c.dir / "nodes.conf"))
    assert saved is not None and {p.node_id for p in saved.peers} == {ids[a.port], ids[b.port]}

    # kill -9 C: A and B flag it (fail? then fail: 2 of 3 is a majority)
    c_id = ids[c.port]
    c.kill_group()
    for n in (a, b):
        n.wait_for(lambda n=n: nodes_table(n)[c_id][1] == "fail", real_wait_s, "C fail")
        assert info(n)["cluster_reachable_nodes"] == "1"
        assert all(h[c_id] == "10" for h in hellos(n))

    # restart C with the same dir: same ID, it dials its peers, flags clear
    c.start()
    assert text(cluster(c, "MYID")) == c_id
    for n in (a, b, c):
        n.wait_for(lambda n=n: meshed(n), real_wait_s, "C rejoined")

    # LEAVING on B: priority 100 in HELLO on every node, every worker
    assert cluster(b, "LEAVING") in (b"no", "no")
    assert cluster(b, "LEAVING", "yes") in (b"OK", True, "OK")
    assert cluster(b, "LEAVING") in (b"yes", "yes")
    for n in (a, b, c):
        n.wait_for(lambda n=n: all(h[ids[b.port]] == "100" for h in hellos(n)), real_wait_s,
                   "leaving in HELLO")
        assert nodes_table(n)[ids[b.port]][1].endswith("leaving")
    assert cluster(b, "LEAVING", "no") in (b"OK", True, "OK")

    # FORGET C on A: gone, and gossip from B (which still knows C) keeps it gone
    assert cluster(a, "FORGET", c_id) in (b"OK", True, "OK")
    assert c_id not in nodes_table(a)
    time.sleep(NODE_TIMEOUT_MS / 1000)  # several gossip rounds from B and pings from C
    assert c_id not in nodes_table(a)
    assert info(a)["cluster_known_nodes"] == "2"


def test_a_meet_that_cannot_work_says_why_in_the_log(tmp_path: Path) -> None:
    """CLUSTER MEET answers OK (as the reference does); then the log names the address
    dialled, the cause and the bus port rule, for a MEET to a bus port and for a MEET
    to a port whose bus port accepts connections but is no disque node."""
    a = NodeProc(tmp_path / "a", workers=1, conf={"cluster-node-timeout": NODE_TIMEOUT_MS})
    wrong = free_port()  # its bus port: a listener that accepts and never answers
    with socket.create_server(("127.0.0.1", wrong + 10000)) as silent:
        silent.listen(8)
        try:
            a.start()
            client = next(p for p in (free_port() for _ in range(100)) if port_free(p + 20000))
            bus = client + 10000  # a bus port given as if it were a client port: its bus
            # port, bus + 10000, is one nobody listens on
            assert cluster(a, "MEET", "127.0.0.1", str(bus)) in (b"OK", True, "OK")
            assert cluster(a, "MEET", "127.0.0.1", str(wrong)) in (b"OK", True, "OK")
            a.wait_for(lambda: a.log_text().count("given up after") == 2, real_wait_s,
                       "both MEETs given up")
            log = a.log_text()
            assert (f"CLUSTER MEET 127.0.0.1 {bus}: cannot reach its cluster bus at "
                    f"127.0.0.1:{bus + 10000}") in log, log
            assert f"if {bus} is the peer's bus port, its client port is {client}" in log
            assert (f"CLUSTER MEET 127.0.0.1 {wrong} given up after") in log
            assert (f"its bus port {wrong + 10000} accepted the connection but no disque "
                    "node answered there") in log
            assert f"its client port is {wrong - 10000}" not in log  # a bus answered there
            assert info(a)["cluster_known_nodes"] == "1"  # both entries gone
        finally:
            a.stop()


def test_node_timeout_config_set_at_runtime(tmp_path: Path) -> None:
    conf = {"cluster-node-timeout": 600_000}  # ten minutes: only CONFIG SET can make it fail
    a = NodeProc(tmp_path / "a", workers=2, conf=conf)
    b = NodeProc(tmp_path / "b", workers=1, conf=conf)
    try:
        a.start()
        b.start()
        cluster(a, "MEET", "127.0.0.1", str(b.port))
        a.wait_for(lambda: info(a)["cluster_reachable_nodes"] == "1", real_wait_s, "meet")
        b_id = text(cluster(b, "MYID"))
        r = a.client(protocol=2)
        for _ in range(4):  # every worker, whichever the connection lands on
            assert r.execute_command("CONFIG", "SET", "cluster-node-timeout", "1000") in (b"OK", True)
        r.close()
        b.kill_group()
        a.wait_for(lambda: nodes_table(a)[b_id][1] == "fail?", real_wait_s, "B fail?")
        assert all(h[b_id] == "10" for h in hellos(a))
    finally:
        a.stop()
        b.stop()


def worker_pid(node: NodeProc, index: int) -> int:
    found = re.findall(rf"Worker W{index} started, pid (\d+)", node.log_text())
    assert found, node.output()
    return int(found[-1])


def test_worker0_crash_keeps_membership(tmp_path: Path) -> None:
    """Worker 0 owns the bus: SIGKILL it, the supervisor restarts it, it reloads
    nodes.conf and the node is back in the cluster with its ID; the other workers
    reconnect to it and answer CLUSTER again."""
    conf = {"cluster-node-timeout": NODE_TIMEOUT_MS}
    a = NodeProc(tmp_path / "a", workers=2, conf=conf)
    b = NodeProc(tmp_path / "b", workers=2, conf=conf)
    try:
        a.start()
        b.start()
        a_id, b_id = text(cluster(a, "MYID")), text(cluster(b, "MYID"))
        cluster(a, "MEET", "127.0.0.1", str(b.port))
        for n in (a, b):
            n.wait_for(lambda n=n: info(n)["cluster_reachable_nodes"] == "1", real_wait_s, "meet")
        old = worker_pid(a, 0)
        os.kill(old, signal.SIGKILL)
        a.wait_for(lambda: worker_pid(a, 0) != old, real_wait_s, "worker 0 restarted")

        def back() -> bool:
            try:
                return (all(text(cluster(a, "MYID")) == a_id for _ in range(4))
                        and info(a)["cluster_reachable_nodes"] == "1"
                        and nodes_table(b)[a_id][1] == "noflags")
            except redis.ResponseError:
                return False  # worker 0 still starting: the other worker says so

        a.wait_for(back, real_wait_s, "A back in the cluster")
        assert b_id in nodes_table(a)
    finally:
        a.stop()
        b.stop()


def raw(node: NodeProc, payload: bytes) -> bytes:
    """Send one raw RESP command, return the exact bytes of its one reply."""
    reader = hiredis.Reader()
    out = b""
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        s.sendall(payload)
        while True:
            chunk = s.recv(65536)
            assert chunk, f"connection closed after {out!r}"
            out += chunk
            reader.feed(chunk)
            if reader.gets() is not False:
                return out


def test_reference_03_cluster_texts_raw(tmp_path: Path) -> None:
    """tests/reference/03: the exact bytes of CLUSTER replies on a 2-node cluster."""
    a = NodeProc(tmp_path / "a", workers=2)
    b = NodeProc(tmp_path / "b", workers=1)
    try:
        a.start()
        b.start()
        a_id, b_id = text(cluster(a, "MYID")), text(cluster(b, "MYID"))
        assert raw(a, b"CLUSTER MEET 127.0.0.1 notaport\r\n") == \
            b"-ERR Invalid TCP port specified: notaport\r\n"
        assert raw(a, b"CLUSTER BOGUS\r\n") == \
            b"-ERR Wrong CLUSTER subcommand or number of arguments\r\n"
        assert raw(a, b"CLUSTER\r\n") == b"-ERR wrong number of arguments for 'cluster' command\r\n"
        assert raw(a, f"CLUSTER MEET 127.0.0.1 {b.port}\r\n".encode()) == b"+OK\r\n"
        a.wait_for(lambda: info(a)["cluster_reachable_nodes"] == "1", real_wait_s, "meet")
        assert raw(a, b"CLUSTER MYID\r\n") == f"$40\r\n{a_id}\r\n".encode()
        assert raw(a, b"CLUSTER LEAVING\r\n") == b"+no\r\n"
        assert raw(a, b"CLUSTER LEAVING yes\r\n") == b"+OK\r\n"
        me = f"*4\r\n$40\r\n{a_id}\r\n$9\r\n127.0.0.1\r\n${len(str(a.port))}\r\n{a.port}\r\n"
        peer = f"*4\r\n$40\r\n{b_id}\r\n$9\r\n127.0.0.1\r\n${len(str(b.port))}\r\n{b.port}\r\n"
        assert raw(a, b"HELLO\r\n") == \
            f"*4\r\n:1\r\n$40\r\n{a_id}\r\n{me}$3\r\n100\r\n{peer}$1\r\n1\r\n".encode()
        assert raw(a, b"CLUSTER LEAVING no\r\n") == b"+OK\r\n"
        nodes = raw(a, b"CLUSTER NODES\r\n").split(b"\r\n", 1)[1].decode()
        lines = nodes.split("\n")
        assert lines[0] == f"{a_id} 127.0.0.1:{a.port} myself 0 0 connected"
        assert re.fullmatch(rf"{b_id} 127\.0\.0\.1:{b.port} noflags \d+ \d+ connected", lines[1])
        reply = raw(a, b"CLUSTER INFO\r\n")
        assert re.fullmatch(
            rb"\$\d+\r\ncluster_state:ok\r\ncluster_known_nodes:2\r\ncluster_reachable_nodes:1"
            rb"\r\ncluster_size:2\r\ncluster_stats_messages_sent:\d+\r\n"
            rb"cluster_stats_messages_received:\d+\r\n\r\n", reply), reply
    finally:
        a.stop()
        b.stop()


CHILD_CONNECT = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
try:
    s.connect(sys.argv[1])
except PermissionError:
    print("denied")  # the node's private socket directory keeps us out
    raise SystemExit(0)
try:
    s.sendall(sys.stdin.buffer.read())
    print("eof" if s.recv(65536) == b"" else "data")
except (BrokenPipeError, ConnectionResetError):
    print("eof")  # closed on us before or while we wrote
"""


CHILD_PYTHON = "/usr/bin/python3"  # readable by any user, unlike the venv under /root


@pytest.mark.skipif(os.getuid() != 0 or not os.access(CHILD_PYTHON, os.X_OK),
                    reason="needs root (to run a client as another user) and /usr/bin/python3")
def test_agent_socket_refuses_other_users(tmp_path: Path) -> None:
    uvloop.run(_other_user_scenario(tmp_path))


async def _other_user_scenario(tmp: Path) -> None:
    a = AgentHost(tmp, "a")
    await a.start()
    try:
        attack = frames.encode(AGENT_HELLO, {"w": 1}) + frames.encode(
            AGENT_CMD, {"r": 1, "a": ["RESET", "HARD"]})
        name = agent_socket_name(a.cfg.port, a.node_id)
        def attacker() -> bytes:
            done = subprocess.run([CHILD_PYTHON, "-c", CHILD_CONNECT, name], input=attack,
                                  capture_output=True, user=65534, timeout=wait_s, check=True)
            return done.stdout

        out = await asyncio.get_running_loop().run_in_executor(None, attacker)
        assert out.strip() == b"denied"
        assert await run_cluster(a.agents[1], "MYID") == a.node_id.encode()
    finally:
        await a.close()
