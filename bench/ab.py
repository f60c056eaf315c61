"""A/B of source trees: the same redis-benchmark commands against each, interleaved.

    python -m bench.ab before=/tmp/base:2 after=.:2 [--rounds 3] [--pipeline 1 32] \\
        [--cmd "-r 10000 ADDJOB q:__rand_int__ x 0"] [--cmd "GETJOB NOHANG FROM q"]

Each tree (``label=dir[:workers]``) runs as its own node (``python -m disque_mp``
with PYTHONPATH=dir, so its compiled build if it has one). Rounds alternate the
order of the trees; for each (command, pipeline, tree) the median round is
printed with the node's CPU per request (utime + stime of every worker, from
/proc), which moves much less than req/s on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.redisq import children_of
from bench.scaling import REQUESTS, bench_cpu, median_row

start_timeout_s = 20.0
default_cmds = ["-r 10000 ADDJOB q:__rand_int__ x 0", "-r 10000 GETJOB NOHANG FROM q:__rand_int__"]


def start(tree: Path, workers: int, work: Path) -> tuple[subprocess.Popen[bytes], int, list[int]]:
    from tests.nodeproc import free_port

    port = free_port()
    d = work / f"n{port}"
    d.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen([sys.executable, "-m", "disque_mp", "--port", str(port), "--dir", str(d),
                             "--workers", str(workers), "--maxmemory", "8gb", "--loglevel", "warning"],
                            cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + start_timeout_s
    while True:
        pids = children_of(proc.pid)
        ok = subprocess.run(["redis-cli", "-p", str(port), "PING"], capture_output=True).stdout
        if len(pids) == workers and ok.strip() == b"PONG":
            return proc, port, pids
        if time.monotonic() > deadline or proc.poll() is not None:
            stop(proc)
            raise RuntimeError(f"node from {tree} did not start")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ab")
    p.add_argument("trees", nargs="+", help="label=dir[:workers]")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pipeline", type=int, nargs="+", default=[1, 32])
    p.add_argument("--cmd", action="append", help="redis-benchmark arguments (repeatable)")
    p.add_argument("--requests", type=int, default=REQUESTS)
    a = p.parse_args(argv)
    cmds = a.cmd or default_cmds
    sides: list[tuple[str, Path, int]] = []
    for spec in a.trees:
        label, _, rest = spec.partition("=")
        d, _, w = rest.partition(":")
        sides.append((label, Path(d).resolve(), int(w or 2)))
    runs: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    procs = []
    with tempfile.TemporaryDirectory(prefix="disque-mp-ab-") as tmp:
        try:
            nodes = []
            for label, tree, workers in sides:
                proc, port, pids = start(tree, workers, Path(tmp))
                procs.append(proc)
                nodes.append((label, port, pids))
            for i in range(a.rounds):
                for cmd in cmds:
                    for pipeline in a.pipeline:
                        for label, port, pids in nodes if i % 2 == 0 else nodes[::-1]:
                            row = bench_cpu(port, pids, *shlex.split(cmd), pipeline=pipeline,
                                            requests=a.requests)
                            runs.setdefault((cmd, pipeline, label), []).append(row)
        finally:
            for proc in procs:
                stop(proc)
    print(f"load average now {os.getloadavg()[0]:.2f}; medians of {a.rounds} rounds")
    for (cmd, pipeline, label), rows in runs.items():
        m = median_row(rows)
        us = sorted(r["server_us_per_req"] for r in rows)[len(rows) // 2]
        print(f"{cmd!r:48} -P {pipeline:<3} {label:>10}: {m['rps']:>10,.0f} req/s "
              f"(rounds {', '.join(format(r['rps'], ',.0f') for r in rows)}); node CPU {us:.2f} us/req")
    return 0


if __name__ == "__main__":
    sys.exit(main())
