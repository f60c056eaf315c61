"""A job at a paced rate in work counts: callgrind instructions per job over every
process of the node, when each job is a wake-up of its own.

    python -m bench.paced_instructions before=/tmp/base after=. [--jobs 300] [--workers 1] [--gap-ms 30]

The paced row of ``bench.peers`` in a fixed number of jobs: a consumer blocked in
``GETJOB TIMEOUT 5000 COUNT 50 FROM q``, a producer sending one ``ADDJOB q body 0``,
``--gap-ms`` apart; each job wakes the consumer, which acknowledges it before the next
is sent (three reads a job on the node: the ADDJOB, the ACKJOB, the GETJOB that blocks
again). Each tree (``label=dir``, its compiled build if it has one) runs as a whole node
under ``valgrind --tool=callgrind`` (as ``bench.instructions``); the counters are dumped
before and after the jobs, so the figure is their own work, kernel excluded. The node's
idle rate (its timers, ~50x more often per job under callgrind) is measured over
``--idle-s`` first and printed beside the raw figure with the net.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from bench.cycle_instructions import BODY, Conn
from bench.instructions import _dump_all, _phase_totals, callgrind_node


def drive(port: int, jobs: int, gap_s: float, queue: bytes) -> None:
    """``jobs`` jobs one at a time: added, delivered to the blocked consumer, acked."""
    consumer, producer = Conn(port), Conn(port)
    errors: list[BaseException] = []
    got = threading.Semaphore(0)

    def consume() -> None:
        try:
            done = 0
            while done < jobs:
                reply = consumer.send([[b"GETJOB", b"TIMEOUT", b"5000", b"COUNT", b"50", b"FROM", queue]])[0]
                if not reply:
                    continue
                ids = [j[1] for j in reply]  # type: ignore[attr-defined]
                consumer.send([[b"ACKJOB", *ids]])
                done += len(ids)
                for _ in ids:
                    got.release()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)
            got.release()

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.5)  # the consumer blocked before the first job
    for _ in range(jobs):
        producer.send([[b"ADDJOB", queue, BODY, b"0"]])
        if not got.acquire(timeout=60) or errors:
            break
        time.sleep(gap_s)
    t.join(120)
    if errors:
        raise errors[0]


def run_tree(tree: Path, workers: int, jobs: int, gap_s: float, idle_s: float,
             keep: str | None) -> tuple[float, float]:
    """Instructions per job, and the idle node's share of them."""
    with callgrind_node(tree, workers) as (port, work, pids):
        drive(port, 20, gap_s, b"warm")  # first-use costs out of the figure
        _dump_all(pids)  # dump 1: start and warm-up
        time.sleep(idle_s)
        _dump_all(pids)  # dump 2: the node idle
        idle_rate = _phase_totals(work, 2) / idle_s
        t0 = time.monotonic()
        drive(port, jobs, gap_s, b"paced")
        _dump_all(pids)  # dump 3: the paced jobs
        seconds = time.monotonic() - t0
        instr = _phase_totals(work, 3) / jobs
        if keep:
            dest = Path(keep) / f"paced-w{workers}-{tree.name}"
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(work, dest, ignore=shutil.ignore_patterns("*.aof*", "*.sock*"))
    return instr, idle_rate * seconds / jobs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.paced_instructions")
    p.add_argument("trees", nargs="+", help="label=dir")
    p.add_argument("--jobs", type=int, default=300)
    p.add_argument("--workers", type=int, nargs="+", default=[1])
    p.add_argument("--gap-ms", type=float, default=30.0, help="pause between one job's ACK and the next ADDJOB")
    p.add_argument("--idle-s", type=float, default=5.0)
    p.add_argument("--keep", help="copy each node's callgrind files under this folder")
    a = p.parse_args(argv)
    if a.jobs < 1:
        p.error("--jobs must be at least 1")
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed")
    sides = [(label, Path(d).resolve()) for label, _, d in (s.partition("=") for s in a.trees)]
    print(f"load at start: {os.getloadavg()}", flush=True)
    for workers in a.workers:
        for label, tree in sides:
            instr, idle = run_tree(tree, workers, a.jobs, a.gap_ms / 1000, a.idle_s, a.keep)
            print(f"{label:>8} workers {workers}: {instr:,.0f} instr/job, of which {idle:,.0f} the "
                  f"idle node's rate (net {instr - idle:,.0f})", flush=True)
    print(f"load at end: {os.getloadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
