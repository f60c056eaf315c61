"""Cross-protocol requests: an HTTP request sent to the RESP port (a web page
making a browser POST a form) is closed at its first line, logged, and nothing in
its body runs; the cluster secret cannot be turned off at runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.nodeproc import NodeProc, unique_queue
from tests.rawclient import exchange

pytestmark = pytest.mark.integration

read_timeout_s = 20.0
ATTACK = "Possible SECURITY ATTACK detected"


def send_and_read_all(port: int, data: bytes) -> bytes:
    return exchange(port, data, timeout_s=read_timeout_s)


def test_http_lines_as_commands_close_the_connection(tmp_path: Path) -> None:
    with NodeProc(tmp_path, workers=2) as node:
        r = node.client(protocol=2)
        q = unique_queue()
        r.execute_command("ADDJOB", q, "keep me", 0)
        body = b"DEBUG FLUSHALL\r\nCONFIG SET maxclients 1\r\n"
        form = (b"POST / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                b"Content-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
                % (node.port, len(body), body))
        assert send_and_read_all(node.port, form) == b""  # no reply at all
        # a header line first (the request line lost), multibulk or inline
        assert send_and_read_all(node.port, b"Host: evil.example\r\nDEBUG FLUSHALL\r\n") == b""
        assert send_and_read_all(node.port, b"*1\r\n$5\r\nHOST:\r\n*2\r\n$5\r\nDEBUG\r\n"
                                            b"$8\r\nFLUSHALL\r\n") == b""
        assert r.execute_command("QLEN", q) == 1  # nothing in the bodies ran
        assert r.config_get("maxclients")["maxclients"] == "10000"
        node.wait_for(lambda: node.log_text().count(ATTACK) >= 3, 10, "three warnings")
        # the same words inside a command's arguments are data
        assert r.execute_command("ADDJOB", q, "POST / HTTP/1.1", 0).startswith(b"D-")
        r.close()


def test_the_cluster_secret_cannot_be_turned_off_at_runtime(tmp_path: Path) -> None:
    secret = tmp_path / "cluster.secret"
    secret.write_text("first secret of this test\n")
    newer = tmp_path / "newer.secret"
    newer.write_text("second secret of this test\nfirst secret of this test\n")
    newer.chmod(0o600)  # CONFIG SET takes only a file no other user may read
    with NodeProc(tmp_path / "n", workers=2, conf={"cluster-secret-file": str(secret)}) as node:
        r = node.client(protocol=2)
        with pytest.raises(Exception, match="cannot be turned off at runtime"):
            r.execute_command("CONFIG", "SET", "cluster-secret-file", "")
        assert r.config_get("cluster-secret-file")["cluster-secret-file"] == str(secret)
        assert "cluster-secret-file \"\" refused" in node.log_text()
        # rotating to another file stays possible
        assert r.execute_command("CONFIG", "SET", "cluster-secret-file", str(newer)) == b"OK"
        r.close()
