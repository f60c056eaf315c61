"""bench/hosts.py against a real 2-node cluster: every case's jobs delivered and counted,
its work per job read (CPU, bus frames, syscalls); no timing is asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import peers_servers as srv
from bench.hosts import cases, run_case

pytestmark = pytest.mark.integration


# serial: the paced clients are forked processes (as bench.scaling's), which a forked
# xdist worker with threads of its own should not do
@pytest.mark.serial
def test_replicated_and_federated_cases_on_two_nodes(tmp_path: Path) -> None:
    assert list(cases(1, [1, 2], ["local", "federated"])) == [(1, "local")]
    with srv.disque_mp_nodes(tmp_path, 2, 1) as ports:
        pids = srv.server_pids(ports)
        for rep, traffic in cases(2, [2], ["local", "federated"]):
            row = run_case(ports, pids, rep, traffic, rate=200.0, batch=10, seconds=1.0)
            assert row["jobs"] > 0, row
            assert row["cpu_us_per_job"] is not None and row["syscalls_per_job"] > 0
            # a replicated job's messages cross the bus (REPLJOB, GOTJOB, SETACK ...)
            assert row["bus_frames_per_job"] > 0
