"""The data source's options, checked (every failure says what to fix), the
row schema, and the reachability check the driver makes before planning."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from disque_mp.client import (
    Disque,
    DisqueError,
    parse_nodes,
)

Address = tuple[str, int]

SCHEMA = ("id string, queue string, body binary, state string, ctime long, "
          "nacks long, additional_deliveries long")

# Spark-side option keys that reach data sources and are not ours.
_FOREIGN_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})


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


def require_queues(opts: Options, what: str) -> list[str]:
    if not opts.queues:
        raise ValueError(f"{what} needs option queue (e.g. .option('queue', 'events'); "
                         "several queues: queue=a,b)")
    return opts.queues
