"""Priorities, measured: a backlog of priority 0 queued, then a few jobs of
priority 9; at which deliveries do the priority-9 jobs come out?

    python -m bench.priority                     # 100,000 + 100; bench/results/priority.{json,md}
    python -m bench.priority --quick --out /tmp/p   # 5,000 + 100

- disque-mp, one node: ``ADDJOB q body 0`` (the backlog, priority 0), then
  ``ADDJOB ... PRIORITY 9``; one consumer ``GETJOB COUNT 100``.
- disque-mp, 3 nodes: backlog and priority-9 jobs added on node 1 (REPLICATE 1),
  the consumer on node 3 (nothing queued there: it imports by NEEDJOBS /
  YOURJOBS, and node 1 gives out its highest priorities first); and the
  priority-9 jobs added on node 2 instead (two sources).
- RabbitMQ, a classic queue with ``x-max-priority 9``, the priority-9 messages
  published with ``priority 9``; and a quorum queue (priorities there need
  RabbitMQ 4.0: the server installed may answer without them, the record says
  which it was).
- Celery over disque-mp and over RabbitMQ (``task_queue_max_priority 9``): the
  backlog's tasks sent, then the urgent ones with ``priority=9``, then one real
  worker (tests/brokers/proof_celery.py, one process, prefetch 1) started; the
  positions are those of the tasks' runs (PRIORITY_CELERY_BACKLOG, 10,000 by default:
  a Celery publish costs far more than an ADDJOB).

The scenario, its reader and its figures are bench/fair_tenants.py's (B's jobs are
the priority-9 ones): the delivery position (1-based) of the first and last
priority-9 job, counted from the first delivery after they were added.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import fair_tenants  # noqa: E402
from tests.nodeproc import NodeProc, form_cluster, unique_queue  # noqa: E402

# ADDJOB's options for the backlog's jobs and for the urgent ones
PRIORITY_OPTIONS: tuple[tuple[Any, ...], tuple[Any, ...]] = ((), ("PRIORITY", 9))
cluster_form_timeout_s = 60.0
celery_backlog_default = 10_000
urgent_n_base = 1_000_000  # the urgent tasks' numbers start here (the backlog's below)


def _cluster(workdir: Path, backlog: int, small: int) -> dict[str, Any]:
    nodes = [NodeProc(workdir / f"c{i}", workers=2,
                      conf={"cluster-node-timeout": 3000, "loglevel": "warning"})
             for i in range(3)]
    out: dict[str, Any] = {}
    try:
        for n in nodes:
            n.start()
        form_cluster(nodes, cluster_form_timeout_s)
        a, b, c = (n.port for n in nodes)
        out["disque-mp, 3 nodes (all on node 1)"] = fair_tenants.disque(
            (a, a, c), backlog, small, PRIORITY_OPTIONS)
        out["disque-mp, 3 nodes (priority 9 on node 2)"] = fair_tenants.disque(
            (a, b, c), backlog, small, PRIORITY_OPTIONS)
    finally:
        for n in nodes:
            n.stop()
    return out


def _rabbit(url: str, backlog: int, small: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, arguments in (("rabbitmq classic, x-max-priority 9", {"x-max-priority": 9}),
                            ("rabbitmq quorum, x-max-priority 9",
                             {"x-queue-type": "quorum", "x-max-priority": 9})):
        try:
            out[name] = fair_tenants.rabbitmq(url, backlog, small, arguments, 9)
        except Exception as exc:  # noqa: BLE001 - the record says what the server answered
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    return out


def celery(broker: str, url: str, workdir: Path, backlog: int, small: int) -> dict[str, Any]:
    """The scenario with Celery tasks and one real worker on ``url``."""
    import time

    from tests.brokers import proof
    from tests.brokers.conftest import WorkerProc

    os.environ["PROOF_MAX_PRIORITY"] = "9"  # the worker's queue (its env is ours and more)
    side = proof.Side(broker, url, workdir)
    q, rec = unique_queue("prio"), workdir / f"prio-{broker}.jsonl"
    app = side.producer()
    app.conf.task_queue_max_priority = 9  # the producer declares the queue as the worker
    t0 = time.monotonic()
    for i in range(backlog):
        proof.send(app, "echo", q, i)
    for i in range(small):
        proof.send(app, "echo", q, urgent_n_base + i, priority=9)
    t1 = time.monotonic()
    try:
        # started by hand: the queue is full, its log fills before celery_worker's
        # wait would see the ready line
        args = ["celery", "-A", proof.CELERY_APP, "worker", "-Q", q, "-P", "prefork", "-c",
                "1", "-l", "warning", "-n", "prio@%h", "--without-mingle", "--without-gossip",
                "--without-heartbeat"]
        side.workers.append(WorkerProc(args, side.env(q, rec), workdir / f"{q}.log").start())

        def urgent_run() -> bool:
            return sum(r["n"] >= urgent_n_base for r in proof.records(rec, "echo")) >= small

        proof.wait_for(urgent_run, proof.scenario_wait_max_s, "the urgent tasks")
    finally:
        side.stop_workers()
    t2 = time.monotonic()
    order = [b"B" if r["n"] >= urgent_n_base else b"A" for r in proof.records(rec, "echo")]
    return fair_tenants.figures(order, small, backlog, t1 - t0, t2 - t1)


def _celery_sides(workdir: Path, backlog: int, small: int,
                  brokers: list[str]) -> dict[str, Any]:
    from bench.brokers_rabbit import RabbitServer

    out: dict[str, Any] = {}
    if "celery-disque" in brokers:
        with NodeProc(workdir / "celery-node", workers=2,
                      conf={"loglevel": "warning", "maxmemory": "8gb"}) as node:
            out[f"celery over disque-mp ({backlog:,} tasks behind)"] = celery(
                "disque", f"disque://127.0.0.1:{node.port}", workdir, backlog, small)
    if "celery-rabbitmq" in brokers:
        rabbit = RabbitServer(workdir / "celery-rabbitmq").start()
        try:
            out[f"celery over rabbitmq, x-max-priority 9 ({backlog:,} tasks behind)"] = celery(
                "rabbitmq", rabbit.url, workdir, backlog, small)
        finally:
            rabbit.stop()
    return out


def run(workdir: Path, backlog: int, small: int, brokers: list[str]) -> dict[str, Any]:
    from bench.brokers_rabbit import RabbitServer, server_script

    out: dict[str, Any] = {}
    if "disque" in brokers:
        with NodeProc(workdir / "node", workers=2,
                      conf={"loglevel": "warning", "maxmemory": "8gb"}) as node:
            out["disque-mp, 1 node"] = fair_tenants.disque((node.port,) * 3, backlog, small,
                                                           PRIORITY_OPTIONS)
        out.update(_cluster(workdir / "cluster", backlog, small))
    if "rabbitmq" in brokers and Path(server_script).exists():  # Debian's rabbitmq-server
        rabbit = RabbitServer(workdir / "rabbitmq").start()
        try:
            out.update(_rabbit(rabbit.url, backlog, small))
        finally:
            rabbit.stop()
    celery_backlog = int(os.environ.get("PRIORITY_CELERY_BACKLOG", celery_backlog_default))
    out.update(_celery_sides(workdir, min(backlog, celery_backlog), small, brokers))
    return out


def to_markdown(report: dict[str, Any]) -> str:
    return fair_tenants.to_markdown(
        report, f"Priorities: {report['backlog']:,} jobs of priority 0 queued, then "
        f"{report['small']} of priority 9",
        ("first priority-9 delivery", "last priority-9 delivery", "all within the first"))


def main(argv: list[str] | None = None) -> int:
    return fair_tenants.record_run(argv, __doc__ or "", run, "priority",
                                   "disque,rabbitmq,celery-disque,celery-rabbitmq", to_markdown)


if __name__ == "__main__":
    sys.exit(main())
