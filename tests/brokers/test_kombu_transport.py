"""The disque:// kombu transport in process, against a real node: the mapping of
publish options onto ADDJOB, queue size, purge, ack/reject/requeue, what a closing
channel does with unacked messages, priority queues, bad jobs, and the refusal
of broadcast (fanout exchanges, Celery events and remote control)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import kombu
import pytest
from celery import Celery

import disque_mp.kombu  # noqa: F401  (registers disque://)
from disque_mp.client import Disque, PausedError
from disque_mp.kombu import BroadcastNotSupported, Transport, transport
from disque_mp.kombu.transport import job_times, seconds_until
from tests.nodeproc import NodeProc, unique_queue, wait_until


@pytest.fixture
def disque(broker_node: NodeProc) -> Iterator[Disque]:
    with Disque([f"127.0.0.1:{broker_node.port}"]) as d:
        yield d


def connection(node: NodeProc, **options: object) -> kombu.Connection:
    return kombu.Connection(f"disque://127.0.0.1:{node.port}",
                            transport_options={"visibility_timeout": 30, **options})


def test_seconds_until_rounds_up_and_reads_iso_and_timestamps() -> None:
    now = 1_000_000.0
    assert seconds_until(None, now) is None
    assert seconds_until(now + 0.2, now) == 1
    assert seconds_until(now - 5, now) == 0
    aware = datetime.fromtimestamp(now + 10, UTC).isoformat()
    assert seconds_until(aware, now) == 10
    naive = datetime.fromtimestamp(now + 10, UTC).replace(tzinfo=None).isoformat()
    assert seconds_until(naive, now) == 10  # naive is UTC
    with pytest.raises(ValueError):
        seconds_until("tomorrow", now)


def test_job_times_keep_delay_below_ttl() -> None:
    now = 1_000_000.0
    assert job_times({}, now, 86400) == (0, 86400)
    assert job_times({"eta": now + 30}, now, 86400) == (30, 86430)
    assert job_times({"expires": now + 60}, now, 86400) == (0, 60)
    assert job_times({"eta": now + 30, "expires": now + 60}, now, 86400) == (30, 60)
    # expires before its eta: delivered just after the eta, so Celery revokes it as expired
    assert job_times({"eta": now + 30, "expires": now + 10}, now, 86400) == (30, 31)


def test_publish_maps_eta_expires_and_visibility_onto_addjob(broker_node: NodeProc,
                                                            disque: Disque) -> None:
    q = unique_queue("k")
    now = datetime.now(UTC)
    with connection(broker_node, visibility_timeout=42) as conn:
        producer = conn.Producer()
        producer.publish({"x": 1}, routing_key=q, declare=[kombu.Queue(q)],
                         headers={"eta": (now + timedelta(seconds=20)).isoformat(),
                                  "expires": (now + timedelta(seconds=600)).isoformat()})
    [job_id] = list(disque.iter_jobs(queue=q))
    shown = disque.show(job_id)
    assert shown is not None
    assert shown["retry"] == 42
    assert 19 <= shown["delay"] <= 20
    assert 590 <= shown["ttl"] <= 600
    assert disque.qlen(q) == 0  # delayed: not queued yet
    disque.del_job(job_id)


def test_size_purge_ack_and_requeue(broker_node: NodeProc, disque: Disque) -> None:
    q = unique_queue("k")
    with connection(broker_node) as conn:
        sq = conn.SimpleQueue(q)
        sq.consumer.qos(prefetch_count=1)  # else one GETJOB takes fetch_count jobs
        for i in range(5):
            sq.put({"n": i})
        assert sq.qsize() == 5
        m = sq.get(timeout=5)
        assert m.payload == {"n": 0}
        assert m.delivery_tag.startswith("D-")  # the Disque job ID
        m.requeue()  # NACK: queued again at once
        again = sq.get(timeout=5)
        assert again.delivery_tag == m.delivery_tag
        again.ack()
        sq.consumer.channel.qos.flush_acks()  # acks leave in batches from a thread
        assert disque.show(m.delivery_tag) is None or disque.show(m.delivery_tag)["state"] == "acked"
        assert sq.qsize() == 4
        assert sq.clear() == 4
        assert sq.qsize() == 0
        sq.close()


def test_reject_goes_to_the_dead_letter_queue(broker_node: NodeProc, disque: Disque) -> None:
    q, dlq = unique_queue("k"), unique_queue("dead")
    with connection(broker_node, dead_letter_queue=dlq) as conn:
        sq = conn.SimpleQueue(q)
        sq.put({"bad": True})
        sq.get(timeout=5).reject()
        assert sq.qsize() == 0
        assert disque.qlen(dlq) == 1
        dead = conn.SimpleQueue(dlq).get(timeout=5)
        assert dead.payload == {"bad": True}
        dead.ack()
        sq.close()


def test_reject_without_a_dead_letter_queue_dead_letters_the_job(
        broker_node: NodeProc, disque: Disque) -> None:
    q = unique_queue("k")
    with connection(broker_node) as conn:
        sq = conn.SimpleQueue(q)
        sq.put({"bad": True})
        message = sq.get(timeout=5)
        job_id = message.delivery_tag
        message.reject()  # never dropped: the same job, in dead:<queue>
        assert sq.qsize() == 0
        shown = disque.show(job_id)
        assert shown is not None and shown["queue"] == "dead:" + q
        assert shown["dead-reason"] == "rejected without requeue"
        assert disque.redrive("dead:" + q) == 1 and sq.get(timeout=5).payload == {"bad": True}
        sq.close()


def test_closing_a_channel_nacks_its_unacked_messages(broker_node: NodeProc,
                                                     disque: Disque) -> None:
    q = unique_queue("k")
    with connection(broker_node) as conn:
        sq = conn.SimpleQueue(q)
        sq.consumer.qos(prefetch_count=2)
        for i in range(3):
            sq.put({"n": i})
        conn.transport.confirm_published()  # publishes are pipelined: wait for the replies
        taken = [sq.get(timeout=5) for _ in range(2)]
        assert disque.qlen(q) == 1
    # NACKed at close: back at once (not after the 30 s visibility timeout), not copied
    assert disque.qlen(q) == 3
    assert {t.delivery_tag for t in taken} <= {j.id for j in disque.qpeek(q, 10)}
    assert disque.show(taken[0].delivery_tag)["nacks"] == 1
    with connection(broker_node) as conn:
        assert conn.SimpleQueue(q).clear() == 3


def test_publish_pipelines_and_an_error_surfaces_later(broker_node: NodeProc,
                                                      disque: Disque) -> None:
    """A publish the node refuses (a paused queue) raises from a later publish or from
    confirm_published, once; the publishes after it land. confirm_publish raises at once."""
    paused, other = unique_queue("kp"), unique_queue("ko")
    disque.pause(paused, "in")
    raised, sent = [], 0
    with connection(broker_node) as conn:
        producer = conn.Producer()
        for target in (paused, other, other):
            try:
                producer.publish({"x": 1}, routing_key=target, declare=[kombu.Queue(target)])
                sent += target == other
            except PausedError as exc:  # the paused add's error: this publish sent nothing
                raised.append(exc)
        try:
            conn.transport.confirm_published()
        except PausedError as exc:
            raised.append(exc)
    assert len(raised) == 1
    assert disque.qlen(other) == sent >= 1 and disque.qlen(paused) == 0
    with connection(broker_node, confirm_publish=True) as conn, pytest.raises(PausedError):
        conn.Producer().publish({"x": 1}, routing_key=paused, declare=[kombu.Queue(paused)])
    disque.pause(paused, "none")
    with connection(broker_node) as conn:
        assert conn.SimpleQueue(other).clear() == sent


def test_acks_leave_in_batches(broker_node: NodeProc, disque: Disque) -> None:
    q = unique_queue("ka")
    with connection(broker_node) as conn:
        sq = conn.SimpleQueue(q)
        sq.consumer.qos(prefetch_count=40)
        for i in range(40):
            sq.put({"n": i})
        taken = [sq.get(timeout=5) for _ in range(40)]
        for m in taken:
            m.ack()
        qos = sq.consumer.channel.qos
        qos.flush_acks()
        assert qos._acks is not None and 1 <= qos._acks.batches < 40
        assert all(disque.show(m.delivery_tag) is None for m in taken)
        sq.close()


def test_priority_is_addjob_priority_in_one_queue(broker_node: NodeProc,
                                                 disque: Disque) -> None:
    """Without ``priority_steps`` a message's priority (0-9, higher first) is ADDJOB
    PRIORITY on the queue itself: no queue per level."""
    q = unique_queue("k")
    with connection(broker_node) as conn:
        sq = conn.SimpleQueue(q)
        for p in (0, 3, 9, 0):
            sq.put({"p": p}, priority=p)
        assert disque.qlen(q) == 4  # one Disque queue
        got = [sq.get(timeout=5) for _ in range(4)]
        assert [m.payload["p"] for m in got] == [9, 3, 0, 0]
        for m in got:
            m.ack()
        sq.close()


def test_priority_steps_consume_lower_numbers_first(broker_node: NodeProc) -> None:
    q = unique_queue("k")
    with connection(broker_node, priority_steps=[0, 5]) as conn:
        sq = conn.SimpleQueue(q)
        sq.put({"p": 9}, priority=9)
        sq.put({"p": 0}, priority=0)
        assert sq.qsize() == 2
        first, second = sq.get(timeout=5), sq.get(timeout=5)
        assert [first.payload["p"], second.payload["p"]] == [0, 9]
        first.ack()
        second.ack()
        sq.close()


def test_a_job_that_is_not_a_kombu_message_is_moved_aside(broker_node: NodeProc,
                                                         disque: Disque) -> None:
    q = unique_queue("k")
    disque.add_job(q, b"\xff not json")
    with connection(broker_node) as conn:
        sq = conn.SimpleQueue(q)
        with pytest.raises(sq.Empty):
            sq.get(timeout=1)
        sq.close()
    [moved] = disque.qpeek(q + ".invalid", 1)
    assert moved.body == b"\xff not json"
    assert disque.qlen(q) == 0
    disque.ack(moved)


def test_broadcast_is_refused_with_a_clear_message(broker_node: NodeProc,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    with connection(broker_node) as conn:
        with pytest.raises(BroadcastNotSupported, match="no broadcast primitive"):
            kombu.Exchange("fan", type="fanout")(conn.default_channel).declare()
    app = Celery("c", broker=f"disque://127.0.0.1:{broker_node.port}", set_as_current=False)
    with pytest.raises(BroadcastNotSupported, match="remote control"):
        app.control.inspect(timeout=0.5).ping()
    # events: dropped with one warning (raising would make a -E worker buffer them forever)
    monkeypatch.setattr(transport, "_events_warned", False)
    with caplog.at_level(logging.WARNING, logger="disque_mp.kombu"):
        with app.events.default_dispatcher() as dispatcher:
            dispatcher.send("task-sent")
            dispatcher.send("task-sent")
            assert not dispatcher._outbound_buffer
    warnings = [r.getMessage() for r in caplog.records if "Celery events" in r.getMessage()]
    assert len(warnings) == 1 and "dropped" in warnings[0]
    with Disque([f"127.0.0.1:{broker_node.port}"]) as d:
        assert not [q for q in d.iter_queues() if "celeryev" in q]


def test_explicit_transport_setting_and_several_nodes(broker_node: NodeProc,
                                                      disque: Disque) -> None:
    q = unique_queue("k")
    # the first node in the list is down: the client tries the others
    app = Celery("c", set_as_current=False,
                 broker=f"disque://127.0.0.1:1;disque://127.0.0.1:{broker_node.port}")
    app.conf.broker_transport = "disque_mp.kombu:Transport"
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, Transport)
        assert conn.transport.seeds() == ["127.0.0.1:1", f"127.0.0.1:{broker_node.port}"]
        conn.SimpleQueue(q).put({"ok": 1})
    wait_until(lambda: disque.qlen(q) == 1, 10, "the message published through the 2nd node")
    with connection(broker_node) as conn:
        assert conn.SimpleQueue(q).clear() == 1


def test_bad_transport_options_are_refused(broker_node: NodeProc) -> None:
    for options, match in (({"visibility_timeout": 0}, "visibility_timeout"),
                           ({"message_ttl": 0}, "message_ttl"),
                           ({"priority_steps": [3, 6]}, "priority_steps"),
                           ({"nodes": ["nohost"]}, "host:port")):
        with connection(broker_node, **options) as conn:
            with pytest.raises(ValueError, match=match):
                conn.SimpleQueue(unique_queue("k")).put({"x": 1})


def test_disque_task_helpers() -> None:
    from datetime import UTC, datetime

    from disque_mp.kombu.celery import held_job_id, is_job_id, retry_delay_s

    job = "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"
    assert is_job_id(job) and not is_job_id("5fa7e499-32f0-4b8f-8ce2-7e2983180492")
    assert not is_job_id(17)  # an AMQP delivery tag

    class Req:
        properties = {"delivery_tag": job}

    assert held_job_id(Req()) == job
    Req.properties = {}
    assert held_job_id(Req()) is None
    assert retry_delay_s({"countdown": 1}, 0.0) == 1
    assert retry_delay_s({"countdown": 0.2}, 0.0) == 1  # rounded up: never early
    assert retry_delay_s({}, 0.0) == 0
    eta = datetime(2030, 1, 1, tzinfo=UTC)
    assert retry_delay_s({"eta": eta}, eta.timestamp() - 2.5) == 3


def test_message_group_from_the_header_the_fair_key_or_a_task_kwarg() -> None:
    import base64
    import json

    from disque_mp.kombu.transport import message_group

    def msg(headers: dict[str, object], kwargs: dict[str, object]) -> dict[str, object]:
        body = base64.b64encode(json.dumps([[1], kwargs, {}]).encode()).decode()
        return {"body": body, "content-type": "application/json", "headers": headers,
                "properties": {"body_encoding": "base64"}}

    assert message_group(msg({}, {"tenant": "t1"}), None) is None
    assert message_group(msg({"disque_group": "g"}, {"tenant": "t1"}), "tenant") == "g"
    assert message_group(msg({"tenant": 7}, {"tenant": "t1"}), "tenant") == "7"
    assert message_group(msg({}, {"tenant": "t1"}), "tenant") == "t1"
    assert message_group({"body": "x", "content-type": "application/x-python-serialize",
                          "headers": {}}, "tenant") is None
    assert message_group(msg({"group": "canvas-id"}, {}), None) is None  # Celery's own
    with pytest.raises(ValueError, match="ADDJOB GROUP"):
        message_group(msg({"disque_group": "g" * 257}, {}), None)


def test_publish_sets_group_from_fair_key(broker_node: NodeProc, disque: Disque) -> None:
    q = unique_queue("k")
    with connection(broker_node, fair_key="tenant") as conn:
        producer = conn.Producer()
        for tenant in ("a", "a", "b"):
            producer.publish({"x": 1}, routing_key=q, declare=[kombu.Queue(q)],
                             headers={"tenant": tenant})
    assert disque.qgroups(q) == [("a", 2), ("b", 1)]
    disque.del_queue(q)
