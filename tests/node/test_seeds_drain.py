"""Hosts joining by ``cluster-seeds`` and leaving by ``disque-mp admin drain`` (and
``POST /api/drain``), on real nodes: every joining node names a seed nobody answers
first, then the module's anchor node; consumers on the anchor take a drained node's
jobs by federation."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from disque_mp import cli
from tests.httpclient import get, post
from tests.nodeproc import REPO, NodeProc, free_port, reachable_nodes, unique_queue, wait_until

pytestmark = pytest.mark.integration

node_timeout_ms = 2000
wait_s = 60.0  # cold nodes on 2 cores shared with other test runs (a bound, not a timing)


@pytest.fixture(scope="module")
def anchor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with NodeProc(tmp_path_factory.mktemp("anchor"), workers=2,
                  conf={"cluster-node-timeout": node_timeout_ms}) as n:
        yield n


def seeded(base: Path, anchor: NodeProc, **conf: Any) -> NodeProc:
    dead = free_port()  # nothing listens there: the node must go on to the next seed
    return NodeProc(base, workers=2, conf={"cluster-node-timeout": node_timeout_ms,
                                           "cluster-seeds": f"127.0.0.1:{dead},127.0.0.1:{anchor.port}",
                                           **conf})


def my_id(node: NodeProc) -> str:
    return node.client().execute_command("CLUSTER", "MYID").decode()


def knows(a: NodeProc, b: NodeProc) -> bool:
    """``a`` sees ``b`` as a healthy member."""
    for line in a.client().execute_command("CLUSTER", "NODES").decode().splitlines():
        fields = line.split()
        if fields and fields[0] == my_id(b):
            return not any(f in fields[2] for f in ("fail", "handshake", "noaddr"))
    return False


def joined(node: NodeProc, anchor: NodeProc) -> None:
    wait_until(lambda: knows(node, anchor) and knows(anchor, node), wait_s,
               "the seeded node and the anchor knowing each other", detail=node.output)


def forget_everywhere(anchor: NodeProc, gone_id: str) -> None:
    """The anchor forgets a node that has stopped (the next test starts clean)."""
    anchor.client().execute_command("CLUSTER", "FORGET", gone_id)


def add_jobs(node: NodeProc, queue: str, count: int, replicate: int) -> set[str]:
    r = node.client()
    return {r.execute_command("ADDJOB", queue, f"job {i}", 5000, "REPLICATE", replicate).decode()
            for i in range(count)}


class Consumer(threading.Thread):
    """GETJOB + ACKJOB on ``node`` until ``want`` jobs came or the bound passed."""

    def __init__(self, node: NodeProc, queue: str, want: int) -> None:
        super().__init__(daemon=True)
        self.node, self.queue, self.want = node, queue, want
        self.got: set[str] = set()

    def run(self) -> None:
        r = self.node.client(socket_timeout=20)
        deadline = time.monotonic() + wait_s
        while len(self.got) < self.want and time.monotonic() < deadline:
            for _, job_id, _ in r.execute_command("GETJOB", "TIMEOUT", 500, "COUNT", 10,
                                                  "FROM", self.queue) or []:
                self.got.add(job_id.decode())
                r.execute_command("ACKJOB", job_id)
        r.close()


def admin_proc(node: NodeProc, *args: str) -> subprocess.Popen[str]:
    """``disque-mp admin`` as a user runs it: its own process, the console entry point."""
    return subprocess.Popen([sys.executable, "-m", "disque_mp", "admin", "--node",
                             f"127.0.0.1:{node.port}", *args], cwd=str(REPO), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_node_with_cluster_seeds_joins_the_running_node(anchor, tmp_path):
    dead = free_port()
    node = NodeProc(tmp_path / "joiner", workers=2, conf={"cluster-node-timeout": node_timeout_ms},
                    args=["--cluster-seeds", f"127.0.0.1:{dead}"]).start()
    try:
        r = node.client()
        assert r.execute_command("CONFIG", "GET", "cluster-seeds")[1] == f"127.0.0.1:{dead}".encode()
        wait_until(lambda: f"met 127.0.0.1:{dead}" in node.log_text(), wait_s,
                   "a first attempt at the seed nobody answers", detail=node.output)
        with pytest.raises(redis.ResponseError, match="bad port '0'"):
            r.execute_command("CONFIG", "SET", "cluster-seeds", "127.0.0.1:0")
        r.execute_command("CONFIG", "SET", "cluster-seeds", f"127.0.0.1:{dead},127.0.0.1:{anchor.port}")
        joined(node, anchor)
        assert reachable_nodes(node.port) == 1
        wait_until(lambda: "cluster-seeds: a peer is known" in node.log_text(), wait_s,
                   "the joined line in the log", detail=node.output)
        assert "does not resolve" not in node.log_text()
        gone = my_id(node)
    finally:
        node.stop()
    forget_everywhere(anchor, gone)


def test_drain_moves_queued_jobs_to_a_consumer_elsewhere_then_the_node_exits_0(anchor, tmp_path):
    node = seeded(tmp_path / "drained", anchor).start()
    try:
        joined(node, anchor)
        q = unique_queue("drain")
        ids = add_jobs(node, q, 10, replicate=1) | add_jobs(node, q, 10, replicate=2)
        jobs = node.client().info("jobs")
        assert jobs["queued_jobs"] == 20 and jobs["wait_repl_jobs"] == 0
        # no consumer yet: nothing moves, the drain times out and the node stays LEAVING
        short = admin_proc(node, "--json", "drain", "--no-shutdown", "--timeout", "1",
                           "--interval", "0.3")
        out, err = short.communicate(timeout=wait_s)
        assert short.returncode == 1 and out == ""
        assert "drain timed out after 1 s" in err and "the node stays LEAVING" in err
        samples = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
        assert samples and samples[-1]["left"] == 20 and samples[-1]["leaving"] is True
        assert node.client().execute_command("CLUSTER", "LEAVING") == b"yes"
        assert node.proc is not None and node.proc.poll() is None
        consumer = Consumer(anchor, q, len(ids))
        consumer.start()
        full = admin_proc(node, "drain", "--timeout", str(wait_s), "--interval", "0.5")
        out, err = full.communicate(timeout=wait_s + 30)
        consumer.join(wait_s)
        assert full.returncode == 0, (out, err)
        assert "jobs left: 0 (queued 0, waiting for copies 0)" in out
        assert "the node is shut down" in out
        assert node.wait_exit(30) == 0
        assert consumer.got == ids
        gone = my_id_of_stopped(anchor, node)
    finally:
        node.stop()
    forget_everywhere(anchor, gone)


def my_id_of_stopped(anchor: NodeProc, node: NodeProc) -> str:
    """The ID the anchor knows for ``node``'s port (the node itself is gone)."""
    for line in anchor.client().execute_command("CLUSTER", "NODES").decode().splitlines():
        fields = line.split()
        if fields and fields[1].endswith(f":{node.port}"):
            return fields[0]
    raise AssertionError(f"the anchor does not know port {node.port}")


def test_drain_is_refused_on_a_lone_node_holding_jobs_and_changes_nothing(tmp_path, capsys):
    http_port = free_port()
    with NodeProc(tmp_path / "lone", workers=1, conf={"http-port": http_port}) as node:
        q = unique_queue("lone")
        node.client().execute_command("ADDJOB", q, "only here", 0)
        code = cli.main(["admin", "--node", f"127.0.0.1:{node.port}", "drain", "--timeout", "5"])
        _, err = capsys.readouterr()
        assert code == 1
        assert "refusing to drain: the node holds 1 jobs (queued 1, waiting for copies 0)" in err
        assert "no other node is reachable and not leaving" in err and "nothing changed" in err
        reply = post(http_port, "/api/drain", {"timeout_s": 5})
        assert reply.status == 409 and "refusing to drain" in reply.json()["error"]
        assert post(http_port, "/api/drain", {"timeout_s": -1}).status == 400
        assert post(http_port, "/api/drain", {"shutdown": "yes"}).status == 400
        assert post(http_port, "/api/drain", {}, json_body=False).status == 415
        r = node.client()
        assert r.execute_command("CLUSTER", "LEAVING") == b"no"
        assert r.execute_command("QLEN", q) == 1
        progress = get(http_port, "/api/drain").json()
        assert progress["left"] == 1 and progress["leaving"] is False and progress["peers_ok"] == 0
        # with nothing to move there is nothing to refuse: --no-shutdown only sets LEAVING
        r.execute_command("DEBUG", "FLUSHALL")
        code = cli.main(["admin", "--node", f"127.0.0.1:{node.port}", "drain", "--no-shutdown"])
        out, _ = capsys.readouterr()
        assert code == 0 and "the node runs, LEAVING" in out
        assert r.execute_command("CLUSTER", "LEAVING") == b"yes"
        assert node.proc is not None and node.proc.poll() is None


def test_http_drain_moves_the_jobs_then_shuts_the_node_down(anchor, tmp_path):
    http_port = free_port()
    node = seeded(tmp_path / "http", anchor, **{"http-port": http_port}).start()
    try:
        joined(node, anchor)
        q = unique_queue("httpdrain")
        ids = add_jobs(node, q, 5, replicate=1)
        consumer = Consumer(anchor, q, len(ids))
        consumer.start()
        reply = post(http_port, "/api/drain", {"timeout_s": wait_s})
        assert reply.status == 200, reply
        started = reply.json()
        assert started["leaving"] is True and started["shutdown"] is True and started["peers_ok"] == 1
        consumer.join(wait_s)
        assert consumer.got == ids
        assert node.wait_exit(wait_s) == 0
        assert "drain: no job left to move, shutting down" in node.log_text()
        gone = my_id_of_stopped(anchor, node)
    finally:
        node.stop()
    forget_everywhere(anchor, gone)
