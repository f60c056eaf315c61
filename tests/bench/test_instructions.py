"""bench/instructions.py: a real node of this tree under callgrind, real
redis-benchmark phases, counters dumped between them. No figure is asserted but
that each phase was counted and the first tree is the reference."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import instructions

REPO = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^\s*(\w+) -P 32: ADDJOB ([\d,]+) instr/req \(([-+][\d.]+) %\), "
                  r"GETJOB NOHANG ([\d,]+) instr/req \(([-+][\d.]+) %\)$")


@pytest.mark.integration
def test_each_phase_of_a_node_is_counted(capsys: pytest.CaptureFixture[str]) -> None:
    assert instructions.main([f"a={REPO}", "--requests", "640", "--pipeline", "32",
                              "--workers", "1"]) == 0
    rows = [LINE.match(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 1 and rows[0] is not None
    m = rows[0]
    assert m.group(1) == "a" and m.group(3) == "+0.00" and m.group(5) == "+0.00"
    # an ADDJOB costs the node thousands of instructions: a phase counted as 0 (a
    # dump that missed the workers) or as the whole run would be far off
    assert 2_000 < int(m.group(2).replace(",", "")) < 5_000_000
    assert 2_000 < int(m.group(4).replace(",", "")) < 5_000_000


def test_the_shape_commands_are_the_requests_they_name() -> None:
    import hiredis

    reader = hiredis.Reader()
    for command, words in (("ADDJOB", [b"ADDJOB", b"q:7", b"x", b"0"]), ("QLEN", [b"QLEN", b"q:7"]),
                           ("QSTAT", [b"QSTAT", b"q:7"]), ("QPEEK", [b"QPEEK", b"q:7", b"1"])):
        reader.feed(instructions._request(command, b"q:7"))
        assert reader.gets() == words
    instructions._check("ADDJOB", b"D-1234")
    instructions._check("QLEN", 3)
    with pytest.raises(RuntimeError):
        instructions._check("QLEN", b"D-1234")
    with pytest.raises(RuntimeError):
        instructions._check("ADDJOB", b"-ERR")


@pytest.mark.integration
def test_the_cycle_and_paced_drivers_run_every_job_through(tmp_path: Path) -> None:
    """The loads of bench.cycle_instructions (one queue and many) and
    bench.paced_instructions on one real node: every job added is delivered and
    acknowledged (the node is left with none)."""
    import redis

    from bench import cycle_instructions, paced_instructions
    from tests.nodeproc import NodeProc

    with NodeProc(tmp_path / "node", workers=1) as node:
        cycle_instructions.drive(node.port, 300, "one", 1)
        cycle_instructions.drive(node.port, 300, "many", 7)
        paced_instructions.drive(node.port, 12, 0.001, b"paced")
        r = redis.Redis(port=node.port)
        try:
            assert r.info()["registered_jobs"] == 0
        finally:
            r.close()
