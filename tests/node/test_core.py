"""``core.WorkerCore``, the worker's shared base, in process: a real shard, a real
event loop, no sockets. Its timer tick follows the shard: a timer due before the
planned tick (WAITJOB's TIMEOUT in ms) moves the tick forward, the shard's
``Wake`` reaches the handler registered for its token, and an idle core plans no
tick at all: it sleeps until its next timer or its next periodic work."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Iterator
from typing import Any

import pytest

from disque_mp import compiled
from disque_mp.node.config import Config
from disque_mp.node.core import NO_TICK_MS, WorkerCore
from workers.replies import PENDING
from workers.shard import Shard

NODE_ID = "ab" * 20
WAITJOB_TIMEOUT_MS = 20  # a timer due soon
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


def _waitjob(c: WorkerCore, got: list[Any], timeout_ms: int = WAITJOB_TIMEOUT_MS) -> str:
    """WAITJOB on a queued job, with a timeout of ``timeout_ms``."""
    c.now_ms = c.now_ms + 1
    job_id = c.shard.op_addjob(b"q", b"body", timeout_ms=0, replicate=None, delay_s=0,
                               retry_s=None, ttl_s=3600, maxlen=0, async_=False,
                               token=c.new_token(), now_ms=c.now_ms)
    token = c.new_token()
    c.tokens[token] = got.append
    assert c.shard.op_waitjob(token, [str(job_id)], timeout_ms, c.now_ms) is PENDING
    return str(job_id)


def test_a_timer_due_before_the_planned_tick_moves_the_tick(core: WorkerCore) -> None:
    core.tick()
    planned = core.tick_at
    assert planned == NO_TICK_MS  # the empty shard has no timer, the core no periodic work
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
    copies answer before its 50 ms step): the tick goes back to the next timer
    still there (here the acked job's GC, seconds away) instead of firing for
    nothing, and the shard's heap no longer holds the empty due time."""
    core.tick()
    got: list[Any] = []
    job_id = _waitjob(core, got)
    core.reschedule_tick()
    pulled = core.tick_at
    assert pulled < core.now_ms + 1000  # to the WAITJOB's timeout
    assert core.shard.op_ackjob([job_id], core.now_ms) == 1
    core.drain_effects()
    assert got == [1]  # the WAITJOB is answered by the ACK, its timer dropped
    core.reschedule_tick()
    due = core.shard.next_due()
    assert due is not None and due > core.now_ms + 1000 > pulled
    assert core.tick_at == due


def _run_loop(c: WorkerCore, seconds: float, until: Any = None) -> None:
    loop = c.loop
    deadline = loop.time() + seconds
    while loop.time() < deadline and not (until is not None and until()):
        loop.run_until_complete(asyncio.sleep(0.005))


def test_an_idle_core_plans_no_tick(core: WorkerCore) -> None:
    """No timer and no periodic work: no tick is planned, and none runs while the
    loop turns (a fixed-rate tick would have run several times meanwhile)."""
    start = core.ticks
    core.tick()
    assert core.tick_at == NO_TICK_MS and core.tick_handle is None
    _run_loop(core, 0.3)
    assert core.ticks - start == 1  # only the call above
    core.reschedule_tick()  # a batch that touched no timer plans nothing either
    assert core.tick_handle is None


def test_a_timer_far_in_the_future_is_the_next_tick(core: WorkerCore) -> None:
    """A queued job whose timers are all seconds away or more (its TTL an hour):
    the tick is planned at the first of them, no fixed-rate tick before it."""
    core.tick()
    core.now_ms += 1
    core.shard.op_addjob(b"q", b"body", timeout_ms=0, replicate=None, delay_s=0, retry_s=None,
                         ttl_s=3600, maxlen=0, async_=False, token=core.new_token(),
                         now_ms=core.now_ms)
    core.drain_effects()
    due = core.shard.next_due()
    assert due is not None and due >= core.now_ms + 10_000
    assert core.tick_at == due and core.tick_handle is not None


def test_a_timer_fires_on_time_with_no_tick_before_it(core: WorkerCore) -> None:
    """A WAITJOB timeout 150 ms away: the one tick runs at its deadline (not
    before it) and answers the WAITJOB; then the tick waits for the job's own
    timers, seconds away."""
    core.tick()
    start = core.ticks
    got: list[Any] = []
    _waitjob(core, got, timeout_ms=150)
    due = core.shard.next_due()
    assert due is not None
    core.reschedule_tick()
    _run_loop(core, LOOP_WAIT_S, until=lambda: bool(got))
    assert got == [0]
    assert core.ticks - start == 1 and core.last_tick_ms >= due
    assert core.tick_at == core.shard.next_due() and core.tick_at > due + 10_000


# mypyc refuses an interpreted subclass of the compiled core: the tests of PeriodicCore
# run in the pure pass of make test (tests/node/test_core.py is among its PURE_TESTS)
needs_pure_core = pytest.mark.skipif(
    "disque_mp.node.core" in compiled.status()["compiled"],
    reason="an interpreted subclass of the compiled WorkerCore; runs in the pure pass")


class PeriodicCore(WorkerCore):
    """A core with periodic work each 50 ms for ``active`` more rounds, then none
    (as ``Worker``'s each-second work ends on an idle second)."""

    period_ms = 50

    def __init__(self, cfg: Config, index: int, node_id: str) -> None:
        super().__init__(cfg, index, node_id)
        self.active = 0
        self.rounds = 0
        self.wakes = 0

    def on_tick(self) -> int:
        self.rounds += 1
        self.active -= 1
        return self.now_ms + self.period_ms if self.active > 0 else NO_TICK_MS

    def on_wake(self) -> int:
        self.wakes += 1
        self.active = 2
        return self.now_ms + self.period_ms


@needs_pure_core
def test_periodic_work_stops_when_idle_and_resumes_on_a_batch() -> None:
    loop = asyncio.new_event_loop()
    c = PeriodicCore(Config(), 0, NODE_ID)
    c.loop = loop
    c.shard = Shard(NODE_ID, 0, 1, os.urandom(16), random.Random(7), c.now_ms)
    try:
        c.tick()  # the first tick wakes it
        assert c.wakes == 1 and c.tick_at == c.period_at < NO_TICK_MS
        _run_loop(c, LOOP_WAIT_S, until=lambda: c.period_at == NO_TICK_MS)
        assert c.rounds == 2 and c.tick_handle is None  # its two rounds, then asleep
        _run_loop(c, 0.2)
        assert c.rounds == 2  # nothing ran while idle
        c.begin_batch()
        c.end_batch()  # a client's read: the periodic work resumes
        assert c.wakes == 2 and c.tick_at == c.period_at < NO_TICK_MS
        _run_loop(c, LOOP_WAIT_S, until=lambda: c.period_at == NO_TICK_MS)
        assert c.rounds == 4
        c.begin_batch()
        c.end_batch()
        c.begin_batch()
        c.end_batch()  # already awake: no second wake
        assert c.wakes == 3
    finally:
        if c.tick_handle is not None:
            c.tick_handle.cancel()
        loop.close()


def test_jobs_woken_for_a_waiter_that_left_go_back_to_their_queue(core: WorkerCore) -> None:
    """A blocked GETJOB served by an ADDJOB (its Wake pending) whose handler is gone
    before the effects are carried out (an UNBLOCK later in the same mesh read): the
    jobs it took are given back, queued again uncounted, not left ACTIVE until RETRY."""
    c, now = core, core.now_ms
    token = c.new_token()
    c.tokens[token] = lambda reply: pytest.fail(f"the handler was dropped: {reply!r}")
    c.shard.op_block(token, [b"q"], 5, False, now)
    job_id = str(c.shard.op_addjob(b"q", b"body", timeout_ms=0, replicate=None, delay_s=0,
                                   retry_s=None, ttl_s=3600, maxlen=0, async_=False,
                                   token=c.new_token(), now_ms=now))
    assert c.shard.op_qlen(b"q") == 0  # delivered to the waiter: its Wake is pending
    del c.tokens[token]  # the waiter's UNBLOCK, before the Wake is carried out
    c.carry_out_effects()
    assert c.shard.op_qlen(b"q") == 1
    taken = c.shard.op_take([b"q"], 5, False, now + 1)
    assert [e[1] for e in taken] == [job_id]
