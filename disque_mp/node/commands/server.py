"""The server commands: CONFIG, DEBUG, SLOWLOG, BGREWRITEAOF, CLUSTER, SHUTDOWN,
QSCAN and JSCAN; and ``local_op``, this worker's part of every node-wide command.

Handlers take ``(worker, conn, cmd)`` and return a reply value, or ``PENDING``
after reserving a reply slot (``scatter.gather`` for commands that need every
worker). ``local_op`` is what each worker runs for a gathered command; its
result crosses the mesh as a packed value, so it is built from JSON-able parts.

Scan cursors over workers: global = local * workers + index (contracts.md).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bus import mesh as meshmod
from bus.mesh import unpack
from disque_mp.node import config as configmod
from disque_mp.node import slowlog
from disque_mp.node.commands import cluster as clustermod
from disque_mp.node.commands import jobs as cmd_jobs
from disque_mp.node.commands.clients import client_line, kill_clients
from disque_mp.node.commands.jobs import parse_int
from disque_mp.node.errors import (
    ERR_CLUSTER,
    ERR_CONFIG,
    ERR_CURSOR,
    ERR_DEBUG,
    ERR_NO_SHUTDOWN,
    ERR_NOT_INT,
    ERR_SECRET_OFF,
    ERR_SLOWLOG,
    ERR_SYNTAX,
)
from disque_mp.node.http.ops import local_op as http_local_op
from disque_mp.node.log import set_loglevel
from disque_mp.node.resp import encode
from disque_mp.node.scatter import gather, on_every_worker
from workers.replies import OK, PENDING, Error, Status

log = logging.getLogger("disque_mp.node.commands")

if TYPE_CHECKING:
    from disque_mp.node.view import Client, NodeView

# A QSCAN/JSCAN call asks shards again while it found fewer than COUNT items (a
# shard stops after COUNT*10 empty positions), so small node answer in one call
# like the reference; this bounds the work of one call when filters match little.
scan_rounds_max = 16



def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")



def _op_qscan(w: NodeView, arg: Any) -> Any:
    cursor, count, minlen, maxlen, importrate = arg
    nxt, names = w.shard.op_qscan(cursor, count, minlen, maxlen, importrate)
    return [nxt, names]


def _op_jscan(w: NodeView, arg: Any) -> Any:
    cursor, count, queue, states, reply_all = arg
    qname = queue.encode("latin-1") if queue is not None else None
    nxt, items = w.shard.op_jscan(cursor, count, qname, set(states) if states is not None else None,
                                  reply_all, w.now_ms)
    return [nxt, items]


def _op_flushall(w: NodeView, arg: Any) -> Any:
    w.flush_all()  # blocked GETJOBs answered as on timeout, shard, AOF, memory level
    return OK


def _op_resetstat(w: NodeView, arg: Any) -> Any:
    w.reset_stats()
    return OK


def _op_slowlog_reset(w: NodeView, arg: Any) -> Any:
    w.slowlog.reset()
    return OK


def _op_bgrewriteaof(w: NodeView, arg: Any) -> Any:
    if w.aof is None:
        return "ERR Append only file persistence is not available in this build"
    return w.aof.bgrewriteaof()


def _op_rewrite_at_exit(w: NodeView, arg: Any) -> Any:
    w.rewrite_aof_at_exit = True
    return OK


# A node-wide command's part on each worker, by the operation name its scatter
# frame carries (the HTTP endpoint's gathers, ``http.*``, are disque_mp/node/http/ops.py's).
_LOCAL_OPS: dict[str, Callable[[NodeView, Any], Any]] = {
    "info": lambda w, arg: w.local_stats(),
    "qscan": _op_qscan,
    "jscan": _op_jscan,
    "flushall": _op_flushall,
    "config_set": lambda w, arg: _apply_config(w, arg[0], arg[1]),
    "resetstat": _op_resetstat,
    "clients": lambda w, arg: [client_line(w, c) for c in w.conns],
    "client_kill": lambda w, arg: kill_clients(w, list(arg)),
    "slowlog_get": lambda w, arg: w.slowlog.newest(int(arg)),
    "slowlog_len": lambda w, arg: len(w.slowlog.entries),
    "slowlog_reset": _op_slowlog_reset,
    "bgrewriteaof": _op_bgrewriteaof,
    "memory": lambda w, arg: w.memory.exchange(arg) if w.memory is not None else 0,
    "rewrite_at_exit": _op_rewrite_at_exit,
}


def local_op(w: NodeView, op: str, arg: Any) -> Any:
    """This worker's part of a node-wide command."""
    if op.startswith("http."):
        return http_local_op(w, op, arg)
    fn = _LOCAL_OPS.get(op)
    if fn is None:
        return Error(f"ERR unknown node operation '{op}'")
    return fn(w, arg)


def cmd_shutdown(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    opts = {a.lower() for a in cmd[1:]}
    if not opts <= {b"nosave", b"save", b"rewrite-aof", b"now", b"force", b"abort"}:
        return ERR_SYNTAX
    if b"abort" in opts:
        return ERR_NO_SHUTDOWN
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
        if not w.cfg.config_file:
            return _no_config_file()
        try:
            configmod.rewrite(w.cfg)
        except OSError as exc:
            return Error(f"ERR Rewriting config file: {exc.strerror or exc}")
        return OK
    if sub == b"resetstat":
        return gather(w, conn, "resetstat", None, lambda parts: OK)
    return ERR_CONFIG




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
        set_loglevel(w.cfg.loglevel)
    if name in ("getjob-count-max", "qpeek-count-max", "qgroups-count-max", "scan-count-max",
                "queue-name-bytes-max", "waitjob-entries-per-client-max",
                "redrive-count-max", "queue-groups-max", "qlimit-value-max",
                "qlimit-queues-max", "dedup-keep-max"):
        cmd_jobs.apply_limits(w.cfg)
    if name == "dedup-keys-max":
        w.shard.set_dedup_keys_max(int(w.cfg.dedup_keys_max))
    if name in ("result-ttl", "result-bytes-max", "result-store-bytes-max",
                "progress-bytes-max", "dedup-keep-max"):
        w.shard.configure_results(w.cfg)
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




def cmd_slowlog(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    """SLOWLOG GET [count] | LEN | RESET over every worker's log (disque_mp/node/slowlog.py)."""
    sub, n = cmd[1].lower(), len(cmd)
    if sub == b"get" and n in (2, 3):
        count = slowlog.slowlog_get_default
        if n == 3:
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


def _no_config_file() -> Error:
    """CONFIG REWRITE on a node started without a config file: the reference's reply,
    and in the log what to do (a controlled restart needs the file to carry
    aof-enqueue-jobs-once across the restart)."""
    log.warning("CONFIG REWRITE refused: the node was started without a config file, so "
                "there is nowhere to write. Start it with one (disque-mp /path/disque-mp.conf); "
                "for a controlled restart without one, start the next node with "
                "--aof-enqueue-jobs-once yes")
    return Error("ERR The server is running without a config file")


def cmd_bgrewriteaof(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    def finish(parts: list[Any]) -> Any:
        texts = [str(p) for p in parts]
        for t in texts:
            if t.startswith("ERR "):
                return Error(t)
        return Status(texts[0])

    return gather(w, conn, "bgrewriteaof", None, finish)


def cmd_cluster(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    """CLUSTER: handed to the cluster work (``clustermod.cluster``, run on worker 0)."""
    if w.agent is None:
        return _cluster_single(w, cmd)
    slot = conn.defer()
    if cmd[1].lower() != b"reset":
        clustermod.cluster(w.agent, cmd[1:], lambda reply: conn.fill(slot, encode(reply, conn.resp3)))
        return PENDING

    def reset_done(reply: Any) -> None:
        if isinstance(reply, Error):
            conn.fill(slot, encode(reply, conn.resp3))
            return
        # The reference's clusterReset ends with flushServerData: a reset node holds
        # no jobs and no queues (their node lists name nodes it no longer knows).
        on_every_worker(w, "flushall", None, lambda parts: conn.fill(slot, encode(reply, conn.resp3)))

    clustermod.cluster(w.agent, cmd[1:], reset_done)
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
    return ERR_CLUSTER


# ------------------------------------------------------------------ scans


def cmd_qscan(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    spec = cmd_jobs.parse_qscan(cmd[1:])
    if isinstance(spec, Error):
        return spec

    def arg(local: int) -> Any:
        return [local, spec.count, spec.minlen, spec.maxlen, spec.importrate]

    return _scan(w, conn, "qscan", spec, arg)


def cmd_jscan(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
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
        return ERR_CURSOR
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
