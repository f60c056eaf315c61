"""The Celery app of the proof scenarios (tests/brokers/proof.py), the same on every
broker: ``celery -A tests.brokers.proof_celery worker``. The broker is the URL in
PROOF_BROKER_URL (``disque://``, ``redis://`` or ``amqp://``); PROOF_QUEUE,
BROKER_RECORD_FILE (one JSON line per task run), PROOF_VISIBILITY_S (the
visibility timeout: Disque's RETRY, the Redis transport's restore time; RabbitMQ
has none), PROOF_MAX_DELIVERIES and PROOF_REPLICATE (disque:// only: ADDJOB
MAXDELIVER, REPLICATE), PROOF_MAX_PRIORITY (the queues' ``x-max-priority``, which
RabbitMQ needs for priorities; disque:// ignores queue arguments).

Every task runs with ``acks_late`` and ``task_reject_on_worker_lost`` (a pool
process that dies gives its message back: the poison scenario), and the
``DisqueTask`` class (its retries requeue the same job on disque://; on the other
brokers it is Celery's Task).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from celery import Celery

import disque_mp.kombu  # noqa: F401  (registers disque://)
from disque_mp.kombu.celery import DisqueTask
from tests.brokers.record import record

QUEUE = os.environ.get("PROOF_QUEUE", "proof")
_options: dict[str, Any] = {
    "visibility_timeout": int(os.environ.get("PROOF_VISIBILITY_S", "4")),
    # Redis only: sweep for messages past their visibility timeout every second (the
    # default is every 10 s times a throttle of 10), so that its figures show the
    # visibility timeout and not the sweep's period
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
}
if os.environ.get("PROOF_MAX_DELIVERIES"):
    _options["max_deliveries"] = int(os.environ["PROOF_MAX_DELIVERIES"])
if os.environ.get("PROOF_REPLICATE"):
    _options["replicate"] = int(os.environ["PROOF_REPLICATE"])

app = Celery("proof_celery", broker=os.environ.get("PROOF_BROKER_URL", "disque://127.0.0.1:7711"),
             task_cls=DisqueTask)
app.conf.update(
    broker_transport_options=_options,
    broker_connection_retry_on_startup=True,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    task_default_queue=QUEUE,
    task_ignore_result=True,
    # how long the worker waits for a dead pool process's result before it calls it
    # lost (default 10 s): the poison scenario's cycle
    worker_lost_wait=1.0,
)
if os.environ.get("PROOF_MAX_PRIORITY"):  # bench/priority.py: RabbitMQ's x-max-priority
    app.conf.task_queue_max_priority = int(os.environ["PROOF_MAX_PRIORITY"])


def _tag(task: Any) -> str:
    """The broker's delivery tag of the running task (the job ID on disque://)."""
    return str((task.request.properties or {}).get("delivery_tag"))


@app.task(bind=True)
def echo(self: Any, n: int) -> None:
    record("echo", self.request.id, n=n, tag=_tag(self))


@app.task(bind=True)
def nap(self: Any, seconds: float, label: str) -> None:
    record("nap-start", self.request.id, label=label, tag=_tag(self))
    time.sleep(seconds)
    record("nap-done", self.request.id, label=label)


@app.task(bind=True)
def slow_once(self: Any, marker: str, seconds: float) -> None:
    """Sleeps the first time (its worker is killed meanwhile); returns at once after."""
    record("slow", self.request.id, marker=marker)
    path = Path(marker)
    if not path.exists():
        path.write_text("started")
        time.sleep(seconds)
    record("slow-done", self.request.id, marker=marker)


@app.task(bind=True)
def poison(self: Any) -> None:
    """Kills the pool process running it, every time (a segfaulting C extension)."""
    record("poison", self.request.id, tag=_tag(self), retries=self.request.retries)
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(bind=True, max_retries=3)
def backoff(self: Any) -> str:
    """Fails three times, retried after 1, 2 and 4 s; the fourth run succeeds."""
    record("backoff", self.request.id, tag=_tag(self), retries=self.request.retries)
    if self.request.retries < 3:
        raise self.retry(countdown=2 ** self.request.retries)
    return "done"


@app.task(bind=True)
def shifty(self: Any, n: int) -> None:
    """Retried once with other arguments: a new message, the first job acknowledged."""
    record("shifty", self.request.id, n=n, tag=_tag(self), retries=self.request.retries)
    if n == 0:
        raise self.retry(args=(1,), countdown=1)
