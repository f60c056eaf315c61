"""Taskiq on disque-mp: a worker, a delayed task, a retry on the same job, the ack after the run.

    make run                                       # a node on 127.0.0.1:7711 (other terminal)
    .venv/bin/python examples/taskiq_demo.py [--nodes 127.0.0.1:7711,127.0.0.1:7712]

The script starts a real ``taskiq worker`` on this module, kicks tasks, and reads what
the tasks report from a Disque queue. Your own app only needs:

    from disque_mp.taskiq import DisqueBroker
    broker = DisqueBroker("disque://127.0.0.1:7711,127.0.0.1:7712", queue="tasks")
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import demo_worker  # examples/demo_worker.py: the --nodes option, the worker process
from taskiq import Context, SmartRetryMiddleware, TaskiqDepends

from disque_mp.aclient import AsyncDisque
from disque_mp.client import Disque
from disque_mp.taskiq import DisqueBroker

NODES = os.environ.get("DEMO_NODES", "127.0.0.1:7711")
QUEUE = "taskiq-demo"
REPORTS = "taskiq-demo-reports"

# A job neither acked nor kept alive by the worker's WORKING heartbeat comes back after
# 60 s; one that keeps killing its worker lands in dead:taskiq-demo after 5 deliveries
broker = DisqueBroker(f"disque://{NODES}", queue=QUEUE, visibility_timeout_s=60, maxdeliver=5)
# a retry kicks the same task ID again: this broker turns it into NACK DELAY on the job
broker.add_middlewares(SmartRetryMiddleware(default_retry_count=3, default_delay=1,
                                            use_jitter=False))


async def report(text: str) -> None:
    async with AsyncDisque(NODES) as d:
        await d.add_job(REPORTS, text)


@broker.task
async def greet(name: str) -> None:
    await report(f"hello {name} at {time.strftime('%X')}")


@broker.task(retry_on_error=True, max_retries=3)
async def unreliable(what: str, ctx: Annotated[Context, TaskiqDepends()]) -> str:
    labels = ctx.message.labels
    if int(labels.get("_retries", 0)) < 2:
        await report(f"unreliable({what!r}) failed on job {labels['disque_job_id']}")
        raise RuntimeError(f"{what}: backend down")
    await report(f"unreliable({what!r}) worked on job {labels['disque_job_id']} "
                 f"after {labels['_retries']} retries")
    return "ok"


async def kick_all() -> None:
    await broker.startup()
    try:
        await greet.kiq("tom")
        await greet.kicker().with_labels(delay=2).kiq("ann")  # ADDJOB ... DELAY 2
        await unreliable.kiq("payment")
    finally:
        await broker.shutdown()


def main() -> None:
    nodes, env = demo_worker.demo_nodes(__doc__, NODES, __file__)
    here = Path(__file__).resolve().parent
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(here), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "taskiq", "worker", "taskiq_demo:broker", "--workers", "1"]
    with demo_worker.worker_process(cmd, env, cwd=str(here), quiet=True), Disque(nodes) as d:
        print(f"sent at {time.strftime('%X')}: two greetings (one delayed 2 s) and a task "
              "that fails twice, retried 1 s later each time on the same Disque job")
        # kick from the module the worker imports: run as a script this file is
        # __main__, and Taskiq names a task after its module ("taskiq_demo:greet")
        import taskiq_demo

        asyncio.run(taskiq_demo.kick_all())
        demo_worker.print_reports(d, REPORTS, 5, time.monotonic() + 60, "task")


if __name__ == "__main__":
    main()
