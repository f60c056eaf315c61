"""The forwarded-work budget (forwarded-commands-max): a connection's general-path
commands for a queue another worker owns run there at most a window at a time, so
the owner never builds more replies for one pipelining client than the window
before that client's output limits are checked; the window keeps replies in order
and the hot commands behind held ones in their place."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.nodeproc import NodeProc
from tests.rawclient import RawClient, Status, connect_to_worker, encode_command
from workers.ids import owner_of_queue

pytestmark = pytest.mark.integration

window = 8  # forwarded-commands-max of these nodes
jobs_n = 400
body = "b" * 1000  # each QPEEK q 1000 reply is about 400 KB


def _queue_of(index: int, prefix: str) -> str:
    return next(f"{prefix}{i}" for i in range(2000)
                if owner_of_queue(f"{prefix}{i}".encode(), 2) == index)


def _forwarded(port: int, index: int) -> int:
    text = RawClient(port).call("INFO", "workers").decode()
    line = next(x for x in text.split("\r\n") if x.startswith(f"worker{index}:"))
    return int(line.split("forwarded=")[1].split(",")[0])


@pytest.fixture
def node(tmp_path: Path) -> NodeProc:
    conf = {"forwarded-commands-max": window, "client-output-buffer-limit": "normal 4mb 0 0"}
    with NodeProc(tmp_path / "n", workers=2, conf=conf) as n:
        yield n


def test_heavy_forwarded_reads_stop_at_the_window_when_the_client_is_closed(
        node: NodeProc) -> None:
    q = _queue_of(1, "heavy")
    filler = RawClient(node.port)
    filler.send(b"".join(encode_command("ADDJOB", q, body, 0) for _ in range(jobs_n)))
    assert all(isinstance(filler.read(), Status) for _ in range(jobs_n))
    c = connect_to_worker(node.port, 0)
    before = _forwarded(node.port, 0)
    c.send(encode_command("QPEEK", q, 1000) * 300)  # ~120 MB of replies
    assert c.closed()  # past the 4 MB output limit
    sent = _forwarded(node.port, 0) - before
    # The window, plus what the kernel's socket buffers took before the 4 MB limit
    # was crossed (a few MB on loopback): a few dozen, not the 300 of the pipeline.
    assert sent <= 100, f"{sent} QPEEKs of the closed client ran on the owner"
    assert RawClient(node.port).call("QLEN", q) == jobs_n  # the node serves on


def test_the_window_keeps_order_and_hot_commands_behind_held_ones(node: NodeProc) -> None:
    q = _queue_of(1, "order")
    c = connect_to_worker(node.port, 0)
    batch = []
    for i in range(5 * window):
        batch.append(encode_command("QLEN", q))  # general path, forwarded
        batch.append(encode_command("ADDJOB", q, f"j{i}", 0))  # hot path (RAW), forwarded
    c.send(b"".join(batch))
    got = [c.read() for _ in range(len(batch))]
    assert got[0::2] == list(range(5 * window))  # each QLEN saw the ADDJOBs before it
    assert all(isinstance(g, Status) for g in got[1::2])
    assert c.call("PING") == Status("PONG")
