"""Dramatiq on disque-mp: a worker, a delayed message, Retries, the dead-letter queue.

    make run                                       # a node on 127.0.0.1:7711 (other terminal)
    .venv/bin/python examples/dramatiq_demo.py [--nodes 127.0.0.1:7711,127.0.0.1:7712]

The script starts a real ``dramatiq`` worker on this module, sends messages, and
reads what the actors report from a Disque queue. Your own app only needs:

    from disque_mp.dramatiq import DisqueBroker
    dramatiq.set_broker(DisqueBroker(nodes=["127.0.0.1:7711", "127.0.0.1:7712"]))
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dramatiq

from disque_mp.client import Disque
from disque_mp.dramatiq import DisqueBroker

NODES = os.environ.get("DEMO_NODES", "127.0.0.1:7711")
QUEUE = "dramatiq-demo"
REPORTS = "dramatiq-demo-reports"

# Retries' backoff is NACK DELAY on the same job; a message that keeps killing its
# worker lands in dead:<queue> after 5 deliveries (MAXDELIVER)
broker = DisqueBroker(nodes=NODES, visibility_timeout=60, max_deliveries=5)
dramatiq.set_broker(broker)


def report(text: str) -> None:
    with Disque(NODES) as d:
        d.add_job(REPORTS, text)


@dramatiq.actor(queue_name=QUEUE)
def greet(name: str) -> None:
    report(f"hello {name} at {time.strftime('%X')}")


@dramatiq.actor(queue_name=QUEUE, max_retries=2, min_backoff=500, max_backoff=1000)
def unreliable(what: str) -> None:
    report(f"unreliable({what!r}) failed")
    raise RuntimeError(f"{what}: backend down")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default=NODES)
    args = ap.parse_args()
    env = dict(os.environ, DEMO_NODES=args.nodes)
    if args.nodes != NODES:  # the app was configured at import: start again with these nodes
        os.execve(sys.executable, [sys.executable, __file__, "--nodes", args.nodes], env)
    here = Path(__file__).resolve().parent
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(here), env.get("PYTHONPATH")]))
    worker = subprocess.Popen([sys.executable, "-m", "dramatiq", "dramatiq_demo", "--processes",
                               "1", "--threads", "2"], env=env, cwd=str(here),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        with Disque(args.nodes) as d:
            print(f"sent at {time.strftime('%X')}: two greetings (one delayed 2.5 s, run after "
                  "3 s: Disque delays in whole seconds) and a failing message")
            greet.send("tom")
            greet.send_with_options(args=("ann",), delay=2500)
            unreliable.send("payment")
            seen, deadline = 0, time.monotonic() + 60
            while seen < 5 and time.monotonic() < deadline:
                for job in d.get_jobs(REPORTS, timeout_ms=500, count=10):
                    print("  actor said:", job.body.decode())
                    d.ack(job)
                    seen += 1
            dead = QUEUE + ".XQ"
            while d.qlen(dead) == 0 and time.monotonic() < deadline:
                time.sleep(0.2)
            print(f"dead letters in {dead!r}: {d.qlen(dead)} (Retries gave up after 2 retries)")
            for job in d.qpeek(dead, 10):
                d.ack(job)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()


if __name__ == "__main__":
    main()
