"""QLIMIT in the seeded simulation: queues get limits (ACTIVE, RATE, GROUP-ACTIVE,
set with BCAST from random nodes, through the faulty network) while producers,
consumers, blocked GETJOBs, crashes and partitions go on. Every shard's check runs
the limits' check (``check_limits``: never more delivered and not done than ACTIVE,
the per-group counts right) after every consumer's turn and at the end; the
simulation's own properties (every job delivered, acked ones gone) hold with the
limits lifted in the quiet phase.

More seeds: SIM_SEEDS=1000 (default 20 here)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.sim.net import seeds
from tests.sim.test_sim import Sim, run_seed
from workers.job import JobExt


class LimitSim(Sim):
    """The simulation's workload, most jobs in one of three tenants, and a QLIMIT
    ... BCAST among the faults, drawn from a second seeded generator."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.limit_rng = random.Random(seed ^ 0x11A1)
        plain_addjob = self.net.addjob

        def addjob(node_id: str, queue: bytes = b"q", body: bytes = b"x", **kw: Any) -> Any:
            g = self.limit_rng.choice((b"", b"t1", b"t2", b"t3"))
            return plain_addjob(node_id, queue, body, ext=JobExt(group=g) if g else None, **kw)

        self.net.addjob = addjob  # type: ignore[method-assign]
        self.limits_set = 0
        self.withheld = 0  # consumer turns on a node with limits and jobs out

    def fault(self) -> None:
        if self.limit_rng.random() < 0.4:
            self.set_limits()
        super().fault()

    def set_limits(self) -> None:
        rng = self.limit_rng
        node = rng.choice(self.alive())
        values = (rng.choice((0, 1, 2, 5)), rng.choice((0, 0, 5, 50)), rng.choice((0, 1, 2)))
        queue = b"q%d" % rng.randint(0, 1)
        self.net.nodes[node].shard.op_qlimit(queue, values, True, 100, self.net.now)
        self.limits_set += 1
        self.net.drain(node)

    def consume(self, node: str) -> None:
        shard = self.net.nodes[node].shard
        if self.net.drop == 0.0:
            # the quiet phase (no more faults, drops off): the limits are lifted, as
            # the simulation lifts its pauses then (a BCAST still in flight included)
            for q in (b"q0", b"q1"):
                shard.op_qlimit(q, (0, 0, 0), False, 100, self.net.now)
        held = sum(shard.core.tally().active.values())
        super().consume(node)
        shard.core.check_limits()
        self.withheld += held > 0 and any(shard.core.limit_of(q) for q in (b"q0", b"q1"))


@pytest.mark.parametrize("seed", seeds("SIM_SEEDS", 20))
def test_sim_with_limits(seed: int) -> None:
    sim = LimitSim(seed)
    run_seed(sim, "tests/sim/test_limits_sim.py")
    assert sim.jobs, f"seed {seed}: no job was ever added"
    assert sim.limits_set and sim.withheld, f"seed {seed}: the limits were never in play"
