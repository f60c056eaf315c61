"""Priorities (ADDJOB ... PRIORITY p): a queue serves its highest priority first,
within one priority its groups in rotation, within a group the oldest first; a
queue that never saw a priority keeps its one deque; every move keeps the levels
right (``Shard.check`` checks them after each step, through ``Queue.check``)."""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest

from disque_mp.node.commands.jobs import ERR_PRIORITY, parse_addjob
from tests.workers.queue_walk import Model, walk
from tests.workers.test_shard import Env
from workers.job import QUEUED, Job, JobExt, job_id_of_record
from workers.queue import Cells, Queue

T0 = 1_795_301_808_328


def _job(n: int, priority: int = 0, group: bytes = b"") -> Job:
    job = Job(f"D-{n:08x}", b"q", b"", QUEUED, 1, 60, n, 0, 0, 0, ())
    if priority or group:
        job.ext = JobExt(group=group, priority=priority)
    return job


def test_a_queue_without_priorities_keeps_one_deque() -> None:
    q = Queue(b"q", 0, T0)
    for n in range(1, 20):
        q.push(_job(n))
    assert q.tiers is None and q.priority_counts() == []
    q.push(_job(20, priority=0, group=b"A"))  # a job with ext, priority 0
    assert q.tiers is None and q.check() is None


def test_the_highest_priority_first_and_back_to_one_deque() -> None:
    q = Queue(b"q", 0, T0)
    for n in range(1, 101):
        q.push(_job(n))
    for n in range(101, 104):
        q.push(_job(n, priority=9))
    q.push(_job(104, priority=4))
    assert q.tiers is not None and q.check() is None and len(q) == 104
    assert q.priority_counts() == [(9, 3), (4, 1), (0, 100)]
    got = [q.pop() for _ in range(6)]
    assert [j.ctime_us for j in got if j] == [101, 102, 103, 104, 1, 2]
    assert q.tiers is None and q.check() is None  # level 0 alone: its deque is the queue's
    assert q.oldest(2)[0].ctime_us == 3 and len(q) == 98


def test_within_a_priority_groups_rotate() -> None:
    q = Queue(b"q", 0, T0)
    for n in range(1, 7):
        q.push(_job(n, priority=5, group=b"A" if n <= 4 else b"B"))
    q.push(_job(7, priority=1, group=b"B"))
    q.push(_job(8))
    order = [j.ctime_us for j in iter(q.pop, None)]
    assert order == [1, 5, 2, 6, 3, 4, 7, 8]
    assert q.check() is None and q.tiers is None


def test_reads_merge_the_levels_by_age() -> None:
    q = Queue(b"q", 0, T0)
    for n in range(1, 11):
        q.push(_job(n, priority=n % 3, group=b"G" if n % 2 else b""))
    assert [j.ctime_us for j in q.oldest(4)] == [1, 2, 3, 4]
    assert [j.ctime_us for j in q.newest(3)] == [10, 9, 8]
    assert sorted(j.ctime_us for j in q) == list(range(1, 11))
    assert q.has_named_groups() and q.largest_groups(5) == [(b"", 5), (b"G", 5)]
    assert q.groups() == 6  # a group counts once per priority it is queued at
    q.drop_all()
    assert q.tiers is None and len(q) == 0 and q.check() is None


def test_random_moves_keep_the_levels_consistent() -> None:
    """Push, pop, remove, revive, detach (a move to another queue and back),
    drop_all: after each step the check passes and each pop is of the highest
    priority queued, the oldest of its group at that priority."""

    def new_job(n: int, rng: random.Random) -> Job:
        return _job(n, rng.choice((0, 0, 0, 3, 9)), rng.choice((b"", b"A", b"B")))

    for seed in range(40):
        def on_pop(got: Job, queued: Model, seed: int = seed) -> None:
            top = max(j.priority for j in queued.values())
            assert got.priority == top, seed
            same = [j.ctime_us for j in queued.values()
                    if j.priority == top and j.group == got.group]
            assert got.ctime_us == min(same), seed

        def after(q: Queue, queued: Model, seed: int = seed) -> None:
            counts: dict[int, int] = {}
            for job in queued.values():
                counts[job.priority] = counts.get(job.priority, 0) + 1
            want = sorted(counts.items(), reverse=True)
            assert q.priority_counts() == (want if any(p for p, _ in want) else []), seed

        walk(seed, 700, new_job, on_pop, after, detach_p=0.3)


def test_the_record_carries_the_priority_in_version_4() -> None:
    env = Env()
    jid = env.add(ext=JobExt(priority=7, group=b"g"), maxdeliver=2)
    job = env.s.lookup(jid)
    assert job is not None
    rec = job.to_record()
    assert rec[0] == 4 and job_id_of_record(rec) == jid
    back = Job.from_record(rec)
    assert (back.priority, back.group, back.maxdeliver) == (7, b"g", 2)
    assert Job.from_record(back.to_record()).to_record() == rec
    plain = env.s.lookup(env.add())
    assert plain is not None and plain.to_record()[0] == 1 and plain.ext is None
    grouped = env.s.lookup(env.add(ext=JobExt(group=b"g")))
    assert grouped is not None and grouped.to_record()[0] == 3
    at = struct.calcsize(">BBBHQQQQQQQHHHIIHHHHB") - 1  # the priority: the head's last byte
    assert rec[at] == 7
    for bad in (0, 10, 255):
        broken = bytearray(rec)
        broken[at] = bad
        with pytest.raises(ValueError):
            Job.from_record(bytes(broken))
    with pytest.raises(ValueError):
        Job.from_record(rec[:-1])


def test_addjob_priority_option_and_its_errors() -> None:
    a = parse_addjob([b"q", b"b", b"0", b"PRIORITY", b"9", b"GROUP", b"g"])
    assert not isinstance(a, type(ERR_PRIORITY)) and a.ext is not None
    assert (a.ext.priority, a.ext.group) == (9, b"g")
    zero = parse_addjob([b"q", b"b", b"0", b"priority", b"0"])
    assert not isinstance(zero, type(ERR_PRIORITY)) and zero.ext is None  # no field at all
    for bad in (b"10", b"-1", b"x", b"1.5", b"", b"01"):
        assert parse_addjob([b"q", b"b", b"0", b"PRIORITY", bad]) is ERR_PRIORITY
    assert str(ERR_PRIORITY).startswith("ERR ")


def _prios(env: Env, got: list[Any]) -> list[int]:
    out = []
    for entry in got:
        job = env.s.lookup(entry[1])
        assert job is not None
        out.append(job.priority)
    return out


def test_every_move_of_the_shard_keeps_the_priority() -> None:
    """GETJOB order, NACK, DEQUEUE/ENQUEUE, the retry timer, dead letter and
    REDRIVE, SHOW and QSTAT: Env checks the shard (levels included) after each step."""
    env = Env()
    low = [env.add(body=b"l%d" % i, retry_s=60) for i in range(3)]
    high = [env.add(body=b"h%d" % i, retry_s=60, ext=JobExt(priority=8)) for i in range(2)]
    mid = env.add(body=b"m", retry_s=60, maxdeliver=1, ext=JobExt(priority=3))
    stat = env.s.op_qstat(b"q", env.now)
    assert stat[-2:] == [b"priorities", [8, 2, 3, 1, 0, 3]] and b"groups" not in stat
    assert env.show_all(high[0])[b"priority"] == 8 and b"priority" not in env.show_all(low[0])
    got = env.take(count=2)
    assert [e[1] for e in got] == high
    assert env.s.op_nack([high[1]], env.now) == 1  # back at the head of its priority
    assert [e[1] for e in env.take(count=1)] == [high[1]]
    assert env.s.op_dequeue([low[0]], env.now) == 1
    assert env.s.op_enqueue([low[0]], env.now) == 1
    env.advance(61_000)  # retry timers requeue the two priority-8 jobs
    got = env.take(count=4)
    assert _prios(env, got) == [8, 8, 3, 0]
    env.advance(61_000)  # the priority-3 job is past MAXDELIVER: dead-lettered
    dead = env.s.lookup(mid)
    assert dead is not None and dead.queue == b"dead:q" and dead.priority == 3
    assert env.s.op_qstat(b"dead:q", env.now)[-2:] == [b"priorities", [3, 1]]
    assert env.s.op_redrive(b"dead:q", 10, env.now) == 1
    back = env.s.lookup(mid)
    assert back is not None and back.queue == b"q" and back.priority == 3
    assert _prios(env, env.take(count=1)) == [8]


def test_aof_reload_keeps_the_order() -> None:
    env = Env()
    for i in range(5):
        env.add(body=b"p%d" % i, ext=JobExt(priority=i * 2))
    back = Env()
    for job in reversed(env.s.jobs()):
        back.s.load_record(job.to_record(), True, back.now)
    back.s.check()
    assert [e[2] for e in back.take(count=5)] == [b"p4", b"p3", b"p2", b"p1", b"p0"]


def test_levels_publish_nothing_the_queue_counts_for_its_slot() -> None:
    """The slot's cell counts the queue while any level holds a job; a level handed
    the queue's jobs (level 0) and drained apart from the others touches no cell."""
    cells = Cells.private()
    slot = 12_345
    q = Queue(b"q", slot, T0, cells)
    plain = [_job(n) for n in range(1, 4)]
    for job in plain:
        q.push(job)
    q.push(_job(4, priority=9))
    assert cells.nonempty[slot] == 1
    for job in plain:
        job.state = 0
        q.remove(job)  # level 0 drained while level 9 holds its job
    assert cells.nonempty[slot] == 1 and q.check() is None
    got = q.pop()
    assert got is not None and got.priority == 9 and cells.nonempty[slot] == 0
    assert q.tiers is None and q.check() is None
    for job in plain:  # revived in the queue's own deque again
        job.state = QUEUED
        q.push(job)
    assert cells.nonempty[slot] == 1 and len(q) == 3 and q.check() is None
