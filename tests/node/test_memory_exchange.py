"""The memory monitor's exchange between workers, in process (a real shard and
event loop; no other worker, so nothing goes over a mesh): a figure read later
wins whichever way it came, a malformed telling is ignored, a monitor is quiet
only when every other worker has its figure at level 0, and a wake never samples
inline (a sample's eviction drains effects, and a drain may wake the worker)."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Iterator
from typing import Any

import pytest

from disque_mp.node.config import Config
from disque_mp.node.memory import Monitor
from workers.shard import Shard

NODE_ID = "cd" * 20


class Host:
    """What a Monitor reads of its worker (``view.MemoryHost``), for worker ``index``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, index: int, workers: int) -> None:
        self.cfg = Config()
        self.index, self.workers, self.loop = index, workers, loop
        self.shard = Shard(NODE_ID, index, workers, os.urandom(16), random.Random(3), 0)
        self.oom = False
        self.mesh: Any = None  # never used: these tests call no sample with peers

    def drain_effects(self) -> None:
        self.shard.take_effects()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


def test_a_figure_read_later_wins(loop: asyncio.AbstractEventLoop) -> None:
    m = Monitor(Host(loop, 0, 2))  # type: ignore[arg-type]
    answer = m.exchange([1, 200, 5000])
    assert m.peers[1] == 5000
    assert len(answer) == 2 and answer[1] == m.local_used()
    m.exchange([1, 100, 9999])  # read before the one we have: a late arrival
    assert m.peers[1] == 5000
    m.exchange([1, 300, 7000])
    assert m.peers[1] == 7000


@pytest.mark.parametrize("arg", [None, [0, 400, 1], [2, 400, 1], [1, "400", 1], [1, 400], (1, 400, 1)])
def test_a_malformed_telling_is_ignored(loop: asyncio.AbstractEventLoop, arg: Any) -> None:
    m = Monitor(Host(loop, 0, 2))  # type: ignore[arg-type]
    m.exchange(arg)
    assert m.peers == {}


def test_quiet_once_every_peer_has_our_figure(loop: asyncio.AbstractEventLoop) -> None:
    m = Monitor(Host(loop, 0, 2))  # type: ignore[arg-type]
    assert not m.quiet()  # worker 1 has never heard from us
    m.told[1] = m.local_used()
    assert m.quiet()
    m.level = 1
    assert not m.quiet()  # a level to watch


def test_a_wake_samples_at_the_next_turn_not_inline(loop: asyncio.AbstractEventLoop) -> None:
    m = Monitor(Host(loop, 0, 1))  # type: ignore[arg-type]
    ran: list[int] = []
    sample = m.sample

    def counted() -> None:
        ran.append(1)
        sample()

    m.sample = counted  # type: ignore[method-assign]
    m.wake()
    m.wake()  # already waking: one sample
    assert ran == [] and m.handle is not None
    loop.run_until_complete(asyncio.sleep(0.01))
    assert ran == [1] and m.handle is not None  # sampled, and the next one planned
    m.sleep()
    assert m.handle is None and m.quiet()  # one worker: nobody to tell
