"""QLIMIT, measured on real nodes with real consumers (threads, redis-py):

    python -m bench.limits                 # bench/results/limits.{json,md}
    python -m bench.limits --out /tmp/l    # elsewhere

- ACTIVE: 2 nodes in a cluster, ``QLIMIT q ACTIVE 3 BCAST``, 8 consumers (4 on each
  node) that each take one job, hold it ``work_ms``, then ACK it. The most jobs held
  at once per node, counted by the consumers (between GETJOB's reply and the ACK)
  and sampled from the node (QLIMIT's ``in-use``, every ``sample_ms``); the same run
  without the limit beside it.
- RATE: one node, ``QLIMIT q RATE 50``, 4 consumers taking up to 10 jobs a call and
  acknowledging at once: deliveries a second (the first second holds the bucket's
  burst of 50 on top of the refill; then at most 50 a second).
- GROUP-ACTIVE: one node, ``QLIMIT q GROUP-ACTIVE 2``, three tenants' jobs (GROUP),
  8 consumers holding each job ``work_ms``: the most jobs of one tenant held at once.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import redis  # noqa: E402

from bench import record  # noqa: E402
from tests.nodeproc import NodeProc, form_cluster, unique_queue  # noqa: E402

work_ms = 20  # how long a consumer holds a job before its ACK
sample_ms = 5  # the sampler's period (QLIMIT's in-use)
active_jobs_per_node = 150
rate_jobs = 400
rate_limit = 50
tenant_jobs = 60
take_timeout_ms = 1000  # GETJOB TIMEOUT: a consumer that waited this long finds it empty
rounds_max = 100_000  # bounds every consumer loop
cluster_form_timeout_s = 60.0


def _client(port: int) -> redis.Redis:
    return redis.Redis(port=port, protocol=2, socket_timeout=30)


class Held:
    """Jobs held by consumers right now, per key (node or tenant), and the most."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now: dict[str, int] = {}
        self.most: dict[str, int] = {}

    def take(self, key: str) -> None:
        with self.lock:
            n = self.now.get(key, 0) + 1
            self.now[key] = n
            self.most[key] = max(self.most.get(key, 0), n)

    def give(self, key: str) -> None:
        with self.lock:
            self.now[key] -= 1


def _consume(port: int, q: str, key_of: Callable[[list[Any]], str], held: Held,
             count: int, hold_s: float, times: list[float]) -> None:
    r = _client(port)
    for _ in range(rounds_max):
        got = r.execute_command("GETJOB", "TIMEOUT", take_timeout_ms, "COUNT", count, "FROM", q)
        if not got:
            return
        now = time.monotonic()
        keys = [key_of(e) for e in got]
        for key in keys:
            held.take(key)
            times.append(now)
        if hold_s:
            time.sleep(hold_s)
        for key in keys:
            held.give(key)
        r.execute_command("ACKJOB", *[e[1] for e in got])


def _run_consumers(targets: list[tuple[int, Callable[[list[Any]], str]]], q: str, held: Held,
                   count: int, hold_s: float) -> list[float]:
    times: list[float] = []
    threads = [threading.Thread(target=_consume, args=(port, q, key_of, held, count, hold_s,
                                                       times)) for port, key_of in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times


def _sampler(ports: list[int], q: str, stop: threading.Event, most: dict[int, int]) -> None:
    rs = {p: _client(p) for p in ports}
    while not stop.is_set():
        for p, r in rs.items():
            reply = r.execute_command("QLIMIT", q)
            in_use = int(dict(zip(reply[::2], reply[1::2], strict=True))[b"in-use"])
            most[p] = max(most.get(p, 0), in_use)
        time.sleep(sample_ms / 1000)


def _node_key(port: int) -> Callable[[list[Any]], str]:
    """A consumer's jobs counted under its node."""
    return lambda _entry: str(port)


def active(nodes: list[NodeProc], limit: int | None) -> dict[str, Any]:
    q = unique_queue("limit")
    ports = [n.port for n in nodes]
    if limit is not None:
        _client(ports[0]).execute_command("QLIMIT", q, "ACTIVE", limit, "BCAST")
        time.sleep(0.5)  # the BCAST reaches the other node
    for p in ports:
        pipe = _client(p).pipeline(transaction=False)
        for i in range(active_jobs_per_node):
            pipe.execute_command("ADDJOB", q, f"j{i}", 0, "REPLICATE", 1, "RETRY", 60)
        pipe.execute()
    held = Held()
    stop = threading.Event()
    sampled: dict[int, int] = {}
    sampler = threading.Thread(target=_sampler, args=(ports, q, stop, sampled))
    sampler.start()
    t0 = time.monotonic()
    targets: list[tuple[int, Callable[[list[Any]], str]]] = [
        (p, _node_key(p)) for p in ports for _ in range(4)]
    times = _run_consumers(targets, q, held, 1, work_ms / 1000)
    stop.set()
    sampler.join()
    _client(ports[0]).execute_command("QLIMIT", q, "RESET", "BCAST")
    return {"limit": limit, "consumers": len(targets), "jobs": len(times),
            "seconds": round(time.monotonic() - t0, 2),
            "most_held_per_node": [held.most.get(str(p), 0) for p in ports],
            "most_in_use_sampled_per_node": [sampled.get(p, 0) for p in ports]}


def rate(node: NodeProc) -> dict[str, Any]:
    q = unique_queue("rate")
    r = _client(node.port)
    pipe = r.pipeline(transaction=False)
    for i in range(rate_jobs):
        pipe.execute_command("ADDJOB", q, f"j{i}", 0, "RETRY", 60)
    pipe.execute()
    r.execute_command("QLIMIT", q, "RATE", rate_limit)
    times = _run_consumers([(node.port, lambda _e: "all")] * 4, q, Held(), 10, 0.0)
    start = min(times)
    per_second: dict[int, int] = {}
    for t in times:
        s = int(t - start)
        per_second[s] = per_second.get(s, 0) + 1
    seconds = [per_second.get(s, 0) for s in range(max(per_second) + 1)]
    steady = seconds[1:-1] or seconds
    return {"rate": rate_limit, "jobs": len(times), "per_second": seconds,
            "first_second": seconds[0], "most_in_a_later_second": max(steady),
            "mean_after_the_first_second": round(sum(steady) / len(steady), 1)}


def group_active(node: NodeProc, limit: int | None) -> dict[str, Any]:
    q = unique_queue("tenants")
    r = _client(node.port)
    if limit is not None:
        r.execute_command("QLIMIT", q, "GROUP-ACTIVE", limit)
    pipe = r.pipeline(transaction=False)
    for i in range(tenant_jobs):
        for tenant in ("A", "B", "C"):
            pipe.execute_command("ADDJOB", q, f"{tenant}{i}", 0, "RETRY", 60, "GROUP", tenant)
    pipe.execute()
    held = Held()
    targets = [(node.port, lambda e: e[2].decode()[0])] * 8
    times = _run_consumers(targets, q, held, 1, work_ms / 1000)
    return {"limit": limit, "consumers": 8, "jobs": len(times),
            "most_held_per_tenant": {k: held.most[k] for k in sorted(held.most)}}


def run(workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    nodes = [NodeProc(workdir / f"c{i}", workers=2, conf={"loglevel": "warning"})
             for i in range(2)]
    try:
        for n in nodes:
            n.start()
        form_cluster(nodes, cluster_form_timeout_s)
        out["active"] = [active(nodes, None), active(nodes, 3)]
    finally:
        for n in nodes:
            n.stop()
    with NodeProc(workdir / "one", workers=2, conf={"loglevel": "warning"}) as node:
        out["rate"] = rate(node)
        out["group_active"] = [group_active(node, None), group_active(node, 2)]
    return out


def to_markdown(report: dict[str, Any]) -> str:
    res = report["results"]
    lines = ["# QLIMIT: limits per node, measured", "",
             f"{report['time']}, {report['machine']}, node build: {report['node_build']}, "
             f"commit {report['commit']}, load (1 min) {report['loadavg_1m'][0]} -> "
             f"{report['loadavg_1m'][1]}. `python -m bench.limits`.", "",
             f"## ACTIVE: 2 nodes, 8 consumers (4 a node), {active_jobs_per_node} jobs a node, "
             f"each held {work_ms} ms", "",
             "| limit | jobs | most held at once per node (consumers) | most in-use per node "
             "(node, sampled) | seconds |", "|---|---|---|---|---|"]
    for a in res["active"]:
        name = "none" if a["limit"] is None else f"ACTIVE {a['limit']} BCAST"
        lines.append(f"| {name} | {a['jobs']} | {a['most_held_per_node']} | "
                     f"{a['most_in_use_sampled_per_node']} | {a['seconds']} |")
    r = res["rate"]
    lines += ["", f"## RATE {r['rate']}: one node, 4 consumers (COUNT 10, ACK at once), "
              f"{r['jobs']} jobs", "",
              f"Deliveries per second: {r['per_second']}. First second "
              f"{r['first_second']} (the bucket's burst of {r['rate']} plus its refill), "
              f"then at most {r['most_in_a_later_second']} in a second, "
              f"{r['mean_after_the_first_second']} on average.", "",
              f"## GROUP-ACTIVE: one node, 3 tenants x {tenant_jobs} jobs, 8 consumers, each "
              f"job held {work_ms} ms", "",
              "| limit | jobs | most held at once per tenant |", "|---|---|---|"]
    for g in res["group_active"]:
        name = "none" if g["limit"] is None else f"GROUP-ACTIVE {g['limit']}"
        lines.append(f"| {name} | {g['jobs']} | {g['most_held_per_tenant']} |")
    lines += ["", "Limits are per node: with ACTIVE 3 on 2 nodes at most 6 run at once "
              "across the cluster (docs/extensions.md, \"QLIMIT\")."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    record.run_and_write(args.out, "limits", run, to_markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
