"""bench/crossing.py: a node per tree, both shapes per round, the medians and the ratio
printed. Counts only; no timing is asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.crossing import main

REPO = Path(__file__).resolve().parents[2]


# serial: its load generators are forked (as bench.scaling's cores run)
@pytest.mark.serial
@pytest.mark.integration
def test_two_trees_each_get_both_shapes_and_a_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([f"one={REPO}", f"two={REPO}", "--workers", "2", "--rounds", "1",
                 "--seconds", "0.3"]) == 0
    out = capsys.readouterr().out
    for label in ("one", "two"):
        for shape in ("random", "per-connection"):
            assert f"{label:>10} {shape:>14}:" in out
        line = next(s for s in out.splitlines() if s.startswith(f"{label:>10}: random"))
        assert line.endswith("x") and "per-connection" in line
