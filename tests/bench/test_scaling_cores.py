"""bench/scaling.py's cores mode: its own pinned load generator against a real node.

Counts only (every request answered, the CPU counters read); no timing is asserted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from bench.scaling import (
    CORES_SHAPES,
    cores_counts,
    cores_markdown,
    cores_model,
    cores_run,
    disque_mp_node,
)

run_seconds = 0.5


# serial: make test runs it alone after the parallel step. It pins the node's workers
# to cores and forks its load generators (multiprocessing "fork"): forked from an xdist
# worker, which has threads of its own, a generator hung past its bound.
@pytest.mark.serial
@pytest.mark.integration
def test_cores_run_both_shapes_on_a_real_node(tmp_path: Path) -> None:
    with disque_mp_node(tmp_path, 1) as (port, pids):
        rows = {shape: cores_run(port, pids, 1, shape, seconds=run_seconds)
                for shape in CORES_SHAPES}
        r = redis.Redis(port=port, protocol=2, socket_timeout=10)
        queued = sum(int(r.execute_command("QLEN", f"c:{c}")) for c in range(64))
        r.close()
    for row in rows.values():
        assert row["requests"] > 0 and row["requests"] % 32 == 0
        assert row["node_us_per_req"] > 0
    assert queued == rows["per-connection"]["requests"]  # every ADDJOB of that shape queued
    res = {"cpus": 2, "cpu_model": "x", "workers": [1], "rounds": 1, "seconds": run_seconds,
           "conns": 64, "pipeline": 32,
           "medians": {f"{s}_w1": {**row, "speedup_vs_1": 1.0} for s, row in rows.items()}}
    model = cores_model({"local_us": 4.0, "forward_relay_us": 4.0,
                         "executed_for_other_us": 5.0}, [1, 2])
    assert model["per-connection"][2] == 2 * model["per-connection"][1]
    assert model["random"][2] < model["per-connection"][2]
    assert "| 1 | random |" in cores_markdown(res, model)
    for row in rows.values():  # the node read its sockets: syscalls were counted
        assert row["syscalls_per_req"] > 0
        assert 0 < row["node_kernel_share"] < 1  # some of its CPU in the kernel, not all


def test_cores_counts_stop_at_the_cores_unless_asked_beyond() -> None:
    assert cores_counts((1, 2, 4, 16), 2, False) == [1, 2]
    assert cores_counts((1, 2, 4, 16), 4, False) == [1, 2, 4]
    assert cores_counts((1, 2, 4, 16), 2, True) == [1, 2, 4, 16]
