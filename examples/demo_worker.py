"""What the two broker demos (celery_demo.py, dramatiq_demo.py) share besides their
apps: the ``--nodes`` option, the worker process each starts on itself, and printing
what its tasks report (they ADDJOB a line to a reports queue) and what landed in the
dead-letter queue."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from disque_mp.client import Disque

worker_stop_timeout_s = 30  # a warm shutdown gets this long, then the group is killed


def demo_nodes(doc: str, default: str, script: str) -> tuple[str, dict[str, str]]:
    """The demo's ``--nodes`` and the environment of its worker (``DEMO_NODES``). The
    app reads its nodes when imported: other nodes than ``default`` start ``script``
    again with them."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--nodes", default=default)
    nodes = ap.parse_args().nodes
    env = dict(os.environ, DEMO_NODES=nodes)
    if nodes != default:
        os.execve(sys.executable, [sys.executable, script, "--nodes", nodes], env)
    return nodes, env


@contextmanager
def worker_process(cmd: list[str], env: dict[str, str],
                   cwd: str | None = None, quiet: bool = False) -> Iterator[None]:
    """Run the worker command ``cmd`` in its own process group while the block runs;
    then SIGTERM it (a warm shutdown) and SIGKILL the group if it is still there."""
    out = subprocess.DEVNULL if quiet else None
    worker = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=out,
                              start_new_session=True)
    try:
        yield
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=worker_stop_timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()


def print_reports(d: Disque, queue: str, expected: int, deadline: float, who: str) -> None:
    """Print (and ACK) the lines the tasks report in ``queue``, until ``expected`` came
    or the monotonic ``deadline`` passed."""
    seen = 0
    while seen < expected and time.monotonic() < deadline:
        for job in d.get_jobs(queue, timeout_ms=500, count=10):
            print(f"  {who} said:", job.body.decode())
            d.ack(job)
            seen += 1


def print_dead_letters(d: Disque, dead: str, deadline: float, why: str) -> None:
    """Wait (until ``deadline``) for a job in the dead-letter queue ``dead``, say how
    many there are, and ACK them (the demo can run again)."""
    while d.qlen(dead) == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    print(f"dead letters in {dead!r}: {d.qlen(dead)} ({why})")
    for job in d.qpeek(dead, 10):
        d.ack(job)
