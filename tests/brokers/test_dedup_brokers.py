"""The brokers' ``dedup`` option against a real node (ADDJOB ... DEDUP, docs/extensions.md):
Celery's task ID (kombu transport option), Dramatiq's message ID (broker argument) as
the key; a message re-sent while the node holds the first is not added again, a
retry published as a new message is. Taskiq's ``dedup`` label: tests/brokers/test_taskiq.py;
a producer re-sending a task to real workers, on disque-mp, Redis and RabbitMQ: point 8
of ``make bench-brokers`` (tests/brokers/proof.py ``resent_task``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from dramatiq import Message

import disque_mp.kombu  # noqa: F401  (registers disque://)
from disque_mp.client import Disque, addjob_args
from disque_mp.client.core import task_dedup_key
from disque_mp.dramatiq import DisqueBroker
from tests.nodeproc import NodeProc, unique_queue

pytestmark = pytest.mark.integration


@pytest.fixture
def disque(broker_node: NodeProc) -> Iterator[Disque]:
    with Disque([f"127.0.0.1:{broker_node.port}"]) as d:
        yield d


def _keys(d: Disque, queue: str) -> list[Any]:
    return sorted(str((d.show(j.id) or {}).get("dedup") or "") for j in d.qpeek(queue, 100))


def _celery(node: NodeProc, **options: Any) -> Celery:
    app = Celery("dedup-producer", broker=f"disque://127.0.0.1:{node.port}",
                 set_as_current=False)
    app.conf.broker_transport_options = {"visibility_timeout": 30, **options}
    return app


def test_celery_task_id_is_the_key_with_the_dedup_option(broker_node: NodeProc,
                                                         disque: Disque) -> None:
    q = unique_queue("cdd")
    app = _celery(broker_node, dedup=True)
    with app.connection_for_write() as conn:  # closed: every pipelined ADDJOB answered
        for _ in range(3):  # a producer that timed out sends the task again
            app.send_task("t.echo", args=(1,), queue=q, task_id="task-1", connection=conn)
        app.send_task("t.echo", args=(1,), queue=q, task_id="task-1", retries=1,
                      connection=conn)  # Celery's retry: a new message, a new job
    plain = _celery(broker_node)
    with plain.connection_for_write() as conn:
        for _ in range(2):
            plain.send_task("t.echo", args=(1,), queue=q, task_id="task-2", connection=conn)
    assert disque.qlen(q) == 4
    assert _keys(disque, q) == ["", "", "task-1", "task-1:1"]
    disque.del_queue(q)


def test_dramatiq_message_id_is_the_key_with_dedup(broker_node: NodeProc,
                                                    disque: Disque) -> None:
    q = unique_queue("ddd")
    b = DisqueBroker(url=f"disque://127.0.0.1:{broker_node.port}", dedup=True)
    m = Message(queue_name=q, actor_name="a", args=(1,), kwargs={}, options={})
    for _ in range(3):
        b.enqueue(m)
    retry = m.copy(options={"retries": 1})
    b.enqueue(retry)
    b.confirm_enqueued()
    b.close()
    assert disque.qlen(q) == 2
    assert _keys(disque, q) == sorted([m.message_id, f"{m.message_id}:1"])
    disque.del_queue(q)


def test_task_dedup_key_bounds_and_the_addjob_words() -> None:
    assert addjob_args("q", "b", retry=5, dedup="k", async_=True) == \
        ["ADDJOB", "q", "b", 0, "RETRY", 5, "DEDUP", "k", "ASYNC"]
    assert task_dedup_key("abc") == "abc" and task_dedup_key("abc", 2) == "abc:2"
    long = task_dedup_key("x" * 300)
    assert long.startswith("sha256:") and len(long) <= 256
