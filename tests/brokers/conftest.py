"""Real nodes and real worker processes (celery, dramatiq) for the broker tests.

Nodes come from tests/nodeproc.py (free ports, own process group). A worker is
started with ``WorkerProc`` in its own process group too, its output in a file;
teardown SIGKILLs the whole group whatever happened."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.brokers.record import read_records
from tests.nodeproc import REPO, NodeProc, node_cluster, terminate, wait_until

# Bounds, not timed assertions: the machine is small and shared.
worker_stop_timeout_s = 20.0
tasks_done_timeout_s = 60.0
# The visibility timeout (Disque RETRY) the test apps use: short so that a killed
# worker's task comes back quickly; WORKING every half of it leaves a loaded
# machine 2 s of slack before a live worker's task would be requeued.
visibility_s = 4


@pytest.fixture(scope="session")
def broker_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with NodeProc(tmp_path_factory.mktemp("broker-node"), workers=2) as node:
        yield node


def node_url(*nodes: NodeProc) -> str:
    return ";".join(f"disque://127.0.0.1:{n.port}" for n in nodes)


class WorkerProc:
    """A celery/dramatiq worker command in its own process group."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.args, self.env, self.log_path = args, env, log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProc:
        env = dict(os.environ)
        env.update(self.env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", *self.args], cwd=str(REPO),
                                         env=env, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def log_tail(self) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-5000:]

    def kill(self) -> None:
        """SIGKILL every process of the worker (the main one and its children)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=worker_stop_timeout_s)

    def stop(self) -> None:
        """SIGTERM (warm shutdown), then SIGKILL the group in any case."""
        if self.proc is None:
            return
        terminate(self.proc, worker_stop_timeout_s)
        self.kill()

    def __enter__(self) -> WorkerProc:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_records(path: Path, cond: Callable[[list[dict[str, Any]]], bool], what: str,
                 worker: WorkerProc, timeout_s: float = tasks_done_timeout_s) -> list[dict[str, Any]]:
    """Poll the record file until ``cond(records)``; the worker's log on timeout."""
    wait_until(lambda: cond(read_records(path)), timeout_s, what, poll_s=0.1,
               detail=lambda: f"records: {read_records(path)[-10:]}\nworker:\n{worker.log_tail()}")
    return read_records(path)


def most_at_once(records: list[dict[str, Any]], start: str, done: str) -> int:
    """The most runs between a ``start`` record and its ``done`` (same ``id``) at once,
    counted in the record file's order: a run writes ``done`` before its worker acks
    the job, and the next delivery follows the ack, so the order is causal (no clock
    compared)."""
    running: set[str] = set()
    most = 0
    for r in records:
        if r["task"] == start:
            running.add(r["id"])
            most = max(most, len(running))
        elif r["task"] == done:
            running.discard(r["id"])
    return most


def raw(node: NodeProc) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=node.port, protocol=2, socket_timeout=10)


@pytest.fixture(scope="session")
def broker_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProc]]:
    with node_cluster(tmp_path_factory.mktemp("broker-cluster"), 3, workers=1) as nodes:
        yield nodes


def blocked_getjob(nodes: list[NodeProc]) -> bool:
    """Some connection of these nodes runs GETJOB (CLIENT LIST's cmd)."""
    for node in nodes:
        r = raw(node)
        try:
            if b"cmd=getjob" in r.execute_command("CLIENT", "LIST"):
                return True
        finally:
            r.close()
    return False


def check_worker_follows_leaving(cluster: list[NodeProc], q: str, rec: Path, w: WorkerProc,
                                 what: str, send_one: Callable[[int], object]) -> None:
    """The worker ``w`` of queue ``q`` connected to ``cluster[0]``, a producer on another
    node (``send_one(n)`` sends task n): tasks 0-9 run, then ``cluster[0]`` starts
    leaving, tasks 10-19 run too, the leaving node answers GETJOB with -LEAVING and
    the worker blocks in GETJOB on another node. ``cluster[0]`` stops leaving after."""
    for i in range(10):
        send_one(i)
    wait_records(rec, lambda r: len(r) >= 10, f"10 {what} produced on another node", w)
    wait_until(lambda: blocked_getjob(cluster[:1]), 30, "the worker's GETJOB on its node",
               detail=w.log_tail)
    leaving = raw(cluster[0])
    assert leaving.execute_command("CLUSTER", "LEAVING", "yes") in (b"OK", True)
    try:
        for i in range(10, 20):
            send_one(i)
        records = wait_records(rec, lambda r: len(r) >= 20,
                               f"10 more {what} after the worker's node started leaving", w)
        # with nothing queued there, a leaving node answers GETJOB with -LEAVING...
        with pytest.raises(Exception, match="LEAVING"):
            leaving.execute_command("GETJOB", "TIMEOUT", 100, "FROM", q)
        # ...so the worker now blocks in GETJOB on another node
        wait_until(lambda: blocked_getjob(cluster[1:]), 30,
                   "the worker's GETJOB on a node that is not leaving", detail=w.log_tail)
    finally:
        leaving.execute_command("CLUSTER", "LEAVING", "no")
        leaving.close()
    assert sorted(r["n"] for r in records) == list(range(20))
