"""Jobs across real disque-mp nodes (tests/nodeproc.py) joined with CLUSTER MEET:
replication, consumption elsewhere, federation, PAUSE bcast, LEAVING, SIGKILL
and restart, a job surviving the crash of R-1 of its R holders."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.nodeproc import NodeProc, form_cluster, reachable_nodes, wait_until
from tests.nodeproc import unique_queue as _q
from tests.rawclient import Status, connect_to_worker

pytestmark = pytest.mark.integration

form_timeout_s = 60.0  # cold nodes on 2 cores shared with other test runs
wait_s = 30.0
node_timeout_ms = 2000


def _raw(node: NodeProc, timeout_s: float = 20) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=node.port, protocol=2, socket_timeout=timeout_s)


def _wait_for(predicate: Any, what: str, timeout_s: float = wait_s) -> None:
    wait_until(predicate, timeout_s, what)


def _start(base: Path, count: int, **conf: Any) -> list[NodeProc]:
    nodes = [NodeProc(base / f"n{i}", workers=2,
                      conf={"cluster-node-timeout": node_timeout_ms, **conf})
             for i in range(count)]
    for n in nodes:
        n.start()
    return nodes


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProc]]:
    nodes = _start(Path(tmp_path_factory.mktemp("cluster-jobs")), 3)
    try:
        form_cluster(nodes, form_timeout_s)
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def _show(node: NodeProc, job_id: str) -> dict[str, Any] | None:
    r = _raw(node).execute_command("SHOW", job_id)
    if r is None:
        return None
    return {k.decode(): v for k, v in zip(r[::2], r[1::2], strict=True)}


class Blocked(threading.Thread):
    """A GETJOB blocked on ``node`` in a thread (the reply lands in ``reply``)."""

    def __init__(self, node: NodeProc, queue: str, timeout_ms: int = 20_000,
                 count: int = 1) -> None:
        super().__init__(daemon=True)
        self.conn = _raw(node, timeout_s=timeout_ms / 1000 + 20)
        self.args = ["GETJOB", "TIMEOUT", timeout_ms, "COUNT", count, "FROM", queue]
        self.reply: Any = None
        self.error: Exception | None = None
        self.conn.ping()  # connected before the test goes on

    def run(self) -> None:
        try:
            self.reply = self.conn.execute_command(*self.args)
        except redis.RedisError as e:
            self.error = e


def _blocked_clients(node: NodeProc) -> int:
    return int(_raw(node).info("clients")["blocked_clients"])


def test_replicate_3_shows_everywhere_and_is_consumed_on_another_node(three: list[NodeProc]) -> None:
    a, b, c = three
    q = _q("r3")
    jid = _raw(a).execute_command("ADDJOB", q, "hello", 5000, "REPLICATE", 3).decode()
    shows = [_show(n, jid) for n in three]
    assert all(s is not None for s in shows)
    assert [s["state"] for s in shows if s] == [b"queued", b"active", b"active"]
    assert all(len(s["nodes-delivered"]) == 3 for s in shows if s)
    got = _raw(b).execute_command("GETJOB", "TIMEOUT", 20000, "FROM", q)
    assert got[0][1].decode() == jid and got[0][2] == b"hello"
    assert _raw(b).execute_command("ACKJOB", jid) == 1
    _wait_for(lambda: all(_show(n, jid) is None for n in three), "the ACK GC on every node")


def test_plain_addjob_adds_one_job_and_answers_once(three: list[NodeProc]) -> None:
    """`ADDJOB q body 0` (default REPLICATE = cluster size, synchronous) from a
    connection held by either worker: one job, one reply, the next reply is the next
    command's. (Its fast path once fell through to the general path after deferring
    the reply: two jobs, and every later reply on the connection one behind.)"""
    a = three[0]
    for held_by in (0, 1):
        c = connect_to_worker(a.port, held_by)
        q = _q(f"plain{held_by}")
        for i in range(20):
            jid = c.call("ADDJOB", q, f"b{i}", 0)
            assert isinstance(jid, Status) and jid.startswith("D-"), jid
            assert c.call("PING") == Status("PONG")
        assert c.call("QLEN", q) == 20
        c.close()


def test_replication_levels_and_norepl(three: list[NodeProc]) -> None:
    a = three[0]
    r = _raw(a)
    q = _q("lvl")
    for n in (1, 2, 3):
        jid = r.execute_command("ADDJOB", q, "x", 5000, "REPLICATE", n).decode()
        assert sum(_show(node, jid) is not None for node in three) == n
    with pytest.raises(redis.ResponseError, match="NOREPL Not enough reachable nodes"):
        r.execute_command("ADDJOB", q, "x", 5000, "REPLICATE", 4)
    jid = r.execute_command("ADDJOB", q, "x", 0, "ASYNC").decode()  # default REPLICATE 3
    _wait_for(lambda: all(_show(node, jid) is not None for node in three), "ASYNC copies")


def test_federation_moves_a_job_to_the_blocked_consumer(three: list[NodeProc]) -> None:
    a, b, _c = three
    q = _q("fed")
    waiter = Blocked(b, q)
    waiter.start()
    _wait_for(lambda: _blocked_clients(b) == 1, "the consumer to block on B")
    jid = _raw(a).execute_command("ADDJOB", q, "moved", 5000, "REPLICATE", 1).decode()
    waiter.join(timeout=40)
    assert waiter.error is None and waiter.reply is not None, waiter.error
    assert waiter.reply[0][1].decode() == jid
    qstat = _raw(b).execute_command("QSTAT", q)
    st = {k.decode(): v for k, v in zip(qstat[::2], qstat[1::2], strict=True)}
    a_id = _raw(a).execute_command("CLUSTER", "MYID").decode()
    assert [x.decode() for x in st["import-from"]] == [a_id]
    assert st["import-rate"] >= 1


def test_pause_bcast_reaches_every_node(three: list[NodeProc]) -> None:
    q = _q("pause")
    assert _raw(three[0]).execute_command("PAUSE", q, "in", "bcast") == b"in"
    _wait_for(lambda: all(_raw(n).execute_command("PAUSE", q, "state") == b"in" for n in three),
              "the pause on every node")
    _raw(three[1]).execute_command("PAUSE", q, "none", "bcast")
    _wait_for(lambda: all(_raw(n).execute_command("PAUSE", q, "state") == b"none"
                          for n in three), "the pause cleared everywhere")


def test_leaving_drains_a_node(three: list[NodeProc]) -> None:
    a, b, c = three
    q = _q("drain")
    ids = [_raw(c).execute_command("ADDJOB", q, f"j{i}", 5000, "REPLICATE", 1).decode()
           for i in range(5)]
    waiter = Blocked(c, _q("idle"))  # released with -LEAVING when c starts leaving
    waiter.start()
    _wait_for(lambda: _blocked_clients(c) == 1, "a consumer blocked on C")
    try:
        assert _raw(c).execute_command("CLUSTER", "LEAVING", "yes") == b"OK"
        waiter.join(timeout=40)
        assert isinstance(waiter.error, redis.ResponseError)
        assert str(waiter.error).startswith("LEAVING This node is leaving the cluster")
        with pytest.raises(redis.ResponseError, match="^LEAVING"):
            _raw(c).execute_command("GETJOB", "FROM", _q("empty"))
        # External replication: C keeps no copy of what it accepts now.
        jid = _raw(c).execute_command("ADDJOB", q, "ext", 5000, "REPLICATE", 2).decode()
        assert _show(c, jid) is None
        ids.append(jid)
        got: list[str] = []
        deadline = time.monotonic() + 60
        while len(got) < len(ids) and time.monotonic() < deadline:
            r = _raw(a).execute_command("GETJOB", "TIMEOUT", 3000, "COUNT", 10, "FROM", q)
            for e in r or []:
                got.append(e[1].decode())
                _raw(a).execute_command("ACKJOB", e[1])
        assert sorted(got) == sorted(ids)
        # (other tests left replicas on C: look at this queue's jobs only)
        _wait_for(lambda: all(_show(n, j) is None for n in three for j in ids),
                  "the drained jobs gone everywhere (ACK GC)")
    finally:
        _raw(c).execute_command("CLUSTER", "LEAVING", "no")


def _registered(node: NodeProc) -> int:
    return int(_raw(node).info("jobs")["registered_jobs"])


def test_add_get_ack_run_returns_to_the_baseline(three: list[NodeProc]) -> None:
    """Acked jobs are really unregistered on every node (the reference once leaked them)."""
    a, b, c = three
    before = [_registered(n) for n in three]
    q = _q("base")
    pipe = _raw(a).pipeline(transaction=False)
    for i in range(300):
        pipe.execute_command("ADDJOB", q, f"b{i}", 5000, "REPLICATE", 3)
    ids = [x.decode() for x in pipe.execute()]
    got: list[bytes] = []
    while len(got) < len(ids):
        r = _raw(b).execute_command("GETJOB", "TIMEOUT", 20000, "COUNT", 100, "FROM", q)
        assert r, "jobs did not reach the consumer"
        batch = [e[1] for e in r]
        assert _raw(c).execute_command("ACKJOB", *batch) >= 0  # ACK on a third node
        got += batch
    assert sorted(x.decode() for x in got) == sorted(ids)
    _wait_for(lambda: all(_registered(n) <= was for n, was in zip(three, before, strict=True)),
              "registered_jobs back to the baseline on every node")


@pytest.fixture
def four(tmp_path: Path) -> Iterator[list[NodeProc]]:
    # A longer node timeout: a killed node stays "reachable" for a while, so
    # ADDJOB keeps picking it and must move on to another node every 50 ms.
    nodes = _start(tmp_path, 4)
    try:
        form_cluster(nodes, form_timeout_s)
        for n in nodes:
            _raw(n).execute_command("CONFIG", "SET", "cluster-node-timeout", 15000)
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def test_down_nodes_sigkill_restart_and_surviving_r_minus_1_crashes(four: list[NodeProc]) -> None:
    a, dead, c, d = four
    dead_id = _raw(dead).execute_command("CLUSTER", "MYID").decode()
    dead.kill_group()
    q = _q("down")
    for _ in range(8):  # the shuffle picks the dead node first in many of these
        jid = _raw(a).execute_command("ADDJOB", q, "x", 10000, "REPLICATE", 3).decode()
        holders = [n for n in (a, c, d) if _show(n, jid) is not None]
        assert len(holders) == 3
    # Restarted with SIGKILL's leftovers: same ID, back in everyone's view.
    dead.start()
    assert _raw(dead).execute_command("CLUSTER", "MYID").decode() == dead_id
    _wait_for(lambda: all(reachable_nodes(n.port) == 3 for n in four), "the node back", form_timeout_s)
    for n in four:
        _raw(n).execute_command("CONFIG", "SET", "cluster-node-timeout", node_timeout_ms)
    # A job with REPLICATE 2 survives the crash of one holder (its creator).
    q2 = _q("survive")
    jid = _raw(a).execute_command("ADDJOB", q2, "precious", 10000, "REPLICATE", 2,
                                  "RETRY", 1).decode()
    other = next(n for n in four[1:] if _show(n, jid) is not None)
    a.kill_group()
    consumer = next(n for n in four[1:] if n is not other)  # not a holder: federation too
    got = _raw(consumer).execute_command("GETJOB", "TIMEOUT", 30000, "FROM", q2)
    assert got is not None and got[0][1].decode() == jid and got[0][2] == b"precious"


def _hello_priority(client: Any, node_id: str) -> int:
    hello = client.call("HELLO")
    return next(int(entry[3]) for entry in hello[2:] if entry[0].decode() == node_id)


def _busy_cores(count: int) -> list[Any]:
    import subprocess
    import sys
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def test_leaving_is_in_every_peers_hello_by_the_time_it_answers(three: list[NodeProc]) -> None:
    """The reference suite's "HELLO shows bad priority for nodes leaving": LEAVING no,
    an ADDJOB, LEAVING yes, two GETJOBs on node 0, and at once HELLO on node 1 lists
    node 0 with priority 100; played from the worker that does not own the bus (the
    command crosses to worker 0) against a HELLO on node 1's other worker, 30 times,
    half of them with both cores kept busy."""
    a, b, _ = three
    a_id = _raw(a).execute_command("CLUSTER", "MYID").decode()
    on_a = connect_to_worker(a.port, 1)
    on_b = connect_to_worker(b.port, 1)
    q = _q("leaving-hello")
    busy: list[Any] = []
    try:
        for round_no in range(30):
            if round_no == 15:
                busy = _busy_cores(2)
            assert on_a.call("CLUSTER", "LEAVING", "no") == Status("OK")
            assert _hello_priority(on_b, a_id) == 1, f"round {round_no}: still leaving"
            on_a.call("ADDJOB", q, "job", 0, "REPLICATE", 1, "RETRY", 0)
            assert on_a.call("CLUSTER", "LEAVING", "yes") == Status("OK")
            assert len(on_a.call("GETJOB", "FROM", q)) == 1
            assert str(on_a.call("GETJOB", "FROM", q)).startswith("LEAVING")
            assert _hello_priority(on_b, a_id) == 100, f"round {round_no}"
    finally:
        for p in busy:
            p.kill()
            p.wait()
        on_a.call("CLUSTER", "LEAVING", "no")
        on_a.close()
        on_b.close()
