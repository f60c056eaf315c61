"""The Dramatiq app of the proof scenarios, the same on every broker:
``dramatiq tests.brokers.proof_dramatiq``. The broker follows PROOF_BROKER_URL's
scheme: ``disque://`` (DisqueBroker), ``redis://`` (RedisBroker), ``amqp://``
(RabbitmqBroker); PROOF_QUEUE, BROKER_RECORD_FILE, PROOF_VISIBILITY_S (Disque's
RETRY; unused elsewhere)."""

from __future__ import annotations

import os
import time
from typing import Any

import dramatiq
from dramatiq.middleware import CurrentMessage

from tests.brokers.record import record

QUEUE = os.environ.get("PROOF_QUEUE", "proof")
URL = os.environ.get("PROOF_BROKER_URL", "disque://127.0.0.1:7711")


def _broker() -> Any:
    if URL.startswith("redis://"):
        from dramatiq.brokers.redis import RedisBroker

        return RedisBroker(url=URL)
    if URL.startswith("amqp://"):
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        # kombu writes the default vhost "/" as a trailing "//", pika as "/%2F"
        return RabbitmqBroker(url=URL[:-2] + "/%2F" if URL.endswith("//") else URL)
    from disque_mp.dramatiq import DisqueBroker

    return DisqueBroker(url=URL, visibility_timeout=int(os.environ.get("PROOF_VISIBILITY_S", "4")),
                        dedup=bool(os.environ.get("PROOF_DEDUP")))


broker = _broker()
broker.add_middleware(CurrentMessage())
dramatiq.set_broker(broker)


def _broker_id(message: Any) -> Any:
    """What the broker knows the message by: the Disque job ID, the Redis broker's
    message ID (new at each enqueue), RabbitMQ's delivery tag."""
    return (getattr(message, "job_id", None) or message.options.get("redis_message_id")
            or getattr(message, "_tag", None))


@dramatiq.actor(queue_name=QUEUE, max_retries=3)
def backoff(key: str) -> None:
    """Fails three times, retried after 1, 2 and 4 s (Retry's delay, no jitter)."""
    message = CurrentMessage.get_current_message()
    assert message is not None
    retries = int(message.options.get("retries", 0))
    record("backoff", key, tag=str(_broker_id(message)), retries=retries)
    if retries < 3:
        raise dramatiq.Retry(delay=1000 * 2 ** retries)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def nap(seconds: float, label: str) -> None:
    """Sleeps; its runs are counted by message ID (the resent-task point)."""
    message = CurrentMessage.get_current_message()
    assert message is not None
    record("nap-start", message.message_id, label=label, tag=str(_broker_id(message)))
    time.sleep(seconds)
    record("nap-done", message.message_id, label=label)
