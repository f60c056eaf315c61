"""Where replicated latency goes: disque-mp and the C Disque, 3-node clusters on loopback.

    python -m bench.peers_probe [--rounds 2] [--jobs 300] [--workers 1]

Two probes per cluster, each on the first node with redis-py, rounds alternating the sides:

- ``steps``: one client, per job ADDJOB ... REPLICATE 3, then GETJOB, then ACKJOB, each
  round trip timed apart (medians, microseconds).
- ``blocked``: a consumer thread blocked in GETJOB; the producer sends one ADDJOB
  (REPLICATE 3, then REPLICATE 1) and waits for the delivery before the next one:
  add-to-delivery p50 / p99 (microseconds).

``--work`` measures work instead of time (robust on a loaded machine): the ``blocked``
REPLICATE 3 loop, and for each of the three nodes (every process of it) the CPU time,
the read and write system calls and the context switches it spent, from /proc, divided
by the jobs (the idle cost of the same span, measured first, subtracted).

The gap between REPLICATE 3 and REPLICATE 1 on each side is what the replication round
trip costs (REPLJOB to two nodes, their GOTJOB back, the wake of the waiting reply).
``--trees base=/tmp/base new=.`` runs each tree's own cluster beside the others (a tree's
compiled build if it has one): before and after in one run, under one load.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import redis

from bench import peers_servers as srv

deliver_timeout_ms = 5000  # a blocked GETJOB; a job is normally there within milliseconds
gap_s = 0.002  # between two probe jobs, so each is alone in flight


def steps(port: int, jobs: int) -> dict[str, float]:
    r = redis.Redis(port=port, protocol=2, socket_timeout=30)
    t: dict[str, list[int]] = {"addjob_r3": [], "getjob": [], "ackjob": []}
    try:
        for _ in range(jobs):
            a = time.perf_counter_ns()
            r.execute_command("ADDJOB", "probe-steps", "x", 0, "REPLICATE", 3)
            b = time.perf_counter_ns()
            job = r.execute_command("GETJOB", "TIMEOUT", deliver_timeout_ms, "FROM", "probe-steps")
            c = time.perf_counter_ns()
            r.execute_command("ACKJOB", job[0][1])
            t["addjob_r3"].append(b - a)
            t["getjob"].append(c - b)
            t["ackjob"].append(time.perf_counter_ns() - c)
    finally:
        r.close()
    return {k: sorted(v)[len(v) // 2] / 1e3 for k, v in t.items()}


def blocked(port: int, replicate: int, jobs: int) -> dict[str, float]:
    q = f"probe-blocked-{replicate}"
    got: list[int] = []

    def consumer() -> None:
        c = redis.Redis(port=port, protocol=2, socket_timeout=30)
        try:
            for _ in range(jobs):
                job = c.execute_command("GETJOB", "TIMEOUT", deliver_timeout_ms, "FROM", q)
                if not job:
                    return
                got.append(time.perf_counter_ns())
                c.execute_command("ACKJOB", job[0][1])
        finally:
            c.close()

    th = threading.Thread(target=consumer)
    th.start()
    p = redis.Redis(port=port, protocol=2, socket_timeout=30)
    sent: list[int] = []
    try:
        for i in range(jobs):
            time.sleep(gap_s)
            sent.append(time.perf_counter_ns())
            p.execute_command("ADDJOB", q, "x", 0, "REPLICATE", replicate)
            deadline = time.monotonic() + deliver_timeout_ms / 1000
            while len(got) <= i and th.is_alive() and time.monotonic() < deadline:
                time.sleep(0.0002)
    finally:
        th.join(deliver_timeout_ms / 1000 + 5)
        p.close()
    lat = sorted(g - s for g, s in zip(got, sent, strict=False))
    if not lat:
        return {"p50_us": float("nan"), "p99_us": float("nan"), "delivered": 0}
    return {"p50_us": lat[len(lat) // 2] / 1e3, "p99_us": lat[int(len(lat) * 0.99)] / 1e3,
            "delivered": len(lat)}


def _tree(pid: int) -> list[int]:
    from bench.redisq import children_of

    return [pid, *children_of(pid)]


def _counters(pids: list[int]) -> list[int]:
    """[CPU ticks (utime + stime), read syscalls, write syscalls, context switches]
    summed over ``pids``."""
    out = [0, 0, 0, 0]
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out[0] += int(stat[11]) + int(stat[12])
        io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        out[1] += int(io["syscr"])
        out[2] += int(io["syscw"])
        st = dict(line.split(":\t") for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if line.endswith(tuple("0123456789")) and ":\t" in line)
        out[3] += int(st["voluntary_ctxt_switches"]) + int(st["nonvoluntary_ctxt_switches"])
    return out


def _node_pids(port: int) -> list[int]:
    r = redis.Redis(port=port, protocol=2)
    try:
        return _tree(int(r.info("server")["process_id"]))
    finally:
        r.close()


def work(ports: list[int], jobs: int, replicate: int = 3) -> list[dict[str, float]]:
    """Per node of ``ports``: CPU us, read and write syscalls and context switches per
    job of the ``blocked`` loop on ``ports[0]``, less the idle cost of the same span."""
    trees = [_node_pids(p) for p in ports]
    idle0 = [_counters(t) for t in trees]
    t0 = time.monotonic()
    time.sleep(1.0)
    idle = [[b - a for a, b in zip(x, _counters(t), strict=True)] for x, t in zip(idle0, trees, strict=True)]
    idle_s = time.monotonic() - t0
    before = [_counters(t) for t in trees]
    t1 = time.monotonic()
    b = blocked(ports[0], replicate, jobs)
    span = time.monotonic() - t1
    rows = []
    tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
    for x, t, i in zip(before, trees, idle, strict=True):
        d = [b2 - a - s * span / idle_s for a, b2, s in zip(x, _counters(t), i, strict=True)]
        n = max(1, b["delivered"])
        rows.append({"cpu_us": d[0] * tick_us / n, "reads": d[1] / n, "writes": d[2] / n,
                     "switches": d[3] / n})
    return rows


def run_work(jobs: int, workers: int, trees: list[tuple[str, Path | None]],
             rounds: int = 1) -> list[dict[str, Any]]:
    """``work`` on 3-node clusters of each tree (label, source dir; None: this one),
    then on C Disque, ``rounds`` times, in one run: before/after under the same load."""
    from bench.scaling import reference_binary

    binary, status = reference_binary()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="disque-mp-probe-", dir=srv.scratch_root()) as tmp:
        for r in range(rounds):
            for label, tree in trees:
                with srv.disque_mp_nodes(Path(tmp) / f"mp-{label}-{r}", 3, workers, tree) as mp:
                    _work_rows(label, mp, jobs, rows)
            if binary is None:
                print(f"disque-c {status}")
                continue
            with srv.reference_nodes(binary, Path(tmp) / f"c-{r}", 3) as c:
                _work_rows("disque-c", c, jobs, rows)
    return rows


def _work_rows(name: str, ports: list[int], jobs: int, rows: list[dict[str, Any]]) -> None:
    for i, r in enumerate(work(ports, jobs)):
        row = {"system": name, "node": "origin" if i == 0 else f"replica {i}",
               **{k: round(v, 2) for k, v in r.items()}}
        rows.append(row)
        print(row, flush=True)


def _callgrind_node(tree: Path, work: Path) -> tuple[int, subprocess.Popen[bytes]]:
    """A 1-worker node of ``tree`` under callgrind (as bench.instructions runs one)."""
    from bench.instructions import _wait_ready
    from tests.nodeproc import free_port

    port = free_port()
    work.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--trace-children=yes", f"--callgrind-out-file={work}/cg.%p",
         sys.executable, "-m", "disque_mp", "--port", str(port), "--dir", str(work), "--workers", "1",
         "--maxmemory", "4gb", "--loglevel", "warning"],
        cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    _wait_ready(proc, port)
    return port, proc


def instructions(tree: Path, jobs: int, work: Path, idle_s: float = 5.0) -> dict[str, float]:
    """Instructions per job of the ``blocked`` REPLICATE 3 loop on the origin and on one
    replica, each a whole node under callgrind (the third node runs normally). A node
    also works when idle (its ticks, the bus's PINGs): that rate is measured over
    ``idle_s`` both before and after the loop (it moves with the load) and their mean
    is taken off for the loop's span (which a loaded machine stretches); both rates
    are reported, and ``*_idle_share`` says how much of the loop's count was idle work."""
    from bench.instructions import _node_pids, _phase_totals

    with ExitStack() as stack:
        procs = []
        for name in ("origin", "replica"):
            port, proc = _callgrind_node(tree, work / name)
            stack.callback(_stop_group, proc)
            procs.append((name, port, proc))
        third = stack.enter_context(srv.disque_mp_nodes(work / "third", 1, 1, tree))
        srv.meet_all([procs[0][1], procs[1][1], third[0]])
        blocked(procs[0][1], 3, 20)  # warm up: links, queues, first-call paths
        pids = {name: _node_pids(proc.pid) for name, _, proc in procs}
        _dump_each(pids)  # dump 1: the start and the warm-up
        t0 = time.monotonic()
        time.sleep(idle_s)
        _dump_each(pids)  # dump 2: idle before
        t1 = time.monotonic()
        delivered = blocked(procs[0][1], 3, jobs)["delivered"]
        _dump_each(pids)  # dump 3: the jobs
        t2 = time.monotonic()
        time.sleep(idle_s)
        _dump_each(pids)  # dump 4: idle after (the ack GC of the last job is done by then)
        t3 = time.monotonic()
        span = t2 - t1
        out: dict[str, float] = {"delivered": delivered, "span_s": span}
        for name in pids:
            before = _phase_totals(work / name, 2) / (t1 - t0)
            after = _phase_totals(work / name, 4) / (t3 - t2)
            idle = (before + after) / 2
            total = _phase_totals(work / name, 3)
            out[f"{name}_idle_per_s"] = before
            out[f"{name}_idle_after_per_s"] = after
            out[f"{name}_idle_share"] = idle * span / max(1, total)
            out[name] = (total - idle * span) / max(1, delivered)
        return out


def _dump_each(pids: dict[str, list[int]]) -> None:
    from bench.instructions import _dump_all

    for node_pids in pids.values():
        _dump_all(node_pids)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=120)


def run(rounds: int, jobs: int, workers: int,
        trees: list[tuple[str, Path | None]] | None = None) -> list[dict[str, Any]]:
    """The timed probes on a 3-node cluster of each tree (label, source dir; None: this
    one) and of C Disque, all up at once, rounds alternating the order."""
    from bench.scaling import reference_binary

    binary, status = reference_binary()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="disque-mp-probe-", dir=srv.scratch_root()) as tmp, \
            ExitStack() as stack:
        work = Path(tmp)
        sides = [(label, stack.enter_context(
                     srv.disque_mp_nodes(work / f"mp-{label}", 3, workers, tree))[0])
                 for label, tree in trees or [("disque-mp", None)]]
        if binary is None:
            print(f"disque-c {status}")
        else:
            sides.append(("disque-c", stack.enter_context(srv.reference_nodes(binary, work / "c", 3))[0]))
        return _probe_rounds(sides, rounds, jobs, rows)


def _probe_rounds(sides: list[tuple[str, int]], rounds: int, jobs: int,
                  rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for r in range(rounds):
        for name, port in sides if r % 2 == 0 else sides[::-1]:
            row = {"system": name, "round": r, **steps(port, jobs)}
            for rep in (3, 1):
                b = blocked(port, rep, jobs)
                row[f"blocked_r{rep}_p50_us"], row[f"blocked_r{rep}_p99_us"] = b["p50_us"], b["p99_us"]
            rows.append(row)
            print({k: round(v) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers_probe")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--jobs", type=int, default=300)
    p.add_argument("--workers", type=int, default=1, help="disque-mp workers per node")
    p.add_argument("--instructions", action="store_true",
                   help="instructions per replicated job (origin, replica) under callgrind")
    p.add_argument("--work", action="store_true",
                   help="CPU, syscalls and context switches per replicated job, per node")
    p.add_argument("--trees", nargs="*", default=[], metavar="LABEL=DIR",
                   help="disque-mp source trees to compare, each on its own cluster "
                        "(default: this one)")
    a = p.parse_args(argv)
    trees: list[tuple[str, Path | None]] = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]))
                                            for t in a.trees]
    if a.instructions:
        with tempfile.TemporaryDirectory(prefix="disque-mp-probe-", dir=srv.scratch_root()) as tmp:
            for label, tree in trees or [("disque-mp", None)]:
                got = instructions((tree or Path(".")).resolve(), a.jobs, Path(tmp) / label)
                print({"tree": label, **{k: round(v, 3 if k.endswith("_share") else 1 if v < 100 else None)
                                         for k, v in got.items()}}, flush=True)
    elif a.work:
        run_work(a.jobs, a.workers, trees or [("disque-mp", None)], a.rounds)
    else:
        run(a.rounds, a.jobs, a.workers, trees)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
