"""bench/front_read.py: a child process on a real tree (this one) builds a worker and
a connection and runs reads of ADDJOB and GETJOB through them. No timing is asserted:
each command is reported, measured against the first tree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import front_read

REPO = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^\s*(\w+) -P (\d+) *: ADDJOB ([\d,]+) ns/command \(([-+][\d.]+) %\), "
                  r"GETJOB ([\d,]+) ns/command \(([-+][\d.]+) %\)$")


def test_each_tree_reports_both_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert front_read.main([f"a={REPO}", f"b={REPO}", "--reads", "50", "--repeats", "2",
                            "--pipeline", "1", "8"]) == 0
    rows = [LINE.match(line) for line in capsys.readouterr().out.splitlines()]
    assert [(m.group(1), m.group(2)) for m in rows if m] == [("a", "1"), ("b", "1"),
                                                              ("a", "8"), ("b", "8")]
    for first in (rows[0], rows[2]):
        assert first is not None and first.group(4) == "+0.0" and first.group(6) == "+0.0"
    for m in rows:
        assert m is not None and int(m.group(3).replace(",", "")) > 0
        assert int(m.group(5).replace(",", "")) > 0


def test_a_tree_without_the_node_is_refused(tmp_path: Path) -> None:
    """The installed package must not stand in for a tree that lacks it."""
    with pytest.raises(RuntimeError, match="not from the tree"):
        front_read.run_tree(tmp_path, 10, 1)
