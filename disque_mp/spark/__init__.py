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
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from disque_mp.client import (
    Disque,
    DisqueError,
    Job,
    addjob_args,
    parse_nodes,
    pipeline_commands_max,
)

log = logging.getLogger("disque_mp.spark")

Address = tuple[str, int]

SCHEMA = ("id string, queue string, body binary, state string, ctime long, "
          "nacks long, additional_deliveries long")

# Jobs one micro-batch takes at most: they sit in the driver-side source process
# until the batch commits, so memory is the limit (about 100 bytes + body each).
stream_batch_jobs_max = 1_000_000
# Heartbeat thread: how often it looks for batches due a WORKING, at most.
heartbeat_tick_s = 0.25
# A job in flight gets its first WORKING after this long (half of Disque's
# smallest RETRY), then again every half retry (the spec's example says 80 %;
# half leaves room for the tick above and a loaded machine).
stream_heartbeat_first_s = 0.5
stream_heartbeat_fraction = 0.5
# The stream source asks HELLO for the cluster's nodes again after this long.
node_refresh_s = 10.0
# How long stop() waits for the ACKs of committed batches to go out.
ack_drain_timeout_s = 30.0
# Jobs of a batch asked for their retry in the first heartbeat round.
heartbeat_sample_jobs = 16
# Spark-side option keys that reach data sources and are not ours.
_FOREIGN_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})


# --------------------------------------------------------------------------- options


_INT_OPTIONS = {  # name -> (minimum, what it is)
    "replicate": (1, "a number of nodes"),
    "retry": (0, "seconds"),
    "ttl": (1, "seconds"),
    "delay": (0, "seconds"),
    "timeout_ms": (0, "milliseconds"),
    "maxlen": (1, "a number of jobs"),
    "count": (1, "jobs per GETJOB"),
    "max_jobs_per_batch": (1, "jobs"),
    "num_partitions": (1, "partitions"),
}
_BOOL_OPTIONS = ("async", "heartbeat", "fast_ack", "prefetch", "route_to_owner", "tls")
_STR_OPTIONS = ("nodes", "queue", "queue_column", "body_column", "report_file", "states",
                "tls_ca_cert_file", "tls_cert_file", "tls_key_file")
JOB_STATES = ("wait-repl", "active", "queued", "acked")
KNOWN_OPTIONS = frozenset(_INT_OPTIONS) | frozenset(_BOOL_OPTIONS) | frozenset(_STR_OPTIONS)


@dataclass(slots=True)
class Options:
    """The data source's options, checked. Every failure says what to fix."""

    nodes: list[tuple[str, int]]
    queues: list[str] = field(default_factory=list)
    queue_column: str | None = None
    body_column: str = "body"
    replicate: int | None = None
    retry: int | None = None
    ttl: int | None = None
    delay: int | None = None
    maxlen: int | None = None
    timeout_ms: int = 0
    async_: bool = False
    count: int = 1000
    max_jobs_per_batch: int = 10_000
    num_partitions: int = 2
    heartbeat: bool = True
    fast_ack: bool = False
    prefetch: bool = False  # measured: no gain on 2 cores shared by Spark and the node
    route_to_owner: bool = False  # clients send job commands to the owning worker's port
    report_file: str | None = None
    states: list[str] = field(default_factory=list)
    # TLS to the nodes' tls-port (give those ports in nodes): the CA that signed the
    # nodes' certificates, and our own certificate when they ask for one
    tls: bool = False
    tls_ca_cert_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    def nodes_text(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.nodes)

    def redis_kwargs(self) -> dict[str, Any]:
        """What every client of this source passes to redis-py: TLS when asked."""
        if not self.tls:
            return {}
        return {"ssl": True, "ssl_ca_certs": self.tls_ca_cert_file,
                "ssl_certfile": self.tls_cert_file, "ssl_keyfile": self.tls_key_file}

    def client(self, nodes: list[tuple[str, int]] | None = None, **kw: Any) -> Disque:
        return Disque(self.nodes if nodes is None else nodes, redis_kwargs=self.redis_kwargs(),
                      **kw)

    def addjob_options(self) -> dict[str, Any]:
        return {"replicate": self.replicate, "retry": self.retry, "ttl": self.ttl,
                "delay": self.delay, "maxlen": self.maxlen, "async_": self.async_}


def _parse_int(name: str, text: str) -> int:
    minimum, unit = _INT_OPTIONS[name]
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"option {name}={text!r} must be an integer ({unit})") from None
    if value < minimum:
        raise ValueError(f"option {name}={text!r} must be >= {minimum} ({unit})")
    return value


def _parse_bool(name: str, text: str) -> bool:
    low = text.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise ValueError(f"option {name}={text!r} must be true or false")


def parse_options(raw: Mapping[str, str]) -> Options:
    """Spark's case-insensitive option map -> Options (values arrive as strings)."""
    given = {str(k).lower(): str(v) for k, v in raw.items()}
    unknown = sorted(k for k in given if k not in KNOWN_OPTIONS and k not in _FOREIGN_OPTIONS
                     and not k.startswith("spark."))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for format 'disque'; "
                         f"valid options: {', '.join(sorted(KNOWN_OPTIONS))}")
    try:
        nodes = parse_nodes(given.get("nodes"))
    except ValueError as exc:
        raise ValueError(f"option nodes={given.get('nodes')!r}: {exc}; give a comma-separated "
                         "list such as nodes=127.0.0.1:7711,127.0.0.1:7712") from None
    opts = Options(nodes=nodes)
    if "queue" in given:
        opts.queues = [q.strip() for q in given["queue"].split(",") if q.strip()]
        if not opts.queues:
            raise ValueError("option queue is empty: name a queue, e.g. queue=events")
    opts.queue_column = given.get("queue_column")
    opts.body_column = given.get("body_column", "body")
    opts.report_file = given.get("report_file")
    for name in ("tls_ca_cert_file", "tls_cert_file", "tls_key_file"):
        setattr(opts, name, given.get(name))
    opts.states = [s.strip() for s in given.get("states", "").split(",") if s.strip()]
    bad_states = [s for s in opts.states if s not in JOB_STATES]
    if bad_states:
        raise ValueError(f"option states: unknown state(s) {', '.join(bad_states)}; "
                         f"use a comma-separated subset of {', '.join(JOB_STATES)}")
    for name in _INT_OPTIONS:
        if name in given:
            setattr(opts, name, _parse_int(name, given[name]))
    opts.async_ = _parse_bool("async", given["async"]) if "async" in given else False
    for name in _BOOL_OPTIONS[1:]:  # "async" is set above (its field is async_)
        if name in given:
            setattr(opts, name, _parse_bool(name, given[name]))
    return opts


def check_reachable(opts: Options) -> None:
    """Fail planning early, on the driver, when no listed node answers HELLO."""
    client = opts.client(connect_timeout=3.0, socket_timeout=10.0)
    try:
        client.connect()
    except DisqueError as exc:
        raise ConnectionError(f"option nodes={opts.nodes_text()}: {exc}; check the addresses "
                              "and that the Disque nodes are running") from None
    finally:
        client.close()


def _require_queues(opts: Options, what: str) -> list[str]:
    if not opts.queues:
        raise ValueError(f"{what} needs option queue (e.g. .option('queue', 'events'); "
                         "several queues: queue=a,b)")
    return opts.queues


# --------------------------------------------------------------------------- data source


class DisqueDataSource(DataSource):
    """Format ``disque``: see the module doc for options and guarantees."""

    @classmethod
    def name(cls) -> str:
        return "disque"

    def schema(self) -> str:
        return SCHEMA

    def _opts(self) -> Options:
        return parse_options(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return DisqueWriter(_write_plan(self._opts(), schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return DisqueStreamWriter(_write_plan(self._opts(), schema))

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = self._opts()
        _require_queues(opts, "reading")
        check_reachable(opts)
        return DisqueBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = self._opts()
        _require_queues(opts, "readStream")
        check_reachable(opts)
        return DisqueStreamReader(opts)


# --------------------------------------------------------------------------- writing


@dataclass(slots=True)
class WritePlan:
    """What every write task needs: options and the column positions."""

    opts: Options
    body_index: int
    queue_index: int | None


def _write_plan(opts: Options, schema: StructType) -> WritePlan:
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


# --------------------------------------------------------------------------- batch read


def _snapshot_rows(opts: Options) -> Iterator[tuple[Any, ...]]:
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
        return _snapshot_rows(self.opts)


# --------------------------------------------------------------------------- streaming read


class JobsPartition(InputPartition):
    """Jobs taken on the driver, shipped to the executor that turns them into rows."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        super().__init__(None)
        self.rows = rows


def _row(job: Job) -> tuple[Any, ...]:
    return (job.id, job.queue, job.body, "active", None, job.nacks or 0,
            job.additional_deliveries or 0)


@dataclass(slots=True)
class _Batch:
    jobs: list[Job]
    taken_at: float  # monotonic time GETJOB returned them
    next_beat: float  # monotonic time of the next WORKING round
    sampled: bool = False  # has the retry of a sample of its jobs been asked for
    committed: bool = False  # Spark committed it; the acker thread is ACKing it


def _new_batch(jobs: list[Job], taken_at: float) -> _Batch:
    return _Batch(jobs, taken_at, taken_at + stream_heartbeat_first_s)


class StreamState:
    """The source process's memory: jobs taken and not yet acknowledged, per batch.

    Lives only in the long-lived source runner process (never pickled). Three
    threads help the Spark-facing calls: the acker (commit hands it the IDs and
    returns; a crash before the ACK only means a duplicate delivery), the
    prefetcher (takes the next batch's jobs while Spark runs this one), and the
    heartbeat (WORKING for jobs held).
    """

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        # HELLO, QLEN, and ACKs whose node is gone
        self.client = opts.client(route_to_owner=opts.route_to_owner)
        self.take_lock = threading.Lock()  # one taker at a time: latestOffset or prefetcher
        # written under take_lock (entries are only added):
        self.node_clients: dict[Address, Disque] = {}  # one per node HELLO lists
        self.nodes_seen_at = -node_refresh_s  # monotonic time of the last HELLO
        self.next_node = 0  # round robin start over node_clients
        self.lock = threading.Lock()  # guards everything below
        self.origin: dict[str, Address] = {}  # job ID -> node that delivered it
        self.batches: dict[int, _Batch] = {}
        self.ready: _Batch | None = None  # prefetched, not offered to Spark yet
        self.prefetch_target = 0  # jobs to keep ready: the last batch limit
        self.issued = 0  # highest sequence number latestOffset returned
        self.available_now_left: int | None = None
        self.stopping = threading.Event()
        self.wake_prefetch = threading.Event()
        self.acks: queue.SimpleQueue[list[int] | None] = queue.SimpleQueue()
        self.threads = [self._start(self._ack_loop, "acker")]
        if opts.heartbeat:
            self.threads.append(self._start(self._beat_loop, "heartbeat"))
        if opts.prefetch:
            self.threads.append(self._start(self._prefetch_loop, "prefetch"))

    @staticmethod
    def _start(target: Any, name: str) -> threading.Thread:
        thread = threading.Thread(target=target, daemon=True, name=f"disque-stream-{name}")
        thread.start()
        return thread

    # ---- taking jobs

    def _nodes(self) -> list[tuple[Address, Disque]]:
        """Every node HELLO lists (refreshed every node_refresh_s), in round-robin order.

        Jobs are queued on one node at a time and GETJOB NOHANG does not pull
        jobs from other nodes (only a blocked GETJOB makes a node ask), so the
        source takes from every node itself. Called with take_lock held.
        """
        now = time.monotonic()
        if now - self.nodes_seen_at >= node_refresh_s:
            self.nodes_seen_at = now
            for node in self.client.hello().nodes:
                address = (node.host, node.port)
                if address not in self.node_clients:
                    self.node_clients[address] = self.opts.client(
                        [address], failover_attempts=0, follow_priority=False,
                        route_to_owner=self.opts.route_to_owner)
        nodes = list(self.node_clients.items())
        self.next_node = (self.next_node + 1) % max(1, len(nodes))
        return nodes[self.next_node:] + nodes[:self.next_node]

    def _getjob(self, want: int) -> list[Job]:
        """Up to want jobs from the nodes in turn, within the AvailableNow budget
        (call with take_lock held)."""
        with self.lock:
            if self.available_now_left is not None:
                want = min(want, self.available_now_left)
                self.available_now_left -= want
        got: list[Job] = []
        for address, client in self._nodes() if want > 0 else []:
            try:
                jobs = client.get_jobs(self.opts.queues, nohang=True, count=want - len(got),
                                       withcounters=True)
            except DisqueError as exc:  # down or leaving: the others still serve
                log.warning("disque stream: GETJOB on %s:%d failed: %s", *address, exc)
                continue
            with self.lock:
                for job in jobs:
                    self.origin[job.id] = address
            got += jobs
            if len(got) >= want:
                break
        with self.lock:
            if self.available_now_left is not None:
                self.available_now_left += want - len(got)
        return got

    def _by_node(self, ids: list[str]) -> dict[Address, list[str]]:
        """Job IDs grouped by the node that delivered them (call with self.lock held)."""
        groups: dict[Address, list[str]] = {}
        for job_id in ids:
            groups.setdefault(self.origin.get(job_id, ("", 0)), []).append(job_id)
        return groups

    def _send_by_node(self, verb: str, ids: list[str], per_command: int) -> list[Any]:
        """``verb`` for the IDs on the node that delivered each, pipelined; when that
        node fails, through the main client (any node of the cluster takes it).
        Replies in no particular order, errors as DisqueError values."""
        with self.lock:
            groups = self._by_node(ids)
        replies: list[Any] = []
        for address, group in groups.items():
            commands = [[verb, *group[i:i + per_command]]
                        for i in range(0, len(group), per_command)]
            client = self.node_clients.get(address, self.client)
            try:
                replies += client.execute_many(commands, raise_on_error=False)
            except DisqueError:
                replies += self.client.execute_many(commands, raise_on_error=False)
        return replies

    def _take(self, limit: int) -> list[Job]:
        jobs: list[Job] = []
        while len(jobs) < limit:
            want = min(self.opts.count, limit - len(jobs))
            got = self._getjob(want)
            jobs += got
            if len(got) < want:
                break
        return jobs

    def _prefetch_loop(self) -> None:
        while not self.stopping.is_set():
            self.wake_prefetch.wait()
            self.wake_prefetch.clear()
            while not self.stopping.is_set():
                with self.take_lock:
                    with self.lock:
                        held = len(self.ready.jobs) if self.ready else 0
                        want = min(self.opts.count, self.prefetch_target - held)
                    got = self._getjob(want) if want > 0 else []
                    if got:
                        with self.lock:
                            if self.ready is None:
                                self.ready = _new_batch([], time.monotonic())
                            self.ready.jobs += got
                if len(got) < want or want <= 0:
                    break

    def _claim_ready(self, limit: int) -> tuple[list[Job], float]:
        """Prefetched jobs, at most limit (with self.lock held)."""
        if self.ready is None:
            return [], time.monotonic()
        ready = self.ready
        jobs, ready.jobs = ready.jobs[:limit], ready.jobs[limit:]
        if not ready.jobs:
            self.ready = None
        return jobs, ready.taken_at

    def latest(self, start_seq: int, limit: int) -> int:
        with self.take_lock:
            with self.lock:
                self.issued = max(self.issued, start_seq)
                if self.issued > start_seq:  # offered before and not planned yet: again
                    return self.issued
                jobs, taken_at = self._claim_ready(limit)
            jobs += self._take(limit - len(jobs))
            with self.lock:
                self.prefetch_target = limit
                seq = self._next_offset(start_seq, jobs, taken_at)
        self.wake_prefetch.set()
        return seq

    def _next_offset(self, start_seq: int, jobs: list[Job], taken_at: float) -> int:
        if jobs:
            self.issued += 1
            self.batches[self.issued] = _new_batch(jobs, taken_at)
            return self.issued
        if any(seq <= start_seq and not b.committed for seq, b in self.batches.items()):
            self.issued += 1  # an empty batch, so Spark commits the ones before it
            return self.issued
        return start_seq

    def rows(self, start_seq: int, end_seq: int) -> list[tuple[Any, ...]]:
        with self.lock:
            return [_row(job) for seq, batch in sorted(self.batches.items())
                    if start_seq < seq <= end_seq for job in batch.jobs]

    # ---- acknowledging

    def commit(self, end_seq: int) -> None:
        with self.lock:
            done = [seq for seq, b in self.batches.items() if seq <= end_seq and not b.committed]
            for seq in done:
                self.batches[seq].committed = True
        if done:
            self.acks.put(done)

    def _ack_loop(self) -> None:
        verb = "FASTACK" if self.opts.fast_ack else "ACKJOB"
        while (done := self.acks.get()) is not None:
            with self.lock:
                ids = [job.id for seq in done for job in self.batches[seq].jobs]
            try:
                replies = self._send_by_node(verb, ids, pipeline_commands_max)
                failed = [r for r in replies if isinstance(r, DisqueError)]
                if failed:
                    raise failed[0]
                log.info("disque stream: acknowledged %d jobs of batches %s", len(ids), done)
            except DisqueError as exc:  # they will be delivered again after RETRY
                log.error("disque stream: ACK of %d jobs failed: %s", len(ids), exc)
            with self.lock:
                for seq in done:
                    self.batches.pop(seq, None)
                for job_id in ids:
                    self.origin.pop(job_id, None)

    # ---- heartbeat

    def _beat_loop(self) -> None:
        """WORKING for jobs held, before their retry time elapses.

        The first round asks a sample of a batch (WORKING returns the retry),
        then every job gets WORKING every half of the smallest retry seen, counted
        from when the jobs were taken. A job whose retry is shorter than every
        sampled one may be queued again while held: a duplicate delivery, never
        a lost job. Sampling keeps short batches free of WORKING traffic (a
        full round costs as much as the GETJOB that took the jobs).
        """
        while not self.stopping.wait(heartbeat_tick_s):
            now = time.monotonic()
            with self.lock:
                held = [*self.batches.values(), *([self.ready] if self.ready else [])]
                due = [b for b in held if b.next_beat <= now]
            for batch in due:
                with self.lock:
                    jobs = list(batch.jobs)
                if batch.sampled:
                    retry_s, since = self._beat(jobs), time.monotonic()
                else:
                    step = max(1, len(jobs) // heartbeat_sample_jobs)
                    retry_s = self._beat(jobs[::step][:heartbeat_sample_jobs])
                    since = batch.taken_at
                with self.lock:
                    batch.sampled = True
                    batch.next_beat = (since + retry_s * stream_heartbeat_fraction
                                       if retry_s > 0 else float("inf"))

    def _beat(self, jobs: list[Job]) -> int:
        """WORKING for the jobs; the smallest retry returned (0: none to keep)."""
        try:
            replies = self._send_by_node("WORKING", [j.id for j in jobs], 1)
        except DisqueError as exc:
            log.warning("disque stream heartbeat failed: %s", exc)
            return 1  # try again soon
        return min((r for r in replies if isinstance(r, int) and r > 0), default=0)

    # ---- end

    def close(self) -> None:
        """Finish the ACKs of committed batches; put prefetched jobs back in their queues.

        Batches planned but not committed stay un-acked: Disque delivers them
        again after their RETRY.
        """
        self.stopping.set()
        self.wake_prefetch.set()
        self.acks.put(None)
        for thread in self.threads:
            thread.join(timeout=ack_drain_timeout_s)
        with self.lock:
            ready, self.ready = self.ready, None
        if ready is not None and ready.jobs:
            try:
                self._send_by_node("ENQUEUE", [j.id for j in ready.jobs], pipeline_commands_max)
            except DisqueError as exc:
                log.warning("disque stream: could not requeue %d prefetched jobs (they come "
                            "back after RETRY): %s", len(ready.jobs), exc)
        for client in [self.client, *self.node_clients.values()]:
            client.close()


def queued_in_cluster(client: Disque, queues: list[str], opts: Options | None = None) -> int:
    """QLEN summed over every node HELLO lists (a job is queued on one node at a time)."""
    total = 0
    for node in client.hello().nodes:
        address = [(node.host, node.port)]
        other = opts.client(address, connect_timeout=2.0, socket_timeout=10.0) \
            if opts is not None else Disque(address, connect_timeout=2.0, socket_timeout=10.0)
        try:
            total += sum(other.qlen(q) for q in queues)
        except DisqueError as exc:  # unreachable: its jobs wait for the next run
            log.warning("disque: QLEN on %s failed: %s", node.address, exc)
        finally:
            other.close()
    return total


class DisqueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"seq": n}``: batch n holds the jobs latestOffset took for it."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self._state: StreamState | None = None

    # The reader is pickled to executors: ship options only, never threads or sockets.
    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.opts = state["opts"]
        self._state = None

    def _live(self) -> StreamState:
        if self._state is None:
            self._state = StreamState(self.opts)
        return self._state

    def initialOffset(self) -> dict:
        return {"seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.opts.max_jobs_per_batch)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if isinstance(limit, ReadMaxRows):
            most = min(limit.max_rows, stream_batch_jobs_max)
        elif isinstance(limit, ReadAllAvailable):
            most = stream_batch_jobs_max
        else:
            most = self.opts.max_jobs_per_batch
        return {"seq": self._live().latest(int(start.get("seq", 0)), most)}

    def prepareForTriggerAvailableNow(self) -> None:
        """The query ends after taking as many jobs as are queued now, cluster-wide."""
        state = self._live()
        state.available_now_left = queued_in_cluster(state.client, self.opts.queues, self.opts)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        rows = self._live().rows(int(start.get("seq", 0)), int(end.get("seq", 0)))
        if not rows:
            return []
        parts = min(self.opts.num_partitions, len(rows))
        return [JobsPartition(rows[i::parts]) for i in range(parts)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, JobsPartition)
        return iter(partition.rows)

    def commit(self, end: dict) -> None:
        self._live().commit(int(end.get("seq", 0)))

    def stop(self) -> None:
        """Query ended (or failed): jobs not committed stay un-acked and come back after RETRY."""
        if self._state is not None:
            self._state.close()
            self._state = None


def register(spark: Any) -> None:
    """``spark.dataSource.register(DisqueDataSource)``."""
    spark.dataSource.register(DisqueDataSource)


def find_java17_home() -> str | None:
    """JAVA_HOME if it holds a Java 17, else the first JDK 17 under /usr/lib/jvm."""
    import glob
    import os

    current = os.environ.get("JAVA_HOME")
    if current and "17" in current and os.path.exists(os.path.join(current, "bin", "java")):
        return current
    for home in sorted(glob.glob("/usr/lib/jvm/*17*")):
        if os.path.exists(os.path.join(home, "bin", "java")):
            return home
    return current


def local_session(app_name: str = "disque-mp", cores: int = 2, **conf: str) -> Any:
    """A local SparkSession set up as docs/client-spark.md ("PySpark facts") advises,
    with the ``disque`` format registered. Call before any other Spark code."""
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers need pyarrow and disque_mp
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    java_home = find_java17_home()
    if java_home:
        os.environ["JAVA_HOME"] = java_home
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.sql.shuffle.partitions": str(cores),
        "spark.driver.memory": "1g",
        **conf,
    }
    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session
