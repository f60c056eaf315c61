"""The connection commands: PING, TIME, AUTH, HELLO, CLIENT.

Handlers take ``(worker, conn, cmd)`` and return a reply value, or ``PENDING``
after reserving a reply slot (``scatter.gather``: CLIENT LIST and KILL ask every
worker). The worker is seen through ``view.NodeView``, the connection through
``view.Client``.
"""

from __future__ import annotations

import hmac
import time
from typing import TYPE_CHECKING, Any

from bus.auth import STATS as auth_stats
from disque_mp import DISQUE_VERSION
from disque_mp.node.commands import cluster as clustermod
from disque_mp.node.errors import (
    ERR_AUTH_NOT_SET,
    ERR_CLIENT,
    ERR_HELLO_NOAUTH,
    ERR_INVALID_PASSWORD,
    ERR_NAME,
    ERR_NO_SUCH_CLIENT,
    ERR_NOAUTH,
    ERR_NOPROTO,
    ERR_NOT_INT,
    ERR_PING_ARITY,
    ERR_PROTO_NOT_INT,
    ERR_SYNTAX,
    ERR_WRONGPASS,
)
from disque_mp.node.scatter import gather
from workers.replies import OK, Error, Status

if TYPE_CHECKING:
    from disque_mp.node.view import Client, NodeView




def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")



# ------------------------------------------------------------------ connection commands


def cmd_ping(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    if len(cmd) > 2:
        return ERR_PING_ARITY
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
            return ERR_WRONGPASS
        conn.authed = True
        return OK
    if not w.cfg.requirepass:
        return ERR_AUTH_NOT_SET
    if not _password_ok(w, cmd[1]):
        conn.authed = False
        _auth_failed(conn)
        return ERR_INVALID_PASSWORD
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
            return ERR_NOAUTH
        return _tls_ports(w, conn, _disque_hello(w))
    try:
        proto = int(cmd[1])
    except ValueError:
        return ERR_PROTO_NOT_INT
    if proto not in (2, 3):
        return ERR_NOPROTO
    err = _hello_options(w, conn, cmd[2:])
    if err is not None:
        return err
    if not conn.authed:
        return ERR_HELLO_NOAUTH
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
                return ERR_WRONGPASS
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
        return clustermod.hello(w.agent)
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
