"""The command table: one entry per command (name, arity, flags, route, handler,
fast path). Adding a command is one line here and its handler.

Arity follows Redis/Disque: positive = exactly that many words (name included),
negative = at least that many. Flags are the reference's (see
the reference server's COMMAND reply). The route says where a command runs:

    queue    arg 1 is a queue name: run on the worker owning its slot
    ids      args 1.. are job IDs: split by owner, run there, merge the replies
    getjob   queues after FROM: the coordinator asks owners left to right
    scatter  node-wide: run on every worker and merge (INFO, QSCAN, JSCAN, ...)
    local    answered by the connection's worker (PING, TIME, HELLO, CLIENT ...)

The handler's signature follows the route: ``queue`` and ``ids`` handlers run on
the owner's shard, ``handler(shard, args, token, now_ms)`` with the arguments after
the name (``commands/jobs.py``); ``scatter`` and ``local`` handlers run on the
connection's worker, ``handler(worker, conn, cmd)`` (``commands/clients.py``, ``info.py``,
``server.py``; COMMAND is here), and
gather from the other workers themselves; ``getjob`` has none: the router's GETJOB
path runs it (``Router.getjob``). ``fast`` says the worker has a fast path for the command's
common shape (``Router._fast_<name>``, ``router.py``), tried before the general path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from disque_mp.node.commands import clients, info, jobs, schedule, server
from workers.replies import Error, Status

if TYPE_CHECKING:
    from disque_mp.node.view import Client, NodeView
    from workers.shard import Shard


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    arity: int
    flags: tuple[str, ...]
    route: str
    handler: Callable[..., Any] | None = None
    fast: bool = False
    # ``ids`` route: option words that may end the ID list, each with one value
    # (``NACK id ... DELAY s``); the router gives them to every owner's share.
    tail_opts: tuple[bytes, ...] = ()
    # COMMAND lists this arity when set (an extension's option words make the
    # command longer than the reference's, whose COMMAND reply stays as it was)
    listed_arity: int = 0


def cmd_command(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    """COMMAND [COUNT | INFO name ... | DOCS]: this table, as the reference lists it."""
    if len(cmd) == 1:
        return [_command_entry(c.name) for c in TABLE.values()]
    sub = cmd[1].lower()
    if sub == b"count" and len(cmd) == 2:
        return len(TABLE)
    if sub == b"info":
        return [_command_entry(n.decode("utf-8", "surrogateescape").lower())
                if n.lower() in TABLE else None for n in cmd[2:]]
    if sub == b"docs":
        return {} if conn.resp3 else []
    return Error("ERR Unknown subcommand or wrong number of arguments for "
                 f"'{cmd[1].decode('utf-8', 'surrogateescape')}'. Try COMMAND HELP.")


def _command_entry(name: str) -> list[Any]:
    c = TABLE[name.encode()]
    return [name.encode(), c.listed_arity or c.arity, [Status(f) for f in c.flags], 0, 0, 0]


_W, _R, _F, _A, _L, _D = "write", "readonly", "fast", "admin", "loading", "denyoom"

TABLE: dict[bytes, Command] = {
    c.name.encode(): c
    for c in (
        Command("addjob", -4, (_W, _D, _F), "queue", jobs.cmd_addjob, fast=True),
        Command("getjob", -2, (_W, _F), "getjob", fast=True),
        Command("ackjob", -1, (_W, _F), "ids", jobs.cmd_ackjob, fast=True,
                tail_opts=(b"result",)),
        Command("fastack", -1, (_W, _F), "ids", jobs.cmd_fastack, fast=True),
        Command("nack", -1, (_W, _D, _F), "ids", jobs.cmd_nack, tail_opts=(b"delay",)),
        Command("working", -2, (_W, _F), "ids", jobs.cmd_working, tail_opts=(b"progress",),
                listed_arity=2),
        Command("enqueue", -1, (_W, _D, _F), "ids", jobs.cmd_enqueue),
        Command("dequeue", -1, (_W, _F), "ids", jobs.cmd_dequeue),
        Command("deljob", -1, (_W, _F), "ids", jobs.cmd_deljob),
        Command("show", 2, (_R, _F), "ids", jobs.cmd_show),
        Command("qlen", 2, (_R, _F), "queue", jobs.cmd_qlen),
        Command("qpeek", 3, (_R,), "queue", jobs.cmd_qpeek),
        Command("qstat", 2, (_R, _F), "queue", jobs.cmd_qstat),
        Command("pause", -3, (_R, _F), "queue", jobs.cmd_pause),
        # Extensions (docs/extensions.md): not in the reference.
        Command("waitjob", -2, (_R,), "ids", jobs.cmd_waitjob, tail_opts=(b"timeout",)),
        Command("result", -2, (_R,), "ids", jobs.cmd_result, tail_opts=(b"timeout",)),
        Command("globalqlen", 2, (_R, _F), "queue", jobs.cmd_globalqlen),
        Command("delqueue", -2, (_W,), "queue", jobs.cmd_delqueue),
        Command("deadletter", -2, (_W, _F), "ids", jobs.cmd_deadletter,
                tail_opts=(b"reason",)),
        Command("redrive", -2, (_W,), "queue", jobs.cmd_redrive),
        Command("qgroups", -2, (_R,), "queue", jobs.cmd_qgroups),
        Command("qlimit", -2, (_W, _F), "queue", jobs.cmd_qlimit),
        Command("schedule", -2, (_W, _A), "local", schedule.cmd_schedule),
        Command("qscan", -1, (_R,), "scatter", server.cmd_qscan),
        Command("jscan", -1, (_R,), "scatter", server.cmd_jscan),
        Command("info", -1, (_R, _L), "scatter", info.cmd_info),
        Command("debug", -2, (_A,), "scatter", server.cmd_debug),
        Command("config", -2, (_R, _A), "scatter", server.cmd_config),
        Command("cluster", -2, (_R, _A), "scatter", server.cmd_cluster),
        Command("bgrewriteaof", 1, (_R, _A), "scatter", server.cmd_bgrewriteaof),
        Command("slowlog", -2, (_R,), "scatter", server.cmd_slowlog),
        Command("hello", -1, (_R, _F), "local", clients.cmd_hello),
        Command("ping", -1, (_R, _F), "local", clients.cmd_ping),
        Command("time", 1, (_R, _F), "local", clients.cmd_time),
        Command("command", 0, (_R, _L), "local", cmd_command),
        Command("client", -2, (_R, _A), "local", clients.cmd_client),
        Command("auth", -2, (_R, _L, _F), "local", clients.cmd_auth),
        Command("shutdown", -1, (_R, _A, _L), "local", server.cmd_shutdown),
    )
}


def run_on_shard(shard: Shard, name: bytes, args: list[bytes], token: int, now_ms: int) -> Any:
    """Run a ``queue``- or ``ids``-routed command on the owner's shard (``name``
    lowercase, ``args`` after it): locally, or for another worker that forwarded it."""
    c = TABLE.get(name)
    if c is None or c.route not in ("queue", "ids") or c.handler is None:
        return Error(f"ERR unknown command '{name.decode('latin-1')}'")
    return c.handler(shard, args, token, now_ms)
