"""Dramatiq on DisqueBroker with real ``dramatiq`` worker processes and real nodes:
messages run, a failing actor is retried (Retries middleware, unchanged) then
dead-lettered, a message whose worker is SIGKILLed is delivered again after the
visibility timeout, a delay is honoured (rounded up to whole seconds), and a
worker follows its node's ``-LEAVING`` in a 3-node cluster."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dramatiq import Message

from disque_mp.client import Disque
from disque_mp.dramatiq import DisqueBroker
from tests.brokers.conftest import (
    WorkerProc,
    check_worker_follows_leaving,
    most_at_once,
    visibility_s,
    wait_records,
)
from tests.brokers.record import read_records
from tests.nodeproc import NodeProc, unique_queue, wait_until


def url(node: NodeProc) -> str:
    return f"disque://127.0.0.1:{node.port}"


def worker(broker_url: str, queue: str, tmp_path: Path, name: str = "worker",
           threads: int = 2, limits: dict[str, int] | None = None) -> WorkerProc:
    env = {"DISQUE_BROKER_URL": broker_url, "BROKER_TEST_QUEUE": queue,
           "BROKER_RECORD_FILE": str(tmp_path / "records.jsonl"),
           "DISQUE_VISIBILITY_S": str(visibility_s),
           "BROKER_QUEUE_LIMITS": json.dumps(limits) if limits else ""}
    args = ["dramatiq", "tests.brokers.dramatiq_app", "--processes", "1",
            "--threads", str(threads)]
    return WorkerProc(args, env, tmp_path / f"{name}.log")


@pytest.fixture
def broker(broker_node: NodeProc) -> Iterator[DisqueBroker]:
    """A DisqueBroker on the one-node fixture, closed after the test."""
    b = DisqueBroker(url=url(broker_node), visibility_timeout=visibility_s)
    yield b
    b.close()


def send(broker: DisqueBroker, queue: str, actor: str, *args: Any,
         delay: int | None = None) -> Message:
    return broker.enqueue(Message(queue_name=queue, actor_name=actor, args=args, kwargs={},
                                  options={}), delay=delay)


def test_messages_run_and_a_delay_is_honoured(broker_node: NodeProc, broker: DisqueBroker,
                                              tmp_path: Path) -> None:
    q = unique_queue("dq")
    rec = tmp_path / "records.jsonl"
    with worker(url(broker_node), q, tmp_path) as w:
        send(broker, q, "echo", -1, time.time(), delay=1500)  # rounded up: DELAY 2
        for i in range(20):
            send(broker, q, "echo", i, time.time())
        records = wait_records(rec, lambda r: len(r) >= 21, "21 messages run", w)
        broker.join(q, timeout=30_000)
    assert sorted(r["n"] for r in records) == [-1, *range(20)]
    delayed = next(r for r in records if r["n"] == -1)
    assert delayed["t"] - delayed["sent_at"] >= 1.9
    # queued on the node 2 s after the others, behind them: it does not run first (that
    # it ran last held only while the worker ran 20 messages in under 2 s, not on a
    # loaded host)
    assert records[0]["n"] != -1
    assert broker.client.qlen(q) == 0


def test_a_failing_actor_is_retried_then_dead_lettered(
        broker_node: NodeProc, broker: DisqueBroker, tmp_path: Path) -> None:
    q = unique_queue("dq")
    rec = tmp_path / "records.jsonl"
    with worker(url(broker_node), q, tmp_path) as w:
        sent = send(broker, q, "flaky", 7)
        wait_records(rec, lambda r: len(r) >= 3, "three runs of the failing actor", w)
        wait_until(lambda: broker.client.qlen("dead:" + q) == 1, 30, "the dead letter",
                   detail=w.log_tail)
    [dead] = broker.client.qpeek("dead:" + q, 1)
    message = Message.decode(dead.body)  # the job itself, retried in place, then given up
    assert message.message_id == sent.message_id
    shown = broker.client.show(dead)
    assert shown is not None and shown["nacks"] == 2  # the two retries (NACK DELAY)
    assert shown["dead-reason"] == "RuntimeError: flaky 7 fails every time"
    assert len(read_records(rec)) == 3  # max_retries=2: one run and two retries
    assert broker.client.qlen(q) == 0


def test_a_message_whose_worker_is_killed_is_delivered_again(
        broker_node: NodeProc, broker: DisqueBroker, tmp_path: Path) -> None:
    q = unique_queue("dq")
    rec = tmp_path / "records.jsonl"
    marker = tmp_path / "marker"
    first = worker(url(broker_node), q, tmp_path, "first").start()
    try:
        send(broker, q, "slow", str(marker))
        wait_records(rec, lambda r: any(x["task"] == "slow" for x in r), "the slow actor to start",
                     first)
        time.sleep(visibility_s)  # the heartbeat keeps it ours meanwhile
        assert broker.client.qlen(q) == 0
        first.kill()
        killed_at = time.time()
    finally:
        first.stop()
    with worker(url(broker_node), q, tmp_path, "second") as second:
        records = wait_records(rec, lambda r: any(x["task"] == "slow-done" for x in r),
                               "the slow actor to run again and finish", second)
    starts = [r for r in records if r["task"] == "slow"]
    assert len(starts) == 2
    assert starts[1]["t"] - killed_at >= visibility_s / 2 - 0.5


def test_cluster_worker_and_producer_on_different_nodes_and_leaving(
        broker_cluster: list[NodeProc], tmp_path: Path) -> None:
    worker_node, producer_node = broker_cluster[0], broker_cluster[1]
    q = unique_queue("dq")
    rec = tmp_path / "records.jsonl"
    broker = DisqueBroker(nodes=[f"127.0.0.1:{producer_node.port}"])
    with worker(url(worker_node), q, tmp_path) as w:
        check_worker_follows_leaving(broker_cluster, q, rec, w, "messages",
                                     lambda i: send(broker, q, "echo", i, time.time()))
    with Disque([f"127.0.0.1:{producer_node.port}"]) as d:
        assert d.hello().nodes  # the producer node still serves
    broker.close()


def test_the_priority_option_sets_addjob_priority(broker_node: NodeProc, broker: DisqueBroker,
                                                  tmp_path: Path) -> None:
    """``priority`` (or RabbitMQ's ``broker_priority``) is ADDJOB PRIORITY: 4 messages
    of priority 9 sent behind 30 plain ones are among the first a real worker runs; a
    priority out of 0..9 is refused at send."""
    q = unique_queue("dq")
    rec = tmp_path / "records.jsonl"
    for i in range(30):
        send(broker, q, "echo", i, time.time())
    for i, name in ((100, "priority"), (101, "priority"), (102, "broker_priority"),
                    (103, "priority")):
        broker.enqueue(Message(queue_name=q, actor_name="echo", args=(i, time.time()),
                               kwargs={}, options={name: 9}))
    with pytest.raises(ValueError, match="ADDJOB PRIORITY"):
        broker.enqueue(Message(queue_name=q, actor_name="echo", args=(0, 0.0), kwargs={},
                               options={"priority": 10}))
    broker.confirm_enqueued()
    assert broker.client.qlen(q) == 34
    with worker(url(broker_node), q, tmp_path) as w:
        wait_until(lambda: len(read_records(rec)) >= 34, 60, "34 messages run",
                   detail=w.log_tail)
    order = [r["n"] for r in read_records(rec)]
    assert sorted(order) == [*range(30), *range(100, 104)]
    assert max(order.index(n) for n in range(100, 104)) < 10, order


def test_queue_limits_active_2_holds_a_worker_of_6_threads_to_2(
        broker_node: NodeProc, broker: DisqueBroker, tmp_path: Path) -> None:
    """The worker's ``DisqueBroker(queue_limits={q: {"active": 2}})`` (QLIMIT when it
    consumes the queue): 12 messages queued before it starts, never more than 2
    actors running at once on its 6 threads, all run."""
    q = unique_queue("dq")
    rec = tmp_path / "records.jsonl"
    for i in range(12):
        send(broker, q, "nap", i, 0.2)
    broker.confirm_enqueued()
    with worker(url(broker_node), q, tmp_path, threads=6, limits={"active": 2}) as w:
        records = wait_records(rec, lambda r: sum(x["task"] == "nap-done" for x in r) >= 12,
                               "12 nap messages run", w)
        assert broker.client.limits(q)["active"] == 2
        broker.client.reset_limits(q)
    assert sorted(int(r["id"]) for r in records if r["task"] == "nap-done") == list(range(12))
    assert most_at_once(records, "nap-start", "nap-done") <= 2


def test_the_group_option_sets_addjob_group(broker: DisqueBroker) -> None:
    q = unique_queue("dq")
    for tenant in ("a", "a", "b"):
        broker.enqueue(Message(queue_name=q, actor_name="echo", args=(1, 0.0), kwargs={},
                               options={"group": tenant}))
    broker.enqueue(Message(queue_name=q, actor_name="echo", args=(2, 0.0), kwargs={}, options={}))
    with pytest.raises(ValueError, match="ADDJOB GROUP"):
        broker.enqueue(Message(queue_name=q, actor_name="echo", args=(3, 0.0), kwargs={},
                               options={"group": ""}))
    broker.confirm_enqueued()
    assert broker.client.qgroups(q) == [("a", 2), ("", 1), ("b", 1)]
    broker.client.del_queue(q)


def test_the_results_middleware_on_the_node(broker_node: NodeProc, broker: DisqueBroker,
                                            tmp_path: Path) -> None:
    from dramatiq.results import ResultMissing

    from disque_mp.dramatiq import DisqueResultBackend

    q = unique_queue("dqres")
    backend = DisqueResultBackend(url=url(broker_node))
    pending = send(broker, q, "add", 0, 0)
    with pytest.raises(ResultMissing):
        backend.get_result(pending)  # not run yet: no worker
    with worker(url(broker_node), q, tmp_path):
        msgs = [send(broker, q, "add", i, 10) for i in range(10)]
        got = [backend.get_result(m, block=True, timeout=60_000) for m in msgs]
        assert backend.get_result(pending, block=True, timeout=60_000) == 0
    assert got == [i + 10 for i in range(10)]
    assert backend.get_result(msgs[0]) == 10  # kept after the worker left
