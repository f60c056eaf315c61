"""What a queue owned by another worker costs: connections pinned by worker.

The kernel spreads connections over the workers (SO_REUSEPORT), so a client
cannot choose its worker. This benchmark finds out from outside: the node's
side of each connection is a socket inode in /proc/net/tcp, and the worker
holding it has that inode among its /proc/<pid>/fd links. It keeps only
connections held by the wanted worker, then sends pipelined ADDJOB to one
queue from all of them for a fixed time:

    local    connections held by the queue's owner
    remote   connections held by the other worker (the node may forward each
             command, or hand the socket to the owner after a few commands)
    mixed    remote connections whose commands alternate between a queue of
             each worker, so that handing the socket over cannot help

The cost is ``1 - remote/local`` (and ``1 - mixed/local``). Needs /proc and a
node on this machine.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.loadgen import Conn, connect_to, encode
from workers.ids import owner_of_queue

connect_attempts_max = 400  # connections opened to find enough on one worker
conns_wanted = 8  # connections per run (the kernel's spread gives about half each)
find_socket_s_max = 2.0  # /proc may lag the accept by a moment
rounds = 5  # interleaved rounds per kind; the median counts (load from elsewhere comes in bursts)
reply_grace_s = 30.0  # longest wait for the last batch's replies after the run's end
probe_commands = 64  # one-queue commands sent to provoke a handoff (the node's streak is 16)


def tcp_inode(local_port: int, remote_port: int) -> int | None:
    """Inode of the node-side socket (local = node port, remote = our client port)."""
    want_l, want_r = f":{local_port:04X}", f":{remote_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[1].endswith(want_l) and f[2].endswith(want_r):
            return int(f[9])
    return None


def holder_of(inode: int, pids: list[int]) -> int | None:
    link = f"socket:[{inode}]"
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == link:
                    return pid
            except OSError:
                continue
    return None


async def held_by(port: int, conn: Conn, pids: list[int]) -> int | None:
    assert conn.transport is not None
    client_port = conn.transport.get_extra_info("sockname")[1]
    deadline = time.monotonic() + find_socket_s_max
    while time.monotonic() < deadline:
        inode = tcp_inode(port, client_port)
        pid = holder_of(inode, pids) if inode else None
        if pid is not None:
            return pid
        await asyncio.sleep(0.01)
    return None


async def pinned(port: int, pid: int, pids: list[int], n: int) -> list[Conn]:
    """``n`` connections whose node side lives in worker ``pid``."""
    keep: list[Conn] = []
    for _ in range(connect_attempts_max):
        if len(keep) >= n:
            break
        conn = await connect_to("127.0.0.1", port)
        if await held_by(port, conn, pids) == pid:
            keep.append(conn)
        else:
            conn.close()
    if len(keep) < n:
        raise RuntimeError(f"found only {len(keep)} of {n} connections on worker pid {pid}")
    return keep


async def drive(conns: list[Conn], queues: list[bytes], pipeline: int, seconds: float) -> float:
    """Pipelined ADDJOB for ``seconds``, jobs/s. Commands cycle through ``queues``
    across batches too, so that -P 1 alternates as well."""
    cmds = [encode(b"ADDJOB", q, b"x", b"0") for q in queues]
    payloads = [b"".join(cmds[(start + i) % len(cmds)] for i in range(pipeline))
                for start in range(len(cmds))]
    end = time.monotonic() + seconds
    done = 0

    async def one(conn: Conn) -> None:
        nonlocal done
        batch = 0
        while time.monotonic() < end:
            replies, _, _ = await conn.call(payloads[batch % len(payloads)], pipeline)
            batch += pipeline
            bad = [r for r in replies if not isinstance(r, bytes)]
            if bad:
                raise RuntimeError(f"ADDJOB failed: {bad[0]!r}")
            done += pipeline

    t0 = time.monotonic()
    # a silent node must not hang the benchmark: replies are due long before this
    await asyncio.wait_for(asyncio.gather(*[one(c) for c in conns]), seconds + reply_grace_s)
    return done / (time.monotonic() - t0)


def queue_of_owner(owner: int, workers: int, prefix: str) -> bytes:
    for i in range(10_000):
        name = f"{prefix}{i}".encode()
        if owner_of_queue(name, workers) == owner:
            return name
    raise RuntimeError("no queue name found for that owner")


async def where_queue_lives(port: int, queue: bytes, pids: list[int]) -> int | None:
    """The pid of ``queue``'s owner: a connection sending only that queue's commands,
    one at a time, is handed to the owner. None if no connection ever moves (a node
    without handoff), seen from connections that started on every worker."""
    started_on: set[int] = set()
    for _ in range(connect_attempts_max // 10):
        conn = await connect_to("127.0.0.1", port)
        try:
            first = await held_by(port, conn, pids)
            for _ in range(probe_commands):
                await asyncio.wait_for(conn.call(encode(b"QLEN", queue), 1), reply_grace_s)
            await asyncio.sleep(0.05)
            now = await held_by(port, conn, pids)
        finally:
            conn.close()
        if first is not None and now is not None and now != first:
            return now
        if first is not None:
            started_on.add(first)
        if started_on >= set(pids):
            return None
    return None


async def measure(port: int, pids: list[int], owner_pid: int, other_pid: int, workers: int,
                  owner_index: int, pipeline: int, seconds: float) -> dict[str, Any]:
    """Interleaved rounds (local, remote, mixed, local, ...) with fresh connections each
    time (a remote one may have been handed over); the median round of each kind counts,
    so that a burst of load from elsewhere does not land on one kind only."""
    qa = queue_of_owner(owner_index, workers, "xw-local-")
    qb = queue_of_owner(1 - owner_index, workers, "xw-other-")
    out: dict[str, Any] = {"pipeline": pipeline, "seconds": seconds, "conns": conns_wanted,
                           "rounds": rounds}
    kinds = (("local", owner_pid, [qa]), ("remote", other_pid, [qa]), ("mixed", other_pid, [qa, qb]))
    for _ in range(rounds):
        for label, pid, queues in kinds:
            conns = await pinned(port, pid, pids, conns_wanted)
            try:
                rate = await drive(conns, queues, pipeline, seconds / rounds)
                out.setdefault(f"{label}_rounds", []).append(round(rate, 1))
                out[f"{label}_after_pid"] = [await held_by(port, c, pids) for c in conns]
            finally:
                for c in conns:
                    c.close()
    for label, _, _ in kinds:
        out[label] = statistics.median(out[f"{label}_rounds"])
    out["remote_cost_pct"] = 100 * (1 - out["remote"] / out["local"])
    out["mixed_cost_pct"] = 100 * (1 - out["mixed"] / out["local"])
    return out


def run(port: int, supervisor_pid: int, pipeline: int = 32, seconds: float = 5.0) -> dict[str, Any]:
    """Measure local / remote / mixed ADDJOB throughput on a 2-worker node."""
    import uvloop

    from bench.redisq import children_of

    pids = children_of(supervisor_pid)
    if len(pids) != 2:
        raise RuntimeError(f"expected a 2-worker node, found worker pids {pids}")

    async def go() -> dict[str, Any]:
        qa = queue_of_owner(0, 2, "xw-local-")
        owner = await where_queue_lives(port, qa, pids)
        guessed = owner is None
        owner = owner if owner is not None else pids[0]  # worker 0 is forked first
        other = pids[1] if owner == pids[0] else pids[0]
        out = await measure(port, pids, owner, other, 2, 0, pipeline, seconds)
        out["owner_pid_guessed"] = guessed
        out["detail"] = (f"ADDJOB -P {pipeline}, {conns_wanted} conns: local {out['local']:,.0f}, "
                         f"remote {out['remote']:,.0f}, mixed 2 owners {out['mixed']:,.0f} jobs/s")
        out["cost_pct"] = out["remote_cost_pct"]
        return out

    return uvloop.run(go())
