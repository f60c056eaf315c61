"""Celery on disque-mp: a worker, tasks with a countdown, a retry, a dead letter.

    make run                                       # a node on 127.0.0.1:7711 (other terminal)
    .venv/bin/python examples/celery_demo.py [--nodes 127.0.0.1:7711,127.0.0.1:7712]

The script starts a real ``celery worker`` on this module, sends tasks, and reads
what the tasks report from a Disque queue (the broker carries the tasks; results
need a result backend of their own, so this demo has tasks ADDJOB their output).
Your own app only needs the first lines:

    import disque_mp.kombu                         # registers disque://
    from disque_mp.kombu.celery import DisqueTask  # retries requeue the same job (NACK DELAY)
    app = Celery("demo", broker="disque://127.0.0.1:7711;disque://127.0.0.1:7712",
                 task_cls=DisqueTask)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import demo_worker  # examples/demo_worker.py: what the two broker demos share
from celery import Celery

import disque_mp.kombu  # noqa: F401  (registers disque://)
from disque_mp.client import Disque
from disque_mp.kombu.celery import DisqueTask

NODES = os.environ.get("DEMO_NODES", "127.0.0.1:7711")
QUEUE = "celery-demo"
REPORTS = "celery-demo-reports"  # what the tasks did, for this script to print
DEAD = "celery-demo-dead"

app = Celery("celery_demo", broker=";".join(f"disque://{n}" for n in NODES.split(",")),
             task_cls=DisqueTask)  # self.retry(countdown=...) is NACK DELAY on the same job
app.conf.update(
    task_default_queue=QUEUE,
    task_acks_late=True,  # ack after the task ran: a worker that dies mid-task loses nothing
    task_acks_on_failure_or_timeout=False,  # a task that fails for good is rejected ...
    broker_transport_options={"visibility_timeout": 60,  # ... Disque RETRY
                              "dead_letter_queue": DEAD,  # ... and lands here
                              # a task that keeps killing its worker: dead:<queue> after 5
                              "max_deliveries": 5},
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


def report(text: str) -> None:
    with Disque(NODES) as d:
        d.add_job(REPORTS, text)


@app.task
def add(x: int, y: int) -> int:
    report(f"add({x}, {y}) = {x + y} at {time.strftime('%X')}")
    return x + y


@app.task(bind=True, max_retries=2)
def unreliable(self, what: str) -> None:
    job_id = (self.request.properties or {}).get("delivery_tag")
    report(f"unreliable({what!r}) attempt {self.request.retries + 1}, job {job_id}")
    raise self.retry(countdown=1, exc=RuntimeError(f"{what}: backend down"))


def main() -> None:
    nodes, env = demo_worker.demo_nodes(__doc__, NODES, __file__)
    here = Path(__file__).resolve().parent
    cmd = [sys.executable, "-m", "celery", "--workdir", str(here), "-A", "celery_demo",
           "worker", "-c", "2", "-l", "warning"]
    with demo_worker.worker_process(cmd, env), Disque(nodes) as d:
        print(f"sending to {QUEUE!r}: 3 additions (one with countdown=3) and a failing task")
        print(f"sent at {time.strftime('%X')}")
        add.delay(1, 2)
        add.delay(3, 4)
        add.apply_async((5, 6), countdown=3)  # Disque DELAY 3: queued 3 s from now
        unreliable.delay("payment")
        deadline = time.monotonic() + 60
        demo_worker.print_reports(d, REPORTS, 6, deadline, "task")
        demo_worker.print_dead_letters(d, DEAD, deadline, "the task that failed 3 times")


if __name__ == "__main__":
    main()
