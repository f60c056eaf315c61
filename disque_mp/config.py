"""Node configuration: Disque's ``disque.conf`` directives plus our ``workers``.

CONTRACT (shared by the supervisor, the workers and CONFIG GET/SET/REWRITE):
``Config`` holds every directive under its directive name with ``-`` turned into
``_``. Parsing, validation and rewriting live here (owner: supervisor work).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(slots=True)
class Config:
    port: int = 7711
    bind: str = "127.0.0.1"
    dir: str = "."
    logfile: str = ""  # "" = stdout
    loglevel: str = "notice"  # debug | verbose | notice | warning
    pidfile: str = ""
    daemonize: bool = False
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
    # Limits on client input (bad input must never hurt other clients).
    client_query_buffer_bytes_max: int = 1 << 30  # Redis' client-query-buffer-limit
    proto_max_bulk_len: int = 512 << 20  # largest bulk argument accepted
    proto_max_multibulk_len: int = 1024 * 1024  # most arguments in one command
    # ours
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    # where the config came from (CONFIG REWRITE target, INFO config_file)
    config_file: str = ""
