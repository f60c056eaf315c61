"""Node-wide and connection commands: INFO, CONFIG, CLUSTER, HELLO, CLIENT, ...

Handlers take ``(worker, conn, cmd)`` and return a reply value, or ``PENDING``
after reserving a reply slot (``gather`` does that for commands that need every
worker). ``local_op`` is what each worker runs for a gathered command; its
result crosses the mesh as a packed value, so it is built from JSON-able parts.
The worker is seen through ``view.NodeView``: what these commands use of it.

Scan cursors over workers: global = local * workers + index (contracts.md).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import platform
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bus import mesh as meshmod
from bus.auth import STATS as auth_stats
from bus.mesh import unpack
from disque_mp.node import config as configmod
from disque_mp.node.resp import encode
from disque_mp.node.scatter import on_every_worker
from workers.replies import ERR_SYNTAX, OK, PENDING, Error, Status

log = logging.getLogger("disque_mp.node.admin")

if TYPE_CHECKING:
    from disque_mp.node.view import Client, NodeView

DISQUE_VERSION = "1.0-rc1"  # the API level we answer for (INFO, HELLO 3)
ERR_NOPROTO = Error("NOPROTO unsupported protocol version")
ERR_CLIENT = Error("ERR Syntax error, try CLIENT (LIST | KILL ip:port | GETNAME | SETNAME connection-name)")
ERR_NAME = Error("ERR Client names cannot contain spaces, newlines or special characters.")
ERR_CONFIG = Error("ERR CONFIG subcommand must be one of GET, SET, RESETSTAT, REWRITE")
ERR_DEBUG = Error("ERR Syntax error, try DEBUG [flushall|sleep <seconds>]")
ERR_NO_SUCH_CLIENT = Error("ERR No such client")
# A QSCAN/JSCAN call asks shards again while it found fewer than COUNT items (a
# shard stops after COUNT*10 empty positions), so small node answer in one call
# like the reference; this bounds the work of one call when filters match little.
scan_rounds_max = 16
INFO_DEFAULT = ("server", "clients", "memory", "jobs", "queues", "persistence", "stats", "cpu",
                "workers")
INFO_ALL = (*INFO_DEFAULT, "commandstats")


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


# ------------------------------------------------------------------ gathering


def gather(w: NodeView, conn: Client, op: str, arg: Any, finish: Callable[[list[Any]], Any]) -> Any:
    """Run ``local_op(op, arg)`` on every worker; reply ``finish(results by index)``."""
    slot = conn.defer()

    def reply(results: list[Any]) -> None:
        errors = [r for r in results if isinstance(r, Error)]
        conn.fill(slot, encode(errors[0] if errors else finish(results), conn.resp3))

    on_every_worker(w, op, arg, local_op, reply)
    return PENDING


def local_op(w: NodeView, op: str, arg: Any) -> Any:
    """This worker's part of a node-wide command."""
    if op.startswith("http."):  # the HTTP endpoint's gathers (disque_mp/node/http/ops.py)
        from disque_mp.node.http.ops import local_op as http_local_op

        return http_local_op(w, op, arg)
    if op == "info":
        return w.local_stats()
    if op == "qscan":
        cursor, count, minlen, maxlen, importrate = arg
        nxt, names = w.shard.op_qscan(cursor, count, minlen, maxlen, importrate)
        return [nxt, names]
    if op == "jscan":
        cursor, count, queue, states, reply_all = arg
        qname = queue.encode("latin-1") if queue is not None else None
        nxt, items = w.shard.op_jscan(cursor, count, qname, set(states) if states is not None else None,
                                      reply_all, w.now_ms)
        return [nxt, items]
    if op == "flushall":
        w.flush_all()  # blocked GETJOBs answered as on timeout, shard, AOF, memory level
        return OK
    if op == "config_set":
        return _apply_config(w, arg[0], arg[1])
    if op == "resetstat":
        w.reset_stats()
        return OK
    if op == "clients":
        return [client_line(w, c) for c in w.conns]
    if op == "client_kill":
        return kill_clients(w, list(arg))
    if op == "slowlog_get":
        return w.slowlog.newest(int(arg))
    if op == "slowlog_len":
        return len(w.slowlog.entries)
    if op == "slowlog_reset":
        w.slowlog.reset()
        return OK
    if op == "bgrewriteaof":
        if w.aof is None:
            return "ERR Append only file persistence is not available in this build"
        return w.aof.bgrewriteaof()
    if op == "memory":
        return w.memory.local_used() if w.memory is not None else 0
    if op == "rewrite_at_exit":
        w.rewrite_aof_at_exit = True
        return OK
    return Error(f"ERR unknown node operation '{op}'")


# ------------------------------------------------------------------ connection commands


def cmd_ping(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    if len(cmd) > 2:
        return Error("ERR wrong number of arguments for 'ping' command")
    return cmd[1] if len(cmd) == 2 else Status("PONG")


def cmd_time(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    now_us = time.time_ns() // 1000
    return [str(now_us // 1_000_000).encode(), str(now_us % 1_000_000).encode()]


def cmd_auth(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    """``AUTH password`` (Disque) and ``AUTH default password`` (Redis 6+: redis-py
    sends it when given a username); "default" is the only user."""
    if len(cmd) > 3:
        return ERR_SYNTAX
    if len(cmd) == 3:
        if cmd[1] != b"default" or (w.cfg.requirepass and not _password_ok(w, cmd[2])):
            # Redis 6's form keeps the connection as it was (without requirepass every
            # connection is, and stays, authenticated)
            _auth_failed(conn)
            return Error("WRONGPASS invalid username-password pair or user is disabled.")
        conn.authed = True
        return OK
    if not w.cfg.requirepass:
        return Error("ERR Client sent AUTH, but no password is set")
    if not _password_ok(w, cmd[1]):
        conn.authed = False
        _auth_failed(conn)
        return Error("ERR invalid password")
    conn.authed = True
    return OK


def _auth_failed(conn: Client) -> None:
    """Counted (INFO acl_access_denied_auth); the connection reads its next command
    only after ``auth-failure-delay-ms`` (connection.py), so guessing is slow."""
    auth_stats["client_auth_failures"] += 1
    conn.auth_fails += 1


def _password_ok(w: NodeView, given: bytes) -> bool:
    return hmac.compare_digest(given, w.cfg.requirepass.encode("utf-8", "surrogateescape"))


def cmd_hello(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    if len(cmd) == 1:
        if not conn.authed:
            return Error("NOAUTH Authentication required.")
        return _tls_ports(w, conn, _disque_hello(w))
    try:
        proto = int(cmd[1])
    except ValueError:
        return Error("ERR Protocol version is not an integer or out of range")
    if proto not in (2, 3):
        return ERR_NOPROTO
    err = _hello_options(w, conn, cmd[2:])
    if err is not None:
        return err
    if not conn.authed:
        return Error("NOAUTH HELLO must be called with the client already authenticated, otherwise "
                     "the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the "
                     "client and select the RESP protocol version at the same time")
    conn.resp3 = proto == 3
    return {"server": "disque", "version": DISQUE_VERSION, "proto": proto, "id": conn.id,
            "mode": "standalone", "role": "master", "modules": []}


def _hello_options(w: NodeView, conn: Client, opts: list[bytes]) -> Error | None:
    i = 0
    while i < len(opts):
        opt = opts[i].lower()
        if opt == b"auth" and len(opts) - i >= 3:
            if opts[i + 1] != b"default" or not w.cfg.requirepass \
                    or not _password_ok(w, opts[i + 2]):
                _auth_failed(conn)
                return Error("WRONGPASS invalid username-password pair or user is disabled.")
            conn.authed = True
            i += 3
        elif opt == b"setname" and len(opts) - i >= 2:
            if not _valid_name(opts[i + 1]):
                return ERR_NAME
            conn.name = opts[i + 1]
            i += 2
        else:
            return Error(f"ERR Syntax error in HELLO option '{_text(opts[i])}'")
    return None


def _disque_hello(w: NodeView) -> Any:
    if w.agent is not None:
        from disque_mp.node.commands import cluster as cmd_cluster

        return cmd_cluster.hello(w.agent)
    me = w.node_id
    return [1, me, [me, "", str(w.cfg.port), "1"]]


def _tls_ports(w: NodeView, conn: Client, reply: Any) -> Any:
    """A client on the TLS port fails over to TLS ports: each node's port moved by
    this node's offset between ``port`` and ``tls-port`` (the nodes of a TLS
    cluster keep the same offset; the bus does not carry TLS ports)."""
    transport = conn.transport
    if not w.cfg.tls_port or transport is None \
            or transport.get_extra_info("ssl_object") is None:
        return reply
    offset = w.cfg.tls_port - w.cfg.port
    return [*reply[:2], *([node_id, ip, str(int(port) + offset), *rest]
                          for node_id, ip, port, *rest in reply[2:])]


def _valid_name(name: bytes) -> bool:
    return all(33 <= ch <= 126 for ch in name)


def cmd_client(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    sub = cmd[1].lower()
    n = len(cmd)
    if sub == b"setname" and n == 3:
        if not _valid_name(cmd[2]):
            return ERR_NAME
        conn.name = cmd[2]
        return OK
    if sub == b"getname" and n == 2:
        return conn.name or None
    if sub == b"id" and n == 2:
        return conn.id
    if sub == b"setinfo" and n == 4:
        return _client_setinfo(conn, cmd[2].lower(), cmd[3])
    if sub == b"info" and n == 2:
        return client_line(w, conn).encode()
    if sub == b"list" and n == 2:
        return gather(w, conn, "clients", None, lambda parts: "".join(
            line for part in parts for line in part).encode())
    if sub == b"kill" and n >= 3:
        return _client_kill(w, conn, cmd[2:])
    return ERR_CLIENT


_CLIENT_TYPES = ("normal", "slave", "replica", "master", "pubsub")


def _client_kill(w: NodeView, conn: Client, args: list[bytes]) -> Any:
    """CLIENT KILL ip:port (+OK or -ERR No such client, the caller included) or the
    filters ID / ADDR / TYPE / SKIPME (the count killed; SKIPME yes by default), as
    Redis; every worker closes its own matching connections."""
    if len(args) == 1:
        flt: list[Any] = [None, _text(args[0]), None, 0]
        return gather(w, conn, "client_kill", flt + [conn.id],
                      lambda parts: OK if sum(parts) else ERR_NO_SUCH_CLIENT)
    if len(args) % 2:
        return ERR_SYNTAX
    flt = [None, None, None, conn.id]  # id, addr, type, the id SKIPME spares (0: none)
    for i in range(0, len(args), 2):
        name, value = args[i].lower(), _text(args[i + 1])
        if name == b"id":
            if not value.isdigit():
                from disque_mp.node.commands.jobs import ERR_NOT_INT

                return ERR_NOT_INT
            flt[0] = int(value)
        elif name == b"addr":
            flt[1] = value
        elif name == b"type":
            if value.lower() not in _CLIENT_TYPES:
                return Error(f"ERR Unknown client type '{value}'")
            flt[2] = value.lower()
        elif name == b"skipme":
            if value.lower() not in ("yes", "no"):
                return ERR_SYNTAX
            flt[3] = conn.id if value.lower() == "yes" else 0
        else:
            return ERR_SYNTAX
    return gather(w, conn, "client_kill", flt + [conn.id], sum)


def kill_clients(w: NodeView, flt: list[Any]) -> int:
    """This worker's part of CLIENT KILL: close the matching connections. The caller's
    own connection is closed after its reply, as Redis does."""
    want_id, addr, ctype, spare, caller = flt
    killed = 0
    for c in list(w.conns):
        if ((want_id is not None and c.id != want_id) or (addr is not None and c.addr != addr)
                or (ctype is not None and ctype != "normal") or c.id == spare):
            continue
        killed += 1
        if c.id == caller:
            c.closing = True
            c.close_after_write = True
        elif c.transport is not None:
            c.transport.close()
    return killed


def _client_setinfo(conn: Client, attr: bytes, value: bytes) -> Any:
    if not _valid_name(value) and value:
        return Error(f"ERR {_text(attr)} cannot contain spaces, newlines or special characters.")
    if attr == b"lib-name":
        conn.lib_name = value
    elif attr == b"lib-ver":
        conn.lib_ver = value
    else:
        return Error(f"ERR Unrecognized option '{_text(attr)}'")
    return OK


def client_line(w: NodeView, c: Client) -> str:
    now = time.time()
    return (f"id={c.id} addr={c.addr} name={_text(c.name)} age={int(now - c.ctime_s)} "
            f"idle={int(now - c.last_s)} flags={'b' if c.waiters else 'N'} db=0 sub=0 psub=0 "
            f"multi=-1 qbuf=0 qbuf-free=0 obl=0 oll=0 omem=0 events=r cmd={c.last_cmd} "
            f"resp={3 if c.resp3 else 2} lib-name={_text(c.lib_name)} lib-ver={_text(c.lib_ver)} "
            f"worker={w.index}\n")


def _table() -> dict[bytes, Any]:
    """The command table (it names this module's handlers, so it is read here late)."""
    from disque_mp.node.commands.table import TABLE

    return TABLE


def cmd_command(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    TABLE = _table()
    if len(cmd) == 1:
        return [_command_entry(c.name) for c in TABLE.values()]
    sub = cmd[1].lower()
    if sub == b"count" and len(cmd) == 2:
        return len(TABLE)
    if sub == b"info":
        return [_command_entry(_text(n).lower()) if n.lower() in TABLE else None for n in cmd[2:]]
    if sub == b"docs":
        return {} if conn.resp3 else []
    return Error(f"ERR Unknown subcommand or wrong number of arguments for '{_text(cmd[1])}'. "
                 "Try COMMAND HELP.")


def _command_entry(name: str) -> list[Any]:
    c = _table()[name.encode()]
    return [name.encode(), c.arity, [Status(f) for f in c.flags], 0, 0, 0]


def cmd_shutdown(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    opts = {a.lower() for a in cmd[1:]}
    if not opts <= {b"nosave", b"save", b"rewrite-aof", b"now", b"force", b"abort"}:
        return ERR_SYNTAX
    if b"abort" in opts:
        return Error("ERR No shutdown in progress.")
    if b"rewrite-aof" in opts:
        w.rewrite_aof_at_exit = True
        for j in range(w.workers):
            if j != w.index:
                w.mesh.send(j, meshmod.K_SCATTER, {"r": 0, "op": "rewrite_at_exit"})
    w.log(f"User requested shutdown (client {conn.addr})")
    # The supervisor stops every worker (us included) and exits 0. The mesh
    # frames above leave before its SIGTERM can arrive: they go out this turn.
    w.loop.call_soon(os.kill, w.parent_pid, signal.SIGTERM)
    conn.closing = True
    return PENDING  # Redis sends no reply to a successful SHUTDOWN


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
    ]


def _info_clients(w: NodeView, conn: Client, parts: list[Any]) -> list[tuple[str, Any]]:
    return [("connected_clients", _sum(parts, "clients")), ("client_longest_output_list", 0),
            ("client_biggest_input_buf", 0), ("blocked_clients", _sum(parts, "blocked"))]


def _info_memory(w: NodeView, conn: Client, parts: list[Any]) -> list[tuple[str, Any]]:
    from disque_mp.node import memory

    return memory.info_fields(w.cfg.maxmemory, w.cfg.maxmemory_policy, parts)


def _info_jobs(w: NodeView, conn: Client, parts: list[Any]) -> list[tuple[str, Any]]:
    return [("registered_jobs", sum(int(p["shard"]["registered_jobs"]) for p in parts))]


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
    from disque_mp.node.aof import merge_info

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
            *_bus_security_stats(parts)]


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
    for name in _table():  # the table's order, like the reference's
        key = name.decode()
        if key in merged:
            calls, ns = merged[key]
            usec = ns // 1000
            out.append((f"cmdstat_{key}", f"calls={calls},usec={usec},usec_per_call={usec / calls:.2f}"))
    return out


def _info_workers(w: NodeView, conn: Client, parts: list[Any]) -> list[tuple[str, Any]]:
    from disque_mp import compiled

    ports = configmod.worker_ports(w.cfg)  # "" when off (README, "Worker ports")
    out: list[tuple[str, Any]] = [("workers", w.workers), ("connection_worker", w.index),
                                  ("shard_build", compiled.summary()),
                                  ("worker_ports", ",".join(map(str, ports)))]
    for p in parts:
        sh = p["shard"]
        out.append((f"worker{p['index']}",
                     f"pid={p['pid']},clients={p['clients']},jobs={sh['registered_jobs']},"
                     f"queues={sh['registered_queues']},commands={p['commands']},"
                     f"handed_off={p['handed_off']},forwarded={p.get('forwarded', 0)},"
                     f"used_memory_rss={p['rss']}"))
    return out


_INFO_SECTIONS: dict[str, Callable[[NodeView, Client, list[Any]], list[tuple[str, Any]]]] = {
    "server": _info_server, "clients": _info_clients, "memory": _info_memory,
    "jobs": _info_jobs, "queues": _info_queues, "persistence": _info_persistence,
    "stats": _info_stats, "cpu": _info_cpu, "commandstats": _info_commandstats,
    "workers": _info_workers,
}


def cmd_config(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    sub = cmd[1].lower()
    n = len(cmd)
    if sub == b"get":
        if n != 3:
            return Error("ERR Wrong number of arguments for CONFIG get")
        return [x.encode() for pair in configmod.config_get(w.cfg, _text(cmd[2])) for x in pair]
    if sub == b"set":
        if n != 4:
            return Error("ERR Wrong number of arguments for CONFIG set")
        name, value = _text(cmd[2]).lower(), _text(cmd[3])
        err = _apply_config(w, name, value)
        if err is not OK:
            return err
        others = [j for j in range(w.workers) if j != w.index]
        if not others:
            return OK
        return gather(w, conn, "config_set", [name, value], lambda parts: OK)
    if sub == b"rewrite":
        if n != 2:
            return Error("ERR Wrong number of arguments for CONFIG rewrite")
        try:
            configmod.rewrite(w.cfg)
        except OSError as exc:
            return Error(f"ERR Rewriting config file: {exc.strerror or exc}")
        return OK
    if sub == b"resetstat":
        return gather(w, conn, "resetstat", None, lambda parts: OK)
    return ERR_CONFIG


ERR_SECRET_OFF = Error(
    "ERR cluster-secret-file: the cluster bus authenticates with this secret; it cannot be "
    "turned off at runtime (remove it from the config file and restart every node)")


def _apply_config(w: NodeView, name: str, value: str) -> Any:
    if name == "cluster-secret-file" and not value and w.agent is not None \
            and w.agent.keyring.enabled:
        # a web page or a stolen password must not open the bus with one command
        log.warning("CONFIG SET cluster-secret-file \"\" refused: the cluster secret "
                    "stays on while the node runs")
        return ERR_SECRET_OFF
    err = configmod.config_set(w.cfg, name, value)
    if err is not None:
        return Error("ERR " + err)
    if name == "loglevel":
        from disque_mp.node.log import set_loglevel

        set_loglevel(w.cfg.loglevel)
    if name in ("getjob-count-max", "qpeek-count-max", "scan-count-max"):
        from disque_mp.node.commands import jobs as cmd_jobs

        cmd_jobs.apply_limits(w.cfg)
    if w.aof is not None and name in ("appendonly", "appendfsync"):
        w.aof.apply_config()
    if w.memory is not None and name == "maxmemory":
        w.memory.update()  # the level follows the new budget at once (the reference
        # measures at every command), not a sample later
    if name == "cluster-secret-file" and w.agent is not None:
        reason = w.agent.configure_secret()  # checked by config_set: only a race fails here
        if reason is not None:
            return Error(f"ERR cluster-secret-file: {reason}")
    return OK


def cmd_debug(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    sub = cmd[1].lower()
    if sub == b"flushall" and len(cmd) == 2:
        return gather(w, conn, "flushall", None, lambda parts: OK)
    if sub == b"sleep" and len(cmd) == 3:
        try:
            time.sleep(max(0.0, float(cmd[2])))
        except ValueError:
            return ERR_DEBUG
        return OK
    return ERR_DEBUG


ERR_SLOWLOG = Error("ERR Unknown SLOWLOG subcommand or wrong # of args. Try GET, RESET, LEN.")


def cmd_slowlog(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    """SLOWLOG GET [count] | LEN | RESET over every worker's log (disque_mp/node/slowlog.py)."""
    from disque_mp.node import slowlog

    sub, n = cmd[1].lower(), len(cmd)
    if sub == b"get" and n in (2, 3):
        count = slowlog.slowlog_get_default
        if n == 3:
            from disque_mp.node.commands.jobs import ERR_NOT_INT, parse_int

            parsed = parse_int(cmd[2])
            if parsed is None:
                return ERR_NOT_INT
            count = parsed
        return gather(w, conn, "slowlog_get", count,
                      lambda parts: slowlog.merge(parts, count))
    if sub == b"len" and n == 2:
        return gather(w, conn, "slowlog_len", None, sum)
    if sub == b"reset" and n == 2:
        return gather(w, conn, "slowlog_reset", None, lambda parts: OK)
    return ERR_SLOWLOG


def cmd_bgrewriteaof(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    def finish(parts: list[Any]) -> Any:
        texts = [str(p) for p in parts]
        for t in texts:
            if t.startswith("ERR "):
                return Error(t)
        return Status(texts[0])

    return gather(w, conn, "bgrewriteaof", None, finish)


def cmd_cluster(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    """CLUSTER: handed to the cluster work (``cmd_cluster.cluster``, run on worker 0)."""
    if w.agent is None:
        return _cluster_single(w, cmd)
    from disque_mp.node.commands import cluster as cmd_cluster

    slot = conn.defer()
    if cmd[1].lower() != b"reset":
        cmd_cluster.cluster(w.agent, cmd[1:], lambda reply: conn.fill(slot, encode(reply, conn.resp3)))
        return PENDING

    def reset_done(reply: Any) -> None:
        if isinstance(reply, Error):
            conn.fill(slot, encode(reply, conn.resp3))
            return
        # The reference's clusterReset ends with flushServerData: a reset node holds
        # no jobs and no queues (their node lists name nodes it no longer knows).
        on_every_worker(w, "flushall", None, local_op, lambda parts: conn.fill(slot, encode(reply, conn.resp3)))

    cmd_cluster.cluster(w.agent, cmd[1:], reset_done)
    return PENDING


def _cluster_single(w: NodeView, cmd: list[bytes]) -> Any:
    sub = cmd[1].lower()
    if sub == b"myid" and len(cmd) == 2:
        return w.node_id.encode()
    if sub == b"nodes" and len(cmd) == 2:
        return f"{w.node_id} :{w.cfg.port} myself 0 0 connected\n".encode()
    if sub == b"info" and len(cmd) == 2:
        return (b"cluster_state:ok\r\ncluster_known_nodes:1\r\ncluster_reachable_nodes:0\r\n"
                b"cluster_size:1\r\ncluster_stats_messages_sent:0\r\n"
                b"cluster_stats_messages_received:0\r\n")
    return Error("ERR Wrong CLUSTER subcommand or number of arguments")


# ------------------------------------------------------------------ scans


def cmd_qscan(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    from disque_mp.node.commands import jobs as cmd_jobs

    spec = cmd_jobs.parse_qscan(cmd[1:])
    if isinstance(spec, Error):
        return spec

    def arg(local: int) -> Any:
        return [local, spec.count, spec.minlen, spec.maxlen, spec.importrate]

    return _scan(w, conn, "qscan", spec, arg)


def cmd_jscan(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    from disque_mp.node.commands import jobs as cmd_jobs

    spec = cmd_jobs.parse_jscan(cmd[1:])
    if isinstance(spec, Error):
        return spec
    queue = spec.queue.decode("latin-1") if spec.queue is not None else None
    states = sorted(spec.states) if spec.states is not None else None

    def arg(local: int) -> Any:
        return [local, spec.count, queue, states, spec.reply_all]

    return _scan(w, conn, "jscan", spec, arg)


def _scan(w: NodeView, conn: Client, op: str, spec: Any, arg: Callable[[int], Any]) -> Any:
    """Walk workers from the cursor's one; move on while a call found fewer than COUNT.

    BUSYLOOP too stops at the bounds of one call (its COUNT is scan-count-max, and
    at most scan_rounds_max shard calls): the client continues by cursor, and no
    call stalls the worker (worker 0 also serves the cluster bus)."""
    n = w.workers
    state = {"worker": spec.cursor % n, "local": spec.cursor // n, "rounds": 0}
    if state["worker"] >= n:
        return Error("ERR invalid cursor")
    items: list[Any] = []
    slot = conn.defer()

    def done(cursor: int) -> None:
        conn.fill(slot, encode([str(cursor).encode(), items], conn.resp3))

    def got(value: Any) -> None:
        while True:
            if isinstance(value, Error):
                conn.fill(slot, encode(value, conn.resp3))
                return
            nxt, part = value
            items.extend(part)
            worker = state["worker"]
            state["rounds"] += 1
            if nxt:
                if len(items) >= spec.count or state["rounds"] >= scan_rounds_max:
                    return done(nxt * n + worker)
                state["local"] = nxt
            else:
                if worker + 1 >= n:
                    return done(0)
                if len(items) >= spec.count or state["rounds"] >= scan_rounds_max:
                    return done(worker + 1)
                state["worker"], state["local"] = worker + 1, 0
            value = ask()
            if value is PENDING:
                return

    def ask() -> Any:
        worker = state["worker"]
        if worker == w.index:
            return local_op(w, op, arg(state["local"]))
        w.mesh.request(worker, meshmod.K_SCATTER, {"op": op, "a": arg(state["local"])}, (),
                       lambda m, b: got(unpack(m.get("v"), b)))
        return PENDING

    first = ask()
    if first is not PENDING:
        got(first)
    return PENDING
