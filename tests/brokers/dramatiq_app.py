"""The Dramatiq actors the broker tests run in a real ``dramatiq`` worker process.
Settings from the environment: DISQUE_BROKER_URL, BROKER_TEST_QUEUE,
BROKER_RECORD_FILE (one JSON line per actor run), DISQUE_VISIBILITY_S,
BROKER_QUEUE_LIMITS (JSON, QLIMIT's options for the test queue: the broker's
``queue_limits``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import dramatiq
from dramatiq.results import Results

from disque_mp.dramatiq import DisqueBroker, DisqueResultBackend
from tests.brokers.record import record

QUEUE = os.environ.get("BROKER_TEST_QUEUE", "dramatiq-test")

_limits = os.environ.get("BROKER_QUEUE_LIMITS")
broker = DisqueBroker(url=os.environ.get("DISQUE_BROKER_URL", "disque://127.0.0.1:7711"),
                      visibility_timeout=int(os.environ.get("DISQUE_VISIBILITY_S", "3")),
                      queue_limits={QUEUE: json.loads(_limits)} if _limits else None)
broker.add_middleware(Results(backend=DisqueResultBackend(
    url=os.environ.get("DISQUE_BROKER_URL", "disque://127.0.0.1:7711"))))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def echo(n: int, sent_at: float) -> None:
    record("echo", n, n=n, sent_at=sent_at)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def nap(n: int, seconds: float) -> None:
    record("nap-start", n)
    time.sleep(seconds)
    record("nap-done", n)


@dramatiq.actor(queue_name=QUEUE, max_retries=2, min_backoff=200, max_backoff=1000)
def flaky(n: int) -> None:
    record("flaky", n, n=n)
    raise RuntimeError(f"flaky {n} fails every time")


@dramatiq.actor(queue_name=QUEUE, max_retries=0, time_limit=120_000)
def slow(marker: str) -> None:
    """Sleeps a minute the first time (the test kills the worker meanwhile)."""
    record("slow", marker, marker=marker)
    path = Path(marker)
    if not path.exists():
        path.write_text("started")
        time.sleep(60)
    record("slow-done", marker, marker=marker)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, store_results=True)
def add(x: int, y: int) -> int:
    return x + y
