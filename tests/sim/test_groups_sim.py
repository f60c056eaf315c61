"""Fair tenants across nodes in the seeded simulation: the group travels with
every copy (REPLJOB, YOURJOBS, AOF), a node that imports jobs by federation
serves their groups in rotation, and the lanes stay right under the simulation's
faults (``net.check`` runs every shard's check, lanes included).

More seeds: SIM_SEEDS=1000 (default 20 here)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.sim.net import Net, seeds
from tests.sim.test_sim import Sim, run_seed
from workers.job import JobExt


def test_federation_carries_the_group_and_the_importer_rotates() -> None:
    net = Net(3, seed=11)
    a, b, _c = net.ids
    for i in range(30):
        net.addjob(a, body=b"a%d" % i, replicate=1, ext=JobExt(group=b"A"))
    for i in range(3):
        net.addjob(a, body=b"b%d" % i, replicate=1, ext=JobExt(group=b"B"))
    net.run(50)
    net.block(b, count=1)  # a consumer on b: NEEDJOBS, a's YOURJOBS
    net.run(2000)
    qb = net.nodes[b].shard.core.find_queue(b"q")
    assert qb is not None and qb.groups() == 2, "both groups imported"
    got = [e[2] for e in net.take(b, count=8)]
    bs = [x for x in got if x.startswith(b"b")]
    assert len(bs) >= 2 and got.index(bs[0]) <= 1, got
    for jid in (e[1] for e in net.take(b, count=100)):
        job = net.nodes[b].shard.lookup(jid)
        assert job is not None and job.group in (b"A", b"B")
    net.check()


class GroupSim(Sim):
    """The simulation's workload with a group on most jobs (three tenants and the
    ungrouped ones), drawn from a second seeded generator."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        groups = random.Random(seed ^ 0x6A0)
        plain_addjob = self.net.addjob

        def addjob(node_id: str, queue: bytes = b"q", body: bytes = b"x", **kw: Any) -> Any:
            g = groups.choice((b"", b"t1", b"t2", b"t3"))
            return plain_addjob(node_id, queue, body, ext=JobExt(group=g) if g else None, **kw)

        self.net.addjob = addjob  # type: ignore[method-assign]


@pytest.mark.parametrize("seed", seeds("SIM_SEEDS", 20))
def test_sim_with_groups(seed: int) -> None:
    sim = GroupSim(seed)
    run_seed(sim, "tests/sim/test_groups_sim.py")
