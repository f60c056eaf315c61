"""The Redis side of the comparison, and process helpers for the macro runs.

Redis as a jobs queue (what Disque replaces): LPUSH to add, BLMOVE src
processing RIGHT LEFT to take (the item stays in a processing list until the
worker is done), LREM processing 1 item to ack. bench/loadgen.py drives that
pattern (``--target redis``); this module starts the redis-server it runs
against, runs redis-benchmark and reads its CSV, and reads process memory.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

start_timeout_s = 20.0  # redis-server starts in milliseconds; the machine may be loaded
benchmark_timeout_s = 600.0  # one redis-benchmark call (200k requests at >= 1k/s)


class RedisServer:
    """A throwaway redis-server on a free loopback port: no persistence."""

    def __init__(self, workdir: Path, port: int) -> None:
        self.dir, self.port = Path(workdir), port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed (make sysdeps)")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                if self.client().ping():
                    return self
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"redis-server on port {self.port} did not start") from None
                time.sleep(0.05)

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def redis_benchmark(port: int, *args: str, clients: int = 50, requests: int = 200_000,
                    pipeline: int = 1) -> list[dict[str, Any]]:
    """Run redis-benchmark (``-t ...`` or a custom command) and return its CSV rows:
    ``test``, ``rps``, ``avg_latency_ms``, ``p50_latency_ms``, ``p99_latency_ms`` ..."""
    cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", str(clients),
           "-n", str(requests), "-P", str(pipeline), "--csv", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=benchmark_timeout_s)
    rows = [r for r in csv.DictReader(io.StringIO(out.stdout)) if r.get("rps")]
    if out.returncode != 0 or not rows:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr[-2000:]}")
    for r in rows:
        for k, v in list(r.items()):
            if k != "test":
                r[k] = float(v)
        r["command"] = " ".join(cmd)
    return rows


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (the supervisor's workers), from /proc."""
    kids: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # exited while we looked
        # the command name may hold spaces and parentheses: the ppid follows the last ')'
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            kids.append(int(entry))
    return sorted(kids)


def rss_bytes(pid: int) -> int:
    """Resident set size of one process (VmRSS in /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def workers_rss_bytes(supervisor_pid: int) -> int:
    return sum(rss_bytes(p) for p in children_of(supervisor_pid))
