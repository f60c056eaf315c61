"""Celery and Dramatiq on disque-mp against the same frameworks on redis-server.

    python -m bench.brokers                      # 50,000 tasks per run, writes bench/results/brokers.{json,md}
    python -m bench.brokers --tasks 2000 --out /tmp/b   # a quick look

For each framework (Celery, Dramatiq) and each broker (disque-mp node with 2
workers, redis-server with the framework's own Redis broker), in the same run:

1. **prefill**: a producer process enqueues ``--tasks`` no-op tasks as fast as
   it can, no worker running (enqueue/s alone);
2. **drain**: a real worker process starts (``celery worker -c 2`` prefork /
   ``dramatiq --processes 2 --threads 4``) and runs them (consume/s alone:
   tasks / (last start - first start), the worker's start-up not counted);
3. **saturated**: ``--tasks`` more, produced while the worker consumes;
   tasks/s = tasks / (last task start - first enqueue); the enqueue-to-start
   latency is then mostly time spent queued behind the others;
4. **paced**: ``--paced-tasks`` tasks at ``--paced-rate``/s, well under
   capacity: the enqueue-to-start latency of a system that keeps up.

Each task appends ``sent_at start_at`` to a file (same cost on both brokers).
The machine running this is usually shared (2 cores): the load average before
and after each run is recorded with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.redisq import RedisServer  # noqa: E402
from tests.nodeproc import NodeProc, free_port  # noqa: E402

tasks_default = 50_000
paced_tasks_default = 2_000
paced_rate_default = 200.0  # tasks/s, far under what either broker sustains
node_workers = 2
warmup_timeout_s = 120.0
# a run gives up when no task started for this long (a stuck worker, not a slow one)
stall_timeout_s = 120.0
worker_stop_timeout_s = 30.0

WORKER_ARGS = {
    "celery": ["celery", "-A", "bench.brokers_apps:celery_app", "worker", "-c", "2",
               "-P", "prefork", "-l", "warning", "--without-mingle", "--without-gossip",
               "--without-heartbeat"],
    "dramatiq": ["dramatiq", "bench.brokers_apps", "--processes", "2", "--threads", "4"],
}


# --------------------------------------------------------------------------- producer side


def produce(count: int, rate: float) -> dict[str, float]:
    """In the producer process: enqueue ``count`` tasks (``rate`` per second, 0 = flat out)."""
    from bench import brokers_apps as apps

    if apps.FRAMEWORK == "celery":
        app = apps.celery_app

        def send(now: float) -> None:
            app.send_task("bench.noop", args=(now,), queue=apps.QUEUE)
    else:
        actor = apps.noop

        def send(now: float) -> None:
            actor.send(now)

    begin = time.time()
    for i in range(count):
        if rate > 0:
            due = begin + i / rate
            wait = due - time.time()
            if wait > 0:
                time.sleep(wait)
        send(time.time())
    return {"begin": begin, "end": time.time()}


# --------------------------------------------------------------------------- runner side


def _env(framework: str, url: str, queue: str, record: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(BENCH_FRAMEWORK=framework, BENCH_BROKER_URL=url, BENCH_QUEUE=queue,
               BENCH_RECORD_FILE=str(record))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _run_producer(env: dict[str, str], count: int, rate: float) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-m", "bench.brokers", "--produce", str(count),
                          "--rate", str(rate)], cwd=str(REPO), env=env, check=True,
                         capture_output=True, text=True, timeout=3600)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _lines(record: Path) -> list[tuple[float, float]]:
    if not record.exists():
        return []
    out = []
    for line in record.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            out.append((float(parts[0]), float(parts[1])))
    return out


def _wait_lines(record: Path, want: int, worker: subprocess.Popen[bytes], log: Path) -> None:
    seen, last_change = -1, time.monotonic()
    while True:
        n = len(_lines(record))
        if n >= want:
            return
        if n != seen:
            seen, last_change = n, time.monotonic()
        if worker.poll() is not None or time.monotonic() - last_change > stall_timeout_s:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise RuntimeError(f"{n}/{want} tasks ran; worker log:\n{tail}")
        time.sleep(0.5)


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def _phase(lines: list[tuple[float, float]], window: dict[str, float]) -> dict[str, float]:
    rows = [(s, t) for s, t in lines if window["begin"] <= s <= window["end"]]
    lat_ms = [(t - s) * 1000 for s, t in rows]
    first_sent = min(s for s, _ in rows)
    last_start = max(t for _, t in rows)
    return {
        "tasks": len(rows),
        "tasks_per_s": round(len(rows) / (last_start - first_sent), 1),
        "enqueue_per_s": round(len(rows) / max(1e-9, window["end"] - window["begin"]), 1),
        "latency_p50_ms": round(_percentile(lat_ms, 50), 2),
        "latency_p99_ms": round(_percentile(lat_ms, 99), 2),
        "latency_max_ms": round(max(lat_ms), 2),
    }


def run_one(framework: str, broker: str, url: str, tasks: int, paced_tasks: int,
            paced_rate: float, workdir: Path) -> dict[str, Any]:
    queue = f"bench-{framework}-{uuid.uuid4().hex[:8]}"
    record = workdir / f"{framework}-{broker}.rec"
    log = workdir / f"{framework}-{broker}.log"
    env = _env(framework, url, queue, record)
    args = list(WORKER_ARGS[framework])
    if framework == "celery":
        args += ["-Q", queue]
    load_before = os.getloadavg()[0]
    # prefill: the whole batch enqueued while no worker runs (enqueue rate alone)
    prefill = _run_producer(env, tasks, 0)
    with open(log, "ab") as out:
        worker = subprocess.Popen([sys.executable, "-m", *args], cwd=str(REPO), env=env,
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        _wait_lines(record, tasks, worker, log)  # drain: consume rate alone
        saturated = _run_producer(env, tasks, 0)  # both at once
        _wait_lines(record, 2 * tasks, worker, log)
        paced = _run_producer(env, paced_tasks, paced_rate)
        _wait_lines(record, 2 * tasks + paced_tasks, worker, log)
    finally:
        _stop(worker)
    lines = _lines(record)
    drained = [t for s_at, t in lines if prefill["begin"] <= s_at <= prefill["end"]]
    return {"framework": framework, "broker": broker,
            "enqueue_per_s": round(tasks / (prefill["end"] - prefill["begin"]), 1),
            "drain_per_s": round(len(drained) / (max(drained) - min(drained)), 1),
            "saturated": _phase(lines, saturated), "paced": _phase(lines, paced),
            "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def _stop(worker: subprocess.Popen[bytes]) -> None:
    """SIGTERM (warm shutdown), then SIGKILL whatever is left of its process group."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=worker_stop_timeout_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(worker.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    worker.wait()


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {p: version(p) for p in ("celery", "kombu", "dramatiq", "redis")}
    out["python"] = platform.python_version()
    out["redis-server"] = subprocess.run(["redis-server", "--version"], capture_output=True,
                                         text=True).stdout.strip()
    return out


def to_markdown(report: dict[str, Any]) -> str:
    rows = report["runs"]
    lines = [
        "# Celery and Dramatiq: disque-mp broker vs the Redis broker",
        "",
        f"`python -m bench.brokers --tasks {report['tasks']}` at {report['time']}, "
        f"{report['machine']}; node: disque-mp with {node_workers} workers "
        f"({report['node_build']}), redis-server {report['versions']['redis-server'].split()[2]}; "
        "workers, producer, node and redis-server share the machine's cores.",
        "",
        "| framework | broker | tasks/s, produce and consume at once | p99 enqueue-to-start "
        "then | enqueue/s alone | consume/s alone (drain) | "
        f"p50 / p99 enqueue-to-start, paced at {report['paced_rate']:.0f}/s | load avg |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s, p = r["saturated"], r["paced"]
        lines.append(f"| {r['framework']} | {r['broker']} | {s['tasks_per_s']:,.0f} | "
                     f"{s['latency_p99_ms']:,.0f} ms | {r['enqueue_per_s']:,.0f} | "
                     f"{r['drain_per_s']:,.0f} | {p['latency_p50_ms']:.1f} / "
                     f"{p['latency_p99_ms']:.1f} ms | {r['loadavg_1m'][0]} -> {r['loadavg_1m'][1]} |")
    lines += ["", "Ratios (disque-mp / Redis, same run):", ""]
    for fw in ("celery", "dramatiq"):
        by = {r["broker"]: r for r in rows if r["framework"] == fw}
        if "disque" in by and "redis" in by:
            d, rd = by["disque"], by["redis"]
            tput = d["saturated"]["tasks_per_s"] / rd["saturated"]["tasks_per_s"]
            drain = d["drain_per_s"] / rd["drain_per_s"]
            sat99 = d["saturated"]["latency_p99_ms"] / max(1e-9, rd["saturated"]["latency_p99_ms"])
            p99 = d["paced"]["latency_p99_ms"] / max(1e-9, rd["paced"]["latency_p99_ms"])
            lines.append(f"- {fw}: tasks/s {tput:.2f}x (consume alone {drain:.2f}x); p99 "
                         f"enqueue-to-start {sat99:.2f}x saturated, {p99:.2f}x paced "
                         "(lower is better)")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=tasks_default)
    ap.add_argument("--paced-tasks", type=int, default=paced_tasks_default)
    ap.add_argument("--paced-rate", type=float, default=paced_rate_default)
    ap.add_argument("--frameworks", default="celery,dramatiq")
    ap.add_argument("--brokers", default="disque,redis")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--produce", type=int, help=argparse.SUPPRESS)  # producer subprocess
    ap.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.produce is not None:
        print(json.dumps(produce(args.produce, args.rate)))
        return 0

    from disque_mp import compiled

    workdir = Path(tempfile.mkdtemp(prefix="bench-brokers-"))
    node = NodeProc(workdir / "node", workers=node_workers,
                    conf={"loglevel": "warning", "maxmemory": "8gb"})
    redis_server = RedisServer(workdir / "redis", free_port())
    runs = []
    try:
        node.start()
        redis_server.start()
        urls = {"disque": f"disque://127.0.0.1:{node.port}",
                "redis": f"redis://127.0.0.1:{redis_server.port}/0"}
        for framework in args.frameworks.split(","):
            for broker in args.brokers.split(","):
                print(f"{framework} on {broker} ...", file=sys.stderr, flush=True)
                run = run_one(framework, broker, urls[broker], args.tasks, args.paced_tasks,
                              args.paced_rate, workdir)
                print(json.dumps(run), file=sys.stderr, flush=True)
                runs.append(run)
    finally:
        node.stop()
        redis_server.stop()
    report = {"tasks": args.tasks, "paced_tasks": args.paced_tasks, "paced_rate": args.paced_rate,
              "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{os.cpu_count()} CPUs, {platform.platform()}",
              "node_build": compiled.summary(), "versions": _versions(), "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "brokers.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "brokers.md").write_text(to_markdown(report))
    print(to_markdown(report))
    shutil.rmtree(workdir, ignore_errors=True)  # kept when a run failed, for its logs
    return 0


if __name__ == "__main__":
    sys.exit(main())
