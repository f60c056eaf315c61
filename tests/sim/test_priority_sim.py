"""Priorities across nodes in the seeded simulation: the priority travels with
every copy (REPLJOB, YOURJOBS, requeues, dead letters), a node exporting jobs by
federation sends its highest priorities first, every GETJOB gets the highest
priority its node holds queued, and the levels stay right under the simulation's
faults (``net.check`` runs every shard's check, which checks each level).

More seeds: SIM_SEEDS=1000 (default 20 here)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.sim.net import Net, seeds
from tests.sim.test_sim import Sim, run_seed
from workers.job import QUEUED, JobExt


def _top_queued(net: Net, node_id: str, queue: bytes) -> int:
    """The highest priority queued in ``queue`` on ``node_id`` (-1: none)."""
    q = net.nodes[node_id].shard.core.find_queue(queue)
    return max((job.priority for job in q), default=-1) if q is not None else -1


def test_federation_exports_the_highest_priorities_first() -> None:
    net = Net(3, seed=5)
    a, b, _c = net.ids
    for i in range(40):
        net.addjob(a, body=b"low%d" % i, replicate=1)
    for i in range(5):
        net.addjob(a, body=b"high%d" % i, replicate=1, ext=JobExt(priority=9))
    net.run(50)
    net.block(b, count=1)  # a consumer on b: NEEDJOBS, a's YOURJOBS (5 jobs at first)
    net.run(2000)
    qb = net.nodes[b].shard.core.find_queue(b"q")
    assert qb is not None and qb.priority_counts()[:1] == [(9, 4)], qb.priority_counts()
    got = [e[2] for e in net.take(b, count=4)]
    assert got == [b"high%d" % i for i in range(1, 5)], got
    for entry in net.take(a, count=40):
        job = net.nodes[a].shard.lookup(entry[1])
        assert job is not None and job.priority == 0
    net.check()


def test_replicas_and_requeues_keep_the_priority() -> None:
    net = Net(3, seed=9)
    a, b, c = net.ids
    jid = net.added(a, 200, body=b"h", replicate=3, retry_s=1, ext=JobExt(priority=6))
    for node in (b, c):
        copy = net.nodes[node].shard.lookup(jid)
        assert copy is not None and copy.priority == 6
    net.crash(a)
    net.run(5000)  # the copies requeue it after RETRY
    queued = [n for n in (b, c) if (j := net.nodes[n].shard.lookup(jid)) is not None
              and j.state == QUEUED]
    assert queued and _top_queued(net, queued[0], b"q") == 6
    net.check()


class PrioritySim(Sim):
    """The simulation's workload with a priority on most jobs (and a group on some),
    drawn from a second seeded generator; every GETJOB is checked against what its
    node held queued just before."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        draw = random.Random(seed ^ 0x9A1)
        plain_addjob = self.net.addjob
        plain_take = self.net.take
        net = self.net

        def addjob(node_id: str, queue: bytes = b"q", body: bytes = b"x", **kw: Any) -> Any:
            p = draw.choice((0, 0, 1, 5, 9))
            g = draw.choice((b"", b"", b"t1"))
            ext = JobExt(group=g, priority=p) if p or g else None
            return plain_addjob(node_id, queue, body, ext=ext, **kw)

        def take(node_id: str, queue: bytes = b"q", count: int = 1) -> list[list[Any]]:
            top = _top_queued(net, node_id, queue)
            out = plain_take(node_id, queue, count)
            if out:
                job = net.nodes[node_id].shard.lookup(out[0][1])
                assert job is not None and job.priority == top, (self.seed, top, job)
            return out

        self.net.addjob = addjob  # type: ignore[method-assign]
        self.net.take = take  # type: ignore[method-assign]


@pytest.mark.parametrize("seed", seeds("SIM_SEEDS", 20))
def test_sim_with_priorities(seed: int) -> None:
    sim = PrioritySim(seed)
    run_seed(sim, "tests/sim/test_priority_sim.py")
