"""The shard's counters for /metrics: totals, per-queue rows and the two histograms."""

from __future__ import annotations

import random
from typing import Any

from workers import shard as shard_mod
from workers.shard import Shard

NODE = "739317b21b9046a3454204425426c55a12ccc07a"
T0 = 1_795_301_808_328
BOUNDS = shard_mod.latency_bounds_ms


def addjob(s: Shard, queue: bytes, now: int, **kw: Any) -> str:
    args: dict[str, Any] = dict(timeout_ms=0, replicate=None, delay_s=0, retry_s=None,
                                ttl_s=86400, maxlen=0, async_=False, token=0)
    args.update(kw)
    return str(s.op_addjob(queue, b"body", now_ms=now, **args))


def rows(m: dict[str, Any]) -> dict[bytes, list[Any]]:
    return {r[0]: r for r in m["queue_rows"]}


def test_counters_follow_a_job_through_its_life() -> None:
    s = Shard(NODE, 0, 1, b"seed", random.Random(7), T0)
    a = addjob(s, b"q", T0)
    b = addjob(s, b"q", T0)
    addjob(s, b"q", T0, delay_s=60)
    m = s.metrics(100, T0 + 1000)
    assert (m["added"], m["queued"], m["delayed"], m["active"]) == (3, 2, 1, 0)
    assert rows(m)[b"q"][1:5] == [2, 0, 1, 1000]  # queued, active, delayed, oldest age ms

    [[_, got, _]] = s.op_take([b"q"], 1, False, T0 + 20)  # waited 20 ms
    assert got == a
    assert s.op_nack([a], T0 + 30) == 1  # requeued: no longer active
    [[_, again, _]] = s.op_take([b"q"], 1, False, T0 + 40)
    assert again == a  # queues are ordered by creation time
    [[_, second, _]] = s.op_take([b"q"], 1, False, T0 + 40)
    assert second == b
    m = s.metrics(100, T0 + 40)
    assert (m["delivered"], m["active"], m["nacked"], m["requeued_nack"]) == (3, 2, 1, 1)
    assert rows(m)[b"q"][2] == 2
    assert sum(m["wait_counts"]) == 2  # first deliveries only: 20 ms and 40 ms
    assert m["wait_counts"][BOUNDS.index(25)] == 1 and m["wait_counts"][BOUNDS.index(50)] == 1

    assert s.op_ackjob([b], T0 + 340) == 1  # processed in 300 ms
    m = s.metrics(100, T0 + 340)
    assert (m["acked"], m["active"], m["proc_sum_ms"]) == (1, 1, 300)
    assert m["proc_counts"][BOUNDS.index(500)] == 1
    assert rows(m)[b"q"][2] == 1
    s.check()


def test_retry_and_ttl_are_counted_and_the_delay_ends() -> None:
    s = Shard(NODE, 0, 1, b"seed", random.Random(7), T0)
    addjob(s, b"r", T0, retry_s=1, ttl_s=10)
    addjob(s, b"d", T0, delay_s=2, ttl_s=10)
    s.op_take([b"r"], 1, False, T0)
    s.tick(T0 + 3000)  # RETRY elapsed, DELAY elapsed
    m = s.metrics(100, T0 + 3000)
    assert (m["requeued_retry"], m["delayed"], m["active"]) == (1, 0, 0)
    assert rows(m)[b"d"][1] == 1
    s.tick(T0 + 11_000)
    m = s.metrics(100, T0 + 11_000)
    assert (m["expired"], m["jobs"]) == (2, 0)
    s.check()


def test_the_largest_queues_are_exported_first() -> None:
    s = Shard(NODE, 0, 1, b"seed", random.Random(7), T0)
    for i in range(10):
        for _ in range(i):
            addjob(s, b"q%d" % i, T0)
    m = s.metrics(3, T0)
    assert sorted(rows(m)) == [b"q7", b"q8", b"q9"]
    assert m["queues"] == 9 and m["queued"] == 45  # q0 never got a job
