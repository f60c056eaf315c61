"""Macro benchmarks: real disque-mp nodes and a real redis-server, side by side.

    .venv/bin/python -m pytest bench/test_macro.py --benchmark-enable -s

Each test runs its measurement once (``benchmark.pedantic``, one round) and puts
the figures in ``benchmark.extra_info``; bench/run_all.py turns the JSON into
bench/results/summary.md and the plots. The throughput figures come from
redis-benchmark and bench/loadgen.py, not from pytest-benchmark's own timer.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import loadgen
from bench.redisq import RedisServer, redis_benchmark, workers_rss_bytes
from tests.nodeproc import NodeProc, free_port

CLIENTS = 50  # redis-benchmark -c, as in the targets
REQUESTS = 200_000  # redis-benchmark -n, as in the targets
RB_ROUNDS = 3  # interleaved redis-benchmark rounds per side (median counts): one run moves +-5 %
CYCLE_S = 4.0  # seconds per load-generator cycle round
CYCLE_ROUNDS = 3  # interleaved rounds per side (median counts)
CROSS_S = 6.0  # seconds per cross-worker kind (local, remote, mixed), over xworker.rounds rounds
MEMORY_JOBS = 1_000_000  # the memory target's job count
MEMORY_BODY = b"x" * 100  # ... and body size
settle_s = 1.0  # let a fresh node's allocator and imports settle before an RSS baseline


def once(benchmark: Any, fn: Any) -> Any:
    """Run the measurement once; record the machine's load around it (other work on a
    2-core machine moves every figure, so the results say how busy it was)."""
    before = os.getloadavg()[0]
    info = benchmark.pedantic(fn, rounds=1, iterations=1, warmup_rounds=0)
    benchmark.extra_info["loadavg_1m"] = [round(before, 2), round(os.getloadavg()[0], 2)]
    return info


def bench_retry(port: int, *args: str, **kw: Any) -> dict[str, Any]:
    """redis-benchmark against the node; one retry after a failure, which is recorded."""
    try:
        return redis_benchmark(port, *args, **kw)[0]
    except RuntimeError as e:
        row = redis_benchmark(port, *args, **kw)[0]
        row["retried_after"] = str(e)[-300:]
        return row


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis"), free_port()) as server:
        yield server


@pytest.fixture(scope="module")
def floor_port() -> Iterator[int]:
    """bench/floor_server.py: canned replies, no work; the ceiling of one Python worker."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.floor_server", "--port", str(port)],
                            cwd=str(Path(__file__).resolve().parent.parent),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not answers(port):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("bench.floor_server did not start")
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def answers(port: int) -> bool:
    """The floor server answers every command with a canned reply (no HELLO: raw RESP)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(16) == b":1\r\n"
    except OSError:
        return False


def node(tmp_path: Path, workers: int) -> NodeProc:
    # A fast run fills the default 1 GB past 75 % (then ADDJOB answers NOREPL, out of
    # memory): the throughput runs measure speed, not the memory levels.
    return NodeProc(tmp_path / f"node{workers}", workers=workers,
                    conf={"loglevel": "warning", "maxmemory": "8gb"}).start()


@pytest.mark.parametrize("pipeline", [1, 32])
def test_redis_benchmark_addjob_getjob(benchmark: Any, tmp_path: Path, redis_server: RedisServer,
                                       floor_port: int, pipeline: int) -> None:
    """ADDJOB vs LPUSH, GETJOB NOHANG FROM q (after ADDJOB filled q) vs RPOP; and the
    same commands against the do-nothing floor server."""
    benchmark.group = "redis-benchmark"
    n = node(tmp_path, 2)
    try:
        def measure() -> dict[str, Any]:
            kw = {"clients": CLIENTS, "requests": REQUESTS, "pipeline": pipeline}
            runs: dict[str, list[dict[str, Any]]] = {k: [] for k in (
                "lpush", "rpop", "addjob", "getjob", "floor_addjob", "floor_getjob")}
            for _ in range(RB_ROUNDS):  # interleaved: both sides see the same machine
                ref = {r["test"]: r for r in redis_benchmark(redis_server.port, "-t", "lpush,rpop", **kw)}
                runs["lpush"].append(ref["LPUSH"])
                runs["rpop"].append(ref["RPOP"])
                runs["addjob"].append(bench_retry(n.port, "ADDJOB", "q", "x", "0", **kw))
                runs["getjob"].append(bench_retry(n.port, "GETJOB", "NOHANG", "FROM", "q", **kw))
                runs["floor_addjob"].append(redis_benchmark(floor_port, "ADDJOB", "q", "x", "0", **kw)[0])
                runs["floor_getjob"].append(
                    redis_benchmark(floor_port, "GETJOB", "NOHANG", "FROM", "q", **kw)[0])
            med = {k: sorted(v, key=lambda r: r["rps"])[len(v) // 2] for k, v in runs.items()}
            return {"pipeline": pipeline, "workers": 2, "rounds": RB_ROUNDS, **med,
                    "rounds_rps": {k: [r["rps"] for r in v] for k, v in runs.items()},
                    "addjob_retried": any("retried_after" in r for r in runs["addjob"]),
                    "addjob_ratio": med["addjob"]["rps"] / med["lpush"]["rps"],
                    "getjob_ratio": med["getjob"]["rps"] / med["rpop"]["rps"]}

        info = once(benchmark, measure)
        qlen = n.client().execute_command("QLEN", "q")
    finally:
        n.stop()
    benchmark.extra_info.update(info)
    # every GETJOB took a job: the queue ADDJOB filled is empty again (a retried ADDJOB
    # run leaves the first attempt's jobs behind)
    if not info["addjob_retried"]:
        assert qlen == 0, qlen


def test_scaling(benchmark: Any, tmp_path: Path) -> None:
    """Every core pays? 1 vs 2 workers over 10,000 random queues, one queue against the
    reference C Disque (built from its source where the machine has it), CPU per role
    and the model of throughput against workers (bench/scaling.py)."""
    from bench import scaling

    benchmark.group = "scaling"
    info = once(benchmark, lambda: scaling.run())
    benchmark.extra_info.update(info)
    for key in ("addjob_p1_ratio", "addjob_p32_ratio", "getjob_p1_ratio", "getjob_p32_ratio"):
        assert info["many_queues"][key] > 0
    assert info["roles"]["local_us"] > 0 and info["roles"]["executed_for_other_us"] > 0


def cycle_settings(target: str, port: int, pipeline: int, rate: float) -> loadgen.Settings:
    return loadgen.Settings(workload="cycle", target=target, port=port, procs=2, producers=2,
                            consumers=2, pipeline=pipeline, duration_s=CYCLE_S, rate=rate,
                            quiet=True)


@pytest.mark.parametrize("pipeline,rate", [(8, 0.0), (1, 0.0), (1, 5000.0), (1, 2000.0)],
                         ids=["saturate-p8", "saturate-p1", "rate5000-p1", "rate2000-p1"])
def test_loadgen_cycle(benchmark: Any, tmp_path: Path, redis_server: RedisServer, pipeline: int,
                       rate: float) -> None:
    """ADDJOB -> GETJOB -> ACKJOB vs LPUSH -> BLMOVE -> LREM, same generator, same settings."""
    benchmark.group = "loadgen cycle"
    n = node(tmp_path, 2)
    try:
        def measure() -> dict[str, Any]:
            return cycle_rounds(n.port, redis_server.port, pipeline, rate)

        info = once(benchmark, measure)
    finally:
        n.stop()
    benchmark.extra_info.update(info)
    for side in ("disque", "redis"):
        for res in info[f"{side}_rounds"]:
            assert res["fatal"] == [] and res["errors"] == 0, (side, res["first_error"], res["fatal"])
            assert res["acked"] == res["produced"], (side, res["acked"], res["produced"])


def cycle_rounds(disque_port: int, redis_port: int, pipeline: int, rate: float) -> dict[str, Any]:
    """CYCLE_ROUNDS interleaved rounds (disque first, then redis first, ...); each side's
    median round is its figure, so that one burst of load from elsewhere does not decide
    the ratio."""
    runs: dict[str, list[dict[str, Any]]] = {"disque": [], "redis": []}
    for i in range(CYCLE_ROUNDS):
        order = [("disque", disque_port), ("redis", redis_port)]
        for side, port in order if i % 2 == 0 else order[::-1]:
            runs[side].append(loadgen.run(cycle_settings(side, port, pipeline, rate)))
    # saturated: the median by throughput; paced (same throughput): the median by p99
    key = (lambda x: x["latency"]["p99_us"]) if rate else (lambda x: x["jobs_per_s"])
    d, r = median_run(runs["disque"], key), median_run(runs["redis"], key)
    return {"pipeline": pipeline, "rate": rate, "rounds": CYCLE_ROUNDS, "disque": d, "redis": r,
            "disque_rounds": runs["disque"], "redis_rounds": runs["redis"],
            "throughput_ratio": d["jobs_per_s"] / max(r["jobs_per_s"], 1e-9),
            "p99_ratio": d["latency"]["p99_us"] / max(r["latency"]["p99_us"], 1e-9)}


def median_run(runs: list[dict[str, Any]], key: Any) -> dict[str, Any]:
    return sorted(runs, key=key)[len(runs) // 2]


def fill(target: str, port: int, jobs: int) -> dict[str, Any]:
    s = loadgen.Settings(workload="produce", target=target, port=port, procs=2, conns=4,
                         pipeline=64, body_bytes=len(MEMORY_BODY), queues=16, jobs=jobs,
                         duration_s=600.0, quiet=True)
    return loadgen.run(s)


def test_memory_1m_jobs(benchmark: Any, tmp_path: Path, redis_server: RedisServer) -> None:
    """RSS of all workers with 1,000,000 queued 100-byte jobs, over an empty node."""
    benchmark.group = "memory"
    n = node(tmp_path, 2)
    try:
        c = n.client()
        time.sleep(settle_s)
        assert n.proc is not None
        empty = workers_rss_bytes(n.proc.pid)

        def measure() -> dict[str, Any]:
            res = fill("disque", n.port, MEMORY_JOBS)
            full = workers_rss_bytes(n.proc.pid)  # type: ignore[union-attr]
            prefix = res["settings"]["prefix"]
            queued = sum(int(c.execute_command("QLEN", f"{prefix}:{k}")) for k in range(16))
            return {"jobs": queued, "empty_rss": empty, "full_rss": full,
                    "bytes_per_job": (full - empty) / max(queued, 1), "fill": res}

        info = once(benchmark, measure)
    finally:
        n.stop()
    benchmark.extra_info.update(info)
    benchmark.extra_info["redis"] = redis_memory(redis_server)
    assert info["jobs"] == MEMORY_JOBS


def redis_memory(server: RedisServer) -> dict[str, Any]:
    """The same million 100-byte items LPUSHed to redis-server, for context."""
    from bench.redisq import rss_bytes

    c = server.client()
    c.flushall()
    assert server.proc is not None
    empty = rss_bytes(server.proc.pid)
    res = fill("redis", server.port, MEMORY_JOBS)
    full = rss_bytes(server.proc.pid)
    c.flushall()
    return {"jobs": res["produced"], "empty_rss": empty, "full_rss": full,
            "bytes_per_job": (full - empty) / max(res["produced"], 1)}


@pytest.mark.parametrize("pipeline", [1, 32])
def test_cross_worker(benchmark: Any, tmp_path: Path, pipeline: int) -> None:
    """ADDJOB from connections held by the queue's owner vs by the other worker."""
    from bench import xworker

    benchmark.group = "cross-worker"
    n = node(tmp_path, 2)
    try:
        assert n.proc is not None
        pid = n.proc.pid
        info = once(benchmark, lambda: xworker.run(n.port, pid, pipeline, CROSS_S))
    finally:
        n.stop()
    benchmark.extra_info.update(info)
    assert info["local"] > 0 and info["remote"] > 0
