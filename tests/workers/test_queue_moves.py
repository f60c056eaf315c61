"""Moving a job between queues costs O(1) whatever the queue's length: the entry
it leaves is a ghost (``Queue.detach``), never searched for; reads from the head
drop the stale run they meet once. Counted by the entries a move's deque scans
pass, and checked move by move against the shard's invariants and the order."""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from tests.workers.test_shard import Env
from workers.job import ACTIVE, QUEUED, Job, JobExt
from workers.queue import Queue

T0 = 1_795_301_808_328


class Scanned(deque[Job]):
    """A queue's deque that counts the entries its scans pass (``remove`` compares
    every entry before the one it removes; ``insert`` and ``index`` walk too)."""

    passed = 0

    def remove(self, value: Job) -> None:
        Scanned.passed += self.index(value)
        super().remove(value)

    def insert(self, i: int, x: Job) -> None:
        Scanned.passed += min(i, len(self) - i)
        super().insert(i, x)


def _scanned(q: Queue) -> None:
    """Give the queue (each lane of a split one) a counting deque, same entries."""
    if q.lanes is None:
        q._dq = Scanned(q._dq)
    else:
        for lane in q.lanes.values():
            lane.dq = Scanned(lane.dq)


def _jobs(n: int, group: bytes = b"") -> list[Job]:
    out: list[Job] = []
    for i in range(n):
        job = Job(f"D-{i:08x}", b"q", b"", QUEUED, 1, 60, 1000 + i, 0, 0, 0, ())
        if group:
            job.ext = JobExt(group=group if i % 2 else b"other")
        out.append(job)
    return out


def _move_out(q: Queue, job: Job) -> None:
    """What Core._move_to does to the queue a job leaves."""
    job.state = ACTIVE
    q.remove(job)
    if job.in_deque():
        q.detach(job)
    job.queue = b"dead:q"


def test_moving_the_newest_jobs_out_compares_no_entry() -> None:
    for group in (b"", b"g"):  # a single deque, then a queue split in two lanes
        q = Queue(b"q", 0, T0)
        jobs = _jobs(2000, group)
        for job in jobs:
            q.push(job)
        _scanned(q)
        Scanned.passed = 0
        for job in jobs[-500:]:
            _move_out(q, job)
        assert Scanned.passed == 0  # was 500 scans of ~2,000 entries
        assert q.check() is None and len(q) == 1500
        dead = Queue(b"dead:q", 0, T0)
        for job in jobs[-500:]:  # queued there: fresh entries, nothing revived here
            job.state = QUEUED
            dead.push(job)
        assert q.check() is None and dead.check() is None
        assert len(dead) == 500 and [j.id for j in dead.oldest(3)] == [j.id for j in jobs[-500:-497]]
        assert all(j in jobs[:1500] for j in q.oldest(1500)) and len(q.oldest(2000)) == 1500


def test_a_job_coming_back_revives_its_ghost_in_place() -> None:
    q = Queue(b"q", 0, T0)
    jobs = _jobs(100)
    for job in jobs:
        q.push(job)
    moved = jobs[40]
    _move_out(q, moved)
    assert q.ghosts == {moved} and q.check() is None
    moved.queue, moved.state = b"q", QUEUED  # REDRIVE back
    _scanned(q)
    Scanned.passed = 0
    q.push(moved)
    assert Scanned.passed == 0 and not q.ghosts and q.check() is None
    assert [j.ctime_us for j in q.oldest(100)] == [j.ctime_us for j in jobs]
    assert [q.pop() for _ in range(100)] == jobs and q.pop() is None


def test_a_ghost_queued_elsewhere_is_never_served_here() -> None:
    q = Queue(b"q", 0, T0)
    jobs = _jobs(200)
    for job in jobs:
        q.push(job)
    for job in jobs[:150]:
        _move_out(q, job)
    dead = Queue(b"dead:q", 0, T0)
    for job in jobs[:150]:
        job.state = QUEUED
        dead.push(job)
    assert [j.id for j in q.oldest(5)] == [j.id for j in jobs[150:155]]
    assert list(q) == jobs[150:] and q.newest(60) == jobs[150:][::-1]
    assert [q.pop() for _ in range(50)] == jobs[150:] and q.pop() is None
    assert q.check() is None and dead.check() is None
    assert all(j.in_deque() for j in jobs[:150])  # their own entries, in dead:q
    assert [dead.pop() for _ in range(150)] == jobs[:150]


def test_reads_from_the_head_drop_the_stale_run_once() -> None:
    q = Queue(b"q", 0, T0)
    jobs = _jobs(3000)
    for job in jobs:
        q.push(job)
    for job in jobs[:1400]:  # DEQUEUEd: stale entries ahead (fewer than the live ones)
        job.state = ACTIVE
        q.remove(job)
    assert q.stale == 1400
    assert q.oldest(1) == [jobs[1400]]
    assert q.stale == 0 and q.check() is None  # the run is gone: the next read is O(1)
    for job in jobs[:1400]:
        job.state = QUEUED
        q.push(job)  # their entries went: inserted again, in ctime order
    assert q.oldest(3000) == jobs and q.check() is None


def _add(env: Env) -> Any:
    """ADDJOB without the whole check after it (the caller checks once)."""
    return env.s.op_addjob(b"q", b"x", timeout_ms=0, replicate=None, delay_s=0, retry_s=60,
                           ttl_s=86400, maxlen=0, async_=False, token=0, now_ms=env.now)


def test_deadletter_and_redrive_cost_no_scan_of_the_queue() -> None:
    """The shard's DEADLETTER of the newest jobs of a long queue, then REDRIVE of
    them behind DEQUEUEd entries: the replies and the order as before."""
    env = Env()
    jids = [_add(env) for _ in range(3000)]
    env.s.check()
    newest = jids[-300:]
    assert env.s.op_deadletter(newest, b"why", env.now) == 300
    env.s.check()
    assert env.s.op_qlen(b"q") == 2700 and env.s.op_qlen(b"dead:q") == 300
    assert [e[1] for e in env.s.op_qpeek(b"dead:q", 2)] == newest[:2]
    assert env.s.op_dequeue(jids[:1500], env.now) == 1500
    env.s.check()
    assert env.s.op_redrive(b"dead:q", 200, env.now) == 200
    env.s.check()
    assert env.s.op_qlen(b"q") == 1400 and env.s.op_qlen(b"dead:q") == 100
    assert [e[1] for e in env.s.op_qpeek(b"q", 1400)] == jids[1500:2900]
    assert [e[1] for e in env.s.op_qpeek(b"q", -2)] == jids[2898:2900][::-1]
    assert env.s.op_deadletter(jids[1500:1600], None, env.now) == 100
    assert env.s.op_redrive(b"dead:q", 1000, env.now) == 200
    env.s.check()
    assert [e[1] for e in env.s.op_qpeek(b"q", 2000)] == jids[1500:]  # back in ctime order
    got = [e[1] for e in env.s.op_take([b"q"], 1500, False, env.now)]
    assert got == jids[1500:]
    env.s.check()


def test_random_moves_keep_every_invariant() -> None:
    """Random adds, takes, DEQUEUE, ENQUEUE, NACK, DEADLETTER, REDRIVE and ACK over
    grouped and plain jobs, the shard's whole check after every step."""
    rnd = random.Random(42)
    env = Env()
    known: list[Any] = []
    for step in range(600):
        op = rnd.randrange(8)
        pick = rnd.sample(known, min(len(known), rnd.randrange(1, 6))) if known else []
        if op == 0 or not known:
            group = rnd.choice([None, b"a", b"b", b"c"])
            kw: dict[str, Any] = {"ext": JobExt(group=group)} if group else {}
            known.append(env.add(retry_s=60, **kw))
        elif op == 1:
            env.take(rnd.choice([b"q", b"dead:q"]), count=rnd.randrange(1, 4))
        elif op == 2:
            env.s.op_dequeue(pick, env.now)
        elif op == 3:
            env.s.op_enqueue(pick, env.now)
        elif op == 4:
            env.s.op_deadletter(pick, None, env.now)
        elif op == 5:
            env.s.op_redrive(b"dead:q", rnd.randrange(1, 5), env.now)
        elif op == 6:
            env.s.op_nack(pick, env.now)
        else:
            env.s.op_ackjob(pick[:1], env.now)
        env.s.take_effects()
        env.s.check()
        for name in (b"q", b"dead:q"):
            assert len(env.s.op_qpeek(name, 10_000)) == env.s.op_qlen(name), step


def test_an_insert_between_queued_jobs_finds_bisect_right_from_the_nearer_end() -> None:
    """``_position`` gallops from both ends: the same place as ``bisect_right``
    (ties after the equal ones), probing near the end the job is near."""
    from bisect import bisect_right

    from workers.queue import _position

    rnd = random.Random(3)
    for _ in range(2000):
        n = rnd.randrange(2, 300)
        cts = sorted(rnd.randrange(0, 50) for _ in range(n))
        if cts[-1] == cts[0]:
            continue
        c = rnd.randrange(cts[0], cts[-1])
        dq = deque(Job(f"D-{i:08x}", b"q", b"", QUEUED, 1, 60, t, 0, 0, 0, ())
                   for i, t in enumerate(cts))
        assert _position(dq, c) == bisect_right(cts, c), (cts, c)
    q = Queue(b"q", 0, T0)
    jobs = _jobs(5000)
    for job in jobs[100:]:
        q.push(job)
    _scanned(q)
    Scanned.passed = 0
    for job in reversed(jobs[:100]):  # each older than the head: appendleft
        q.push(job)
    late = Job("D-late", b"q", b"", QUEUED, 1, 60, jobs[-3].ctime_us, 0, 0, 0, ())
    q.push(late)  # two from the tail: after its equal, a walk of two entries
    assert Scanned.passed <= 2 and q.check() is None
    assert q.newest(3) == [jobs[-1], jobs[-2], late]
