"""Reply values a shard (or a command handler) returns; ``disque_mp.node.resp`` encodes them.

Mapping to RESP:
    int            -> ``:n``
    bytes / str    -> bulk string
    Status("x")    -> ``+x``
    Error("ERR x") -> ``-ERR x`` (the text carries its own code word)
    None           -> null bulk ``$-1`` (RESP3: ``_``)
    NULL_ARRAY     -> null array ``*-1`` (RESP3: ``_``)
    list / tuple   -> array of the above, nested
"""

from __future__ import annotations


class Status(str):
    """A RESP simple string (``+OK``)."""

    __slots__ = ()


class Error(str):
    """A RESP error; the text starts with its code word (``ERR``, ``BADID``, ``NOJOB`` ...)."""

    __slots__ = ()


class _NullArray:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NULL_ARRAY"


NULL_ARRAY = _NullArray()

OK = Status("OK")

# Texts the reference server answers with (recorded from the reference Disque 1.0-rc1 server).
ERR_SYNTAX = Error("ERR syntax error")
ERR_BADID = Error("BADID Invalid Job ID format.")
ERR_NOJOB = Error("NOJOB Job not known in the context of this node.")
ERR_PAUSED = Error("PAUSED Queue paused in input, try later")
ERR_NOREPL = Error("NOREPL Not enough reachable nodes for the requested replication level")
ERR_LEAVING = Error("LEAVING This node is leaving the cluster, please connect to a different one")
# Past maxmemory (disque_mp/node/memory.py's level 3): Redis' text, as the command
# table's denyoom flag answers it; the shard gives it to a PAUSE that would create a queue.
ERR_OOM = Error("OOM command not allowed when used memory > 'maxmemory'.")


def err_arity(name: str) -> Error:
    return Error(f"ERR wrong number of arguments for '{name.lower()}' command")


def err_unknown(name: str) -> Error:
    return Error(f"ERR unknown command '{name}'")


class _Pending:
    __slots__ = ()

    def __repr__(self) -> str:
        return "PENDING"


# Returned by an op that will answer later through a ``Wake(token, reply)`` effect
# (blocked GETJOB, ADDJOB waiting for synchronous replication).
PENDING = _Pending()
