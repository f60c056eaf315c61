"""WAITJOB over a batch: how long after the last ACK the waiting client hears.

    python -m bench.waitjob                    # 10,000 jobs, 5 rounds, one node and a 3-node cluster
    python -m bench.waitjob --jobs 2000 --rounds 2 --out /tmp/w

Per round: ``--jobs`` jobs are added (pipelined), one connection sends
``WAITJOB <every id> TIMEOUT 60000`` from a thread, and the main thread consumes
them as a worker would (GETJOB COUNT 500, then ACKJOB of the batch). The figure
is the time from the reply of the last ACKJOB to the WAITJOB reply, both read in
this process (``perf_counter``); <= 0 means the WAITJOB reply was read first.
On one node (2 workers) the IDs span both workers; in the cluster (3 nodes,
REPLICATE 2) the jobs are added and consumed on node A and acknowledged on node
B, so every job's ACK reaches A's copy through SETACK (and, for comparison,
acknowledged on A itself, where the copies elsewhere learn it by SETACK but A's
own is acked at once). Results go to
``bench/results/waitjob.{json,md}``. The target is 50 ms after the last ACK.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis

from bench import record
from tests.nodeproc import NodeProc, form_cluster

target_ms = 50.0
getjob_batch = 500
pipeline_batch = 1000


def _r(node: NodeProc) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=node.port, protocol=2, socket_timeout=120)


def _add(r: redis.Redis, queue: str, jobs: int, replicate: int) -> list[str]:
    ids: list[str] = []
    for start in range(0, jobs, pipeline_batch):
        pipe = r.pipeline(transaction=False)
        for _ in range(start, min(jobs, start + pipeline_batch)):
            pipe.execute_command("ADDJOB", queue, "x", 0, "REPLICATE", replicate)
        ids += [x.decode() for x in pipe.execute()]
    return ids


def _round(producer: NodeProc, acker: NodeProc, queues: list[str], jobs: int,
           replicate: int) -> float:
    r = _r(producer)
    per = jobs // len(queues)
    ids = [i for q in queues for i in _add(r, q, per, replicate)]
    got: list[Any] = []
    done_at: list[float] = []

    def wait() -> None:
        got.append(_r(producer).execute_command("WAITJOB", *ids, "TIMEOUT", 60_000))
        done_at.append(time.perf_counter())

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.2)  # the WAITJOB is registered before the first ACK
    a = _r(acker)
    last_ack = 0.0
    left = len(ids)
    while left:
        batch = r.execute_command("GETJOB", "NOHANG", "COUNT", getjob_batch, "FROM", *queues)
        if not batch:
            continue
        a.execute_command("ACKJOB", *[j[1] for j in batch])
        last_ack = time.perf_counter()
        left -= len(batch)
    t.join(120)
    if got != [len(ids)]:
        raise RuntimeError(f"WAITJOB replied {got}, expected {len(ids)}")
    return (done_at[0] - last_ack) * 1000


def _summary(samples: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(samples), 2), "max_ms": round(max(samples), 2),
            "min_ms": round(min(samples), 2)}


def run(jobs: int, rounds: int, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"jobs": jobs, "rounds": rounds, "target_ms": target_ms,
                           "load_before": os.getloadavg()}
    with NodeProc(workdir / "one", workers=2) as n:
        out["one_node"] = _summary([_round(n, n, [f"wa{i}", f"wb{i}"], jobs, 1)
                                    for i in range(rounds)])
    nodes = [NodeProc(workdir / f"c{i}", workers=2) for i in range(3)]
    try:
        for n in nodes:
            n.start()
        form_cluster(nodes, 60.0)
        out["cluster_ack_here"] = _summary(
            [_round(nodes[0], nodes[0], [f"ch{i}"], jobs, 2) for i in range(rounds)])
        out["cluster_ack_elsewhere"] = _summary(
            [_round(nodes[0], nodes[1], [f"ca{i}"], jobs, 2) for i in range(rounds)])
    finally:
        for n in nodes:
            n.stop()
    out["load_after"] = os.getloadavg()
    return out


def _markdown(res: dict[str, Any]) -> str:
    lines = [f"# WAITJOB: last ACK to WAITJOB reply, {res['jobs']} jobs, {res['rounds']} rounds",
             "", f"Target: {res['target_ms']} ms. Load average before {res['load_before']}, "
             f"after {res['load_after']}. {res.get('provenance_line', '')}", "", "| setup | median ms | max ms | min ms |",
             "|---|---|---|---|"]
    for key, label in (("one_node", "one node, 2 workers (IDs on both)"),
                       ("cluster_ack_here", "3 nodes, REPLICATE 2, ACK on the waiting node"),
                       ("cluster_ack_elsewhere", "3 nodes, REPLICATE 2, ACK on another node")):
        s = res[key]
        lines.append(f"| {label} | {s['median_ms']} | {s['max_ms']} | {s['min_ms']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="waitjob-") as tmp:
        res = run(args.jobs, args.rounds, Path(tmp))
    res["provenance"] = record.provenance()
    res["provenance_line"] = record.provenance_line()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "waitjob.json").write_text(json.dumps(res, indent=2) + "\n")
    md = _markdown(res)
    (args.out / "waitjob.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
