"""What a benchmark's current record in bench/results/ names: the node's build, the
commit measured and the machine (bench/results/README.md lists the records)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def commit() -> str:
    """The checkout's short commit, marked when it has uncommitted changes."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                          capture_output=True, text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           cwd=REPO, capture_output=True, text=True).stdout.strip()
    return head + (" (with uncommitted changes)" if dirty else "")


def machine() -> str:
    return f"{os.cpu_count()} CPUs, {platform.platform()}"


def provenance() -> dict[str, str]:
    """``build`` (``compiled.summary()``: mypyc, pure, mixed or stale), ``commit``, ``machine``."""
    from disque_mp import compiled

    return {"build": compiled.summary(), "commit": commit(), "machine": machine()}


def provenance_line() -> str:
    """The record's one line of provenance, for its Markdown."""
    p = provenance()
    return f"Build {p['build']}, commit {p['commit']}, machine: {p['machine']}."


def run_and_write(out: Path, stem: str, run: Callable[[Path], dict[str, Any]],
                  to_markdown: Callable[[dict[str, Any]], str],
                  fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run a benchmark in a temporary directory (removed after) and write its record,
    ``<stem>.json`` and ``<stem>.md`` in ``out``: the time, machine, node build,
    commit, the load average before and after, ``fields`` and ``results``. Prints the
    Markdown; returns the report."""
    from disque_mp import compiled

    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{stem}-"))
    load_before = os.getloadavg()[0]
    try:
        results = run(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report = {"time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": machine(), "node_build": compiled.summary(), "commit": commit(),
              **(fields or {}),
              "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
              "results": results}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"{stem}.md").write_text(to_markdown(report))
    print(to_markdown(report))
    return report
