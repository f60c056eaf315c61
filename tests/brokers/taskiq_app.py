"""The Taskiq tasks the broker tests run in a real ``taskiq worker`` process.
Settings from the environment: DISQUE_BROKER_URL, BROKER_TEST_QUEUE,
BROKER_RECORD_FILE (one JSON line per task run), DISQUE_VISIBILITY_S and
TASKIQ_REDIS_URL (a taskiq-redis result backend when set), TASKIQ_DISQUE_RESULTS
("1": disque-mp's own result backend)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

from taskiq import Context, SmartRetryMiddleware, TaskiqDepends
from taskiq.depends.progress_tracker import ProgressTracker

from disque_mp.taskiq import DisqueBroker
from tests.brokers.record import record

broker = DisqueBroker(os.environ.get("DISQUE_BROKER_URL", "disque://127.0.0.1:7711"),
                      queue=os.environ.get("BROKER_TEST_QUEUE", "taskiq-test"),
                      visibility_timeout_s=int(os.environ.get("DISQUE_VISIBILITY_S", "4")))
broker.add_middlewares(SmartRetryMiddleware(default_retry_count=3, default_delay=1,
                                            use_jitter=False))
if os.environ.get("TASKIQ_REDIS_URL"):
    from taskiq_redis import RedisAsyncResultBackend

    broker = broker.with_result_backend(RedisAsyncResultBackend(os.environ["TASKIQ_REDIS_URL"]))
elif os.environ.get("TASKIQ_DISQUE_RESULTS") == "1":
    from disque_mp.taskiq import DisqueResultBackend

    broker = broker.with_result_backend(DisqueResultBackend(
        os.environ.get("DISQUE_BROKER_URL", "disque://127.0.0.1:7711")))


def _job(ctx: Context) -> str:
    return str(ctx.message.labels.get("disque_job_id"))


@broker.task
async def echo(n: int, ctx: Annotated[Context, TaskiqDepends()]) -> int:
    record("echo", n, n=n, job=_job(ctx))
    return n * 2


@broker.task
async def nap(n: int, seconds: float) -> None:
    record("nap-start", n)
    await asyncio.sleep(seconds)
    record("nap-done", n)


@broker.task(retry_on_error=True, max_retries=3)
async def flaky(n: int, ctx: Annotated[Context, TaskiqDepends()]) -> None:
    record("flaky", n, n=n, job=_job(ctx), retries=int(ctx.message.labels.get("_retries", 0)))
    raise RuntimeError(f"flaky {n} fails every time")


@broker.task
async def slow(marker: str, ctx: Annotated[Context, TaskiqDepends()]) -> None:
    """Sleeps a minute the first time (the test kills the worker meanwhile)."""
    record("slow", marker, marker=marker, job=_job(ctx))
    path = Path(marker)
    if not path.exists():
        path.write_text("started")
        await asyncio.sleep(60)
    record("slow-done", marker, marker=marker, job=_job(ctx))


@broker.task
async def stepped(n: int, marker: str,
                  progress: Annotated[ProgressTracker[dict[str, int]], TaskiqDepends()]) -> int:
    """Reports progress, then waits (at most a minute) for the test's marker file."""
    await progress.set_progress("PROGRESS", {"step": 1})
    path = Path(marker)
    for _ in range(600):
        if path.exists():
            break
        await asyncio.sleep(0.1)
    return n + 1
