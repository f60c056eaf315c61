"""Input from clients on real nodes: bounds before AUTH (a client that never
authenticates cannot make a worker hold a big bulk or many arguments), an AUTH in
a pipeline lifts them for the rest, and a multibulk of many tiny arguments that
trickles in costs each byte once (no re-parse from its first argument per read)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from tests.nodeproc import NodeProc, unique_queue
from tests.rawclient import encode_command

pytestmark = pytest.mark.integration

PASSWORD = "s3cret-pass"
read_timeout_s = 20.0
guesses = 10
guess_delay_ms = 150


def recv_until_closed(s: socket.socket) -> bytes:
    s.settimeout(read_timeout_s)
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=read_timeout_s)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def test_unauthenticated_clients_are_bounded_and_slowed(tmp_path: Path) -> None:
    with NodeProc(tmp_path, workers=2, conf={"auth-failure-delay-ms": guess_delay_ms}) as node:
        admin = node.client()
        assert admin.execute_command("CONFIG", "SET", "requirepass", PASSWORD) == b"OK"
        admin.close()
        unauthenticated_bounds(node)
        wrong_passwords_counted_and_slowed(node)


def unauthenticated_bounds(node: NodeProc) -> None:
    with connect(node.port) as s:  # a big bulk started before AUTH
        s.sendall(b"*1\r\n$100000\r\n" + b"x" * 1000)
        assert recv_until_closed(s) == b"-ERR Protocol error: unauthenticated bulk length\r\n"
    with connect(node.port) as s:
        s.sendall(b"*11\r\n")
        assert recv_until_closed(s) == \
            b"-ERR Protocol error: unauthenticated multibulk length\r\n"
    with connect(node.port) as s:  # one command at a time, and none after QUIT: the
        # wrong password is never tried (acl_access_denied_auth is checked below)
        s.sendall(encode_command("QUIT") + encode_command("AUTH", "not-tried"))
        assert recv_until_closed(s) == b"+OK\r\n"
    with connect(node.port) as s:  # within the bounds: the usual NOAUTH
        s.sendall(encode_command("QLEN", "q"))
        s.settimeout(read_timeout_s)
        assert s.recv(100).startswith(b"-NOAUTH")
    # AUTH first in the same write: what follows has the full bounds
    q = unique_queue()
    body = b"b" * 20_000
    many = ["ADDJOB", q, "x", 0, "REPLICATE", 1, "RETRY", 5, "TTL", 100, "MAXLEN", 10]
    with connect(node.port) as s:
        s.sendall(encode_command("AUTH", PASSWORD) + encode_command(*many)
                  + encode_command("ADDJOB", q, body, 0) + encode_command("QLEN", q))
        s.settimeout(read_timeout_s)
        got = b""
        while not got.endswith(b":2\r\n"):
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
        assert got.startswith(b"+OK\r\n+D-") and got.count(b"\r\n+D-") == 2, got
    r = node.client(password=PASSWORD)
    assert int(r.info("stats")["total_connections_received"]) >= 4
    r.close()


def _cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime + stime, in ticks
    return total / os.sysconf("SC_CLK_TCK")


pending_args = 100_000  # tiny arguments of a multibulk declaring a million
trickle_sends = 150  # then one tiny argument per send ...
trickle_gap_s = 0.01  # ... this far apart: each send is a read of its own
cpu_share_max = 0.25  # of the trickle's wall time: re-parsing keeps the worker busy


def test_a_trickled_multibulk_is_parsed_once(tmp_path: Path) -> None:
    """Each tiny read must cost the worker little CPU, however many arguments the
    pending multibulk already holds."""
    with NodeProc(tmp_path, workers=1) as node:
        pids = node.worker_pids()
        with connect(node.port) as s:
            s.sendall(b"*1000000\r\n" + b"$1\r\nx\r\n" * pending_args)
            r = node.client(socket_timeout=read_timeout_s)
            assert r.ping()  # the bulk of it is read
            before, start = _cpu_s(pids), time.monotonic()
            for _ in range(trickle_sends):
                s.sendall(b"$1\r\nx\r\n")
                time.sleep(trickle_gap_s)
            assert r.ping()  # the worker still serves others
            used, wall = _cpu_s(pids) - before, time.monotonic() - start
            r.close()
        assert used < cpu_share_max * wall, f"the worker used {used:.2f} s of CPU in {wall:.2f} s"


def wrong_passwords_counted_and_slowed(node: NodeProc) -> None:
    admin = node.client(password=PASSWORD)
    with connect(node.port) as s:
        start = time.monotonic()
        s.sendall(encode_command("AUTH", "wrong") * guesses + encode_command("AUTH", PASSWORD)
                  + encode_command("PING"))
        want = b"-ERR invalid password\r\n" * guesses + b"+OK\r\n+PONG\r\n"
        got = b""
        s.settimeout(read_timeout_s)
        while len(got) < len(want):
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
        took_s = time.monotonic() - start
    assert got == want
    # a lower bound only: each wrong password held the next command back
    assert took_s >= guesses * guess_delay_ms / 1000 * 0.9, took_s
    assert int(admin.info("stats")["acl_access_denied_auth"]) == guesses
    admin.close()
