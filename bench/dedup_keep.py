"""A resend storm: each task sent 3 times within 5 s, acknowledged in between.

    python -m bench.dedup_keep                 # 200 tasks, one node of 2 workers
    python -m bench.dedup_keep --tasks 50 --out /tmp/d

A producer sends every task (a job with the task's ID as DEDUP key) at t = 0, 2 and
4 s, as one that did not see its publish's reply sends again; a consumer on another
connection takes each job as it comes (GETJOB, then ACKJOB at once), so every resend
arrives after the first job was acknowledged. Three ways, on the same node in turn:
``ADDJOB ... DEDUP id DEDUP-KEEP 10`` (the key answers the first job's ID 10 s past
its ACK), ``DEDUP id`` alone (forgotten at the ACK) and no DEDUP. The figure is how
many times each task ran (jobs the consumer got per task ID). Results go to
``bench/results/dedup-keep.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import record
from disque_mp.client import Disque
from tests.nodeproc import NodeProc

sends = 3
send_gap_s = 2.0  # three sends within 5 s
drain_s = 3.0  # the consumer keeps taking this long after the last send
WAYS: tuple[tuple[str, list[Any]], ...] = (("DEDUP-KEEP 10", ["DEDUP", None, "DEDUP-KEEP", 10]), ("DEDUP alone", ["DEDUP", None]),
        ("no DEDUP", []))


def _consume(port: int, queue: str, stop: threading.Event, got: Counter[str]) -> None:
    with Disque(f"127.0.0.1:{port}", socket_timeout=10) as d:
        while not stop.is_set():
            for job in d.get_jobs(queue, count=100, timeout_ms=100) or []:
                got[job.body.decode()] += 1
                d.ack(job)


def one_way(port: int, tasks: int, options: list[Any], queue: str) -> dict[str, Any]:
    got: Counter[str] = Counter()
    stop = threading.Event()
    consumer = threading.Thread(target=_consume, args=(port, queue, stop, got), daemon=True)
    consumer.start()
    ids = [f"task-{i}" for i in range(tasks)]
    with Disque(f"127.0.0.1:{port}", socket_timeout=10) as d:
        for n in range(sends):
            if n:
                time.sleep(send_gap_s)
            cmds = [["ADDJOB", queue, tid, 0, *[tid if o is None else o for o in options]]
                    for tid in ids]
            d.execute_many(cmds)
    time.sleep(drain_s)
    stop.set()
    consumer.join(20)
    runs = Counter(got[tid] for tid in ids)
    return {"tasks": tasks, "runs_per_task": {str(k): v for k, v in sorted(runs.items())},
            "total_runs": sum(got.values())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dedup_keep")
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--out", type=Path, default=record.REPO / "bench" / "results")
    args = p.parse_args(argv)
    res: dict[str, Any] = {"sends": sends, "send_gap_s": send_gap_s, "ways": {}}
    with tempfile.TemporaryDirectory() as tmp, NodeProc(Path(tmp) / "n", workers=2) as n:
        for i, (name, options) in enumerate(WAYS):
            res["ways"][name] = one_way(n.port, args.tasks, options, f"storm-{i}")
    res["provenance"] = record.provenance()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dedup-keep.json").write_text(json.dumps(res, indent=1) + "\n")
    lines = ["# A resend storm: each task sent 3 times within 5 s, ACKed in between", "",
             "`python -m bench.dedup_keep` (bench/dedup_keep.py says how). "
             + record.provenance_line(), "",
             "| ADDJOB | tasks | runs per task (runs: tasks) | runs in all |", "|---|---|---|---|"]
    for name, r in res["ways"].items():
        per = ", ".join(f"{k}: {v}" for k, v in r["runs_per_task"].items())
        lines.append(f"| {name} | {r['tasks']} | {per} | {r['total_runs']} |")
    (args.out / "dedup-keep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
