"""An idle node sleeps: a real node with three workers and no client wakes a few
times a second at most (no fixed-rate tick, no memory exchange between workers,
no parent poll; the supervisor not at all), and everything that waits for time still happens on time:
a DELAY and a TTL on an idle node, the rates of INFO once clients come back, a
CONFIG SET of the slow log at once."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from tests.nodeproc import NodeProc, unique_queue

pytestmark = pytest.mark.integration

WORKERS = 3
settle_s = 2.5  # after the last client command: the workers' active second ends
window_s = 2.0
# A worker asleep wakes for its AOF manager's off-state look (once a second) and,
# worker 0, the bus's alone tick (once a second); a fixed-rate tick (hz 10), the
# memory monitor's exchange (10 a second with every other worker) or a parent poll
# would each be 10 or more a second.
idle_wakeups_per_s_max = 5


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with NodeProc(tmp_path_factory.mktemp("idle"), workers=WORKERS) as n:
        n.wait_for(lambda: len(n.worker_pids()) == WORKERS, 20, "every worker")
        yield n


def _wakeups(pid: int) -> int:
    """Voluntary context switches of every thread of ``pid``: each is a sleep it woke from."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
    return total


def test_idle_workers_and_supervisor_sleep(node: NodeProc) -> None:
    """The workers wake a few times a second at most; the supervisor (no systemd
    watchdog here) not at all: it sleeps until a worker exits or a signal comes."""
    time.sleep(settle_s)
    pids = node.worker_pids()
    assert node.proc is not None
    supervisor = node.proc.pid
    before = {p: _wakeups(p) for p in [*pids, supervisor]}
    time.sleep(window_s)
    per_s = {p: (_wakeups(p) - before[p]) / window_s for p in pids}
    assert all(v <= idle_wakeups_per_s_max for v in per_s.values()), per_s
    assert _wakeups(supervisor) - before[supervisor] <= 1  # a 1 s poll would be 2


def test_a_delay_and_a_ttl_fire_on_an_idle_node(node: NodeProc) -> None:
    r = node.client()
    delayed, short = unique_queue("delayed"), unique_queue("short")
    r.execute_command("ADDJOB", delayed, "x", 0, "DELAY", 1, "TTL", 60)
    job = r.execute_command("ADDJOB", short, "x", 0, "TTL", 1)
    assert r.execute_command("QLEN", delayed) == 0
    time.sleep(1.6)  # nobody talks to the node meanwhile: only its timers can act
    assert r.execute_command("QLEN", delayed) == 1
    assert r.execute_command("SHOW", job) is None
    r.close()


def test_rates_follow_clients_after_idle(node: NodeProc) -> None:
    time.sleep(settle_s)
    r = node.client()
    deadline = time.monotonic() + 10
    ops = 0
    while time.monotonic() < deadline and ops == 0:
        for _ in range(50):
            r.execute_command("PING")
        info = r.execute_command("INFO", "stats")
        ops = int(info["instantaneous_ops_per_sec"]) if isinstance(info, dict) else \
            int(str(info).split("instantaneous_ops_per_sec:")[1].split()[0])
        time.sleep(0.05)
    assert ops > 0
    r.close()


def test_config_set_slowlog_applies_at_once_on_an_idle_node(node: NodeProc) -> None:
    time.sleep(settle_s)
    r = node.client()
    try:
        r.execute_command("SLOWLOG", "RESET")
        r.execute_command("CONFIG", "SET", "slowlog-log-slower-than", 0)
        for _ in range(WORKERS * 4):  # the kernel picks a worker per connection
            c = node.client()
            c.execute_command("PING")
            c.close()
        assert r.execute_command("SLOWLOG", "LEN") >= WORKERS * 4  # every PING, on any worker
    finally:
        r.execute_command("CONFIG", "SET", "slowlog-log-slower-than", 10000)
        r.close()
