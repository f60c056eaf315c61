"""Cluster bus throughput: job messages between two hosts, one process each.

    .venv/bin/python -m bench.bus_bench [--messages N] [--body BYTES] [--from-worker K] [--relay]
                                        [--secret]

Host B runs in a child process (worker 0 only, its own uvloop); host A sends N
REPLJOB-shaped frames (small meta + one body) to B and B counts them at the slot
owner. ``--from-worker 1`` sends from A's worker 1 on its own data link
(bus/datalink.py); add ``--relay`` to send through A's worker 0 instead.
``--secret`` gives both hosts a cluster secret (authenticated links, a MAC per
write). Prints messages/s, best of 3 rounds. B counts messages from members
only, so A waits until B has finished its side of the MEET.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

from bus import nodes_conf
from disque_mp.node.commands import cluster as cmd_cluster
from disque_mp.node.config import Config
from tests.nodeproc import free_port

rounds = 3


def _cfg(tmp: str, name: str, port: int, workers: int, secret: bool) -> Config:
    path = Path(tmp) / "cluster.secret"
    if secret:
        path.write_text("the secret of the bus benchmark\n")
    return Config(port=port, bind="127.0.0.1", workers=workers,
                  cluster_config_file=str(Path(tmp) / f"{name}.conf"), cluster_node_timeout=15000,
                  cluster_secret_file=str(path) if secret else "")


def host_b(tmp: str, port: int, expect: int, ready: Any, done: Any, secret: bool) -> None:
    async def main() -> None:
        cfg = _cfg(tmp, "b", port, 1, secret)
        nc, _ = nodes_conf.load_or_create(cfg.cluster_config_file, "127.0.0.1", port)
        count = 0
        loop = asyncio.get_running_loop()
        finished = loop.create_future()

        def on_message(*_msg: Any) -> None:
            nonlocal count
            count += 1
            if count % expect == 0:
                done.put(count)
            if count >= expect * rounds and not finished.done():
                finished.set_result(None)

        agent = cmd_cluster.make_agent(cfg, 0, nc.node_id, 1, on_message)
        await agent.start()
        ready.put(nc.node_id)
        assert agent.bus is not None
        while not any(not n.handshake for n in agent.bus.m.others()):
            await asyncio.sleep(0.01)
        ready.put("A is a member")
        await finished
        await asyncio.sleep(0.5)
        await agent.close()

    uvloop.run(main())


async def host_a(tmp: str, b_port: int, b_id: str, n: int, body: bytes, from_worker: int,
                 relay: bool, ready: Any, done: Any, secret: bool) -> list[float]:
    cfg = _cfg(tmp, "a", free_port(), 2, secret)
    nc, _ = nodes_conf.load_or_create(cfg.cluster_config_file, "127.0.0.1", cfg.port)
    agents = [cmd_cluster.make_agent(cfg, i, nc.node_id, 2, lambda *m: None) for i in range(2)]
    for agent in agents:
        await agent.start()
    sender = agents[from_worker]
    fut = asyncio.get_running_loop().create_future()
    sender.command([b"MEET", b"127.0.0.1", str(b_port).encode()], fut.set_result)
    await fut
    assert agents[0].bus is not None
    while b_id not in agents[0].bus.m.nodes or agents[0].bus.m.nodes[b_id].handshake:
        await asyncio.sleep(0.01)
    await asyncio.get_running_loop().run_in_executor(None, ready.get)  # B knows A too
    if sender.data_out is not None and not relay:  # let worker k's own data link come up
        while sender.data_out.usable(b_id) is None:
            await asyncio.sleep(0.01)
    elif sender.data_out is not None:
        sender.data_out.closing = True  # --relay: measure the path through worker 0
    rates = []
    loop = asyncio.get_running_loop()
    for _ in range(rounds):
        t0 = time.perf_counter()
        for i in range(n):
            sender.send(b_id, "REPLJOB", i & 16383, {"q": "queue", "ttl": 86400}, [body])
            if i % 256 == 255:
                await asyncio.sleep(0)  # let the loop write, as a busy worker would
        await loop.run_in_executor(None, done.get)
        rates.append(n / (time.perf_counter() - t0))
    for agent in reversed(agents):
        await agent.close()
    return rates


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--body", type=int, default=100)
    ap.add_argument("--from-worker", type=int, default=0, choices=(0, 1))
    ap.add_argument("--relay", action="store_true", help="worker 1 without its data link")
    ap.add_argument("--secret", action="store_true", help="both hosts with a cluster secret")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ctx = multiprocessing.get_context("fork")
        ready, done = ctx.Queue(), ctx.Queue()
        b_port = free_port()
        proc = ctx.Process(target=host_b,
                           args=(tmp, b_port, args.messages, ready, done, args.secret))
        proc.start()
        b_id = ready.get(timeout=30)
        rates = uvloop.run(host_a(tmp, b_port, b_id, args.messages, b"x" * args.body,
                                  args.from_worker, args.relay, ready, done, args.secret))
        proc.join(timeout=30)
    path = " via worker 0" if args.relay and args.from_worker else ""
    path += " with a cluster secret" if args.secret else ""
    print(f"bus: {args.messages} messages of {args.body} B from worker {args.from_worker}{path}: "
          f"best {max(rates):,.0f} msg/s (rounds: {', '.join(f'{r:,.0f}' for r in rates)})")


if __name__ == "__main__":
    main()
