"""The membership tick of a node alone: real ``ClusterBus`` instances in one event
loop (real listeners, real nodes.conf files). Alone (no other node, no link, no
cluster-seeds) the bus ticks once per ``alone_tick_ms``; a CLUSTER MEET ticks at
once, on the node met too (its inbound link wakes it: the MEET's handshake node
must not expire before its tick dials back), and the tick is back to its ping
rate while there is another node."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from bus import hostbus, nodes_conf
from bus.hostbus import ClusterBus
from disque_mp.node.config import Config
from tests.nodeproc import free_port

pytestmark = pytest.mark.integration

wait_s = 20.0  # generous: the machine is shared


def _bus(tmp: Path, name: str) -> ClusterBus:
    cfg = Config(port=free_port(), bind="127.0.0.1", cluster_config_file=str(tmp / f"{name}.conf"),
                 cluster_node_timeout=1000)
    nc, _ = nodes_conf.load_or_create(cfg.cluster_config_file, "127.0.0.1", cfg.port)
    return ClusterBus(cfg, nc.node_id, lambda *a: None, lambda v: None, 1, random.Random(name))


async def _until(cond: Any, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def test_alone_the_bus_ticks_seldom_and_a_meet_ticks_at_once(tmp_path: Path) -> None:
    async def run() -> None:
        a, b = _bus(tmp_path, "a"), _bus(tmp_path, "b")
        await a.start()
        await b.start()
        try:
            await _until(lambda: a.ticks >= 1 and b.ticks >= 1, "the first ticks")
            first_a, first_b = a.last_tick_ms, b.last_tick_ms
            await asyncio.sleep(0.5)
            assert a.ticks == 1  # alone: the next tick is a second away (not 5 at 100 ms)
            assert a.tick_wake is not None
            before, before_b = a.ticks, b.ticks
            a.meet("127.0.0.1", b.cfg.port)
            await _until(lambda: a.ticks > before, "the tick after MEET")
            assert a.last_tick_ms - first_a < hostbus.alone_tick_ms  # woken, not timed out
            await _until(lambda: b.ticks > before_b, "B's tick after the link in")
            assert b.last_tick_ms - first_b < hostbus.alone_tick_ms
            await _until(lambda: b.my_id in a.m.nodes and not a.m.nodes[b.my_id].handshake,
                         "the handshake")
            count = a.ticks
            await asyncio.sleep(0.5)
            assert a.ticks - count >= 3  # another node: ticks at its ping rate again
        finally:
            await a.close()
            await b.close()

    asyncio.run(run())
