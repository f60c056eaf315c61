"""Every fixed error reply of the node side, in one place: the front end's, the
commands', the HTTP API's use of them. The texts are the reference's (Disque, or
Redis where Disque takes the command from it) wherever it has one; an extension's
own texts say what was wrong and what is allowed.

The shard's replies (``workers/replies.py``: syntax, bad ID, no job, ...) are named
here too, so the node side imports its error texts from this module alone; the
shard's option bounds (``workers/shard.py``) stay with the rules they check.
"""

from __future__ import annotations

from workers.replies import (
    ERR_BADID,
    ERR_LEAVING,
    ERR_NOJOB,
    ERR_NOREPL,
    ERR_OOM,
    ERR_PAUSED,
    ERR_SYNTAX,
    Error,
    err_arity,
    err_unknown,
)

__all__ = [
    "ERR_AUTH_NOT_SET", "ERR_BADID", "ERR_CLIENT", "ERR_CLUSTER", "ERR_CONFIG", "ERR_COUNT",
    "ERR_CURSOR", "ERR_DEBUG", "ERR_DELAY", "ERR_HELLO_NOAUTH", "ERR_INTERNAL",
    "ERR_INVALID_PASSWORD", "ERR_LEAVING", "ERR_MAXLEN", "ERR_NAME", "ERR_NOAUTH",
    "ERR_NOJOB", "ERR_NOPROTO", "ERR_NOREPL", "ERR_NOT_INT", "ERR_NO_SHUTDOWN",
    "ERR_NO_SUCH_CLIENT", "ERR_OOM", "ERR_PAUSED", "ERR_PING_ARITY", "ERR_PROTO_NOT_INT",
    "ERR_REPLICATE", "ERR_RETRY", "ERR_SECRET_OFF", "ERR_SLOWLOG", "ERR_STATE", "ERR_SYNTAX",
    "ERR_TIMEOUT_NEGATIVE", "ERR_TIMEOUT_NOT_INT", "ERR_TTL", "ERR_WRONGPASS",
    "err_arity", "err_unknown",
]

# ---------------------------------------------------------------- the front end
ERR_NOAUTH = Error("NOAUTH Authentication required.")
ERR_INTERNAL = Error("ERR internal error, see the server log")  # a bug, logged; the node serves on

# ---------------------------------------------------------------- connection commands
ERR_PING_ARITY = Error("ERR wrong number of arguments for 'ping' command")
ERR_WRONGPASS = Error("WRONGPASS invalid username-password pair or user is disabled.")
ERR_AUTH_NOT_SET = Error("ERR Client sent AUTH, but no password is set")
ERR_INVALID_PASSWORD = Error("ERR invalid password")
ERR_NOPROTO = Error("NOPROTO unsupported protocol version")
ERR_PROTO_NOT_INT = Error("ERR Protocol version is not an integer or out of range")
ERR_HELLO_NOAUTH = Error(
    "NOAUTH HELLO must be called with the client already authenticated, otherwise the "
    "HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and "
    "select the RESP protocol version at the same time")
ERR_CLIENT = Error("ERR Syntax error, try CLIENT (LIST | KILL ip:port | GETNAME | SETNAME connection-name)")
ERR_NAME = Error("ERR Client names cannot contain spaces, newlines or special characters.")
ERR_NO_SUCH_CLIENT = Error("ERR No such client")

# ---------------------------------------------------------------- server commands
ERR_CONFIG = Error("ERR CONFIG subcommand must be one of GET, SET, RESETSTAT, REWRITE")
ERR_SECRET_OFF = Error(
    "ERR cluster-secret-file: the cluster bus authenticates with this secret; it cannot be "
    "turned off at runtime (remove it from the config file and restart every node)")
ERR_DEBUG = Error("ERR Syntax error, try DEBUG [flushall|sleep <seconds>]")
ERR_SLOWLOG = Error("ERR Unknown SLOWLOG subcommand or wrong # of args. Try GET, RESET, LEN.")
ERR_NO_SHUTDOWN = Error("ERR No shutdown in progress.")
ERR_CLUSTER = Error("ERR Wrong CLUSTER subcommand or number of arguments")

# ---------------------------------------------------------------- job commands' options
ERR_TIMEOUT_NOT_INT = Error("ERR timeout is not an integer or out of range")
ERR_TIMEOUT_NEGATIVE = Error("ERR timeout is negative")
ERR_NOT_INT = Error("ERR value is not an integer or out of range")
ERR_REPLICATE = Error("ERR REPLICATE must be between 1 and 65535")
ERR_TTL = Error("ERR TTL must be a number > 0")
ERR_RETRY = Error("ERR RETRY time must be a non negative number")
ERR_DELAY = Error("ERR Delay time must be a non negative number")
ERR_MAXLEN = Error("ERR MAXLEN must be a positive number")
ERR_COUNT = Error("ERR COUNT must be a number greater than zero")
ERR_STATE = Error("ERR Invalid job state name")
ERR_CURSOR = Error("ERR invalid cursor")
