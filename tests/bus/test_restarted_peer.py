"""A peer that restarts counts as reachable as soon as the reference counts it: a
node redials a peer without a link within the reference's cron period (100 ms),
and at once when the peer's own PING arrives, so the PONG that clears its PFAIL
comes before the restarted peer serves clients. The reference's cluster suite
kills such a peer again right away and expects an ADDJOB that needs every node to
wait for it (REPLJOB retried) rather than answer NOREPL."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.nodeproc import node_cluster, reachable_nodes, unique_queue

pytestmark = pytest.mark.integration

node_timeout_ms = 1000
down_s = 2.5  # past the node timeout, and long enough for the redial backoff to grow
wait_s = 30.0  # a generous bound (2 shared cores), never a timed assertion


def test_a_restarted_peer_is_reachable_when_it_serves(tmp_path: Path) -> None:
    with node_cluster(tmp_path, 2, workers=1, node_timeout_ms=node_timeout_ms) as (a, b):
        b.signal(signal.SIGKILL)
        assert b.proc is not None
        b.proc.wait(timeout=wait_s)
        a.wait_for(lambda: reachable_nodes(a.port) == 0, wait_s, "the killed peer unreachable")
        time.sleep(down_s)
        b.start()  # returns once b serves clients
        r = a.client(protocol=2, socket_timeout=wait_s)
        reply = r.execute_command("ADDJOB", unique_queue(), "x", 10_000, "REPLICATE", 2)
        assert reply.startswith(b"D-"), reply
        r.close()
