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

Connections speak RESP2 (``protocol=2``): the reference Disque rejects
``HELLO 3`` (redis-py 8's default handshake), and disque-mp answers Disque
commands in RESP2 shapes anyway. ``driver_info=None`` skips ``CLIENT SETINFO``.

The asyncio twin with the same methods is ``disque_mp.client.aio.AsyncDisque``.
Everything here that is not I/O (argument building, reply parsing, node
selection, error mapping) is shared with it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, overload

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger("disque_mp.client")

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


class DisqueError(Exception):
    """A Disque error reply (``code`` is its first word: ERR, NOJOB, ...) or a client failure."""

    code = "ERR"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class CommandError(DisqueError):
    """``-ERR ...``: a bad command or bad arguments."""


class NoReplicationError(DisqueError):
    """``-NOREPL``: not enough reachable nodes for the requested replication level."""

    code = "NOREPL"


class PausedError(DisqueError):
    """``-PAUSED``: the queue is paused in input."""

    code = "PAUSED"


class LeavingError(DisqueError):
    """``-LEAVING``: the node is leaving the cluster; connect to another one."""

    code = "LEAVING"


class NoJobError(DisqueError):
    """``-NOJOB``: the node does not know this job (WORKING)."""

    code = "NOJOB"


class BadIdError(DisqueError):
    """``-BADID``: not a job ID."""

    code = "BADID"


class TooLateError(DisqueError):
    """``-TOOLATE``: WORKING refused, half of the job's TTL already elapsed."""

    code = "TOOLATE"


class OutOfMemoryError(DisqueError):
    """``-OOM``: the node is out of memory."""

    code = "OOM"


class DisqueConnectionError(DisqueError):
    """No node of the list could be reached (the message says which were tried)."""

    code = "CONNECTION"


_ERROR_CLASSES: dict[str, type[DisqueError]] = {
    "ERR": CommandError,
    "NOREPL": NoReplicationError,
    "PAUSED": PausedError,
    "LEAVING": LeavingError,
    "NOJOB": NoJobError,
    "BADID": BadIdError,
    "OOM": OutOfMemoryError,
    "TOOLATE": TooLateError,
}


def error_from_reply(text: str) -> DisqueError:
    """The exception for an error reply's full text (``"NOJOB Job not known ..."``)."""
    code = text.split(" ", 1)[0]
    cls = _ERROR_CLASSES.get(code, DisqueError)
    return cls(text, code)


def map_redis_error(exc: redis.ResponseError) -> DisqueError:
    """redis-py strips the code word of errors it knows (ERR, OOM ...): put it back."""
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


def _str(value: Any) -> str:
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
        counters = {_str(item[i]): item[i + 1] for i in range(3, len(item) - 1, 2)}
        nacks = int(counters.get("nacks", 0))
        extra = int(counters.get("additional-deliveries", 0))
    return Job(_str(item[0]), _str(item[1]), bytes(item[2]), nacks, extra)


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
        key = _str(reply[i])
        value = reply[i + 1]
        if isinstance(value, list):
            value = [_str(v) for v in value]
        elif isinstance(value, bytes) and key not in _SHOW_BYTES_FIELDS:
            value = _str(value)
        out[key] = value
    return out


def parse_hello(reply: Any, host: str, port: int) -> Hello:
    """HELLO: version, my ID, then [id, ip, port, priority] per node.

    A standalone reference node reports an empty IP for itself: the address we
    connected to is used then.
    """
    version, my_id = int(reply[0]), _str(reply[1])
    nodes = []
    for entry in reply[2:]:
        node_id, ip, node_port, priority = (_str(x) for x in entry[:4])
        if not ip:
            ip, node_port = (host, str(port)) if node_id == my_id else (ip, node_port)
        if ip and node_port.isdigit():
            nodes.append(NodeInfo(node_id, ip, int(node_port), int(priority)))
    return Hello(version, my_id, tuple(nodes))


def parse_scan(reply: Any) -> tuple[int, list[Any]]:
    return int(reply[0]), list(reply[1] or [])


def _queues(queues: str | bytes | Iterable[str | bytes]) -> list[str | bytes]:
    if isinstance(queues, str | bytes):
        return [queues]
    out = list(queues)
    if not out:
        raise ValueError("at least one queue name is needed")
    return out


def _ids(ids: tuple[str | Job | Iterable[str | Job], ...]) -> list[str]:
    """Accept job IDs, Job records, or one iterable of either."""
    flat: list[str] = []
    for item in ids:
        if isinstance(item, Job):
            flat.append(item.id)
        elif isinstance(item, str | bytes):
            flat.append(_str(item))
        else:
            flat.extend(x.id if isinstance(x, Job) else _str(x) for x in item)
    return flat


# --------------------------------------------------------------------------- command builders


def addjob_args(
    queue: str | bytes,
    body: bytes | str,
    timeout_ms: int = 0,
    *,
    replicate: int | None = None,
    delay: int | None = None,
    retry: int | None = None,
    ttl: int | None = None,
    maxlen: int | None = None,
    async_: bool = False,
) -> list[Any]:
    args: list[Any] = ["ADDJOB", queue, body, int(timeout_ms)]
    for name, value in (("REPLICATE", replicate), ("DELAY", delay), ("RETRY", retry),
                        ("TTL", ttl), ("MAXLEN", maxlen)):
        if value is not None:
            args += [name, int(value)]
    if async_:
        args.append("ASYNC")
    return args


def getjob_args(
    queues: str | bytes | Iterable[str | bytes],
    *,
    timeout_ms: int | None = None,
    count: int | None = None,
    nohang: bool = False,
    withcounters: bool = False,
) -> list[Any]:
    args: list[Any] = ["GETJOB"]
    if nohang:
        args.append("NOHANG")
    if timeout_ms is not None:
        args += ["TIMEOUT", int(timeout_ms)]
    if count is not None:
        args += ["COUNT", int(count)]
    if withcounters:
        args.append("WITHCOUNTERS")
    return args + ["FROM", *_queues(queues)]


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


def _chunks_by_size(commands: Sequence[Sequence[Any]],
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
    for line in _str(text).splitlines():
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


# --------------------------------------------------------------------------- shared settings


class ClientSettings:
    """What ``Disque`` and ``AsyncDisque`` share besides parsing: the seeds and
    topology, the connection settings, the failover budget. The I/O is theirs."""

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
    ) -> None:
        self.topology = Topology(parse_nodes(nodes), prefer_producer)
        self._follow_priority = follow_priority
        self._socket_timeout = socket_timeout
        self._connect_timeout = connect_timeout
        self._password = password
        self._failover_attempts = failover_attempts
        self._redis_kwargs = dict(redis_kwargs or {})
        self._init_io()

    def _init_io(self) -> None:
        """The connection and its lock: the twin's own kind (threads or asyncio)."""
        raise NotImplementedError

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

    def _raise_unless_retrying(self, exc: redis.RedisError, attempt: int, what: str) -> None:
        """After a failed try: raise what the caller should see, or return when another
        node should get the command (-LEAVING or a dropped connection, within budget)."""
        if isinstance(exc, redis.ResponseError):
            err = map_redis_error(exc)
            if not is_leaving(err) or attempt >= self._attempts():
                raise err from None
        elif attempt >= self._attempts():
            raise DisqueConnectionError(f"{what} failed: {exc}") from exc

    @property
    def node_id(self) -> str | None:
        """The ID of the node we are connected to (None before the first command)."""
        return self.topology.hello.node_id if self.topology.hello else None

    @property
    def address(self) -> tuple[str, int] | None:
        return self.topology.current


# --------------------------------------------------------------------------- sync client


class Disque(ClientSettings):
    """A Disque client: see the module doc. Thread-safe (redis-py's pool per node).

    ``nodes``: seeds, ``"host:port"`` strings, ``(host, port)`` tuples or one
    comma-separated string (default 127.0.0.1:7711). ``socket_timeout`` must
    exceed the longest blocking GETJOB you send (None: no timeout).
    ``failover_attempts``: nodes to try after -LEAVING or a drop (default: as
    many as are known; 0 sticks to one node). ``follow_priority=False`` stays
    on a node even when HELLO shows better ones. ``redis_kwargs`` go to
    ``redis.Redis`` (ssl, username ...).
    """

    def _init_io(self) -> None:
        self._redis: redis.Redis | None = None
        self._lock = threading.RLock()

    # ---- connection management

    def _make_redis(self, host: str, port: int) -> redis.Redis:
        r = redis.Redis(**self._redis_options(host, port), retry=Retry(NoBackoff(), 0))
        r.response_callbacks.pop("INFO", None)  # keep INFO's text: Disque's own sections
        return r

    def connect(self, avoid: tuple[str, int] | None = None) -> Hello:
        """Connect to the best reachable node (random among the seeds at first), run HELLO.

        Landing on a node that advertises a worse priority than others (a leaving
        node says 100) moves on to a better one when one answers, unless
        ``follow_priority=False`` (a client meant for one given node).
        """
        with self._lock:
            hello = self._connect_first(self.topology.candidates(avoid))
            better = self.topology.better_nodes() if self._follow_priority else []
            if better:
                try:
                    hello = self._connect_first(better)
                except DisqueConnectionError:
                    pass  # stay: a leaving node still serves ACKs and NOHANG GETJOBs
            return hello

    def _connect_first(self, candidates: list[tuple[str, int]]) -> Hello:
        tried = []
        for host, port in candidates:
            r = self._make_redis(host, port)
            try:
                hello = parse_hello(r.execute_command("HELLO"), host, port)
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                tried.append(f"{host}:{port} ({exc})")
                r.close()
                continue
            except redis.ResponseError as exc:
                tried.append(f"{host}:{port} ({map_redis_error(exc)})")
                r.close()
                continue
            old, self._redis = self._redis, r
            if old is not None:
                old.close()
            self.topology.learn(hello, (host, port))
            log.debug("connected to %s:%d (node %s)", host, port, hello.node_id)
            return hello
        raise DisqueConnectionError("no Disque node reachable; tried: " + "; ".join(tried))

    def _client(self) -> redis.Redis:
        r = self._redis
        if r is None:
            with self._lock:
                if self._redis is None:
                    self.connect()
                r = self._redis
        assert r is not None
        return r

    def _failover(self, broken: redis.Redis) -> None:
        with self._lock:
            if self._redis is broken:  # another thread may have moved already
                self.connect(avoid=self.topology.current)

    def execute(self, *args: Any) -> Any:
        """Run one command; move to another node on -LEAVING or a dropped connection.

        A command whose connection dropped is sent again on the new node, so an
        ADDJOB may then create a second copy of the job (at-least-once).
        """
        attempt = 0
        while True:
            r = self._client()
            try:
                return r.execute_command(*args)
            except (redis.ResponseError, redis.ConnectionError, redis.TimeoutError) as exc:
                self._raise_unless_retrying(exc, attempt, str(args[0]))
            attempt += 1
            self._failover(r)

    def close(self) -> None:
        with self._lock:
            if self._redis is not None:
                self._redis.close()
                self._redis = None

    def __enter__(self) -> Disque:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- commands

    def hello(self) -> Hello:
        r = self._client()
        host, port = self.topology.current or ("", 0)
        hello = parse_hello(self.execute("HELLO"), host, port)
        if r is self._redis:
            self.topology.hello = hello
        return hello

    def info(self, section: str | None = None) -> dict[str, str]:
        return parse_info(self.execute("INFO", *([section] if section else [])))

    def ping(self) -> bool:
        return self.execute("PING") in (b"PONG", "PONG", True)

    def add_job(
        self,
        queue: str | bytes,
        body: bytes | str,
        timeout_ms: int = 0,
        *,
        replicate: int | None = None,
        delay: int | None = None,
        retry: int | None = None,
        ttl: int | None = None,
        maxlen: int | None = None,
        async_: bool = False,
    ) -> str:
        """ADDJOB; returns the job ID. Times in seconds except ``timeout_ms``."""
        return _str(self.execute(*addjob_args(queue, body, timeout_ms, replicate=replicate,
                                               delay=delay, retry=retry, ttl=ttl, maxlen=maxlen,
                                               async_=async_)))

    def add_jobs(
        self,
        items: Iterable[tuple[str | bytes, bytes | str]],
        timeout_ms: int = 0,
        **options: Any,
    ) -> list[str]:
        """ADDJOB for each (queue, body), pipelined; returns the IDs in order.

        Stops at the first error reply and raises it (jobs before it were added).
        ``options`` are add_job's keyword options.
        """
        ids: list[str] = []
        batch: list[list[Any]] = []
        for queue, body in items:
            batch.append(addjob_args(queue, body, timeout_ms, **options))
            if len(batch) >= pipeline_commands_max:
                ids += self._pipeline(batch)
                batch = []
        if batch:
            ids += self._pipeline(batch)
        return ids

    def _pipeline(self, commands: list[list[Any]]) -> list[str]:
        return [_str(x) for x in self.execute_many(commands)]

    def execute_many(self, commands: Sequence[Sequence[Any]], *,
                     raise_on_error: bool = True) -> list[Any]:
        """Send commands pipelined, read every reply.

        An error reply raises (the first one) or, with ``raise_on_error=False``,
        stands in the list as a DisqueError. Round trips carry at most
        pipeline_bytes_max of commands. A dropped connection moves to another
        node and sends that round trip again.
        """
        out: list[Any] = []
        for chunk in _chunks_by_size(commands, pipeline_bytes_max):
            out += self._round_trip(chunk)
        if raise_on_error:
            for reply in out:
                if isinstance(reply, DisqueError):
                    raise reply
        return out

    def _round_trip(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        attempt = 0
        while True:
            r = self._client()
            try:
                pipe = r.pipeline(transaction=False)
                for args in commands:
                    pipe.execute_command(*args)
                replies = pipe.execute(raise_on_error=False)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._raise_unless_retrying(exc, attempt, "pipeline")
                attempt += 1
                self._failover(r)
                continue
            return [map_redis_error(x) if isinstance(x, redis.ResponseError) else x
                    for x in replies]

    def get_jobs(
        self,
        queues: str | bytes | Iterable[str | bytes],
        *,
        timeout_ms: int | None = None,
        count: int | None = None,
        nohang: bool = False,
        withcounters: bool = False,
    ) -> list[Job]:
        """GETJOB; [] when the timeout elapsed (or NOHANG found nothing)."""
        jobs = parse_jobs(self.execute(*getjob_args(queues, timeout_ms=timeout_ms, count=count,
                                                    nohang=nohang, withcounters=withcounters)))
        self._maybe_follow_producer(jobs)
        return jobs

    def get_job(self, queues: str | bytes | Iterable[str | bytes], **kw: Any) -> Job | None:
        jobs = self.get_jobs(queues, count=1, **kw)
        return jobs[0] if jobs else None

    def _maybe_follow_producer(self, jobs: Sequence[Job]) -> None:
        target = self.topology.note_jobs(jobs)
        if target is None or target == self.topology.current:
            return
        log.info("most jobs come from %s:%d: moving there", *target)
        with self._lock:
            saved = self.topology.seeds
            self.topology.seeds = [target]
            hello, self.topology.hello = self.topology.hello, None
            try:
                self.connect()
            except DisqueConnectionError:
                self.topology.hello = hello
            finally:
                self.topology.seeds = saved

    def ack(self, *ids: str | Job | Iterable[str | Job]) -> int:
        return int(self.execute("ACKJOB", *_ids(ids)))

    def fast_ack(self, *ids: str | Job | Iterable[str | Job]) -> int:
        return int(self.execute("FASTACK", *_ids(ids)))

    def nack(self, *ids: str | Job | Iterable[str | Job]) -> int:
        return int(self.execute("NACK", *_ids(ids)))

    def enqueue(self, *ids: str | Job | Iterable[str | Job]) -> int:
        return int(self.execute("ENQUEUE", *_ids(ids)))

    def dequeue(self, *ids: str | Job | Iterable[str | Job]) -> int:
        return int(self.execute("DEQUEUE", *_ids(ids)))

    def del_job(self, *ids: str | Job | Iterable[str | Job]) -> int:
        return int(self.execute("DELJOB", *_ids(ids)))

    def working(self, job: str | Job) -> int:
        """WORKING; returns the seconds the next delivery was postponed by (the retry)."""
        return int(self.execute("WORKING", _ids((job,))[0]))

    def show(self, job: str | Job) -> dict[str, Any] | None:
        """SHOW as a dict (None for an unknown job); ``body`` stays bytes."""
        return parse_pairs(self.execute("SHOW", _ids((job,))[0]))

    def qlen(self, queue: str | bytes) -> int:
        return int(self.execute("QLEN", queue))

    def qpeek(self, queue: str | bytes, count: int) -> list[Job]:
        return parse_jobs(self.execute("QPEEK", queue, int(count)))

    def qstat(self, queue: str | bytes) -> dict[str, Any] | None:
        return parse_pairs(self.execute("QSTAT", queue))

    def pause(self, queue: str | bytes, *options: str) -> str:
        """PAUSE queue in|out|all|none|state [bcast]; returns the pause state."""
        return _str(self.execute("PAUSE", queue, *options))

    def iter_queues(self, *, count: int | None = None, minlen: int | None = None,
                    maxlen: int | None = None, importrate: int | None = None) -> Iterator[str]:
        """Every queue name (QSCAN until the cursor returns to 0; names may repeat)."""
        cursor = 0
        while True:
            cursor, names = parse_scan(self.execute(*qscan_args(cursor, count, minlen, maxlen,
                                                                importrate)))
            yield from (_str(n) for n in names)
            if cursor == 0:
                return

    @overload
    def iter_jobs(self, *, queue: str | bytes | None = ..., states: Iterable[str] = ...,
                  count: int | None = ..., reply_all: Literal[False] = ...) -> Iterator[str]: ...
    @overload
    def iter_jobs(self, *, queue: str | bytes | None = ..., states: Iterable[str] = ...,
                  count: int | None = ..., reply_all: Literal[True]) -> Iterator[dict[str, Any]]: ...

    def iter_jobs(self, *, queue: str | bytes | None = None, states: Iterable[str] = (),
                  count: int | None = None, reply_all: bool = False) -> Iterator[Any]:
        """JSCAN: job IDs, or SHOW-like dicts with ``reply_all=True``."""
        states = list(states)
        cursor = 0
        while True:
            cursor, items = parse_scan(self.execute(*jscan_args(cursor, count, queue, states,
                                                                reply_all)))
            for item in items:
                yield parse_pairs(item) if reply_all else _str(item)
            if cursor == 0:
                return

    # ---- consumer helper

    @overload
    def consume(self, queues: str | bytes | Iterable[str | bytes], handler: None = None, *,
                count: int = ..., max_jobs: int | None = ..., stop: threading.Event | None = ...,
                fast_ack: bool = ..., poll_ms: int = ...) -> Iterator[Job]: ...
    @overload
    def consume(self, queues: str | bytes | Iterable[str | bytes],
                handler: Callable[[Job], Any], *, count: int = ..., max_jobs: int | None = ...,
                stop: threading.Event | None = ..., fast_ack: bool = ...,
                poll_ms: int = ...) -> int: ...

    def consume(self, queues: str | bytes | Iterable[str | bytes],
                handler: Callable[[Job], Any] | None = None, *, count: int = 1,
                max_jobs: int | None = None, stop: threading.Event | None = None,
                fast_ack: bool = False, poll_ms: int = consume_poll_ms) -> Iterator[Job] | int:
        """Take jobs one by one, keep each alive with WORKING while it is worked on.

        With a ``handler``: call it for each job, ACK when it returns, NACK when
        it raises (the exception is logged, the loop goes on); returns the number
        of jobs handled once ``max_jobs`` were handled or ``stop`` is set.

        Without: an iterator. A job is ACKed when the loop asks for the next one;
        leaving the loop (break, exception) NACKs the job in hand, so it is
        delivered again at once (ACK it yourself before ``break`` if it is done).
        """
        runner = _ConsumeLoop(self, _queues(queues), count, max_jobs, stop, fast_ack, poll_ms)
        if handler is None:
            return runner.iterate()
        return runner.run(handler)


class Heartbeat:
    """A thread that sends WORKING for jobs in hand before their retry time elapses."""

    def __init__(self, working: Callable[[str], int]) -> None:
        self._working = working
        self._due: dict[str, float] = {}  # job ID -> monotonic time of the next WORKING
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="disque-heartbeat", daemon=True)
        self._thread.start()

    def add(self, job_id: str) -> None:
        with self._cond:
            self._due[job_id] = time.monotonic() + heartbeat_first_s
            self._cond.notify()

    def remove(self, job_id: str) -> None:
        with self._cond:
            self._due.pop(job_id, None)

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join()

    def _next_due(self) -> tuple[str, float] | None:
        if not self._due:
            return None
        job_id = min(self._due, key=self._due.__getitem__)
        return job_id, self._due[job_id]

    def _run(self) -> None:
        while True:
            with self._cond:
                nxt = self._next_due()
                while not self._stopped and (nxt is None or nxt[1] > time.monotonic()):
                    self._cond.wait(None if nxt is None else nxt[1] - time.monotonic())
                    nxt = self._next_due()
                if self._stopped or nxt is None:
                    return
                job_id = nxt[0]
            retry_s = self._beat(job_id)
            with self._cond:
                if job_id in self._due:
                    if retry_s > 0:
                        self._due[job_id] = time.monotonic() + retry_s * heartbeat_retry_fraction
                    else:
                        del self._due[job_id]

    def _beat(self, job_id: str) -> int:
        try:
            return self._working(job_id)
        except DisqueError as exc:  # NOJOB, acked, or past 50 % of its TTL: nothing to keep
            log.warning("WORKING %s: %s", job_id, exc)
            return 0


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


class _ConsumeLoop:
    __slots__ = ("client", "queues", "count", "max_jobs", "stop", "fast_ack", "poll_ms", "handled")

    def __init__(self, client: Disque, queues: list[str | bytes], count: int,
                 max_jobs: int | None, stop: threading.Event | None, fast_ack: bool,
                 poll_ms: int) -> None:
        self.client, self.queues, self.count = client, queues, count
        self.max_jobs, self.stop, self.fast_ack, self.poll_ms = max_jobs, stop, fast_ack, poll_ms
        self.handled = 0

    def _done(self) -> bool:
        return consume_done(self.max_jobs, self.handled, self.stop)

    def _take(self, beat: Heartbeat) -> list[Job]:
        """The next jobs, all kept alive from now on (later ones wait for earlier ones)."""
        want = consume_batch(self.count, self.max_jobs, self.handled)
        jobs = self.client.get_jobs(self.queues, timeout_ms=self.poll_ms, count=want,
                                    withcounters=True)
        for job in jobs:
            beat.add(job.id)
        return jobs

    def _ack(self, job: Job) -> None:
        (self.client.fast_ack if self.fast_ack else self.client.ack)(job.id)

    def run(self, handler: Callable[[Job], Any]) -> int:
        beat = Heartbeat(self.client.working)
        in_hand: list[Job] = []
        try:
            while not self._done():
                in_hand = self._take(beat)
                while in_hand:
                    self._handle(handler, in_hand[0], beat)
                    in_hand.pop(0)
                    self.handled += 1
        finally:
            beat.close()
            if in_hand:  # interrupted (KeyboardInterrupt ...): deliver the rest again now
                self.client.nack(*(j.id for j in in_hand))
        return self.handled

    def _handle(self, handler: Callable[[Job], Any], job: Job, beat: Heartbeat) -> None:
        try:
            handler(job)
        except Exception:
            beat.remove(job.id)
            log.exception("handler failed on job %s: NACK", job.id)
            self.client.nack(job.id)
        else:
            beat.remove(job.id)
            self._ack(job)

    def iterate(self) -> Iterator[Job]:
        beat = Heartbeat(self.client.working)
        in_hand: list[Job] = []
        try:
            while not self._done():
                in_hand = self._take(beat)
                while in_hand:
                    job = in_hand[0]
                    yield job
                    beat.remove(job.id)
                    self._ack(in_hand.pop(0))
                    self.handled += 1
        finally:
            beat.close()
            if in_hand:  # left the loop with jobs taken but not handled: deliver again now
                self.client.nack(*(j.id for j in in_hand))
