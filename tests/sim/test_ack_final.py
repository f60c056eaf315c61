"""Fault-free simulation: an ACK that was answered is final.

5 nodes, message delays 1-40 ms (so messages overtake each other), no drops,
no duplicates, no partitions, no crashes. Producers add REPLICATE 3 RETRY 2
jobs on random nodes, consumers take them (polling and blocked GETJOB, so
federation moves jobs between nodes) and ACK each one on a random node, as
the clients of a Celery or Dramatiq deployment do. Checked per seed: no job is
delivered again after an ACKJOB for it was answered, and every acked job is gone
from every node at the end.

    SIM_SEED=7 .venv/bin/python -m pytest -q tests/sim/test_ack_final.py
"""

from __future__ import annotations

import random

import pytest

from tests.sim.net import Net, seeds, woken_jobs
from workers.effects import Effect

traffic_ms = 20_000
quiet_ms = 90_000  # room for requeues (RETRY 2 s) and the GC backoff
step_ms = 20


class AckSim:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed ^ 0xACC)
        self.net = Net(5, seed, delay_ms=(1, 40))
        self.acked_at: dict[str, int] = {}  # job id -> when its ACKJOB was answered
        self.late: list[str] = []  # deliveries after an answered ACK
        self.held: list[tuple[int, str]] = []  # (ack time, job id)
        self.blocked: dict[tuple[str, int], int] = {}
        self.added = 0
        self.net.watch = self._watch

    def _watch(self, node_id: str, effects: list[Effect]) -> None:
        for jid in woken_jobs(node_id, effects, self.blocked):
            self._delivered(node_id, jid)

    def _delivered(self, node: str, jid: str) -> None:
        if jid in self.acked_at:
            self.late.append(f"{jid} delivered on {node[:4]} {self.net.now - self.acked_at[jid]} ms "
                             "after its ACK was answered")
            return
        self.held.append((self.net.now + self.rng.randint(0, 300), jid))

    def step(self) -> None:
        net, rng = self.net, self.rng
        r = rng.random()
        node = rng.choice(net.ids)
        q = b"q%d" % rng.randint(0, 1)
        if r < 0.45:
            net.addjob(node, q, b"body", replicate=3, retry_s=2, timeout_ms=5000)
            self.added += 1
        elif r < 0.8:
            for e in net.take(node, q, count=rng.randint(1, 4)):
                self._delivered(node, e[1])
        else:
            tok = net.token()
            self.blocked[(node, tok)] = net.now + rng.randint(100, 2000)
            net.nodes[node].shard.op_block(tok, [q], rng.randint(1, 4), False, net.now)
            net.drain(node)

    def acks_due(self, everything: bool = False) -> None:
        keep = []
        for at, jid in self.held:
            if at > self.net.now and not everything:
                keep.append((at, jid))
                continue
            self.net.ack(self.rng.choice(self.net.ids), [jid])
            self.acked_at.setdefault(jid, self.net.now)
        self.held = keep

    def unblock_due(self, everything: bool = False) -> None:
        for (node, tok), until in list(self.blocked.items()):
            if everything or until <= self.net.now:
                del self.blocked[(node, tok)]
                self.net.nodes[node].shard.op_unblock(tok, self.net.now)

    def run(self) -> None:
        net = self.net
        end = net.now + traffic_ms
        while net.now < end:
            net.run(step_ms)
            self.step()
            self.acks_due()
            self.unblock_due()
        self.unblock_due(everything=True)
        end = net.now + quiet_ms
        while net.now < end:
            net.run(250)
            for node in net.ids:
                for q in (b"q0", b"q1"):
                    for e in net.take(node, q, count=100):
                        self._delivered(node, e[1])
            self.acks_due(everything=True)

    def check(self) -> None:
        assert not self.late, f"{len(self.late)} redeliveries after an answered ACK: {self.late[:5]}"
        left = [j for j in self.acked_at if self.net.holders(j)]
        assert not left, f"{len(left)} acked jobs still held, e.g. {left[0]} on {self.net.holders(left[0])}"
        self.net.check()


@pytest.mark.parametrize("seed", seeds("SIM_ACK_SEEDS", 20))
def test_no_redelivery_after_answered_ack(seed: int) -> None:
    sim = AckSim(seed)
    sim.run()
    assert sim.added and sim.acked_at, f"seed {seed}: no traffic"
    sim.check()
