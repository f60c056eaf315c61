"""QSTAT's load signals on one shard (the fields after the reference's ones):
active, delayed, oldest-age and dead-len follow a job's moves, and /metrics'
queue row carries the same values."""

from __future__ import annotations

import random
from typing import Any

from workers.shard import Shard

NODE = "739317b21b9046a3454204425426c55a12ccc07a"
T0 = 1_795_301_808_328
REFERENCE_FIELDS = [b"name", b"len", b"age", b"idle", b"blocked", b"import-from",
                    b"import-rate", b"jobs-in", b"jobs-out", b"pause"]


def addjob(s: Shard, queue: bytes, now: int, **kw: Any) -> str:
    args: dict[str, Any] = dict(timeout_ms=0, replicate=None, delay_s=0, retry_s=None,
                                ttl_s=86400, maxlen=0, async_=False, token=0)
    args.update(kw)
    return str(s.op_addjob(queue, b"body", now_ms=now, **args))


def qstat(s: Shard, queue: bytes, now: int) -> dict[bytes, Any]:
    reply = s.op_qstat(queue, now)
    return dict(zip(reply[::2], reply[1::2], strict=True))


def row(s: Shard, queue: bytes, now: int) -> list[Any]:
    return next(r for r in s.metrics(100, now)["queue_rows"] if r[0] == queue)


def test_the_reference_fields_come_first_then_the_signals() -> None:
    s = Shard(NODE, 0, 1, b"seed", random.Random(7), T0)
    addjob(s, b"q", T0)
    names = s.op_qstat(b"q", T0)[::2]
    assert names == REFERENCE_FIELDS + [b"active", b"delayed", b"oldest-age", b"dead-len"]


def test_signals_follow_the_jobs() -> None:
    s = Shard(NODE, 0, 1, b"seed", random.Random(7), T0)
    first = addjob(s, b"q", T0, retry_s=30, maxdeliver=1)
    addjob(s, b"q", T0 + 500)
    addjob(s, b"q", T0, delay_s=60)
    st = qstat(s, b"q", T0 + 2_900)
    assert (st[b"len"], st[b"active"], st[b"delayed"], st[b"oldest-age"], st[b"dead-len"]) == (
        2, 0, 1, 2, 0)

    [[_, got, _]] = s.op_take([b"q"], 1, False, T0 + 3_000)
    assert got == first
    st = qstat(s, b"q", T0 + 3_000)
    # the oldest queued job is now the one added 500 ms later
    assert (st[b"len"], st[b"active"], st[b"oldest-age"]) == (1, 1, 2)

    assert s.op_nack([first], T0 + 3_100) == 1  # MAXDELIVER 1 reached: dead-lettered
    st = qstat(s, b"q", T0 + 3_100)
    assert (st[b"len"], st[b"active"], st[b"dead-len"]) == (1, 0, 1)
    assert qstat(s, b"dead:q", T0 + 3_100)[b"len"] == 1
    r = row(s, b"q", T0 + 3_100)
    assert r[1:5] == [1, 0, 1, 2_600] and r[-1] == 1  # queued, active, delayed, age ms; dead

    [[_, second, _]] = s.op_take([b"q"], 1, False, T0 + 4_000)
    st = qstat(s, b"q", T0 + 4_000)
    assert (st[b"len"], st[b"active"], st[b"oldest-age"]) == (0, 1, 0)  # 0 when empty
    assert row(s, b"q", T0 + 4_000)[4] == -1
    assert s.op_ackjob([second], T0 + 4_100) == 1
    assert qstat(s, b"q", T0 + 4_100)[b"active"] == 0
    s.tick(T0 + 62_000)  # the DELAY ends: queued
    st = qstat(s, b"q", T0 + 62_000)
    # its ctime follows the job's added at T0 + 500 (a node's ctimes only grow)
    assert (st[b"len"], st[b"delayed"], st[b"oldest-age"]) == (1, 0, 61)
    s.check()


def test_oldest_age_skips_jobs_that_left_the_head() -> None:
    s = Shard(NODE, 0, 1, b"seed", random.Random(7), T0)
    old = [addjob(s, b"q", T0) for _ in range(3)]
    addjob(s, b"q", T0 + 5_000)
    assert s.op_dequeue(old, T0 + 6_000) == 3  # stale entries at the head of the order
    st = qstat(s, b"q", T0 + 7_000)
    assert (st[b"len"], st[b"oldest-age"]) == (1, 2)
    s.check()
