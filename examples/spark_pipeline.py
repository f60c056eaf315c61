"""A Spark pipeline through Disque: CSV -> jobs -> streaming consumer -> totals.

    make run                                   # a node on 127.0.0.1:7711 (other terminal)
    .venv/bin/python examples/spark_pipeline.py [--nodes 127.0.0.1:7711] [--queue sales]

1. Load ``examples/data/sales.csv`` (2,000 orders: city, product, quantity, amount).
2. Enqueue every order as one job (body = the row as JSON) with the batch writer.
3. Consume the queue with a streaming query (Trigger.AvailableNow): jobs are
   acknowledged only after each micro-batch reached the sink.
4. Aggregate revenue and orders per city, print them, and check them against
   the same aggregation computed straight from the CSV.
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

from disque_mp.client import Disque
from disque_mp.spark import local_session

CSV = Path(__file__).resolve().parent / "data" / "sales.csv"
ORDER_SCHEMA = "order_id int, city string, product string, quantity int, amount double"


def wait_with_progress(query: Any, every_s: int = 2) -> None:
    """awaitTermination, printing each micro-batch as it completes (jobs taken, then ACKed)."""
    seen = -1
    done = 0
    while True:
        finished = query.awaitTermination(every_s)
        for progress in query.recentProgress:
            if progress["batchId"] > seen and progress["numInputRows"]:
                seen = progress["batchId"]
                done += progress["numInputRows"]
                print(f"  micro-batch {seen}: {progress['numInputRows']} jobs "
                      f"({done} so far)", flush=True)
        if finished:
            return


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="127.0.0.1:7711", help="comma-separated host:port list")
    ap.add_argument("--queue", default=f"sales-{uuid.uuid4().hex[:6]}")
    args = ap.parse_args()

    print("starting a local Spark session (local[2]; the JVM takes 10-30 s to start) ...",
          flush=True)
    spark = local_session("disque-pipeline")
    orders = spark.read.csv(str(CSV), header=True, schema=ORDER_SCHEMA)
    print(f"enqueueing {CSV.name} into {args.queue!r} with the batch writer ...", flush=True)

    # 2. one job per order; RETRY 60 s: a job a crashed consumer took comes back within a minute
    (orders.select(F.to_json(F.struct(*orders.columns)).alias("body"))
     .write.format("disque").option("nodes", args.nodes).option("queue", args.queue)
     .option("retry", "60").mode("append").save())
    with Disque(args.nodes) as d:
        print(f"enqueued {d.qlen(args.queue)} jobs into {args.queue!r}")

    # 3. + 4. consume and aggregate
    jobs = (spark.readStream.format("disque").option("nodes", args.nodes)
            .option("queue", args.queue).option("max_jobs_per_batch", "500").load())
    parsed = jobs.select(F.from_json(F.col("body").cast("string"), ORDER_SCHEMA).alias("o"))
    totals = (parsed.groupBy("o.city")
              .agg(F.count("*").alias("orders"), F.round(F.sum("o.amount"), 2).alias("revenue")))
    print("consuming with a streaming query (500 jobs per micro-batch) ...", flush=True)
    with tempfile.TemporaryDirectory() as checkpoint:
        query = (totals.writeStream.outputMode("complete").format("memory")
                 .queryName("city_totals").trigger(availableNow=True)
                 .option("checkpointLocation", checkpoint).start())
        wait_with_progress(query)
    result = spark.table("city_totals").orderBy(F.desc("revenue"))
    result.show()

    expected = (orders.groupBy("city").agg(F.count("*").alias("orders"),
                                           F.round(F.sum("amount"), 2).alias("revenue")))
    same = sorted(map(tuple, result.collect())) == sorted(map(tuple, expected.collect()))
    with Disque(args.nodes) as d:  # acknowledged jobs are gone from the node
        left = sum(1 for _ in d.iter_jobs(queue=args.queue))
    print(f"matches the CSV: {same}; jobs not yet acknowledged: {left}")
    spark.stop()


if __name__ == "__main__":
    main()
