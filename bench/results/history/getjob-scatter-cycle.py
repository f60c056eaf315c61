"""The many-queue cycle of bench.peers (2 producers, 2 consumers, 100 queues, GETJOB
COUNT 50 over each consumer's 50 queues) on disque-mp only, 1 and 2 workers, two
source trees, rounds interleaved; prints jobs/s and node CPU per job.

    PYTHONPATH=. python bench/results/history/getjob-scatter-cycle.py before=DIR after=DIR [rounds]
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import peers
from bench import peers_servers as srv
from bench.peers_drivers import Target
from bench.peers_load import cycle


def main() -> None:
    trees = [(label, Path(d).resolve()) for label, _, d in (a.partition("=") for a in sys.argv[1:3])]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    rate: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[float]] = {}
    print("load at start:", os.getloadavg())
    for r in range(rounds):
        for label, tree in trees if r % 2 == 0 else trees[::-1]:
            for workers in (1, 2):
                with tempfile.TemporaryDirectory(dir=srv.scratch_root()) as tmp, \
                        srv.disque_mp_nodes(Path(tmp), 1, workers, tree) as ports:
                    t = Target("disque-mp", ports, 1, tuple(srv.server_pids(ports)))
                    qs = [f"scatter-r{r}-{i}" for i in range(peers.MANY_QUEUES)]
                    run = functools.partial(cycle, t, qs, peers.CLIENTS, peers.cycle_seconds)
                    out: dict[str, Any] = peers.with_queues(t, qs, run)
                rate.setdefault((label, workers), []).append(out.get("jobs_per_s", 0.0))
                cpu.setdefault((label, workers), []).append(out.get("server_us_per_job") or 0.0)
                print(r, label, workers, out, flush=True)
    print("load at end:", os.getloadavg())
    for (label, workers), v in sorted(rate.items()):
        print(f"{label} workers={workers}: median {statistics.median(v):.0f} jobs/s "
              f"rounds {[round(x) for x in v]}")
    for (label, workers), v in sorted(cpu.items()):
        print(f"{label} workers={workers}: node CPU per job median {statistics.median(v):.1f} us "
              f"rounds {[round(x, 1) for x in v]}")


if __name__ == "__main__":
    main()
