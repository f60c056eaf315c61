"""The counts the memory estimate reads are kept as the shard changes, never
walked for: the lanes (``LaneCount``, one per group of a split queue) through
splits, drops, purges, unsplits, evictions and FLUSHALL; and a lane that leaves
is not kept alive by its queue's group order (``GroupOrder.drop``), however long
the queue stays split and whether or not QGROUPS ever reads the buckets."""

from __future__ import annotations

import random
from typing import Any

from tests.workers.test_shard import Env
from workers.job import QUEUED, Job, JobExt
from workers.lanes import LaneCount, order_garbage_min
from workers.queue import Queue

T0 = 1_795_301_808_328


def _walked(env: Env) -> int:
    return sum(len(q.lanes) for q in env.s.core.queue_list() if q.lanes is not None)


def _grouped(env: Env, group: bytes, queue: bytes = b"q") -> Any:
    return env.add(queue, retry_s=60, ext=JobExt(group=group))


def test_the_lane_count_follows_every_move_of_the_shard() -> None:
    """Random adds over many groups, takes, DEADLETTER, REDRIVE, ACK, DEQUEUE and
    idle eviction: the kept count equals a walk of the queues after every step
    (``Shard.check`` compares them too), and FLUSHALL brings it to 0."""
    rnd = random.Random(5)
    env = Env()
    known: list[Any] = []
    highest = 0
    for step in range(800):
        op = rnd.randrange(7)
        pick = rnd.sample(known, min(len(known), rnd.randrange(1, 6))) if known else []
        if op <= 1 or not known:
            queue = rnd.choice([b"q", b"r"])
            known.append(_grouped(env, b"g%d" % rnd.randrange(40), queue))
        elif op == 2:
            env.take(rnd.choice([b"q", b"r", b"dead:q"]), count=rnd.randrange(1, 8))
        elif op == 3:
            env.s.op_deadletter(pick, None, env.now)
        elif op == 4:
            env.s.op_redrive(b"dead:q", rnd.randrange(1, 5), env.now)
        elif op == 5:
            env.s.op_ackjob(pick[:2], env.now)
        else:
            env.s.op_dequeue(pick, env.now)
        env.s.take_effects()
        env.s.check()
        assert env.s.core.lane_count() == _walked(env), step
        highest = max(highest, env.s.core.lane_count())
    assert highest > 40  # the walk did see queues split into many lanes
    env.take(b"q", b"r", b"dead:q", count=10_000)
    env.advance(10 * 86_400_000)  # every job times out, every queue idles out
    assert env.s.core.queue_count() == 0 and env.s.core.lane_count() == 0
    for g in range(10):
        _grouped(env, b"g%d" % g)
    assert env.s.core.lane_count() == 10
    env.s.op_flushall()
    assert env.s.core.lane_count() == 0 and _walked(env) == 0


def test_lanes_moved_out_are_not_kept_by_the_group_order() -> None:
    """5,000 groups of one queue dead-lettered: the lanes leave the old queue and
    neither its heads nor its dirty list keeps them (they held ~1 KB each)."""
    env = Env()
    args: dict[str, Any] = dict(timeout_ms=0, replicate=None, delay_s=0, retry_s=60,
                                ttl_s=86400, maxlen=0, async_=False, token=0)
    jids = [str(env.s.op_addjob(b"q", b"x", now_ms=env.now, ext=JobExt(group=b"g%05d" % i),
                                **args)) for i in range(5000)]
    env.s.op_qpeek(b"q", -1)  # the tails order exists too
    assert env.s.core.lane_count() == 5000
    for i in range(0, len(jids), 100):
        env.s.op_deadletter(jids[i:i + 100], b"why", env.now)
    q = env.s.core.find_queue(b"q")
    assert q is not None and q.order is not None and q.lanes is not None
    most = max(order_garbage_min, 2 * len(q.lanes))
    assert len(q.lanes) < order_garbage_min + 1  # the stale ones a purge has not reached
    assert len(q.order.heads) <= most and len(q.order.dirty) <= most
    assert q.order.tails is not None and len(q.order.tails) <= most
    assert env.s.core.lane_count() == len(q.lanes) + 5000  # dead:q holds one per group
    env.s.check()


def _job(n: int, group: bytes) -> Job:
    job = Job(f"D-{n:08x}", b"q", b"", QUEUED, 1, 60, 1000 + n, 0, 0, 0, ())
    job.ext = JobExt(group=group)
    return job


def test_groups_coming_and_going_leave_the_orders_bounded() -> None:
    """A queue that stays split (two long-lived groups) while 20,000 short groups
    come and go: its orders never hold more than the bound, with QGROUPS reading
    the buckets now and then or never."""
    long_lived = (b"keep", b"also")
    for read_buckets in (False, True):
        count = LaneCount()
        q = Queue(b"q", 0, T0, lane_count=count)
        n = 0
        for group in long_lived * 3:
            q.push(_job(n, group))
            n += 1
        for i in range(20_000):
            q.push(_job(n, b"short%d" % i))
            n += 1
            if read_buckets and i % 1000 == 0:
                assert q.largest_groups(2) == [(b"also", 3), (b"keep", 3)]
            for _ in range(3):  # the ring serves each lane in turn: the short one leaves
                job = q.pop()
                assert job is not None and job.ext is not None
                if job.ext.group not in long_lived:
                    break
                q.push(job)  # the long-lived groups keep their jobs
            order = q.order
            assert order is not None and q.lanes is not None and len(q.lanes) == 2, i
            most = max(order_garbage_min, 2 * len(q.lanes)) + 1
            assert len(order.heads) <= most and len(order.dirty) <= most, i
            assert order.entries <= most and count.lanes == len(q.lanes), i
        assert q.check() is None
        q.drop_all()
        assert count.lanes == 0
