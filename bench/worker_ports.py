"""Worker ports: does sending each job command to its owner's port pay?

    python -m bench.worker_ports [--procs 4] [--seconds 10] [--rounds 3] [--pipeline 100]
                                 [--queues 10000] [--workers 2] [--json out.json]

One node (``--workers``, ``worker-ports-base`` set) on free ports. Each round runs
``--procs`` client processes for ``--seconds``, each a ``disque_mp.client.Disque``
sending pipelined ``add_jobs`` (``--pipeline`` ADDJOBs per call) over ``--queues``
random queue names, once with ``route_to_owner=False`` (the main port: a command
for another worker's queue takes the mesh hop, or the socket is handed off) and
once with ``route_to_owner=True`` (one connection per worker port, no hop); the
sides alternate and the node is flushed between runs. Printed per run: jobs/s,
node CPU per job (utime + stime of the workers from /proc/<pid>/stat over the
window) and the commands the workers forwarded (INFO workers ``forwarded=``).
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from bench.redisq import children_of
from bench.scaling import cpu_s

start_timeout_s = 20.0
join_timeout_s = 60.0  # a client process past its window (one add_jobs call in flight)


def _client(port: int, route: bool, queues: int, pipeline: int, seconds: float,
            go: Any, out: Any, seed: int) -> None:
    """One client process: connect, wait for ``go``, add jobs for ``seconds``."""
    from disque_mp.client import Disque

    rng = random.Random(seed)
    names = [f"q:{i}" for i in range(queues)]
    body = b"x" * 16
    d = Disque([f"127.0.0.1:{port}"], socket_timeout=60, route_to_owner=route)
    d.ping()
    routed = d.routes is not None
    go.wait()
    done = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        d.add_jobs([(rng.choice(names), body) for _ in range(pipeline)])
        done += pipeline
    d.close()
    out.put((done, routed))


def _forwarded(r: redis.Redis) -> int:
    text = r.execute_command("INFO", "workers").decode()
    return sum(int(line.split("forwarded=")[1].split(",")[0]) for line in text.splitlines()
               if line.startswith("worker") and "forwarded=" in line)


def run_side(port: int, pids: list[int], r: redis.Redis, route: bool,
             args: argparse.Namespace) -> dict[str, Any]:
    ctx = multiprocessing.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_client, args=(port, route, args.queues, args.pipeline,
                                               args.seconds, go, out, random.randrange(1 << 30)))
             for _ in range(args.procs)]
    for p in procs:
        p.start()
    time.sleep(0.5)  # let every client connect (and read INFO workers) before the window
    fwd0 = _forwarded(r)
    cpu0 = sum(cpu_s(p) for p in pids)
    t0 = time.monotonic()
    go.set()
    results = [out.get(timeout=args.seconds + join_timeout_s) for _ in procs]
    elapsed = time.monotonic() - t0
    cpu = sum(cpu_s(p) for p in pids) - cpu0
    fwd = _forwarded(r) - fwd0
    for p in procs:
        p.join(timeout=join_timeout_s)
    jobs = sum(n for n, _ in results)
    return {"route_to_owner": route, "routed_clients": sum(1 for _, x in results if x),
            "jobs": jobs, "seconds": elapsed, "jobs_per_s": jobs / elapsed,
            "node_cpu_us_per_job": cpu / jobs * 1e6 if jobs else 0.0,
            "forwarded_per_job": fwd / jobs if jobs else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pipeline", type=int, default=100)
    ap.add_argument("--queues", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    from tests.nodeproc import NodeProc, free_port, port_free

    port = free_port()
    while True:
        base = free_port()
        ports = range(base, base + args.workers)
        if port not in ports and port + 10000 not in ports and all(port_free(p) for p in ports):
            break
    with tempfile.TemporaryDirectory() as tmp:
        node = NodeProc(Path(tmp), workers=args.workers, port=port,
                        conf={"loglevel": "warning", "maxmemory": "8gb",
                              "worker-ports-base": base})
        with node:
            assert node.proc is not None
            pids: list[int] = []
            deadline = time.monotonic() + start_timeout_s
            while len(pids) < args.workers and time.monotonic() < deadline:
                pids = children_of(node.proc.pid)
                time.sleep(0.05)
            r = redis.Redis(host="127.0.0.1", port=port, protocol=2, socket_timeout=60)
            r.response_callbacks.pop("INFO", None)
            runs: list[dict[str, Any]] = []
            for i in range(args.rounds):
                for route in ((False, True) if i % 2 == 0 else (True, False)):
                    r.execute_command("DEBUG", "FLUSHALL")
                    res = run_side(port, pids, r, route, args)
                    runs.append(res)
                    print(f"round {i + 1} route_to_owner={str(route):5}: "
                          f"{res['jobs_per_s']:9,.0f} jobs/s, "
                          f"{res['node_cpu_us_per_job']:6.2f} us node CPU/job, "
                          f"forwarded {res['forwarded_per_job']:.2f}/job "
                          f"({res['routed_clients']}/{args.procs} clients routed)", flush=True)
            r.close()
    print(f"\n{args.procs} client processes, {args.workers} workers, pipeline {args.pipeline}, "
          f"{args.queues} queues, {args.rounds} rounds of {args.seconds:g} s (medians):")
    summary = {}
    for route in (False, True):
        side = [x for x in runs if x["route_to_owner"] is route]
        jps = statistics.median(x["jobs_per_s"] for x in side)
        cpu = statistics.median(x["node_cpu_us_per_job"] for x in side)
        summary[str(route)] = {"jobs_per_s": jps, "node_cpu_us_per_job": cpu}
        print(f"  route_to_owner={str(route):5}: {jps:9,.0f} jobs/s, {cpu:6.2f} us node CPU/job")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs,
                                               "summary": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
