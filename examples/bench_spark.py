"""Throughput of the Spark ``disque`` source: batch write and streaming consume.

    .venv/bin/python examples/bench_spark.py                 # starts its own node
    .venv/bin/python examples/bench_spark.py --nodes 127.0.0.1:7711 --rows 1000000

Phase 1 writes ``--rows`` rows (short string bodies) with the batch writer
(``--partitions`` tasks, pipelined ADDJOB) and reports jobs/s from ``save()``
start to end. Phase 2 consumes the same queue with a streaming query
(Trigger.AvailableNow, a ``noop`` sink, ``--batch`` jobs per micro-batch) and
reports jobs/s from ``start()`` to termination, including acknowledgements.
The first Spark action of a session pays ~10 s of start-up, so a warm-up write
of 1,000 rows runs first. Numbers are wall-clock on this machine: noisy.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from disque_mp.client import Disque  # noqa: E402
from disque_mp.spark import local_session  # noqa: E402


def write_jobs(spark, nodes: str, queue: str, rows: int, partitions: int) -> float:
    df = spark.range(rows, numPartitions=partitions).selectExpr(
        "concat('job-', cast(id as string)) as body")
    start = time.perf_counter()
    (df.write.format("disque").option("nodes", nodes).option("queue", queue)
     .option("retry", "600").mode("append").save())
    return time.perf_counter() - start


def consume_jobs(spark, nodes: str, queue: str, batch: int, heartbeat: bool,
                 prefetch: bool = False) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as checkpoint:
        stream = (spark.readStream.format("disque").option("nodes", nodes)
                  .option("queue", queue).option("max_jobs_per_batch", str(batch))
                  .option("count", "5000").option("heartbeat", str(heartbeat).lower())
                  .option("prefetch", str(prefetch).lower()).load())
        start = time.perf_counter()
        query = (stream.writeStream.format("noop").trigger(availableNow=True)
                 .option("checkpointLocation", checkpoint).start())
        query.awaitTermination()
        elapsed = time.perf_counter() - start
        if query.exception() is not None:
            raise RuntimeError(query.exception())
        rows = sum(p["numInputRows"] for p in query.recentProgress)
    return elapsed, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", help="use running nodes; default: start one (tests/nodeproc.py)")
    ap.add_argument("--workers", type=int, default=2, help="workers of the node started here")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--batch", type=int, default=100_000, help="max jobs per micro-batch")
    ap.add_argument("--no-heartbeat", action="store_true")
    ap.add_argument("--prefetch", action="store_true", help="stream option prefetch=true")
    args = ap.parse_args()

    with ExitStack() as stack:
        nodes = args.nodes
        if nodes is None:
            from tests.nodeproc import NodeProc

            tmp = stack.enter_context(tempfile.TemporaryDirectory())
            node = stack.enter_context(NodeProc(Path(tmp), workers=args.workers))
            nodes = f"127.0.0.1:{node.port}"
        spark = local_session("disque-bench", cores=2)
        stack.callback(spark.stop)
        queue = f"bench-{uuid.uuid4().hex[:6]}"
        write_jobs(spark, nodes, queue + "-warmup", 1000, args.partitions)
        consume_jobs(spark, nodes, queue + "-warmup", 1000, True)

        elapsed = write_jobs(spark, nodes, queue, args.rows, args.partitions)
        with Disque(nodes) as d:
            queued = d.qlen(queue)
        print(f"batch write: {args.rows} rows in {elapsed:.1f} s = {args.rows / elapsed:,.0f} "
              f"jobs/s ({args.partitions} partitions); QLEN after: {queued}")

        elapsed, rows = consume_jobs(spark, nodes, queue, args.batch, not args.no_heartbeat,
                                     args.prefetch)
        with Disque(nodes) as d:
            left = d.qlen(queue)
        print(f"stream consume: {rows} jobs in {elapsed:.1f} s = {rows / elapsed:,.0f} jobs/s "
              f"(batches of <= {args.batch}, heartbeat {'off' if args.no_heartbeat else 'on'}, "
              f"prefetch {'on' if args.prefetch else 'off'}); "
              f"QLEN after: {left}")


if __name__ == "__main__":
    main()
