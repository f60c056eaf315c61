"""A seeded walk of random moves on one queue (push, pop, remove, revive, detach,
drop_all) against a model of the jobs it holds: after each step the queue's own
check passes and its length is the model's. The tests of groups and priorities
say what each pop must be and what else must hold."""

from __future__ import annotations

import random
from collections.abc import Callable

from workers.job import QUEUED, Job
from workers.queue import Queue

T0 = 1_795_301_808_328

Model = dict[int, Job]  # ctime -> a queued job


def walk(seed: int, steps: int, new_job: Callable[[int, random.Random], Job],
         on_pop: Callable[[Job, Model], None], after: Callable[[Queue, Model], None],
         detach_p: float = 0.0) -> None:
    """``steps`` random moves from ``seed``; ``on_pop`` sees each popped job (with the
    model before it leaves), ``after`` the queue and model after each step; a
    removed job's entry is detached (a ghost) with probability ``detach_p``."""
    rng = random.Random(seed)
    q = Queue(b"q", 0, T0)
    queued: Model = {}
    removed: list[Job] = []
    n = 0
    for _ in range(steps):
        op = rng.random()
        if op < 0.45:
            n += 1
            job = new_job(n, rng)
            q.push(job)
            queued[n] = job
        elif op < 0.7:
            got = q.pop()
            if got is None:
                assert not queued, seed
                continue
            on_pop(got, queued)
            del queued[got.ctime_us]
            got.state = 0
        elif op < 0.85 and queued:
            job = queued.pop(rng.choice(list(queued)))
            job.state = 0
            q.remove(job)
            if detach_p and rng.random() < detach_p and job.in_deque():
                q.detach(job)
            removed.append(job)
        elif op < 0.98 and removed:
            job = removed.pop(rng.randrange(len(removed)))
            job.state = QUEUED
            q.push(job)
            queued[job.ctime_us] = job
        elif op >= 0.995:
            q.drop_all()
            for job in queued.values():
                job.state = 0
            queued.clear()
            removed.clear()
        err = q.check()
        assert err is None, (seed, err)
        assert len(q) == len(queued)
        after(q, queued)
