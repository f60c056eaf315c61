"""Hosts that join by cluster-seeds and leave by `disque-mp admin drain` while
clients run, with one host cut off and healed: nothing lost, nothing acknowledged
delivered again, every client error a documented reply (tests/faults/membership.py).

A failure prints its seed and keeps its history and the hosts' dirs under
``<tmp>/disque-mp-faults/``; ``FAULTS_SEED=<seed>`` replays the same choices.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.faults.membership import MembershipRun, run_membership

# serial: make test runs it alone after the parallel step, as the other fault run
pytestmark = [pytest.mark.netns, pytest.mark.serial]

keep_dir = Path(tempfile.gettempdir()) / "disque-mp-faults"


@pytest.mark.timeout(900)  # every phase is bounded (MembershipRun)
def test_hosts_join_by_seeds_and_leave_by_drain_under_load(tmp_path: Path) -> None:
    env = os.environ.get("FAULTS_SEED")
    seed = int(env) if env else random.SystemRandom().randrange(1, 1 << 31)
    history = tmp_path / f"membership-seed{seed}.json"
    print(f"membership run seed {seed}, history {history}")
    try:
        res = run_membership(MembershipRun(seed=seed), tmp_path, history)
    except BaseException:
        shutil.copytree(tmp_path, keep_dir / f"membership-seed{seed}", dirs_exist_ok=True)
        raise
    summary = {k: res.get(k) for k in ("operations", "r2", "r0", "unexpected", "events")}
    print(json.dumps(summary, indent=1, default=str)[:6000])
    kept = keep_dir / f"membership-seed{seed}"
    if not res["valid"]:
        shutil.copytree(tmp_path, kept, dirs_exist_ok=True)
    assert [e["event"] for e in res["events"]] == ["join", "join", "drain", "drain"]
    assert sum(e["queued_before"] for e in res["events"] if e["event"] == "drain") > 0, \
        "the drained hosts held no queued job: the drains moved nothing"
    assert res["r2"]["ok"] > 50 and res["r2"]["delivered"] > 50, f"seed {seed}: too little work"
    assert res["valid"], (f"seed {seed} failed, history and host dirs kept in {kept}: "
                          + "\n".join(res["problems"]))
