"""The HTTP endpoint on a real node: credentials checked on the request head
(no body read for a stranger), a bound on open connections, only Host names of
this node (DNS rebinding), and malformed numbers answered 400."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests import rawclient
from tests.httpclient import get
from tests.nodeproc import NodeProc, free_port

pytestmark = pytest.mark.integration

read_timeout_s = 15.0
PASSWORD = "http-test-password"


def http_node(tmp: Path, **conf: object) -> NodeProc:
    port = free_port()
    node = NodeProc(tmp, workers=1, conf={"http-port": port, **conf})
    node.http_port = port  # type: ignore[attr-defined]
    return node


def exchange(port: int, data: bytes) -> bytes:
    """Send ``data``, read the answer until the server closes."""
    return rawclient.exchange(port, data, timeout_s=read_timeout_s)


def test_http_head_checks_and_bounds(tmp_path: Path) -> None:
    with http_node(tmp_path) as node:
        port = node.http_port  # type: ignore[attr-defined]
        malformed_numbers_and_duplicates(node, port)
        only_this_nodes_host_names(node, port)
        open_connections_bounded(node, port)
        credentials_before_the_body(node, port)
        assert "Traceback" not in node.log_text()


def malformed_numbers_and_duplicates(node: NodeProc, port: int) -> None:
    sup2 = b"POST /api/queues/q/pause HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: \xb2\r\n\r\n"
    assert exchange(port, sup2).startswith(b"HTTP/1.1 400 ")
    twice = (b"POST /api/queues/q/pause HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             b"Content-Length: 0\r\nContent-Length: 5\r\n\r\nhello")
    assert exchange(port, twice).startswith(b"HTTP/1.1 400 ")
    assert get(port, "/api/queues?limit=%C2%B2").status == 400
    assert get(port, "/api/queues?limit=5").status == 200


def only_this_nodes_host_names(node: NodeProc, port: int) -> None:
    rebinding = b"GET /api/overview HTTP/1.1\r\nHost: attacker.example:%d\r\n\r\n" % port
    assert exchange(port, rebinding).startswith(b"HTTP/1.1 403 ")
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "127.0.0.1"):
        assert get(port, "/api/overview", headers={"Host": host}).status == 200, host
    r = node.client()
    r.execute_command("CONFIG", "SET", "http-allowed-hosts", "disque.internal ops.example")
    r.close()
    assert get(port, "/api/overview", headers={"Host": "ops.example:80"}).status == 200
    assert get(port, "/api/overview", headers={"Host": "other.example"}).status == 403


def open_connections_bounded(node: NodeProc, port: int) -> None:
    r = node.client()
    r.execute_command("CONFIG", "SET", "http-connections-max", 3)  # one worker: all three
    r.close()
    held = [socket.create_connection(("127.0.0.1", port), timeout=read_timeout_s)
            for _ in range(3)]
    try:
        for s in held:  # each is accepted and served
            s.sendall(b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 200 ")
        assert exchange(port, b"").startswith(b"HTTP/1.1 503 ")
    finally:
        for s in held:
            s.close()
    node.wait_for(lambda: get(port, "/api/overview").status == 200, 10, "room again")


def credentials_before_the_body(node: NodeProc, port: int) -> None:
    r = node.client()
    assert r.execute_command("CONFIG", "SET", "requirepass", PASSWORD) == b"OK"
    r.close()
    head = (b"POST /api/queues/q/pause HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Length: 900000\r\n\r\n")
    # the head alone is answered: the 900 KB body is never waited for
    out = exchange(port, head)
    assert out.startswith(b"HTTP/1.1 401 ") and b"WWW-Authenticate: Basic" in out
