"""bench/front_read.py: a child process on a real tree (this one) builds a worker and
a connection and runs reads of ADDJOB and GETJOB through them. No timing is asserted:
each command is reported, measured against the first tree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import front_read

REPO = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^\s*(\w+): ADDJOB ([\d,]+) ns/read \(([-+][\d.]+) %\), "
                  r"GETJOB ([\d,]+) ns/read \(([-+][\d.]+) %\)$")


def test_each_tree_reports_both_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert front_read.main([f"a={REPO}", f"b={REPO}", "--reads", "50", "--repeats", "2"]) == 0
    rows = [LINE.match(line) for line in capsys.readouterr().out.splitlines()]
    assert [m.group(1) for m in rows if m] == ["a", "b"]
    first = rows[0]
    assert first is not None and first.group(3) == "+0.0" and first.group(5) == "+0.0"
    for m in rows:
        assert m is not None and int(m.group(2).replace(",", "")) > 0
        assert int(m.group(4).replace(",", "")) > 0


def test_a_tree_without_the_node_is_refused(tmp_path: Path) -> None:
    """The installed package must not stand in for a tree that lacks it."""
    with pytest.raises(RuntimeError, match="not from the tree"):
        front_read.run_tree(tmp_path, 10, 1)
