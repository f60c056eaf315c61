"""bench/idle.py end to end on a real node: one worker, a short window, no
reference: the record has a row with the node's CPU and wake-ups and names its build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import idle

pytestmark = pytest.mark.integration


def test_idle_bench_writes_its_record(tmp_path: Path) -> None:
    md, js = tmp_path / "idle.md", tmp_path / "idle.json"
    assert idle.main(["--workers", "1", "--seconds", "1", "--settle", "0.5", "--no-reference",
                      "--md", str(md), "--json", str(js)]) == 0
    record = json.loads(js.read_text())
    (row,) = record["rows"]
    assert row["system"] == "new" and row["workers"] == 1 and row["processes"] == 2
    assert row["sched_pct"] >= 0 and row["wakes_per_s"] >= 0
    assert record["builds"]["new"] in ("pure", "mypyc", "mixed") and record["reference"] is None
    text = md.read_text()
    assert "| new | 1 |" in text and "skipped (--no-reference)" in text
