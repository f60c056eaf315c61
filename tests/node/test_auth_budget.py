"""One budget of wrong passwords for the whole node: HTTP basic auth and RESP AUTH
draw from the same gate (``disque_mp/node/authgate.py``), so guessing on both
ports at once, over many connections, is spaced as guessing on one port is.
Lower bounds only: a slow machine makes the guesses take longer, never shorter."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.httpclient import get
from tests.node.test_security_names_guesses import read_exactly
from tests.nodeproc import NodeProc, free_port
from tests.rawclient import encode_command

pytestmark = pytest.mark.integration

PASSWORD = "budget-pass"
rate_per_s = 20  # node-wide: 2 workers -> one wrong password per 0.1 s per worker
http_guessers = 16
resp_guessers = 16
read_timeout_s = 30.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    port = free_port()
    conf = {"http-port": port, "auth-failures-per-second-max": rate_per_s}
    with NodeProc(tmp_path_factory.mktemp("budget"), workers=2, conf=conf) as n:
        n.http_port = port  # type: ignore[attr-defined]
        r = n.client(protocol=2)
        assert r.execute_command("CONFIG", "SET", "requirepass", PASSWORD) == b"OK"
        r.close()
        yield n


def _http_guess(port: int, statuses: list[int]) -> None:
    statuses.append(get(port, "/metrics", password="wrong").status)


def _resp_guess(port: int, replies: list[bytes]) -> None:
    want = b"-ERR invalid password\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=read_timeout_s) as s:
        s.sendall(encode_command("AUTH", "wrong"))
        replies.append(read_exactly(s, len(want)))


def _guess_at_once(node: NodeProc, http: int, resp: int) -> tuple[float, list[int], list[bytes]]:
    """``http`` + ``resp`` connections, one wrong password each, all at once: how long
    until every answer came."""
    statuses: list[int] = []
    replies: list[bytes] = []
    port = node.http_port  # type: ignore[attr-defined]
    threads = [threading.Thread(target=_http_guess, args=(port, statuses)) for _ in range(http)]
    threads += [threading.Thread(target=_resp_guess, args=(node.port, replies))
                for _ in range(resp)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=read_timeout_s * 2)
    return time.monotonic() - start, statuses, replies


def _floor_s(node: NodeProc, guesses: int) -> float:
    """The least time ``guesses`` wrong passwords take at rate_per_s node-wide: each
    worker takes at least guesses / workers of them, one share apart (90 % of it)."""
    share_s = node.workers / rate_per_s
    return (guesses // node.workers - 1) * share_s * 0.9


def test_http_guesses_are_spaced_node_wide(node: NodeProc) -> None:
    took_s, statuses, _ = _guess_at_once(node, http_guessers, 0)
    assert statuses == [401] * http_guessers
    assert took_s >= _floor_s(node, http_guessers), took_s


def test_http_and_resp_guesses_draw_from_one_budget(node: NodeProc) -> None:
    took_s, statuses, replies = _guess_at_once(node, http_guessers, resp_guessers)
    assert statuses == [401] * http_guessers
    assert replies == [b"-ERR invalid password\r\n"] * resp_guessers
    assert took_s >= _floor_s(node, http_guessers + resp_guessers), took_s


def test_the_right_password_still_gets_in(node: NodeProc) -> None:
    assert get(node.http_port, "/metrics", password=PASSWORD).status == 200  # type: ignore[attr-defined]
    r = node.client(password=PASSWORD, protocol=2)
    try:
        assert r.ping()
    finally:
        r.close()
