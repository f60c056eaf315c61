"""Where the CPU of one command goes, for disque-mp and the reference Disque side by side.

    python -m bench.cpu_split [--workers 1] [--pipeline 1 32] [--cmd "ADDJOB q x 0"] [--out NAME]

For each server and pipeline depth: the server's CPU per request (utime + stime of
its processes over a redis-benchmark run, as bench/scaling.py measures it), and a
``perf record`` of those processes during a second run of the same load, whose
samples are split by where they fell: the kernel (sockets, epoll, scheduling), the
event loop (uvloop/libuv), the Python runtime (libpython: allocation, reference
counts, dict lookups, calls through the C API), the project's compiled code (the
mypyc extension), hiredis, libc, and the rest. Shares times CPU per request give
microseconds per request for each part, so the two servers compare part by part.

Needs ``perf`` (linux-tools) and the right to record other processes (root, or
perf_event_paranoid <= 1); the reference is built as bench/scaling.py does, and
skipped with a message when it cannot be. Writes bench/results/cpu-split-NAME.md.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.plots import RESULTS
from bench.record import provenance_line
from bench.redisq import redis_benchmark
from bench.scaling import (
    REQUESTS,
    bench_cpu,
    disque_mp_node,
    median_row,
    reference_binary,
    reference_server,
)
from disque_mp.compiled import COMPILED_MODULES

record_hz = 2000  # samples per second per process
record_s = 2.0  # recorded while the second run is under way
record_delay_s = 0.5  # let the run reach its steady state first
rounds = 3  # CPU per request: the median of this many runs

# the per-module shims of the mypyc build (shard.cpython-*.so, ...) beside the shared library
_COMPILED_LEAVES = frozenset(m.rsplit(".", 1)[1] for m in COMPILED_MODULES)
PARTS = ("kernel", "event loop", "python runtime", "compiled project code",
         "hiredis", "libc", "server (C)", "other")


def part_of(dso: str, symbol: str) -> str:
    """The part of the stack a sample's DSO and symbol belong to."""
    if dso.startswith("[kernel") or symbol.startswith("[k]"):
        return "kernel"
    name = Path(dso).name
    if "uvloop" in dso or "libuv" in name or name.startswith("loop.cpython"):
        return "event loop"
    if name.startswith("libpython") or name == "python3.11":
        return "python runtime"
    if "__mypyc" in name or name.split(".")[0] in _COMPILED_LEAVES:
        return "compiled project code"
    if "hiredis" in name:
        return "hiredis"
    if name.startswith(("libc.", "libc-", "ld-linux", "libm.")):
        return "libc"
    if name.startswith("disque-server"):
        return "server (C)"
    return "other"


def record(pids: list[int], seconds: float) -> dict[str, float]:
    """perf samples of ``pids`` for ``seconds``, counted per part."""
    out = Path(tempfile.mkdtemp(prefix="cpu-split-")) / "perf.data"
    try:
        subprocess.run(["perf", "record", "-q", "-F", str(record_hz), "-o", str(out),
                        "-p", ",".join(map(str, pids)), "--", "sleep", str(seconds)],
                       capture_output=True, timeout=seconds + 60, check=True)
        rep = subprocess.run(["perf", "report", "-i", str(out), "--no-children", "--sort", "dso,symbol",
                              "-F", "overhead,dso,symbol", "--stdio", "-q"],
                             capture_output=True, text=True, timeout=120, check=True).stdout
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)
    parts: dict[str, float] = collections.defaultdict(float)
    for line in rep.splitlines():
        bits = line.split()
        if len(bits) < 3 or not bits[0].endswith("%"):
            continue
        parts[part_of(bits[1], " ".join(bits[2:]))] += float(bits[0][:-1])
    return parts


def flush(port: int, prefill: str, jobs: int) -> None:
    """Empty the server between runs (DEBUG FLUSHALL, which both servers have: a long
    ADDJOB run would otherwise take the reference to its maxmemory), then queue
    ``jobs`` jobs in ``prefill`` when one is named (for GETJOB runs)."""
    import redis

    redis.Redis(port=port, protocol=2).execute_command("DEBUG", "FLUSHALL")
    if prefill:
        redis_benchmark(port, "ADDJOB", prefill, "x", "0", requests=jobs, pipeline=32)


def measure(port: int, pids: list[int], cmd: list[str], pipeline: int,
            prefill: str = "") -> dict[str, Any]:
    rows = []
    for _ in range(rounds):
        flush(port, prefill, REQUESTS)
        rows.append(bench_cpu(port, pids, *cmd, pipeline=pipeline))
    row = median_row(rows)
    # the profile: a run of the same load with perf attached meanwhile
    shares: dict[str, float] = {}

    def prof() -> None:
        time.sleep(record_delay_s)
        try:
            shares.update(record(pids, record_s))
        except subprocess.SubprocessError as e:  # reported; that column's parts stay empty
            print(f"perf record of {pids} failed: {e}")

    # long enough to cover the recording, at the rate just measured
    requests = int(row["rps"] * (record_delay_s + record_s + 1.0))
    flush(port, prefill, requests)
    t = threading.Thread(target=prof)
    t.start()
    bench_cpu(port, pids, *cmd, pipeline=pipeline, requests=requests)
    t.join()
    total = sum(shares.values()) or 1.0
    us = row["server_us_per_req"]
    return {"rps": row["rps"], "us_per_req": us,
            "parts": {p: round(us * shares.get(p, 0.0) / total, 2) for p in PARTS}}


def table(results: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    servers = list(results)
    pipelines = sorted({p for r in results.values() for p in r})
    lines = ["| part (us per request) | " + " | ".join(f"{s} -P {p}" for p in pipelines for s in servers) + " |",
             "|---|" + "---|" * (len(servers) * len(pipelines))]
    for part in PARTS:
        cells = [results[s][p]["parts"][part] for p in pipelines for s in servers]
        if any(cells):
            lines.append(f"| {part} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    lines.append("| **server CPU per request** | " + " | ".join(
        f"**{results[s][p]['us_per_req']:.2f}**" for p in pipelines for s in servers) + " |")
    lines.append("| req/s | " + " | ".join(
        f"{results[s][p]['rps']:,.0f}" for p in pipelines for s in servers) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--pipeline", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--cmd", default="ADDJOB q x 0")
    ap.add_argument("--out", default="")
    ap.add_argument("--prefill", default="", metavar="QUEUE",
                    help="before each run, queue as many jobs in QUEUE as the run has requests")
    args = ap.parse_args(argv)
    if shutil.which("perf") is None:
        print("perf is not installed: nothing to record")
        return 1
    cmd = args.cmd.split()
    results: dict[str, dict[int, dict[str, Any]]] = {}
    work = Path(tempfile.mkdtemp(prefix="cpu-split-"))
    try:
        with disque_mp_node(work, args.workers) as (port, pids):
            results[f"disque-mp {args.workers}w"] = {p: measure(port, pids, cmd, p, args.prefill) for p in args.pipeline}
        binary, status = reference_binary()
        if binary is not None:
            with reference_server(binary, work) as (port, pids):
                results["reference"] = {p: measure(port, pids, cmd, p, args.prefill) for p in args.pipeline}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    name = args.out or "-".join(cmd[:1]).lower() + f"-w{args.workers}"
    text = [f"# CPU per request by part: `{args.cmd}`", "",
            f"`python -m bench.cpu_split --workers {args.workers} --pipeline "
            f"{' '.join(map(str, args.pipeline))} --cmd \"{args.cmd}\""
            f"{' --prefill ' + args.prefill if args.prefill else ''}` at "
            f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; redis-benchmark -c 50 -n 200000. "
            f"Reference: {status}. Server CPU per request: median of {rounds} runs "
            f"(utime + stime of the server's processes); parts: perf samples of a further run "
            f"({record_hz} Hz, {record_s:.0f} s), by shared object. {provenance_line()}",
            "", *table(results), ""]
    path = RESULTS / f"cpu-split-{name}.md"
    path.write_text("\n".join(text))
    print("\n".join(text))
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
