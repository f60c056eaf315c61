"""What a benchmark's current record in bench/results/ names: the node's build, the
commit measured and the machine (bench/results/README.md lists the records)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

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
