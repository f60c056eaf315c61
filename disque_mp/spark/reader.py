"""Batch read: a snapshot of the jobs of the queues (JSCAN ... REPLY all) on
every node listed, without consuming them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import (
    DataSourceReader,
    InputPartition,
)

from disque_mp.spark.options import Options


def snapshot_rows(opts: Options) -> Iterator[tuple[Any, ...]]:
    """Every job of the queues on every listed node, each ID once (first node wins)."""
    seen: set[str] = set()
    for address in opts.nodes:
        client = opts.client([address])
        try:
            for queue in opts.queues:
                for job in client.iter_jobs(queue=queue, states=opts.states, reply_all=True):
                    if job["id"] in seen:
                        continue
                    seen.add(job["id"])
                    yield (job["id"], job["queue"], job.get("body", b""), job.get("state"),
                           job.get("ctime"), job.get("nacks", 0),
                           job.get("additional-deliveries", 0))
        finally:
            client.close()


class DisqueBatchReader(DataSourceReader):
    def __init__(self, opts: Options) -> None:
        self.opts = opts

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return snapshot_rows(self.opts)
