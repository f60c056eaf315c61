"""A Python client for Disque (and disque-mp) on top of redis-py.

    from disque_mp.client import Disque
    d = Disque(["127.0.0.1:7711", "127.0.0.1:7712"])
    job_id = d.add_job("emails", b"send to tom@example.net", retry=60)
    for job in d.get_jobs("emails", timeout_ms=1000):
        ...
        d.ack(job.id)

It follows the spec's "Client libraries" protocol: connect to a random reachable
node from the list, run ``HELLO`` to learn every node and its priority, move to
another node (lowest priority first) when the current one answers ``-LEAVING``
or drops the connection, and optionally move to the node that produces most of
the jobs this client receives (``prefer_producer=True``; the node shows in the
job ID prefix).

The modules:

- ``core``: everything that is not I/O (errors, records, reply parsing, argument
  building, node selection, the tunables); no asyncio, threading or sockets.
- ``sync``: ``Disque`` over redis-py, thread-safe; ``Heartbeat`` keeps jobs alive.
- ``batching``: ``AddWindow`` (pipelined ADDJOB, a bounded window of unanswered
  adds whose errors surface on the next add or on ``flush``) and ``AckBatcher``
  (ACKJOB in batches from a thread), what the Celery and Dramatiq brokers use
  to avoid a round trip per message.
- ``aio``: ``AsyncDisque`` over redis.asyncio, the same methods as coroutines
  (also importable as ``disque_mp.aclient.AsyncDisque``).

The names below are re-exported from ``core``, ``batching`` and ``sync``. The tunables
(``producer_sample_jobs``, ``pipeline_bytes_max`` ...) are read by both clients from
``disque_mp.client.core``: set them there, not on this package.
"""

from disque_mp.client.batching import AckBatcher, AddWindow, add_window_default
from disque_mp.client.core import (
    DEFAULT_NODE,
    AddJobOptions,
    BadIdError,
    ClientSettings,
    CommandError,
    DisqueConnectionError,
    DisqueError,
    GetJobOptions,
    Hello,
    Job,
    LeavingError,
    NodeInfo,
    NoJobError,
    NoReplicationError,
    OutOfMemoryError,
    PausedError,
    Progress,
    TooLateError,
    Topology,
    addjob_args,
    consume_batch,
    consume_done,
    consume_poll_ms,
    error_from_reply,
    getjob_args,
    heartbeat_first_s,
    heartbeat_retry_fraction,
    is_leaving,
    jscan_args,
    map_redis_error,
    parse_address,
    parse_hello,
    parse_info,
    parse_job,
    parse_jobs,
    parse_nodes,
    parse_pairs,
    parse_scan,
    pipeline_bytes_max,
    pipeline_commands_max,
    producer_sample_jobs,
    producer_share_min,
    qscan_args,
)
from disque_mp.client.sync import Disque, Heartbeat

__all__ = [
    "DEFAULT_NODE",
    "AckBatcher",
    "AddWindow",
    "AddJobOptions",
    "BadIdError",
    "ClientSettings",
    "CommandError",
    "Disque",
    "DisqueConnectionError",
    "DisqueError",
    "Heartbeat",
    "GetJobOptions",
    "Hello",
    "Job",
    "LeavingError",
    "NodeInfo",
    "NoJobError",
    "NoReplicationError",
    "OutOfMemoryError",
    "PausedError",
    "Progress",
    "TooLateError",
    "Topology",
    "add_window_default",
    "addjob_args",
    "consume_batch",
    "consume_done",
    "consume_poll_ms",
    "error_from_reply",
    "getjob_args",
    "heartbeat_first_s",
    "heartbeat_retry_fraction",
    "is_leaving",
    "jscan_args",
    "map_redis_error",
    "parse_address",
    "parse_hello",
    "parse_info",
    "parse_job",
    "parse_jobs",
    "parse_nodes",
    "parse_pairs",
    "parse_scan",
    "pipeline_bytes_max",
    "pipeline_commands_max",
    "producer_sample_jobs",
    "producer_share_min",
    "qscan_args",
]
