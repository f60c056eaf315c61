"""The short form of the fault suite: 3 real nodes in their own network
namespaces, partitions (one node isolated) and kill -9 with restart, under a
total-queue workload; about 2 minutes. The long form is ``make chaos``.

A failure prints its seed and keeps its history (JSON) in the test's tmp dir;
``FAULTS_SEED=<seed> pytest tests/faults`` replays the same schedule.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from tests.faults.runner import FaultRun, run

short_kinds = ("isolate", "kill9")


def _seed() -> int:
    env = os.environ.get("FAULTS_SEED")
    return int(env) if env else random.SystemRandom().randrange(1, 1 << 31)


def test_total_queue_under_partitions_and_kill9(tmp_path: Path) -> None:
    seed = _seed()
    history = tmp_path / f"history-seed{seed}.json"
    print(f"fault run seed {seed}, history {history}")
    res = run(FaultRun(seed=seed, nodes=3, kinds=short_kinds, duration_s=75.0), tmp_path, history)
    summary = {k: res.get(k) for k in ("operations", "faults", "r2", "r0", "unexpected")}
    print(json.dumps(summary, indent=1, default=str)[:4000])
    assert res["faults"] >= 2, f"seed {seed}: the nemesis played too few faults ({history})"
    assert res["r2"]["ok"] > 50 and res["r2"]["delivered"] > 50, f"seed {seed}: too little work"
    assert res["valid"], (f"seed {seed} failed, history kept in {history}: "
                          + "\n".join(res["problems"]))
