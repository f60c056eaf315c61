"""redis-cli (the system binary) against a real node: lines of tests/reference/01."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.nodeproc import NodeProc

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("redis-cli") is None,
                                 reason="redis-cli not installed")]


def cli(node: NodeProc, *args: str, stdin: str | None = None) -> str:
    out = subprocess.run(["redis-cli", "-p", str(node.port), "--no-raw", *args], input=stdin,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_redis_cli_reproduces_reference_lines(node: NodeProc) -> None:
    assert cli(node, "PING") == "PONG\n"
    job_id = cli(node, "ADDJOB", "q1", "body1", "0").strip()
    assert re.fullmatch(r"D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-05a1", job_id), job_id
    assert cli(node, "QLEN", "q1") == "(integer) 1\n"
    assert cli(node, "QPEEK", "q1", "10") == f'1) 1) "q1"\n   2) "{job_id}"\n   3) "body1"\n'
    assert cli(node, "GETJOB", "NOHANG", "FROM", "emptyq") == "(nil)\n"
    assert cli(node, "ADDJOB", "q", "body") == \
        "(error) ERR wrong number of arguments for 'addjob' command\n"
    assert cli(node, "ADDJOB", "q", "body", "0", "TTL", "0") == "(error) ERR TTL must be a number > 0\n"
    assert cli(node, "ACKJOB", "notajobid") == "(error) BADID Invalid Job ID format.\n"
    assert cli(node, "SHOW", "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1") == "(nil)\n"
    assert cli(node, "NOSUCHCOMMAND") == "(error) ERR unknown command 'NOSUCHCOMMAND'\n"
    assert cli(node, "INFO", "jobs").replace("\r", "") == \
        "# Jobs\nregistered_jobs:1\nqueued_jobs:1\nwait_repl_jobs:0\n"
    hello = cli(node, "HELLO").splitlines()
    assert hello[0] == "1) (integer) 1" and len(hello) == 6


def test_redis_cli_script_from_stdin(node: NodeProc) -> None:
    out = cli(node, stdin="ADDJOB piped x 0\nQLEN piped\nGETJOB NOHANG FROM piped\nQLEN piped\n")
    lines = out.splitlines()
    assert lines[0].startswith("D-") and lines[1] == "(integer) 1"
    assert lines[2] == '1) 1) "piped"' and lines[-1] == "(integer) 0"
