"""What the fault suite found, pinned on two plain loopback nodes (no namespaces needed).

A job federation moved from node A to node B (NEEDJOBS / YOURJOBS, A keeps an
active copy) and later moved back to A, because a consumer waits on A while
the job sits queued on B: A used to drop an at-most-once (RETRY 0) job it
already held, while B had popped it to send it, so the job was queued nowhere
and lost without any fault. It must come back to A's consumer, once.

A node that has just restarted reaches A (its bus link to A is up) before A
redials it: A used to answer its NEEDJOBS with a YOURJOBS that A's bus dropped
(no link to that node yet), after the job had left A's queue, so an
at-most-once job queued on A was lost once the fault was over. It must reach
the restarted node's consumer.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.nodeproc import NodeProc, form_cluster, reachable_nodes, unique_queue, wait_until

form_timeout_s = 60.0
tries_max = 5  # the set-up below is not a race, a few tries cover a slow host
ask_wait_ms = 200  # B's GETJOB on the empty queue: long enough to ask A for jobs
ask_travel_s = 0.3  # for that NEEDJOBS to reach A (A keeps the ask for seconds)
settle_s = 5.0  # bound on the job reaching B's queue


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NodeProc, NodeProc]]:
    base = Path(tmp_path_factory.mktemp("bounce"))
    a = NodeProc(base / "a", workers=2, conf={"cluster-node-timeout": 2000})
    b = NodeProc(base / "b", workers=2, conf={"cluster-node-timeout": 2000})
    try:
        a.start()
        b.start()
        form_cluster([a, b], form_timeout_s)
        yield a, b
    finally:
        a.stop()
        b.stop()


def _queued_on_b_only(ra: redis.Redis, rb: redis.Redis, retry_args: list[object],
                      seen: list[str]) -> tuple[str, bytes] | None:
    """A job added on A that A pushes into B's queue with no consumer waiting on B:
    a GETJOB on B over an empty queue asks A for jobs (NEEDJOBS) and gives up; A
    keeps the ask, and the job it then gets goes to B (YOURJOBS). None when it did
    not end queued on B (the caller tries again with a new queue); what happened is
    appended to ``seen``."""
    q = unique_queue("bounce")
    if rb.execute_command("GETJOB", "TIMEOUT", ask_wait_ms, "FROM", q):
        seen.append("a job on a new queue")
        return None
    time.sleep(ask_travel_s)
    job_id = ra.execute_command("ADDJOB", q, "x", 0, "REPLICATE", 1, *retry_args)
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        if rb.execute_command("QLEN", q) == 1 and ra.execute_command("QLEN", q) == 0:
            return q, job_id
        time.sleep(0.05)
    seen.append(f"QLEN on A {ra.execute_command('QLEN', q)}, on B {rb.execute_command('QLEN', q)}")
    return None


@pytest.mark.parametrize("retry_args", [["RETRY", 0], ["RETRY", 60]], ids=["retry0", "retry60"])
def test_a_job_federation_moved_back_is_delivered(pair: tuple[NodeProc, NodeProc],
                                                  retry_args: list[object]) -> None:
    a, b = pair
    ra, rb = a.client(protocol=2), b.client(protocol=2, socket_timeout=20)
    try:
        seen: list[str] = []
        for _ in range(tries_max):
            found = _queued_on_b_only(ra, rb, retry_args, seen)
            if found is not None:
                break
        else:
            pytest.fail(f"the job never stayed queued on B in {tries_max} tries: {seen}")
        q, job_id = found
        got = ra.execute_command("GETJOB", "TIMEOUT", 10_000, "FROM", q)
        assert got is not None and got[0][1] == job_id, (
            f"job {job_id!r} moved back to A was not delivered; SHOW on A: "
            f"{ra.execute_command('SHOW', job_id)}, on B: {rb.execute_command('SHOW', job_id)}")
        assert ra.execute_command("QLEN", q) == 0 and rb.execute_command("QLEN", q) == 0
        assert rb.execute_command("GETJOB", "TIMEOUT", 500, "FROM", q) is None
    finally:
        ra.close()
        rb.close()


restart_rounds = 2  # before the fix, each round lost the job (8 in 8 on a 2-core VM)
failure_detection_s = 15.0  # cluster-node-timeout 2000: A flags the killed node within ~3 s
deliver_s = 15.0  # bound on the job reaching the restarted node's consumer
lost_link_s = 0.5  # A's link to a killed node is gone by then (a reset, not a timeout)


def _show(r: redis.Redis, job_id: Any) -> Any:
    reply = r.execute_command("SHOW", job_id)
    return reply and {k: v for k, v in zip(reply[::2], reply[1::2], strict=False) if k != b"body"}


@pytest.mark.parametrize("within_timeout", [False, True], ids=["flagged", "within-timeout"])
def test_an_at_most_once_job_reaches_a_node_that_just_restarted(tmp_path: Path,
                                                                within_timeout: bool) -> None:
    """Kill -9 X, queue an at-most-once job on A, restart X and wait on X at once:
    X's NEEDJOBS reaches A before A has redialled X. Either A has flagged X by
    then (unreachable until a PONG on A's new link), or X is back within the node
    timeout: A still sees it reachable, but its link to X is gone (not linked)."""
    timeout_ms = 30000 if within_timeout else 2000
    a = NodeProc(tmp_path / "a", workers=2, conf={"cluster-node-timeout": timeout_ms})
    x = NodeProc(tmp_path / "x", workers=2, conf={"cluster-node-timeout": timeout_ms})
    with contextlib.ExitStack() as stack:
        stack.callback(x.stop)
        stack.callback(a.stop)
        a.start()
        x.start()
        form_cluster([a, x], form_timeout_s)
        ra = a.client(protocol=2)
        stack.callback(ra.close)
        for _ in range(restart_rounds):
            x.kill_group()
            if within_timeout:
                time.sleep(lost_link_s)  # A sees its link to X drop, X not flagged
                assert reachable_nodes(a.port) == 1
            else:
                wait_until(lambda: reachable_nodes(a.port) == 0, failure_detection_s,
                           "A flags the killed node")
            q = unique_queue("restart")
            job_id = ra.execute_command("ADDJOB", q, "x", 0, "REPLICATE", 1, "RETRY", 0)
            x.start(wait=False)
            got = None
            deadline = time.monotonic() + deliver_s
            while got is None and time.monotonic() < deadline:
                try:
                    rx = x.client(protocol=2, socket_timeout=5)
                    try:
                        got = rx.execute_command("GETJOB", "TIMEOUT", 100, "FROM", q)
                    finally:
                        rx.close()
                except (redis.ConnectionError, redis.ResponseError):
                    time.sleep(0.02)  # not accepting clients yet
            x.wait_ready()
            rx = x.client(protocol=2)
            try:
                assert got is not None and got[0][1] == job_id, (
                    f"job {job_id!r} never reached the restarted node; SHOW on A: "
                    f"{_show(ra, job_id)}, on X: {_show(rx, job_id)}")
            finally:
                rx.close()
