"""The command table: one entry per command (name, arity, flags, route).

Arity follows Redis/Disque: positive = exactly that many words (name included),
negative = at least that many. Flags are the reference's (see
the reference server's COMMAND reply). The route says where a command runs:

    queue    arg 1 is a queue name: run on the worker owning its slot
    ids      args 1.. are job IDs: split by owner, run there, merge the replies
    getjob   queues after FROM: the coordinator asks owners left to right
    scatter  node-wide: run on every worker and merge (INFO, QSCAN, JSCAN, ...)
    local    answered by the connection's worker (PING, TIME, HELLO, CLIENT ...)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    arity: int
    flags: tuple[str, ...]
    route: str


_W, _R, _F, _A, _L, _D = "write", "readonly", "fast", "admin", "loading", "denyoom"

TABLE: dict[bytes, Command] = {
    c.name.encode(): c
    for c in (
        Command("addjob", -4, (_W, _D, _F), "queue"),
        Command("getjob", -2, (_W, _F), "getjob"),
        Command("ackjob", -1, (_W, _F), "ids"),
        Command("fastack", -1, (_W, _F), "ids"),
        Command("nack", -1, (_W, _D, _F), "ids"),
        Command("working", 2, (_W, _F), "ids"),
        Command("enqueue", -1, (_W, _D, _F), "ids"),
        Command("dequeue", -1, (_W, _F), "ids"),
        Command("deljob", -1, (_W, _F), "ids"),
        Command("show", 2, (_R, _F), "ids"),
        Command("qlen", 2, (_R, _F), "queue"),
        Command("qpeek", 3, (_R,), "queue"),
        Command("qstat", 2, (_R, _F), "queue"),
        Command("pause", -3, (_R, _F), "queue"),
        Command("qscan", -1, (_R,), "scatter"),
        Command("jscan", -1, (_R,), "scatter"),
        Command("info", -1, (_R, _L), "scatter"),
        Command("debug", -2, (_A,), "scatter"),
        Command("config", -2, (_R, _A), "scatter"),
        Command("cluster", -2, (_R, _A), "scatter"),
        Command("bgrewriteaof", 1, (_R, _A), "scatter"),
        Command("slowlog", -2, (_R,), "scatter"),
        Command("hello", -1, (_R, _F), "local"),
        Command("ping", -1, (_R, _F), "local"),
        Command("time", 1, (_R, _F), "local"),
        Command("command", 0, (_R, _L), "local"),
        Command("client", -2, (_R, _A), "local"),
        Command("auth", 2, (_R, _L, _F), "local"),
        Command("shutdown", -1, (_R, _A, _L), "local"),
    )
}
