"""A blocked GETJOB's waiter that reached a queue's owner after the node was flushed
(CLUSTER RESET, DEBUG FLUSHALL): its BLOCK came from another worker before that
worker's flush, the owner's flush ran first, and the BLOCK re-created the queue.
The coordinator's UNBLOCK says the waiter was released by the flush, and the empty
queue goes with it; an ordinary UNBLOCK (timeout, disconnect) leaves the queue, as
the reference leaves a queue a blocked client created until it is idle long enough."""

from __future__ import annotations

import random

from workers.shard import Shard

T0 = 1_795_301_808_328
NODE = "aa" * 20


def _shard() -> Shard:
    return Shard(NODE, 0, 1, b"seed", random.Random(3), T0)


def test_a_waiter_released_by_a_flush_takes_the_queue_it_recreated() -> None:
    s = _shard()
    s.op_block(1, [b"q", b"other"], 1, False, T0)
    s.op_flushall(keep_waiters=False)  # this worker's part of CLUSTER RESET
    assert s.info()["registered_queues"] == 0
    s.op_block(2, [b"q", b"other"], 1, False, T0 + 1)  # the late BLOCK
    assert s.info()["registered_queues"] == 2
    s.op_unblock(2, T0 + 2, forget_queues=True)
    assert s.info() == {"registered_jobs": 0, "registered_queues": 0, "blocked_clients": 0,
                        "queued_jobs": 0, "wait_repl_jobs": 0}
    s.check()


def test_an_ordinary_unblock_keeps_the_queue_and_a_flush_unblock_keeps_live_ones() -> None:
    s = _shard()
    s.op_block(1, [b"q"], 1, False, T0)
    s.op_unblock(1, T0 + 1)
    assert s.info()["registered_queues"] == 1  # until it has been idle long enough
    s.op_addjob(b"full", b"body", token=9, now_ms=T0, timeout_ms=0, replicate=None,
                delay_s=0, retry_s=None, ttl_s=60, maxlen=0, async_=False)
    s.op_block(2, [b"empty", b"full"], 1, False, T0 + 2)  # served at once: no waiter
    s.op_block(3, [b"empty"], 1, False, T0 + 3)
    s.op_unblock(3, T0 + 4, forget_queues=True)
    assert s.info()["registered_queues"] == 2  # q (idle, not this waiter's) and full
    s.check()
