"""The proof scenarios: the same Celery/Dramatiq apps (proof_celery, proof_dramatiq)
with real worker processes, on whichever broker a ``Side`` names.

Each scenario returns the figures it measured. tests/brokers/test_proof.py runs
them on disque-mp and asserts on them (small counts); bench/brokers_proof.py runs
them on disque-mp, Redis and RabbitMQ with the full counts and records them.
Nothing here asserts: a peer that redelivers a task is a figure, not a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from celery import Celery
from kombu import Connection

import disque_mp.kombu  # noqa: F401  (registers disque://)
from tests.brokers.conftest import WorkerProc
from tests.brokers.record import read_records
from tests.nodeproc import NodeProc, proc_stats, unique_queue

CELERY_APP = "tests.brokers.proof_celery"
DRAMATIQ_APP = "tests.brokers.proof_dramatiq"
# Bounds of the waits (a stuck scenario ends, it does not hang the run)
worker_ready_timeout_s = 90.0
scenario_wait_max_s = 180.0
poll_s = 0.1
celery_ready_line = "ready."
# After the producer is done: how long the worker is left to take what the
# broker hands out before its memory is read (point 2)
rss_settle_s = 3.0
rss_wait_max_s = 120.0
# kombu's Redis transport's default visibility timeout (s)
default_visibility_s = 3600


@dataclass
class Side:
    """One broker under test: its kind (disque, redis, rabbitmq), its URL for the
    apps and a directory for the workers' logs and records."""

    broker: str
    url: str
    workdir: Path
    visibility_s: int = 4
    max_deliveries: int | None = None  # disque:// only: ADDJOB MAXDELIVER
    replicate: int | None = None  # disque:// only: ADDJOB REPLICATE
    dedup: bool = False  # disque:// only: the brokers' dedup option (ADDJOB DEDUP <task id>)
    workers: list[WorkerProc] = field(default_factory=list)

    def env(self, queue: str, record: Path) -> dict[str, str]:
        return {"PROOF_BROKER_URL": self.url, "PROOF_QUEUE": queue,
                "BROKER_RECORD_FILE": str(record), "PROOF_VISIBILITY_S": str(self.visibility_s),
                "PROOF_MAX_DELIVERIES": str(self.max_deliveries or ""),
                "PROOF_REPLICATE": str(self.replicate or ""),
                "PROOF_DEDUP": "1" if self.dedup else ""}

    def celery_worker(self, queue: str, record: Path, name: str,
                      pool: tuple[str, ...] = ("-P", "prefork", "-c", "1")) -> WorkerProc:
        args = ["celery", "-A", CELERY_APP, "worker", "-Q", queue, *pool, "-l", "info",
                "-n", f"{name}@%h", "--without-mingle", "--without-gossip",
                "--without-heartbeat"]
        w = WorkerProc(args, self.env(queue, record), self.workdir / f"{queue}-{name}.log")
        self.workers.append(w.start())
        wait_for(lambda: celery_ready_line in w.log_tail(), worker_ready_timeout_s,
                 f"celery worker {name} ready", w)
        return w

    def dramatiq_worker(self, queue: str, record: Path, name: str) -> WorkerProc:
        args = ["dramatiq", DRAMATIQ_APP, "--processes", "1", "--threads", "2"]
        w = WorkerProc(args, self.env(queue, record), self.workdir / f"{queue}-{name}.log")
        self.workers.append(w.start())
        return w

    def producer(self) -> Celery:
        app = Celery("proof-producer", broker=self.url, set_as_current=False)
        options: dict[str, Any] = {"visibility_timeout": self.visibility_s}
        if self.broker == "disque" and self.max_deliveries:
            options["max_deliveries"] = self.max_deliveries
        if self.broker == "disque" and self.replicate:
            options["replicate"] = self.replicate
        if self.broker == "disque" and self.dedup:
            options["dedup"] = True
        app.conf.broker_transport_options = options
        app.conf.task_default_queue = "proof"
        return app

    def ready_count(self, queue: str) -> int:
        """Messages waiting in the queue, as the broker counts them (kombu's passive
        declare: QLEN, LLEN, RabbitMQ's message_count)."""
        with Connection(self.url, transport_options={"visibility_timeout": self.visibility_s}) as c:
            try:
                return int(c.default_channel.queue_declare(queue, passive=True).message_count)
            except c.channel_errors:  # Redis: an empty list is no key, "no such queue"
                return 0

    def stop_workers(self) -> None:
        for w in self.workers:
            w.stop()
        self.workers.clear()


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str,
             worker: WorkerProc | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            tail = worker.log_tail() if worker is not None else ""
            raise TimeoutError(f"timed out waiting for {what}\n{tail}")
        time.sleep(poll_s)


def records(path: Path, task: str | None = None) -> list[dict[str, Any]]:
    return [r for r in read_records(path) if task is None or r["task"] == task]


def send(app: Celery, task: str, queue: str, *args: Any, **options: Any) -> str:
    return str(app.send_task(f"{CELERY_APP}.{task}", args=args, queue=queue, **options).id)


def group_rss_mb(leader: int) -> float:
    """Resident memory of every process in the worker's process group (MB)."""
    total_kb = 0
    for pid, fields in proc_stats():
        if int(fields[2]) != leader:
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total_kb += int(line.split()[1])
        except OSError:
            continue
    return round(total_kb / 1024, 1)


def pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


# --------------------------------------------------------------------------- the points


def countdown_past_visibility(side: Side, countdown_s: float, watch_s: float) -> dict[str, Any]:
    """Point 1: a countdown longer than the visibility timeout; runs counted."""
    q, rec = unique_queue("p1"), side.workdir / f"p1-{side.broker}.jsonl"
    side.celery_worker(q, rec, "p1", pool=("-P", "prefork", "-c", "2"))
    sent = time.time()
    task_id = send(side.producer(), "echo", q, 1, countdown=countdown_s)
    end = sent + countdown_s + watch_s
    while time.time() < end:
        time.sleep(poll_s)
    runs = [r for r in records(rec, "echo") if r["id"] == task_id]
    side.stop_workers()
    return {"countdown_s": countdown_s, "visibility_s": side.visibility_s, "runs": len(runs),
            "first_run_after_s": round(runs[0]["t"] - sent, 2) if runs else None}


def countdown_memory(side: Side, tasks: int, countdown_s: int = 3600) -> dict[str, Any]:
    """Point 2: ``tasks`` tasks with a far countdown; the worker's RSS before and after.

    Run with the visibility timeout at Redis's default (an hour): with a short one,
    the Redis transport would also hand the worker each task again every timeout
    (point 1), and the figure would mix both effects."""
    side = replace(side, visibility_s=default_visibility_s)  # the same list of workers
    q, rec = unique_queue("p2"), side.workdir / f"p2-{side.broker}.jsonl"
    w = side.celery_worker(q, rec, "p2")
    assert w.proc is not None
    time.sleep(rss_settle_s)
    before = group_rss_mb(w.proc.pid)
    app = side.producer()
    with app.producer_or_acquire() as producer:
        for i in range(tasks):
            app.send_task(f"{CELERY_APP}.echo", args=(i,), queue=q, countdown=countdown_s,
                          producer=producer)
    # the worker takes what the broker hands out, for at most rss_wait_max_s (RabbitMQ
    # hands ETA tasks over one prefetch increment at a time)
    deadline = time.monotonic() + rss_wait_max_s
    while side.ready_count(q) and time.monotonic() < deadline:
        time.sleep(1)
    time.sleep(rss_settle_s)
    after = group_rss_mb(w.proc.pid)
    left = side.ready_count(q)
    side.stop_workers()
    return {"tasks": tasks, "countdown_s": countdown_s, "rss_before_mb": before,
            "rss_after_mb": after, "rss_growth_mb": round(after - before, 1),
            "left_in_broker_queue": left, "runs": len(records(rec))}


def killed_worker_and_long_task(side: Side, slow_s: float = 60.0) -> dict[str, Any]:
    """Point 3: a worker SIGKILLed mid-task (its task runs again on the other worker:
    how long after the kill), then a task of three visibility timeouts (runs counted)."""
    q, rec = unique_queue("p3"), side.workdir / f"p3-{side.broker}.jsonl"
    solo = ("-P", "solo")
    workers = [side.celery_worker(q, rec, f"p3{i}", pool=solo) for i in range(2)]
    app = side.producer()
    marker = side.workdir / f"p3-{side.broker}-{q}.marker"
    send(app, "slow_once", q, str(marker), slow_s)
    wait_for(lambda: records(rec, "slow"), scenario_wait_max_s, "the slow task to start")
    victim = next(w for w in workers
                  if w.proc is not None and pgid_of(records(rec, "slow")[0]["pid"]) == w.proc.pid)
    killed_at = time.time()
    victim.kill()
    wait_for(lambda: records(rec, "slow-done"), scenario_wait_max_s,
             "the killed worker's task to run again")
    rerun_s = records(rec, "slow")[-1]["t"] - killed_at
    # a fresh second worker, idle while the other runs the long task: it would take
    # a redelivery of it
    side.celery_worker(q, rec, "p3b", pool=solo)
    long_s = 3 * side.visibility_s
    send(app, "nap", q, long_s, "long")
    wait_for(lambda: records(rec, "nap-done"), scenario_wait_max_s, "the long task")
    time.sleep(side.visibility_s + 1)  # a redelivery of it would start by now
    side.stop_workers()
    return {"visibility_s": side.visibility_s, "rerun_after_kill_s": round(rerun_s, 2),
            "long_task_s": long_s, "long_runs": len(records(rec, "nap-start")),
            "long_completions": len(records(rec, "nap-done"))}


def poison(side: Side, watch_s: float, max_deliveries: int = 3) -> dict[str, Any]:
    """Point 4: a task that kills its pool process every time. Runs counted over
    ``watch_s`` after the first; on disque-mp (its tasks sent with ``max_deliveries``),
    what landed in ``dead:<queue>``."""
    if side.broker == "disque":
        side = replace(side, max_deliveries=max_deliveries)  # the same list of workers
    q, rec = unique_queue("p4"), side.workdir / f"p4-{side.broker}.jsonl"
    side.celery_worker(q, rec, "p4")
    task_id = send(side.producer(), "poison", q)
    wait_for(lambda: records(rec, "poison"), scenario_wait_max_s, "the poison task to run")
    first = records(rec, "poison")[0]["t"]
    while time.time() < first + watch_s:
        time.sleep(poll_s)
    runs = records(rec, "poison")
    out: dict[str, Any] = {"task_id": task_id, "watch_s": watch_s, "runs": len(runs),
                           "tags": sorted({r["tag"] for r in runs}),
                           "ready_after": side.ready_count(q)}
    if side.broker == "disque":
        out["dead_letter"] = dead_letter_of(side, q)
    side.stop_workers()
    return out


def dead_letter_of(side: Side, queue: str) -> dict[str, Any] | None:
    """The job in ``dead:<queue>`` (disque-mp's MAXDELIVER target), with SHOW's counters."""
    from disque_mp.client import Disque

    nodes = [u.split("//", 1)[1] for u in side.url.split(";")]
    with Disque(nodes) as d:
        jobs = d.qpeek("dead:" + queue, 10)
        if not jobs:
            return None
        shown = d.show(jobs[0].id) or {}
        headers = json.loads(jobs[0].body).get("headers", {})
        d.ack(jobs)
    return {"count": len(jobs), "id": jobs[0].id, "task_id": headers.get("id"),
            "nacks": shown.get("nacks"),
            "additional_deliveries": shown.get("additional-deliveries"),
            "maxdeliver": shown.get("maxdeliver")}


def backoff_celery(side: Side) -> dict[str, Any]:
    """Point 5, Celery: retried after 1, 2, 4 s; the delivery tags and the gaps."""
    q, rec = unique_queue("p5c"), side.workdir / f"p5c-{side.broker}.jsonl"
    side.celery_worker(q, rec, "p5c", pool=("-P", "solo"))
    send(side.producer(), "backoff", q)
    wait_for(lambda: len(records(rec, "backoff")) >= 4, scenario_wait_max_s, "four runs")
    side.stop_workers()
    return backoff_figures(records(rec, "backoff"))


def backoff_dramatiq(side: Side) -> dict[str, Any]:
    """Point 5, Dramatiq: Retries with Retry(delay=1, 2, 4 s)."""
    import subprocess
    import sys

    q, rec = unique_queue("p5d"), side.workdir / f"p5d-{side.broker}.jsonl"
    w = side.dramatiq_worker(q, rec, "p5d")
    env = {**os.environ, **side.env(q, rec)}
    subprocess.run([sys.executable, "-c", f"from {DRAMATIQ_APP} import backoff, broker; "
                    "backoff.send('k'); broker.close()"], env=env, check=True, timeout=60,
                   cwd=str(Path(__file__).resolve().parents[2]))
    wait_for(lambda: len(records(rec, "backoff")) >= 4, scenario_wait_max_s, "four runs", w)
    side.stop_workers()
    return backoff_figures(records(rec, "backoff"))


def backoff_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    gaps = [round(b["t"] - a["t"], 2) for a, b in zip(runs, runs[1:], strict=False)]
    tags = {r["tag"] for r in runs}
    known = "None" not in tags  # Celery on RabbitMQ: no delivery tag in the task's request
    return {"runs": len(runs), "retries": [r["retries"] for r in runs],
            "same_delivery_id": len(tags) == 1 if known else None,
            "delivery_ids": len(tags) if known else None, "gaps_s": gaps,
            "late_s": [round(g - 2 ** i, 2) for i, g in enumerate(gaps)]}


def cluster_failover(side: Side, nodes: list[NodeProc], tasks: int) -> dict[str, Any]:
    """Point 6 (disque-mp: ``side.url`` names the 3 nodes, ``side.replicate`` 2):
    ``tasks`` tasks; the first node SIGKILLed after a third was produced, the second
    restarted (SIGTERM, start on its AOF) after two thirds. Lost tasks counted, and
    whether the worker process is the one that started."""
    q, rec = unique_queue("p6"), side.workdir / f"p6-{side.broker}.jsonl"
    w = side.celery_worker(q, rec, "p6", pool=("-P", "prefork", "-c", "2"))
    assert w.proc is not None
    worker_pid = w.proc.pid
    app = side.producer()
    third = tasks // 3
    with app.producer_or_acquire() as producer:
        for i in range(tasks):
            if i == third:
                nodes[0].kill_group()
            elif i == 2 * third:
                nodes[1].restart()
            app.send_task(f"{CELERY_APP}.echo", args=(i,), queue=q, producer=producer)
    wait_for(lambda: len({r["n"] for r in records(rec, "echo")}) >= tasks,
             scenario_wait_max_s, f"{tasks} tasks to run", w)
    ran = [r["n"] for r in records(rec, "echo")]
    alive = w.proc.poll() is None and w.proc.pid == worker_pid
    side.stop_workers()
    return {"tasks": tasks, "lost": tasks - len(set(ran)), "runs": len(ran),
            "duplicates": len(ran) - len(set(ran)), "worker_never_restarted": alive}


def prefetch_fairness(side: Side, long_s: float, shorts: int) -> dict[str, Any]:
    """Point 7: one long task, then ``shorts`` short ones, on a worker of two processes:
    how many short ones finished before the long one, and when the last one did."""
    q, rec = unique_queue("p7"), side.workdir / f"p7-{side.broker}.jsonl"
    side.celery_worker(q, rec, "p7", pool=("-P", "prefork", "-c", "2"))
    app = side.producer()
    send(app, "nap", q, long_s, "long")
    wait_for(lambda: records(rec, "nap-start"), scenario_wait_max_s, "the long task to start")
    started = time.time()
    for i in range(shorts):
        send(app, "echo", q, i)
    wait_for(lambda: len(records(rec, "echo")) >= shorts or records(rec, "nap-done"),
             long_s + scenario_wait_max_s, "the short tasks or the long one")
    short_done = records(rec, "echo")
    long_done = records(rec, "nap-done")
    long_end = long_done[0]["t"] if long_done else float("inf")
    if len(short_done) < shorts:
        wait_for(lambda: len(records(rec, "echo")) >= shorts, scenario_wait_max_s,
                 "the short tasks after the long one")
    short_done = records(rec, "echo")
    side.stop_workers()
    return {"long_s": long_s, "shorts": shorts,
            "shorts_before_long_ended": sum(1 for r in short_done if r["t"] < long_end),
            "last_short_after_s": round(max(r["t"] for r in short_done) - started, 2)}


def resent_task(side: Side, sends: int = 3, nap_s: float = 3.0,
                timeout_s: float = 0.5) -> dict[str, Any]:
    """Point 8: a producer that gets no reply in ``timeout_s`` sends the same task
    again (same Celery task ID, same Dramatiq message), ``sends`` times in all, while
    the first one runs (a task of ``nap_s``). Runs counted for Celery and Dramatiq; on
    disque-mp with the brokers' ``dedup`` option (ADDJOB DEDUP <task id>), the peers
    have no such option."""
    if side.broker == "disque":
        side = replace(side, dedup=True)  # the same list of workers
    q, rec = unique_queue("p8c"), side.workdir / f"p8c-{side.broker}.jsonl"
    side.celery_worker(q, rec, "p8c", pool=("-P", "prefork", "-c", "2"))
    app = side.producer()
    task_id = str(uuid.uuid4())
    for _ in range(sends):
        send(app, "nap", q, nap_s, "resent", task_id=task_id)
        time.sleep(timeout_s)
    celery_runs = _runs_settled(rec, task_id, nap_s)
    side.stop_workers()
    q, rec = unique_queue("p8d"), side.workdir / f"p8d-{side.broker}.jsonl"
    w = side.dramatiq_worker(q, rec, "p8d")
    env = {**os.environ, **side.env(q, rec)}
    code = (f"import time\nfrom {DRAMATIQ_APP} import nap, broker\n"
            f"m = nap.message({nap_s}, 'resent')\nprint(m.message_id, flush=True)\n"
            f"for _ in range({sends}):\n    broker.enqueue(m)\n"
            f"    getattr(broker, 'confirm_enqueued', lambda: None)()\n"
            f"    time.sleep({timeout_s})\nbroker.close()\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60,
                         capture_output=True, text=True,
                         cwd=str(Path(__file__).resolve().parents[2]))
    message_id = out.stdout.split()[0]
    wait_for(lambda: records(rec, "nap-start"), scenario_wait_max_s, "the resent message", w)
    dramatiq_runs = _runs_settled(rec, message_id, nap_s)
    side.stop_workers()
    return {"sends": sends, "timeout_s": timeout_s, "task_s": nap_s, "dedup": side.dedup,
            "celery_runs": celery_runs, "dramatiq_runs": dramatiq_runs}


def _runs_settled(rec: Path, task_id: str, nap_s: float) -> int:
    """Runs of ``task_id`` once the first finished and a further run would have too."""
    wait_for(lambda: [r for r in records(rec, "nap-done") if r["id"] == task_id],
             scenario_wait_max_s, f"task {task_id} to run")
    time.sleep(nap_s + 1.0)
    return len([r for r in records(rec, "nap-start") if r["id"] == task_id])
