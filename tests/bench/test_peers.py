"""bench/peers*: the head-to-head harness against real servers, and its report.

The workloads run briefly against a real redis-server, a real disque-mp node and (when
installed) a real beanstalkd: every job produced must be acked, every paced job
delivered with a latency. No timing is asserted (figures live in bench/results/).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from bench import peers_servers as srv
from bench.peers_drivers import Target, connect
from bench.peers_load import BODY_BYTES, body, cycle, paced, percentile, stamp_of
from bench.peers_report import markdown, medians, targets

run_seconds = 0.5  # producers add for this long: a few thousand jobs at most


def check_cycle(target: Target, queues: list[str]) -> None:
    d = connect(target)
    try:
        d.setup(queues)
        res = cycle(target, queues, clients=2, seconds=run_seconds)
        d.teardown(queues)
    finally:
        d.close()
    assert res["produced"] > 0
    assert res["jobs"] == res["produced"]
    assert res["complete"] and res["jobs_per_s"] > 0
    assert res["clients_us_per_job"] > 0  # the client processes' own CPU, measured
    if target.pids:
        assert res["server_us_per_job"] > 0


def check_paced(target: Target, q: str) -> None:
    d = connect(target)
    try:
        d.setup([q])
        res = paced(target, q, rate=200, seconds=run_seconds)
        d.teardown([q])
    finally:
        d.close()
    assert res["sent"] == 100  # 200/s for 0.5 s, never more
    assert res["received"] == res["sent"]
    lat = res["latency_ns"]
    assert lat == sorted(lat) and lat[0] > 0


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
@pytest.mark.parametrize("system", ["redis-list", "redis-streams"])
def test_redis_peers_cycle_and_paced(tmp_path: Path, system: str) -> None:
    with srv.redis_server(tmp_path) as ports:
        target = Target(system, ports)
        check_cycle(target, ["one"])
        check_cycle(target, [f"many-{i}" for i in range(5)])
        check_paced(target, "paced")


@pytest.mark.integration
def test_disque_mp_cycle_and_paced(tmp_path: Path) -> None:
    with srv.disque_mp_nodes(tmp_path, 1, 2) as ports:
        pids = srv.server_pids(ports)
        assert len(pids) == 3  # the supervisor and both workers
        target = Target("disque-mp", ports, 1, tuple(pids))
        check_cycle(target, ["one"])
        check_cycle(target, [f"many-{i}" for i in range(5)])
        check_paced(target, "paced")


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("beanstalkd") is None, reason="beanstalkd not installed")
def test_beanstalkd_cycle(tmp_path: Path) -> None:
    with srv.beanstalkd(tmp_path) as ports:
        check_cycle(Target("beanstalkd", ports), ["one", "two"])


def test_body_carries_its_add_time() -> None:
    b = body(3, 7)
    assert len(b) == BODY_BYTES
    assert stamp_of(b) > 0 and body(3, 8) != b


def test_percentile_nearest_rank() -> None:
    ns = [i * 1_000_000 for i in range(1, 101)]  # 1..100 ms
    assert percentile(ns, 50) == 50.0
    assert percentile(ns, 99) == 99.0
    assert percentile(ns, 99.9) == 100.0
    assert math.isnan(percentile([], 99))


def rows(system: str, setting: str, workload: str, vals: list[float], key: str) -> list[dict]:
    return [{"setting": setting, "workload": workload, "system": system, "round": i, key: v,
             "complete": True} for i, v in enumerate(vals)]


def test_report_medians_ratios_and_targets() -> None:
    results = (rows("disque-mp", "single", "cycle-1q", [90.0, 100.0, 300.0], "jobs_per_s")
               + rows("beanstalkd", "single", "cycle-1q", [50.0, 40.0, 60.0], "jobs_per_s")
               + rows("nats", "replicated", "cycle-1q", [400.0], "jobs_per_s")
               + rows("disque-mp", "replicated", "cycle-1q", [200.0], "jobs_per_s")
               + [{"setting": "single", "workload": "cycle-1q", "system": "redis-streams",
                   "round": 0, "error": "ConnectionError: refused"}])
    meds = medians(results)
    assert meds[("single", "cycle-1q", "disque-mp")]["jobs_per_s"] == 100.0
    assert meds[("single", "cycle-1q", "redis-streams")]["failed"] == 1
    lines = targets(meds)
    assert "- replicated cycle, 1 queue: disque-mp / nats = 0.50x (>= 1.0x: not met)" in lines
    assert "- single cycle, 1 queue: disque-mp / beanstalkd = 2.00x (>= 1.0x: met)" in lines
    info = {"argv": "python -m bench.peers", "date": "d", "cpus": 2, "rounds": 3,
            "loadavg_1m_start": 1.0, "loadavg_1m_end": 2.0, "minutes": 1.0, "clients": 2,
            "single_workers": 2, "replicated_workers": 1}
    text = markdown({"results": results, "samples": {}}, info)
    assert "| beanstalkd | single, cycle, 1 queue | 50 jobs/s | 2.00x |" in text
    assert "| redis-streams | single, cycle, 1 queue | failed (1 round(s) failed) |" in text


@pytest.mark.integration
def test_replication_probe_on_a_real_cluster(tmp_path: Path) -> None:
    from bench.peers_probe import blocked, steps, work

    with srv.disque_mp_nodes(tmp_path, 3, 1) as ports:
        assert srv.hello_nodes(ports[0]) == 3
        s = steps(ports[0], 20)
        assert set(s) == {"addjob_r3", "getjob", "ackjob"} and min(s.values()) > 0
        for rep in (3, 1):
            assert blocked(ports[0], rep, 20)["delivered"] == 20
        rows = work(ports, 20)  # per node: /proc counters per replicated job
        assert len(rows) == 3 and all(set(r) == {"cpu_us", "reads", "writes", "switches"}
                                      for r in rows)
        # every job wrote to its client and to both replicas; each replica answered
        assert rows[0]["writes"] > 1 and min(r["writes"] for r in rows[1:]) > 0.5


def test_a_narrowed_run_never_writes_over_the_record(tmp_path: Path) -> None:
    from bench.peers import SCRATCH, out_dir, parser
    from bench.plots import RESULTS

    assert out_dir(parser().parse_args([])) == RESULTS
    for narrowed in (["--setting", "single"], ["--workload", "cycle"], ["--systems", "disque-mp"],
                     ["--quick"], ["--node-tree", str(tmp_path / "tree")]):
        assert out_dir(parser().parse_args(narrowed)) == SCRATCH
    chosen = tmp_path / "out"
    assert out_dir(parser().parse_args(["--quick", "--out", str(chosen)])) == chosen
    assert git_ignores(SCRATCH / "peers.md")


def git_ignores(path: Path) -> bool:
    import subprocess

    done = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=path.parents[2])
    return done.returncode == 0
