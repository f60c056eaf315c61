"""What an idle node costs: CPU and wake-ups of a node with no client at all.

    python -m bench.idle [--workers 1 2 4 8 16] [--seconds 10] [--settle 3]
                         [--trees base=/tmp/base new=.] [--pure] [--no-reference]

For each tree and worker count it starts one node (``bench.peers_servers``
``disque_mp_nodes``), waits until every worker is up and the node has settled
(``--settle`` seconds: start-up imports, the first membership view), then reads
from /proc, over ``--seconds``, the CPU every process of the node used (the
supervisor and the workers: utime + stime, and the scheduler's nanoseconds of
each thread, ``/proc/PID/task/TID/schedstat``) and how often it woke (voluntary
context switches: each is a sleep the process came back from). It prints % of a
core per node and per worker, the wake-ups per second, and the C reference
(``bench.scaling.reference_binary``) idle the same way beside them.

``--trees NAME=PATH`` runs the node from each source tree in the same run (a
before/after of a change); ``--pure`` runs every tree as plain Python
(``DISQUE_MP_PURE=1``), so trees with and without compiled modules compare alike.
Writes bench/results/idle.md and idle.json (``--md``/``--json`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.record import REPO, provenance, provenance_line

clock_ticks_per_s = os.sysconf("SC_CLK_TCK")
settle_s_default = 3.0  # after every worker is up: imports done, first views applied


@dataclass
class Sample:
    """What the processes of one server used up to one moment."""

    ticks: int  # utime + stime, in clock ticks, every process
    run_ns: int  # the scheduler's run time of every thread
    wakes: int  # voluntary context switches of every thread


@dataclass
class Row:
    system: str  # "base", "new", "C Disque"
    workers: int  # 0 for the reference
    processes: int
    seconds: float
    cpu_pct: float  # utime + stime of every process over the window, % of one core
    sched_pct: float  # the same from the scheduler's nanoseconds (finer than clock ticks)
    per_worker_pct: float  # sched_pct / workers (the reference: its one process)
    supervisor_pct: float  # the supervisor alone (0 for the reference)
    wakes_per_s: float  # voluntary context switches per second, every thread
    wakes_per_worker_s: float


def _read_int_fields(path: str) -> list[str]:
    with open(path) as f:
        return f.read().rsplit(")", 1)[-1].split()


def sample(pids: list[int]) -> dict[int, Sample]:
    """Each live process's CPU and wake-ups so far (a process gone meanwhile is left out)."""
    out = {}
    for pid in pids:
        try:
            fields = _read_int_fields(f"/proc/{pid}/stat")
            ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
            run_ns = wakes = 0
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    run_ns += int(f.read().split()[0])
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches:"):
                            wakes += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out[pid] = Sample(ticks, run_ns, wakes)
    return out


def measure(system: str, workers: int, pids: list[int], supervisor: int | None,
            seconds: float) -> Row:
    t0 = time.monotonic()
    before = sample(pids)
    time.sleep(seconds)
    after = sample(pids)
    span_s = time.monotonic() - t0
    live = [p for p in before if p in after]
    ticks = sum(after[p].ticks - before[p].ticks for p in live)
    run_ns = sum(after[p].run_ns - before[p].run_ns for p in live)
    wakes = sum(after[p].wakes - before[p].wakes for p in live)
    sup_ns = (after[supervisor].run_ns - before[supervisor].run_ns
              if supervisor in before and supervisor in after else 0)
    cpu_pct = 100 * ticks / clock_ticks_per_s / span_s
    sched_pct = 100 * run_ns / 1e9 / span_s
    n = max(workers, 1)
    return Row(system, workers, len(live), round(span_s, 2), round(cpu_pct, 3),
               round(sched_pct, 3), round(sched_pct / n, 3), round(100 * sup_ns / 1e9 / span_s, 3),
               round(wakes / span_s, 1), round(wakes / span_s / n, 1))


def node_rows(name: str, tree: Path, counts: list[int], seconds: float, settle_s: float,
              pure: bool, workdir: Path) -> list[Row]:
    from bench.peers_servers import disque_mp_nodes, server_pids

    rows = []
    saved = os.environ.get("DISQUE_MP_PURE")
    if pure:
        os.environ["DISQUE_MP_PURE"] = "1"
    try:
        for w in counts:
            with disque_mp_nodes(workdir / f"{name}-w{w}", 1, w, tree) as ports:
                time.sleep(settle_s)
                pids = server_pids(ports)
                supervisor = min(pids, key=lambda p: _parent_in(p, pids))
                row = measure(name, w, pids, supervisor, seconds)
                rows.append(row)
                print(_line(row), flush=True)
    finally:
        if saved is None:
            os.environ.pop("DISQUE_MP_PURE", None)
        else:
            os.environ["DISQUE_MP_PURE"] = saved
    return rows


def tree_build(tree: Path, pure: bool) -> str:
    """The build a node from ``tree`` runs (``compiled.summary()``: mypyc, pure, mixed, stale)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    if pure:
        env["DISQUE_MP_PURE"] = "1"
    out = subprocess.run([sys.executable, "-c", "from disque_mp import compiled; print(compiled.summary())"],
                         env=env, cwd=str(tree), capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or f"unknown ({out.stderr.strip()[-200:]})"


def _parent_in(pid: int, pids: list[int]) -> int:
    """0 for the process whose parent is outside ``pids`` (the supervisor), else 1."""
    try:
        ppid = int(_read_int_fields(f"/proc/{pid}/stat")[1])
    except (OSError, ValueError, IndexError):
        return 1
    return 1 if ppid in pids else 0


def reference_row(seconds: float, settle_s: float, workdir: Path) -> tuple[Row | None, str]:
    from bench.scaling import reference_binary, reference_server

    binary, status = reference_binary()
    if binary is None:
        return None, status
    with reference_server(binary, workdir / "reference") as (_port, pids):
        time.sleep(settle_s)
        row = measure("C Disque", 0, pids, None, seconds)
    print(_line(row), flush=True)
    return row, status


def _line(r: Row) -> str:
    who = f"{r.system} w{r.workers}" if r.workers else r.system
    return (f"{who:>14}: {r.sched_pct:6.2f} % of a core ({r.cpu_pct:.2f} % utime+stime), "
            f"{r.per_worker_pct:5.2f} % per worker, supervisor {r.supervisor_pct:.2f} %, "
            f"{r.wakes_per_s:7.1f} wake-ups/s ({r.wakes_per_worker_s:.1f} per worker)")


def markdown(rows: list[Row], ref: Row | None, ref_status: str, args: argparse.Namespace,
             trees: dict[str, Path], builds: dict[str, str]) -> str:
    lines = [
        "# An idle node: CPU and wake-ups with no client at all",
        "",
        f"`python -m bench.idle --workers {' '.join(map(str, args.workers))} --seconds {args.seconds:g} "
        f"--settle {args.settle:g} --trees {' '.join(f'{k}={v}' for k, v in trees.items())}"
        f"{' --pure' if args.pure else ''}`",
        "",
        provenance_line() + (" Every tree ran as plain Python (`--pure`)." if args.pure else ""),
        "Trees: " + ", ".join(f"{k} = {v} (build {builds[k]})" for k, v in trees.items()) + ".",
        "",
        "Each node (supervisor and workers) measured over the window after every worker was up "
        f"and {args.settle:g} s to settle. `% of a core` is the scheduler's run time of every "
        "thread (`/proc/PID/task/TID/schedstat`); `utime+stime` the same from /proc/PID/stat "
        "(10 ms ticks); wake-ups are voluntary context switches (each a sleep the process came "
        "back from).",
        "",
        "| node | workers | % of a core | utime+stime % | per worker % | supervisor % | wake-ups/s | per worker |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows + ([ref] if ref is not None else []):
        lines.append(f"| {r.system} | {r.workers or '-'} | {r.sched_pct:.2f} | {r.cpu_pct:.2f} | "
                     f"{r.per_worker_pct:.2f} | {r.supervisor_pct:.2f} | {r.wakes_per_s:.1f} | "
                     f"{r.wakes_per_worker_s:.1f} |")
    lines += ["", f"C Disque: {ref_status}." if ref is None else
              f"C Disque ({ref_status}): one process, `hz 10`.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--settle", type=float, default=settle_s_default)
    ap.add_argument("--trees", nargs="+", default=["new=."], metavar="NAME=PATH")
    ap.add_argument("--pure", action="store_true", help="run every tree as plain Python")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--md", type=Path, default=REPO / "bench" / "results" / "idle.md")
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "idle.json")
    args = ap.parse_args(argv)
    trees = {}
    for spec in args.trees:
        name, _, path = spec.partition("=")
        trees[name or "new"] = Path(path or ".").resolve()
    builds = {name: tree_build(tree, args.pure) for name, tree in trees.items()}
    with tempfile.TemporaryDirectory(prefix="disque-mp-idle-") as tmp:
        rows = []
        for name, tree in trees.items():
            rows += node_rows(name, tree, args.workers, args.seconds, args.settle, args.pure, Path(tmp))
        ref, ref_status = (None, "skipped (--no-reference)") if args.no_reference else \
            reference_row(args.seconds, args.settle, Path(tmp))
    args.md.parent.mkdir(parents=True, exist_ok=True)
    args.md.write_text(markdown(rows, ref, ref_status, args, trees, builds))
    record = {**provenance(), "pure": args.pure, "seconds": args.seconds, "settle": args.settle,
              "trees": {k: str(v) for k, v in trees.items()}, "builds": builds,
              "rows": [asdict(r) for r in rows], "reference": asdict(ref) if ref else None,
              "reference_status": ref_status}
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.md} and {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
