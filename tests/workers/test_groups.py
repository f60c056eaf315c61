"""Fair tenants (ADDJOB ... GROUP): a queue serves its groups in rotation, one
group costs what a plain queue costs, and every move keeps the lanes right
(``Shard.check`` checks them after each step)."""

from __future__ import annotations

import random
from typing import Any

from tests.workers.queue_walk import Model, walk
from tests.workers.test_shard import Env
from workers.job import QUEUED, Job, JobExt
from workers.queue import Queue

T0 = 1_795_301_808_328


def _job(n: int, group: bytes = b"") -> Job:
    job = Job(f"D-{n:08x}", b"q", b"", QUEUED, 1, 60, n, 0, 0, 0, ())
    if group:
        job.ext = JobExt(group=group)
    return job


def _groups(env: Env, jids: list[Any]) -> list[bytes]:
    out = []
    for jid in jids:
        job = env.s.lookup(jid)
        assert job is not None
        out.append(job.group)
    return out


def test_a_plain_or_single_group_queue_never_splits() -> None:
    q = Queue(b"q", 0, T0)
    for n in range(1, 50):
        q.push(_job(n))
    assert q.lanes is None and q.groups() == 1
    assert [q.pop().ctime_us for _ in range(49)] == list(range(1, 50))  # type: ignore[union-attr]
    for n in range(50, 60):
        q.push(_job(n, b"A"))  # empty deque: it takes the one group's label
    assert q.lanes is None and q.group0 == b"A" and q.check() is None
    assert q.largest_groups(10) == [(b"A", 10)]


def test_a_second_group_is_served_in_rotation_and_the_queue_merges_back() -> None:
    q = Queue(b"q", 0, T0)
    for n in range(1, 1001):
        q.push(_job(n, b"A"))
    for n in range(1001, 1011):
        q.push(_job(n, b"B"))
    assert q.lanes is not None and q.groups() == 2 and q.check() is None
    got = [q.pop() for _ in range(20)]
    assert [j.group for j in got if j] == [b"A", b"B"] * 10
    assert [j.ctime_us for j in got if j and j.group == b"A"] == list(range(1, 11))
    assert q.lanes is None and q.group0 == b"A" and q.check() is None  # B drained
    assert len(q) == 990


def test_ungrouped_jobs_are_one_group_of_their_own() -> None:
    q = Queue(b"q", 0, T0)
    for n in range(1, 7):
        q.push(_job(n, b"" if n <= 3 else (b"A" if n % 2 else b"B")))
    assert q.groups() == 3
    assert q.largest_groups(10) == [(b"", 3), (b"B", 2), (b"A", 1)]
    order = [q.pop() for _ in range(6)]
    assert [j.ctime_us for j in order if j] == [1, 4, 5, 2, 6, 3]
    assert q.pop() is None and q.check() is None


def test_random_moves_keep_the_lanes_consistent() -> None:
    """Push, pop, remove, revive (re-push of a removed job), drop_all: after each
    step the invariant check passes and each pop is the oldest of its group."""

    def new_job(n: int, rng: random.Random) -> Job:
        return _job(n, rng.choice([b"", b"A", b"B", b"C"][: rng.randint(1, 4)]))

    for seed in range(40):
        def on_pop(job: Job, queued: Model, seed: int = seed) -> None:
            same = [j.ctime_us for j in queued.values() if j.group == job.group]
            assert job.ctime_us == min(same), seed

        def after(q: Queue, queued: Model) -> None:
            assert q.groups() == len({j.group for j in queued.values()})

        walk(seed, 600, new_job, on_pop, after)


def test_every_move_of_the_shard_keeps_the_groups() -> None:
    """NACK, DEQUEUE/ENQUEUE, WORKING, a scatter surplus given back, DELJOB, ACKJOB,
    the retry timer: Env checks the shard (lanes included) after each step."""
    env = Env()
    a = [env.add(body=b"a%d" % i, retry_s=60, ext=JobExt(group=b"A")) for i in range(6)]
    b = [env.add(body=b"b%d" % i, retry_s=60, ext=JobExt(group=b"B")) for i in range(2)]
    plain = env.add(body=b"p", retry_s=60)
    got = [e[1] for e in env.take(count=3)]
    assert _groups(env, got) == [b"A", b"B", b""]
    assert env.s.op_nack([got[1]], env.now) == 1  # B's first back in its lane
    env.s.check()
    assert env.s.op_dequeue([a[3]], env.now) == 1
    env.s.check()
    env.s.op_return([got[0]], env.now)  # a scatter surplus: back in place
    env.s.check()
    assert env.s.op_enqueue([a[3]], env.now) == 1
    env.s.check()
    assert env.s.op_working(got[2], env.now) == 60
    assert env.s.op_deljob([b[1]], env.now) == 1
    env.s.check()
    stat = env.s.op_qstat(b"q", env.now)
    assert stat[-2:] == [b"groups", 2]
    assert env.s.op_qgroups(b"q", 100) == [[b"A", 6], [b"B", 1]]
    assert env.s.op_qgroups(b"q", 1) == [[b"A", 6]]
    assert env.s.op_qgroups(b"nosuch", 100) == []
    assert env.s.op_ackjob([plain], env.now) == 1
    env.advance(61_000)  # retry timers: nothing lost, lanes right
    assert env.s.op_qlen(b"q") == 7
    got = [e[1] for e in env.take(count=7)]
    assert _groups(env, got)[:3] == [b"A", b"B", b"A"]
    assert set(got) == set(a) | {b[0]}


def test_aof_reload_and_delqueue_keep_the_groups() -> None:
    env = Env()
    for i in range(4):
        env.add(body=b"a%d" % i, ext=JobExt(group=b"A"))
    env.add(body=b"b", ext=JobExt(group=b"B"))
    env.add(body=b"p")
    back = Env()
    for job in reversed(env.s.jobs()):  # a replay in any order finds the same lanes
        back.s.load_record(job.to_record(), True, back.now)
    back.s.check()
    assert back.s.op_qgroups(b"q", 10) == [[b"A", 4], [b"", 1], [b"B", 1]]
    assert len({e[2] for e in back.take(count=3)} & {b"b", b"p"}) == 2
    assert env.s.op_delqueue(0, b"q", True, env.now) == 6
    env.s.check()
    stat = env.s.op_qstat(b"q", env.now)
    shown = dict(zip(stat[::2], stat[1::2], strict=True))
    assert env.s.op_qgroups(b"q", 10) == [] and shown.get(b"groups", 0) == 0


def test_qstat_of_a_plain_queue_is_the_reference_reply() -> None:
    env = Env()
    env.add()
    assert b"groups" not in env.s.op_qstat(b"q", env.now)
    env.add(ext=JobExt(group=b"A"))
    assert env.s.op_qstat(b"q", env.now)[-2:] == [b"groups", 2]
