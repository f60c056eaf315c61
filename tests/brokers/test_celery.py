"""Celery on disque:// with real ``celery worker`` processes and real nodes: tasks
run, a failing task is retried then dead-lettered, a countdown is honoured, a
cold shutdown gives held tasks back, and a worker follows its node's ``-LEAVING``
in a 3-node cluster. A task whose worker is SIGKILLed: test_proof.py (point 3)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

from celery import Celery

import disque_mp.kombu  # noqa: F401  (registers disque://)
from disque_mp.client import Disque
from tests.brokers.conftest import (
    WorkerProc,
    check_worker_follows_leaving,
    most_at_once,
    node_url,
    raw,
    visibility_s,
    wait_records,
)
from tests.nodeproc import NodeProc, unique_queue, wait_until

TASKS = "tests.brokers.celery_app"


def worker(url: str, queue: str, tmp_path: Path, name: str = "worker",
           extra: tuple[str, ...] = (), dead_letters: str = "queue",
           backend: str = "", limits: dict[str, int] | None = None) -> WorkerProc:
    env = {"DISQUE_BROKER_URL": url, "BROKER_TEST_QUEUE": queue, "DISQUE_RESULT_BACKEND": backend,
           "BROKER_RECORD_FILE": str(tmp_path / "records.jsonl"),
           "DISQUE_VISIBILITY_S": str(visibility_s), "BROKER_DEAD_LETTERS": dead_letters,
           "BROKER_QUEUE_LIMITS": json.dumps(limits) if limits else ""}
    args = ["celery", "-A", TASKS, "worker", "-Q", queue, "-c", "2", "-l", "info",
            "-n", f"{name}@%h", "--without-mingle", "--without-gossip", *extra]
    return WorkerProc(args, env, tmp_path / f"{name}.log")


def producer(url: str) -> Celery:
    app = Celery("producer", broker=url, set_as_current=False)
    app.conf.broker_transport_options = {"visibility_timeout": visibility_s}
    return app


def send(app: Celery, task: str, queue: str, *args: Any, **options: Any) -> str:
    return app.send_task(f"{TASKS}.{task}", args=args, queue=queue, **options).id


def test_tasks_run_and_a_countdown_is_honoured(broker_node: NodeProc, tmp_path: Path) -> None:
    q = unique_queue("cel")
    url = node_url(broker_node)
    app = producer(url)
    rec = tmp_path / "records.jsonl"
    with worker(url, q, tmp_path) as w:
        delayed_id = send(app, "echo", q, -1, time.time(), countdown=2)
        for i in range(20):
            send(app, "echo", q, i, time.time())
        records = wait_records(rec, lambda r: len(r) >= 21, "21 echo tasks run", w)
    assert sorted(r["n"] for r in records) == [-1, *range(20)]
    delayed = next(r for r in records if r["id"] == delayed_id)
    assert delayed["t"] - delayed["sent_at"] >= 1.9  # DELAY 2: never early
    assert records[-1]["id"] == delayed_id  # the 20 others did not wait for it
    with Disque([f"127.0.0.1:{broker_node.port}"]) as d:
        assert d.qlen(q) == 0


def test_a_failing_task_is_retried_then_dead_lettered(broker_node: NodeProc,
                                                      tmp_path: Path) -> None:
    q = unique_queue("cel")
    url = node_url(broker_node)
    rec = tmp_path / "records.jsonl"
    with worker(url, q, tmp_path) as w:
        task_id = send(producer(url), "flaky", q, 7)
        wait_records(rec, lambda r: len(r) >= 3, "three runs of the failing task", w)
        with Disque([f"127.0.0.1:{broker_node.port}"]) as d:
            wait_until(lambda: d.qlen(q + ".dead") == 1, 30, "the dead letter",
                       detail=w.log_tail)
            [dead] = d.qpeek(q + ".dead", 1)
    runs = [r for r in read(rec) if r["id"] == task_id]
    assert [r["retries"] for r in runs] == [0, 1, 2]
    # each retry waited for its countdown (1 s) in Disque (DELAY)
    assert all(b["t"] - a["t"] >= 0.9 for a, b in zip(runs, runs[1:], strict=False))
    message = json.loads(dead.body)
    assert message["headers"]["id"] == task_id and message["headers"]["retries"] == 2


def test_reject_and_out_of_retries_are_dead_lettered_with_the_reason(
        broker_node: NodeProc, tmp_path: Path) -> None:
    """No dead_letter_queue: the node moves the job itself to dead:<queue> (same
    job, the exception's text kept as its dead-letter reason), REDRIVE-able."""
    q = unique_queue("cel")
    url = node_url(broker_node)
    rec = tmp_path / "records.jsonl"
    with worker(url, q, tmp_path, dead_letters="node") as w:
        app = producer(url)
        rejected_id = send(app, "rejecting", q, 3)
        doomed_id = send(app, "doomed", q, 4)
        with Disque([f"127.0.0.1:{broker_node.port}"]) as d:
            wait_until(lambda: d.qlen("dead:" + q) == 2, 60, "two dead letters",
                       detail=w.log_tail)
            dead = d.qpeek("dead:" + q, 2)
            reasons = {json.loads(j.body)["headers"]["id"]: (d.show(j) or {})["dead-reason"]
                       for j in dead}
            assert d.qlen(q) == 0
            assert d.redrive("dead:" + q) == 2  # acted on: back in the queue
            wait_until(lambda: d.qlen("dead:" + q) == 2, 60, "dead again after the redrive",
                       detail=w.log_tail)
    assert reasons[rejected_id] == "ValueError: payload 3 cannot be parsed"
    assert reasons[doomed_id] == "RuntimeError: doomed 4 fails every time"
    assert len([r for r in read(rec) if r["id"] == doomed_id]) >= 2  # retried, then dead


def read(path: Path) -> list[dict[str, Any]]:
    from tests.brokers.record import read_records

    return read_records(path)


def test_worker_shutdown_returns_held_tasks_with_nack(broker_node: NodeProc,
                                                     tmp_path: Path) -> None:
    q = unique_queue("cel")
    url = node_url(broker_node)
    rec = tmp_path / "records.jsonl"
    app = producer(url)
    # one pool process, prefetch 2: one task runs, one waits reserved in the worker
    w = worker(url, q, tmp_path, extra=("--concurrency", "1", "--prefetch-multiplier", "2"))
    ids = [send(app, "nap", q, 5.0) for _ in range(3)]
    with Disque([f"127.0.0.1:{broker_node.port}"]) as d:
        with w:
            wait_records(rec, lambda r: any(x["task"] == "nap-start" for x in r),
                         "the first task to start", w)
            wait_until(lambda: d.qlen(q) == 1, 30, "two tasks held by the worker",
                       detail=w.log_tail)
            # cold shutdown: the running task is abandoned (acks_late), the reserved one
            # never runs; the channel's close gives both back. (A warm shutdown runs
            # what the worker reserved, then has nothing to give back.)
            assert w.proc is not None
            w.proc.send_signal(signal.SIGQUIT)
            w.proc.wait(timeout=60)
        # back at once, long before the visibility timeout, and not published again:
        # the same jobs, their NACK counted
        assert d.qlen(q) == 3
        queued = d.get_jobs(q, nohang=True, count=3, withcounters=True)
        d.ack(queued)
    assert sorted(j.nacks or 0 for j in queued) == [0, 1, 1]
    assert {json.loads(j.body)["headers"]["id"] for j in queued} == set(ids)
    assert [r["task"] for r in read(rec)] == ["nap-start"]


def test_fair_key_lets_a_small_tenant_pass_a_backlog(broker_node: NodeProc,
                                                      tmp_path: Path) -> None:
    """Tenant A's 60 tasks queued, then B's 5 (``fair_key`` names the ``tenant``
    header: ADDJOB GROUP): the worker runs B's among the first, not after A's."""
    q = unique_queue("cel")
    url = node_url(broker_node)
    rec = tmp_path / "records.jsonl"
    app = producer(url)
    app.conf.broker_transport_options = {"visibility_timeout": visibility_s,
                                         "fair_key": "tenant"}
    for i in range(60):
        send(app, "echo", q, i, time.time(), headers={"tenant": "A"})
    for i in range(100, 105):
        send(app, "echo", q, i, time.time(), headers={"tenant": "B"})
    with Disque([f"127.0.0.1:{broker_node.port}"]) as d:
        assert d.qgroups(q) == [("A", 60), ("B", 5)]
    with worker(url, q, tmp_path, extra=("--concurrency", "1")) as w:
        records = wait_records(rec, lambda r: len(r) >= 65, "65 echo tasks run", w)
    order = [r["n"] for r in records]
    assert sorted(order) == [*range(60), *range(100, 105)]
    assert max(order.index(n) for n in range(100, 105)) < 20, order


def test_task_priority_is_addjob_priority(broker_node: NodeProc, tmp_path: Path) -> None:
    """Celery's ``priority`` (0-9, higher first as on RabbitMQ) is ADDJOB PRIORITY, in
    the task's one queue: 5 tasks of priority 9 sent behind 40 of priority 0 are among
    the first the worker runs."""
    q = unique_queue("cel")
    url = node_url(broker_node)
    rec = tmp_path / "records.jsonl"
    app = producer(url)
    for i in range(40):
        send(app, "echo", q, i, time.time())
    for i in range(100, 105):
        send(app, "echo", q, i, time.time(), priority=9)
    stat = raw(broker_node).execute_command("QSTAT", q)
    shown = dict(zip(stat[::2], stat[1::2], strict=True))
    assert shown[b"priorities"] == [9, 5, 0, 40]
    with worker(url, q, tmp_path, extra=("--concurrency", "1")) as w:
        records = wait_records(rec, lambda r: len(r) >= 45, "45 echo tasks run", w)
    order = [r["n"] for r in records]
    assert sorted(order) == [*range(40), *range(100, 105)]
    assert max(order.index(n) for n in range(100, 105)) < 10, order


# 4 threads: without a limit the worker runs 4 tasks at once
four_at_once = ("--pool", "threads", "--concurrency", "4")


def test_queue_limits_active_1_runs_one_task_at_a_time_on_a_worker_of_4(
        broker_node: NodeProc, tmp_path: Path) -> None:
    """The worker's transport option ``queue_limits={q: {"active": 1}}`` (QLIMIT when
    it declares the queue): 10 tasks queued before it starts, never two running at
    once on its 4 threads, all run."""
    q = unique_queue("cel")
    url = node_url(broker_node)
    rec = tmp_path / "records.jsonl"
    app = producer(url)
    ids = [send(app, "nap", q, 0.2) for _ in range(10)]
    with worker(url, q, tmp_path, extra=four_at_once, limits={"active": 1}) as w:
        records = wait_records(rec, lambda r: sum(x["task"] == "nap-done" for x in r) >= 10,
                               "10 nap tasks run", w)
        with Disque([f"127.0.0.1:{broker_node.port}"]) as d:
            assert d.limits(q)["active"] == 1
            d.reset_limits(q)
    assert sorted(r["id"] for r in records if r["task"] == "nap-done") == sorted(ids)
    assert most_at_once(records, "nap-start", "nap-done") == 1


def test_queue_limits_group_active_1_runs_one_task_per_tenant(broker_node: NodeProc,
                                                              tmp_path: Path) -> None:
    """``{"group_active": 1}`` with ``fair_key``: 3 tenants' 3 tasks each, held running
    until the test opens their gate: the worker of 4 runs 3 at once, one per tenant
    (the node gives its fourth slot nothing), then each tenant's one at a time."""
    q = unique_queue("cel")
    url = node_url(broker_node)
    rec, gate = tmp_path / "records.jsonl", tmp_path / "gate"
    app = producer(url)
    app.conf.broker_transport_options = {"visibility_timeout": visibility_s,
                                         "fair_key": "tenant"}
    tenant_of = {send(app, "gated", q, str(gate), headers={"tenant": t}): t
                 for _ in range(3) for t in "ABC"}
    with Disque([f"127.0.0.1:{broker_node.port}"]) as d, \
            worker(url, q, tmp_path, extra=four_at_once, limits={"group_active": 1}) as w:
        started = wait_records(rec, lambda r: len(r) >= 3, "3 gated tasks held running", w)
        assert sorted(tenant_of[r["id"]] for r in started) == ["A", "B", "C"]
        wait_until(lambda: d.limits(q)["in-use"] == 3, 30, "3 deliveries in use", detail=w.log_tail)
        assert d.limits(q)["full-groups"] == 3 and d.qlen(q) == 6
        gate.write_text("open")
        records = wait_records(rec, lambda r: sum(x["task"] == "gated-done" for x in r) >= 9,
                               "the 9 gated tasks done", w)
        d.reset_limits(q)
    assert {r["id"] for r in records if r["task"] == "gated-done"} == set(tenant_of)
    for tenant in "ABC":
        mine = [r for r in records if tenant_of[r["id"]] == tenant]
        assert most_at_once(mine, "gated-start", "gated-done") == 1, (tenant, mine)


def test_cluster_worker_and_producer_on_different_nodes_and_leaving(
        broker_cluster: list[NodeProc], tmp_path: Path) -> None:
    worker_node, producer_node = broker_cluster[0], broker_cluster[1]
    q = unique_queue("cel")
    rec = tmp_path / "records.jsonl"
    app = producer(node_url(producer_node))
    with worker(node_url(worker_node), q, tmp_path) as w:
        check_worker_follows_leaving(broker_cluster, q, rec, w, "tasks",
                                     lambda i: send(app, "echo", q, i, time.time()))


# ------------------------------------------------------------------ the result backend


def result_producer(url: str, queue: str) -> Celery:
    """A producer with the disque:// result backend (chord_unlock goes to ``queue``)."""
    app = Celery("producer", broker=url, backend=url, set_as_current=False)
    app.conf.broker_transport_options = {"visibility_timeout": visibility_s}
    app.conf.task_default_queue = queue
    return app


def test_result_backend_get_progress_and_a_chord(broker_node: NodeProc, tmp_path: Path) -> None:
    from celery import chord, signature

    q = unique_queue("celres")
    url = node_url(broker_node)
    app = result_producer(url, q)
    marker = tmp_path / "go"
    with worker(url, q, tmp_path, backend=url) as w:
        res = app.send_task(f"{TASKS}.add", args=(2, 3), queue=q)
        assert res.get(timeout=60) == 5
        assert res.state == "SUCCESS"
        slow = app.send_task(f"{TASKS}.progressing", args=(21, str(marker)), queue=q)
        wait_until(lambda: slow.state == "PROGRESS", 60, "the PROGRESS state",
                   detail=w.log_tail)
        assert slow.info == {"step": 1, "of": 2}
        marker.write_text("go")
        assert slow.get(timeout=60) == 42
        header = [signature(f"{TASKS}.add", args=(i, i), app=app, queue=q) for i in range(20)]
        body = signature(f"{TASKS}.tsum", app=app, queue=q)
        total = chord(header, app=app)(body)
        assert total.get(timeout=120) == sum(2 * i for i in range(20))
    # a task ID no task had: PENDING (its slot answers null)
    assert app.AsyncResult("no-such-task").state == "PENDING"
    with Disque([f"127.0.0.1:{broker_node.port}"]) as d:
        assert d.qlen(q) == 0


def test_result_backend_results_survive_a_restart(tmp_path: Path) -> None:
    q = unique_queue("celaof")
    with NodeProc(tmp_path / "node", workers=2, conf={"appendonly": "yes",
                                                      "appendfsync": "always"}) as n:
        url = node_url(n)
        app = result_producer(url, q)
        with worker(url, q, tmp_path, backend=url):
            ids = [app.send_task(f"{TASKS}.add", args=(i, 1), queue=q).id for i in range(5)]
            assert [app.AsyncResult(t).get(timeout=60) for t in ids] == [i + 1 for i in range(5)]
        n.restart()
        again = result_producer(node_url(n), q)
        assert [again.AsyncResult(t).get(timeout=30) for t in ids] == [i + 1 for i in range(5)]


def test_beat_entries_run_as_schedules_after_beat_stops(broker_node: NodeProc,
                                                        tmp_path: Path) -> None:
    """A real ``celery beat -S disque_mp.kombu.beat:DisqueScheduler`` syncs its entry
    into a SCHEDULE and is stopped; the node fires it and a real worker runs it."""
    q = unique_queue("beat")
    url = node_url(broker_node)
    env = {"DISQUE_BROKER_URL": url, "BROKER_TEST_QUEUE": q, "BROKER_BEAT_EVERY_S": "1",
           "BROKER_RECORD_FILE": str(tmp_path / "records.jsonl")}
    beat = WorkerProc(["celery", "-A", TASKS, "beat", "-S", "disque_mp.kombu.beat:DisqueScheduler",
                       "-s", str(tmp_path / "beat-schedule"), "-l", "info"], env,
                      tmp_path / "beat.log")
    name = b"celery-beat:echo-every"
    with Disque([f"127.0.0.1:{broker_node.port}"]) as d:
        with beat:
            wait_until(lambda: name in d.execute("SCHEDULE", "LIST"), 60.0,
                       "beat syncing its entry", detail=beat.log_tail)
        show = next(s for s in d.schedules() if s["name"] == name.decode())
        assert show["rule"] == "EVERY 1" and show["addjob"][0] == q.encode()
        rec = tmp_path / "records.jsonl"
        with worker(url, q, tmp_path) as w:  # beat is gone: the node fires
            records = wait_records(rec, lambda r: sum(x["n"] == 42 for x in r) >= 3,
                                   "three firings run by the worker", w)
        assert all(r["n"] == 42 for r in records)
        assert d.unschedule(name)


def test_beat_rules_from_crontab_and_intervals() -> None:
    from datetime import timedelta

    from celery.beat import ScheduleEntry
    from celery.schedules import crontab, schedule

    from disque_mp.kombu.beat import rule_of

    app = Celery("rules", set_as_current=False)
    app.conf.timezone = "Europe/Paris"  # a crontab's zone is its app's

    def rule(s: Any) -> Any:
        return rule_of(ScheduleEntry(name="e", task="t", schedule=s, app=app), "UTC")

    assert rule(crontab(minute="*/15", hour="1-3", app=app)) == {"cron": "0,15,30,45 1,2,3 * * *",
                                                         "tz": "Europe/Paris"}
    assert rule(crontab(minute=0, hour=4, day_of_week="sun", app=app)) == {"cron": "0 4 * * 0",
                                                                  "tz": "Europe/Paris"}
    assert rule(schedule(timedelta(minutes=2))) == {"every": 120}
    assert rule(30.0) == {"every": 30}
    assert rule(0.5) is None  # under a second: no EVERY for it
    class Custom(schedule):  # not a plain interval (solar, one of the app's): left out
        def __init__(self) -> None:
            super().__init__(timedelta(seconds=5))

    assert rule(Custom()) is None
