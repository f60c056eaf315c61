"""Where replicated latency goes: disque-mp and the C Disque, 3-node clusters on loopback.

    python -m bench.peers_probe [--rounds 2] [--jobs 300] [--workers 1]

Two probes per cluster, each on the first node with redis-py, rounds alternating the sides:

- ``steps``: one client, per job ADDJOB ... REPLICATE 3, then GETJOB, then ACKJOB, each
  round trip timed apart (medians, microseconds).
- ``blocked``: a consumer thread blocked in GETJOB; the producer sends one ADDJOB
  (REPLICATE 3, then REPLICATE 1) and waits for the delivery before the next one:
  add-to-delivery p50 / p99 (microseconds).

The gap between REPLICATE 3 and REPLICATE 1 on each side is what the replication round
trip costs (REPLJOB to two nodes, their GOTJOB back, the wake of the waiting reply).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis

from bench import peers_servers as srv

deliver_timeout_ms = 5000  # a blocked GETJOB; a job is normally there within milliseconds
gap_s = 0.002  # between two probe jobs, so each is alone in flight


def steps(port: int, jobs: int) -> dict[str, float]:
    r = redis.Redis(port=port, protocol=2, socket_timeout=30)
    t: dict[str, list[int]] = {"addjob_r3": [], "getjob": [], "ackjob": []}
    try:
        for _ in range(jobs):
            a = time.perf_counter_ns()
            r.execute_command("ADDJOB", "probe-steps", "x", 0, "REPLICATE", 3)
            b = time.perf_counter_ns()
            job = r.execute_command("GETJOB", "TIMEOUT", deliver_timeout_ms, "FROM", "probe-steps")
            c = time.perf_counter_ns()
            r.execute_command("ACKJOB", job[0][1])
            t["addjob_r3"].append(b - a)
            t["getjob"].append(c - b)
            t["ackjob"].append(time.perf_counter_ns() - c)
    finally:
        r.close()
    return {k: sorted(v)[len(v) // 2] / 1e3 for k, v in t.items()}


def blocked(port: int, replicate: int, jobs: int) -> dict[str, float]:
    q = f"probe-blocked-{replicate}"
    got: list[int] = []

    def consumer() -> None:
        c = redis.Redis(port=port, protocol=2, socket_timeout=30)
        try:
            for _ in range(jobs):
                job = c.execute_command("GETJOB", "TIMEOUT", deliver_timeout_ms, "FROM", q)
                if not job:
                    return
                got.append(time.perf_counter_ns())
                c.execute_command("ACKJOB", job[0][1])
        finally:
            c.close()

    th = threading.Thread(target=consumer)
    th.start()
    p = redis.Redis(port=port, protocol=2, socket_timeout=30)
    sent: list[int] = []
    try:
        for i in range(jobs):
            time.sleep(gap_s)
            sent.append(time.perf_counter_ns())
            p.execute_command("ADDJOB", q, "x", 0, "REPLICATE", replicate)
            deadline = time.monotonic() + deliver_timeout_ms / 1000
            while len(got) <= i and th.is_alive() and time.monotonic() < deadline:
                time.sleep(0.0002)
    finally:
        th.join(deliver_timeout_ms / 1000 + 5)
        p.close()
    lat = sorted(g - s for g, s in zip(got, sent, strict=False))
    if not lat:
        return {"p50_us": float("nan"), "p99_us": float("nan"), "delivered": 0}
    return {"p50_us": lat[len(lat) // 2] / 1e3, "p99_us": lat[int(len(lat) * 0.99)] / 1e3,
            "delivered": len(lat)}


def run(rounds: int, jobs: int, workers: int) -> list[dict[str, Any]]:
    from bench.scaling import reference_binary

    binary, status = reference_binary()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="disque-mp-probe-", dir=srv.scratch_root()) as tmp:
        work = Path(tmp)
        with srv.disque_mp_nodes(work / "mp", 3, workers) as mp:
            sides = [("disque-mp", mp[0])]
            if binary is None:
                print(f"disque-c {status}")
                return _probe_rounds(sides, rounds, jobs, rows)
            with srv.reference_nodes(binary, work / "c", 3) as c:
                sides.append(("disque-c", c[0]))
                return _probe_rounds(sides, rounds, jobs, rows)


def _probe_rounds(sides: list[tuple[str, int]], rounds: int, jobs: int,
                  rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for r in range(rounds):
        for name, port in sides if r % 2 == 0 else sides[::-1]:
            row = {"system": name, "round": r, **steps(port, jobs)}
            for rep in (3, 1):
                b = blocked(port, rep, jobs)
                row[f"blocked_r{rep}_p50_us"], row[f"blocked_r{rep}_p99_us"] = b["p50_us"], b["p99_us"]
            rows.append(row)
            print({k: round(v) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers_probe")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--jobs", type=int, default=300)
    p.add_argument("--workers", type=int, default=1, help="disque-mp workers per node")
    a = p.parse_args(argv)
    run(a.rounds, a.jobs, a.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
