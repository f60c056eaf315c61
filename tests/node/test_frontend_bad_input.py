"""Bad input gets Redis' protocol error and closes that connection only; other
clients and the jobs are untouched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nodeproc import NodeProc
from tests.rawclient import Err, RawClient, Status

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def small_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    conf = {"client-query-buffer-bytes-max": "65536", "proto-max-bulk-len": "10000",
            "proto-max-multibulk-len": "100"}
    with NodeProc(tmp_path_factory.mktemp("bad") / "node", workers=2, conf=conf) as n:
        yield n


CASES = [
    (b"*1\r\n$abc\r\n", "Protocol error: invalid bulk length"),
    (b"*1\r\n$-5\r\n", "Protocol error: invalid bulk length"),
    (b"*x\r\n", "Protocol error: invalid multibulk length"),
    (b"*1\r\n:5\r\n", "Protocol error: expected '$', got ':'"),
    (b"*2\r\n$4\r\nPING\r\n$20000\r\n", "Protocol error: invalid bulk length"),  # over proto-max-bulk-len
    (b"*1000\r\n$4\r\n", "Protocol error: invalid multibulk length"),  # over proto-max-multibulk-len
    (b"A" * 70000, "Protocol error: too big inline request"),
    (b"PING \"unbalanced\r\n", "Protocol error: unbalanced quotes in request"),
]


@pytest.mark.parametrize(("data", "error"), CASES, ids=[c[1] + str(i) for i, c in enumerate(CASES)])
def test_protocol_error_closes_only_that_client(small_node: NodeProc, data: bytes, error: str) -> None:
    other = RawClient(small_node.port)
    job_id = other.call("ADDJOB", "keep", "x", 0)
    bad = RawClient(small_node.port)
    bad.send(b"*1\r\n$4\r\nPING\r\n" + data)  # a good command first: it is still answered
    assert bad.read() == Status("PONG")
    assert bad.read() == Err("ERR " + error)
    assert bad.closed()
    assert other.call("SHOW", job_id)[1] == job_id.encode()
    assert other.call("PING") == Status("PONG")
    assert other.call("DELJOB", job_id) == 1
    other.close()


def test_bulk_split_across_reads(small_node: NodeProc) -> None:
    """A legal command that arrives in pieces is not mistaken for bad input."""
    c = RawClient(small_node.port)
    body = b"b" * 9000
    cmd = b"*4\r\n$6\r\nADDJOB\r\n$5\r\nsplit\r\n$%d\r\n%s\r\n$1\r\n0\r\n" % (len(body), body)
    for i in range(0, len(cmd), 777):
        c.send(cmd[i : i + 777])
    job_id = c.read()
    assert isinstance(job_id, Status)
    assert c.call("GETJOB", "NOHANG", "FROM", "split")[0][2] == body
    c.close()


def test_query_buffer_flood(small_node: NodeProc) -> None:
    """Every bulk is legal, but one command grows past client-query-buffer-bytes-max."""
    c = RawClient(small_node.port)
    c.send(b"*100\r\n")
    arg = b"$9000\r\n" + b"x" * 9000 + b"\r\n"
    try:
        for _ in range(99):
            c.send(arg)
    except OSError:
        pass  # closed while we were still sending
    assert c.read() == Err("ERR Protocol error: client query buffer over its limit")
    assert c.closed()
    c2 = RawClient(small_node.port)
    assert c2.call("PING") == Status("PONG")
    c2.close()


def test_many_arguments_within_bounds(small_node: NodeProc) -> None:
    c = RawClient(small_node.port)
    ids = [c.call("ADDJOB", f"many{i}", "x", 0) for i in range(20)]
    assert c.call("DELJOB", *ids) == 20
    c.close()


def test_output_backpressure(tmp_path: Path) -> None:
    """A client that never reads does not make the node buffer without bound."""
    with NodeProc(tmp_path / "bp", workers=1) as n:
        slow = RawClient(n.port)
        slow.sock.setblocking(False)
        sent = 0
        try:
            for _ in range(20000):
                sent += slow.sock.send(b"*2\r\n$4\r\nPING\r\n$1000\r\n" + b"p" * 1000 + b"\r\n")
        except BlockingIOError:
            pass  # the node stopped reading us: backpressure
        fine = RawClient(n.port)
        assert fine.call("PING") == Status("PONG")
        fine.close()
        slow.close()
        assert sent < 20000 * 1020
