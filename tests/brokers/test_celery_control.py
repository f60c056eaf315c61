"""Celery's remote control, events and Flower over disque://, with real ``celery
worker`` processes, the real ``celery`` command line, a real event receiver and a
real Flower process against a real node; and, in process, the shared bindings
they stand on (a fanout publish reaches another connection's queue, a reply finds
another connection's reply queue, a closed connection's bindings go at once)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kombu
import pytest
from celery import Celery

import disque_mp.kombu  # noqa: F401  (registers disque://)
from disque_mp.client import Disque
from disque_mp.kombu.bindings import Binding, registry_prefix
from tests.brokers.conftest import WorkerProc, node_url, visibility_s, worker_stop_timeout_s
from tests.brokers.test_celery import TASKS, producer, read, send, worker
from tests.nodeproc import REPO, NodeProc, free_port, unique_queue, wait_until

HOST = socket.gethostname()
# Bounds, not timed assertions (a small shared machine).
command_timeout_s = 60.0
ready_timeout_s = 60.0


def celery_cmd(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``celery -A <the test app> <args>`` in a process of its own."""
    env = dict(os.environ, DISQUE_BROKER_URL=url)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "celery", "-A", TASKS, *args], cwd=str(REPO),
                          env=env, capture_output=True, text=True, timeout=command_timeout_s)


def ping(url: str, *names: str) -> dict[str, Any]:
    """``celery inspect ping --json`` to these workers: {name: reply} of those that answered."""
    out = celery_cmd(url, "inspect", "ping", "--json", "--timeout", "5",
                     "--destination", ",".join(names))
    text = out.stdout.strip()
    return json.loads(text) if text.startswith("{") else {}


def probe_until(send_probe: Callable[[], set[str]], seen: Callable[[set[str]], set[str]],
                rounds: int = 30) -> None:
    """Send a probe task each round until ``seen`` reports one: a worker reads the event
    bindings at most a second old (bindings_cache_s), so the events of a task sent
    just after a receiver bound may go before the worker knows of it."""
    for _ in range(rounds):
        probe = send_probe()
        try:
            wait_until(lambda p=probe: seen(p) == p, 2, "", poll_s=0.2)  # type: ignore[misc]
            return
        except TimeoutError:
            continue
    raise TimeoutError(f"no probe task seen in {rounds} rounds")


def node_name(name: str) -> str:
    return f"{name}@{HOST}"


def registered_queues(node: NodeProc, exchange: str) -> set[str]:
    """The queues the registry on the node lists for ``exchange``."""
    with Disque([f"127.0.0.1:{node.port}"]) as d:
        jobs = d.qpeek(registry_prefix + exchange, 1000)
    return {b.queue for b in map(Binding.decode, (j.body for j in jobs)) if b is not None}


@pytest.fixture(scope="module")
def control_workers(broker_node: NodeProc, tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[tuple[str, str, Path]]:
    """Two workers with events on (``-E``) on one queue: (url, queue, record file)."""
    tmp = tmp_path_factory.mktemp("celery-control")
    url, q = node_url(broker_node), unique_queue("ctl")
    w1 = worker(url, q, tmp, name="ctl1", extra=("-E",))
    w2 = worker(url, q, tmp, name="ctl2", extra=("-E",))
    with w1, w2:
        names = (node_name("ctl1"), node_name("ctl2"))
        wait_until(lambda: len(ping(url, *names)) == 2, ready_timeout_s,
                   "both workers answering ping",
                   detail=lambda: w1.log_tail() + "\n" + w2.log_tail())
        yield url, q, tmp / "records.jsonl"


def test_inspect_ping_and_status_answer_from_each_worker(
        control_workers: tuple[str, str, Path]) -> None:
    url, _, _ = control_workers
    replies = ping(url, node_name("ctl1"), node_name("ctl2"))
    assert replies == {node_name("ctl1"): {"ok": "pong"}, node_name("ctl2"): {"ok": "pong"}}
    status = celery_cmd(url, "status", "--timeout", "3")
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"{node_name('ctl1')}: OK" in status.stdout
    assert f"{node_name('ctl2')}: OK" in status.stdout
    assert "2 nodes online." in status.stdout
    # a command with arguments and a reply: the workers say which queue they consume
    active = celery_cmd(url, "inspect", "active_queues", "--json", "--timeout", "5",
                        "--destination", node_name("ctl1"))
    [(name, queues)] = json.loads(active.stdout).items()
    assert name == node_name("ctl1") and [x["name"] for x in queues] == [control_workers[1]]


def test_a_worker_busy_at_its_prefetch_limit_still_answers(
        control_workers: tuple[str, str, Path], tmp_path: Path) -> None:
    """Each worker runs 2 tasks at once (prefetch 2): with 4 tasks held running, the
    task channels wait for an ack, and the pidbox is asked on its own (NOHANG)."""
    url, q, rec = control_workers
    gate = tmp_path / "gate"
    app = producer(url)
    ids = {send(app, "gated", q, str(gate)) for _ in range(4)}

    def seen(kind: str) -> set[str]:
        return {r["id"] for r in read(rec) if r["task"] == kind} & ids

    try:
        wait_until(lambda: seen("gated-start") == ids, 60, "4 tasks running, 2 on each worker")
        replies = ping(url, node_name("ctl1"), node_name("ctl2"))
        assert seen("gated-done") == set()  # the gate is shut: all 4 still run
        assert set(replies) == {node_name("ctl1"), node_name("ctl2")}
    finally:
        gate.write_text("open")
    wait_until(lambda: seen("gated-done") == ids, 60, "the 4 tasks done")


def test_an_event_receiver_sees_each_task_and_the_workers(
        broker_node: NodeProc, control_workers: tuple[str, str, Path]) -> None:
    url, q, _ = control_workers
    seen: list[dict[str, Any]] = []
    app = Celery("events-test", broker=url, set_as_current=False)
    conn = app.connection_for_read()
    recv = app.events.Receiver(conn, handlers={"*": seen.append})
    thread = threading.Thread(target=recv.capture,
                              kwargs={"limit": None, "timeout": None, "wakeup": False},
                              daemon=True)
    thread.start()
    try:
        wait_until(lambda: recv.queue.name in registered_queues(broker_node, "celeryev"), 30,
                   "the event receiver's binding in the registry")
        app_p = producer(url)

        def succeeded(ids: set[str]) -> set[str]:
            return {e.get("uuid") for e in seen if e.get("type") == "task-succeeded"} & ids

        probe_until(lambda: {send(app_p, "echo", q, -1, time.time())}, succeeded)
        ids = {send(app_p, "echo", q, i, time.time()) for i in range(5)}
        wait_until(lambda: succeeded(ids) == ids, 60, "task-succeeded for each of 5 tasks",
                   detail=lambda: str([e.get("type") for e in seen][-20:]))
        wait_until(lambda: {e.get("hostname") for e in seen if e.get("type") == "worker-heartbeat"}
                   >= {node_name("ctl1"), node_name("ctl2")}, 30,
                   "a heartbeat from each worker")
    finally:
        recv.should_stop = True  # seen within a second (its drain's safety interval)
        thread.join(timeout=30)
        conn.release()
    for task_id in ids:
        kinds = [e["type"] for e in seen if e.get("uuid") == task_id]
        assert {"task-received", "task-started", "task-succeeded"} <= set(kinds), kinds
    # the receiver's queue left the registry when its consumer closed the connection
    wait_until(lambda: not any(x.startswith("celeryev.")
                               for x in registered_queues(broker_node, "celeryev")), 30,
               "the receiver's binding gone")


@pytest.mark.skipif(importlib.util.find_spec("flower") is None,
                    reason="flower is not installed (the test extra installs it)")
def test_flower_shows_the_workers_and_their_tasks(
        control_workers: tuple[str, str, Path], tmp_path: Path) -> None:
    url, q, _ = control_workers
    port = free_port()
    env = {"DISQUE_BROKER_URL": url, "FLOWER_UNAUTHENTICATED_API": "1"}
    flower = WorkerProc(["celery", "-A", TASKS, "flower", f"--port={port}",
                         "--address=127.0.0.1"], env, tmp_path / "flower.log")

    def api(path: str) -> Any:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
                return json.loads(r.read())
        except (OSError, urllib.error.URLError, ValueError):
            return None

    with flower:
        wait_until(lambda: api("/api/tasks") is not None, 60, "Flower's API",
                   detail=flower.log_tail)
        app = producer(url)

        def done(ids: set[str]) -> set[str]:
            tasks = api("/api/tasks") or {}
            return {t for t, v in tasks.items() if v.get("state") == "SUCCESS"} & ids

        # Flower binds its event queue a moment after its API answers
        probe_until(lambda: {send(app, "echo", q, -1, time.time())}, done)
        ids = {send(app, "echo", q, i, time.time()) for i in range(3)}
        wait_until(lambda: done(ids) == ids, 60, "Flower listing the 3 tasks as done",
                   detail=lambda: str(api("/api/tasks")) + flower.log_tail())
        tasks = api("/api/tasks")
        assert {tasks[t]["worker"] for t in ids} <= {node_name("ctl1"), node_name("ctl2")}
        # /api/workers fills in as the answers to Flower's inspect broadcasts come
        wait_until(lambda: all({"stats", "active_queues", "registered"}
                               <= set((api("/api/workers") or {}).get(n, {}))
                               for n in (node_name("ctl1"), node_name("ctl2"))),
                   60, "Flower's /api/workers listing both workers", detail=flower.log_tail)
        workers = api("/api/workers")
    for name in (node_name("ctl1"), node_name("ctl2")):
        assert workers[name]["stats"]["broker"]["transport"] == "disque"
        assert [x["name"] for x in workers[name]["active_queues"]] == [q]
        assert f"{TASKS}.echo" in workers[name]["registered"]


def test_control_shutdown_stops_one_worker_and_a_killed_one_falls_out(
        broker_node: NodeProc, control_workers: tuple[str, str, Path], tmp_path: Path) -> None:
    url, q, _ = control_workers
    env_ttl = {"DISQUE_BINDING_TTL_S": "3"}
    stopped = worker(url, q, tmp_path, name="ctl3")
    killed = worker(url, q, tmp_path, name="ctl4")
    stopped.env.update(env_ttl)
    killed.env.update(env_ttl)
    with stopped, killed:
        names = (node_name("ctl3"), node_name("ctl4"))
        wait_until(lambda: len(ping(url, *names)) == 2, ready_timeout_s, "the new workers",
                   detail=lambda: stopped.log_tail() + killed.log_tail())
        out = celery_cmd(url, "control", "shutdown", "--timeout", "2",
                         "--destination", node_name("ctl3"))
        assert stopped.proc is not None
        stopped.proc.wait(timeout=worker_stop_timeout_s)
        assert "Got shutdown from remote" in stopped.log_tail(), out.stdout + out.stderr
        # a warm shutdown unbinds at once: the registry no longer lists its pidbox
        assert f"{node_name('ctl3')}.celery.pidbox" not in registered_queues(
            broker_node, "celery.pidbox")
        assert killed.proc is not None
        os.killpg(killed.proc.pid, signal.SIGKILL)
        killed.proc.wait(timeout=worker_stop_timeout_s)
        wait_until(lambda: f"{node_name('ctl4')}.celery.pidbox" not in registered_queues(
            broker_node, "celery.pidbox"), 30, "the killed worker's binding expiring")
    # the others still answer
    assert set(ping(url, node_name("ctl1"), node_name("ctl2"))) == {node_name("ctl1"),
                                                                    node_name("ctl2")}


def test_fanout_and_replies_across_connections_in_process(broker_node: NodeProc) -> None:
    """kombu alone: a queue bound to a fanout exchange by one connection receives what
    another publishes (an at-most-once copy, acknowledged on delivery), a direct
    publish finds another connection's transient queue, and closing the connection
    unbinds at once."""
    url = f"disque://127.0.0.1:{broker_node.port}"
    fan = kombu.Exchange(unique_queue("fan"), type="fanout", durable=False)
    replies = kombu.Exchange(unique_queue("reply"), type="direct", durable=False)
    inbox = kombu.Queue(unique_queue("inbox"), fan, auto_delete=True, durable=False,
                        message_ttl=20)
    reply_q = kombu.Queue(unique_queue("rq"), replies, routing_key="me", auto_delete=True,
                          durable=False)
    got: list[Any] = []
    opts = {"visibility_timeout": visibility_s}
    with kombu.Connection(url, transport_options=opts) as listener, \
            kombu.Connection(url, transport_options=opts) as sender, \
            Disque([f"127.0.0.1:{broker_node.port}"]) as d:
        with listener.Consumer([inbox, reply_q], no_ack=True,
                               callbacks=[lambda body, m: got.append(body)]):
            with sender.Producer() as p:
                p.publish({"to": "all"}, exchange=fan, declare=[fan])
                p.publish({"to": "me"}, exchange=replies, routing_key="me", declare=[replies])
                p.publish({"to": "nobody"}, exchange=replies, routing_key="other")
            for _ in range(20):  # bounded
                if len(got) >= 2:
                    break
                try:
                    listener.drain_events(timeout=1)
                except TimeoutError:
                    pass
            assert sorted(b["to"] for b in got) == ["all", "me"]
            # acknowledged as delivered: nothing left on the node
            wait_until(lambda: not list(d.iter_jobs(queue=inbox.name)), 10, "the copy acked")
            assert registered_queues(broker_node, fan.name) == {inbox.name}
        listener.release()
        assert registered_queues(broker_node, fan.name) == set()
        assert registered_queues(broker_node, replies.name) == set()


def test_remote_control_across_the_nodes_of_a_cluster(broker_cluster: list[NodeProc],
                                                      tmp_path: Path) -> None:
    """A worker on one node answers ``celery inspect ping`` sent through another: its
    binding is registered on every node, the broadcast's copy and the reply reach
    their consumers on the other node through Disque's federation."""
    worker_node, other = broker_cluster[0], broker_cluster[1]
    q = unique_queue("ctl")
    w = worker(node_url(worker_node), q, tmp_path, name="ctlc")
    with w:
        wait_until(lambda: ping(node_url(other), node_name("ctlc"))
                   == {node_name("ctlc"): {"ok": "pong"}}, ready_timeout_s,
                   "the worker on node 0 answering a ping sent through node 1",
                   detail=w.log_tail)
        for node in broker_cluster:
            assert f"{node_name('ctlc')}.celery.pidbox" in registered_queues(
                node, "celery.pidbox")
    for node in broker_cluster:  # a warm shutdown unbinds on every node
        assert f"{node_name('ctlc')}.celery.pidbox" not in registered_queues(
            node, "celery.pidbox")
