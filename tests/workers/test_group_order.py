"""A queue split by groups answers QPEEK, the oldest age and QGROUPS from its
``GroupOrder`` (workers/lanes.py): what a read visits depends on its COUNT, not on
how many groups the queue holds; the answers are a full scan's, step by step."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator

from workers.job import ACTIVE, QUEUED, Job, JobExt
from workers.queue import Queue

T0 = 1_795_301_808_328


class Walked(deque[Job]):
    """A lane's deque that counts the walks over it (a merge of lanes walks each)."""

    walks = 0

    def __iter__(self) -> Iterator[Job]:
        Walked.walks += 1
        return super().__iter__()

    def __reversed__(self) -> Iterator[Job]:
        Walked.walks += 1
        return super().__reversed__()


def _job(n: int, group: bytes) -> Job:
    job = Job(f"D-{n:08x}", b"q", b"", QUEUED, 1, 60, 1000 + n, 0, 0, 0, ())
    job.ext = JobExt(group=group)
    return job


def test_reads_of_a_queue_of_many_groups_visit_what_they_ask() -> None:
    q = Queue(b"q", 0, T0)
    groups = 3000
    for n in range(groups):
        q.push(_job(n, b"g%05d" % n))
    assert q.lanes is not None and q.groups() == groups and q.check() is None
    for lane in q.lanes.values():
        lane.dq = Walked(lane.dq)
    for count in (1, 5):
        Walked.walks = 0
        assert [j.ctime_us for j in q.oldest(count)] == [1000 + n for n in range(count)]
        assert Walked.walks <= count  # a merge of every lane walked 3,000
        Walked.walks = 0
        assert [j.ctime_us for j in q.newest(count)] == [1000 + groups - 1 - n
                                                         for n in range(count)]
        assert Walked.walks <= count
    Walked.walks = 0
    assert q.largest_groups(3) == [(b"g00000", 1), (b"g00001", 1), (b"g00002", 1)]
    assert Walked.walks == 0
    q.push(_job(groups, b"g02999"))
    assert q.largest_groups(2) == [(b"g02999", 2), (b"g00000", 1)]
    assert q.check() is None


def _expected(q: Queue, jobs: list[Job]) -> tuple[list[Job], list[tuple[bytes, int]]]:
    live = sorted((j for j in jobs if j.state == QUEUED and j.queue == q.name),
                  key=lambda j: j.ctime_us)
    counts: dict[bytes, int] = {}
    for j in live:
        g = j.ext.group if j.ext is not None else b""
        counts[g] = counts.get(g, 0) + 1
    return live, sorted(counts.items(), key=lambda e: (-e[1], e[0]))


def test_random_moves_keep_the_orders_a_full_scan_gives() -> None:
    rnd = random.Random(11)
    q = Queue(b"q", 0, T0)
    jobs: list[Job] = []
    for step in range(1500):
        op = rnd.randrange(6)
        if op <= 1 or not jobs:
            n = len(jobs)
            # mostly newest, sometimes older (a requeue, a copy from another node)
            job = _job(n, b"g%d" % rnd.randrange(25))
            job.ctime_us = 1000 + n * 10 if rnd.random() < 0.8 else rnd.randrange(1000, 1000 + n * 10 + 1)
            jobs.append(job)
            q.push(job)
        elif op == 2:
            popped = q.pop()
            if popped is not None:
                popped.state = ACTIVE  # delivered
        elif op == 3:
            job = rnd.choice(jobs)
            if job.state == QUEUED:
                job.state = ACTIVE
                q.remove(job)
        elif op == 4:
            job = rnd.choice(jobs)
            if job.state == ACTIVE and job.queue == b"q":
                job.state = QUEUED
                q.push(job)
        else:
            job = rnd.choice(jobs)
            if job.state == QUEUED:  # to another queue and (sometimes) back
                job.state = ACTIVE
                q.remove(job)
                if job.in_deque():
                    q.detach(job)
                job.queue = b"dead:q"
                if rnd.random() < 0.5:
                    job.queue, job.state = b"q", QUEUED
                    q.push(job)
        assert q.check() is None, step
        live, counts = _expected(q, jobs)
        k = rnd.randrange(1, 8)
        assert [j.ctime_us for j in q.oldest(k)] == [j.ctime_us for j in live[:k]], step
        assert [j.ctime_us for j in q.newest(k)] == [j.ctime_us for j in live[::-1][:k]], step
        assert q.largest_groups(k) == counts[:k], step
        assert q.groups() == len(counts) and len(q) == len(live)
        assert q.check() is None, step


def test_adds_group_says_when_a_job_makes_one_group_more() -> None:
    q = Queue(b"q", 0, T0)
    assert not q.adds_group(b"a")  # empty: the first group takes the queue's label
    q.push(_job(1, b"a"))
    assert not q.adds_group(b"a") and q.adds_group(b"b")
    q.push(_job(2, b"b"))
    assert not q.adds_group(b"b") and q.adds_group(b"c")
    q.pop()
    assert q.adds_group(b"a") and not q.adds_group(b"b")
