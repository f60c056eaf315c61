"""Takes over empty queues and the queues' eviction check: the check is armed once,
when a queue turns empty (or is created empty), and takes that find it empty leave
it alone, with the same effects as re-arming it each time: an empty queue nobody
fills is evicted ``queue_idle_evict_ms`` after its last enqueue or dequeue however
often GETJOB looks at it (the reference's queue GC), and a queue that turns empty
again later is checked again."""

from __future__ import annotations

import random

from workers import core as core_mod
from workers.shard import Shard
from workers.timers import resolution_for, timer_resolution_ms

NODE = "a" * 40
T0 = 1_795_301_808_328
IDLE_MS = core_mod.queue_idle_evict_ms
RES = timer_resolution_ms
IDLE_RES = resolution_for(IDLE_MS)  # an idle queue's check is rounded as far as it is set


def _shard() -> Shard:
    return Shard(NODE, 0, 1, b"seed", random.Random(7), T0)


def _advance(s: Shard, now: int) -> None:
    nxt = s.tick(now)
    for _ in range(1000):  # bounded: each tick does a capped amount of work
        if nxt is None or nxt > now:
            break
        nxt = s.tick(now)
    s.check()


def _add(s: Shard, queue: bytes, now: int) -> str:
    r = s.op_addjob(queue, b"x", now_ms=now, timeout_ms=0, replicate=None, delay_s=0,
                    retry_s=None, ttl_s=86400, maxlen=0, async_=False, token=0)
    return str(r)


def _timer_entries(s: Shard) -> int:
    return sum(len(b.items) for b in s.core.timers.buckets.values())


def test_takes_over_empty_queues_arm_nothing_more() -> None:
    s = _shard()
    s.op_take([b"a", b"b", b"c"], 4, False, T0)  # created empty: each check armed
    s.op_take([b"d"], 4, False, T0)
    armed = _timer_entries(s)
    for i in range(1, 200):
        s.op_take([b"a", b"b", b"c"], 4, False, T0 + i * 50)
        s.op_take([b"d"], 4, False, T0 + i * 50)
    s.check()
    assert _timer_entries(s) == armed


def test_empty_queues_taken_from_are_still_evicted() -> None:
    s = _shard()
    now = T0
    for _ in range(IDLE_MS // 1000 - 1):  # one look a second, never a job
        s.op_take([b"a", b"b"], 4, False, now)
        s.op_take([b"c"], 1, False, now)
        now += 1000
        _advance(s, now)
    assert sorted(s.core.queues) == [b"a", b"b", b"c"]
    _advance(s, T0 + IDLE_MS + IDLE_RES)
    assert not s.core.queues


def test_queue_drained_by_a_take_is_evicted_after_its_last_dequeue() -> None:
    s = _shard()
    s.op_take([b"a", b"b"], 4, False, T0)  # both created empty, checks armed at T0
    _add(s, b"a", T0 + 5_000)
    _add(s, b"b", T0 + 5_000)
    t = T0 + 10_000
    assert len(s.op_take([b"a", b"b"], 4, False, t)) == 2  # both turn empty: re-armed
    for i in range(1, 50):
        s.op_take([b"a", b"b"], 4, False, t + i * 100)  # empty takes change nothing
    _advance(s, t + IDLE_MS - 1_000)
    assert sorted(s.core.queues) == [b"a", b"b"]
    _advance(s, t + IDLE_MS + IDLE_RES)
    assert not s.core.queues
