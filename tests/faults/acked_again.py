"""Fault-free run on real nodes: is a job delivered again after its ACKJOB was answered?

    python -m tests.faults.acked_again [--nodes 5] [--clients 8] [--seconds 40] [--seed 1]

N nodes on loopback (2 workers each), no faults. Half the client threads loop on
ADDJOB (REPLICATE 3, RETRY 2) on a random node, the other half on GETJOB (TIMEOUT
500 COUNT 4) on a random node then ACKJOB of what it got on another random node
(consumers that wait on a drained node make federation move jobs between nodes). Then a drain (GETJOB NOHANG
+ ACKJOB on every node until nothing comes for 3 x RETRY + 2 s). Every call goes
into a fault-run history (tests/faults/history.py), and ``after_ack`` counts the
jobs a GETJOB returned after an ACKJOB naming them had been answered: with no
fault window, every one is unexplained. Prints one line of figures; exits 1 when
such a job was seen. The node directories are kept when it does (their logs).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis

from tests.faults.history import History, after_ack
from tests.nodeproc import NodeProc, form_cluster

retry_s = 2
getjob_timeout_ms = 500
form_timeout_s = 60.0
call_timeout_s = 10.0


def _client(hist: History, ports: list[int], k: int, seed: int, stop: threading.Event) -> None:
    rng = random.Random(seed * 1000 + k)
    conns = {p: redis.Redis(host="127.0.0.1", port=p, protocol=2, socket_timeout=call_timeout_s)
             for p in ports}
    seq = 0
    while not stop.is_set():
        seq += 1
        n = rng.randrange(len(ports))
        t0 = hist.now()
        if k % 2:  # odd clients only consume: queues drain, federation moves jobs
            take_and_ack(hist, conns, ports, rng, f"c{k}", ["TIMEOUT", getjob_timeout_ms], 4)
            continue
        try:
            jid = conns[ports[n]].execute_command("ADDJOB", "acked-again", f"c{k}:{seq}", 2000,
                                                  "REPLICATE", 3, "RETRY", retry_s)
            hist.record(f"c{k}", n, "enqueue", "ok", t0, v=f"c{k}:{seq}", id=jid.decode())
        except redis.RedisError as e:
            hist.record(f"c{k}", n, "enqueue", "info", t0, v=f"c{k}:{seq}", err=str(e)[:120])
    for c in conns.values():
        c.close()


def take_and_ack(hist: History, conns: dict[int, redis.Redis], ports: list[int],
                 rng: random.Random, who: str, block: list[Any], count: int,
                 node: int | None = None) -> int:
    """GETJOB on ``node`` (random when None), ACKJOB on another random node; jobs got."""
    n = rng.randrange(len(ports)) if node is None else node
    t0 = hist.now()
    try:
        reply = conns[ports[n]].execute_command("GETJOB", *block, "COUNT", count,
                                                "FROM", "acked-again")
    except redis.RedisError as e:
        hist.record(who, n, "dequeue", "info", t0, err=str(e)[:120])
        return 0
    jobs = [[body.decode(), jid.decode()] for _q, jid, body in reply or []]
    hist.record(who, n, "dequeue", "ok", t0, v=jobs)
    if not jobs:
        return 0
    m = rng.choice([i for i in range(len(ports)) if i != n])
    t0 = hist.now()
    ids = [j for _v, j in jobs]
    try:
        conns[ports[m]].execute_command("ACKJOB", *ids)
        hist.record(who, m, "ack", "ok", t0, ids=ids)
    except redis.RedisError as e:
        hist.record(who, m, "ack", "info", t0, ids=ids, err=str(e)[:120])
    return len(jobs)


def _drain(hist: History, ports: list[int], seed: int, quiet_s: float, max_s: float) -> None:
    rng = random.Random(seed)
    conns = {p: redis.Redis(host="127.0.0.1", port=p, protocol=2, socket_timeout=call_timeout_s)
             for p in ports}
    deadline = time.monotonic() + max_s
    last = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - last < quiet_s:
        got = sum(take_and_ack(hist, conns, ports, rng, "drain", ["NOHANG"], 100, node=i)
                  for i in range(len(ports)))
        if got:
            last = time.monotonic()
        else:
            time.sleep(0.2)
    for c in conns.values():
        c.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=5)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="disque-mp-acked-again-"))
    nodes = [NodeProc(work / f"n{i}", workers=2, conf={"cluster-node-timeout": 5000})
             for i in range(args.nodes)]
    hist = History()
    try:
        for n in nodes:
            n.start(wait=False)
        for n in nodes:
            n.wait_ready()
        form_cluster(nodes, form_timeout_s)
        ports = [n.port for n in nodes]
        stop = threading.Event()
        threads = [threading.Thread(target=_client, args=(hist, ports, k, args.seed, stop),
                                    daemon=True) for k in range(args.clients)]
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        stop.set()
        for t in threads:
            t.join(call_timeout_s * 3)
        _drain(hist, ports, args.seed, 3 * retry_s + 2.0, 120.0)
    finally:
        for n in nodes:
            n.stop()
    res = after_ack(hist.ops, [])
    added = sum(1 for op in hist.ops if op["f"] == "enqueue" and op["type"] == "ok")
    acked = {j for op in hist.ops if op["f"] == "ack" and op["type"] == "ok" for j in op["ids"]}
    print(f"acked-again: {args.nodes} nodes, {args.clients} clients, {args.seconds:.0f} s, "
          f"seed {args.seed}: {added} jobs added, {len(acked)} acked, {res['jobs']} delivered "
          f"again after an answered ACK {res['unexplained'][:5]}", flush=True)
    if res["jobs"]:
        print(f"node dirs kept in {work}", flush=True)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
