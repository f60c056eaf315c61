"""Writing: batch and streaming writes, each partition pipelining ADDJOB to a
node; the commit logs the count and appends it to ``report_file``."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from disque_mp.client import (
    Disque,
    DisqueError,
    addjob_args,
    pipeline_commands_max,
)
from disque_mp.spark.options import Options, check_reachable

log = logging.getLogger("disque_mp.spark")


@dataclass(slots=True)
class WritePlan:
    """What every write task needs: options and the column positions."""

    opts: Options
    body_index: int
    queue_index: int | None


def write_plan(opts: Options, schema: StructType) -> WritePlan:
    names = [f.name for f in schema.fields]
    if opts.body_column not in names:
        raise ValueError(f"no body column {opts.body_column!r} in columns {names}; name the "
                         "job body column 'body' or set option body_column")
    body_type = schema.fields[names.index(opts.body_column)].dataType
    if not isinstance(body_type, StringType | BinaryType):
        raise ValueError(f"body column {opts.body_column!r} is {body_type.simpleString()}; "
                         "cast it to string or binary (e.g. to_json(struct(*)) for rows)")
    if len(opts.queues) > 1:
        raise ValueError(f"option queue={','.join(opts.queues)!r}: writing takes one queue; "
                         "to spread rows over queues use a queue column (option queue_column)")
    queue_index = None
    if opts.queue_column is not None or not opts.queues:
        column = opts.queue_column or "queue"
        if column not in names:
            raise ValueError(f"no queue column {column!r} in columns {names}; set option queue "
                             "to one queue name, or option queue_column to a string column")
        queue_index = names.index(column)
        queue_type = schema.fields[queue_index].dataType
        if not isinstance(queue_type, StringType):
            raise ValueError(f"queue column {column!r} is {queue_type.simpleString()}; it must "
                             "hold queue names as strings (cast it to string)")
    check_reachable(opts)
    return WritePlan(opts, names.index(opts.body_column), queue_index)


@dataclass
class WriteReport(WriterCommitMessage):
    jobs: int
    partition: int


def _write_rows(plan: WritePlan, rows: Iterator[Any]) -> WriteReport:
    """One task: pipeline ADDJOB for every row; a refused job fails the task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    opts = plan.opts
    default_queue = opts.queues[0] if opts.queues else None
    add_options = opts.addjob_options()
    client = opts.client(route_to_owner=opts.route_to_owner)
    written = 0
    batch: list[list[Any]] = []
    try:
        for row in rows:
            queue = row[plan.queue_index] if plan.queue_index is not None else default_queue
            body = row[plan.body_index]
            if queue is None or body is None:
                raise ValueError(f"row {written + len(batch)} has a null "
                                 f"{'queue' if queue is None else 'body'}; filter nulls out")
            batch.append(addjob_args(queue, bytes(body) if isinstance(body, bytearray) else body,
                                     opts.timeout_ms, **add_options))
            if len(batch) >= pipeline_commands_max:
                written += _send(client, batch, written)
                batch = []
        if batch:
            written += _send(client, batch, written)
    finally:
        client.close()
    return WriteReport(written, ctx.partitionId() if ctx else 0)


def _send(client: Disque, batch: list[list[Any]], before: int) -> int:
    replies = client.execute_many(batch, raise_on_error=False)
    for i, reply in enumerate(replies):
        if isinstance(reply, DisqueError):
            raise RuntimeError(f"ADDJOB refused for row {before + i} (queue "
                               f"{batch[i][1]!r}): {reply}") from None
    return len(replies)


def _report(opts: Options, messages: Sequence[Any], batch_id: int | None) -> int:
    jobs = sum(m.jobs for m in messages if isinstance(m, WriteReport))
    log.info("disque: %d jobs added by %d tasks%s", jobs, len(messages),
             "" if batch_id is None else f" in batch {batch_id}")
    if opts.report_file:
        line = {"jobs_added": jobs, "tasks": len(messages), "batch_id": batch_id,
                "time": time.time()}
        with open(opts.report_file, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
    return jobs


class DisqueWriter(DataSourceWriter):
    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> WriteReport:
        return _write_rows(self.plan, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _report(self.plan.opts, [m for m in messages if m is not None], None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        added = sum(m.jobs for m in messages if isinstance(m, WriteReport))
        log.warning("disque write aborted; %d jobs were already added by tasks that finished",
                    added)


class DisqueStreamWriter(DataSourceStreamWriter):
    """At-least-once: a micro-batch Spark runs again adds its jobs again."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> WriteReport:
        return _write_rows(self.plan, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _report(self.plan.opts, [m for m in messages if m is not None], batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("disque stream write of batch %d aborted", batchId)
