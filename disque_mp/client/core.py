"""The client's sans-I/O core: all that ``Disque`` (``disque_mp.client.sync``) and
``AsyncDisque`` (``disque_mp.client.aio``) share, none of which does I/O.

- errors: ``DisqueError`` and a subclass per error code, ``error_from_reply`` (an
  error reply's text -> exception), ``map_redis_error`` (a redis-py error reply ->
  exception), ``is_leaving`` (whether an error means "use another node");
- records and parsers: ``Job``, ``NodeInfo``, ``Hello``, and ``parse_*`` for the
  replies as redis-py returns them in RESP2 (bytes, ints, nested lists, None);
- argument building: ``addjob_args``, ``getjob_args``, ``qscan_args``,
  ``jscan_args``, and the splitting of a pipeline into round trips;
- ``Topology``: the nodes HELLO reported, which to try next, when to follow the
  producer of the jobs received;
- ``ClientSettings``: the seeds, connection settings and failover budget, and the
  decision whether a failed command is raised or sent to another node; plus the
  consume loop's decisions (``consume_done``, ``consume_batch``);
- worker ports (``route_to_owner=True``): ``parse_worker_layout`` reads what
  ``INFO workers`` announces, ``owner_of_command`` names the worker owning a
  command's queue or job IDs, ``WorkerRoutes`` picks the port (or the main one).

A client builds a command's arguments here, sends them its own way (redis-py with
threads in ``sync``, redis.asyncio in ``aio``), hands the reply to a parser, a failure
to ``ClientSettings._raise_unless_retrying``, and each HELLO to ``Topology.learn``;
``Topology.candidates`` then says which node to connect to. This module imports
neither asyncio, threading nor redis, opens no socket and reads no clock, so all of
it is tested without a server (``tests/client/test_client_core.py``).

The tunables below are read at call time by both clients: set them on this module.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, Protocol, TypedDict, TypeVar, Unpack, cast

from workers.ids import is_valid_job_id, owner_of_job_id, owner_of_queue
from workers.job import dedup_bytes_max

DEFAULT_NODE = "127.0.0.1:7711"

# After this many jobs received, prefer_producer looks at where they came from.
producer_sample_jobs = 1000
# A foreign node must have produced at least this share of the sample to move there
# (a clear majority: moving costs a reconnect and a HELLO).
producer_share_min = 0.5
# ADDJOBs sent before reading replies in add_jobs (bounds client memory, and the
# server's output buffer for one connection).
pipeline_commands_max = 1000
# Bytes of commands sent in one pipelined round trip. Bounds client memory, and
# disque-mp's front end lost framing on pipelines of ~2.5 MB (seen with 60 ACKJOBs
# of 1000 IDs each; reported), so stay well below that.
pipeline_bytes_max = 1 << 20
# Consumer heartbeat: a job still in a handler after this long gets its first
# WORKING (half of Disque's smallest RETRY, 1 s), then again every half retry.
# The spec's example waits for 80 %; half leaves a loaded machine (late thread
# wake-ups) a margin of half a retry, for one more WORKING per job and retry.
heartbeat_first_s = 0.5
heartbeat_retry_fraction = 0.5
# How long one GETJOB of the consumer loop blocks before it re-checks its stop flag.
consume_poll_ms = 1000


# --------------------------------------------------------------------------- errors


# An error reply's code word -> the DisqueError subclass raised for it (filled in as
# each subclass below is defined with its code).
_ERROR_CLASSES: dict[str, type[DisqueError]] = {}


class DisqueError(Exception):
    """A Disque error reply (``code`` is its first word: ERR, NOJOB, ...) or a client failure.

    A subclass names its code in its header, ``class PausedError(DisqueError,
    code="PAUSED")``; ``error_from_reply`` then raises it for that code's replies
    (``reply=False``: a client-side failure, never read from a reply). A subclass
    without a code keeps its parent's."""

    code = "ERR"

    def __init_subclass__(cls, code: str | None = None, reply: bool = True,
                          **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if code is not None:  # else: the parent's code, and its replies stay the parent's
            cls.code = code
            if reply:
                _ERROR_CLASSES[code] = cls

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class CommandError(DisqueError, code="ERR"):
    """``-ERR ...``: a bad command or bad arguments."""


class NoReplicationError(DisqueError, code="NOREPL"):
    """``-NOREPL``: not enough reachable nodes for the requested replication level."""


class PausedError(DisqueError, code="PAUSED"):
    """``-PAUSED``: the queue is paused in input."""


class LeavingError(DisqueError, code="LEAVING"):
    """``-LEAVING``: the node is leaving the cluster; connect to another one."""


class NoJobError(DisqueError, code="NOJOB"):
    """``-NOJOB``: the node does not know this job (WORKING)."""


class BadIdError(DisqueError, code="BADID"):
    """``-BADID``: not a job ID."""


class TooLateError(DisqueError, code="TOOLATE"):
    """``-TOOLATE``: WORKING refused, half of the job's TTL already elapsed."""


class OutOfMemoryError(DisqueError, code="OOM"):
    """``-OOM``: the node is out of memory."""


class DisqueConnectionError(DisqueError, code="CONNECTION", reply=False):
    """No node of the list could be reached (the message says which were tried)."""


def error_from_reply(text: str) -> DisqueError:
    """The exception for an error reply's full text (``"NOJOB Job not known ..."``)."""
    code = text.split(" ", 1)[0]
    cls = _ERROR_CLASSES.get(code, DisqueError)
    return cls(text, code)


def map_redis_error(exc: Exception) -> DisqueError:
    """A redis-py ``ResponseError`` as the DisqueError of its reply.

    redis-py strips the code word of errors it knows (ERR, OOM ...) into
    ``status_code``: put it back. Read as an attribute, so the core needs no redis.
    """
    text = str(exc)
    status = getattr(exc, "status_code", None)
    if status:
        text = f"{status} {text}"
    return error_from_reply(text)


def is_leaving(err: DisqueError) -> bool:
    """-LEAVING, or ADDJOB's NOREPL on a leaving node: both mean "use another node"."""
    if isinstance(err, LeavingError):
        return True
    return isinstance(err, NoReplicationError) and "leaving the cluster" in str(err)


# --------------------------------------------------------------------------- records


@dataclass(slots=True, frozen=True)
class Job:
    """A job as GETJOB/QPEEK return it. Counters are None unless asked for (WITHCOUNTERS)."""

    queue: str
    id: str
    body: bytes
    nacks: int | None = None
    additional_deliveries: int | None = None

    @property
    def producer_prefix(self) -> str:
        """The first 8 hex chars of the ID of the node that created the job."""
        return self.id[2:10]


@dataclass(slots=True, frozen=True)
class NodeInfo:
    id: str
    host: str
    port: int
    priority: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(slots=True, frozen=True)
class Hello:
    version: int
    node_id: str
    nodes: tuple[NodeInfo, ...]


# --------------------------------------------------------------------------- parsing


def as_str(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def parse_address(text: str | tuple[str, int]) -> tuple[str, int]:
    """``"host:port"`` or ``(host, port)`` -> ``(host, port)``; ValueError says what is wrong."""
    if isinstance(text, tuple):
        host, port = text
        return str(host), int(port)
    host, sep, port_text = str(text).strip().rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"node address {text!r} is not host:port (for example 127.0.0.1:7711)")
    return host.strip("[]"), int(port_text)


def parse_nodes(nodes: str | Sequence[str | tuple[str, int]] | None) -> list[tuple[str, int]]:
    if nodes is None:
        nodes = [DEFAULT_NODE]
    if isinstance(nodes, str):
        nodes = [n for n in nodes.split(",") if n.strip()]
    addresses = [parse_address(n) for n in nodes]
    if not addresses:
        raise ValueError("no node address given (for example nodes=['127.0.0.1:7711'])")
    return addresses


def parse_job(item: Sequence[Any]) -> Job:
    nacks = extra = None
    if len(item) >= 7:
        counters = {as_str(item[i]): item[i + 1] for i in range(3, len(item) - 1, 2)}
        nacks = int(counters.get("nacks", 0))
        extra = int(counters.get("additional-deliveries", 0))
    return Job(as_str(item[0]), as_str(item[1]), bytes(item[2]), nacks, extra)


def parse_jobs(reply: Any) -> list[Job]:
    if not reply:
        return []
    return [parse_job(item) for item in reply]


_SHOW_BYTES_FIELDS = frozenset({"body"})


def parse_pairs(reply: Any) -> dict[str, Any] | None:
    """A flat key/value array (SHOW, QSTAT, JSCAN REPLY all) -> dict; null -> None."""
    if reply is None:
        return None
    if isinstance(reply, dict):  # a RESP3 map, should a server send one
        reply = [x for kv in reply.items() for x in kv]
    out: dict[str, Any] = {}
    for i in range(0, len(reply) - 1, 2):
        key = as_str(reply[i])
        value = reply[i + 1]
        if isinstance(value, list):
            value = [as_str(v) for v in value]
        elif isinstance(value, bytes) and key not in _SHOW_BYTES_FIELDS:
            value = as_str(value)
        out[key] = value
    return out


def parse_hello(reply: Any, host: str, port: int) -> Hello:
    """HELLO: version, my ID, then [id, ip, port, priority] per node.

    A standalone reference node reports an empty IP for itself: the address we
    connected to is used then.
    """
    version, my_id = int(reply[0]), as_str(reply[1])
    nodes = []
    for entry in reply[2:]:
        node_id, ip, node_port, priority = (as_str(x) for x in entry[:4])
        if not ip:
            ip, node_port = (host, str(port)) if node_id == my_id else (ip, node_port)
        if ip and node_port.isdigit():
            nodes.append(NodeInfo(node_id, ip, int(node_port), int(priority)))
    return Hello(version, my_id, tuple(nodes))


def parse_scan(reply: Any) -> tuple[int, list[Any]]:
    return int(reply[0]), list(reply[1] or [])


def queue_list(queues: str | bytes | Iterable[str | bytes]) -> list[str | bytes]:
    if isinstance(queues, str | bytes):
        return [queues]
    out = list(queues)
    if not out:
        raise ValueError("at least one queue name is needed")
    return out


def job_ids_of(ids: tuple[str | Job | Iterable[str | Job], ...]) -> list[str]:
    """Accept job IDs, Job records, or one iterable of either."""
    flat: list[str] = []
    for item in ids:
        if isinstance(item, Job):
            flat.append(item.id)
        elif isinstance(item, str | bytes):
            flat.append(as_str(item))
        else:
            flat.extend(x.id if isinstance(x, Job) else as_str(x) for x in item)
    return flat


# --------------------------------------------------------------------------- command builders


class AddJobOptions(TypedDict, total=False):
    """ADDJOB's options, as ``add_job`` / ``add_jobs`` / ``addjob_args`` take them.
    Times in seconds; ``maxdeliver`` is disque-mp's MAXDELIVER extension, ``dedup``
    its DEDUP one (a key, 1 to 256 bytes: while a job of the queue with that key is
    not acknowledged on the node, the add answers that job's ID and adds nothing)."""

    replicate: int | None
    delay: int | None
    retry: int | None
    ttl: int | None
    maxlen: int | None
    async_: bool
    maxdeliver: int | None
    dedup: str | bytes | None
    group: str | bytes | None  # fair tenants: GETJOB serves a queue's groups in rotation
    # with ``dedup``: the key keeps answering this job's ID this many seconds after
    # its ACK (DEDUP-KEEP), so a re-send just after the ACK adds nothing either
    dedup_keep: int | None
    priority: int | None  # 0..9, higher delivered first (PRIORITY; 0 or None: not sent)


# AddJobOptions' valued options and their words, in the order ADDJOB's arguments take them.
_ADDJOB_WORDS = (("replicate", "REPLICATE"), ("delay", "DELAY"), ("retry", "RETRY"),
                 ("ttl", "TTL"), ("maxlen", "MAXLEN"), ("maxdeliver", "MAXDELIVER"))
_ADDJOB_OPTIONS = AddJobOptions.__optional_keys__


def addjob_args(queue: str | bytes, body: bytes | str, timeout_ms: int = 0,
                **options: Unpack[AddJobOptions]) -> list[Any]:
    """ADDJOB's words; a keyword that is no AddJobOptions raises TypeError."""
    _check_options(dict(options), _ADDJOB_OPTIONS, "ADDJOB")
    args: list[Any] = ["ADDJOB", queue, body, int(timeout_ms)]
    for key, word in _ADDJOB_WORDS:
        value = cast("int | None", options.get(key))
        if value is not None:
            args += [word, int(value)]
    dedup = options.get("dedup")
    if dedup is not None:
        args += ["DEDUP", dedup]
    keep = options.get("dedup_keep")
    if keep is not None:
        args += ["DEDUP-KEEP", int(keep)]
    group = options.get("group")
    if group is not None:
        args += ["GROUP", group]
    priority = options.get("priority")
    if priority:
        args += ["PRIORITY", int(priority)]
    if options.get("async_"):
        args.append("ASYNC")
    return args


def schedule_args(name: str | bytes, queue: str | bytes, body: bytes | str, *,
                  cron: str | None = None, every: int | None = None, tz: str | None = None,
                  timeout_ms: int = 0, **options: Unpack[AddJobOptions]) -> list[Any]:
    """SCHEDULE SET (disque-mp extension): ``cron`` (5 fields, in ``tz``, UTC by
    default) or ``every`` (seconds), then the ADDJOB a firing runs."""
    if (cron is None) == (every is None):
        raise TypeError("schedule() takes exactly one of cron= or every=")
    if tz is not None and cron is None:
        raise TypeError("tz= goes with cron=")
    rule: list[Any] = ["EVERY", int(every)] if every is not None else \
        ["CRON", cron, *(["TZ", tz] if tz is not None else [])]
    return ["SCHEDULE", "SET", name, *rule, *addjob_args(queue, body, timeout_ms, **options)]


def parse_schedule(reply: Any) -> dict[str, Any]:
    """SCHEDULE SHOW's pairs -> a dict: texts as str, counts and times (epoch ms) as
    int, ``addjob`` as the ADDJOB words (bytes: a body may be any bytes)."""
    return {as_str(k): v if isinstance(v, (int, list)) else as_str(v)
            for k, v in zip(reply[::2], reply[1::2], strict=True)}


def task_dedup_key(task_id: str, retries: int = 0) -> str:
    """The DEDUP key the brokers give a task's message: its task ID, and for a
    retry published as a new message (Celery's ``retry``, a Dramatiq or Taskiq retry
    that could not requeue the job in place) the retry's number after a colon, so a
    retry is never taken for a re-send of the attempt it follows (that job is still
    held, unacknowledged, while its task retries). An ID too long for DEDUP is
    replaced by its SHA-256."""
    key = task_id if not retries else f"{task_id}:{int(retries)}"
    if len(key.encode()) > dedup_bytes_max:
        key = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    return key


def qgroups_args(queue: str | bytes, count: int | None) -> list[Any]:
    """QGROUPS (disque-mp extension): groups with queued jobs, largest first."""
    return ["QGROUPS", queue, *(["COUNT", int(count)] if count is not None else [])]


def parse_groups(reply: Any) -> list[tuple[str, int]]:
    """QGROUPS' [[group, n], ...] -> [(group, n)]; the ungrouped jobs are group ''."""
    return [(as_str(g), int(n)) for g, n in reply or []]


def qlimit_args(queue: str | bytes, active: int | None = None, rate: int | None = None,
                group_active: int | None = None, bcast: bool = False,
                reset: bool = False) -> list[Any]:
    """QLIMIT (disque-mp extension): set the limits given (0 takes one away), RESET
    them all, or none given: show them; ``bcast`` sets them on every reachable node."""
    args: list[Any] = ["QLIMIT", queue]
    if reset:
        args.append("RESET")
    for word, value in (("ACTIVE", active), ("RATE", rate), ("GROUP-ACTIVE", group_active)):
        if value is not None:
            args += [word, int(value)]
    if bcast:
        args.append("BCAST")
    return args


def parse_limits(reply: Any) -> dict[str, int]:
    """QLIMIT's reply: ``active``, ``rate``, ``group-active`` (0: none), ``in-use``,
    ``tokens`` (-1 without RATE), ``full-groups``, as ints."""
    return {as_str(k): int(v) for k, v in zip(reply[::2], reply[1::2], strict=True)}


def nack_args(ids: list[str], delay: int | None) -> list[Any]:
    """NACK, with disque-mp's DELAY extension (seconds) when ``delay`` is given."""
    return ["NACK", *ids, *(["DELAY", int(delay)] if delay is not None else [])]


class Progress(NamedTuple):
    """RESULT of a job still pending that reported progress (WORKING ... PROGRESS):
    the last value it reported (disque-mp's ``["progress", value]`` reply)."""

    value: bytes


def ack_args(ids: list[str], result: bytes | str | None) -> list[Any]:
    """ACKJOB, with disque-mp's RESULT extension (one job) when ``result`` is given."""
    if result is None:
        return ["ACKJOB", *ids]
    if len(ids) != 1:
        raise ValueError("ack(..., result=) takes exactly one job")
    return ["ACKJOB", ids[0], "RESULT", result]


def working_args(job_id: str, progress: bytes | str | None) -> list[Any]:
    """WORKING, with disque-mp's PROGRESS extension when ``progress`` is given."""
    return ["WORKING", job_id, *(["PROGRESS", progress] if progress is not None else [])]


def result_args(job_id: str, timeout_ms: int | None) -> list[Any]:
    """RESULT (disque-mp extension); ``timeout_ms`` None answers at once, 0 waits until
    the job is done, n waits at most n ms for a pending job."""
    return ["RESULT", job_id, *(["TIMEOUT", int(timeout_ms)] if timeout_ms is not None else [])]


def parse_result(reply: Any) -> bytes | Progress | None:
    """RESULT's reply: the value (bytes), ``Progress(value)`` for a pending job that
    reported progress, or None (no result, a job long gone)."""
    if isinstance(reply, list):
        return Progress(_bytes(reply[1])) if len(reply) == 2 else None
    return None if reply is None else _bytes(reply)


def waitjob_args(ids: list[str], timeout_ms: int | None) -> list[Any]:
    """WAITJOB (disque-mp extension); ``timeout_ms`` None or 0 waits forever."""
    return ["WAITJOB", *ids, *(["TIMEOUT", int(timeout_ms)] if timeout_ms is not None else [])]


def deadletter_args(ids: list[str], reason: str | bytes | None) -> list[Any]:
    """DEADLETTER (disque-mp extension), with a REASON (at most 1024 bytes) when given."""
    return ["DEADLETTER", *ids, *(["REASON", reason] if reason is not None else [])]


def redrive_args(dead_queue: str | bytes, count: int | None) -> list[Any]:
    """REDRIVE (disque-mp extension); no ``count``: as many as the node moves a call."""
    return ["REDRIVE", dead_queue, *(["COUNT", int(count)] if count is not None else [])]


def delqueue_args(queue: str | bytes, local: bool) -> list[Any]:
    """DELQUEUE (disque-mp extension): cluster-wide, or this node only."""
    return ["DELQUEUE", queue, *(["LOCAL"] if local else [])]


class GetJobOptions(TypedDict, total=False):
    """GETJOB's options, as ``get_jobs`` and ``getjob_args`` take them."""

    timeout_ms: int | None
    count: int | None
    nohang: bool
    withcounters: bool


def _check_options(options: dict[str, Any], known: frozenset[str], command: str) -> None:
    unknown = options.keys() - known
    if unknown:
        raise TypeError(f"unexpected {command} option(s): {', '.join(sorted(unknown))}")


def getjob_args(queues: str | bytes | Iterable[str | bytes],
                **options: Unpack[GetJobOptions]) -> list[Any]:
    """GETJOB's words; a keyword that is no GetJobOptions raises TypeError."""
    _check_options(dict(options), GetJobOptions.__optional_keys__, "GETJOB")
    args: list[Any] = ["GETJOB"]
    if options.get("nohang"):
        args.append("NOHANG")
    timeout_ms, count = options.get("timeout_ms"), options.get("count")
    if timeout_ms is not None:
        args += ["TIMEOUT", int(timeout_ms)]
    if count is not None:
        args += ["COUNT", int(count)]
    if options.get("withcounters"):
        args.append("WITHCOUNTERS")
    return args + ["FROM", *queue_list(queues)]


def qscan_args(cursor: int, count: int | None, minlen: int | None, maxlen: int | None,
               importrate: int | None) -> list[Any]:
    args: list[Any] = ["QSCAN", cursor]
    for name, value in (("COUNT", count), ("MINLEN", minlen), ("MAXLEN", maxlen),
                        ("IMPORTRATE", importrate)):
        if value is not None:
            args += [name, int(value)]
    return args


def jscan_args(cursor: int, count: int | None, queue: str | bytes | None,
               states: Iterable[str], reply_all: bool) -> list[Any]:
    args: list[Any] = ["JSCAN", cursor]
    if count is not None:
        args += ["COUNT", int(count)]
    if queue is not None:
        args += ["QUEUE", queue]
    for state in states:
        args += ["STATE", state]
    args += ["REPLY", "all" if reply_all else "id"]
    return args


def _command_bytes(args: Sequence[Any]) -> int:
    """Rough RESP size of a command (framing ~16 bytes per argument)."""
    return sum(16 + (len(a) if isinstance(a, bytes | str) else 20) for a in args)


def chunks_by_size(commands: Sequence[Sequence[Any]],
                    bytes_max: int) -> Iterator[Sequence[Sequence[Any]]]:
    start, size = 0, 0
    for i, args in enumerate(commands):
        size += _command_bytes(args)
        if size > bytes_max and i > start:
            yield commands[start:i]
            start, size = i, _command_bytes(args)
    if start < len(commands):
        yield commands[start:]


def parse_info(text: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in as_str(text).splitlines():
        if line and not line.startswith("#") and ":" in line:
            key, _, value = line.partition(":")
            out[key] = value
    return out


# --------------------------------------------------------------------------- topology


@dataclass(slots=True)
class Topology:
    """Which nodes exist, which one we use, where to go next. No I/O."""

    seeds: list[tuple[str, int]]
    prefer_producer: bool = False
    rng: random.Random = field(default_factory=random.Random)
    hello: Hello | None = None
    current: tuple[str, int] | None = None
    produced: Counter[str] = field(default_factory=Counter)
    received: int = 0

    def candidates(self, avoid: tuple[str, int] | None = None) -> list[tuple[str, int]]:
        """Nodes to try, best first: HELLO's nodes by priority (ties shuffled), then seeds."""
        known: list[tuple[int, float, tuple[str, int]]] = []
        if self.hello is not None:
            known = [(n.priority, self.rng.random(), (n.host, n.port)) for n in self.hello.nodes]
        known.sort()
        order = [addr for _, _, addr in known]
        seeds = [s for s in self.seeds if s not in order]
        self.rng.shuffle(seeds)
        order += seeds
        if avoid is not None and avoid in order and len(order) > 1:
            order.remove(avoid)
            order.append(avoid)  # last resort: it may have stopped leaving
        return order

    def learn(self, hello: Hello, address: tuple[str, int]) -> None:
        self.hello = hello
        self.current = address
        self.produced.clear()
        self.received = 0

    def better_nodes(self) -> list[tuple[str, int]]:
        """Nodes advertising a better (lower) priority than the one we are on, best first."""
        if self.hello is None:
            return []
        mine = [n.priority for n in self.hello.nodes if n.id == self.hello.node_id]
        if not mine:
            return []
        better = [(n.priority, self.rng.random(), (n.host, n.port)) for n in self.hello.nodes
                  if n.priority < mine[0]]
        return [addr for _, _, addr in sorted(better)]

    def note_jobs(self, jobs: Sequence[Job]) -> tuple[str, int] | None:
        """Count producers; after a sample, name the node to move to, if any (spec step 3)."""
        if not self.prefer_producer or not jobs or self.hello is None:
            return None
        for job in jobs:
            self.produced[job.producer_prefix] += 1
        self.received += len(jobs)
        if self.received < producer_sample_jobs:
            return None
        prefix, seen = self.produced.most_common(1)[0]
        share = seen / self.received
        self.produced.clear()
        self.received = 0
        if prefix == self.hello.node_id[:8] or share < producer_share_min:
            return None
        best = min(self.hello.nodes, key=lambda n: n.priority)
        for node in self.hello.nodes:
            if node.id.startswith(prefix) and node.priority <= best.priority:
                return (node.host, node.port)
        return None

    def producer_to_follow(self, jobs: Sequence[Job]) -> tuple[str, int] | None:
        """``note_jobs``, less the node we are on: where to move, if anywhere."""
        target = self.note_jobs(jobs)
        return None if target == self.current else target

    @contextmanager
    def trying_only(self, target: tuple[str, int]) -> Iterator[None]:
        """A connect inside tries ``target`` alone (a move to the producer); when it
        fails (DisqueConnectionError, swallowed) the client stays with its last HELLO."""
        saved, hello = self.seeds, self.hello
        self.seeds, self.hello = [target], None
        try:
            yield
        except DisqueConnectionError:
            self.hello = hello
        finally:
            self.seeds = saved


# --------------------------------------------------------------------------- worker ports

# Commands sent straight to the worker owning their target when the node announces
# worker ports (``route_to_owner=True``): ADDJOB by its queue, GETJOB by its one
# queue, these by the job IDs they name (all of one owner). Everything else, and
# these when the target is spread or unknown, goes to the main connection.
ROUTED_BY_IDS: frozenset[str] = frozenset({"ACKJOB", "FASTACK", "NACK", "WORKING", "ENQUEUE",
                                            "DEQUEUE", "DELJOB", "SHOW"})
# A worker port that failed is left alone (its commands take the main port) this long.
worker_port_retry_s = 5.0
_GETJOB_FLAGS = frozenset({"NOHANG", "WITHCOUNTERS"})
_GETJOB_VALUED = frozenset({"TIMEOUT", "COUNT"})


@dataclass(slots=True, frozen=True)
class WorkerLayout:
    """What ``INFO workers`` announces: the worker count, worker k's own port."""

    workers: int
    ports: tuple[int, ...]


def parse_worker_layout(info: dict[str, str]) -> WorkerLayout | None:
    """The layout from ``INFO workers`` (``parse_info``'s dict); None when the node
    announces no worker ports (off, an older node, the reference Disque)."""
    try:
        workers = int(info.get("workers", "0"))
        ports = tuple(int(p) for p in info.get("worker_ports", "").split(",") if p.strip())
    except ValueError:
        return None
    if workers < 1 or len(ports) != workers or not all(0 < p < 65536 for p in ports):
        return None
    return WorkerLayout(workers, ports)


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode("utf-8", "surrogateescape")


def owner_of_command(args: Sequence[Any], workers: int) -> int | None:
    """The worker owning what the command addresses (``workers.ids``' slot rule, the
    node's own), or None when it should go to the main connection."""
    if not args or workers < 1:
        return None
    name = as_str(args[0]).upper()
    if name == "ADDJOB":
        return owner_of_queue(_bytes(args[1]), workers) if len(args) >= 4 else None
    if name == "GETJOB":
        queue = _getjob_single_queue(args)
        return None if queue is None else owner_of_queue(queue, workers)
    if name in ROUTED_BY_IDS and len(args) >= 2:
        owner: int | None = None
        for job_id in args[1:]:
            text = as_str(job_id)
            if not is_valid_job_id(text):
                return None  # the main connection answers -BADID
            k = owner_of_job_id(text, workers)
            if owner is not None and k != owner:
                return None  # spread: the node splits it
            owner = k
        return owner
    return None


def _getjob_single_queue(args: Sequence[Any]) -> bytes | None:
    """GETJOB's queue when it names exactly one (after FROM), else None."""
    i, n = 1, len(args)
    while i < n:
        word = as_str(args[i]).upper()
        if word == "FROM":
            return _bytes(args[i + 1]) if n - i == 2 else None
        if word in _GETJOB_VALUED:
            i += 2
        elif word in _GETJOB_FLAGS:
            i += 1
        else:
            return None  # not a shape we know: let the node answer it
    return None


@dataclass(slots=True)
class WorkerRoutes:
    """Which worker port a command goes to on the node we are connected to; a port
    that failed rests ``worker_port_retry_s``. The clock is the caller's (no I/O)."""

    host: str
    layout: WorkerLayout
    down_until: dict[int, float] = field(default_factory=dict)

    @classmethod
    def from_info(cls, host: str, info_reply: Any) -> WorkerRoutes | None:
        """From the node's reply to ``INFO workers``; None when it announces no worker ports."""
        layout = parse_worker_layout(parse_info(info_reply))
        return None if layout is None else cls(host, layout)

    def port_of(self, worker: int) -> int:
        return self.layout.ports[worker]

    def route(self, args: Sequence[Any], now: float) -> int | None:
        """The worker to send ``args`` to, None for the main connection."""
        k = owner_of_command(args, self.layout.workers)
        if k is None or self.down_until.get(k, 0.0) > now:
            return None
        return k

    def split(self, commands: Sequence[Sequence[Any]],
              now: float) -> dict[int | None, list[int]]:
        """Indices of ``commands`` by the worker each goes to (None: main connection),
        each list in order, so one queue's commands keep their order."""
        groups: dict[int | None, list[int]] = {}
        for i, args in enumerate(commands):
            groups.setdefault(self.route(args, now), []).append(i)
        return groups

    def mark_down(self, worker: int, now: float) -> None:
        self.down_until[worker] = now + worker_port_retry_s


# --------------------------------------------------------------------------- shared settings


ConnT = TypeVar("ConnT")


class ClientSettings(Generic[ConnT]):
    """What ``Disque`` and ``AsyncDisque`` share besides parsing: the seeds and
    topology, the connection settings, the failover budget, the worker-port
    connections. The I/O is theirs: ``ConnT`` is their kind of redis-py client."""

    _workers: dict[int, ConnT]  # route_to_owner: worker index -> its port's client

    def __init__(
        self,
        nodes: str | Sequence[str | tuple[str, int]] | None = None,
        *,
        prefer_producer: bool = False,
        socket_timeout: float | None = None,
        connect_timeout: float = 2.0,
        password: str | None = None,
        failover_attempts: int | None = None,
        follow_priority: bool = True,
        redis_kwargs: dict[str, Any] | None = None,
        route_to_owner: bool = False,
    ) -> None:
        self.topology = Topology(parse_nodes(nodes), prefer_producer)
        self._route_to_owner = route_to_owner
        self.routes: WorkerRoutes | None = None  # set on connect when the node has worker ports
        self._follow_priority = follow_priority
        self._socket_timeout = socket_timeout
        self._connect_timeout = connect_timeout
        self._password = password
        self._failover_attempts = failover_attempts
        self._redis_kwargs = dict(redis_kwargs or {})
        self._redis: ConnT | None = None  # the main connection, made by the first command
        self._workers = {}
        self._init_io()

    def _init_io(self) -> None:
        """The lock around (re)connecting: the twin's own kind (threads or asyncio)."""
        raise NotImplementedError

    def _make_redis(self, host: str, port: int) -> ConnT:
        """A client of the twin's kind for one node (not connected yet)."""
        raise NotImplementedError

    def _worker_conn(self, routes: WorkerRoutes, k: int) -> ConnT:
        """Worker k's client, made on first use, while ``routes`` are still the node's;
        after a move to another node, ConnectionError (an OSError: the caller sends
        the command on the main connection)."""
        if self.routes is not routes:
            raise ConnectionError("the node changed")
        conn = self._workers.get(k)
        if conn is None:
            conn = self._workers[k] = self._make_redis(routes.host, routes.port_of(k))
        return conn

    def _redis_options(self, host: str, port: int) -> dict[str, Any]:
        """redis-py's constructor arguments for one node (sync and asyncio take the same)."""
        return dict(host=host, port=port, protocol=2, driver_info=None, password=self._password,
                    socket_timeout=self._socket_timeout,
                    socket_connect_timeout=self._connect_timeout, **self._redis_kwargs)

    def _attempts(self) -> int:
        if self._failover_attempts is not None:
            return self._failover_attempts
        known = len(self.topology.hello.nodes) if self.topology.hello else 0
        return max(len(self.topology.seeds), known, 1)

    def _raise_unless_retrying(self, exc: Exception, attempt: int, what: str) -> None:
        """After a failed try: raise what the caller should see, or return when another
        node should get the command (-LEAVING or a dropped connection, within budget).

        ``exc`` is the error reply as a DisqueError (``map_redis_error``), or the
        exception of a dropped connection or timeout. Called in the I/O's ``except``
        block: a DisqueError is raised with its cause suppressed.
        """
        if isinstance(exc, DisqueError):
            if not is_leaving(exc) or attempt >= self._attempts():
                raise exc from None
        elif attempt >= self._attempts():
            raise DisqueConnectionError(f"{what} failed: {exc}") from exc

    @property
    def node_id(self) -> str | None:
        """The ID of the node we are connected to (None before the first command)."""
        return self.topology.hello.node_id if self.topology.hello else None

    @property
    def address(self) -> tuple[str, int] | None:
        return self.topology.current


# --------------------------------------------------------------------------- consume loop


class _Flag(Protocol):
    def is_set(self) -> bool: ...


def consume_done(max_jobs: int | None, handled: int, stop: _Flag | None) -> bool:
    """Whether a consume loop stops: ``max_jobs`` handled or ``stop`` set (both twins)."""
    if max_jobs is not None and handled >= max_jobs:
        return True
    return stop is not None and stop.is_set()


def consume_batch(count: int, max_jobs: int | None, handled: int) -> int:
    """How many jobs the next GETJOB of a consume loop asks for: never past ``max_jobs``."""
    return count if max_jobs is None else min(count, max_jobs - handled)
