"""The per-slot cells a shard publishes (workers/queue.py ``Cells``): ``nonempty[slot]``
counts the slot's queues holding a queued job through every move of ``Queue.live``
(add, take, ack, dequeue / enqueue, NACK, delete, groups, pause, flush, eviction),
and ``gen[slot]`` moves whenever a queue of the slot vanishes. ``Shard.check``
checks the count (so the simulation does too)."""

from __future__ import annotations

import random

from workers.core import queue_idle_evict_ms
from workers.ids import SLOTS, slot_of
from workers.job import JobExt
from workers.queue import Cells, Queue, cells_bytes
from workers.shard import Shard

NODE = "a" * 40
T0 = 1_795_301_808_328


def _shard(cells: Cells) -> Shard:
    return Shard(NODE, 0, 1, b"seed", random.Random(7), T0, cells=cells)


def _add(s: Shard, queue: bytes, now: int = T0, group: bytes | None = None) -> str:
    r = s.op_addjob(queue, b"x", now_ms=now, timeout_ms=0, replicate=None, delay_s=0,
                    retry_s=None, ttl_s=86400, maxlen=0, async_=False, token=0,
                    ext=None if group is None else JobExt(group=group))
    return str(r)


def _ids(entries: list[list[object]]) -> list[str]:
    return [str(e[1]) for e in entries]


def test_nonempty_follows_every_move_of_a_queues_jobs() -> None:
    cells = Cells.private()
    s = _shard(cells)
    q = b"cells-q"
    slot = slot_of(q)
    assert cells.nonempty[slot] == 0
    a, b = _add(s, q), _add(s, q)
    s.check()
    assert cells.nonempty[slot] == 1  # one queue with jobs, however many jobs
    got = _ids(s.op_take([q], 1, False, T0))
    assert cells.nonempty[slot] == 1
    assert s.op_dequeue([b], T0) == 1  # queued -> active: the queue is empty
    s.check()
    assert cells.nonempty[slot] == 0
    assert s.op_enqueue([b], T0) == 1
    assert cells.nonempty[slot] == 1
    assert s.op_nack(got, T0) == 1  # a second queued job: still one queue
    s.check()
    assert cells.nonempty[slot] == 1
    assert s.op_deljob([a, b], T0) == 2  # both removed (stale entries)
    s.check()
    assert cells.nonempty[slot] == 0
    _add(s, q)
    assert s.op_pause(q, ["out"], T0).upper() == "OUT"  # paused: still holds a job
    s.check()
    assert cells.nonempty[slot] == 1
    gen = cells.gen[slot]
    s.op_flushall()
    s.check()
    assert cells.nonempty[slot] == 0 and cells.gen[slot] == gen + 1


def test_groups_lanes_count_the_queue_once() -> None:
    cells = Cells.private()
    s = _shard(cells)
    q = b"cells-groups"
    slot = slot_of(q)
    for i in range(6):
        _add(s, q, group=b"g%d" % (i % 3))
        s.check()
    assert cells.nonempty[slot] == 1
    for _ in range(6):
        assert len(s.op_take([q], 1, False, T0)) == 1  # lanes served in turn, then gone
        s.check()
    assert cells.nonempty[slot] == 0
    assert s.op_take([q], 1, False, T0) == []
    assert cells.nonempty[slot] == 0


def test_queues_of_one_slot_count_apart_and_eviction_moves_the_generation() -> None:
    cells = Cells.private()
    s = _shard(cells)
    q1 = b"cells-one"
    slot = slot_of(q1)
    q2 = next(n for n in (b"cells-%d" % i for i in range(200_000)) if slot_of(n) == slot and n != q1)
    _add(s, q1)
    _add(s, q2)
    s.check()
    assert cells.nonempty[slot] == 2
    s.op_take([q1, q2], 2, False, T0)
    s.check()
    assert cells.nonempty[slot] == 0
    gen = cells.gen[slot]
    now = T0 + queue_idle_evict_ms + 5000
    for _ in range(100):  # bounded: each tick does a capped amount of work
        due = s.tick(now)
        if due is None or due > now:
            break
    s.check()
    assert s.core.find_queue(q1) is None and s.core.find_queue(q2) is None
    assert cells.gen[slot] == gen + 2  # each vanished queue moves it
    assert cells.known_empty(slot, gen + 2) and not cells.known_empty(slot, gen)


def test_restart_clears_and_moves_only_its_own_slots() -> None:
    buf = bytearray(cells_bytes)
    cells = Cells(buf)
    other = Cells(buf)  # another worker's view of the same memory
    for slot in (4, 5):
        cells.inc(slot)
    cells.restart(0, 2)  # worker 0 of 2: the even slots
    assert other.nonempty[4] == 0 and other.gen[4] == 1
    assert other.nonempty[5] == 1 and other.gen[5] == 0
    assert sum(other.gen[0::2]) == SLOTS // 2 and sum(other.gen[1::2]) == 0


def test_generation_wraps_and_a_missed_transition_raises() -> None:
    cells = Cells.private()
    cells.gen[7] = 0xFFFFFFFF
    cells.bump(7)
    assert cells.gen[7] == 0
    try:
        cells.dec(7)
    except ValueError:
        pass
    else:
        raise AssertionError("a count below zero must not pass silently")


def test_a_queue_alone_counts_in_scratch_cells() -> None:
    q = Queue(b"alone", 3, T0)
    assert q.cells.nonempty[3] >= 0  # scratch cells: a queue made without a shard works
