"""Dramatiq on disque-mp: a worker, a delayed message, Retries, the dead-letter queue.

    make run                                       # a node on 127.0.0.1:7711 (other terminal)
    .venv/bin/python examples/dramatiq_demo.py [--nodes 127.0.0.1:7711,127.0.0.1:7712]

The script starts a real ``dramatiq`` worker on this module, sends messages, and
reads what the actors report from a Disque queue. Your own app only needs:

    from disque_mp.dramatiq import DisqueBroker
    dramatiq.set_broker(DisqueBroker(nodes=["127.0.0.1:7711", "127.0.0.1:7712"]))
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import demo_worker  # examples/demo_worker.py: what the two broker demos share
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
    nodes, env = demo_worker.demo_nodes(__doc__, NODES, __file__)
    here = Path(__file__).resolve().parent
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(here), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "dramatiq", "dramatiq_demo", "--processes", "1", "--threads",
           "2"]
    with demo_worker.worker_process(cmd, env, cwd=str(here), quiet=True), Disque(nodes) as d:
        print(f"sent at {time.strftime('%X')}: two greetings (one delayed 2.5 s, run after "
              "3 s: Disque delays in whole seconds) and a failing message")
        greet.send("tom")
        greet.send_with_options(args=("ann",), delay=2500)
        unreliable.send("payment")
        deadline = time.monotonic() + 60
        demo_worker.print_reports(d, REPORTS, 5, deadline, "actor")
        demo_worker.print_dead_letters(d, "dead:" + QUEUE, deadline, "Retries gave up after 2 retries")


if __name__ == "__main__":
    main()
