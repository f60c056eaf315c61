"""The ``disque`` data source for PySpark 4 (Python Data Source API).

    from disque_mp.spark import DisqueDataSource
    spark.dataSource.register(DisqueDataSource)

    df.write.format("disque").option("queue", "events").mode("append").save()
    spark.read.format("disque").option("queue", "events").load()        # snapshot
    spark.readStream.format("disque").option("queue", "events").load()  # consume

Batch write: each partition pipelines ADDJOB to a node. The body comes from the
``body`` column (string or binary; ``body_column`` renames it), the queue from
option ``queue`` or per row from a string column (``queue_column``, default
``queue``). A refused ADDJOB fails the task with the server's error text. The
writer's commit logs the number of jobs added and, with option ``report_file``,
appends it as a JSON line to that file.

Batch read: a snapshot of the jobs of a queue (JSCAN ... REPLY all) on the
nodes listed, without consuming them.

Streaming read, at-least-once end to end: the long-lived source process takes
jobs in ``latestOffset`` with ``GETJOB NOHANG COUNT n``, keeps them in memory
under a batch sequence number (the offset), ships them to executors inside the
partitions, keeps them alive with WORKING while they are in flight, and ACKs
them in ``commit(end)``, which Spark calls after the sink committed the batch.
Spark calls ``commit(end_N)`` only while it plans batch N+1, so when the queue
is idle and batch N is not acknowledged yet, ``latestOffset`` offers one empty
batch. A query that dies before commit leaves its jobs un-acked; Disque
delivers them again after their RETRY. After a restart, a batch the dead source
process had taken is re-planned empty (its jobs come back through Disque).

Streaming write: the same as the batch write, per micro-batch.

Rows read carry the job ID and the delivery counters, so sinks can
de-duplicate. Pitfalls this module minds are listed in ``docs/client-spark.md``
("PySpark facts": connect lazily, picklable partitions, RESP2, no CLIENT SETINFO).

Modules: ``options`` (the options, checked; the schema), ``source`` (the
``DataSource``), ``writer`` (batch and streaming writes), ``reader`` (batch
read), ``stream`` (streaming read: ``StreamState`` and its reader),
``session`` (a local SparkSession for tests and examples).
"""

from __future__ import annotations

from disque_mp.spark.options import (
    JOB_STATES,
    KNOWN_OPTIONS,
    SCHEMA,
    Options,
    check_reachable,
    parse_options,
)
from disque_mp.spark.reader import DisqueBatchReader, snapshot_rows
from disque_mp.spark.session import find_java17_home, local_session
from disque_mp.spark.source import DisqueDataSource, register
from disque_mp.spark.stream import DisqueStreamReader, StreamState, queued_in_cluster
from disque_mp.spark.writer import DisqueStreamWriter, DisqueWriter

__all__ = [
    "JOB_STATES", "KNOWN_OPTIONS", "SCHEMA", "DisqueBatchReader", "DisqueDataSource",
    "DisqueStreamReader", "DisqueStreamWriter", "DisqueWriter", "Options", "StreamState",
    "check_reachable", "find_java17_home", "local_session", "parse_options",
    "queued_in_cluster", "register", "snapshot_rows",
]
