"""DisqueBroker in process against a real node: delay rounding, URLs, the consumer's
prefetch, ack, nack to the dead-letter queue, requeue, close, flush and join."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dramatiq import Message
from dramatiq.errors import QueueJoinTimeout

from disque_mp.dramatiq import DisqueBroker, DisqueMessage
from disque_mp.dramatiq.broker import delay_seconds, nodes_from_url
from tests.nodeproc import NodeProc, unique_queue


@pytest.fixture
def broker(broker_node: NodeProc) -> Iterator[DisqueBroker]:
    b = DisqueBroker(url=f"disque://127.0.0.1:{broker_node.port}", visibility_timeout=30)
    yield b
    b.close()


def message(queue: str, n: int) -> Message:
    return Message(queue_name=queue, actor_name="a", args=(n,), kwargs={}, options={})


def test_delay_is_rounded_up_to_whole_seconds() -> None:
    assert delay_seconds(None) is None
    assert delay_seconds(0) is None
    assert delay_seconds(1) == 1
    assert delay_seconds(1000) == 1
    assert delay_seconds(1001) == 2


def test_urls_and_bad_settings() -> None:
    assert nodes_from_url("disque://a:7711,b:7712") == ["a:7711", "b:7712"]
    assert nodes_from_url("a:7711") == ["a:7711"]
    with pytest.raises(ValueError, match="host:port"):
        DisqueBroker(url="disque://nohost")
    with pytest.raises(ValueError, match="visibility_timeout"):
        DisqueBroker(nodes=["127.0.0.1:7711"], visibility_timeout=0)
    with pytest.raises(ValueError, match="url or nodes"):
        DisqueBroker(url="disque://a:1", nodes=["a:1"])


def test_prefetch_ack_nack_requeue_and_close(broker: DisqueBroker) -> None:
    q = unique_queue("dm")
    broker.declare_queue(q)
    for i in range(4):
        broker.enqueue(message(q, i))
    consumer = broker.consume(q, prefetch=2, timeout=200)
    first, second = next(consumer), next(consumer)
    assert isinstance(first, DisqueMessage) and isinstance(second, DisqueMessage)
    assert [list(first.args), list(second.args)] == [[0], [1]]
    assert next(consumer) is None  # prefetch reached: nothing more until an ack
    consumer.ack(first)
    third = next(consumer)
    assert third is not None
    consumer.nack(second)  # failed for good: dead letter
    assert broker.client.qlen(q + ".XQ") == 1
    consumer.requeue([third])  # NACK: back at once
    assert broker.client.qlen(q) == 2
    fourth = next(consumer)
    assert fourth is not None
    consumer.close()  # the held one is not given back by close (the worker requeues it)
    broker.flush(q)
    assert broker.client.qlen(q) == 0 and broker.client.qlen(q + ".XQ") == 0
    broker.client.nack(fourth.job_id)
    broker.flush(q)


def test_join_waits_for_queued_and_delayed_messages(broker: DisqueBroker) -> None:
    q = unique_queue("dm")
    broker.declare_queue(q)
    assert broker.get_declared_delay_queues() == set()
    broker.enqueue(message(q, 1), delay=60_000)
    with pytest.raises(QueueJoinTimeout):
        broker.join(q, timeout=300)  # delayed jobs count: they are active
    for job_id in broker.client.iter_jobs(queue=q):
        broker.client.del_job(job_id)
    broker.join(q, timeout=5000)
