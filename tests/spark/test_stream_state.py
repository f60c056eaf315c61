"""The streaming source's bookkeeping (disque_mp.spark.StreamState) driven directly,
in the order Spark calls it, against a real node: offsets, re-offers, the empty
batch that gets the last one committed, ACK after commit, prefetch and stop."""

from __future__ import annotations

import time
import uuid
from typing import Any

from disque_mp.client import Disque
from disque_mp.spark import StreamState, parse_options
from tests.nodeproc import NodeProc

ack_wait_s = 30.0  # the acker thread ACKs in the background


def _wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + ack_wait_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _state(node: NodeProc, queue: str, **options: str) -> StreamState:
    return StreamState(parse_options({"nodes": f"127.0.0.1:{node.port}", "queue": queue,
                                      "count": "20", **options}))


def test_offsets_commit_and_the_empty_batch(node: NodeProc) -> None:
    queue = f"ss-{uuid.uuid4().hex[:8]}"
    with Disque([f"127.0.0.1:{node.port}"]) as d:
        ids = d.add_jobs(((queue, f"j{i}") for i in range(70)), retry=120)
        state = _state(node, queue)
        try:
            assert state.latest(0, 50) == 1
            assert state.latest(0, 50) == 1  # not planned yet: the same batch again
            first = [r[0] for r in state.rows(0, 1)]
            assert first == ids[:50]
            assert state.latest(1, 50) == 2  # the 20 left
            assert [r[0] for r in state.rows(1, 2)] == ids[50:]
            assert all(d.show(i)["state"] == "active" for i in ids)
            state.commit(1)
            _wait_for(lambda: all(d.show(i) is None for i in first), "batch 1 acknowledged")
            assert all(d.show(i)["state"] == "active" for i in ids[50:])
            # queue empty, batch 2 planned but not committed: an empty batch 3 is offered
            assert state.latest(2, 50) == 3
            assert state.rows(2, 3) == []
            state.commit(2)
            _wait_for(lambda: all(d.show(i) is None for i in ids), "batch 2 acknowledged")
            assert state.latest(3, 50) == 3  # idle and nothing to commit: no new batch
        finally:
            state.close()


def test_available_now_budget_and_restart(node: NodeProc) -> None:
    queue = f"ss-{uuid.uuid4().hex[:8]}"
    with Disque([f"127.0.0.1:{node.port}"]) as d:
        d.add_jobs(((queue, f"a{i}") for i in range(30)), retry=120)
        state = _state(node, queue)
        try:
            state.available_now_left = 25  # as prepareForTriggerAvailableNow records QLEN
            assert state.latest(7, 100) == 8  # after a restart Spark starts from seq 7
            assert len(state.rows(7, 8)) == 25
            assert state.rows(0, 7) == []  # batches of the dead process: planned empty
            state.commit(8)
            assert state.latest(8, 100) == 8  # budget spent: the query can end
            assert d.qlen(queue) == 5
        finally:
            state.close()


def test_prefetch_and_stop_requeue_what_spark_never_saw(node: NodeProc) -> None:
    queue = f"ss-{uuid.uuid4().hex[:8]}"
    with Disque([f"127.0.0.1:{node.port}"]) as d:
        ids = d.add_jobs(((queue, f"p{i}") for i in range(100)), retry=120)
        state = _state(node, queue, prefetch="true")
        try:
            assert state.latest(0, 30) == 1
            _wait_for(lambda: d.qlen(queue) == 40, "the next 30 jobs prefetched")
            assert state.latest(1, 30) == 2
            assert [r[0] for r in state.rows(1, 2)] == ids[30:60]
            _wait_for(lambda: d.qlen(queue) == 10, "30 more prefetched")
            state.commit(1)
        finally:
            state.close()  # ACKs batch 1, requeues the 30 prefetched, leaves batch 2 active
        assert all(d.show(i) is None for i in ids[:30])
        assert {d.show(i)["state"] for i in ids[30:60]} == {"active"}
        assert d.qlen(queue) == 40
        assert {d.show(i)["state"] for i in ids[60:]} == {"queued"}
