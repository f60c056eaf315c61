"""The ``disque`` Spark source against a real 2-node cluster: writes spread over the
nodes, a snapshot read sees each replicated job once, and the streaming source
takes the jobs queued on every node (GETJOB NOHANG does not pull them over)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from disque_mp.client import Disque
from tests.nodeproc import NodeProc

cluster_form_timeout_s = 60.0
query_timeout_s = 180


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProc]]:
    base = Path(tmp_path_factory.mktemp("spark-cluster"))
    nodes = [NodeProc(base / f"n{i}", workers=1) for i in range(2)]
    try:
        for n in nodes:
            n.start()
        nodes[0].client(protocol=2).execute_command("CLUSTER", "MEET", "127.0.0.1",
                                                    nodes[1].port)
        deadline = time.monotonic() + cluster_form_timeout_s
        for n in nodes:
            with Disque([f"127.0.0.1:{n.port}"]) as d:
                while len(d.hello().nodes) < 2:
                    assert time.monotonic() < deadline, "cluster did not form"
                    time.sleep(0.1)
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def _gone_or_acked(clients: list[Disque], job_id: str) -> bool:
    return all((c.show(job_id) or {"state": "acked"})["state"] == "acked" for c in clients)


def test_cluster_write_snapshot_and_stream(spark: Any, pair: list[NodeProc],
                                          tmp_path: Path) -> None:
    queue = f"cl-{uuid.uuid4().hex[:8]}"
    both = ",".join(f"127.0.0.1:{n.port}" for n in pair)
    a, b = (Disque([f"127.0.0.1:{n.port}"], follow_priority=False) for n in pair)
    with a, b:
        df = spark.range(1000).selectExpr("concat('r', cast(id as string)) as body").repartition(4)
        (df.write.format("disque").option("nodes", both).option("queue", queue)
         .option("replicate", "2").option("retry", "60").mode("append").save())
        assert a.qlen(queue) + b.qlen(queue) == 1000

        rows = (spark.read.format("disque").option("nodes", both).option("queue", queue)
                .load().collect())
        assert len(rows) == 1000 and len({r.id for r in rows}) == 1000  # replicas once

        extra = a.add_jobs(((queue, f"a{i}") for i in range(100)), retry=60, replicate=1)
        extra += b.add_jobs(((queue, f"b{i}") for i in range(100)), retry=60, replicate=1)
        seen: list[Any] = []
        query = (spark.readStream.format("disque").option("nodes", f"127.0.0.1:{pair[0].port}")
                 .option("queue", queue).option("max_jobs_per_batch", "1000").load()
                 .writeStream.foreachBatch(lambda df, _: seen.extend(df.collect()))
                 .trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "ck")).start())
        assert query.awaitTermination(query_timeout_s)
        assert query.exception() is None
        ids = [r.id for r in rows] + extra
        assert sorted(r.id for r in seen) == sorted(ids)
        assert a.qlen(queue) + b.qlen(queue) == 0
        deadline = time.monotonic() + query_timeout_s
        while not all(_gone_or_acked([a, b], i) for i in extra):
            assert time.monotonic() < deadline, "jobs not acknowledged"
            time.sleep(0.2)
