"""What scraping /metrics costs a loaded node: ADDJOB throughput with and without a
scrape every second, side by side.

    python -m bench.metrics_cost [--rounds 4] [--seconds 6] [--queues 10000] [--workers 2]

Starts a node (tests/nodeproc.py) with http-port on. Each run: DEBUG FLUSHALL, fill
``--queues`` queues (redis-benchmark -r), then ``redis-benchmark -c 50 -r QUEUES
ADDJOB q:__rand_int__ x 0`` for ``--seconds``, with a scraper thread fetching
/metrics once a second or not. Runs alternate ABBA (off, on, on, off, ...) so the
drift of a shared machine falls on both sides. Prints each run, the medians, the
difference in percent, the workers' CPU time per ADDJOB on each side (from /proc:
steadier than throughput on a shared machine) and the scrape's own time and size;
``--json`` writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.profile_node import benchmark_for
from tests.nodeproc import NodeProc, free_port

scrape_period_s = 1.0
scrape_timeout_s = 30.0


def fill(port: int, queues: int) -> None:
    subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", "50",
                    "-n", str(queues * 5), "-r", str(queues), "-q", "ADDJOB", "q:__rand_int__",
                    "x", "0"], check=True, capture_output=True, timeout=600)


class Scraper(threading.Thread):
    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.times_s: list[float] = []
        self.sizes: list[int] = []
        self.errors = 0

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url, timeout=scrape_timeout_s) as resp:
                    self.sizes.append(len(resp.read()))
                self.times_s.append(time.perf_counter() - t0)
            except OSError:
                self.errors += 1
            self.stop.wait(max(0.0, scrape_period_s - (time.perf_counter() - t0)))


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes (/proc/PID/stat)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def one_run(node: NodeProc, http_port: int, scrape: bool, a: argparse.Namespace) -> dict[str, Any]:
    r = node.client(protocol=2)
    r.execute_command("DEBUG", "FLUSHALL")
    fill(node.port, a.queues)
    queues = int(r.info("queues")["registered_queues"])
    jobs0 = int(r.info("jobs")["registered_jobs"])
    pids = node.worker_pids()
    cpu0 = cpu_s(pids)
    scraper = Scraper(f"http://127.0.0.1:{http_port}/metrics") if scrape else None
    if scraper is not None:
        scraper.start()
    line = benchmark_for(node.port, ["-r", str(a.queues), "ADDJOB", "q:__rand_int__", "x", "0"],
                         1, a.seconds)
    if scraper is not None:
        scraper.stop.set()
        scraper.join(timeout=scrape_timeout_s)
    cpu = cpu_s(pids) - cpu0
    jobs = int(r.info("jobs")["registered_jobs"]) - jobs0
    r.close()
    rate = float(line.rsplit(":", 1)[1].split()[0].replace(",", ""))
    out: dict[str, Any] = {"scrape": scrape, "rate": rate, "queues": queues, "jobs": jobs,
                           "cpu_us_per_job": round(1e6 * cpu / max(jobs, 1), 2)}
    if scraper is not None:
        out.update(scrapes=len(scraper.times_s), scrape_errors=scraper.errors,
                   scrape_ms_median=1000 * statistics.median(scraper.times_s or [0.0]),
                   scrape_ms_max=1000 * max(scraper.times_s or [0.0]),
                   body_bytes=max(scraper.sizes or [0]))
    print(json.dumps(out), flush=True)
    return out


def idle_cost(node: NodeProc, http_port: int, seconds: float, queues: int) -> dict[str, Any]:
    """The scrape's own CPU: the workers' CPU over ``seconds`` without load, without
    then with a scrape a second (the difference does not depend on how fast a
    shared machine happens to run the load)."""
    r = node.client(protocol=2)
    r.execute_command("DEBUG", "FLUSHALL")
    fill(node.port, queues)
    r.close()
    pids = node.worker_pids()
    cpu0 = cpu_s(pids)
    time.sleep(seconds)
    quiet = cpu_s(pids) - cpu0
    scraper = Scraper(f"http://127.0.0.1:{http_port}/metrics")
    cpu0 = cpu_s(pids)
    scraper.start()
    time.sleep(seconds)
    scraper.stop.set()
    scraper.join(timeout=scrape_timeout_s)
    busy = cpu_s(pids) - cpu0
    n = max(len(scraper.times_s), 1)
    out = {"idle_cpu_s": round(quiet, 3), "scraped_cpu_s": round(busy, 3), "scrapes": n,
           "cpu_ms_per_scrape": round(1000 * (busy - quiet) / n, 1),
           "scrape_ms_median": round(1000 * statistics.median(scraper.times_s or [0.0]), 1)}
    print(json.dumps(out), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.metrics_cost")
    p.add_argument("--rounds", type=int, default=4, help="pairs of runs (ABBA order)")
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--queues", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", default="", help="write the runs and the summary here")
    p.add_argument("--idle-seconds", type=float, default=10.0,
                   help="also measure a scrape's CPU on the idle node over this long (0: skip)")
    a = p.parse_args(argv)
    http_port = free_port()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, \
            NodeProc(Path(tmp), workers=a.workers, conf={"http-port": http_port}) as node:
        idle = idle_cost(node, http_port, a.idle_seconds, a.queues) if a.idle_seconds else {}
        for i in range(a.rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            for scrape in order:
                runs.append(one_run(node, http_port, scrape, a))
    off = [r["rate"] for r in runs if not r["scrape"]]
    on = [r["rate"] for r in runs if r["scrape"]]
    summary = {
        "median_without": statistics.median(off), "median_with": statistics.median(on),
        "cost_percent": 100 * (1 - statistics.median(on) / statistics.median(off)),
        "cpu_us_per_job_without": statistics.median([r["cpu_us_per_job"] for r in runs if not r["scrape"]]),
        "cpu_us_per_job_with": statistics.median([r["cpu_us_per_job"] for r in runs if r["scrape"]]),
        "cpu_cost_percent": 0.0,
        "scrape_ms_median": statistics.median([r["scrape_ms_median"] for r in runs if r["scrape"]]),
        "body_bytes": max(r["body_bytes"] for r in runs if r["scrape"]),
        "queues": a.queues, "workers": a.workers, "seconds": a.seconds, "rounds": a.rounds,
        "idle": idle,
    }
    summary["cpu_cost_percent"] = 100 * (summary["cpu_us_per_job_with"]
                                         / summary["cpu_us_per_job_without"] - 1)
    print(json.dumps(summary, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
