"""Celery and Dramatiq on disque-mp against the same frameworks on redis-server and
on rabbitmq-server.

    python -m bench.brokers                      # 3 rounds of 50,000 tasks, writes bench/results/brokers.{json,md}
    python -m bench.brokers --tasks 2000 --rounds 1 --out /tmp/b   # a quick look

For each framework (Celery, Dramatiq) and each broker (disque-mp node with 2
workers; redis-server with the framework's own Redis broker; rabbitmq-server
with Celery's amqp:// transport (py-amqp) and Dramatiq's RabbitmqBroker (pika)),
in the same run:

1. **prefill**: a producer process enqueues ``--tasks`` no-op tasks as fast as
   it can, no worker running (enqueue/s alone; the time includes waiting for the
   node's replies to pipelined publishes, ``flush_windows``);
2. **drain**: a real worker process starts (``celery worker -c 2`` prefork,
   ``acks_late``, prefetch multiplier 4 / ``dramatiq --processes 1 --threads 2``,
   ``--dramatiq-processes`` / ``--dramatiq-threads`` to change it)
   and runs them (consume/s alone: tasks / (last start - first start), the
   worker's start-up not counted);
3. **saturated**: ``--tasks`` more, produced while the worker consumes;
   tasks/s = tasks / (last task start - first enqueue); the enqueue-to-start
   latency is then mostly time spent queued behind the others;
4. **paced**: ``--paced-tasks`` tasks at ``--paced-rate``/s, well under
   capacity: the enqueue-to-start latency of a system that keeps up.

This is repeated ``--rounds`` times, the brokers interleaved (round ``i`` starts
with a different broker each time, so that a change in the machine's load falls
on all of them); every figure reported is the median over the rounds, and the
ratios are disque-mp's median over each other broker's. Each task appends
``sent_at start_at`` to a file (same cost on every broker). The machine running
this is usually shared (2 cores): the 1-minute load average before and after
each run is recorded with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.brokers_rabbit import RabbitServer  # noqa: E402
from bench.redisq import RedisServer  # noqa: E402
from tests.nodeproc import NodeProc, free_port  # noqa: E402

tasks_default = 50_000
paced_tasks_default = 2_000
paced_rate_default = 200.0  # tasks/s, far under what every broker sustains
rounds_default = 3
brokers_all = ("disque", "redis", "rabbitmq")
broker_titles = {"disque": "disque-mp", "redis": "Redis", "rabbitmq": "RabbitMQ"}
node_workers = 2
warmup_timeout_s = 120.0
# a run gives up when no task started for this long (a stuck worker, not a slow one)
stall_timeout_s = 120.0
worker_stop_timeout_s = 30.0

WORKER_ARGS = {
    "celery": ["celery", "-A", "bench.brokers_apps:celery_app", "worker", "-c", "2",
               "-P", "prefork", "-l", "warning", "--without-mingle", "--without-gossip",
               "--without-heartbeat"],
    "dramatiq": ["dramatiq", "bench.brokers_apps"],  # + --processes, --threads
}
dramatiq_processes_default = 1
dramatiq_threads_default = 2


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
    from disque_mp.client.batching import flush_windows

    flush_windows()  # disque://: the pipelined publishes answered (a no-op elsewhere)
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
                          "--rate", str(rate)], cwd=str(REPO), env=env,
                         capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"producer exited {out.returncode}:\n{out.stderr[-3000:]}")
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
            paced_rate: float, workdir: Path, worker_args: list[str]) -> dict[str, Any]:
    queue = f"bench-{framework}-{uuid.uuid4().hex[:8]}"
    record = workdir / f"{framework}-{broker}.rec"
    log = workdir / f"{framework}-{broker}.log"
    env = _env(framework, url, queue, record)
    args = list(WORKER_ARGS[framework]) + worker_args
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

    out = {p: version(p) for p in ("celery", "kombu", "dramatiq", "redis", "amqp", "pika")}
    out["python"] = platform.python_version()
    out["redis-server"] = subprocess.run(["redis-server", "--version"], capture_output=True,
                                         text=True).stdout.strip()
    dpkg = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"],
                          capture_output=True, text=True)
    out["rabbitmq-server"] = dpkg.stdout.strip() or "unknown"
    return out


def _git_rev() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=str(REPO),
                         capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           cwd=str(REPO), capture_output=True, text=True).stdout.strip()
    return out.stdout.strip() + (" (uncommitted changes)" if dirty else "")


def _median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of every figure over the rounds of one framework on one broker."""
    def med(values: list[Any]) -> Any:
        if isinstance(values[0], dict):
            return {k: med([v[k] for v in values]) for k in values[0]}
        return round(statistics.median(values), 2)

    keys = ("enqueue_per_s", "drain_per_s", "saturated", "paced")
    out = {k: med([r[k] for r in runs]) for k in keys}
    out.update(framework=runs[0]["framework"], broker=runs[0]["broker"], rounds=len(runs),
               loadavg_1m=[r["loadavg_1m"] for r in runs])
    return out


def medians(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["framework"], r["broker"]), []).append(r)
    return [_median_of(g) for g in groups.values()]


def _load_range(loads: list[list[float]]) -> str:
    flat = [x for pair in loads for x in pair]
    return f"{min(flat)}-{max(flat)}"


def _ratio_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for fw in ("celery", "dramatiq"):
        by = {r["broker"]: r for r in rows if r["framework"] == fw}
        for other in brokers_all[1:]:
            if "disque" not in by or other not in by:
                continue
            d, o = by["disque"], by[other]
            tput = d["saturated"]["tasks_per_s"] / o["saturated"]["tasks_per_s"]
            drain = d["drain_per_s"] / o["drain_per_s"]
            sat99 = d["saturated"]["latency_p99_ms"] / max(1e-9, o["saturated"]["latency_p99_ms"])
            p99 = d["paced"]["latency_p99_ms"] / max(1e-9, o["paced"]["latency_p99_ms"])
            lines.append(f"- {fw}, disque-mp / {broker_titles[other]}: tasks/s {tput:.2f}x "
                         f"(consume alone {drain:.2f}x); p99 enqueue-to-start {sat99:.2f}x "
                         f"saturated, {p99:.2f}x paced (lower is better)")
    return lines


def to_markdown(report: dict[str, Any]) -> str:
    rows = report["medians"]
    v = report["versions"]
    lines = [
        "# Celery and Dramatiq: disque-mp broker vs the Redis and RabbitMQ brokers",
        "",
        f"`{report['command']}` at {report['time']}, {report['machine']}; node: disque-mp "
        f"with {node_workers} workers ({report['node_build']}), redis-server "
        f"{v['redis-server'].split()[2]}, rabbitmq-server {v['rabbitmq-server']}; git "
        f"{report.get('git_rev', '?')}; worker flags: celery "
        f"`{' '.join(report['worker_flags']['celery'])}`, dramatiq "
        f"`{' '.join(report['worker_flags']['dramatiq'])}`; workers, "
        "producer, node, redis-server and rabbitmq-server share the machine's cores. "
        f"Medians of {report['rounds']} rounds, brokers interleaved; load avg is the "
        "1-minute load average, lowest-highest seen before and after the runs.",
        "",
        "| framework | broker | tasks/s, produce and consume at once | p99 enqueue-to-start "
        "then | enqueue/s alone | consume/s alone (drain) | "
        f"p50 / p99 enqueue-to-start, paced at {report['paced_rate']:.0f}/s | load avg |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s, p = r["saturated"], r["paced"]
        lines.append(f"| {r['framework']} | {broker_titles[r['broker']]} | "
                     f"{s['tasks_per_s']:,.0f} | {s['latency_p99_ms']:,.0f} ms | "
                     f"{r['enqueue_per_s']:,.0f} | {r['drain_per_s']:,.0f} | "
                     f"{p['latency_p50_ms']:.1f} / {p['latency_p99_ms']:.1f} ms | "
                     f"{_load_range(r['loadavg_1m'])} |")
    lines += ["", "Ratios (medians, same run):", "", *_ratio_lines(rows), ""]
    return "\n".join(lines)


def run_rounds(args: argparse.Namespace, urls: dict[str, str],
               workdir: Path) -> list[dict[str, Any]]:
    """Every framework on every broker, ``args.rounds`` times, the brokers' order rotated."""
    brokers = args.brokers.split(",")
    runs = []
    for i in range(args.rounds):
        (workdir / f"r{i}").mkdir(parents=True, exist_ok=True)
        order = brokers[i % len(brokers):] + brokers[:i % len(brokers)]
        for framework in args.frameworks.split(","):
            for broker in order:
                print(f"round {i + 1}: {framework} on {broker} ...", file=sys.stderr, flush=True)
                extra = [] if framework == "celery" else [
                    "--processes", str(args.dramatiq_processes),
                    "--threads", str(args.dramatiq_threads)]
                run = run_one(framework, broker, urls[broker], args.tasks, args.paced_tasks,
                              args.paced_rate, workdir / f"r{i}", extra)
                run["round"] = i + 1
                print(json.dumps(run), file=sys.stderr, flush=True)
                runs.append(run)
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=tasks_default)
    ap.add_argument("--paced-tasks", type=int, default=paced_tasks_default)
    ap.add_argument("--paced-rate", type=float, default=paced_rate_default)
    ap.add_argument("--frameworks", default="celery,dramatiq")
    ap.add_argument("--brokers", default=",".join(brokers_all))
    ap.add_argument("--rounds", type=int, default=rounds_default)
    ap.add_argument("--dramatiq-processes", type=int, default=dramatiq_processes_default)
    ap.add_argument("--dramatiq-threads", type=int, default=dramatiq_threads_default)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--produce", type=int, help=argparse.SUPPRESS)  # producer subprocess
    ap.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.produce is not None:
        print(json.dumps(produce(args.produce, args.rate)))
        return 0

    from disque_mp import compiled

    # SIGTERM unwinds like an exception, so every server and worker started is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = Path(tempfile.mkdtemp(prefix="bench-brokers-"))
    brokers = args.brokers.split(",")
    node = NodeProc(workdir / "node", workers=node_workers,
                    conf={"loglevel": "warning", "maxmemory": "8gb"})
    redis_server = RedisServer(workdir / "redis", free_port())
    rabbit = RabbitServer(workdir / "rabbitmq") if "rabbitmq" in brokers else None
    try:
        urls = {}
        if "disque" in brokers:
            node.start()
            urls["disque"] = f"disque://127.0.0.1:{node.port}"
        if "redis" in brokers:
            redis_server.start()
            urls["redis"] = f"redis://127.0.0.1:{redis_server.port}/0"
        if rabbit is not None:
            urls["rabbitmq"] = rabbit.start().url
        runs = run_rounds(args, urls, workdir)
    finally:
        node.stop()
        redis_server.stop()
        if rabbit is not None:
            rabbit.stop()
    report = {"command": "python -m bench.brokers " + " ".join(argv or sys.argv[1:]),
              "tasks": args.tasks, "paced_tasks": args.paced_tasks,
              "paced_rate": args.paced_rate, "rounds": args.rounds,
              "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{os.cpu_count()} CPUs, {platform.platform()}",
              "node_build": compiled.summary(), "versions": _versions(),
              "git_rev": _git_rev(),
              "worker_flags": {"celery": WORKER_ARGS["celery"][4:] + ["-Q", "<queue>"],
                               "dramatiq": ["--processes", str(args.dramatiq_processes),
                                            "--threads", str(args.dramatiq_threads)]},
              "medians": medians(runs), "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "brokers.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "brokers.md").write_text(to_markdown(report))
    print(to_markdown(report))
    shutil.rmtree(workdir, ignore_errors=True)  # kept when a run failed, for its logs
    return 0


if __name__ == "__main__":
    sys.exit(main())
