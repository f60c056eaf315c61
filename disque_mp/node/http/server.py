"""A small HTTP/1.1 server on the worker's own event loop.

Every worker binds ``http-port`` with SO_REUSEPORT, as it binds the client
port: the kernel spreads HTTP connections too, and the worker that holds one
answers it by gathering from every worker. No framework: the node serves a
handful of routes (``api.py``), and an asyncio Protocol with bounded parsing is
less code than adapting one, with nothing new to install.

Requests are read up to ``http-request-bytes-max`` (line, headers and body);
keep-alive and pipelined requests are answered in order, one at a time. With
``requirepass`` set, every path wants HTTP basic auth with that password (any
user name), checked on the request head: a request without it is answered 401
and closed before its body is read. The ``Host`` header must name a bound
address, ``localhost`` or a name of ``http-allowed-hosts`` (a DNS-rebinding page
names its own domain), and at most ``http-connections-max`` connections are open
on the node. An ``ssl.SSLContext`` makes it HTTPS.

A connection counts as unauthenticated until a request head of it passes those
checks: at most ``http-unauth-connections-max`` of them (per node) are open, a
new one closes the oldest idle one past that share, and each is closed after
``http-unauth-idle-ms`` idle, so idle strangers never take the operator's slot.
A wrong password is counted (INFO), logged (at most one line a second) and
answered ``auth-failure-delay-ms`` late, as RESP's AUTH is. Every answer forbids
framing (``X-Frame-Options``, CSP ``frame-ancestors``): no foreign page can put
the dashboard's buttons under a click.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import ipaddress
import logging
import ssl
import time
from typing import TYPE_CHECKING, Any

import orjson

from bus.auth import STATS as auth_stats
from disque_mp.node.authgate import auth_gate
from disque_mp.node.listen import listen_sockets
from disque_mp.node.tls import https_context

if TYPE_CHECKING:
    from disque_mp.node.view import NodeView

log = logging.getLogger("disque_mp.node.http")

header_count_max = 100  # headers in one request; a real browser sends about 20
keepalive_idle_s = 60.0  # an idle keep-alive connection is closed after this
linger_s = 2.0  # after an error answer, input is drained this long before closing
auth_log_interval_s = 1.0  # wrong HTTP passwords: at most one log line this often
# on every answer: no page of another origin may frame ours (clickjacking)
FRAME_HEADERS = "X-Frame-Options: DENY\r\nContent-Security-Policy: frame-ancestors 'none'"
REASONS = {200: "OK", 204: "No Content", 400: "Bad Request", 401: "Unauthorized",
           404: "Not Found", 405: "Method Not Allowed", 409: "Conflict",
           403: "Forbidden", 411: "Length Required", 413: "Content Too Large",
           500: "Internal Server Error",
           415: "Unsupported Media Type", 501: "Not Implemented", 503: "Service Unavailable"}


class Request:
    __slots__ = ("method", "target", "path", "query", "headers", "body")

    def __init__(self, method: str, target: str, headers: dict[str, str], body: bytes) -> None:
        self.method = method
        self.target = target
        path, _, query = target.partition("?")
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body


class Response:
    __slots__ = ("status", "body", "content_type", "headers")

    def __init__(self, status: int, body: bytes, content_type: str = "application/json",
                 headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers or {}

    def encode(self, keep_alive: bool, head_only: bool = False) -> bytes:
        lines = [f"HTTP/1.1 {self.status} {REASONS.get(self.status, 'Unknown')}",
                 f"Content-Type: {self.content_type}", f"Content-Length: {len(self.body)}",
                 "Cache-Control: no-store", "X-Content-Type-Options: nosniff", FRAME_HEADERS,
                 "Connection: " + ("keep-alive" if keep_alive else "close")]
        lines += [f"{k}: {v}" for k, v in self.headers.items()]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head if head_only else head + self.body


def error(status: int, text: str, headers: dict[str, str] | None = None) -> Response:
    """A JSON error answer: ``{"error": text, "status": status}``."""
    return Response(status, orjson.dumps({"error": text, "status": status}), headers=headers)


class BadRequest(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


def parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """Request line and headers (names lowercased); raises BadRequest."""
    lines = head.decode("latin-1").split("\r\n")  # latin-1: any byte is a character
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
        raise BadRequest(400, "bad request line")
    if len(lines) - 1 > header_count_max:
        raise BadRequest(400, "too many headers")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(400, "bad header line")
        name = name.lower()
        if name in _SINGLE_HEADERS and name in headers:  # request smuggling's tool
            raise BadRequest(400, f"more than one {name} header")
        headers[name] = value.strip()
    return parts[0], parts[1], headers


_SINGLE_HEADERS = frozenset(("content-length", "host", "authorization", "transfer-encoding"))
_WILDCARDS = frozenset(("0.0.0.0", "::", "*", ""))


def content_length(headers: dict[str, str]) -> int:
    text = headers.get("content-length", "0")
    if not (text.isascii() and text.isdigit()) or len(text) > 18:  # "\xb2".isdigit() holds
        raise BadRequest(400, "bad Content-Length")
    return int(text)


def host_allowed(host: str, cfg: Any) -> bool:
    """The Host header names this node: an address it is bound to (any address when
    bound to a wildcard), ``localhost``, or a name of ``http-allowed-hosts``."""
    host = host.strip().lower()
    if host.startswith("["):
        name = host[1:host.find("]")] if "]" in host else ""
    else:
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit():
            name = host
    if not name:
        return False
    if name == "localhost" or name in str(cfg.http_allowed_hosts).lower().split():
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False  # a domain name we were not told about: a rebinding page's
    binds = str(cfg.http_bind).split() or ["0.0.0.0"]
    return any(b in _WILDCARDS for b in binds) or name in binds


def authorized(header: str, password: str) -> bool:
    """HTTP basic auth against ``requirepass`` (any user name), in constant time."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return False
    _, sep, given = decoded.partition(":")
    return bool(sep) and hmac.compare_digest(given.encode(), password.encode())


class HttpConn(asyncio.Protocol):
    """One HTTP connection: requests parsed from ``buf`` and answered in order."""

    open_count = 0  # this worker's open HTTP connections (http-connections-max)
    # this worker's connections not yet authenticated, oldest first (a dict keeps order)
    unauthed: dict[HttpConn, None] = {}

    def __init__(self, w: NodeView, handle: Any) -> None:
        self.w = w
        self.handle = handle  # async (NodeView, Request) -> Response
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.busy = False
        self.closing = False
        self.idle: asyncio.TimerHandle | None = None
        self.counted = False
        self.authed = False
        self.turn = False  # a turn of the wrong-password gate was given (authgate.py)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._arm_idle()
        cfg = self.w.cfg
        # a share of the node's bound per worker, as maxclients
        if HttpConn.open_count * max(1, cfg.workers) >= cfg.http_connections_max:
            self._fail(503, "too many HTTP connections (http-connections-max)")
            return
        HttpConn.open_count += 1
        self.counted = True
        self._admit_unauthed()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.counted:
            HttpConn.open_count -= 1
            self.counted = False
        HttpConn.unauthed.pop(self, None)
        if self.idle is not None:
            self.idle.cancel()

    def _arm_idle(self) -> None:
        if self.idle is not None:
            self.idle.cancel()
        idle_s = keepalive_idle_s if self.authed else self.w.cfg.http_unauth_idle_ms / 1000
        self.idle = self.w.loop.call_later(idle_s, self._close)

    def _admit_unauthed(self) -> None:
        """Count this new connection in the unauthenticated share; past the share (per
        worker, as maxclients), close the oldest unauthenticated one: a stranger's idle
        connections give way, an operator's request (sent at once) is read before its
        turn comes."""
        cfg = self.w.cfg
        share = max(1, cfg.http_unauth_connections_max // max(1, cfg.workers))
        queue = HttpConn.unauthed
        queue[self] = None
        if len(queue) <= share:
            return
        oldest = next(iter(queue))  # never self: the share is at least 1
        queue.pop(oldest)
        oldest._close()  # also one lingering after a 401: strangers share one budget

    def _authenticated(self) -> None:
        if not self.authed:
            self.authed = True
            HttpConn.unauthed.pop(self, None)

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.buf += data
        if len(self.buf) > self.w.cfg.http_request_bytes_max:
            if self.busy:  # pipelined requests pile up behind a slow one: stop reading
                if self.transport is not None:
                    self.transport.pause_reading()
                return
            self._fail(413, "request too large (http-request-bytes-max)")
            return
        self._next()

    def _next(self) -> None:
        if self.busy or self.closing or self.transport is None:
            return
        if not self.authed and self.buf and self._wait_turn():
            return
        end = self.buf.find(b"\r\n\r\n")
        limit = self.w.cfg.http_request_bytes_max
        if end < 0:
            if len(self.buf) > limit:
                self._fail(413, "request too large (http-request-bytes-max)")
            return
        headers: dict[str, str] = {}
        try:
            method, target, headers = parse_head(bytes(self.buf[:end]))
            self._check_head(headers)
            if "transfer-encoding" in headers:
                raise BadRequest(501, "chunked request bodies are not supported")
            length = content_length(headers)
            if end + 4 + length > limit:
                raise BadRequest(413, "request too large (http-request-bytes-max)")
        except BadRequest as e:
            if e.status == 401 and "authorization" in headers:
                self._wrong_password()
                return
            self._fail(e.status, str(e), _CHALLENGE if e.status == 401 else None)
            return
        self._authenticated()
        if len(self.buf) < end + 4 + length:
            return  # the body is still coming
        body = bytes(self.buf[end + 4:end + 4 + length])
        del self.buf[:end + 4 + length]
        req = Request(method, target, headers, body)
        keep = headers.get("connection", "").lower() != "close"
        self.busy = True
        self._arm_idle()
        self.w.loop.create_task(self._serve(req, keep))

    async def _serve(self, req: Request, keep: bool) -> None:
        try:
            resp = await self._answer(req)
        except Exception:  # a bug: answer it, keep the node and the connection
            log.exception("HTTP %s %s failed", req.method, req.path)
            resp = error(500, "internal error, see the server log")
        self.busy = False
        if self.transport is None:
            return
        self.transport.write(resp.encode(keep, head_only=req.method == "HEAD"))
        if not keep:
            self.closing = True
            self.transport.close()
            return
        self.transport.resume_reading()
        self._next()

    def _check_head(self, headers: dict[str, str]) -> None:
        """Host and credentials, on the head: no body is read for a request refused."""
        cfg = self.w.cfg
        host = headers.get("host")  # browsers always send one; curl -0 and scripts may not
        if host is not None and not host_allowed(host, cfg):
            raise BadRequest(403, "Host not served here (http-allowed-hosts)")
        password = cfg.requirepass
        if password and not authorized(headers.get("authorization", ""), password):
            raise BadRequest(401, "authentication required")

    async def _answer(self, req: Request) -> Response:
        password = self.w.cfg.requirepass  # CONFIG SET between head and answer
        if password and not authorized(req.headers.get("authorization", ""), password):
            return error(401, "authentication required", _CHALLENGE)
        resp: Response = await self.handle(self.w, req)
        return resp

    def _fail(self, status: int, text: str, headers: dict[str, str] | None = None) -> None:
        """Answer a request we will not serve, then close. The rest of what the client
        sends is read and dropped for up to ``linger_s``: closing a socket with unread
        input sends a reset, which can destroy the answer before the client reads it."""
        self.closing = True
        transport = self.transport
        if transport is None:
            return
        transport.write(error(status, text, headers).encode(False))
        if transport.can_write_eof():
            transport.write_eof()
            if self.idle is not None:
                self.idle.cancel()
            self.idle = self.w.loop.call_later(linger_s, self._close)
        else:
            transport.close()

    def _wait_turn(self) -> bool:
        """While wrong passwords are being tried on this worker (RESP's or ours: one
        budget, authgate.py), an unauthenticated request waits its turn: True when it
        must (``_next`` runs again then)."""
        cfg = self.w.cfg
        if self.turn or not cfg.requirepass or not auth_gate.ahead():
            self.turn = False
            return False
        self.turn = True
        self.busy = True
        if self.transport is not None:
            self.transport.pause_reading()
        self.w.loop.call_at(auth_gate.turn(cfg), self._turn_come)
        return True

    def _turn_come(self) -> None:
        self.busy = False
        if self.transport is not None and not self.closing:
            self.transport.resume_reading()
            self._next()

    def _wrong_password(self) -> None:
        """A wrong password: counted (INFO's auth failures), logged at most once a second,
        answered 401 at the later of ``auth-failure-delay-ms`` and the node-wide gate's
        turn (authgate.py; the connection then closes)."""
        auth_stats["client_auth_failures"] += 1
        _log_wrong_password(self.transport)
        self.closing = True
        if self.transport is not None:
            self.transport.pause_reading()
        if self.idle is not None:
            self.idle.cancel()
        self.idle = self.w.loop.call_at(auth_gate.failed(self.w.cfg),
                                        self._answer_wrong_password)

    def _answer_wrong_password(self) -> None:
        self.closing = False  # _fail sets it again and lingers
        if self.transport is not None:
            self.transport.resume_reading()
        self._fail(401, "authentication required", _CHALLENGE)

    def eof_received(self) -> bool:
        return False  # the client is done sending: close


_auth_log = {"next_s": 0.0, "quiet": 0}  # this worker's rate limit of the lines below


def _log_wrong_password(transport: asyncio.Transport | None) -> None:
    now = time.monotonic()
    if now < _auth_log["next_s"]:
        _auth_log["quiet"] += 1
        return
    peer = transport.get_extra_info("peername") if transport is not None else None
    log.warning("HTTP: wrong password from %s (%d more not logged since the last line)",
                peer[0] if peer else "?", _auth_log["quiet"])
    _auth_log["next_s"] = now + auth_log_interval_s
    _auth_log["quiet"] = 0


_CHALLENGE = {"WWW-Authenticate": 'Basic realm="disque-mp", charset="UTF-8"'}


def ssl_context(cfg: Any) -> ssl.SSLContext | None:
    """HTTPS when the node has a TLS certificate configured (``tls-cert-file`` and
    ``tls-key-file``, the directives of the RESP port's TLS); plain HTTP otherwise."""
    return https_context(cfg)


async def start(w: NodeView, handle: Any,
                ctx: ssl.SSLContext | None = None) -> list[asyncio.AbstractServer]:
    """Listen on ``http-bind``:``http-port`` (nothing when the port is 0); every request
    goes to ``handle(w, request)`` (``api.handle``)."""
    if not w.cfg.http_port:
        return []
    if ctx is None:
        ctx = ssl_context(w.cfg)
    servers: list[asyncio.AbstractServer] = []
    for sock in listen_sockets(w.cfg.http_bind, w.cfg.http_port, w.cfg.tcp_backlog):
        servers.append(await w.loop.create_server(lambda: HttpConn(w, handle), sock=sock, ssl=ctx))
    return servers
