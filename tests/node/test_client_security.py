"""Clients: requirepass with both AUTH forms (redis-py sends ``AUTH default pw``
when given a username), and Redis' protected mode."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import redis

from tests.nodeproc import NodeProc
from tests.rawclient import exchange

pytestmark = pytest.mark.integration

PASSWORD = "s3cret pass"


def test_auth_both_forms(tmp_path: Path) -> None:
    with NodeProc(tmp_path, workers=2) as node:  # readiness is checked without a password
        r = node.client(protocol=2)
        assert r.execute_command("CONFIG", "SET", "requirepass", PASSWORD) == b"OK"
        r.close()
        replies = raw(node.port, [b"ADDJOB q x 0", b"AUTH wrong", b"AUTH default wrong",
                                  f'AUTH admin "{PASSWORD}"'.encode(), b"AUTH a b c",
                                  b"ADDJOB q x 0", f'AUTH "{PASSWORD}"'.encode(),
                                  f'AUTH default "{PASSWORD}"'.encode()])
        assert replies == [b"-NOAUTH Authentication required.", b"-ERR invalid password",
                           b"-WRONGPASS invalid username-password pair or user is disabled.",
                           b"-WRONGPASS invalid username-password pair or user is disabled.",
                           b"-ERR syntax error", b"-NOAUTH Authentication required.",
                           b"+OK", b"+OK"]
        # redis-py with a username: RESP2 sends AUTH default pw, RESP3 HELLO 3 AUTH default pw
        for proto in (2, 3):
            c = node.client(protocol=proto, username="default", password=PASSWORD)
            assert c.execute_command("ADDJOB", "q", "x", 0).startswith(b"D-")
            c.close()
            bad = node.client(protocol=proto, username="default", password="nope")
            with pytest.raises(redis.AuthenticationError):
                bad.ping()
            bad.close()
        c = node.client(protocol=2, password=PASSWORD)  # the old form still works
        assert c.ping()
        c.close()


def test_a_failed_auth_keeps_an_open_node_open(tmp_path: Path) -> None:
    # no requirepass: every connection is authenticated and a wrong AUTH does not undo it
    with NodeProc(tmp_path, workers=1) as node:
        replies = raw(node.port, [b"AUTH someone pw", b"PING", b"AUTH default pw", b"PING",
                                  b"AUTH pw", b"PING"])
        assert replies == [b"-WRONGPASS invalid username-password pair or user is disabled.",
                           b"+PONG", b"+OK", b"+PONG",
                           b"-ERR Client sent AUTH, but no password is set", b"+PONG"]


def raw(port: int, lines: list[bytes]) -> list[bytes]:
    """Inline commands on one connection; the first line of each reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"".join(line + b"\r\n" for line in lines))
        data = b""
        while data.count(b"\r\n") < len(lines):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.split(b"\r\n")[: len(lines)]


def _non_loopback_ip() -> str | None:
    """An address of this host that is not loopback (the route to a public IP; no
    packet is sent), None when the host has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: only a route lookup
            ip = str(s.getsockname()[0])
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def _first_reply(ip: str, port: int) -> bytes:
    return exchange(port, b"PING\r\n", timeout_s=10, host=ip, until=b"\r\n")


def test_protected_mode(tmp_path: Path) -> None:
    ip = _non_loopback_ip()
    if ip is None:
        pytest.skip("this host has no non-loopback address to connect from")
    node = NodeProc(tmp_path, workers=2, args=["--bind", "127.0.0.1", ip])
    with node:
        assert _first_reply("127.0.0.1", node.port) == b"+PONG\r\n"  # loopback: served
        denied = _first_reply(ip, node.port)
        assert denied.startswith(b"-DENIED Redis is running in protected mode")
        assert b"'CONFIG SET protected-mode no'" in denied
        r = node.client(protocol=2)
        assert int(r.execute_command("INFO", "stats")["rejected_connections"]) >= 1
        assert r.execute_command("CONFIG", "SET", "protected-mode", "no") == b"OK"
        assert _first_reply(ip, node.port) == b"+PONG\r\n"
        assert r.execute_command("CONFIG", "SET", "protected-mode", "yes") == b"OK"
        assert _first_reply(ip, node.port).startswith(b"-DENIED")
        assert r.execute_command("CONFIG", "SET", "requirepass", PASSWORD) == b"OK"
        assert _first_reply(ip, node.port).startswith(b"-NOAUTH")  # a password: no protection
        r.close()
        # bound beyond loopback without a cluster secret: the log says which directive
        assert "Set cluster-secret-file" in node.log_text()
