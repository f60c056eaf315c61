"""Every command of the table with many argument shapes, good and bad, from a
connection held by each worker of a real 2-worker node: each gets a reply, the
connection keeps working, and the node logs no exception.

The per-command path is compiled with mypyc (disque_mp/compiled.py), which checks
annotations at run time: a value of the wrong type reaching a typed function
becomes a TypeError there. This walks the argument space the parsers, routers
and shard see, so such a mismatch shows up here rather than in production.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.nodeproc import NodeProc, form_cluster
from tests.rawclient import Err, RawClient, Status, connect_to_worker

pytestmark = pytest.mark.integration

# Commands that would end the test's node or connection, or switch the reply
# protocol; each has tests of its own.
SKIP = {"shutdown", "quit", "hello", "monitor"}
# In a cluster, CLUSTER would change the membership under test (MEET, FORGET, RESET...).
SKIP_IN_CLUSTER = SKIP | {"cluster"}
CLUSTER_JOB_COMMANDS = ["addjob", "getjob", "ackjob", "fastack", "nack", "working", "enqueue",
                        "dequeue", "deljob", "show", "qlen", "qpeek", "qstat", "pause", "jscan",
                        "qscan"]
TOKENS = ["q", "fz", "x", "", "0", "1", "2", "-1", "7", "100", "65536", "1.5", "nan",
          "99999999999999999999999", "FROM", "COUNT", "TIMEOUT", "NOHANG", "WITHCOUNTERS",
          "REPLICATE", "DELAY", "RETRY", "TTL", "MAXLEN", "ASYNC", "BUSYLOOP", "MINLEN",
          "IMPORTRATE", "STATE", "REPLY", "all", "in", "out", "none", "state", "bcast",
          "queued", "active", "acked", "wait-repl", "*", "MATCH", "QUEUE",
          "D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-0000", "D-bad", "\xff\xfe"]
RANDOM_SHAPES_PER_COMMAND = 30
VALID_STEPS = 600  # random valid job commands in the cluster walk
ARGS_MAX = 7


def _shapes(rng: random.Random, real_ids: list[str]) -> list[list[str]]:
    pool = TOKENS + real_ids
    shapes: list[list[str]] = [[], ["fz"], real_ids[:1], real_ids[:2], ["fz", "body", "0"],
                               ["fz", "body", "0", "REPLICATE", "1", "RETRY", "0"],
                               ["fz", "body", "x"], ["fz", "body", "0", "DELAY", "999999999999"]]
    for _ in range(RANDOM_SHAPES_PER_COMMAND):
        shapes.append([rng.choice(pool) for _ in range(rng.randint(1, ARGS_MAX))])
    return shapes


def _call(c: RawClient, name: str, args: list[str]) -> object:
    if name == "getjob":  # never block longer than a moment
        args = ["TIMEOUT", "20", *args]
    if name == "waitjob":  # its TIMEOUT comes last
        args = [*args, "TIMEOUT", "20"]
    if name == "debug" and args and args[0].lower() == "sleep":
        args = ["sleep", "0"]
    return c.call(name, *args)


def test_every_command_answers_every_shape(tmp_path: object) -> None:
    rng = random.Random(5)
    with NodeProc(tmp_path / "fuzz", workers=2) as n:  # type: ignore[operator]
        setup = RawClient(n.port)
        names = sorted(
            entry[0].decode() for entry in setup.call("COMMAND") if isinstance(entry, list))
        assert "addjob" in names and len(names) >= 20
        real_ids = [str(setup.call("ADDJOB", q, "body", 0)) for q in ("fz", "q", "x") for _ in range(2)]
        setup.close()
        calls = 0
        for held_by in (0, 1):
            c = connect_to_worker(n.port, held_by)
            for name in names:
                if name in SKIP:
                    continue
                for args in _shapes(rng, real_ids):
                    reply = _call(c, name, args)
                    calls += 1
                    assert reply is not None or name in ("getjob", "show"), (name, args)
                    if isinstance(reply, Err):
                        assert reply and reply.split()[0].isupper(), (name, args, reply)
                    pong = c.call("PING")
                    assert pong == Status("PONG"), (name, args, reply, pong)
            c.close()
        assert calls >= 2 * (len(names) - len(SKIP)) * RANDOM_SHAPES_PER_COMMAND
        text = n.log_text()
        assert "Ready to accept connections" in text
        assert "Traceback" not in text, text[text.find("Traceback") - 200:][:3000]
        check = RawClient(n.port)
        assert check.call("PING") == Status("PONG")
        check.close()


def test_job_commands_in_a_cluster(tmp_path: Path) -> None:
    """The same walk over the job commands on a node of a 2-node cluster, with
    replicated jobs: replication, acks and federation cross the bus (frames decoded
    into the compiled shard), and neither node may log an exception."""
    rng = random.Random(7)
    with NodeProc(tmp_path / "a", workers=2) as a, NodeProc(tmp_path / "b", workers=2) as b:
        form_cluster([a, b], 30.0)
        setup = RawClient(a.port)
        real_ids = [str(setup.call("ADDJOB", q, "body", 0, "REPLICATE", 2))
                    for q in ("fz", "q") for _ in range(2)]
        assert all(i.startswith("D-") for i in real_ids)
        setup.close()
        c = connect_to_worker(a.port, 1)
        calls = 0
        replicated = [["fz", "b", "500", "REPLICATE", "2"], ["fz", "b", "0", "REPLICATE", "2", "ASYNC"],
                      ["fz", "b", "300", "REPLICATE", "3"], ["fz", "b", "0", "REPLICATE", "2", "RETRY", "0"],
                      ["fz", "b", "0", "REPLICATE", "2", "DELAY", "1"], ["fz", "b", "0", "REPLICATE", "x"]]
        for name in CLUSTER_JOB_COMMANDS:
            for args in (replicated if name == "addjob" else []) + _shapes(rng, real_ids):
                reply = _call(c, name, args)
                calls += 1
                if isinstance(reply, Err):
                    assert reply and reply.split()[0].isupper(), (name, args, reply)
                assert c.call("PING") == Status("PONG"), (name, args, reply)
        c.close()
        assert calls >= len(CLUSTER_JOB_COMMANDS) * RANDOM_SHAPES_PER_COMMAND
        for node in (a, b):
            text = node.log_text()
            assert "Traceback" not in text, text[text.find("Traceback") - 200:][:3000]
            check = RawClient(node.port)
            assert check.call("PING") == Status("PONG")
            check.close()


def test_valid_job_traffic_across_a_cluster(tmp_path: Path) -> None:
    """Valid job commands in random order from connections held by each worker of
    both nodes of a 2-node cluster (replicated and single-copy jobs, at-most-once,
    delayed, NACK, WORKING, acks from the other node): every reply is well formed
    and in order (a PING after each command), and neither node logs an exception."""
    rng = random.Random(11)
    with NodeProc(tmp_path / "a", workers=2) as a, NodeProc(tmp_path / "b", workers=2) as b:
        form_cluster([a, b], 30.0)
        conns = [connect_to_worker(n.port, i) for n in (a, b) for i in (0, 1)]
        queues = ["ta", "tb", "tc"]
        known: list[str] = []
        taken = acked = 0
        for step in range(VALID_STEPS):
            c = rng.choice(conns)
            q = rng.choice(queues)
            op = rng.choice(["add", "add", "add1", "amo", "delay", "get", "get", "ack", "fastack",
                             "nack", "working", "show", "qlen", "deljob", "enqueue", "dequeue"])
            if op == "add":
                reply = c.call("ADDJOB", q, f"s{step}", 500)
            elif op == "add1":
                reply = c.call("ADDJOB", q, f"s{step}", 0, "REPLICATE", 1, "RETRY", 1)
            elif op == "amo":
                reply = c.call("ADDJOB", q, f"s{step}", 0, "REPLICATE", 1, "RETRY", 0)
            elif op == "delay":
                reply = c.call("ADDJOB", q, f"s{step}", 500, "DELAY", 1, "TTL", 5)
            elif op == "get":
                reply = c.call("GETJOB", "NOHANG", "COUNT", rng.randint(1, 3), "FROM", *queues)
                if isinstance(reply, list):
                    known += [e[1].decode() for e in reply]
                    taken += len(reply)
            elif known:
                ids = rng.sample(known, min(len(known), rng.randint(1, 3)))
                name = {"ack": "ACKJOB", "fastack": "FASTACK", "nack": "NACK", "working": "WORKING",
                        "show": "SHOW", "deljob": "DELJOB", "enqueue": "ENQUEUE",
                        "dequeue": "DEQUEUE", "qlen": "QLEN"}[op]
                reply = c.call(name, q) if name == "QLEN" else c.call(name, *(
                    ids[:1] if name in ("WORKING", "SHOW") else ids))
            else:
                reply = c.call("QLEN", q)
            if isinstance(reply, Status) and reply.startswith("D-"):
                known.append(str(reply))
            if op in ("ack", "fastack") and isinstance(reply, int):
                acked += reply
            if isinstance(reply, Err):  # allowed: NOREPL, TOOLATE, NOJOB...: never a bare ERR
                assert reply.split()[0] in ("NOREPL", "TOOLATE", "NOJOB", "PAUSED"), (op, reply)
            assert c.call("PING") == Status("PONG"), (step, op, reply)
        for c in conns:
            c.close()
        assert taken > 20 and acked > 20, (taken, acked)  # the walk reached the deep paths
        for node in (a, b):
            text = node.log_text()
            assert "Traceback" not in text, text[text.find("Traceback") - 200:][:3000]
