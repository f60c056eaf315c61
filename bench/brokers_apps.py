"""The no-op task of the broker benchmark, for Celery and for Dramatiq, on whichever
broker the environment names: BENCH_BROKER_URL (disque://... or redis://...),
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
    app.conf.update(task_default_queue=QUEUE, task_ignore_result=True,
                    worker_hijack_root_logger=False, broker_connection_retry_on_startup=True,
                    worker_log_color=False)
    app.task(name="bench.noop", ignore_result=True)(record)
    return app


def _dramatiq() -> Any:
    import dramatiq

    if URL.startswith("redis://"):
        from dramatiq.brokers.redis import RedisBroker

        broker: Any = RedisBroker(url=URL)
    else:
        from disque_mp.dramatiq import DisqueBroker

        broker = DisqueBroker(url=URL)
    dramatiq.set_broker(broker)
    return dramatiq.actor(actor_name="noop", queue_name=QUEUE, max_retries=0)(record)


if FRAMEWORK == "celery":
    celery_app = _celery()
else:
    noop = _dramatiq()
