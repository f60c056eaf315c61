"""The counts a drain waits for (INFO's queued_jobs and wait_repl_jobs, from
``Shard.info``), on a three-node cluster in one process (tests/sim/net.py)."""

from __future__ import annotations

from tests.sim.net import Net


def test_a_job_waits_for_its_copies_then_is_queued_on_its_creator_only() -> None:
    net = Net(3, seed=7)
    a, b, c = net.ids
    r = net.addjob(a, replicate=3)
    assert r[0] == "pending"
    info = net.nodes[a].shard.info()
    assert info["wait_repl_jobs"] == 1 and info["queued_jobs"] == 0
    net.run(10)
    net.reply(a, r)
    assert net.nodes[a].shard.info()["wait_repl_jobs"] == 0
    assert net.nodes[a].shard.info()["queued_jobs"] == 1
    for other in (b, c):  # a copy is held (active), not queued
        info = net.nodes[other].shard.info()
        assert info["registered_jobs"] == 1 and info["queued_jobs"] == 0
    net.check()
