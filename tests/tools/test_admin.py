"""``disque-mp admin`` against one real node (shared by the module's tests: each uses
queues of its own), through the same entry point the console script calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from disque_mp import cli
from tests.nodeproc import REPO, NodeProc, unique_queue

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with NodeProc(tmp_path_factory.mktemp("admin"), workers=2) as n:
        yield n


def admin(node: NodeProc, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["admin", "--node", f"127.0.0.1:{node.port}", *args])
    out, err = capsys.readouterr()
    return code, out, err


def admin_json(node: NodeProc, capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    code, out, err = admin(node, capsys, "--json", *args)
    assert code == 0, err
    return json.loads(out)


def test_queues_lists_every_queue_with_its_size_largest_first(node, capsys):
    small, big, empty = unique_queue("small"), unique_queue("big"), unique_queue("empty")
    r = node.client()
    for _ in range(2):
        r.execute_command("ADDJOB", small, "x", 0)
    for _ in range(5):
        r.execute_command("ADDJOB", big, "x", 0)
    r.execute_command("ADDJOB", empty, "x", 0)
    r.execute_command("GETJOB", "FROM", empty)  # known to the node, no job queued
    rows = admin_json(node, capsys, "queues")["queues"]
    sizes = {row["name"]: row["queued"] for row in rows}
    assert sizes[big] == 5 and sizes[small] == 2 and empty not in sizes
    names = [row["name"] for row in rows]
    assert names.index(big) < names.index(small)
    everything = admin_json(node, capsys, "queues", "--all", "--limit", "100000")["queues"]
    assert {row["name"]: row["queued"] for row in everything}[empty] == 0
    code, out, _ = admin(node, capsys, "queues")
    assert code == 0 and out.splitlines()[0].split() == ["QUEUE", "QUEUED", "BLOCKED", "AGE_S", "PAUSE"]
    assert any(line.split()[:2] == [big, "5"] for line in out.splitlines())


def test_peek_shows_the_oldest_jobs_and_consumes_nothing(node, capsys):
    q = unique_queue()
    r = node.client()
    ids = [r.execute_command("ADDJOB", q, f"body {i}", 0).decode() for i in range(3)]
    jobs = admin_json(node, capsys, "peek", q, "2")["jobs"]
    assert [j["id"] for j in jobs] == ids[:2]
    assert [j["body"] for j in jobs] == ["body 0", "body 1"]
    assert jobs[0]["nacks"] == 0 and jobs[0]["retry"] > 0
    newest = admin_json(node, capsys, "peek", q, "-1")["jobs"]
    assert [j["id"] for j in newest] == [ids[2]]
    assert r.execute_command("QLEN", q) == 3
    code, out, _ = admin(node, capsys, "peek", q)
    assert code == 0 and ids[0] in out and "body 0" in out
    code, _, err = admin(node, capsys, "peek", q, "0")
    assert code == 1 and "COUNT must not be 0" in err


def test_requeue_moves_dead_letters_back_with_their_settings(node, capsys):
    q = unique_queue("orders")
    r = node.client()
    for i in range(3):
        r.execute_command("ADDJOB", q, f"poison {i}", 0, "MAXDELIVER", 1, "RETRY", 30)
    taken = r.execute_command("GETJOB", "NOHANG", "COUNT", 3, "FROM", q)
    r.execute_command("NACK", *[t[1] for t in taken])  # one delivery each: dead letters
    assert r.execute_command("QLEN", f"dead:{q}") == 3
    assert admin_json(node, capsys, "requeue", f"dead:{q}") == {
        "from": f"dead:{q}", "to": q, "requeued": 3, "left": 0}
    assert r.execute_command("QLEN", q) == 3
    peeked = admin_json(node, capsys, "peek", q, "10")["jobs"]
    assert sorted(j["body"] for j in peeked) == ["poison 0", "poison 1", "poison 2"]
    assert {j["maxdeliver"] for j in peeked} == {1} and {j["retry"] for j in peeked} == {30}
    code, out, _ = admin(node, capsys, "requeue", q)  # the queue's own name works too
    assert code == 0 and out.strip() == f"requeued 0 jobs from dead:{q} to {q}; 0 left in dead:{q}"


def test_node_and_cluster_state(node, capsys):
    state = admin_json(node, capsys, "node")
    my_id = node.client().execute_command("CLUSTER", "MYID").decode()
    assert state["id"] == my_id and state["workers"] == "2"
    assert state["tcp_port"] == str(node.port) and state["build"] in ("mypyc", "pure")
    cluster = admin_json(node, capsys, "cluster")
    assert cluster["state"] == "ok" and cluster["known_nodes"] == 1
    assert cluster["nodes"][0]["id"] == my_id and cluster["nodes"][0]["flags"] == "myself"
    code, out, _ = admin(node, capsys, "cluster")
    assert code == 0 and out.startswith("cluster_state:ok") and my_id in out


def test_schedules_lists_each_schedule_with_its_rule_and_fire_times(node, capsys):
    code, out, _ = admin(node, capsys, "schedules")
    assert code == 0 and out.startswith("no schedule")
    r = node.client()
    q = unique_queue("sched")
    r.execute_command("SCHEDULE", "SET", "nightly", "CRON", "30 2 * * *", "TZ", "Asia/Tokyo",
                      "ADDJOB", q, b"\xffbody", "0", "RETRY", "60")
    try:
        listed = admin_json(node, capsys, "schedules")["schedules"]
        assert [s["name"] for s in listed] == ["nightly"]
        row = listed[0]
        assert row["rule"] == 'CRON "30 2 * * *" TZ Asia/Tokyo' and row["fired"] == 0
        assert row["addjob"] == [q, "\\xffbody", "0", "RETRY", "60"]
        assert row["next-fire"] % 60_000 == 0 and row["last-fire"] == 0
        code, out, _ = admin(node, capsys, "schedules")
        header, line = out.splitlines()
        assert header.split() == ["NAME", "RULE", "QUEUE", "NEXT", "LAST", "FIRED", "SKIPPED",
                                  "FIRER"]
        assert line.startswith("nightly") and q in line and "17:30:00Z" in line
    finally:
        r.execute_command("SCHEDULE", "DEL", "nightly")


def test_a_node_that_does_not_answer_is_one_line_and_exit_1(capsys):
    code = cli.main(["admin", "--node", "127.0.0.1:1", "node"])
    _, err = capsys.readouterr()
    assert code == 1 and err.count("\n") == 1 and "127.0.0.1:1" in err


def test_console_script_entry_and_help(node, tmp_path: Path):
    """``python -m disque_mp admin`` (what the disque-mp script runs) and ``--help``,
    which names the config directives."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "disque_mp", "admin", "--node",
                          f"127.0.0.1:{node.port}", "--json", "node"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(out)["tcp_port"] == str(node.port)
    help_text = subprocess.run([sys.executable, "-m", "disque_mp", "--help"], cwd=tmp_path,
                               env=env, capture_output=True, text=True, timeout=60,
                               check=True).stdout
    for directive in ("appendfsync", "cluster-secret-file", "http-port", "workers"):
        assert f" {directive}" in help_text
    assert "docs/operations.md" in help_text and "admin" in help_text


def test_output_into_a_closed_pipe_is_no_error(node, tmp_path: Path):
    """`disque-mp admin node | head -1`: the reader leaves early, admin exits 0 without a traceback."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = (f"{sys.executable} -m disque_mp admin --node 127.0.0.1:{node.port} --json node"
           " | true; echo ${PIPESTATUS[0]}")
    done = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip() == "0" and "Traceback" not in done.stderr, done.stderr
