"""The general path's commands for one other worker's queue or jobs (QLEN, SHOW,
NACK ...) travel to their owner as RESP in the mesh's RAW frame, as the hot ones do:
every reply is the one a single worker gives, in the client's protocol (RESP3
nulls), in order with the hot commands around it, and each command is counted
once in commandstats (by the owner, which runs it). One 2-worker node and one
1-worker node serve every test here (module scope)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.nodeproc import NodeProc, unique_queue
from tests.rawclient import NULL_BULK, RawClient, connect_to_worker, encode_command
from workers.ids import JobIdGen, owner_of_queue

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NodeProc, NodeProc]]:
    base: Path = tmp_path_factory.mktemp("fwgen")
    with NodeProc(base / "two", workers=2) as two, NodeProc(base / "one", workers=1) as one:
        yield two, one


@pytest.fixture(scope="module")
def durable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    """2 workers, appendfsync always: every reply an owner gives waits for its records
    (the owner's fast paths decline, the general route holds the reply)."""
    conf = {"appendonly": "yes", "appendfsync": "always"}
    with NodeProc(tmp_path_factory.mktemp("fwgen-aof") / "n", workers=2, conf=conf) as n:
        yield n


def _queue_of(index: int, prefix: str) -> str:
    return next(f"{prefix}{i}" for i in range(2000)
                if owner_of_queue(f"{prefix}{i}".encode(), 2) == index)


def _missing_id(index: int) -> str:
    """A well-formed job ID no node holds, owned by worker ``index`` of two."""
    return JobIdGen("cd" * 20, b"seed").make(1 if index == 1 else 2, 3600, 300)


# SHOW's and QSTAT's fields that hold times or node IDs: the two nodes differ there
_VARYING = {b"ttl", b"ctime", b"next-requeue-within", b"next-awake-within", b"age",
            b"idle", b"oldest-age", b"nodes-delivered", b"nodes-confirmed"}


def _normal(reply: Any, ids: dict[bytes, bytes]) -> Any:
    """``reply`` with the node's job IDs as their names and the varying fields as "~"."""
    if isinstance(reply, bytes):
        return ids.get(reply, reply)
    if isinstance(reply, str):
        return type(reply)(ids.get(reply.encode(), reply.encode()).decode())
    if isinstance(reply, list):
        out = [_normal(r, ids) for r in reply]
        for i in range(0, len(out) - 1):
            if isinstance(reply[i], bytes) and reply[i] in _VARYING and i % 2 == 0:
                out[i + 1] = "~"
        return out
    return reply


def _session(node: NodeProc, index: int, q: str, resp3: bool) -> list[Any]:
    """The command mix on a connection of worker ``index`` (0 on the 2-worker node:
    ``q`` belongs to worker 1), every reply normalized."""
    c = connect_to_worker(node.port, index)
    try:
        if resp3:
            assert isinstance(c.call("HELLO", 3), dict)
        first = c.call("ADDJOB", q, "first", 0)
        ids = {first.encode(): b"<A>"}
        c.send(b"".join(encode_command(*cmd) for cmd in (
            ("ADDJOB", q, "second", 0), ("QLEN", q), ("GETJOB", "NOHANG", "FROM", q),
            ("SHOW", first), ("ACKJOB", first), ("QLEN", q), ("SHOW", first),
            ("QSTAT", q), ("QPEEK", q, 1), ("qlen", q), ("Qstat", unique_queue("none")),
            ("SHOW", _missing_id(1)), ("NACK", _missing_id(1)), ("QPEEK", q, "x"),
            ("ADDJOB", q, "third", 0, "RETRY", 7, "TTL", 600),
        )))
        got = [c.read() for _ in range(15)]
        ids[got[0].encode()] = b"<B>"
        ids[got[-1].encode()] = b"<C>"
        second, third = got[0], got[-1]
        c.send(b"".join(encode_command(*cmd) for cmd in (
            ("GETJOB", "NOHANG", "FROM", q), ("WORKING", second), ("NACK", second),
            ("SHOW", second), ("DEQUEUE", second), ("QLEN", q), ("ENQUEUE", second),
            ("QLEN", q), ("DELJOB", second), ("SHOW", second), ("SHOW", third),
            ("DELJOB", third), ("QLEN", q), ("WORKING", second), ("SHOW", "not-an-id"),
        )))
        got += [c.read() for _ in range(15)]
        return [_normal(r, ids) for r in got]
    finally:
        c.close()


@pytest.mark.parametrize("resp3", [False, True], ids=["resp2", "resp3"])
def test_forwarded_general_commands_answer_as_one_worker(
        nodes: tuple[NodeProc, NodeProc], resp3: bool) -> None:
    two, one = nodes
    q = _queue_of(1, unique_queue("mix"))
    forwarded = _session(two, 0, q, resp3)
    single = _session(one, 0, q, resp3)
    assert forwarded == single
    # what the mix is about: the RESP3 null of a missing job, the owner's errors
    assert forwarded[11] is (None if resp3 else NULL_BULK)
    assert forwarded[13].startswith("ERR value is not an integer"), forwarded[13]


def test_replies_held_for_the_aof_come_back_as_one_workers(
        nodes: tuple[NodeProc, NodeProc], durable: NodeProc) -> None:
    q = _queue_of(1, unique_queue("aof"))
    assert _session(durable, 0, q, False) == _session(nodes[1], 0, q, False)


def _calls(port: int) -> dict[str, int]:
    text = RawClient(port).call("INFO", "commandstats").decode()
    out = {}
    for line in text.split("\r\n"):
        if line.startswith("cmdstat_"):
            name, fields = line[len("cmdstat_"):].split(":", 1)
            out[name] = int(fields.split("calls=")[1].split(",")[0])
    return out


def test_a_forwarded_general_command_is_counted_once(nodes: tuple[NodeProc, NodeProc]) -> None:
    two, _ = nodes
    q = _queue_of(1, unique_queue("count"))
    c = connect_to_worker(two.port, 0)
    job_id = c.call("ADDJOB", q, "x", 0)
    before = _calls(two.port)
    n = 7
    c.send((encode_command("QLEN", q) + encode_command("SHOW", job_id)
            + encode_command("QSTAT", q)) * n)
    assert [c.read() for _ in range(3 * n)][0::3] == [1] * n
    after = _calls(two.port)
    for name in ("qlen", "show", "qstat"):
        assert after.get(name, 0) - before.get(name, 0) == n, (name, before, after)
    c.close()
