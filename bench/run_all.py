"""``make bench``: run the micro and macro suites, write results, plots and a summary.

    python -m bench.run_all                 # everything (about 10 minutes on 2 cores)
    python -m bench.run_all --only micro    # or: --only macro
    python -m bench.run_all -k cycle        # a subset of the macro suite, written to
                                            # macro-subset.json (the record stays)

Writes bench/results/micro.json, macro.json (pytest-benchmark JSON; the macro
figures are in each benchmark's ``extra_info``), machine.json, summary.md and
the PNG plots.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from bench.plots import RESULTS, render

REPO = Path(__file__).resolve().parent.parent
suite_timeout_s = 3600  # the macro suite takes ~10 min; a hung server must not hang make


def machine() -> dict[str, object]:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    redis_v = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    from disque_mp import compiled

    return {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "build": compiled.summary(),  # what the nodes run (INFO workers: shard_build)
            "python": platform.python_version(), "redis": redis_v.split(" sha=")[0].strip(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
            "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
            "commit": head + (" (with uncommitted changes)" if dirty else "")}


def run_suite(name: str, extra: list[str], out: Path) -> int:
    cmd = [sys.executable, "-m", "pytest", f"bench/test_{name}.py", "--benchmark-enable",
           f"--benchmark-json={out}", "--timeout", str(suite_timeout_s), "-p", "no:cacheprovider",
           "-q", *extra]
    print("+", " ".join(cmd), flush=True)
    rc = subprocess.run(cmd, cwd=REPO, timeout=suite_timeout_s).returncode
    if out.exists():
        strip_samples(out)
    return rc


def strip_samples(path: Path) -> None:
    """pytest-benchmark keeps every timing sample (~19 MB for the micro suite); the
    committed results keep the statistics only."""
    data = json.loads(path.read_text())
    for b in data.get("benchmarks", []):
        b.get("stats", {}).pop("data", None)
    path.write_text(json.dumps(data, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run_all")
    p.add_argument("--only", choices=["micro", "macro"])
    p.add_argument("-k", dest="select", help="pytest -k expression for the macro suite")
    a = p.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    info = machine()
    full = a.only in (None, "macro") and not a.select
    name = "machine.json" if full else "machine-subset.json"  # the record's stays
    (RESULTS / name).write_text(json.dumps(info, indent=2) + "\n")
    rc = 0
    if a.only in (None, "micro"):
        rc |= run_suite("micro", [], RESULTS / "micro.json")
    if a.only in (None, "macro") and a.select:  # a subset must not replace the record
        rc |= run_suite("macro", ["-k", a.select], RESULTS / "macro-subset.json")
    elif a.only in (None, "macro"):
        rc |= run_suite("macro", [], RESULTS / "macro.json")
        if (RESULTS / "macro.json").exists():
            print((render(RESULTS / "macro.json", info)).read_text())
    return rc


if __name__ == "__main__":
    sys.exit(main())
