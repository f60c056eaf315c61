"""INFO: every worker's figures (``NodeView.local_stats``), gathered and merged
into the reference's sections.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from disque_mp import DISQUE_VERSION, __version__, compiled
from disque_mp.node import config as configmod
from disque_mp.node import memory
from disque_mp.node.aof import merge_info
from disque_mp.node.errors import ERR_SYNTAX
from disque_mp.node.scatter import gather

if TYPE_CHECKING:
    from disque_mp.node.view import Client, NodeView

INFO_DEFAULT = ("server", "clients", "memory", "jobs", "queues", "persistence", "stats", "cpu",
                "workers")
INFO_ALL = (*INFO_DEFAULT, "commandstats")




# ------------------------------------------------------------------ node-wide commands


def cmd_info(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    if len(cmd) > 2:
        return ERR_SYNTAX
    which = cmd[1].lower().decode("latin-1") if len(cmd) == 2 else "default"
    if which in ("default", "everything"):
        sections: tuple[str, ...] = INFO_DEFAULT if which == "default" else INFO_ALL
    elif which == "all":
        sections = INFO_ALL
    elif which in INFO_ALL:
        sections = (which,)
    else:
        return b""
    return gather(w, conn, "info", None, lambda parts: info_text(w, conn, sections, parts).encode())


def info_text(w: NodeView, conn: Client, sections: tuple[str, ...], parts: list[Any]) -> str:
    blocks = []
    for name in sections:
        fields = _INFO_SECTIONS[name](w, conn, parts)
        title = "# " + ("CPU" if name == "cpu" else name.capitalize())
        blocks.append(title + "\r\n" + "".join(f"{k}:{v}\r\n" for k, v in fields))
    return "\r\n".join(blocks)


def _sum(parts: list[Any], key: str) -> int:
    return sum(int(p[key]) for p in parts)


def _run_id(w: NodeView) -> str:
    return hashlib.sha1(f"{w.node_id}:{w.parent_pid}".encode()).hexdigest()


def _info_server(w: NodeView, conn: Client, parts: list[Any]) -> list[tuple[str, Any]]:
    uptime = int(time.time() - w.start_s)
    uname = platform.uname()
    return [
        ("disque_version", DISQUE_VERSION), ("disque_git_sha1", "00000000"),
        ("disque_git_dirty", 0), ("disque_build_id", _run_id(w)[:16]),
        ("os", f"{uname.system} {uname.release} {uname.machine}"),
        ("arch_bits", 64 if sys.maxsize > 2**32 else 32), ("multiplexing_api", "epoll"),
        ("gcc_version", "0.0.0"), ("process_id", w.parent_pid), ("run_id", _run_id(w)),
        ("tcp_port", w.cfg.port), ("uptime_in_seconds", uptime),
        ("uptime_in_days", uptime // 86400), ("hz", w.cfg.hz),
        ("executable", os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""),
        ("config_file", w.cfg.config_file),
        ("disque_mp_version", __version__),  # ours, after the reference's fields
    ]


def _info_clients(w: NodeView, conn: Client, parts: list[Any]) -> list[tuple[str, Any]]:
    return [("connected_clients", _sum(parts, "clients")), ("client_longest_output_list", 0),
            ("client_biggest_input_buf", 0), ("blocked_clients", _sum(parts, "blocked"))]


def _info_memory(w: NodeView, conn: Client, parts: list[Any]) -> list[tuple[str, Any]]:
    return memory.info_fields(w.cfg.maxmemory, w.cfg.maxmemory_policy, parts)


def _info_jobs(w: NodeView, conn: Client, parts: list[Any]) -> list[tuple[str, Any]]:
    """The reference's registered_jobs, then ours: jobs queued here and jobs whose
    synchronous ADDJOB waits for its copies (what draining a host waits for)."""
    return [(key, sum(int(p["shard"].get(key, 0)) for p in parts))
            for key in ("registered_jobs", "queued_jobs", "wait_repl_jobs")]


def _info_queues(w: NodeView, conn: Client, parts: list[Any]) -> list[tuple[str, Any]]:
    return [("registered_queues", sum(int(p["shard"]["registered_queues"]) for p in parts))]


_AOF_OFF = [("loading", 0), ("aof_enabled", 0), ("aof_state", "off"),
            ("aof_rewrite_in_progress", 0), ("aof_rewrite_scheduled", 0),
            ("aof_last_rewrite_time_sec", -1), ("aof_current_rewrite_time_sec", -1),
            ("aof_last_bgrewrite_status", "ok"), ("aof_last_write_status", "ok")]


def _info_persistence(w: NodeView, conn: Client, parts: list[Any]) -> list[tuple[str, Any]]:
    aof_parts = [[tuple(f) for f in p["aof"]] for p in parts if p.get("aof")]
    if not aof_parts:
        return list(_AOF_OFF)
    return list(merge_info(aof_parts))


def _info_stats(w: NodeView, conn: Client, parts: list[Any]) -> list[tuple[str, Any]]:
    return [("total_connections_received", _sum(parts, "conns_received")),
            ("total_commands_processed", _sum(parts, "commands")),
            ("instantaneous_ops_per_sec", _sum(parts, "ops_per_sec")),
            ("total_net_input_bytes", _sum(parts, "net_in")),
            ("total_net_output_bytes", _sum(parts, "net_out")),
            ("instantaneous_input_kbps", f"{sum(p['in_kbps'] for p in parts):.2f}"),
            ("instantaneous_output_kbps", f"{sum(p['out_kbps'] for p in parts):.2f}"),
            ("rejected_connections", _sum(parts, "rejected")), ("latest_fork_usec", 0),
            ("acl_access_denied_auth",
             sum(int((p.get("bus") or {}).get("client_auth_failures", 0)) for p in parts)),
            *_bus_security_stats(parts), *_dedup_stats(parts), *_results_stats(parts)]


def _dedup_stats(parts: list[Any]) -> list[tuple[str, Any]]:
    """ADDJOB ... DEDUP (workers/dedup.py): keys held now, adds answered with a held
    job's ID, keys forgotten at dedup-keys-max; summed over the workers."""
    return [(n, sum(int((p.get("dedup") or {}).get(n, 0)) for p in parts))
            for n in ("dedup_keys", "dedup_hits", "dedup_keys_forgotten")]


def _results_stats(parts: list[Any]) -> list[tuple[str, Any]]:
    """ACKJOB ... RESULT, WORKING ... PROGRESS, DEDUP-KEEP (workers/results.py,
    workers/dedup.py): summed over the workers."""
    names = ("results", "results_bytes", "results_stored", "results_expired",
             "results_evicted", "progress_jobs", "results_waiting", "dedup_keys_kept")
    return [(n, sum(int((p.get("results") or {}).get(n, 0)) for p in parts)) for n in names]


def _bus_security_stats(parts: list[Any]) -> list[tuple[str, Any]]:
    """Counters of bus/auth.py, summed over the workers (README, Security)."""
    names = ("auth_failures", "bad_frames", "handshake_timeouts", "links_refused",
             "rejected_messages", "local_refused")
    return [(f"cluster_bus_{n}", sum(int((p.get("bus") or {}).get(n, 0)) for p in parts))
            for n in names]


def _info_cpu(w: NodeView, conn: Client, parts: list[Any]) -> list[tuple[str, Any]]:
    return [("used_cpu_sys", f"{sum(p['cpu_sys'] for p in parts):.2f}"),
            ("used_cpu_user", f"{sum(p['cpu_user'] for p in parts):.2f}"),
            ("used_cpu_sys_children", "0.00"), ("used_cpu_user_children", "0.00")]


def _info_commandstats(w: NodeView, conn: Client, parts: list[Any]) -> list[tuple[str, Any]]:
    merged: dict[str, list[int]] = {}
    for p in parts:
        for name, (calls, ns) in p["cmdstats"].items():
            m = merged.setdefault(name, [0, 0])
            m[0] += calls
            m[1] += ns
    out = []
    for key in w.command_names():  # the table's order, like the reference's
        if key in merged:
            calls, ns = merged[key]
            usec = ns // 1000
            out.append((f"cmdstat_{key}", f"calls={calls},usec={usec},usec_per_call={usec / calls:.2f}"))
    return out


def _info_workers(w: NodeView, conn: Client, parts: list[Any]) -> list[tuple[str, Any]]:
    ports = configmod.worker_ports(w.cfg)  # "" when off (README, "Worker ports")
    out: list[tuple[str, Any]] = [("workers", w.workers), ("connection_worker", w.index),
                                  ("shard_build", compiled.summary()),
                                  ("worker_ports", ",".join(map(str, ports))),
                                  *_mesh_stats(parts)]
    for p in parts:
        sh = p["shard"]
        out.append((f"worker{p['index']}",
                     f"pid={p['pid']},clients={p['clients']},jobs={sh['registered_jobs']},"
                     f"queues={sh['registered_queues']},commands={p['commands']},"
                     f"handed_off={p['handed_off']},forwarded={p.get('forwarded', 0)},"
                     f"getjob_skipped={p.get('getjob_skipped', 0)},"
                     f"used_memory_rss={p['rss']}"))
    return out


def _mesh_stats(parts: list[Any]) -> list[tuple[str, Any]]:
    """The mesh's refusals (a request or reply too big for one frame) and link resets
    (a bad frame, a failed send; the link redials), summed over the workers."""
    return [(f"mesh_{n}", sum(int((p.get("mesh") or {}).get(n, 0)) for p in parts))
            for n in ("frames_refused", "link_resets")]


_INFO_SECTIONS: dict[str, Callable[[NodeView, Client, list[Any]], list[tuple[str, Any]]]] = {
    "server": _info_server, "clients": _info_clients, "memory": _info_memory,
    "jobs": _info_jobs, "queues": _info_queues, "persistence": _info_persistence,
    "stats": _info_stats, "cpu": _info_cpu, "commandstats": _info_commandstats,
    "workers": _info_workers,
}
