"""The no-op task of the broker benchmark, for Celery and for Dramatiq, on whichever
broker the environment names: BENCH_BROKER_URL (disque://..., redis://... or
amqp://... for RabbitMQ),
BENCH_QUEUE, BENCH_RECORD_FILE (one ``sent_at start_at`` line per task run).

    celery -A bench.brokers_apps:celery_app worker -Q <queue> ...
    dramatiq bench.brokers_apps ...
"""

from __future__ import annotations

import os
import time
from typing import Any

URL = os.environ.get("BENCH_BROKER_URL", "disque://127.0.0.1:7711")
QUEUE = os.environ.get("BENCH_QUEUE", "bench")
FRAMEWORK = os.environ.get("BENCH_FRAMEWORK", "celery")
_record_fd: int | None = None
celery_prefetch_multiplier = 4  # messages per pool process (Celery's default)


def record(sent_at: float) -> None:
    """Append ``sent_at start_at``: one write per task, O_APPEND so processes do not mix."""
    global _record_fd
    start = time.time()
    if _record_fd is None:
        _record_fd = os.open(os.environ["BENCH_RECORD_FILE"],
                             os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_record_fd, f"{sent_at:.6f} {start:.6f}\n".encode())


def _celery() -> Any:
    from celery import Celery

    import disque_mp.kombu  # noqa: F401  (disque://)

    app = Celery("bench", broker=URL)
    # the same settings on every broker: ack after the task ran, 4 prefetched per process
    app.conf.update(task_default_queue=QUEUE, task_ignore_result=True, task_acks_late=True,
                    worker_prefetch_multiplier=celery_prefetch_multiplier,
                    worker_hijack_root_logger=False, broker_connection_retry_on_startup=True,
                    worker_log_color=False)
    app.task(name="bench.noop", ignore_result=True)(record)
    return app


def _dramatiq() -> Any:
    import dramatiq

    if URL.startswith("redis://"):
        from dramatiq.brokers.redis import RedisBroker

        broker: Any = RedisBroker(url=URL)
    elif URL.startswith("amqp://"):
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        # kombu writes the default vhost "/" as a trailing "//", pika as "/%2F"
        broker = RabbitmqBroker(url=URL[:-2] + "/%2F" if URL.endswith("//") else URL)
    else:
        from disque_mp.dramatiq import DisqueBroker

        broker = DisqueBroker(url=URL)
    dramatiq.set_broker(broker)
    return dramatiq.actor(actor_name="noop", queue_name=QUEUE, max_retries=0)(record)


if FRAMEWORK == "celery":
    celery_app = _celery()
else:
    noop = _dramatiq()
