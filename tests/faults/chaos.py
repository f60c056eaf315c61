"""The long form of the fault suite (``make chaos``): 5 real nodes, every fault kind,
about 10 minutes of workload per seed; a history JSON, a PNG timeline and a line
of figures per seed.

    python -m tests.faults.chaos --seeds 1 2 3 [--nodes 5] [--duration-s 600] \
        [--out bench/results/chaos]

Writes ``<out>/history-seed<N>.json.gz``, ``<out>/timeline-seed<N>.png`` and
``<out>/summary.md``; exits 1 if any seed failed (its node logs are kept and
their directory printed), 2 where network namespaces cannot be used.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.faults.history import load
from tests.faults.nemesis import all_kinds
from tests.faults.netns import missing_requirements
from tests.faults.plot import plot
from tests.faults.runner import FaultRun, run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--nodes", type=int, default=5)
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--kinds", nargs="+", default=list(all_kinds), choices=all_kinds)
    ap.add_argument("--replicate", type=int, default=3)
    ap.add_argument("--rate", type=float, default=6.0, help="ADDJOB/s per producer")
    ap.add_argument("--keep", action="store_true", help="keep the node dirs of passing seeds")
    ap.add_argument("--out", type=Path, default=Path("bench/results/chaos"))
    args = ap.parse_args(argv)
    why_not = missing_requirements()
    if why_not:
        print(f"chaos: cannot run: {why_not}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    failed = False
    for seed in args.seeds:
        cfg = FaultRun(seed=seed, nodes=args.nodes, kinds=tuple(args.kinds),
                       duration_s=args.duration_s, healthy_s=(8.0, 15.0), faulty_s=(10.0, 20.0),
                       replicate=args.replicate, rate_per_s=args.rate, drain_max_s=180.0)
        workdir = Path(tempfile.mkdtemp(prefix=f"disque-mp-chaos-seed{seed}-"))
        history = args.out / f"history-seed{seed}.json.gz"
        print(f"chaos: seed {seed}, {args.nodes} nodes, {args.duration_s:.0f} s, "
              f"kinds {' '.join(args.kinds)}", flush=True)
        t0 = time.monotonic()
        try:
            res = run(cfg, workdir, history)
        except Exception as e:  # noqa: BLE001 - one broken seed must not hide the others
            res = {"valid": False, "problems": [f"run broke off: {e!r}"]}
        if history.exists():
            plot(load(history), args.out / f"timeline-seed{seed}.png")
        r2, r0 = res.get("r2", {}), res.get("r0", {})
        again = res.get("after_ack", {})
        row = (f"| {seed} | {res.get('operations')} | {res.get('faults')} | "
               f"{r2.get('ok')} / {r0.get('ok')} | {len(r2.get('lost', []))} | "
               f"{len(r0.get('lost', []))} | {r2.get('duplicated')} ({r2.get('extra_deliveries')}) | "
               f"{r0.get('duplicated')} | {len(again.get('explained', []))} / "
               f"{len(again.get('unexplained', []))} | {len(res.get('unexpected', []))} | "
               f"{'yes' if res['valid'] else 'NO'} | {time.monotonic() - t0:.0f} s |")
        rows.append(row)
        print(row, flush=True)
        if res["valid"] and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not res["valid"]:
            failed = True
            print(f"chaos: seed {seed} FAILED; history {history}, node logs in {workdir}:\n  "
                  + "\n  ".join(res["problems"]), flush=True)
    header = ("| seed | operations | faults | enqueued ok (r2 / r0) | lost r2 | lost r0 "
              "(at-most-once) | duplicated r2 (extra deliveries) | duplicated r0 | delivered again "
              "after an answered ACK (fault at the ACK / none) | unexpected | valid | wall time "
              "|\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    (args.out / "summary.md").write_text(
        f"# make chaos: {args.nodes} nodes, {args.duration_s:.0f} s per seed, "
        f"kinds {', '.join(args.kinds)}\n\n{header}\n" + "\n".join(rows) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
