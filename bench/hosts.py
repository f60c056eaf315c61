"""The horizontal-scaling record: 1, 2, 4 ... hosts, the C reference beside them.

    python -m bench.hosts [--nodes 1 2 4] [--replicate 1 2 3] [--traffic local federated]
        [--rate 1000] [--seconds 6] [--workers 1] [--trees base=/tmp/base new=.]
        [--no-reference] [--out bench/results/hosts]

For each system (each disque-mp tree, its compiled build if it has one, and the C
reference Disque built from its source tarball) and each cluster size N, N nodes on
loopback joined with CLUSTER MEET, and one paced client process per node: every
``batch / rate`` seconds it pipelines ``batch`` ADDJOBs (``REPLICATE r``, synchronous)
to its own node, then takes them with GETJOB COUNT and acknowledges them with one
ACKJOB. ``local``: the consumer is on the producer's node; ``federated``: on the next
node (``i + 1``), which pulls the jobs by federation (NEEDJOBS / YOURJOBS).

Measured over ``--seconds`` after a warm-up second: the jobs delivered (and jobs/s),
and the node CPU of every process of every node (supervisor and workers: utime +
stime from /proc) divided by the jobs delivered: microseconds of node CPU per job.
The clients' own CPU is not counted. A rate the cluster does not hold shows as fewer
jobs/s than asked.

Writes ``<out>.md`` and ``<out>.json`` (the current record: build, commit, machine).

    python -m bench.hosts --instructions [--nodes 2 4] [--replicate 2] [--batches 40]
        [--trees base=/tmp/base new=.]

``--instructions`` counts work instead of time (a shared 2-core machine blurs the
timed figures): every node of the cluster runs under callgrind (as bench.instructions
runs one), one client on the first node sends ``--batches`` batches (ADDJOB x batch
with ``REPLICATE r``, GETJOB COUNT, one ACKJOB), then waits for the ack GC to end on
every node; the count of every process of every node, less the idle rate measured
before for as long, divided by the jobs: instructions per job for the cluster, and
for the first node (the origin) and the others (the copies) apart.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from bench import peers_servers as srv

warmup_s = 1.0
take_timeout_ms = 200  # one GETJOB's wait; a batch is normally there within milliseconds
take_rounds_max = 50  # GETJOBs per batch before the client moves on (federation can lag)
body = b"x" * 100
clock_ticks = os.sysconf("SC_CLK_TCK")


def _cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / clock_ticks


def _syscalls(pids: list[int]) -> int:
    """Read and write system calls of ``pids`` so far (/proc/PID/io)."""
    total = 0
    for pid in pids:
        try:
            fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        except OSError:
            continue
        total += int(fields["syscr"]) + int(fields["syscw"])
    return total


def _bus_frames(ports: list[int]) -> int:
    """Cluster bus frames the nodes on ``ports`` have read (CLUSTER INFO's
    cluster_stats_messages_received: each frame counts once, a JOBS frame too)."""
    total = 0
    for port in ports:
        r = redis.Redis(port=port, protocol=2, socket_timeout=30)
        try:
            text = r.execute_command("CLUSTER", "INFO")
        finally:
            r.close()
        for line in (text.decode() if isinstance(text, bytes) else str(text)).splitlines():
            if line.startswith("cluster_stats_messages_received:"):
                total += int(line.split(":")[1])
    return total


def _client(producer: int, consumer: int, queue: str, rate: float, batch: int, replicate: int,
            seconds: float, barrier: Any, results: Any) -> None:
    """One paced client: batches of ADDJOB on ``producer``, taken and acked on ``consumer``."""
    p = redis.Redis(port=producer, protocol=2, socket_timeout=60)
    c = redis.Redis(port=consumer, protocol=2, socket_timeout=60)
    add = ["ADDJOB", queue, body, 0]
    if replicate:
        add += ["REPLICATE", replicate]
    stamps: list[tuple[float, int]] = []
    barrier.wait()
    start = time.monotonic()
    end = start + seconds
    interval = batch / rate
    due = start
    backlog = 0
    while time.monotonic() < end:
        pipe = p.pipeline(transaction=False)
        for _ in range(batch):
            pipe.execute_command(*add)
        pipe.execute()
        backlog += batch
        for _ in range(take_rounds_max):
            if backlog <= 0:
                break
            got = c.execute_command("GETJOB", "TIMEOUT", take_timeout_ms, "COUNT", backlog,
                                    "FROM", queue)
            if not got:
                continue
            ids = [job[1] for job in got]
            c.execute_command("ACKJOB", *ids)
            stamps.append((time.monotonic(), len(ids)))
            backlog -= len(ids)
        due += interval
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        else:
            due = time.monotonic()  # behind: the rate is not held, do not burst to catch up
    results.put(stamps)


def run_case(ports: list[int], pids: list[int], replicate: int, traffic: str, rate: float,
             batch: int, seconds: float, frames: bool = True) -> dict[str, Any]:
    n = len(ports)
    shift = 1 if traffic == "federated" and n > 1 else 0
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(n + 1)
    results = ctx.Queue()
    tag = f"hosts-{os.getpid()}-{time.monotonic_ns()}"
    procs = [ctx.Process(target=_client, args=(ports[i], ports[(i + shift) % n], f"{tag}-{i}",
                                               rate, batch, replicate, warmup_s + seconds + 0.5,
                                               barrier, results))
             for i in range(n)]
    for proc in procs:
        proc.start()
    barrier.wait()
    t0 = time.monotonic()
    time.sleep(warmup_s)
    f0 = _bus_frames(ports) if frames and n > 1 else 0
    w0, cpu0, sys0 = time.monotonic(), _cpu_s(pids), _syscalls(pids)
    time.sleep(seconds)
    w1, cpu1, sys1 = time.monotonic(), _cpu_s(pids), _syscalls(pids)
    f1 = _bus_frames(ports) if frames and n > 1 else 0
    stamps = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    jobs = sum(k for client in stamps for t, k in client if w0 <= t < w1)
    cpu_us = (cpu1 - cpu0) * 1e6
    return {"nodes": n, "replicate": replicate, "traffic": traffic, "rate_per_node": rate,
            "jobs": jobs, "jobs_per_s": round(jobs / (w1 - w0), 1),
            "cpu_us_per_job": round(cpu_us / jobs, 1) if jobs else None,
            "node_cpu_share": round((cpu1 - cpu0) / (w1 - w0), 3),
            "syscalls_per_job": round((sys1 - sys0) / jobs, 2) if jobs else None,
            "bus_frames_per_job": round((f1 - f0) / jobs, 2) if jobs and frames and n > 1 else None,
            "started_s": round(t0, 1)}


def _batches(port: int, queue: str, replicate: int, batch: int, batches: int) -> int:
    r = redis.Redis(port=port, protocol=2, socket_timeout=600)
    done = 0
    for _ in range(batches):
        pipe = r.pipeline(transaction=False)
        for _ in range(batch):
            pipe.execute_command("ADDJOB", queue, body, 0, "REPLICATE", replicate)
        pipe.execute()
        left = batch
        while left > 0:
            got = r.execute_command("GETJOB", "TIMEOUT", 5000, "COUNT", left, "FROM", queue)
            if got:
                r.execute_command("ACKJOB", *[job[1] for job in got])
                left -= len(got)
                done += len(got)
    return done


def _registered(port: int) -> int:
    info = redis.Redis(port=port, protocol=2, socket_timeout=60).info("jobs")  # parsed
    return int(info["registered_jobs"])


def instructions(tree: Path, n: int, replicate: int, batch: int, batches: int,
                 idle_s: float = 5.0) -> dict[str, float]:
    """Instructions per job of ``batches`` batches on an ``n``-node cluster of ``tree``,
    every node under callgrind (1 worker each): the cluster's, the origin's, the others'."""
    from contextlib import ExitStack

    from bench.instructions import _dump_all, _phase_totals, callgrind_node

    with ExitStack() as stack:
        nodes = [stack.enter_context(callgrind_node(tree, 1)) for _ in range(n)]
        ports = [port for port, _, _ in nodes]
        srv.meet_all(ports)
        q = f"hosts-ins-{os.getpid()}"
        _batches(ports[0], q, replicate, batch, 2)  # warm up: links, the queue, first calls

        def settle() -> None:
            deadline = time.monotonic() + 300
            while any(_registered(p) for p in ports) and time.monotonic() < deadline:
                time.sleep(0.5)

        settle()
        for _, _, pids in nodes:
            _dump_all(pids)  # dump 1: the start and the warm-up
        t0 = time.monotonic()
        time.sleep(idle_s)
        for _, _, pids in nodes:
            _dump_all(pids)  # dump 2: idle
        t1 = time.monotonic()
        jobs = _batches(ports[0], q, replicate, batch, batches)
        settle()  # the ack GC (SETACK, GOTACK, DELJOB) is part of a job's cost
        for _, _, pids in nodes:
            _dump_all(pids)  # dump 3: the jobs
        span = time.monotonic() - t1
        per_node = []
        for _, work, _ in nodes:
            idle = _phase_totals(work, 2) / (t1 - t0)
            per_node.append((_phase_totals(work, 3) - idle * span) / max(1, jobs))
        return {"nodes": n, "replicate": replicate, "batch": batch, "jobs": jobs,
                "cluster": round(sum(per_node)), "origin": round(per_node[0]),
                "others_each": round(sum(per_node[1:]) / max(1, n - 1)),
                "span_s": round(span, 1)}


def cases(n: int, replicate: list[int], traffic: list[str]) -> Iterator[tuple[int, str]]:
    for r in replicate:
        if r > n:
            continue
        for t in traffic:
            if t == "federated" and n == 1:
                continue
            yield r, t


@contextmanager
def system(kind: str, tree: Path | None, binary: Path | None, workdir: Path, n: int,
           workers: int) -> Iterator[list[int]]:
    if kind == "reference":
        assert binary is not None
        with srv.reference_nodes(binary, workdir, n) as ports:
            yield ports
    else:
        with srv.disque_mp_nodes(workdir, n, workers, tree) as ports:
            yield ports


def tree_build(tree: Path | None) -> str:
    root = tree or Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-m", "disque_mp.compiled"], capture_output=True,
                         text=True, env=env, cwd=str(root), timeout=60)
    return out.stdout.strip() or "unknown"


def tree_commit(tree: Path | None) -> str:
    root = tree or Path(__file__).resolve().parent.parent
    out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, timeout=30)
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=30).stdout.strip()
    return (out.stdout.strip() or "?") + ("+changes" if dirty else "")


def table(rows: list[dict[str, Any]], systems: list[str],
          columns: tuple[tuple[str, str], tuple[str, str]] = (("us/job", "cpu_us_per_job"),
                                                              ("jobs/s", "jobs_per_s"))) -> list[str]:
    """One row per case, two ``columns`` (heading, row key) per system."""
    (h1, k1), (h2, k2) = columns
    head = "| traffic | REPLICATE | nodes | " + " | ".join(
        f"{s} {h1} | {s} {h2}" for s in systems) + " |"
    lines = [head, "|" + "---|" * (3 + 2 * len(systems))]
    keys = sorted({(r["traffic"], r["replicate"], r["nodes"]) for r in rows})
    for traffic, rep, n in keys:
        cells = []
        for s in systems:
            row = next((r for r in rows if r["system"] == s and r["traffic"] == traffic
                        and r["replicate"] == rep and r["nodes"] == n), None)
            cells += ([str(row.get(k1) or "-"), str(row.get(k2) or "-")] if row else ["-", "-"])
        lines.append(f"| {traffic} | {rep} | {n} | " + " | ".join(cells) + " |")
    return lines


# per job, what the node's CPU went to: cluster bus frames read (disque-mp) and
# read/write system calls (every system), every node summed
WORK_COLUMNS = (("frames/job", "bus_frames_per_job"), ("syscalls/job", "syscalls_per_job"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.hosts", description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--replicate", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--traffic", nargs="+", choices=["local", "federated"],
                    default=["local", "federated"])
    ap.add_argument("--rate", type=float, default=1000.0, help="jobs/s per node")
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--trees", nargs="*", default=[], metavar="LABEL=DIR",
                    help="disque-mp source trees (default: this one, as disque-mp)")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--out", default="bench/results/hosts")
    ap.add_argument("--instructions", action="store_true",
                    help="instructions per job under callgrind instead of timed CPU")
    ap.add_argument("--batches", type=int, default=40, help="with --instructions")
    args = ap.parse_args(argv)
    if args.instructions:
        ins_trees = [(label, Path(d).resolve()) for label, d in (t.split("=", 1) for t in args.trees)] \
            or [("disque-mp", Path(__file__).resolve().parent.parent)]
        for n in args.nodes:
            for rep in args.replicate:
                if rep > n:
                    continue
                for label, d in ins_trees:
                    got = instructions(d, n, rep, args.batch, args.batches)
                    print(json.dumps({"tree": label, "build": tree_build(d), **got}), flush=True)
        return 0

    trees: list[tuple[str, Path | None]] = [
        (label, Path(d).resolve()) for label, d in (t.split("=", 1) for t in args.trees)
    ] or [("disque-mp", None)]
    systems: list[tuple[str, str, Path | None]] = [(label, "disque-mp", d) for label, d in trees]
    binary: Path | None = None
    ref_status = "not run (--no-reference)"
    if not args.no_reference:
        from bench.scaling import reference_binary
        binary, ref_status = reference_binary()
        if binary is not None:
            systems.append(("C Disque", "reference", None))
    print(f"reference: {ref_status}", flush=True)
    builds = {label: f"{tree_build(d)} at {tree_commit(d)}" for label, kind, d in systems
              if kind == "disque-mp"}
    rows: list[dict[str, Any]] = []
    root = Path(tempfile.mkdtemp(prefix="disque-mp-hosts-", dir=srv.scratch_root()))
    for n in args.nodes:
        for label, kind, tree in systems:
            with system(kind, tree, binary, root / f"{label.replace(' ', '_')}-{n}", n,
                        args.workers) as ports:
                pids = srv.server_pids(ports)
                for rep, traffic in cases(n, args.replicate, args.traffic):
                    row = run_case(ports, pids, rep, traffic, args.rate, args.batch, args.seconds,
                                   frames=kind == "disque-mp")
                    row["system"] = label
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    labels = [label for label, _, _ in systems]
    load = os.getloadavg()
    meta = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.node()} {os.cpu_count()} CPUs {platform.machine()}",
            "builds": builds, "reference": ref_status, "rate_per_node": args.rate,
            "batch": args.batch, "seconds": args.seconds, "workers": args.workers,
            "loadavg_after": [round(x, 2) for x in load],
            "command": "python -m bench.hosts " + " ".join(argv if argv is not None else sys.argv[1:])}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = ["# Hosts: node CPU per job and jobs/s as the cluster grows", "",
             f"`{meta['command']}` ({meta['when']}; {meta['machine']}; load after "
             f"{meta['loadavg_after']}).", "",
             "Builds: " + "; ".join(f"{k}: {v}" for k, v in builds.items())
             + f"; C Disque: {ref_status}.", "",
             f"One paced client per node, {args.rate:g} jobs/s per node in batches of "
             f"{args.batch} (ADDJOB, then GETJOB COUNT and one ACKJOB); `federated`: the "
             f"consumer on the next node. {args.workers} worker(s) per disque-mp node. "
             f"Node CPU (every process of every node, utime + stime) over {args.seconds:g} s "
             "per job delivered in that window.", ""]
    lines += table(rows, labels)
    lines += ["", "Per job delivered, every node summed: cluster bus frames read (disque-mp; "
              "PINGs included) and read/write system calls.", ""]
    lines += table(rows, labels, WORK_COLUMNS)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
