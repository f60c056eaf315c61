"""Where a node's time goes: py-spy samples every worker while a load runs.

    python -m bench.profile_node --workers 2 --load "ADDJOB q x 0" --pipeline 32
    python -m bench.profile_node --workers 2 --load cycle
    python -m bench.profile_node --prefill 2000000 --load "GETJOB NOHANG FROM q:0"

Starts a real node (tests/nodeproc.py), runs redis-benchmark with the given
command (or the load generator's cycle), and records each worker with
``py-spy record --format raw`` at the same time. Prints the functions with the
most samples on top of the stack (self) and anywhere on it (total) into
bench/results/history/profile-NAME.txt (a profile is a note of the lab notebook,
read beside the change it explains: bench/results/README.md); ``--stacks`` also
keeps the collapsed stacks (flamegraph.pl input) as profile-NAME.collapsed.
py-spy needs ptrace rights over the workers (root, or ptrace_scope 0).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from bench import loadgen
from bench.plots import RESULTS
from bench.record import provenance_line
from bench.redisq import children_of
from disque_mp import compiled
from tests.nodeproc import NodeProc

sample_rate_hz = 250  # enough samples in a few seconds, little overhead
top_functions = 25  # lines printed per table
trunk_share = 0.99  # frames on (nearly) every stack are process startup, not information
py_spy_timeout_s = 120.0  # py-spy stops by itself after --duration; this is the backstop
_LINE = re.compile(r":\d+\)$")


def frame_name(frame: str) -> str:
    """``func (path/file.py:123)`` -> ``func (file.py)``: aggregate over lines."""
    frame = _LINE.sub(")", frame.strip())
    if "(" in frame:
        fn, path = frame.split(" (", 1)
        return f"{fn} ({Path(path.rstrip(')')).name})"
    return frame


def tables(collapsed: str) -> tuple[collections.Counter[str], collections.Counter[str], int]:
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in collapsed.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = [frame_name(f) for f in stack.split(";")]
        count = int(n)
        samples += count
        own[frames[-1]] += count
        for f in set(frames):
            total[f] += count
    return own, total, samples


def report(collapsed: str, title: str) -> str:
    own, total, samples = tables(collapsed)
    out = [f"## {title}: {samples} samples", "", "self %   function"]
    out += [f"{100 * n / max(samples, 1):6.1f}   {f}" for f, n in own.most_common(top_functions)]
    out += ["", "total %  function"]
    trunk = {f for f, n in total.items() if n >= trunk_share * samples}  # startup frames
    out += [f"{100 * n / max(samples, 1):6.1f}   {f}"
            for f, n in total.most_common(top_functions + len(trunk)) if f not in trunk]
    return "\n".join(out) + "\n"


def record(pid: int, seconds: float, out: Path, native: bool) -> subprocess.Popen[bytes]:
    """py-spy on one worker. ``native``: also C frames, where the mypyc build's time is
    (without it a compiled function's time shows as its nearest Python caller's)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    cmd = [spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate",
           str(sample_rate_hz), "--format", "raw", "-o", str(out)]
    # --native needs the process stopped while its C stack is read
    cmd.append("--native" if native else "--nonblocking")
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def run_load(port: int, load: str, pipeline: int, seconds: float) -> str:
    if load == "cycle":
        s = loadgen.Settings(workload="cycle", target="disque", port=port, procs=2,
                             pipeline=pipeline, duration_s=seconds, quiet=True)
        return loadgen.human(loadgen.run(s))
    return benchmark_for(port, load.split(), pipeline, seconds)


def benchmark_for(port: int, args: list[str], pipeline: int, seconds: float) -> str:
    """redis-benchmark has no duration option: run it long and stop it after ``seconds``;
    its last progress line carries the overall rate."""
    cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", "50", "-n", "100000000",
           "-P", str(pipeline), "-q", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    rates = re.findall(rb"rps=[0-9.]+ \(overall: ([0-9.]+)\)", out)
    rate = float(rates[-1]) if rates else 0.0
    return f"{' '.join(cmd)}: {rate:,.0f} req/s overall"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile_node")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--load", default="ADDJOB q x 0", help='a command for redis-benchmark, or "cycle"')
    p.add_argument("--pipeline", type=int, default=1)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--prefill", type=int, default=0, help="ADDJOB this many jobs to queue q:0 first")
    p.add_argument("--stacks", action="store_true",
                   help="also keep the collapsed stacks (flamegraph.pl input) in bench/results/history/")
    p.add_argument("--name", default="", help="suffix of bench/results/history/profile-NAME.txt")
    p.add_argument("--native", choices=["auto", "yes", "no"], default="auto",
                   help="sample C frames too (auto: when the mypyc build is in use)")
    a = p.parse_args(argv)
    native = a.native == "yes" or (a.native == "auto" and compiled.summary() != "pure")
    name = a.name or re.sub(r"[^a-z0-9]+", "-", f"{a.load}-p{a.pipeline}-w{a.workers}".lower())
    with tempfile.TemporaryDirectory() as tmp, NodeProc(Path(tmp), workers=a.workers) as node:
        assert node.proc is not None
        pids = children_of(node.proc.pid)
        if a.prefill:
            loadgen.run(loadgen.Settings(workload="produce", target="disque", port=node.port,
                                         procs=1, conns=4, pipeline=64, jobs=a.prefill,
                                         prefix="q", duration_s=600.0, quiet=True, queues=1))
        outs = [Path(tmp) / f"w{i}.txt" for i in range(len(pids))]
        result: list[str] = []
        load = threading.Thread(target=lambda: result.append(
            run_load(node.port, a.load, a.pipeline, a.seconds + 2)))
        load.start()
        spies = [record(pid, a.seconds, out, native) for pid, out in zip(pids, outs, strict=True)]
        for spy in spies:
            spy.wait(timeout=py_spy_timeout_s)
        load.join(timeout=a.seconds + 120)
        text = f"# profile {name}: load `{a.load}` -P {a.pipeline}, {a.workers} workers\n\n"
        if native:
            text += ("py-spy --native (C frames of the mypyc build; sampling pauses the worker, "
                     "so the rate below is under the benchmark's)\n\n")
        text += (result[0] if result else "load did not finish") + "\n\n"
        stacks = ""
        for i, out in enumerate(outs):
            collapsed = out.read_text() if out.exists() else ""
            text += report(collapsed, f"worker process {i} (pid {pids[i]})") + "\n"
            stacks += collapsed
    notes = RESULTS / "history"
    notes.mkdir(parents=True, exist_ok=True)
    (notes / f"profile-{name}.txt").write_text(f"{provenance_line()}\n\n{text}")
    if a.stacks:
        (notes / f"profile-{name}.collapsed").write_text(stacks)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
