"""Fair tenants, measured: tenant A has a backlog queued, then tenant B adds a few;
at which deliveries do B's jobs come out?

    python -m bench.fair_tenants                    # 100,000 + 100; bench/results/fair-tenants.{json,md}
    python -m bench.fair_tenants --quick --out /tmp/f   # 5,000 + 100

- disque-mp, one node: ``ADDJOB ... GROUP A`` (backlog), then ``GROUP B``; one
  consumer ``GETJOB COUNT 100``: the queue serves its groups in rotation.
- disque-mp, 3 nodes: A's backlog added on node 1, B's on node 2 (REPLICATE 1),
  the consumer on node 3 (nothing queued there: it imports by NEEDJOBS/YOURJOBS).
- Redis list (RPUSH / LPOP), Redis Stream (XADD / XREADGROUP), RabbitMQ (one
  classic queue, basic.publish / basic.consume): one FIFO, the way Celery,
  Dramatiq and most hand-built queues use them.

A consumer reads until it has seen all of B's jobs (or the queue is empty); the
figure is the delivery position (1-based) of B's first and last job, counted from
the first delivery after B's jobs arrived. bench/brokers_proof.py runs the same
scenario (``points``: "8 fair tenants") on its servers for ``make bench-brokers``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import redis  # noqa: E402

from bench import record  # noqa: E402
from tests.nodeproc import NodeProc, form_cluster, free_port, unique_queue  # noqa: E402

pipeline_batch = 1000  # commands per pipelined round trip while filling a queue
read_batch = 100  # jobs per GETJOB / LPOP / XREADGROUP / consumer prefetch
read_rounds_max = 1_000_000  # bounds every read loop
consume_idle_s = 5.0  # a read that waited this long finds the queue empty
cluster_form_timeout_s = 60.0


def figures(order: list[bytes], small: int, backlog: int, fill_s: float,
             read_s: float) -> dict[str, Any]:
    pos = [i + 1 for i, body in enumerate(order) if body.startswith(b"B")]
    return {"backlog": backlog, "small": small, "deliveries_read": len(order),
            "b_delivered": len(pos), "b_first_at": pos[0] if pos else None,
            "b_last_at": pos[-1] if len(pos) == small else None,
            "b_all_within_2x": len(pos) == small and pos[-1] <= 2 * small,
            "fill_s": round(fill_s, 1), "read_s": round(read_s, 1)}


def _fill(r: redis.Redis, command: list[Any], tenant: str, n: int) -> None:
    for start in range(0, n, pipeline_batch):
        p = r.pipeline(transaction=False)
        for i in range(start, min(n, start + pipeline_batch)):
            p.execute_command(*[f"{tenant}{i}" if a == "{body}" else a for a in command])
        p.execute()


def disque(ports: tuple[int, int, int], backlog: int, small: int,
           options: tuple[tuple[Any, ...], tuple[Any, ...]] = (("GROUP", "A"), ("GROUP", "B")),
           ) -> dict[str, Any]:
    """``ports``: where A adds, where B adds, where the consumer reads (one node: the
    same port three times); ``options``: ADDJOB's options for A's jobs and B's
    (bench/priority.py gives B a PRIORITY instead of the groups)."""
    q = unique_queue("fair")
    ra, rb, rc = (redis.Redis(port=p, protocol=2, socket_timeout=60) for p in ports)
    t0 = time.monotonic()
    _fill(ra, ["ADDJOB", q, "{body}", 0, "REPLICATE", 1, *options[0]], "A", backlog)
    _fill(rb, ["ADDJOB", q, "{body}", 0, "REPLICATE", 1, *options[1]], "B", small)
    t1 = time.monotonic()
    order: list[bytes] = []
    seen_b = 0
    for _ in range(read_rounds_max):
        got = rc.execute_command("GETJOB", "TIMEOUT", int(consume_idle_s * 1000),
                                 "COUNT", read_batch, "FROM", q)
        if not got:
            break
        rc.execute_command("FASTACK", *[e[1] for e in got])
        order += [e[2] for e in got]
        seen_b += sum(1 for e in got if e[2].startswith(b"B"))
        if seen_b >= small:
            break
    t2 = time.monotonic()
    for r in (ra, rb, rc):
        r.execute_command("DELQUEUE", q)
    return figures(order, small, backlog, t1 - t0, t2 - t1)


def redis_list(port: int, backlog: int, small: int) -> dict[str, Any]:
    r: Any = redis.Redis(port=port, protocol=2, socket_timeout=60)
    q = unique_queue("fair")
    t0 = time.monotonic()
    _fill(r, ["RPUSH", q, "{body}"], "A", backlog)
    _fill(r, ["RPUSH", q, "{body}"], "B", small)
    t1 = time.monotonic()
    order: list[bytes] = []
    seen_b = 0
    for _ in range(read_rounds_max):
        got = r.lpop(q, read_batch)
        if not got:
            break
        order += got
        seen_b += sum(1 for b in got if b.startswith(b"B"))
        if seen_b >= small:
            break
    t2 = time.monotonic()
    r.delete(q)
    return figures(order, small, backlog, t1 - t0, t2 - t1)


def redis_stream(port: int, backlog: int, small: int) -> dict[str, Any]:
    r: Any = redis.Redis(port=port, protocol=2, socket_timeout=60)
    q = unique_queue("fair")
    r.xgroup_create(q, "workers", id="0", mkstream=True)
    t0 = time.monotonic()
    _fill(r, ["XADD", q, "*", "body", "{body}"], "A", backlog)
    _fill(r, ["XADD", q, "*", "body", "{body}"], "B", small)
    t1 = time.monotonic()
    order: list[bytes] = []
    seen_b = 0
    for _ in range(read_rounds_max):
        got = r.xreadgroup("workers", "c1", {q: ">"}, count=read_batch)
        entries = got[0][1] if got else []
        if not entries:
            break
        r.xack(q, "workers", *[eid for eid, _ in entries])
        bodies = [fields[b"body"] for _, fields in entries]
        order += bodies
        seen_b += sum(1 for b in bodies if b.startswith(b"B"))
        if seen_b >= small:
            break
    t2 = time.monotonic()
    r.delete(q)
    return figures(order, small, backlog, t1 - t0, t2 - t1)


def rabbitmq(url: str, backlog: int, small: int, arguments: dict[str, Any] | None = None,
             small_priority: int | None = None) -> dict[str, Any]:
    """``arguments``: the queue's (bench/priority.py: ``x-max-priority``, a quorum
    queue), B's messages published with ``small_priority``."""
    import pika

    # kombu's URL names the default vhost "//" (vhost "/"); pika reads "%2F"
    conn = pika.BlockingConnection(pika.URLParameters(url[:-2] + "/%2F"
                                                      if url.endswith("//") else url))
    try:
        ch = conn.channel()
        q = unique_queue("fair")
        ch.queue_declare(q, durable=bool(arguments), arguments=arguments)
        t0 = time.monotonic()
        for tenant, n in (("A", backlog), ("B", small)):
            props = pika.BasicProperties(priority=small_priority) \
                if tenant == "B" and small_priority is not None else None
            for i in range(n):
                ch.basic_publish("", q, f"{tenant}{i}".encode(), props)
        conn.process_data_events(0)
        t1 = time.monotonic()
        ch.basic_qos(prefetch_count=read_batch)
        order: list[bytes] = []
        seen_b = 0
        for method, _props, body in ch.consume(q, inactivity_timeout=consume_idle_s):
            if method is None:
                break
            ch.basic_ack(method.delivery_tag)
            order.append(body)
            seen_b += body.startswith(b"B")
            if seen_b >= small or len(order) >= read_rounds_max:
                break
        t2 = time.monotonic()
        ch.cancel()
        ch.queue_delete(q)
        return figures(order, small, backlog, t1 - t0, t2 - t1)
    finally:
        conn.close()


def on_side(broker: str, url: str, backlog: int, small: int) -> dict[str, Any]:
    """The scenario on one server of bench/brokers_proof.py (its ``Side``'s URL)."""
    if broker == "disque":
        port = int(url.split(";")[0].rsplit(":", 1)[1].split("/")[0])
        return {"disque-mp": disque((port, port, port), backlog, small)}
    if broker == "redis":
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        return {"redis list": redis_list(port, backlog, small),
                "redis stream": redis_stream(port, backlog, small)}
    return {"rabbitmq": rabbitmq(url, backlog, small)}


def _cluster(workdir: Path, backlog: int, small: int,
             options: tuple[tuple[Any, ...], tuple[Any, ...]] = (("GROUP", "A"), ("GROUP", "B")),
             ) -> dict[str, Any]:
    nodes = [NodeProc(workdir / f"c{i}", workers=2,
                      conf={"cluster-node-timeout": 3000, "loglevel": "warning"})
             for i in range(3)]
    try:
        for n in nodes:
            n.start()
        form_cluster(nodes, cluster_form_timeout_s)
        return disque((nodes[0].port, nodes[1].port, nodes[2].port), backlog, small, options)
    finally:
        for n in nodes:
            n.stop()


def run(workdir: Path, backlog: int, small: int, brokers: list[str]) -> dict[str, Any]:
    from bench.brokers_rabbit import RabbitServer
    from bench.redisq import RedisServer

    out: dict[str, Any] = {}
    if "disque" in brokers:
        with NodeProc(workdir / "node", workers=2,
                      conf={"loglevel": "warning", "maxmemory": "8gb"}) as node:
            out["disque-mp, 1 node"] = disque((node.port,) * 3, backlog, small)
        out["disque-mp, 3 nodes"] = _cluster(workdir / "cluster", backlog, small)
    if "redis" in brokers and shutil.which("redis-server"):
        server = RedisServer(workdir / "redis", free_port()).start()
        try:
            out["redis list"] = redis_list(server.port, backlog, small)
            out["redis stream"] = redis_stream(server.port, backlog, small)
        finally:
            server.stop()
    if "rabbitmq" in brokers:
        rabbit = RabbitServer(workdir / "rabbitmq").start()
        try:
            out["rabbitmq"] = rabbitmq(rabbit.url, backlog, small)
        finally:
            rabbit.stop()
    return out


# the table's columns for B's jobs (bench/priority.py names its priority-9 jobs)
LABELS = ("B's first delivery", "B's last delivery", "all of B within the first")


def to_markdown(report: dict[str, Any], title: str = "", labels: tuple[str, str, str] = LABELS,
                ) -> str:
    title = title or f"Fair tenants: {report['backlog']:,} of A's jobs queued, then " \
        f"{report['small']} of B's"
    lines = [f"# {title}", "",
             f"{report['time']}, {report['machine']}, node build: {report['node_build']}, "
             f"commit {report.get('commit', '?')}, "
             f"load (1 min) {report['loadavg_1m'][0]} -> {report['loadavg_1m'][1]}.", "",
             f"| queue | {labels[0]} | {labels[1]} | {labels[2]} "
             f"{2 * report['small']} | fill s | read s |", "|---|---|---|---|---|---|"]
    for name, f in report["results"].items():
        if "error" in f:
            lines.append(f"| {name} | error: {f['error']} | | | | |")
            continue
        last = f["b_last_at"] if f["b_last_at"] is not None else \
            f"{f['b_delivered']} of {f['small']} in {f['deliveries_read']}"
        lines.append(f"| {name} | {f['b_first_at']} | {last} | "
                     f"{'yes' if f['b_all_within_2x'] else 'no'} | {f['fill_s']} | "
                     f"{f['read_s']} |")
    return "\n".join(lines) + "\n"


Run = Callable[[Path, int, int, list[str]], dict[str, Any]]


def record_run(argv: list[str] | None, doc: str, run: Run, stem: str, brokers: str,
               markdown: Callable[[dict[str, Any]], str]) -> int:
    """The command line of a backlog-then-a-few record: ``run`` over the brokers
    asked for, the report in ``<out>/<stem>.json`` and ``.md`` (``markdown``)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a backlog of 5,000 (a look)")
    ap.add_argument("--backlog", type=int, default=0)
    ap.add_argument("--small", type=int, default=100)
    ap.add_argument("--brokers", default=brokers)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from disque_mp import compiled

    backlog = args.backlog or (5_000 if args.quick else 100_000)
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{stem}-"))
    load_before = os.getloadavg()[0]
    try:
        results = run(workdir, backlog, args.small, args.brokers.split(","))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report = {"time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{os.cpu_count()} CPUs, {platform.platform()}",
              "node_build": compiled.summary(), "commit": record.commit(), "backlog": backlog,
              "small": args.small,
              "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
              "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(report))
    print(markdown(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    return record_run(argv, __doc__ or "", run, "fair-tenants", "disque,redis,rabbitmq",
                      to_markdown)


if __name__ == "__main__":
    sys.exit(main())
