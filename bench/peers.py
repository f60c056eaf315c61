"""``make bench-peers``: disque-mp head to head with the job queues users pick instead.

    python -m bench.peers                       # everything, medians of 3 (~7 min, 2 cores)
    python -m bench.peers --setting single --workload cycle --systems beanstalkd,disque-mp
    python -m bench.peers --quick               # 1 round, short runs: does it all work?

Every peer is a real server started here on free loopback ports and stopped after
(``bench/peers_servers.py``), driven by its usual Python client
(``bench/peers_drivers.py``); the workloads are ``bench/peers_load.py``'s.

- **single** (one node, no replication): disque-mp (``SINGLE_WORKERS`` workers), the same
  node with one worker (``disque-mp-1w``: what crossing workers costs), the C
  reference Disque, a Redis list (LPUSH / LMOVE / LREM), Redis Streams (XADD /
  XREADGROUP / XACK), beanstalkd (put / reserve / delete), a RabbitMQ classic queue
  (publisher confirms, manual acks).
- **replicated** (3 nodes on loopback, every job held by 3 nodes before the producer is
  answered; every client on the first node): disque-mp and the C Disque with
  ``REPLICATE 3``, a RabbitMQ quorum queue (publisher confirms, manual acks), a NATS
  JetStream work-queue stream with 3 replicas (PubAck awaited, explicit acks).

Per setting: the cycle (``CLIENTS`` producers and consumers, 1 queue and, single node,
``MANY_QUEUES`` queues), then the paced latency at ``RATES`` and at half the system's own
cycle figure. Rounds are interleaved (each round runs every system, in an order that
rotates); the figure is the median round. Writes bench/results/peers.md (one table:
system, setting, figure, ratio, command), peers.json and the plots peers-throughput.png
and peers-latency-cdf.png; a run narrowed by ``--setting``, ``--workload``, ``--systems``,
``--quick`` or ``--node-tree`` writes them under bench/scratch/ (ignored by git) unless
``--out`` says where, so that it never overwrites the record.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

from bench import peers_servers as srv
from bench import record
from bench.peers_drivers import Target, connect
from bench.peers_load import cycle, paced, percentile
from bench.plots import RESULTS

SCRATCH = RESULTS.parent / "scratch"  # a subset run's tables: never over the record

ROUNDS = 3
CLIENTS = 2  # producers, and as many consumers, in the cycle
MANY_QUEUES = 100
RATES = (1000, 5000)  # paced jobs/s; half of each system's own cycle figure is added
cycle_seconds = 1.5  # producers add for this long; the consumers then drain
paced_seconds = 2.0
SINGLE_WORKERS = 2  # disque-mp node workers, one per core of the record's machine
REPLICATED_WORKERS = 1  # 3 nodes share the 2 cores: one worker each, like the C nodes
REPLICAS = 3
SINGLE = ["disque-mp", "disque-mp-1w", "disque-c", "redis-list", "redis-streams", "beanstalkd", "rabbitmq"]
REPLICATED = ["disque-mp", "disque-c", "rabbitmq", "nats"]


def servers(setting: str, systems: list[str], work: Path, tree: Path | None,
            stack: ExitStack) -> dict[str, Target]:
    """Start every server the setting needs; the targets that could start (a missing
    reference build is reported, not fatal)."""
    n = 1 if setting == "single" else REPLICAS
    reps = 1 if setting == "single" else REPLICAS
    workers = SINGLE_WORKERS if setting == "single" else REPLICATED_WORKERS
    out: dict[str, Target] = {}
    for system in systems:
        ports = stack.enter_context(_server(system, setting, work, n, workers, tree))
        if ports:
            out[system] = Target(system, ports, reps, tuple(srv.server_pids(ports)))
    return out


def _server(system: str, setting: str, work: Path, n: int, workers: int,
            tree: Path | None) -> AbstractContextManager[list[int]]:
    from contextlib import nullcontext

    d = work / setting / system
    if system == "disque-mp":
        return srv.disque_mp_nodes(d, n, workers, tree)
    if system == "disque-mp-1w":  # the same node with one worker: what crossing workers costs
        return srv.disque_mp_nodes(d, n, 1, tree)
    if system == "disque-c":
        from bench.scaling import reference_binary

        binary, status = reference_binary()
        if binary is None:
            print(f"disque-c {status}", flush=True)
            return nullcontext([])
        return srv.reference_nodes(binary, d, n)
    if system in ("redis-list", "redis-streams"):
        return srv.redis_server(d)
    if system == "beanstalkd":
        return srv.beanstalkd(d)
    if system == "rabbitmq":
        return srv.rabbitmq(d, n)
    if system == "nats":
        return srv.nats(d, n)
    raise ValueError(f"unknown system {system!r}")


def rotated(items: list[str], k: int) -> list[str]:
    k %= max(1, len(items))
    return items[k:] + items[:k]


def with_queues(target: Target, queues: list[str], run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Set the queues up, run, tear them down; a failed run is recorded, not fatal."""
    d = connect(target)
    try:
        d.setup(queues)
        try:
            return run()
        finally:
            d.teardown(queues)
    except Exception as e:  # a peer that fails must not lose the others' figures
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    finally:
        d.close()


def run_cycles(setting: str, targets: dict[str, Target], rounds: int, seconds: float,
               results: list[dict[str, Any]]) -> None:
    shapes = [1] if setting == "replicated" else [1, MANY_QUEUES]
    for r in range(rounds):
        for nq in shapes:
            for system in rotated(list(targets), r):
                qs = [f"peers-{setting}-{system}-r{r}-{nq}-{i}" for i in range(nq)]
                res = with_queues(targets[system], qs,
                                  functools.partial(cycle, targets[system], qs, CLIENTS, seconds))
                results.append({"setting": setting, "workload": f"cycle-{nq}q", "system": system,
                                "round": r, **res})
                print(f"  {setting} cycle {nq}q {system}: {res.get('jobs_per_s', res)}", flush=True)


def median_of(results: list[dict[str, Any]], setting: str, workload: str, system: str,
              key: str) -> float | None:
    vals = [r[key] for r in results if r["setting"] == setting and r["workload"] == workload
            and r["system"] == system and key in r]
    return statistics.median(vals) if vals else None


def run_paced(setting: str, targets: dict[str, Target], rounds: int, seconds: float,
              results: list[dict[str, Any]], samples: dict[str, list[int]]) -> None:
    for r in range(rounds):
        for system in rotated(list(targets), r):
            top = median_of(results, setting, "cycle-1q", system, "jobs_per_s") or 0.0
            rates = [(f"paced-{x}", float(x)) for x in RATES]
            if top > 0:
                rates.append(("paced-half-max", top / 2))
            for name, rate in rates:
                q = f"peers-{setting}-{system}-p{r}-{name}"
                res = with_queues(targets[system], [q],
                                  functools.partial(paced, targets[system], q, rate, seconds))
                lat = res.pop("latency_ns", [])
                row = {"setting": setting, "workload": name, "system": system, "round": r, **res}
                for p in (50, 99, 99.9):
                    row[f"p{p:g}_ms"] = percentile(lat, p)
                results.append(row)
                samples[f"{setting}|{name}|{system}|{r}"] = lat
                print(f"  {setting} {name} {system}: p50 {row['p50_ms']:.3f} "
                      f"p99 {row['p99_ms']:.3f} ms at {res.get('achieved_rate', 0):.0f}/s",
                      flush=True)


def run(settings: list[str], workloads: list[str], systems: list[str] | None, rounds: int,
        quick: bool, tree: Path | None) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    samples: dict[str, list[int]] = {}
    seconds = 1.0 if quick else cycle_seconds
    pseconds = 1.0 if quick else paced_seconds
    for setting in settings:
        wanted = SINGLE if setting == "single" else REPLICATED
        chosen = [s for s in wanted if systems is None or s in systems]
        with tempfile.TemporaryDirectory(prefix="disque-mp-peers-", dir=srv.scratch_root()) as tmp, \
                ExitStack() as stack:
            t0 = time.monotonic()
            targets = servers(setting, chosen, Path(tmp), tree, stack)
            print(f"{setting}: servers up in {time.monotonic() - t0:.0f} s: {sorted(targets)}",
                  flush=True)
            if "cycle" in workloads:
                run_cycles(setting, targets, rounds, seconds, results)
            if "latency" in workloads:
                run_paced(setting, targets, rounds, pseconds, results, samples)
    return {"results": results, "samples": samples}


def out_dir(a: argparse.Namespace) -> Path:
    """``--out``, else the record's folder for the full run and bench/scratch for a
    narrowed one."""
    if a.out is not None:
        return Path(a.out)
    full = not (a.setting or a.workload or a.systems or a.quick or a.node_tree)
    return RESULTS if full else SCRATCH


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.peers")
    p.add_argument("--setting", choices=["single", "replicated"], action="append")
    p.add_argument("--workload", choices=["cycle", "latency"], action="append")
    p.add_argument("--systems", help="comma-separated subset, e.g. disque-mp,beanstalkd")
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--quick", action="store_true", help="1 s runs: a smoke test, not a record")
    p.add_argument("--node-tree", type=Path, default=None,
                   help="run the disque-mp nodes from this source tree (default: this one)")
    p.add_argument("--out", type=Path, default=None,
                   help="where peers.md etc. go (default: bench/results for the full run, "
                        "bench/scratch, which git ignores, for a subset or a quick run)")
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    out = out_dir(a)
    settings = a.setting or ["single", "replicated"]
    workloads = a.workload or ["cycle", "latency"]
    systems = a.systems.split(",") if a.systems else None
    info = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "loadavg_1m_start": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
            "argv": " ".join(["python -m bench.peers", *(argv if argv is not None else sys.argv[1:])]),
            "rounds": a.rounds, "quick": a.quick, "clients": CLIENTS,
            "single_workers": SINGLE_WORKERS, "replicated_workers": REPLICATED_WORKERS,
            **record.provenance()}
    t0 = time.monotonic()
    data = run(settings, workloads, systems, a.rounds, a.quick, a.node_tree)
    info["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    info["minutes"] = round((time.monotonic() - t0) / 60, 1)
    from bench.peers_report import write_all

    for path in write_all(data, info, out):
        print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
