"""The Celery app the broker tests run in a real ``celery -A tests.brokers.celery_app
worker``. Settings come from the environment the test gives the worker:
DISQUE_BROKER_URL, DISQUE_RESULT_BACKEND (none: no result backend), BROKER_TEST_QUEUE, BROKER_RECORD_FILE (one JSON line per
task run), DISQUE_VISIBILITY_S, BROKER_DEAD_LETTERS ("node": no dead_letter_queue,
a rejected message is dead-lettered by the node with its reason),
DISQUE_BINDING_TTL_S (how long a killed worker's pidbox binding outlives it),
BROKER_QUEUE_LIMITS (JSON, QLIMIT's options for the test queue: the transport's
``queue_limits``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from celery import Celery
from celery.exceptions import Reject

import disque_mp.kombu  # noqa: F401  (registers disque://)
from disque_mp.kombu.celery import DisqueTask
from tests.brokers.record import record

QUEUE = os.environ.get("BROKER_TEST_QUEUE", "celery-test")

app = Celery("celery_app", broker=os.environ.get("DISQUE_BROKER_URL", "disque://127.0.0.1:7711"),
             backend=os.environ.get("DISQUE_RESULT_BACKEND") or None)
app.conf.update(
    broker_transport_options={
        "visibility_timeout": int(os.environ.get("DISQUE_VISIBILITY_S", "3")),
        "binding_ttl": int(os.environ.get("DISQUE_BINDING_TTL_S", "30")),
        **({} if os.environ.get("BROKER_DEAD_LETTERS") == "node"
           else {"dead_letter_queue": QUEUE + ".dead"}),
        **({"queue_limits": {QUEUE: json.loads(os.environ["BROKER_QUEUE_LIMITS"])}}
           if os.environ.get("BROKER_QUEUE_LIMITS") else {}),
    },
    broker_connection_retry_on_startup=True,
    task_acks_late=True,
    task_acks_on_failure_or_timeout=False,  # a task that fails for good is rejected: dead letter
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    task_default_queue=QUEUE,
)
if os.environ.get("BROKER_BEAT_EVERY_S"):  # the beat test: entries DisqueScheduler makes SCHEDULEs
    app.conf.beat_schedule = {
        "echo-every": {"task": "tests.brokers.celery_app.echo",
                       "schedule": float(os.environ["BROKER_BEAT_EVERY_S"]),
                       "args": (42, 0.0), "options": {"queue": QUEUE}},
    }


@app.task(bind=True)
def echo(self, n: int, sent_at: float) -> int:
    record("echo", self.request.id, n=n, sent_at=sent_at,
           retries=self.request.retries)
    return n


@app.task(bind=True, max_retries=2)
def flaky(self, n: int) -> None:
    record("flaky", self.request.id, n=n, retries=self.request.retries)
    raise self.retry(countdown=1, exc=RuntimeError(f"flaky {n} fails every time"))


@app.task(bind=True)
def nap(self, seconds: float) -> None:
    record("nap-start", self.request.id)
    time.sleep(seconds)
    record("nap-done", self.request.id)


@app.task(bind=True)
def slow(self, marker: str) -> None:
    """Sleeps a minute the first time (the test kills the worker meanwhile)."""
    record("slow", self.request.id, marker=marker)
    path = Path(marker)
    if not path.exists():
        path.write_text("started")
        time.sleep(60)
    record("slow-done", self.request.id, marker=marker)


@app.task(bind=True)
def gated(self, gate: str, bound_s: float = 120.0) -> None:
    """Runs until the file ``gate`` exists (at most ``bound_s``): the test holds it."""
    record("gated-start", self.request.id)
    deadline = time.monotonic() + bound_s
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    record("gated-done", self.request.id)


@app.task(bind=True, base=DisqueTask)
def rejecting(self, n: int) -> None:
    record("rejecting", self.request.id, n=n)
    raise Reject(ValueError(f"payload {n} cannot be parsed"), requeue=False)


@app.task(bind=True, base=DisqueTask, max_retries=1)
def doomed(self, n: int) -> None:
    record("doomed", self.request.id, n=n, retries=self.request.retries)
    raise self.retry(countdown=1, exc=RuntimeError(f"doomed {n} fails every time"))


@app.task(bind=True)
def add(self, x: int, y: int) -> int:
    return x + y


@app.task(bind=True)
def tsum(self, values: list[int]) -> int:
    record("tsum", self.request.id, total=sum(values), n=len(values))
    return sum(values)


@app.task(bind=True)
def progressing(self, n: int, marker: str) -> int:
    """Reports PROGRESS, then waits (at most a minute) for the test's marker file."""
    self.update_state(state="PROGRESS", meta={"step": 1, "of": 2})
    path = Path(marker)
    for _ in range(600):
        if path.exists():
            break
        time.sleep(0.1)
    return n * 2
