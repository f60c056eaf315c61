"""Seeded simulation of a Disque cluster (TigerBeetle's VOPR, in small).

Each run: 3-5 nodes (tests/sim/net.py), producers and consumers on random
nodes, DEADLETTER and REDRIVE on random nodes (consumers take from the dead-letter
queues too), a network with delays, drops, duplicates and partitions, nodes that
crash (losing everything) and restart; then a quiet phase (faults healed,
consumers draining every node). Checked over many seeds:

1. every job whose synchronous ADDJOB succeeded with REPLICATE R and RETRY > 0
   is delivered at least once if at most R-1 of the nodes holding it when
   ADDJOB returned crashed before it was delivered;
2. every job a client acknowledged is eventually gone from every node (for an
   at-most-once job: if no node crashed during its life, see ``check``);
3. a RETRY 0 (at-most-once) job is never delivered twice;
and every shard's internal invariants hold at the end.

A failure names its seed. Rerun one seed:
    SIM_SEED=1234 .venv/bin/python -m pytest -q tests/sim/test_sim.py
More seeds: SIM_SEEDS=1000 (default 100, about 20 s).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from tests.sim.net import Net, seeds, woken_jobs
from workers.effects import Effect, Wake
from workers.replies import Status

chaos_ms = 30_000  # phase 1: traffic and faults
quiet_ms = 150_000  # phase 2: room for requeues (RETRY <= 3 s) and GC backoff (<= 60 s)
action_every_ms = 50
poll_every_ms = 250


@dataclass
class JobInfo:
    repl: int
    retry_s: int
    holders: set[str] = field(default_factory=set)
    crashed_holders: int = 0
    acked: bool = False
    created_ms: int = 0
    sync: bool = True  # ASYNC jobs have no replication guarantee (property 1 skips them)


class Sim:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed ^ 0x5EED)
        self.net = Net(self.rng.randint(3, 5), seed, delay_ms=(1, 40), drop=0.05, dup=0.05)
        self.jobs: dict[str, JobInfo] = {}
        # Counted apart from ``jobs``: a waiter can get a job before ADDJOB returns.
        self.deliveries: dict[str, int] = {}
        # (node, token) -> (R, retry, crashes so far) of ADDJOBs waiting for replication
        self.pending: dict[tuple[str, int], tuple[int, int, int]] = {}
        self.crashes = 0
        self.down: dict[str, int] = {}  # crashed node -> restart time
        self.last_crash_ms = 0
        self.leaving: set[str] = set()
        self.heal_at = 0
        self.held: list[tuple[int, str, str]] = []  # (ack time, node, job id) consumers hold
        self.blocked: dict[tuple[str, int], int] = {}  # blocked GETJOB -> give-up time
        self.ack_p = 0.8
        self.net.watch = self._watch

    def _watch(self, node_id: str, effects: list[Effect]) -> None:
        """See ADDJOB replies as they are produced, to record the holders then."""
        for eff in effects:  # ADDJOB replies first: a waiter may be served before
            if type(eff) is Wake and (node_id, eff.token) in self.pending:
                self._addjob_done(node_id, eff.token, eff.reply)
        for jid in woken_jobs(node_id, effects, self.blocked):
            self._delivered(node_id, jid)

    def _addjob_done(self, node: str, token: int, reply: object) -> None:
        repl, retry, crashes = self.pending.pop((node, token))
        if isinstance(reply, Status):
            info = JobInfo(repl, retry, created_ms=self.net.now)
            info.holders = set(self.net.holders(str(reply)))
            # A node that confirmed and crashed before the reply is not among the
            # holders seen now: count every crash during the wait as a lost holder.
            info.crashed_holders = self.crashes - crashes
            self.jobs[str(reply)] = info

    # ------------------------------------------------------------------ actions

    def alive(self) -> list[str]:
        return [n for n in self.net.ids if self.net.nodes[n].alive]

    def consumers(self) -> list[str]:
        """Nodes a client can block on (a leaving node answers -LEAVING)."""
        return [n for n in self.alive() if n not in self.leaving] or self.alive()

    def produce(self) -> None:
        node = self.rng.choice(self.alive())
        if self.rng.random() < 0.2:
            repl, retry = 1, 0
        else:
            repl, retry = self.rng.randint(1, 3), self.rng.randint(1, 3)
        async_ = self.rng.random() < 0.1
        delay = self.rng.randint(1, 2) if retry and self.rng.random() < 0.2 else 0
        r = self.net.addjob(node, b"q%d" % self.rng.randint(0, 1), b"body",
                            replicate=repl, retry_s=retry, ttl_s=3600, timeout_ms=1000,
                            async_=async_, delay_s=delay)
        if isinstance(r, tuple):
            self.pending[(node, r[1])] = (repl, retry, self.crashes)
        elif isinstance(r, Status):
            self.jobs[str(r)] = JobInfo(repl, retry, set(self.net.holders(str(r))),
                                        created_ms=self.net.now, sync=not async_)

    def consume(self, node: str) -> None:
        for q in (b"q0", b"q1", b"dead:q0", b"dead:q1"):
            for e in self.net.take(node, q, count=self.rng.randint(1, 3)):
                self._delivered(node, e[1])

    def dead_letters(self) -> None:
        """DEADLETTER of a job this run made, or REDRIVE of a dead-letter queue, on
        a random node (the copies follow through the faulty network)."""
        node = self.rng.choice(self.alive())
        shard = self.net.nodes[node].shard
        if self.jobs and self.rng.random() < 0.6:
            jid = self.rng.choice(list(self.jobs))
            shard.op_deadletter([jid], b"sim %d" % self.rng.randint(0, 9), self.net.now)
        else:
            q = b"dead:q%d" % self.rng.randint(0, 1)
            shard.op_redrive(q, self.rng.randint(1, 3), self.net.now)
        self.net.drain(node)

    def block(self) -> None:
        """A blocked GETJOB (this is what makes nodes send NEEDJOBS)."""
        node = self.rng.choice(self.consumers())
        tok = self.net.token()
        self.blocked[(node, tok)] = self.net.now + self.rng.randint(200, 3000)
        q = b"q%d" % self.rng.randint(0, 1)
        self.net.nodes[node].shard.op_block(tok, [q], self.rng.randint(1, 3), False, self.net.now)
        self.net.drain(node)

    def unblock_due(self) -> None:
        for (node, tok), until in list(self.blocked.items()):
            if until <= self.net.now:
                del self.blocked[(node, tok)]
                if self.net.nodes[node].alive:
                    self.net.nodes[node].shard.op_unblock(tok, self.net.now)

    def _delivered(self, node: str, jid: str) -> None:
        self.deliveries[jid] = self.deliveries.get(jid, 0) + 1
        if self.rng.random() < self.ack_p:
            at = self.net.now + self.rng.randint(0, 2000)
            where = node if self.rng.random() < 0.7 else self.rng.choice(self.net.ids)
            self.held.append((at, where, jid))

    def acks_due(self) -> None:
        keep = []
        for at, node, jid in self.held:
            if at > self.net.now:
                keep.append((at, node, jid))
                continue
            if not self.net.nodes[node].alive:
                node = self.rng.choice(self.alive())
            known = self.net.ack(node, [jid])
            info = self.jobs.get(jid)
            # An ACK counts when the node knew the job, or as a dummy ACK (at-least-once
            # IDs only: an at-most-once ACK sent to a node without the job is lost).
            if info is not None and (known or info.retry_s):
                info.acked = True
        self.held = keep

    def fault(self) -> None:
        net, r = self.net, self.rng.random()
        alive = self.alive()
        if r < 0.3 and len(alive) > 2:
            victim = self.rng.choice(alive)
            self.crash(victim)
        elif r < 0.6 and not net.cut:
            group = set(self.rng.sample(net.ids, self.rng.randint(1, len(net.ids) - 1)))
            net.partition(group)
            self.heal_at = net.now + self.rng.randint(500, 4000)
        elif r < 0.75:
            # CLUSTER LEAVING yes on one node, or no again (at most one leaves).
            if self.leaving:
                self.leaving.clear()
            else:
                self.leaving.add(self.rng.choice(alive))
            net.refresh_views(self.leaving)
        elif r < 0.85:
            # PAUSE q <state> bcast from some node (lifted in the quiet phase).
            node = self.rng.choice(alive)
            state = self.rng.choice(["in", "out", "all", "none", "none"])
            net.nodes[node].shard.op_pause(b"q%d" % self.rng.randint(0, 1), [state, "bcast"],
                                           net.now)
            net.drain(node)
        if self.rng.random() < 0.7:
            net.refresh_views(self.leaving)  # failure detection caught up (or not yet)

    def crash(self, node: str) -> None:
        self.net.crash(node)
        self.last_crash_ms = self.net.now
        self.crashes += 1
        self.down[node] = self.net.now + self.rng.randint(500, 5000)
        for jid, info in self.jobs.items():
            if node in info.holders and not self.deliveries.get(jid):
                info.crashed_holders += 1

    def recover(self, everything: bool = False) -> None:
        net = self.net
        changed = False
        for node, at in list(self.down.items()):
            if everything or at <= net.now:
                net.restart(node)
                del self.down[node]
                changed = True
        if net.cut and (everything or self.heal_at <= net.now):
            net.heal()
            changed = True
        if everything:
            self.leaving.clear()
        if changed or everything:
            net.refresh_views(self.leaving)

    # ------------------------------------------------------------------ run

    def run(self) -> None:
        net = self.net
        end = net.now + chaos_ms
        while net.now < end:
            net.run(action_every_ms)
            r = self.rng.random()
            if r < 0.5:
                self.produce()
            elif r < 0.8:
                self.consume(self.rng.choice(self.alive()))
            elif r < 0.9:
                self.block()
            elif r < 0.93:
                self.fault()
            elif r < 0.95:
                self.dead_letters()
            self.acks_due()
            self.unblock_due()
            self.recover()
        net.check()  # invariants mid-run too, with messages still in flight
        for node, tok in list(self.blocked):
            if net.nodes[node].alive:
                net.nodes[node].shard.op_unblock(tok, net.now)  # the consumers go away
        self.blocked.clear()
        self.recover(everything=True)
        self.ack_p = 1.0
        net.drop = net.dup = 0.0
        net.run(100)  # PAUSE bcasts still in flight land first (max delay 40 ms)
        for node in net.ids:
            for q in (b"q0", b"q1"):
                net.nodes[node].shard.op_pause(q, ["none"], net.now)
        end = net.now + quiet_ms
        while net.now < end:
            net.run(poll_every_ms)
            for node in net.ids:
                self.consume(node)
            self.acks_due()
        net.run(1000)

    def check(self) -> None:
        net = self.net
        for jid, info in self.jobs.items():
            deliveries = self.deliveries.get(jid, 0)
            if info.sync and info.retry_s and info.crashed_holders <= info.repl - 1:
                assert deliveries >= 1, (
                    f"job {jid} (REPLICATE {info.repl}, {info.crashed_holders} holders "
                    f"crashed) never delivered")
            if not info.retry_s:
                assert deliveries <= 1, f"at-most-once job {jid} delivered {deliveries} times"
            # A crash can lose an ACK being collected, or the only node that knew where
            # a job moved (federation): an at-least-once copy left elsewhere is then
            # delivered and acked again, but an at-most-once copy is never queued
            # again and stays until its TTL (as in Disque).
            if info.acked and (info.retry_s or info.created_ms > self.last_crash_ms):
                assert not net.holders(jid), f"acked job {jid} still on {net.holders(jid)}"
        net.check()


def run_seed(sim: Sim, test_file: str) -> None:
    """Run and check one seeded simulation; a failure names its seed and how to rerun it."""
    try:
        sim.run()
        sim.check()
    except AssertionError as e:
        raise AssertionError(
            f"simulation seed {sim.seed} failed: {e}\n"
            f"rerun: SIM_SEED={sim.seed} .venv/bin/python -m pytest -q {test_file}"
        ) from e


@pytest.mark.parametrize("seed", seeds("SIM_SEEDS", 100))
def test_sim(seed: int) -> None:
    sim = Sim(seed)
    run_seed(sim, "tests/sim/test_sim.py")
    assert sim.jobs, f"seed {seed}: no job was ever added"
