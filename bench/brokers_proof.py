"""The proof, side by side: the same Celery and Dramatiq apps, real worker processes,
on disque-mp, on Redis (redis-server) and on RabbitMQ (rabbitmq-server).

    python -m bench.brokers_proof                 # the full counts; bench/results/brokers-proof.{json,md}
    python -m bench.brokers_proof --quick --out /tmp/p   # small counts, a look at the harness

The scenarios are tests/brokers/proof.py's (tests/brokers/test_proof.py asserts on
disque-mp's figures with smaller counts); here each one runs on every broker and
its figures are recorded, not asserted: a peer that runs a task twice is a
result. Every server is started by this script on free loopback ports and
stopped at the end (RabbitMQ with its own epmd).
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
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import fair_tenants, record  # noqa: E402
from bench.brokers_rabbit import RabbitServer  # noqa: E402
from bench.redisq import RedisServer  # noqa: E402
from tests.brokers import proof  # noqa: E402
from tests.nodeproc import NodeProc, form_cluster, free_port  # noqa: E402

brokers_all = ("disque", "redis", "rabbitmq")
visibility_s = 4  # the Redis transport's visibility timeout and Disque's RETRY, both
node_workers = 2
cluster_form_timeout_s = 60.0


def scale(quick: bool) -> dict[str, Any]:
    """The full counts (or small ones with --quick)."""
    if quick:
        return {"countdown_s": 12, "watch_s": 6, "memory_tasks": 2_000, "poison_watch_s": 10,
                "fair_long_s": 10, "fair_shorts": 100, "failover_tasks": 900,
                "tenant_backlog": 5_000}
    return {"countdown_s": 30, "watch_s": 15, "memory_tasks": 100_000, "poison_watch_s": 30,
            "fair_long_s": 60, "fair_shorts": 100, "failover_tasks": 10_000,
            "tenant_backlog": 100_000}


def points(s: dict[str, Any]) -> dict[str, Callable[[proof.Side], dict[str, Any]]]:
    return {
        "1 countdown > visibility timeout": lambda side: proof.countdown_past_visibility(
            side, s["countdown_s"], s["watch_s"]),
        "2 countdown=3600 tasks, worker RSS": lambda side: proof.countdown_memory(
            side, s["memory_tasks"]),
        "3 killed worker / long task": proof.killed_worker_and_long_task,
        "4 poison task": lambda side: proof.poison(side, s["poison_watch_s"]),
        "5 backoff 1, 2, 4 s (Celery)": proof.backoff_celery,
        "5 backoff 1, 2, 4 s (Dramatiq)": proof.backoff_dramatiq,
        "7 prefetch fairness": lambda side: proof.prefetch_fairness(
            side, s["fair_long_s"], s["fair_shorts"]),
        "8 producer re-sends a task 3 times": lambda side: proof.resent_task(side),
        "9 fair tenants": lambda side: fair_tenants.on_side(
            side.broker, side.url, s["tenant_backlog"], 100),
    }


def run_broker(broker: str, workdir: Path, s: dict[str, Any],
               only: set[str] | None) -> dict[str, Any]:
    """Every point on one broker (its server started here, stopped at the end)."""
    server: Any
    if broker == "disque":
        server = NodeProc(workdir / "node", workers=node_workers,
                          conf={"loglevel": "warning", "maxmemory": "8gb"})
        server.start()
        url = f"disque://127.0.0.1:{server.port}"
    elif broker == "redis":
        server = RedisServer(workdir / "redis", free_port()).start()
        url = f"redis://127.0.0.1:{server.port}/0"
    else:
        server = RabbitServer(workdir / "rabbitmq").start()
        url = server.url
    side = proof.Side(broker, url, workdir, visibility_s=visibility_s)
    out: dict[str, Any] = {}
    try:
        for name, fn in points(s).items():
            if only and name.split()[0] not in only:
                continue
            out[name] = _one(name, broker, lambda fn=fn: fn(side))  # type: ignore[misc]
            side.stop_workers()
    finally:
        side.stop_workers()
        server.stop()
    return out


def _one(name: str, broker: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    print(f"{broker}: {name} ...", file=sys.stderr, flush=True)
    started = time.time()
    try:
        fig = fn()
    except Exception as exc:  # a peer that hangs or errors is recorded, the run goes on
        fig = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        traceback.print_exc()
    fig["scenario_s"] = round(time.time() - started, 1)
    print(f"{broker}: {name}: {json.dumps(fig)}", file=sys.stderr, flush=True)
    return fig


def run_failover(workdir: Path, tasks: int) -> dict[str, Any]:
    """Point 6, disque-mp only: 3 nodes with AOF, REPLICATE 2."""
    nodes = [NodeProc(workdir / f"c{i}", workers=1,
                      conf={"cluster-node-timeout": 3000, "appendonly": "yes",
                            "loglevel": "warning"}) for i in range(3)]
    side = proof.Side("disque", ";".join(f"disque://127.0.0.1:{n.port}" for n in nodes),
                      workdir, visibility_s=visibility_s, replicate=2)
    try:
        for n in nodes:
            n.start()
        form_cluster(nodes, cluster_form_timeout_s)
        return _one("6 cluster failover", "disque",
                    lambda: proof.cluster_failover(side, nodes, tasks))
    finally:
        side.stop_workers()
        for n in nodes:
            n.stop()


def _merged(path: Path, rerun: dict[str, Any]) -> dict[str, Any]:
    """A run of some points (--points) folded into the report of record at ``path``:
    its figures replace those points' figures, its time and load are listed under
    ``reruns``; the rest of the report stays as it was."""
    if not path.exists():
        return rerun
    report = json.loads(path.read_text())
    for broker, figures in rerun["results"].items():
        report["results"].setdefault(broker, {}).update(figures)
    report.setdefault("reruns", []).append(
        {"time": rerun["time"], "loadavg_1m": rerun["loadavg_1m"],
         "points": sorted(f"{broker}: {p}" for broker, figures in rerun["results"].items()
                          for p in figures)})
    return report


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("celery", "kombu", "dramatiq", "redis", "amqp", "pika"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "not installed"
    out["python"] = platform.python_version()
    out["redis-server"] = subprocess.run(["redis-server", "--version"], capture_output=True,
                                         text=True).stdout.split()[2]
    dpkg = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"],
                          capture_output=True, text=True)
    out["rabbitmq-server"] = dpkg.stdout.strip() or "unknown"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts (a look, not a record)")
    ap.add_argument("--brokers", default=",".join(brokers_all))
    ap.add_argument("--points", default="", help="e.g. 1,4,5 (default: all)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args(argv)
    # SIGTERM unwinds like an exception, so every server and worker started is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from bench.brokers_proof_report import to_markdown
    from disque_mp import compiled

    s = scale(args.quick)
    only = set(args.points.split(",")) if args.points else None
    workdir = Path(tempfile.mkdtemp(prefix="bench-brokers-proof-"))
    load_before = os.getloadavg()[0]
    results: dict[str, dict[str, Any]] = {}
    for broker in args.brokers.split(","):
        results[broker] = run_broker(broker, workdir / broker, s, only)
    if "disque" in args.brokers.split(",") and (only is None or "6" in only):
        results["disque"]["6 cluster failover"] = run_failover(workdir / "cluster",
                                                               s["failover_tasks"])
    report = {"time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "scale": s,
              "quick": args.quick, "visibility_s": visibility_s,
              "machine": f"{os.cpu_count()} CPUs, {platform.platform()}",
              "node_build": compiled.summary(), "commit": record.commit(), "versions": _versions(),
              "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
              "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    if only is not None:
        report = _merged(args.out / "brokers-proof.json", report)
    (args.out / "brokers-proof.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "brokers-proof.md").write_text(to_markdown(report))
    print(to_markdown(report))
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
