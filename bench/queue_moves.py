"""What moving jobs between queues costs on one shard, in memory (timeit style).

    DISQUE_MP_PURE=1 .venv/bin/python -m bench.queue_moves [--jobs 100000] [--ids 5000]

Four figures, each the best of ``--rounds`` (gc off while timed):

- ``add+take``: one ADDJOB then one GETJOB NOHANG on a queue (the hot path the
  queue's structure must not slow), per pair; ``grouped``: ADDJOB ... GROUP over
  100 groups, a GETJOB after every second one (the queue split), per ADDJOB;
- ``deadletter``: DEADLETTER of the newest ``--ids`` jobs of a queue holding
  ``--jobs`` queued jobs, per ID;
- ``redrive``: REDRIVE COUNT ``--ids`` out of ``dead:q`` with ``--jobs``
  DEQUEUEd (stale) entries ahead of them (and more queued behind), per ID;
- ``groups``: QGROUPS COUNT 10, QPEEK 1 and QSTAT over a queue holding
  ``--groups`` groups of one job each, per command.

A cost independent of ``--jobs`` / ``--groups`` shows as the same per-item
figure when they grow (try 20000 and 100000).
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections.abc import Callable
from typing import Any

from workers.job import JobExt
from workers.shard import Shard

NODE_ID = "0123456789abcdef0123456789abcdef01234567"
T0 = 1_795_301_808_328


def new_shard() -> Shard:
    return Shard(NODE_ID, 0, 1, b"seed", random.Random(7), T0)


def add(s: Shard, queue: bytes, now_ms: int, group: bytes = b"") -> str:
    ext = JobExt(group=group) if group else None
    jid = s.op_addjob(queue, b"x", timeout_ms=0, replicate=1, delay_s=0, retry_s=300,
                      ttl_s=86400, maxlen=0, async_=False, token=0, now_ms=now_ms, ext=ext)
    s.take_effects()
    return str(jid)


def best(rounds: int, setup: Callable[[], Any], run: Callable[[Any], int]) -> float:
    """Seconds per item of the fastest round (``run`` returns its item count)."""
    out = float("inf")
    for _ in range(rounds):
        state = setup()
        gc.disable()
        try:
            t = time.perf_counter()
            n = run(state)
            out = min(out, (time.perf_counter() - t) / max(n, 1))
        finally:
            gc.enable()
    return out


def add_take(pairs: int, groups: int = 0) -> Callable[[Shard], int]:
    names = [b"tenant-%d" % g for g in range(groups)]

    def run(s: Shard) -> int:
        for i in range(pairs):
            add(s, b"q", T0 + i, names[i % groups] if groups else b"")
            if not groups or i % 2:  # grouped: the queue keeps jobs of many groups
                s.op_take([b"q"], 1, False, T0 + i)
            s.take_effects()
        return pairs
    return run


def deadletter_setup(jobs: int, ids: int) -> Callable[[], tuple[Shard, list[str]]]:
    def setup() -> tuple[Shard, list[str]]:
        s = new_shard()
        jids = [add(s, b"q", T0) for _ in range(jobs)]
        return s, jids[-ids:]
    return setup


def deadletter(state: tuple[Shard, list[str]]) -> int:
    s, jids = state
    moved = s.op_deadletter(jids, None, T0)
    s.take_effects()
    return moved


def redrive_setup(jobs: int, ids: int) -> Callable[[], Shard]:
    def setup() -> Shard:
        s = new_shard()
        stale = [add(s, b"q", T0) for _ in range(jobs)]
        moved = [add(s, b"q", T0) for _ in range(jobs + ids)]  # more live than stale
        s.op_deadletter(stale + moved, None, T0)
        s.op_dequeue(stale, T0)  # stale entries ahead of the ones REDRIVE takes
        s.take_effects()
        return s
    return setup


def redrive_run(ids: int) -> Callable[[Shard], int]:
    def run(s: Shard) -> int:
        moved = s.op_redrive(b"dead:q", ids, T0)
        s.take_effects()
        return int(moved) if isinstance(moved, int) else 0
    return run


def groups_setup(groups: int) -> Callable[[], Shard]:
    def setup() -> Shard:
        s = new_shard()
        for g in range(groups):
            add(s, b"q", T0, b"group-%d" % g)
        return s
    return setup


def group_reads(reads: int) -> Callable[[Shard], int]:
    def run(s: Shard) -> int:
        for _ in range(reads):
            s.op_qgroups(b"q", 10)
            s.op_qpeek(b"q", 1)
            s.op_qstat(b"q", T0)
        return 3 * reads
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--ids", type=int, default=5_000)
    p.add_argument("--groups", type=int, default=100_000)
    p.add_argument("--pairs", type=int, default=50_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", choices=("add+take", "grouped", "deadletter", "redrive", "groups"))
    a = p.parse_args()
    runs: dict[str, tuple[Callable[[], Any], Callable[[Any], int]]] = {
        "add+take": (new_shard, add_take(a.pairs)),
        "grouped": (new_shard, add_take(a.pairs, 100)),
        "deadletter": (deadletter_setup(a.jobs, a.ids), deadletter),
        "redrive": (redrive_setup(a.jobs, a.ids), redrive_run(a.ids)),
        "groups": (groups_setup(a.groups), group_reads(5)),
    }
    for name, (setup, run) in runs.items():
        if a.only in (None, name):
            print(f"{name:12s} {best(a.rounds, setup, run) * 1e6:10.2f} us per item")


if __name__ == "__main__":
    main()
