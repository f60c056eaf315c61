"""``core.WorkerCore``, the worker's shared base, in process: a real shard, a real
event loop, no sockets. Its timer tick follows the shard: a timer due before the
planned tick (WAITJOB's TIMEOUT in ms) moves the tick forward, and the shard's
``Wake`` reaches the handler registered for its token."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Iterator
from typing import Any

import pytest

from disque_mp.node.config import Config
from disque_mp.node.core import WorkerCore
from workers.replies import PENDING
from workers.shard import Shard

NODE_ID = "ab" * 20
WAITJOB_TIMEOUT_MS = 20  # well under one tick period (1000 / hz = 100 ms by default)
LOOP_WAIT_S = 5.0  # bound on waiting for the Wake (a loaded machine is slow, never this slow)


@pytest.fixture
def core() -> Iterator[WorkerCore]:
    loop = asyncio.new_event_loop()
    c = WorkerCore(Config(), 0, NODE_ID)
    c.loop = loop
    c.shard = Shard(NODE_ID, 0, 1, os.urandom(16), random.Random(7), c.now_ms)
    try:
        yield c
    finally:
        if c.tick_handle is not None:
            c.tick_handle.cancel()
        loop.close()


def _waitjob(c: WorkerCore, got: list[Any]) -> str:
    """WAITJOB on a queued job, with a timeout shorter than the tick period."""
    c.now_ms = c.now_ms + 1
    job_id = c.shard.op_addjob(b"q", b"body", timeout_ms=0, replicate=None, delay_s=0,
                               retry_s=None, ttl_s=3600, maxlen=0, async_=False,
                               token=c.new_token(), now_ms=c.now_ms)
    token = c.new_token()
    c.tokens[token] = got.append
    assert c.shard.op_waitjob(token, [str(job_id)], WAITJOB_TIMEOUT_MS, c.now_ms) is PENDING
    return str(job_id)


def test_a_timer_due_before_the_planned_tick_moves_the_tick(core: WorkerCore) -> None:
    core.tick()
    planned = core.tick_at
    assert planned > core.now_ms  # one period ahead: the empty shard has no timer
    got: list[Any] = []
    _waitjob(core, got)
    due = core.shard.next_due()
    assert due is not None and due < planned
    core.reschedule_tick()
    assert core.tick_at == due


def test_the_shards_wake_reaches_the_tokens_handler(core: WorkerCore) -> None:
    core.tick()
    got: list[Any] = []
    _waitjob(core, got)
    core.reschedule_tick()
    loop = core.loop
    deadline = loop.time() + LOOP_WAIT_S
    while not got and loop.time() < deadline:
        loop.run_until_complete(asyncio.sleep(0.005))
    assert got == [0]  # the timeout: none of the one job is done
    assert not core.tokens  # the handler was taken with its Wake


def test_a_tick_pulled_earlier_goes_back_when_its_timer_goes(core: WorkerCore) -> None:
    """The timer the tick was moved forward for is gone before it fires (here the
    WAITJOB's job is acked before its timeout; in a cluster, a replicated job's
    copies answer before its 50 ms step): the tick goes back to its hz time instead
    of firing for nothing, and the shard's heap no longer holds the empty due time."""
    core.tick()
    planned = core.tick_at
    got: list[Any] = []
    job_id = _waitjob(core, got)
    core.reschedule_tick()
    assert core.tick_at < planned
    assert core.shard.op_ackjob([job_id], core.now_ms) == 1
    core.drain_effects()
    assert got == [1]  # the WAITJOB is answered by the ACK, its timer dropped
    core.reschedule_tick()
    assert core.tick_at == planned
    assert core.shard.next_due() is None or core.shard.next_due() >= planned
