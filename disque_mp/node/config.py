"""Node configuration: Disque's ``disque.conf`` directives plus our ``workers``.

CONTRACT (shared by the supervisor, the workers and CONFIG GET/SET/REWRITE):
``Config`` holds every directive under its directive name with ``-`` turned into
``_``. Parsing, validation and rewriting live here (owner: supervisor work).

    load(path, overrides) -> Config        # raises ConfigError (report() = Redis' FATAL text)
    parse_text(text) -> Config             # same, from a string (tests)
    config_get(cfg, pattern) -> [(name, value)]   # CONFIG GET, reference order, then ours
    config_set(cfg, name, value) -> None | error text   # CONFIG SET (text without "-ERR ")
    rewrite(cfg, path)                     # CONFIG REWRITE, keeps comments and unknown lines

The file format is Redis': one directive per line, arguments split like
``sdssplitargs`` (double quotes with escapes, single quotes), ``#`` comments,
directive names case-insensitive; a later line overrides an earlier one.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bus.durable import write_atomic

# --- Redis' sdssplitargs / sdscatrepr ---


class ArgsError(ValueError):
    """Unbalanced quotes, or a closing quote not followed by a space."""


_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "a": "\a"}
_HEX = "0123456789abcdefABCDEF"


def _quoted(line: str, i: int, q: str) -> tuple[str, int]:
    """Read a quoted word starting after the opening quote ``q`` at ``i``."""
    out: list[str] = []
    n = len(line)
    while True:
        if i >= n:
            raise ArgsError("unterminated quotes")
        c = line[i]
        if q == '"' and c == "\\" and i + 3 < n and line[i + 1] == "x" \
                and line[i + 2] in _HEX and line[i + 3] in _HEX:
            out.append(chr(int(line[i + 2:i + 4], 16)))
            i += 4
        elif q == '"' and c == "\\" and i + 1 < n:
            out.append(_ESCAPES.get(line[i + 1], line[i + 1]))
            i += 2
        elif q == "'" and c == "\\" and i + 1 < n and line[i + 1] == "'":
            out.append("'")
            i += 2
        elif c == q:
            if i + 1 < n and not line[i + 1].isspace():
                raise ArgsError("closing quote must be followed by a space")
            return "".join(out), i + 1
        else:
            out.append(c)
            i += 1


def split_args(line: str) -> list[str]:
    """Split a config line into words the way Redis' sdssplitargs does."""
    words: list[str] = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i].isspace():
            i += 1
        if i >= n:
            return words
        cur: list[str] = []
        while i < n and not line[i].isspace():
            if line[i] in "\"'":
                part, i = _quoted(line, i + 1, line[i])
                cur.append(part)
                break
            cur.append(line[i])
            i += 1
        words.append("".join(cur))


def quote(s: str) -> str:
    """sdscatrepr: a double-quoted form split_args reads back to ``s``."""
    out = ['"']
    for c in s:
        if c in "\\\"":
            out.append("\\" + c)
        elif c in "\n\r\t\a\b":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t", "\a": "\\a", "\b": "\\b"}[c])
        elif c.isprintable() or ord(c) > 0xFF:
            out.append(c)
        else:
            out.append(f"\\x{ord(c):02x}")
    out.append('"')
    return "".join(out)


def usable_cpus() -> int:
    """CPUs this process may run on (taskset, cgroup cpusets), not the host's count."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(slots=True)
class Config:
    port: int = 7711
    bind: str = "127.0.0.1"  # one or more addresses, space separated
    dir: str = "."  # absolute once the supervisor has changed into it
    logfile: str = ""  # "" = stdout
    loglevel: str = "notice"  # debug | verbose | notice | warning
    pidfile: str = ""  # "" = no pidfile (Disque's default path needs root)
    daemonize: bool = False  # only "no": systemd (Type=notify) supervises us
    hz: int = 10
    maxmemory: int = 1 << 30
    maxmemory_policy: str = "acks"
    maxmemory_samples: int = 5
    cluster_config_file: str = "nodes.conf"
    cluster_node_timeout: int = 15000  # ms
    appendonly: bool = False
    appendfilename: str = "appendonly.aof"
    appendfsync: str = "everysec"  # always | everysec | no
    aof_load_truncated: bool = True
    aof_load_corrupt: str = "refuse"  # refuse | skip (damage before the end of an AOF)
    aof_enqueue_jobs_once: bool = False
    auto_aof_rewrite_percentage: int = 100
    auto_aof_rewrite_min_size: int = 64 << 20
    no_appendfsync_on_rewrite: bool = False
    aof_rewrite_incremental_fsync: bool = True
    requirepass: str = ""
    timeout: int = 0  # client idle timeout, s (0 = never)
    tcp_backlog: int = 511
    tcp_keepalive: int = 0
    maxclients: int = 10000
    unixsocket: str = ""
    unixsocketperm: int = 0
    slowlog_log_slower_than: int = 10000
    slowlog_max_len: int = 128
    latency_monitor_threshold: int = 0
    # Reported by CONFIG GET as the reference does; accepted in the file.
    databases: int = 16
    watchdog_period: int = 0
    activerehashing: bool = True
    syslog_enabled: bool = False
    syslog_ident: str = "disque"
    syslog_facility: str = "local0"
    # Redis' semantics (hard bytes, soft bytes, soft seconds; 0 = none). Not the
    # reference's "normal 0 0 0": a client that never reads its replies must not
    # grow the node without bound (README, Limits).
    client_output_buffer_limit: str = f"normal {1 << 30} {256 << 20} 60"
    # Limits on client input (bad input must never hurt other clients).
    client_query_buffer_bytes_max: int = 1 << 30  # Redis' client-query-buffer-limit
    proto_max_bulk_len: int = 512 << 20  # largest bulk argument accepted
    proto_max_multibulk_len: int = 1024 * 1024  # most arguments in one command
    # Work one command may do (a worker also serves other clients and, worker 0,
    # the cluster bus): past these a reply is cut and scans continue by cursor.
    getjob_count_max: int = 10_000  # jobs one GETJOB returns, whatever its COUNT
    qpeek_count_max: int = 10_000  # jobs one QPEEK returns, whatever its count
    qgroups_count_max: int = 10_000  # groups one QGROUPS lists, whatever its COUNT
    scan_count_max: int = 1_000  # QSCAN/JSCAN COUNT (and BUSYLOOP) per shard call
    # general-path commands of one connection running on another worker at once; the
    # connection's next commands wait (so the owner of a queue builds at most this
    # many replies for one pipelining client before its output limits are checked)
    forwarded_commands_max: int = 32
    # ours
    workers: int = field(default_factory=lambda: usable_cpus())
    # worker k also listens alone on worker-ports-base + k (0 = off; README "Worker ports")
    worker_ports_base: int = 0
    # where the config came from (CONFIG REWRITE target, INFO config_file)
    config_file: str = ""
    # HTTP endpoint: /metrics, the JSON admin API, the dashboard (disque_mp/node/http/)
    http_port: int = 0  # 0 = off (make run serves 7780)
    http_bind: str = "127.0.0.1"  # one or more addresses, space separated
    http_metrics_queues_max: int = 100  # queues with their own series (largest first)
    http_api_jobs_max: int = 1000  # jobs one API call lists or moves
    http_request_bytes_max: int = 1 << 20  # request line + headers + body
    # security (README "Security"): the cluster secret, Redis' protected mode
    cluster_secret_file: str = ""  # keys, one per line; relative to dir; "" = open bus
    protected_mode: bool = True
    tls_port: int = 0  # 0 = no TLS listener (Redis' directive names, disque_mp/node/tls.py)
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_cert_file: str = ""
    tls_auth_clients: str = "yes"  # yes | no | optional
    tls_cluster: bool = False  # bus and data links over mutual TLS (the MAC stays on top)
    tls_protocols: str = ""  # e.g. "TLSv1.2 TLSv1.3"; "" = TLS 1.2 and up
    # security bounds (README "Security", docs/security.md): what a client may send
    # before AUTH when requirepass is set (Redis' fixed 10 and 16 KB)
    unauth_multibulk_len_max: int = 10
    unauth_bulk_bytes_max: int = 16 * 1024
    auth_failure_delay_ms: int = 100  # a connection's next command after a wrong password
    # the HTTP endpoint: open connections on the node, and the Host names it answers
    # besides its bound addresses and localhost (DNS rebinding)
    http_connections_max: int = 512
    http_allowed_hosts: str = ""
    # operator-side safety (docs/security.md, "Files, secrets and the HTTP endpoint")
    dir_strict_modes: bool = True  # refuse a dir of another user or writable by group/others
    cluster_secret_replace: bool = False  # CONFIG SET cluster-secret-file may drop every key in use
    http_unauth_connections_max: int = 128  # HTTP connections not yet authenticated, per node
    http_unauth_idle_ms: int = 10_000  # such a connection is closed when idle this long
    http_metrics_label_bytes_max: int = 256  # a queue name longer than this is cut in /metrics
    requirepass_file: str = ""  # requirepass read from this file (not seen in /proc's cmdline)
    # the log line's shape: "text" (Redis' line) or "json" (one object a line, for
    # Loki, Elasticsearch, journald's JSON readers; docs/observability.md)
    logformat: str = "text"
    # /readyz waits this long for every worker to answer; a worker that does not
    # (stopped, stuck in a long call) makes the node not ready rather than hang the probe
    readyz_timeout_ms: int = 2000
    # security bounds, the command layer (docs/security.md, "Names, guesses and
    # restarts"): a queue name's bytes (its dead-letter queue dead:<name> must still
    # fit a job record and a bus frame), wrong passwords per second on the whole node
    queue_name_bytes_max: int = 0xFFFF - len("dead:")
    auth_failures_per_second_max: int = 100
    # WAITJOB: (job, wait) entries one client may hold in one worker's WAITJOB table
    # (that table holds 1,000,000), so one client cannot fill it for everyone
    waitjob_entries_per_client_max: int = 100_000
    # ADDJOB ... DEDUP: keys one worker holds (workers/dedup.py); past it the oldest
    # key is forgotten (its job stays, no longer deduplicated), an add never fails
    dedup_keys_max: int = 1_000_000
    # REDRIVE: jobs one call moves back from a dead-letter queue (its COUNT is cut to
    # it; a worker also serves other clients): a bigger backlog takes several calls
    redrive_count_max: int = 10_000
    # joining by configuration (bus/seeds.py, docs/cluster.md): host:port[,host:port...]
    # of peers (their client port) worker 0 MEETs while it knows no peer; "" = none
    cluster_seeds: str = ""
    # ADDJOB ... GROUP: groups with queued jobs one queue holds; past it a job of a
    # new group is refused (-ERR), so one queue's group lanes stay bounded
    queue_groups_max: int = 100_000
    # QLIMIT (docs/extensions.md, "Limits"): the largest ACTIVE, RATE or GROUP-ACTIVE
    # a queue may be given (past it: -ERR, nothing changed), and the queues with
    # limits one worker holds (their limits outlive the queue, so they are bounded)
    qlimit_value_max: int = 1_000_000
    qlimit_queues_max: int = 100_000
    # ACKJOB ... RESULT / RESULT (workers/results.py, docs/extensions.md, "Results"):
    # how long a result is kept (s), one value's bytes (refused past it), the bytes of
    # every result one worker keeps (the oldest dropped past it; also counted in
    # maxmemory and evicted first), one WORKING ... PROGRESS value's bytes
    result_ttl: int = 3600
    result_bytes_max: int = 1 << 20
    result_store_bytes_max: int = 256 << 20
    progress_bytes_max: int = 4096
    # ADDJOB ... DEDUP-KEEP seconds: the longest a key is kept past its job's ACK
    dedup_keep_max: int = 7 * 24 * 3600
    # SCHEDULE (docs/extensions.md, "Schedules"): schedules one node holds (a SET past
    # it is refused, a peer's is not taken), the body of a schedule's ADDJOB, what a
    # fire time missed while the node was down does (once | skip), and how long the
    # next node in a schedule's firer order waits for the firer's note before it fires
    schedules_max: int = 10_000
    schedule_body_bytes_max: int = 64 * 1024
    schedule_missed: str = "once"
    schedule_takeover_ms: int = 2000


class ConfigValueError(ValueError):
    """A directive's value is not acceptable; the message is the reason."""


class ConfigRefused(ConfigValueError):
    """A CONFIG SET of ours refused for a reason the client is told (the reference
    has no text for it): a loose secret file, a dir change under the AOF."""


class ConfigError(Exception):
    """A configuration line that stops start-up (Redis' FATAL CONFIG FILE ERROR)."""

    def __init__(self, reason: str, line_no: int, line: str, source: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.line_no = line_no
        self.line = line
        self.source = source  # file path, or "" for the command line

    def report(self) -> str:
        where = (
            f"Reading the configuration file, at line {self.line_no}"
            if self.source
            else f"Reading the command line, at option {self.line_no}"
        )
        src = f"File: {self.source}\n" if self.source else ""
        return (
            f"\n*** FATAL CONFIG FILE ERROR ***\n{src}{where}\n>>> '{self.line}'\n{self.reason}\n"
        )


# --- value parsers: text -> Python value, ConfigValueError(reason) when bad ---

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1024, "m": 1000**2, "mb": 1024**2,
          "g": 1000**3, "gb": 1024**3}
_MEM_RE = re.compile(r"^(-?\d{1,19})([a-zA-Z]*)$")  # fits Disque's long long
authpass_len_max = 512  # Disque's REDIS_AUTHPASS_MAX_LEN
bind_addresses_max = 16  # Disque's REDIS_BINDADDR_MAX
hz_min, hz_max = 1, 500  # Disque clamps hz into this range
workers_max = 1024  # one process per core; more would only thrash
# A job record holds a queue name of at most 0xFFFF bytes (workers/job.py) and the
# cluster bus one of at most 64 KB (bus/messages.py); MAXDELIVER names the dead-letter
# queue dead:<name>, so a client's name leaves room for it.
queue_name_bytes_limit = 0xFFFF - len("dead:")
long_min, long_max = -(1 << 63), (1 << 63) - 1  # Disque keeps numbers in a long long


def parse_memory(text: str) -> int:
    """Redis' memtoll: 1gb = 1024^3, 1g = 10^9, plain numbers are bytes."""
    m = _MEM_RE.match(text.strip())
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigValueError(f"Invalid memory value '{text}'")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def format_memory(n: int) -> str:
    """Bytes as CONFIG REWRITE writes them: the largest exact binary unit."""
    for unit, size in (("gb", 1 << 30), ("mb", 1 << 20), ("kb", 1 << 10)):
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def parse_bool(text: str) -> bool:
    low = text.lower()
    if low not in ("yes", "no"):
        raise ConfigValueError("argument must be 'yes' or 'no'")
    return low == "yes"


def parse_int(text: str, reason: str, lo: int | None = None, hi: int | None = None) -> int:
    if len(text) > 20:  # longer than any 64-bit number (and int() would refuse > 4300 digits)
        raise ConfigValueError(reason)
    try:
        n = int(text, 10)
    except ValueError:
        raise ConfigValueError(reason) from None
    lo = long_min if lo is None else lo
    hi = long_max if hi is None else hi
    if not lo <= n <= hi:
        raise ConfigValueError(reason)
    return n


# --- the directive table ---


@dataclass(frozen=True, slots=True)
class Directive:
    name: str
    kind: str  # int | mem | bool | enum | str | special
    settable: bool  # CONFIG SET may change it while running
    reason: str = ""  # error text for a bad value
    lo: int | None = None
    hi: int | None = None
    choices: tuple[str, ...] = ()
    nargs: int = 1  # exact count; 0 = one or more

    @property
    def attr(self) -> str:
        return self.name.replace("-", "_")


def _d(name: str, kind: str, settable: bool, reason: str = "", **kw: object) -> Directive:
    return Directive(name, kind, settable, reason, **kw)  # type: ignore[arg-type]


# Order = the reference's `CONFIG GET *` (tests/reference/03), then the ones it does
# not list, then ours. config_get() walks this order.
DIRECTIVES: tuple[Directive, ...] = (
    _d("requirepass", "special", True),
    _d("unixsocket", "str", False),
    _d("logfile", "str", False),
    _d("pidfile", "str", False),
    _d("maxmemory", "mem", True, "Invalid maxmemory value", lo=0),
    _d("maxmemory-samples", "int", True, "maxmemory-samples must be 1 or greater", lo=1),
    _d("timeout", "int", True, "Invalid timeout value", lo=0),
    _d("auto-aof-rewrite-percentage", "int", True,
       "Invalid negative percentage for AOF auto rewrite", lo=0),
    _d("auto-aof-rewrite-min-size", "mem", True, "Invalid auto-aof-rewrite-min-size", lo=0),
    _d("slowlog-log-slower-than", "int", True, "Invalid slowlog-log-slower-than value"),
    _d("latency-monitor-threshold", "int", True,
       "The latency threshold can't be negative", lo=0),
    _d("slowlog-max-len", "int", True, "Invalid slowlog-max-len value", lo=0),
    _d("port", "int", False, "Invalid port", lo=1, hi=55535),  # bus port = port + 10000; 0 (no TCP) makes no sense here
    _d("tcp-backlog", "int", False, "Invalid backlog value", lo=0),
    _d("databases", "int", False, "Invalid number of databases", lo=1),
    _d("maxclients", "int", True, "Invalid max clients limit", lo=1),
    _d("watchdog-period", "int", True, "Invalid watchdog-period value", lo=0),
    _d("hz", "special", True, "Invalid hz value"),
    _d("cluster-node-timeout", "int", True,
       "cluster node timeout must be 1 or greater", lo=1),
    _d("tcp-keepalive", "int", True, "Invalid tcp-keepalive value", lo=0),
    _d("no-appendfsync-on-rewrite", "bool", True),
    _d("daemonize", "special", False),
    _d("activerehashing", "bool", True),
    _d("aof-rewrite-incremental-fsync", "bool", True),
    _d("aof-load-truncated", "bool", True),
    _d("aof-enqueue-jobs-once", "bool", True),
    _d("maxmemory-policy", "enum", True, "Invalid maxmemory policy",
       choices=("acks", "noeviction")),
    _d("loglevel", "enum", True,
       "Invalid log level. Must be one of debug, verbose, notice, warning",
       choices=("debug", "verbose", "notice", "warning")),
    _d("appendfsync", "enum", True, "argument must be 'no', 'always' or 'everysec'",
       choices=("everysec", "always", "no")),
    _d("syslog-facility", "enum", False, "Invalid log facility. Must be one of USER or between LOCAL0-LOCAL7",
       choices=("user", *(f"local{i}" for i in range(8)))),
    _d("appendonly", "bool", True),
    _d("dir", "special", True),
    _d("client-output-buffer-limit", "special", True, nargs=4),
    _d("unixsocketperm", "special", False, "Invalid socket file permissions"),
    _d("bind", "special", False, nargs=0),
    # not listed by the reference's CONFIG GET *, but valid in its config file
    _d("appendfilename", "special", False),
    _d("cluster-config-file", "str", False),
    _d("syslog-enabled", "bool", False),
    _d("syslog-ident", "str", False),
    # ours: input limits and the process count
    _d("client-query-buffer-bytes-max", "mem", True,
       "Invalid client-query-buffer-bytes-max value", lo=1024),
    _d("proto-max-bulk-len", "mem", True, "Invalid proto-max-bulk-len value", lo=1),
    _d("proto-max-multibulk-len", "int", True, "Invalid proto-max-multibulk-len value", lo=1),
    # ours: the work one command may do (README, Limits)
    _d("getjob-count-max", "int", True, "Invalid getjob-count-max value", lo=1),
    _d("qpeek-count-max", "int", True, "Invalid qpeek-count-max value", lo=1),
    _d("qgroups-count-max", "int", True, "Invalid qgroups-count-max value", lo=1),
    _d("scan-count-max", "int", True, "Invalid scan-count-max value", lo=1),
    _d("forwarded-commands-max", "int", True, "Invalid forwarded-commands-max value", lo=1),
    _d("workers", "int", False, f"workers must be between 1 and {workers_max}",
       lo=1, hi=workers_max),
    _d("worker-ports-base", "int", False, "Invalid worker-ports-base (0 = off)", lo=0, hi=65535),
    # ours: the HTTP endpoint (metrics, admin API, dashboard)
    _d("http-port", "int", False, "Invalid http-port (0 = off)", lo=0, hi=65535),
    _d("http-bind", "str", False),
    _d("http-metrics-queues-max", "int", True, "Invalid http-metrics-queues-max value", lo=0),
    _d("http-api-jobs-max", "int", True, "Invalid http-api-jobs-max value", lo=1),
    _d("http-request-bytes-max", "mem", True, "Invalid http-request-bytes-max value", lo=1024),
    # ours: security (CONFIG GET shows the secret file's name, never a key)
    _d("cluster-secret-file", "special", True),
    _d("protected-mode", "bool", True),
    _d("tls-port", "int", False, "Invalid tls-port", lo=0, hi=65535),
    _d("tls-cert-file", "str", False),
    _d("tls-key-file", "str", False),
    _d("tls-ca-cert-file", "str", False),
    _d("tls-auth-clients", "enum", False, "argument must be 'yes', 'no' or 'optional'",
       choices=("yes", "no", "optional")),
    _d("tls-cluster", "bool", False),
    _d("tls-protocols", "special", False, nargs=0),
    # ours: security bounds (docs/security.md)
    _d("unauth-multibulk-len-max", "int", True, "Invalid unauth-multibulk-len-max value", lo=3),
    _d("unauth-bulk-bytes-max", "mem", True, "Invalid unauth-bulk-bytes-max value", lo=1024),
    _d("auth-failure-delay-ms", "int", True, "Invalid auth-failure-delay-ms value",
       lo=0, hi=10_000),
    _d("http-connections-max", "int", True, "Invalid http-connections-max value", lo=1),
    _d("http-allowed-hosts", "special", True, nargs=0),
    # ours: operator-side safety (docs/security.md)
    _d("dir-strict-modes", "bool", False),
    _d("cluster-secret-replace", "bool", True),
    _d("http-unauth-connections-max", "int", True, "Invalid http-unauth-connections-max value",
       lo=1),
    _d("http-unauth-idle-ms", "int", True, "Invalid http-unauth-idle-ms value",
       lo=100, hi=3_600_000),
    _d("http-metrics-label-bytes-max", "int", True, "Invalid http-metrics-label-bytes-max value",
       lo=16, hi=65536),
    _d("requirepass-file", "special", False),
    # ours: the log's format (docs/observability.md)
    _d("logformat", "enum", False, "Invalid logformat. Must be one of text, json",
       choices=("text", "json")),
    _d("readyz-timeout-ms", "int", True, "Invalid readyz-timeout-ms value", lo=1,
       hi=60_000),
    # ours: security bounds of the command layer (docs/security.md)
    _d("queue-name-bytes-max", "int", True,
       f"queue-name-bytes-max must be between 1 and {queue_name_bytes_limit}",
       lo=1, hi=queue_name_bytes_limit),
    _d("auth-failures-per-second-max", "int", True,
       "auth-failures-per-second-max must be between 1 and 1000000", lo=1, hi=1_000_000),
    _d("waitjob-entries-per-client-max", "int", True,
       "waitjob-entries-per-client-max must be between 1 and 1000000", lo=1, hi=1_000_000),
    # ours: idempotent adds (docs/extensions.md, "Idempotent adds")
    _d("dedup-keys-max", "int", True,
       "dedup-keys-max must be between 1 and 100000000", lo=1, hi=100_000_000),
    _d("redrive-count-max", "int", True,
       "redrive-count-max must be between 1 and 1000000", lo=1, hi=1_000_000),
    # ours: joining by configuration (docs/cluster.md)
    _d("cluster-seeds", "special", True),
    # ours: damage before the end of an AOF (docs/persistence.md, "Damaged files")
    _d("aof-load-corrupt", "enum", True, "argument must be 'refuse' or 'skip'",
       choices=("refuse", "skip")),
    _d("queue-groups-max", "int", True,
       "queue-groups-max must be between 1 and 100000000", lo=1, hi=100_000_000),
    # ours: QLIMIT's bounds (docs/extensions.md, "Limits")
    _d("qlimit-value-max", "int", True,
       "qlimit-value-max must be between 1 and 1000000000", lo=1, hi=1_000_000_000),
    _d("qlimit-queues-max", "int", True,
       "qlimit-queues-max must be between 1 and 10000000", lo=1, hi=10_000_000),
    # ours: results, progress, dedup that remembers (docs/extensions.md)
    _d("result-ttl", "int", True, "result-ttl must be between 1 and 31536000",
       lo=1, hi=365 * 24 * 3600),
    _d("result-bytes-max", "int", True, "result-bytes-max must be between 1 and 67108864",
       lo=1, hi=64 << 20),
    _d("result-store-bytes-max", "int", True,
       "result-store-bytes-max must be between 1 and 1099511627776", lo=1, hi=1 << 40),
    _d("progress-bytes-max", "int", True, "progress-bytes-max must be between 1 and 67108864",
       lo=1, hi=64 << 20),
    _d("dedup-keep-max", "int", True, "dedup-keep-max must be between 1 and 315360000",
       lo=1, hi=10 * 365 * 24 * 3600),
    # ours: schedules (docs/extensions.md, "Schedules"); read at start
    _d("schedules-max", "int", False, "schedules-max must be between 1 and 1000000",
       lo=1, hi=1_000_000),
    _d("schedule-body-bytes-max", "mem", False, "Invalid schedule-body-bytes-max value",
       lo=1, hi=64 << 20),
    _d("schedule-missed", "enum", False, "argument must be 'once' or 'skip'",
       choices=("once", "skip")),
    _d("schedule-takeover-ms", "int", False, "schedule-takeover-ms must be between 100 and 600000",
       lo=100, hi=600_000),
)
BY_NAME: dict[str, Directive] = {d.name: d for d in DIRECTIVES}
# Names Redis users know for our limit directives (same field, same units).
ALIASES: dict[str, str] = {"client-query-buffer-limit": "client-query-buffer-bytes-max"}


def _special_value(cfg: Config, d: Directive, args: list[str], at_startup: bool) -> object:
    name, v = d.name, args[0]
    if name == "requirepass":
        if len(v) > authpass_len_max:
            raise ConfigValueError("Password is longer than REDIS_AUTHPASS_MAX_LEN")
        return v
    if name == "hz":  # Disque clamps instead of refusing
        return min(max(parse_int(v, d.reason), hz_min), hz_max)
    if name == "daemonize":
        if parse_bool(v):
            raise ConfigValueError(
                "daemonize yes is not supported: run disque-mp in the foreground "
                "and let systemd supervise it (see systemd/disque-mp.service)")
        return False
    if name == "dir":
        return _set_dir(cfg, v, at_startup)
    if name == "client-output-buffer-limit":
        return _client_output_buffer_limit(args)
    if name == "unixsocketperm":
        try:
            perm = int(v, 8)
        except ValueError:
            raise ConfigValueError(d.reason) from None
        if not 0 <= perm <= 0o777:
            raise ConfigValueError(d.reason)
        return perm
    if name == "bind":
        if len(args) > bind_addresses_max:
            raise ConfigValueError("Too many bind addresses specified.")
        return " ".join(args)
    if name == "http-allowed-hosts":
        return " ".join(" ".join(args).split())
    if name == "tls-protocols":
        words = " ".join(args).split()
        if any(w.lower() not in ("tlsv1.2", "tlsv1.3") for w in words):
            raise ConfigValueError("tls-protocols: only TLSv1.2 and TLSv1.3 are supported")
        return " ".join(words)
    if name == "cluster-secret-file":
        if not at_startup and v:  # at start-up the worker reads it, from inside dir
            from bus.auth import SecretError, check_new_secret_file

            try:
                check_new_secret_file(v, cfg.cluster_secret_replace)
            except SecretError as exc:
                raise ConfigRefused(str(exc)) from None
        return v
    if name == "requirepass-file":
        cfg.requirepass = _read_requirepass_file(v)
        return v
    if name == "cluster-seeds":
        from bus.seeds import SeedError, normalize

        try:
            return normalize(v)
        except SeedError as exc:
            raise ConfigRefused(str(exc)) from None
    if name == "appendfilename":
        if "/" in v or not v:
            raise ConfigValueError("appendfilename can't be a path, just a filename")
        return v
    raise ConfigValueError(f"no parser for {name}")  # table and code out of step: a bug


requirepass_file_bytes_max = 4096  # a password file: one line; Disque's limit is 512


def _read_requirepass_file(path: str) -> str:
    """``requirepass`` from a file (its first line): a password on the command line is
    readable by every local user in /proc/<pid>/cmdline; a file of mode 0600 is not."""
    try:
        with open(path, "rb") as f:
            data = f.read(requirepass_file_bytes_max + 1)
    except (OSError, ValueError) as e:
        raise ConfigValueError(f"Can't read requirepass-file '{path}': {e}") from None
    if len(data) > requirepass_file_bytes_max:
        raise ConfigValueError(f"requirepass-file '{path}' is larger than "
                               f"{requirepass_file_bytes_max} bytes")
    lines = data.decode("utf-8", "surrogateescape").splitlines()
    password = lines[0] if lines else ""
    if not password:
        raise ConfigValueError(f"requirepass-file '{path}' holds no password")
    if len(password) > authpass_len_max:
        raise ConfigValueError("Password is longer than REDIS_AUTHPASS_MAX_LEN")
    return password


def _set_dir(cfg: Config, path: str, at_startup: bool) -> str:
    """At start-up the supervisor creates and enters ``dir``; at run time CONFIG
    SET dir changes into it right away, as Disque does."""
    if not path:
        raise ConfigValueError("dir can't be empty")
    if at_startup:
        return path
    if cfg.appendonly and os.path.realpath(path) != os.path.realpath(cfg.dir):
        # the AOF stays open in the old dir while a restart would read the new one:
        # every job written so far would be lost (turn appendonly off first)
        raise ConfigRefused("can't change dir while appendonly is yes "
                            "(CONFIG SET appendonly no first, or restart with the new dir)")
    problem = dir_mode_problem(path) if cfg.dir_strict_modes else None
    if problem:
        raise ConfigRefused(problem)
    try:
        os.chdir(path)
    except (OSError, ValueError) as e:  # ValueError: an embedded NUL
        raise ConfigValueError(f"Can't chdir to '{path}': {e}") from None
    return os.getcwd()


def dir_mode_problem(path: str) -> str | None:
    """Why ``path`` may not be the data dir, or None: another local user could have
    planted files in it (a nodes.conf that sets the node's ID, an AOF of jobs), as
    sshd's StrictModes refuses a loose key file (``dir-strict-modes``)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None  # chdir says why
    if st.st_uid != os.geteuid():
        return (f"Refusing the dir '{path}': it is owned by uid {st.st_uid}, not by the "
                f"node's user (uid {os.geteuid()}); another user may have planted files in it. "
                "Use a directory of the node's own (or set dir-strict-modes no)")
    if st.st_mode & 0o022:
        return (f"Refusing the dir '{path}': its mode {st.st_mode & 0o7777:04o} lets other "
                "users write in it. Use a directory of the node's own, e.g. "
                "mkdir -m 700 ~/disque-data and --dir ~/disque-data (or set dir-strict-modes no)")
    return None


def _client_output_buffer_limit(args: list[str]) -> str:
    klass = args[0].lower()
    if klass != "normal":  # Disque has no replicas and no pub/sub
        raise ConfigValueError("Invalid client class specified in buffer limit. Must be normal")
    hard, soft = parse_memory(args[1]), parse_memory(args[2])
    secs = parse_int(args[3], "Invalid client-output-buffer-limit seconds", lo=0)
    if hard < 0 or soft < 0:
        raise ConfigValueError("Error in hard, soft or soft_seconds setting in buffer limit")
    return f"normal {hard} {soft} {secs}"


def parse_value(cfg: Config, d: Directive, args: list[str], at_startup: bool = True) -> object:
    """Validate ``args`` for directive ``d``; return the value for Config."""
    if (d.nargs and len(args) != d.nargs) or not args:
        raise ConfigValueError("Bad directive or wrong number of arguments")
    if d.kind == "int":
        return parse_int(args[0], d.reason, d.lo, d.hi)
    if d.kind == "mem":
        try:
            n = parse_memory(args[0])
        except ConfigValueError:
            raise ConfigValueError(d.reason) from None
        if (d.lo is not None and n < d.lo) or n > long_max:
            raise ConfigValueError(d.reason)
        return n
    if d.kind == "bool":
        return parse_bool(args[0])
    if d.kind == "enum":
        low = args[0].lower()
        if low not in d.choices:
            raise ConfigValueError(d.reason)
        return low
    if d.kind == "str":
        return args[0]
    return _special_value(cfg, d, args, at_startup)


def lookup(name: str) -> Directive | None:
    low = name.lower()
    return BY_NAME.get(ALIASES.get(low, low))


def apply(cfg: Config, name: str, args: list[str], at_startup: bool = True) -> None:
    """Set directive ``name`` from its arguments, or raise ConfigValueError."""
    d = lookup(name)
    if d is None:
        raise ConfigValueError("Bad directive or wrong number of arguments")
    setattr(cfg, d.attr, parse_value(cfg, d, args, at_startup))


# --- loading ---


include_depth_max = 8  # include files may include others; a cycle must not recurse forever


def _directive_lines(lines: list[str]) -> Iterator[tuple[int, str, list[str] | None]]:
    """(index, stripped text, words) of each line that is not blank or a comment; the
    words are None where the quotes are unbalanced."""
    for i, raw in enumerate(lines):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            words: list[str] | None = split_args(line)
        except ArgsError:
            words = None
        yield i, line, words


def _parse_lines(cfg: Config, lines: list[str], source: str, depth: int = 0) -> None:
    for i, line, words in _directive_lines(lines):
        no = i + 1
        if words is None:
            raise ConfigError("Unbalanced quotes in configuration line", no, line, source)
        if not words:
            continue
        try:
            if words[0].lower() == "include":
                _include(cfg, words[1:], source, depth)
            else:
                apply(cfg, words[0], words[1:])
        except ConfigValueError as e:
            raise ConfigError(str(e), no, line, source) from None


def _include(cfg: Config, args: list[str], source: str, depth: int) -> None:
    """Redis' ``include FILE``: read another file in place (relative to this one)."""
    if len(args) != 1:
        raise ConfigValueError("Bad directive or wrong number of arguments")
    if depth >= include_depth_max:
        raise ConfigValueError(f"include nested deeper than {include_depth_max} files")
    base = os.path.dirname(source) if os.path.isabs(source) else os.getcwd()
    path = os.path.join(base, args[0])
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except (OSError, ValueError) as e:  # ValueError: an embedded NUL
        raise ConfigValueError(f"Can't open the included file '{args[0]}': {e}") from None
    _parse_lines(cfg, text.splitlines(), os.path.abspath(path), depth + 1)


def parse_text(text: str, cfg: Config | None = None, source: str = "<string>") -> Config:
    cfg = cfg if cfg is not None else Config()
    _parse_lines(cfg, text.splitlines(), source)
    return cfg


def load(path: str | None, overrides: list[list[str]] | None = None) -> Config:
    """Read ``path`` (if any), then the command-line overrides (later wins).

    ``overrides`` are directive + args lists, e.g. ``[["port", "7711"]]``.
    Raises ConfigError; an unreadable file is reported the same way.
    """
    cfg = Config()
    if path:
        abspath = os.path.abspath(path)
        try:
            with open(abspath, encoding="utf-8", errors="surrogateescape") as f:
                text = f.read()
        except OSError as e:
            raise ConfigError(f"Fatal error, can't open config file '{path}': {e.strerror}",
                              0, "", abspath) from None
        _parse_lines(cfg, text.splitlines(), abspath)
        cfg.config_file = abspath
    for no, words in enumerate(overrides or [], 1):
        line = "--" + " ".join(quote(w) if " " in w or not w else w for w in words)
        try:
            apply(cfg, words[0], words[1:])
        except ConfigValueError as e:
            raise ConfigError(str(e), no, line, "") from None
    reason = check_worker_ports(cfg)
    if reason:
        raise ConfigError(reason, 0, f"worker-ports-base {cfg.worker_ports_base}",
                          cfg.config_file)
    return cfg


def check_secret_file(cfg: Config) -> str:
    """What is wrong with ``cluster-secret-file`` ("" = nothing): the file must be
    readable by this user and hold a key, now, before any worker starts (a relative
    name is inside ``dir``). Not part of ``load()``, which reads the config alone: the
    supervisor asks it at start, and ``--test-config``, run as the service's user."""
    name = cfg.cluster_secret_file
    if not name:
        return ""
    path = name if os.path.isabs(name) else os.path.join(cfg.dir, name)
    from bus.auth import SecretError, load_keys

    try:
        load_keys(path)
    except SecretError as exc:
        return (f"cluster-secret-file: {exc} (create it with one secret a line, readable "
                "by the user the node runs as, mode 600: docs/operations.md)")
    return ""


def worker_ports(cfg: Config) -> list[int]:
    """The port of each worker (index order), [] when worker-ports-base is 0."""
    base = cfg.worker_ports_base
    return [base + k for k in range(cfg.workers)] if base > 0 else []


def check_worker_ports(cfg: Config) -> str:
    """What is wrong with worker-ports-base given the other ports ("" = nothing):
    every worker port must exist and none may be the client, bus, TLS or HTTP port."""
    ports = worker_ports(cfg)
    if not ports:
        return ""
    if ports[-1] > 65535:
        return f"worker-ports-base {ports[0]} + {cfg.workers} workers goes past port 65535"
    others = (("port", cfg.port), ("the cluster bus port", cfg.port + 10000),
              ("tls-port", cfg.tls_port), ("http-port", cfg.http_port))
    for name, port in others:
        if port and ports[0] <= port <= ports[-1]:
            return f"{name} {port} is one of the worker ports {ports[0]}-{ports[-1]}"
    return ""


# --- CONFIG GET / SET ---


def value_text(cfg: Config, d: Directive) -> str:
    """The value as CONFIG GET shows it."""
    v = getattr(cfg, d.attr)
    if d.name == "tcp-keepalive":
        # The reference prints this integer as a boolean (tests/reference/03:
        # tcp-keepalive "no"); clients compare against it, so we do the same.
        return "yes" if v else "no"
    if d.name == "unixsocketperm":
        return f"{v:o}"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def _redis_glob(pattern: str) -> str:
    return pattern.lower().replace("[^", "[!")


def config_get(cfg: Config, pattern: str) -> list[tuple[str, str]]:
    """(name, value) pairs for every directive matching the glob ``pattern``."""
    pat = _redis_glob(pattern)
    return [(d.name, value_text(cfg, d)) for d in DIRECTIVES if fnmatch.fnmatchcase(d.name, pat)]


# Called as fn(name, value) after every successful CONFIG SET in this process.
# The supervisor installs one in each worker to keep its own copy in step, so
# a worker it restarts starts with the values the others run with.
_set_listeners: list[Callable[[str, str], None]] = []


def add_set_listener(fn: Callable[[str, str], None]) -> None:
    _set_listeners.append(fn)


def config_set(cfg: Config, name: str, value: str) -> str | None:
    """Apply CONFIG SET; None on success, else the error text (no "ERR " prefix)."""
    d = lookup(name)
    if d is None or not d.settable:
        return f"Unsupported CONFIG parameter: {name}"
    try:
        args = split_args(value) if d.nargs != 1 else [value]
        new = parse_value(cfg, d, args, at_startup=False)
    except (ConfigValueError, ArgsError) as exc:
        why = f": {exc}" if isinstance(exc, ConfigRefused) else ""  # ours: say why
        return f"Invalid argument '{value}' for CONFIG SET '{name}'{why}"
    setattr(cfg, d.attr, new)
    for fn in _set_listeners:
        fn(d.name, value)
    return None


# --- CONFIG REWRITE ---


def rewrite_line(cfg: Config, d: Directive) -> str:
    """The directive as CONFIG REWRITE writes it (true values, not GET's quirks)."""
    v = getattr(cfg, d.attr)
    if d.kind == "mem":
        text = format_memory(v)
    elif isinstance(v, bool):
        text = "yes" if v else "no"
    elif d.name == "unixsocketperm":
        text = f"{v:o}"
    elif d.name in ("bind", "client-output-buffer-limit"):
        text = v
    elif d.kind == "enum":
        text = v
    elif isinstance(v, str):
        text = quote(v)  # Redis quotes every string value it rewrites
    else:
        text = str(v)
    return f"{d.name} {text}"


def _is_default(cfg: Config, d: Directive, defaults: Config) -> bool:
    if d.name == "requirepass" and cfg.requirepass_file:
        return True  # the password stays in its own file, never copied into the config
    return bool(getattr(cfg, d.attr) == getattr(defaults, d.attr))


REWRITE_MARKER = "# Generated by CONFIG REWRITE"


def rewrite_text(cfg: Config, old_text: str) -> str:
    """Redis' CONFIG REWRITE on a text: update in place, drop repeats, append new."""
    lines = old_text.splitlines()
    where: dict[str, list[int]] = {}
    for i, _, words in _directive_lines(lines):
        d = lookup(words[0]) if words else None  # unreadable (None): kept as it is
        if d is not None:
            where.setdefault(d.name, []).append(i)
    defaults = Config()
    out: list[str | None] = list(lines)
    appended: list[str] = []
    for d in DIRECTIVES:
        seen = where.get(d.name, [])
        if not seen and _is_default(cfg, d, defaults):
            continue
        text = rewrite_line(cfg, d)
        if seen:
            out[seen[0]] = text
            for i in seen[1:]:
                out[i] = None  # a later duplicate would override the new value
        else:
            appended.append(text)
    kept = [x for x in out if x is not None]
    if appended and REWRITE_MARKER not in kept:
        kept.append(REWRITE_MARKER)
    return "\n".join(kept + appended) + "\n"


def rewrite(cfg: Config, path: str = "") -> None:
    """CONFIG REWRITE: write ``path`` (default: the file we started from) atomically."""
    path = path or cfg.config_file
    if not path:
        raise OSError("The server is running without a config file")
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            old = f.read()
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        old, mode = "", 0o644
    write_atomic(path, rewrite_text(cfg, old).encode("utf-8", errors="surrogateescape"), mode)



