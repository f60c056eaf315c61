"""Bus handshake slots on real nodes: strangers without the secret holding
connections open from several addresses (more than all the handshake slots)
cannot keep a member out, and the log does not grow a line per refused link.
Then a key removed from the secret file closes the links made with it."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.nodeproc import NodeProc, form_cluster, reachable_nodes, wait_until

pytestmark = pytest.mark.integration

SECRET = "the handshake-slots test's cluster secret"
STRANGER_ADDRS = [f"127.0.0.{i}" for i in range(2, 7)]  # 5 addresses x 16 > 64 slots
flood_sockets_max = 300  # open at once (the oldest closed past this)
flood_s = 40.0  # the flood's own bound, whatever the test does
form_timeout_s = 40.0  # generous: nodes of 2 workers on 2 busy cores
BUS_PORT_OFFSET = 10_000


def secret_node(tmp: Path, name: str) -> NodeProc:
    d = tmp / name
    d.mkdir()
    secret = d / "cluster.secret"
    secret.write_text(SECRET + "\n")
    os.chmod(secret, 0o600)
    return NodeProc(d, workers=2, conf={"cluster-node-timeout": 3000,
                                        "cluster-secret-file": str(secret)})


def flood(port: int, stop: threading.Event) -> None:
    """Open connections to ``port`` from the stranger addresses, send nothing."""
    held: list[socket.socket] = []
    deadline = time.monotonic() + flood_s
    i = 0
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            s = socket.socket()
            s.settimeout(1)
            try:
                s.bind((STRANGER_ADDRS[i % len(STRANGER_ADDRS)], 0))
                s.connect(("127.0.0.1", port))
                held.append(s)
            except OSError:
                s.close()
            i += 1
            if len(held) > flood_sockets_max:
                held.pop(0).close()
            time.sleep(0.002)
    finally:
        for s in held:
            with contextlib.suppress(OSError):
                s.close()


def test_handshake_slots_and_key_removal(tmp_path: Path) -> None:
    """Two nodes: b meets a through a flood of strangers; then a drops the key
    their links were made with."""
    a, b = secret_node(tmp_path, "a"), secret_node(tmp_path, "b")
    stop = threading.Event()
    flooder = threading.Thread(target=flood, args=(a.port + BUS_PORT_OFFSET, stop))
    with a, b:
        flooder.start()
        try:
            time.sleep(1.0)  # every slot of a is taken by now
            form_cluster([b, a], form_timeout_s)  # b dials a through the flood
        finally:
            stop.set()
            flooder.join(timeout=flood_s)
        lines = [ln for ln in a.log_text().splitlines() if "cluster bus:" in ln]
        assert len(lines) <= 10, lines[:20]  # a summary, not a line per link
        removed_key_drops_links(a)


OTHER_SECRET = "a secret the other node never had, for the removal test"


def removed_key_drops_links(a: NodeProc) -> None:
    """a (formed with one other node) swaps its only key for one the other never had."""
    newer = Path(a.dir) / "newer.secret"
    newer.write_text(OTHER_SECRET + "\n")
    os.chmod(newer, 0o600)
    r = a.client()
    # a file sharing no key with the keys in use is taken only when asked explicitly
    with pytest.raises(Exception, match="shares no key"):
        r.execute_command("CONFIG", "SET", "cluster-secret-file", str(newer))
    assert r.execute_command("CONFIG", "SET", "cluster-secret-replace", "yes") == b"OK"
    assert r.execute_command("CONFIG", "SET", "cluster-secret-file", str(newer)) == b"OK"
    r.close()
    # a's links to b used the removed key: closed, and no new one authenticates
    wait_until(lambda: reachable_nodes(a.port) == 0, form_timeout_s, "a losing the other node")
    assert "removed from cluster-secret-file" in a.log_text()
