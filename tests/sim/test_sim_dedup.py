"""The seeded simulation (tests/sim/test_sim.py) with producers that add with
``DEDUP`` keys from a small pool and re-send them, as a producer whose ADDJOB timed
out does. Besides the simulation's own properties and every shard's invariants
(the DEDUP index among them), checked at every add:

- a node that holds an unacknowledged job of the queue with the key (its own, a
  REPLJOB copy, one brought by YOURJOBS) answers that job's ID and adds nothing;
- a node that holds none adds a new job (never an ID it answered before).

Rerun one seed: SIM_SEED=1234 .venv/bin/python -m pytest -q tests/sim/test_sim_dedup.py
More seeds: SIM_DEDUP_SEEDS=200 (default 10, a few seconds).
"""

from __future__ import annotations

import pytest

from tests.sim.net import seeds
from tests.sim.test_sim import JobInfo, Sim, run_seed
from workers.job import ACKED, JobExt
from workers.replies import Status

keys_per_queue = 6


class DedupSim(Sim):
    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.hits = 0
        self.answered: set[str] = set()  # every ID an add answered

    def produce(self) -> None:
        node = self.rng.choice(self.alive())
        queue = b"q%d" % self.rng.randint(0, 1)
        key = b"k%d" % self.rng.randint(0, keys_per_queue - 1)
        repl, retry = self.rng.randint(1, 3), self.rng.randint(1, 3)
        delay = self.rng.randint(1, 2) if self.rng.random() < 0.2 else 0
        holders = self._holding(node, queue, key)
        r = self.net.addjob(node, queue, b"body", replicate=repl, retry_s=retry, ttl_s=3600,
                            timeout_ms=1000, delay_s=delay, ext=JobExt(dedup=key))
        if holders:
            assert isinstance(r, Status) and str(r) in holders, (
                f"{node[:4]} holds {holders} for {queue!r}/{key!r}, ADDJOB answered {r}")
            self.hits += 1
            return
        if isinstance(r, tuple):
            self.pending[(node, r[1])] = (repl, retry, self.crashes)
            jid = self.net.nodes[node].shard.jobs()
            new = [j.id for j in jid if j.dedup == key and j.queue == queue
                   and j.id not in self.answered]
            assert new, f"{node[:4]}: a pending ADDJOB without a new job"
            self.answered.update(new)
        elif isinstance(r, Status):
            assert str(r) not in self.answered, f"{node[:4]} answered an old ID {r}"
            self.answered.add(str(r))
            self.jobs[str(r)] = JobInfo(repl, retry, set(self.net.holders(str(r))),
                                        created_ms=self.net.now)

    def _holding(self, node: str, queue: bytes, key: bytes) -> set[str]:
        """The unacknowledged jobs of ``queue`` (or its dead-letter queue) with ``key``
        that ``node`` holds."""
        return {j.id for j in self.net.nodes[node].shard.jobs()
                if j.dedup == key and j.state != ACKED and j.queue in (queue, b"dead:" + queue)}


@pytest.mark.parametrize("seed", seeds("SIM_DEDUP_SEEDS", 10))
def test_sim_dedup(seed: int) -> None:
    sim = DedupSim(seed)
    run_seed(sim, "tests/sim/test_sim_dedup.py")
    assert sim.jobs and sim.hits, f"seed {seed}: {len(sim.jobs)} jobs, {sim.hits} dedup hits"
