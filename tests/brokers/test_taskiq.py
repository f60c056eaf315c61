"""disque_mp.taskiq against a real node and a real ``taskiq worker`` process: results
through taskiq-redis's result backend on a real redis-server, retries as NACK DELAY on
the same job, the ack after the task ran (a worker killed mid-task: the job comes back),
MAXDELIVER and DEDUP from labels, and the label the node cannot honour yet refused."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from taskiq.exceptions import SendTaskError
from taskiq.kicker import AsyncKicker

from bench.redisq import RedisServer
from disque_mp.taskiq import DisqueBroker
from tests.brokers.conftest import (
    WorkerProc,
    most_at_once,
    node_url,
    raw,
    visibility_s,
    wait_records,
)
from tests.brokers.record import read_records
from tests.nodeproc import NodeProc, free_port, wait_until

pytestmark = pytest.mark.integration

APP = "tests.brokers.taskiq_app"


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("redis-server") is None:  # the result backend's test skips, not the rest
        yield ""
        return
    server = RedisServer(tmp_path_factory.mktemp("taskiq-redis"), free_port()).start()
    try:
        yield f"redis://127.0.0.1:{server.port}/0"
    finally:
        server.stop()


def worker(node: NodeProc, queue: str, rec: Path, log: Path, redis_url: str = "",
           disque_results: bool = False) -> WorkerProc:
    return WorkerProc(["taskiq", "worker", f"{APP}:broker", "--workers", "1"],
                      {"DISQUE_BROKER_URL": node_url(node), "BROKER_TEST_QUEUE": queue,
                       "BROKER_RECORD_FILE": str(rec), "DISQUE_VISIBILITY_S": str(visibility_s),
                       "TASKIQ_REDIS_URL": redis_url,
                       "TASKIQ_DISQUE_RESULTS": "1" if disque_results else ""}, log)


class Shared:
    """One worker for the tests that do not kill it."""

    def __init__(self, node: NodeProc, queue: str, rec: Path, w: WorkerProc, redis_url: str):
        self.node, self.queue, self.rec, self.w, self.redis_url = node, queue, rec, w, redis_url

    def producer(self, **kw: Any) -> DisqueBroker:
        broker = DisqueBroker(node_url(self.node), queue=self.queue, **kw)
        if self.redis_url:
            from taskiq_redis import RedisAsyncResultBackend

            broker = broker.with_result_backend(RedisAsyncResultBackend(self.redis_url))
        return broker


@pytest.fixture(scope="module")
def shared(broker_node: NodeProc, redis_url: str,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    d = tmp_path_factory.mktemp("taskiq")
    queue = f"taskiq-{uuid.uuid4().hex[:8]}"
    with worker(broker_node, queue, d / "rec.jsonl", d / "worker.log", redis_url) as w:
        yield Shared(broker_node, queue, d / "rec.jsonl", w, redis_url)


def show(r: Any, job: str) -> dict[bytes, Any]:
    reply = r.execute_command("SHOW", job)
    return dict(zip(reply[::2], reply[1::2], strict=True))


def kicker(broker: DisqueBroker, task: str, **labels: Any) -> AsyncKicker[Any, Any]:
    return AsyncKicker(task_name=f"{APP}:{task}", broker=broker, labels=labels)


def test_result_through_taskiq_redis_backend(shared: Shared) -> None:
    if not shared.redis_url:
        pytest.skip("redis-server not installed (make sysdeps)")

    async def go() -> Any:
        broker = shared.producer()
        await broker.startup()
        try:
            task = await kicker(broker, "echo").kiq(21)
            return await task.wait_result(timeout=60)
        finally:
            await broker.shutdown()

    result = asyncio.run(go())
    assert not result.is_err and result.return_value == 42
    records = wait_records(shared.rec, lambda r: any(x["task"] == "echo" for x in r),
                           "the echo task ran", shared.w)
    # acked after it ran: the job is gone from the node
    job = next(x["job"] for x in records if x["task"] == "echo")
    assert job.startswith("D-") and raw(shared.node).execute_command("SHOW", job) is None


def test_retry_is_nack_delay_on_the_same_job(shared: Shared) -> None:
    async def go() -> None:
        broker = shared.producer()
        await broker.startup()
        try:
            # the decorator's labels travel with a kick from the task object; a kick
            # by name, as here, gives them itself
            await kicker(broker, "flaky", retry_on_error=True, max_retries=3).kiq(7)
        finally:
            await broker.shutdown()

    asyncio.run(go())
    records = wait_records(shared.rec, lambda r: sum(x["task"] == "flaky" for x in r) >= 3,
                           "3 runs of the flaky task", shared.w)
    runs = [x for x in records if x["task"] == "flaky"]
    assert len({x["job"] for x in runs}) == 1  # one job: NACK DELAY, not a new ADDJOB
    assert [x["retries"] for x in runs] == [0, 1, 2]
    # DELAY 1: the node never delivers a retry before its delay ends
    assert all(b["t"] - a["t"] >= 0.9 for a, b in zip(runs, runs[1:], strict=False))
    # max_retries=3 reached: SmartRetryMiddleware gives up, the last run is acked
    r = raw(shared.node)
    for _ in range(100):  # the ack follows the last run's record
        if r.execute_command("SHOW", runs[0]["job"]) is None:
            break
        asyncio.run(asyncio.sleep(0.1))
    assert r.execute_command("SHOW", runs[0]["job"]) is None


def test_maxdeliver_label_and_a_refused_group(broker_node: NodeProc) -> None:
    queue = f"taskiq-md-{uuid.uuid4().hex[:8]}"
    r = raw(broker_node)

    async def go() -> None:
        broker = DisqueBroker(node_url(broker_node), queue=queue)
        await broker.startup()
        try:
            await kicker(broker, "echo", maxdeliver=1).kiq(1)
            with pytest.raises(SendTaskError) as refused:  # taskiq wraps kick's error
                await kicker(broker, "echo", group="g" * 257).kiq(2)
            assert isinstance(refused.value.__cause__, ValueError)
        finally:
            await broker.shutdown()

    asyncio.run(go())
    assert r.execute_command("QLEN", queue) == 1  # the refused kick added nothing
    (_, job_id, _), = r.execute_command("GETJOB", "NOHANG", "FROM", queue)
    r.execute_command("NACK", job_id)  # delivered once: MAXDELIVER 1 dead-letters it
    assert r.execute_command("QLEN", f"dead:{queue}") == 1
    r.execute_command("DELQUEUE", f"dead:{queue}")


def test_group_label_sets_addjob_group(broker_node: NodeProc) -> None:
    queue = f"taskiq-group-{uuid.uuid4().hex[:8]}"
    r = raw(broker_node)

    async def go() -> None:
        broker = DisqueBroker(node_url(broker_node), queue=queue)
        await broker.startup()
        try:
            for i in range(3):
                await kicker(broker, "echo", group="tenant-a").kiq(i)
            await kicker(broker, "echo", group="tenant-b").kiq(9)
            with pytest.raises(SendTaskError) as refused:
                await kicker(broker, "echo", group="g" * 257).kiq(0)
            assert "ADDJOB GROUP" in str(refused.value.__cause__)
        finally:
            await broker.shutdown()

    asyncio.run(go())
    assert r.execute_command("QGROUPS", queue) == [[b"tenant-a", 3], [b"tenant-b", 1]]
    r.execute_command("DELQUEUE", queue)


def test_priority_label_orders_a_real_worker(broker_node: NodeProc, tmp_path: Path) -> None:
    """The ``priority`` label is ADDJOB PRIORITY: 3 tasks of priority 9 kicked behind
    20 plain ones are the first a real worker runs; one past 9 is refused at kick."""
    queue = f"taskiq-prio-{uuid.uuid4().hex[:8]}"
    rec = tmp_path / "rec.jsonl"

    async def go() -> None:
        broker = DisqueBroker(node_url(broker_node), queue=queue)
        await broker.startup()
        try:
            for i in range(20):
                await kicker(broker, "echo").kiq(i)
            for i in range(100, 103):
                await kicker(broker, "echo", priority=9).kiq(i)
            with pytest.raises(SendTaskError) as refused:
                await kicker(broker, "echo", priority=10).kiq(0)
            assert "ADDJOB PRIORITY" in str(refused.value.__cause__)
        finally:
            await broker.shutdown()

    asyncio.run(go())
    stat = raw(broker_node).execute_command("QSTAT", queue)
    assert dict(zip(stat[::2], stat[1::2], strict=True))[b"priorities"] == [9, 3, 0, 20]
    with worker(broker_node, queue, rec, tmp_path / "w.log") as w:
        records = wait_records(rec, lambda r: len(r) >= 23, "23 echo tasks run", w)
    order = [r["n"] for r in records]
    assert sorted(order) == [*range(20), *range(100, 103)]
    assert max(order.index(n) for n in range(100, 103)) < 8, order


def test_qlimit_labels_and_queue_limits_set_the_queues_limits(broker_node: NodeProc) -> None:
    queue = f"taskiq-limit-{uuid.uuid4().hex[:8]}"
    r = raw(broker_node)

    def limits() -> dict[bytes, int]:
        reply = r.execute_command("QLIMIT", queue)
        return dict(zip(reply[::2], reply[1::2], strict=True))

    async def go() -> None:
        broker = DisqueBroker(node_url(broker_node), queue=queue, queue_limits={"rate": 40})
        await broker.startup()  # the broker's queue_limits: QLIMIT ... BCAST
        try:
            assert limits()[b"rate"] == 40
            await kicker(broker, "echo", qlimit_active=3, qlimit_group_active="1").kiq(1)
            assert (limits()[b"active"], limits()[b"group-active"], limits()[b"rate"]) == (3, 1, 40)
            with pytest.raises(SendTaskError) as refused:
                await kicker(broker, "echo", qlimit_active="many").kiq(0)
            assert "qlimit_active" in str(refused.value.__cause__)
        finally:
            await broker.shutdown()

    asyncio.run(go())
    r.execute_command("QLIMIT", queue, "RESET")
    r.execute_command("DELQUEUE", queue)


def test_qlimit_active_label_holds_a_real_worker_to_2_tasks_at_once(
        broker_node: NodeProc, tmp_path: Path) -> None:
    """12 async tasks kicked with ``qlimit_active=2`` (QLIMIT at the first kick), then a
    real worker that would run them all at once (``max_async_tasks`` 100): never more
    than 2 running, all run."""
    queue = f"taskiq-active-{uuid.uuid4().hex[:8]}"
    rec = tmp_path / "rec.jsonl"

    async def kick_12() -> None:  # a failed kick fails the test (asyncio.run ends the loop)
        producer = DisqueBroker(node_url(broker_node), queue=queue)
        await producer.startup()
        for i in range(12):
            await kicker(producer, "nap", qlimit_active=2).kiq(i, 0.2)
        await producer.shutdown()

    asyncio.run(kick_12())
    r = raw(broker_node)
    with worker(broker_node, queue, rec, tmp_path / "w.log") as w:
        records = wait_records(rec, lambda x: sum(y["task"] == "nap-done" for y in x) >= 12,
                               "12 nap tasks run", w)
    assert sorted(int(x["id"]) for x in records if x["task"] == "nap-done") == list(range(12))
    assert most_at_once(records, "nap-start", "nap-done") <= 2
    r.execute_command("QLIMIT", queue, "RESET")
    r.execute_command("DELQUEUE", queue)


def test_killed_mid_task_the_job_comes_back(broker_node: NodeProc, tmp_path: Path) -> None:
    queue = f"taskiq-kill-{uuid.uuid4().hex[:8]}"
    rec, marker = tmp_path / "rec.jsonl", tmp_path / "marker"

    async def go() -> None:
        # RETRY is the producer's (ADDJOB): the visibility timeout the job comes back after
        broker = DisqueBroker(node_url(broker_node), queue=queue, visibility_timeout_s=visibility_s)
        await broker.startup()
        try:
            await kicker(broker, "slow").kiq(str(marker))
        finally:
            await broker.shutdown()

    asyncio.run(go())
    with worker(broker_node, queue, rec, tmp_path / "w1.log") as w1:
        started = wait_records(rec, lambda r: any(x["task"] == "slow" for x in r),
                               "the slow task started", w1)
        job = started[0]["job"]
        # alive, the task keeps its job: the heartbeat's WORKING pushes the requeue back
        r = raw(broker_node)
        last = [show(r, job)[b"next-requeue-within"]]

        def pushed_back() -> bool:
            now = show(r, job)[b"next-requeue-within"]
            pushed, last[0] = now > last[0], now
            return pushed

        wait_until(pushed_back, 30, "a WORKING from the running task's heartbeat",
                   poll_s=0.1, detail=w1.log_tail)
        assert show(r, job)[b"state"] == b"active"
        assert sum(x["task"] == "slow" for x in read_records(rec)) == 1
        w1.kill()  # mid-task: nothing acked the job
    with worker(broker_node, queue, rec, tmp_path / "w2.log") as w2:
        records = wait_records(rec, lambda r: any(x["task"] == "slow-done" for x in r),
                               "the slow task again, in a new worker", w2)
    runs = [x for x in records if x["task"] == "slow"]
    assert len(runs) == 2 and runs[0]["job"] == runs[1]["job"]


def test_dedup_label_adds_a_resent_task_once(broker_node: NodeProc) -> None:
    queue = f"taskiq-dd-{uuid.uuid4().hex[:8]}"
    r = raw(broker_node)

    async def go() -> None:
        broker = DisqueBroker(node_url(broker_node), queue=queue)
        await broker.startup()
        try:
            same = kicker(broker, "echo", dedup=True).with_task_id("task-7")
            for _ in range(3):  # the producer timed out and sends it again
                await same.kiq(1)
            await kicker(broker, "echo", dedup="order-9").kiq(2)
            await kicker(broker, "echo", dedup="order-9").kiq(2)
            await kicker(broker, "echo", dedup=False).with_task_id("task-7").kiq(3)
        finally:
            await broker.shutdown()
        by_default = DisqueBroker(node_url(broker_node), queue=queue, dedup=True)
        await by_default.startup()
        try:
            await kicker(by_default, "echo").with_task_id("task-7").kiq(1)
        finally:
            await by_default.shutdown()

    asyncio.run(go())
    assert r.execute_command("QLEN", queue) == 3  # task-7 once, order-9 once, no key once
    keys = sorted(show(r, j[1].decode()).get(b"dedup", b"")
                  for j in r.execute_command("QPEEK", queue, 10))
    assert keys == [b"", b"order-9", b"task-7"]
    r.execute_command("DELQUEUE", queue)


def test_results_and_progress_through_the_disque_backend(broker_node: NodeProc,
                                                         tmp_path: Path) -> None:
    from disque_mp.taskiq import DisqueResultBackend

    queue = f"taskiq-res-{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "go"

    async def go() -> tuple[Any, Any, Any]:
        broker = DisqueBroker(node_url(broker_node), queue=queue).with_result_backend(
            DisqueResultBackend(node_url(broker_node)))
        await broker.startup()
        try:
            first = await kicker(broker, "echo").kiq(5)
            done = await first.wait_result(timeout=60)
            task = await kicker(broker, "stepped").kiq(1, str(marker))
            progress = None
            for _ in range(600):  # bounded: a minute
                progress = await task.get_progress()
                if progress is not None:
                    break
                await asyncio.sleep(0.1)
            marker.write_text("go")
            return done, progress, await task.wait_result(timeout=60)
        finally:
            await broker.shutdown()

    with worker(broker_node, queue, tmp_path / "rec.jsonl", tmp_path / "w.log",
                disque_results=True):
        done, progress, stepped = asyncio.run(go())
    assert not done.is_err and done.return_value == 10
    assert progress is not None and progress.state == "PROGRESS" and progress.meta == {"step": 1}
    assert not stepped.is_err and stepped.return_value == 2


def test_schedule_source_makes_node_schedules_a_worker_runs(shared: Shared) -> None:
    """DisqueScheduleSource: add_schedule sets a SCHEDULE (no Taskiq scheduler runs:
    the node fires), the real worker runs each firing; a one-off time is refused;
    delete_schedule removes it."""
    from datetime import UTC, datetime

    from taskiq import ScheduledTask

    from disque_mp.taskiq.schedule import DisqueScheduleSource

    async def go(action: str) -> Any:
        broker = shared.producer()
        await broker.startup()
        source = DisqueScheduleSource(broker)
        try:
            if action == "add":
                await source.add_schedule(ScheduledTask(
                    task_name=f"{APP}:echo", labels={}, args=[77], kwargs={},
                    schedule_id="every-second", interval=1))
                with pytest.raises(ValueError):
                    await source.add_schedule(ScheduledTask(
                        task_name=f"{APP}:echo", labels={}, args=[1], kwargs={},
                        time=datetime.now(UTC)))
                return await source.get_schedules()
            await source.delete_schedule("every-second")
            return await broker.client.execute("SCHEDULE", "LIST")
        finally:
            await broker.shutdown()

    assert asyncio.run(go("add")) == []  # Taskiq's own scheduler gets nothing to send
    r = raw(shared.node)
    assert b"taskiq:every-second" in r.execute_command("SCHEDULE", "LIST")
    wait_records(shared.rec, lambda recs: sum(x.get("n") == 77 for x in recs) >= 2,
                 "two firings run by the worker", shared.w)
    assert b"taskiq:every-second" not in asyncio.run(go("del"))
