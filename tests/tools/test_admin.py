"""``disque-mp admin`` against one real node (shared by the module's tests: each uses
queues of its own), through the same entry point the console script calls."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import disque_mp
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
    [[_, done, _]] = r.execute_command("GETJOB", "FROM", empty)
    r.execute_command("ACKJOB", done)  # known to the node, no job in any state
    rows = admin_json(node, capsys, "queues")["queues"]
    sizes = {row["name"]: row["queued"] for row in rows}
    assert sizes[big] == 5 and sizes[small] == 2 and empty not in sizes
    names = [row["name"] for row in rows]
    assert names.index(big) < names.index(small)
    everything = admin_json(node, capsys, "queues", "--all", "--limit", "100000")["queues"]
    assert {row["name"]: row["queued"] for row in everything}[empty] == 0
    code, out, _ = admin(node, capsys, "queues")
    assert code == 0 and out.splitlines()[0].split() == [
        "QUEUE", "QUEUED", "ACTIVE", "DELAYED", "DEAD", "BLOCKED", "AGE_S", "PAUSE"]
    assert any(line.split()[:2] == [big, "5"] for line in out.splitlines())


def test_queues_lists_queues_holding_only_delayed_or_active_jobs(node, capsys):
    """A queue whose only job waits for its DELAY, or is delivered and not acked yet,
    holds a job: listed with its active and delayed counts."""
    delayed, active = unique_queue("delayed"), unique_queue("inflight")
    r = node.client()
    r.execute_command("ADDJOB", delayed, "later", 0, "DELAY", 600)
    r.execute_command("ADDJOB", active, "now", 0)
    r.execute_command("GETJOB", "FROM", active)
    rows = {row["name"]: row for row in admin_json(node, capsys, "queues", "--limit", "100000")["queues"]}
    assert (rows[delayed]["queued"], rows[delayed]["active"], rows[delayed]["delayed"]) == (0, 0, 1)
    assert (rows[active]["queued"], rows[active]["active"], rows[active]["delayed"]) == (0, 1, 0)
    code, out, _ = admin(node, capsys, "queues", "--limit", "100000")
    lines = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert code == 0 and lines[delayed][1:4] == ["0", "0", "1"] and lines[active][1:4] == ["0", "1", "0"]
    assert "no queue holds a job" not in out
    one = admin_json(node, capsys, "queue", delayed)
    assert (one["name"], one["delayed"], one["active"], one["dead"]) == (delayed, 1, 0, 0)
    code, out, _ = admin(node, capsys, "queue", active)
    assert code == 0 and "active           1 (delivered, not acknowledged)" in out
    code, _, err = admin(node, capsys, "queue", unique_queue("none"))
    assert code == 1 and "knows no queue" in err


def test_job_shows_times_in_their_units(node, capsys):
    q = unique_queue("times")
    r = node.client()
    jid = r.execute_command("ADDJOB", q, "later", 0, "DELAY", 600, "RETRY", 90, "TTL", 7200).decode()
    raw = admin_json(node, capsys, "job", jid)
    assert raw["id"] == jid and raw["delay"] == 600 and raw["retry"] == 90 and raw["ctime"] > 10**18
    code, out, _ = admin(node, capsys, "job", jid)
    fields = dict(line.split(None, 1) for line in out.splitlines() if not line.startswith(
        ("additional", "next")))
    assert code == 0 and fields["state"] == "active" and fields["delay"] == "10 min"
    assert fields["retry"] == "1 min 30 s"
    assert fields["ttl"] in ("2 h left", "1 h 59 min left")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(\d+ s ago\)", fields["created"])
    requeue = next(line for line in out.splitlines() if line.startswith("next requeue"))
    assert re.fullmatch(r"next requeue +in (9 min( \d+ s)?|10 min)", requeue), requeue
    code, _, err = admin(node, capsys, "job", "D-00000000-" + "A" * 24 + "-05a1")
    assert code == 1 and "knows no job" in err


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


def test_limit_sets_shows_and_resets_a_queues_limits(node, capsys):
    q = unique_queue("limited")
    got = admin_json(node, capsys, "limit", q, "--active", "5", "--rate", "40")
    assert (got["queue"], got["active"], got["rate"], got["group-active"]) == (q, 5, 40, 0)
    assert admin_json(node, capsys, "limit", q, "--group-active", "2")["active"] == 5  # kept
    code, out, _ = admin(node, capsys, "limit", q)
    assert code == 0 and "limits are per node" in out and "group-active  2" in out, out
    r = node.client()
    stat = r.execute_command("QLIMIT", q)
    assert stat[:6] == [b"active", 5, b"rate", 40, b"group-active", 2]
    assert admin_json(node, capsys, "limit", q, "--reset")["active"] == 0
    code, _, err = admin(node, capsys, "limit", q, "--active", "-1")
    assert code == 1 and "ACTIVE must be between 0 and" in err
    code, _, err = admin(node, capsys, "limit", q, "--reset", "--rate", "3")
    assert code == 1 and "--reset takes no" in err


def test_node_and_cluster_state(node, capsys):
    state = admin_json(node, capsys, "node")
    my_id = node.client().execute_command("CLUSTER", "MYID").decode()
    assert state["id"] == my_id and state["workers"] == "2"
    assert state["tcp_port"] == str(node.port) and state["build"] in ("mypyc", "pure")
    # both versions, each named: this package's and the Disque protocol's it answers as
    assert (state["disque_mp_version"], state["protocol_version"]) == (
        disque_mp.__version__, disque_mp.DISQUE_VERSION)
    code, out, _ = admin(node, capsys, "node")
    assert code == 0 and ["protocol_version", disque_mp.DISQUE_VERSION] in [
        line.split() for line in out.splitlines()], out
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


def test_result_shows_a_value_a_progress_or_none(node, capsys):
    q = unique_queue("res")
    r = node.client()
    done = r.execute_command("ADDJOB", q, "x", 0).decode()
    r.execute_command("ACKJOB", done, "RESULT", "forty-two")
    running = r.execute_command("ADDJOB", q, "y", 0, "RETRY", 60).decode()
    r.execute_command("GETJOB", "FROM", q)
    r.execute_command("WORKING", running, "PROGRESS", "3/10")
    assert admin_json(node, capsys, "result", done) == {"id": done, "state": "result",
                                                         "value": "forty-two"}
    code, out, _ = admin(node, capsys, "result", running)
    assert code == 0 and out.strip() == f"{running} progress: 3/10"
    r.execute_command("ACKJOB", running)
    code, out, _ = admin(node, capsys, "result", running, "--wait", "100")
    assert code == 0 and "no result" in out
    code, _, err = admin(node, capsys, "result", "not-an-id")
    assert code == 1 and "BADID" in err
    assert int(admin_json(node, capsys, "node")["results"]) >= 1
