"""DisqueBroker in process against a real node: delay rounding, URLs, the consumer's
prefetch, ack, nack to the dead-letter queue, requeue, close, flush and join."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dramatiq import Message
from dramatiq.errors import BrokerConnectionError, QueueJoinTimeout

from disque_mp.client import PausedError
from disque_mp.dramatiq import DisqueBroker, DisqueMessage
from disque_mp.dramatiq.broker import delay_seconds, nodes_from_url
from tests.nodeproc import NodeProc, free_port, unique_queue


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
    consumer.nack(second)  # failed for good: the same job dead-lettered by the node
    assert broker.client.qlen("dead:" + q) == 1
    shown = broker.client.show(second.job_id)
    assert shown is not None and shown["dead-reason"] == "failed"  # no exception held
    consumer.requeue([third])  # NACK: back at once
    assert broker.client.qlen(q) == 2
    fourth = next(consumer)
    assert fourth is not None
    consumer.close()  # the held one is not given back by close (the worker requeues it)
    broker.flush(q)
    assert broker.client.qlen(q) == 0 and broker.client.qlen("dead:" + q) == 0
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


def test_a_retry_of_a_held_message_requeues_its_job(broker: DisqueBroker) -> None:
    q = unique_queue("dqr")
    broker.declare_queue(q)
    sent = broker.enqueue(message(q, 1))
    consumer = broker.consume(q, prefetch=1, timeout=2000)
    got = next(consumer)
    assert isinstance(got, DisqueMessage)
    got.options["retries"] = 1  # what the Retries middleware does, then enqueues it
    broker.enqueue(got, delay=1000)
    assert got.requeued_in_place
    consumer.ack(got)  # the worker's ack after the retry: skipped, the job lives on
    shown = broker.client.show(got.job_id)
    assert shown is not None and shown["nacks"] == 1
    again = next(consumer)  # due after the DELAY
    assert isinstance(again, DisqueMessage)
    assert again.job_id == got.job_id and again.message_id == sent.message_id
    assert again.options["retries"] == 1  # the body's 0 plus the job's nacks
    consumer.ack(again)
    consumer.close()
    assert broker.client.show(got.job_id) is None


def test_a_message_not_held_is_published_and_max_deliveries_is_set(
        broker_node: NodeProc) -> None:
    b = DisqueBroker(url=f"disque://127.0.0.1:{broker_node.port}", max_deliveries=2)
    q = unique_queue("dqm")
    first = b.enqueue(message(q, 1))
    b.enqueue(first, delay=None)  # a plain Message: a second job
    b.confirm_enqueued()  # enqueue pipelines its ADDJOB: wait for the node's replies
    jobs = b.client.qpeek(q, 10)
    assert len(jobs) == 2
    shown = b.client.show(jobs[0].id)
    assert shown is not None and shown["maxdeliver"] == 2
    b.client.ack(jobs)
    with pytest.raises(ValueError, match="max_deliveries"):
        DisqueBroker(nodes=["127.0.0.1:1"], max_deliveries=0)
    b.close()


def test_enqueue_pipelines_and_an_error_surfaces_later(broker: DisqueBroker,
                                                      broker_node: NodeProc) -> None:
    """An ADDJOB refused by the node (a paused queue) raises from a later call, not
    lost; the enqueues after it still land; confirm_delivery waits on each."""
    paused, other = unique_queue("dqp"), unique_queue("dqo")
    broker.client.pause(paused, "in")
    raised, sent = [], 0
    for target in (paused, other, other):
        try:
            broker.enqueue(message(target, 1))
            sent += target == other
        except PausedError as exc:  # the paused add's error: this enqueue sent nothing
            raised.append(exc)
    try:
        broker.confirm_enqueued()
    except PausedError as exc:
        raised.append(exc)
    assert len(raised) == 1  # the refused add, raised once
    assert broker.client.qlen(other) == sent >= 1 and broker.client.qlen(paused) == 0
    sync = DisqueBroker(url=f"disque://127.0.0.1:{broker_node.port}", confirm_delivery=True)
    with pytest.raises(PausedError):
        sync.enqueue(message(paused, 1))
    sync.close()
    broker.client.pause(paused, "none")
    broker.flush(other)


def test_acks_leave_in_batches_and_close_sends_them(broker: DisqueBroker) -> None:
    q = unique_queue("dqa")
    broker.declare_queue(q)
    for i in range(40):
        broker.enqueue(message(q, i))
    consumer = broker.consume(q, prefetch=40, timeout=2000)
    taken = [next(consumer) for _ in range(40)]
    assert all(isinstance(m, DisqueMessage) for m in taken)
    for m in taken:
        consumer.ack(m)
    acks = consumer._acks
    consumer.close()  # flushes the pending acks
    assert acks is not None and 1 <= acks.batches < 40
    assert all(broker.client.show(m.job_id) is None for m in taken if isinstance(m, DisqueMessage))


def test_dead_letters_xq_keeps_dramatiqs_own_queue(broker_node: NodeProc) -> None:
    b = DisqueBroker(url=f"disque://127.0.0.1:{broker_node.port}", dead_letters="xq")
    q = unique_queue("dqx")
    b.declare_queue(q)
    b.enqueue(message(q, 1))
    b.confirm_enqueued()
    consumer = b.consume(q, prefetch=1, timeout=200)
    got = next(consumer)
    assert isinstance(got, DisqueMessage)
    consumer.nack(got)  # a copy in <queue>.XQ, the job acknowledged
    assert b.client.qlen(q + ".XQ") == 1 and b.client.qlen("dead:" + q) == 0
    consumer.close()
    b.flush(q)
    with pytest.raises(ValueError, match="dead_letters"):
        DisqueBroker(nodes=["127.0.0.1:1"], dead_letters="drop")
    b.close()


def test_queue_limits_are_set_when_a_worker_consumes(broker_node: NodeProc) -> None:
    q = unique_queue("dm")
    b = DisqueBroker(url=f"disque://127.0.0.1:{broker_node.port}", visibility_timeout=30,
                     queue_limits={q: {"active": 1, "rate": 50}})
    try:
        b.declare_queue(q)
        for n in range(3):
            b.enqueue(message(q, n))
        b.confirm_enqueued()
        consumer = b.consume(q, prefetch=3, timeout=200)  # QLIMIT ... BCAST
        assert b.client.limits(q)["active"] == 1 and b.client.limits(q)["rate"] == 50
        got = [m for m in (next(consumer) for _ in range(5)) if m is not None]
        assert len(got) == 1  # one delivered and not acked: ACTIVE 1 holds the others
        consumer.ack(got[0])
        consumer.close()
        b.client.reset_limits(q)
    finally:
        b.close()
    with pytest.raises(ValueError, match="queue_limits"):
        DisqueBroker(nodes=["127.0.0.1:7711"], queue_limits={"q": {"active": -1}})
    # no node to set them on: the error Dramatiq's consumer thread retries (it restarts
    # the consumer on a connection error), not an unexpected one
    unreachable = DisqueBroker(nodes=[f"127.0.0.1:{free_port()}"], queue_limits={q: {"active": 1}})
    try:
        with pytest.raises(BrokerConnectionError):
            unreachable.consume(q)
    finally:
        unreachable.close()
