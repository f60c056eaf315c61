"""The short form of the fault suite: 3 real nodes in their own network
namespaces, partitions (one node isolated) and kill -9 with restart, under a
total-queue workload; about 2 minutes. The long form is ``make chaos``.

A failure prints its seed and keeps its history (JSON) and the nodes' dirs
(logs, AOF, nodes.conf) under ``<tmp>/disque-mp-faults/``;
``FAULTS_SEED=<seed> pytest tests/faults`` replays the same schedule.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.faults.runner import FaultRun, run

# serial: make test runs it alone after the parallel step (nodes in namespaces with a
# 2.5 s failure-detection timeout: other tests' load would only add faults of its own)
pytestmark = [pytest.mark.netns, pytest.mark.serial]

short_kinds = ("isolate", "kill9")
short_duration_s = 70.0  # workload under faults; start, heal and drain add about a minute
keep_dir = Path(tempfile.gettempdir()) / "disque-mp-faults"  # outlives pytest's tmp rotation


def _seed() -> int:
    env = os.environ.get("FAULTS_SEED")
    return int(env) if env else random.SystemRandom().randrange(1, 1 << 31)


@pytest.mark.timeout(900)  # every phase is bounded (FaultRun); their sum on a loaded host
def test_total_queue_under_partitions_and_kill9(tmp_path: Path) -> None:
    seed = _seed()
    history = tmp_path / f"history-seed{seed}.json"
    print(f"fault run seed {seed}, history {history}")
    try:
        res = run(FaultRun(seed=seed, nodes=3, kinds=short_kinds, duration_s=short_duration_s),
                  tmp_path, history)
    except BaseException:
        kept = keep_dir / f"seed{seed}"
        shutil.copytree(tmp_path, kept, dirs_exist_ok=True)
        print(f"fault run seed {seed} broke off; history and node dirs kept in {kept}")
        raise
    summary = {k: res.get(k) for k in ("operations", "faults", "r2", "r0", "unexpected")}
    print(json.dumps(summary, indent=1, default=str)[:4000])
    kept = keep_dir / f"seed{seed}"
    if not res["valid"]:
        shutil.copytree(tmp_path, kept, dirs_exist_ok=True)
    assert res["faults"] >= 2, f"seed {seed}: the nemesis played too few faults ({history})"
    assert res["r2"]["ok"] > 50 and res["r2"]["delivered"] > 50, f"seed {seed}: too little work"
    assert res["valid"], (f"seed {seed} failed, history and node dirs kept in {kept}: "
                          + "\n".join(res["problems"]))
