"""Timed A/B of source trees on the crossing shape: node CPU per request for random
queues against a queue per connection, many workers on few cores.

    python -m bench.crossing before=/tmp/base after=. [--workers 16] [--rounds 3] \\
        [--seconds 3]

One node per tree (its compiled build if it has one: the tree first on PYTHONPATH),
all started at once and left idle between runs; then ``--rounds`` rounds, each
running every tree on both shapes (``bench.scaling.cores_run``: 64 connections,
ADDJOB -P 32, the pinned generator; more workers than cores share every core),
the trees' order turned each round so that load from elsewhere falls on both.
Per tree and shape the median round's node CPU per request (utime + stime of every
worker / requests), its read and write syscalls per request, and the ratio of
random to per-connection: the figure ``bench.instructions --shape`` gives in
instructions, where callgrind's slowness fills every frame with many commands,
here at native speed, where a frame carries a command or two.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench.instructions import _node_pids, _wait_ready
from bench.scaling import CORES_SHAPES, cores_run

stop_timeout_s = 60.0
workers_timeout_s = 60.0  # every worker forked and counted after the first answers PING


@contextmanager
def tree_node(tree: Path, work: Path, workers: int) -> Iterator[tuple[int, list[int]]]:
    """A node of ``tree`` (its code first on PYTHONPATH) -> (port, worker pids)."""
    from tests.nodeproc import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "disque_mp", "--port", str(port), "--dir", str(work),
         "--workers", str(workers), "--maxmemory", "8gb", "--loglevel", "warning"],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_ready(proc, port)
        # PING answers once one worker does: every worker counts, so wait for them all
        deadline = time.monotonic() + workers_timeout_s
        pids = [p for p in _node_pids(proc.pid) if p != proc.pid]
        while len(pids) < workers and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = [p for p in _node_pids(proc.pid) if p != proc.pid]
        if len(pids) != workers:
            raise RuntimeError(f"the node of {tree} has {len(pids)} workers, not {workers}")
        yield port, pids
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=stop_timeout_s)


def median_of(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.crossing")
    p.add_argument("trees", nargs="+", help="label=dir")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0)
    a = p.parse_args(argv)
    sides = [(label, Path(d).resolve()) for label, _, d in (s.partition("=") for s in a.trees)]
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="crossing-") as tmp, ExitStack() as stack:
        nodes = {}
        for label, tree in sides:
            work = Path(tmp) / label
            work.mkdir()
            nodes[label] = stack.enter_context(tree_node(tree, work, a.workers))
        for r in range(a.rounds):
            order = sides if r % 2 == 0 else sides[::-1]
            for label, _ in order:
                port, pids = nodes[label]
                for shape in CORES_SHAPES if r % 2 == 0 else CORES_SHAPES[::-1]:
                    got = cores_run(port, pids, a.workers, shape, a.seconds)
                    rows.setdefault((label, shape), []).append(got)
                    print(f"round {r + 1} {label:>10} {shape:>14}: {got['rps']:>9,.0f} req/s "
                          f"{got['node_us_per_req']:6.2f} us/req "
                          f"{got['syscalls_per_req']:.3f} syscalls/req", flush=True)
    print(f"\nmedians, {a.workers} workers, {os.cpu_count()} CPUs, {a.rounds} rounds of "
          f"{a.seconds:g} s:")
    for label, _ in sides:
        rnd, per = rows[(label, "random")], rows[(label, "per-connection")]
        us_r, us_p = median_of(rnd, "node_us_per_req"), median_of(per, "node_us_per_req")
        print(f"{label:>10}: random {us_r:.2f} us/req ({median_of(rnd, 'syscalls_per_req'):.3f} "
              f"syscalls/req, {median_of(rnd, 'rps'):,.0f} req/s), per-connection {us_p:.2f} "
              f"us/req ({median_of(per, 'syscalls_per_req'):.3f}, {median_of(per, 'rps'):,.0f} "
              f"req/s): {us_r / us_p:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
