"""The HTTP endpoint against strangers, on one real node shared by these tests:
idle connections that never authenticate cannot take the operator's slot, a wrong
password is counted, logged and answered late, no answer may be framed by another
origin, and a long queue name cannot make a /metrics scrape megabytes."""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterator

import pytest

from tests.httpclient import get
from tests.nodeproc import NodeProc, free_port, unique_queue

pytestmark = pytest.mark.integration

PASSWORD = "ops-http-test-password"
read_timeout_s = 15.0
UNAUTH_MAX = 4  # http-unauth-connections-max of the node below (one worker: all of it)
CONNS_MAX = 8  # http-connections-max
LABEL_MAX = 64  # http-metrics-label-bytes-max


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    port = free_port()
    conf = {"http-port": port, "http-connections-max": CONNS_MAX,
            "http-unauth-connections-max": UNAUTH_MAX, "http-unauth-idle-ms": 1000,
            "auth-failure-delay-ms": 100, "http-metrics-label-bytes-max": LABEL_MAX}
    with NodeProc(tmp_path_factory.mktemp("ops-http"), workers=1, conf=conf) as n:
        n.http_port = port  # type: ignore[attr-defined]
        r = n.client()
        r.execute_command("CONFIG", "SET", "requirepass", PASSWORD)  # after the ready check
        r.close()
        yield n


def hp(node: NodeProc) -> int:
    return int(node.http_port)  # type: ignore[attr-defined]


def basic(password: str) -> str:
    return "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()


def auth_failures(node: NodeProc) -> int:
    r = node.client(password=PASSWORD)
    try:
        return int(r.info("stats")["acl_access_denied_auth"])
    finally:
        r.close()


def test_no_answer_can_be_framed(node: NodeProc) -> None:
    for path, password, status in (("/", PASSWORD, 200), ("/api/overview", PASSWORD, 200),
                                   ("/nowhere", PASSWORD, 404), ("/", None, 401)):
        reply = get(hp(node), path, password=password)
        assert reply.status == status, (path, reply)
        assert reply.headers["x-frame-options"] == "DENY", path
        assert reply.headers["content-security-policy"] == "frame-ancestors 'none'", path


def test_wrong_passwords_are_counted_logged_and_delayed(node: NodeProc) -> None:
    before = auth_failures(node)
    for _ in range(3):
        reply = get(hp(node), "/api/overview", headers={"Authorization": basic("guess")})
        assert reply.status == 401 and "www-authenticate" in reply.headers
    # no Authorization header at all is a browser's first request, not a guess
    assert get(hp(node), "/api/overview").status == 401
    assert auth_failures(node) == before + 3
    node.wait_for(lambda: "HTTP: wrong password from 127.0.0.1" in node.log_text(), 10,
                  "the wrong password logged")
    assert get(hp(node), "/api/overview", password=PASSWORD).status == 200


def test_idle_strangers_leave_room_for_the_operator(node: NodeProc) -> None:
    # as many idle connections as the node takes in all: before, the operator got 503
    strangers = [socket.create_connection(("127.0.0.1", hp(node)), timeout=read_timeout_s)
                 for _ in range(CONNS_MAX + 2)]
    try:
        reply = get(hp(node), "/api/overview", password=PASSWORD)
        assert reply.status == 200, reply
        # past the unauthenticated share the oldest strangers were closed
        closed = 0
        for s in strangers[:CONNS_MAX + 2 - UNAUTH_MAX]:
            try:
                closed += s.recv(100) == b""
            except ConnectionResetError:
                closed += 1
        assert closed == CONNS_MAX + 2 - UNAUTH_MAX
    finally:
        for s in strangers:
            s.close()


def test_an_unauthenticated_connection_is_closed_when_idle(node: NodeProc) -> None:
    with socket.create_connection(("127.0.0.1", hp(node)), timeout=read_timeout_s) as s:
        s.sendall(b"GET /api/overview HTTP/1.1\r\n")  # a head that never ends
        assert s.recv(100) == b""  # closed after http-unauth-idle-ms (1 s here)
    # an authenticated keep-alive connection stays open across requests
    req = (b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: "
           + basic(PASSWORD).encode() + b"\r\n\r\n")
    with socket.create_connection(("127.0.0.1", hp(node)), timeout=read_timeout_s) as s:
        for _ in range(2):
            s.sendall(req)
            assert s.recv(65536).startswith(b"HTTP/1.1 200 ")


def test_metrics_labels_are_bounded(node: NodeProc) -> None:
    long_a = unique_queue("a") + "x" * 3000
    long_b = long_a + "y"  # the same first bytes: two series all the same
    r = node.client(password=PASSWORD)
    for q in (long_a, long_b):
        r.execute_command("ADDJOB", q, "body", 0)
    r.close()
    reply = get(hp(node), "/metrics", password=PASSWORD)
    assert reply.status == 200
    text = reply.body.decode()
    assert "x" * 100 not in text
    labels = {line.split('queue="')[1].split('"')[0] for line in text.splitlines()
              if line.startswith("disque_queue_jobs_queued{") and long_a[:20] in line}
    assert len(labels) == 2
    assert all(len(label.encode()) <= LABEL_MAX and "~" in label for label in labels)
