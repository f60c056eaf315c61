"""RESP for the client side: request parsing (bounded) and reply encoding.

Parsing: ``RequestParser.feed(data)`` returns the complete commands in ``data``
(each a list of bytes) and, if the stream turned bad, the protocol error text to
send before closing. Multibulk requests are parsed by hiredis (C, about 8x
faster than a Python loop on pipelined ADDJOB); inline requests (``PING\\r\\n``
typed in telnet) are split here, as Redis does.

hiredis enforces no size limits: a client announcing ``$999999999999`` would make
it buffer forever. So when a read ends in the middle of a command, a small
Python walker follows that one pending command's headers (``*N``, ``$L``) and
skips its payload, checking ``proto_max_bulk_len``, ``proto_max_multibulk_len``
and ``client_query_buffer_bytes_max`` as the bytes arrive. The walker needs to
know where the pending command starts; hiredis accepts only canonical numbers
(no leading zeros or signs, checked), so the bytes used by each complete command
follow from its arguments (``_canonical_len``).

Encoding: ``encode(value, resp3)`` turns the values of ``workers/replies.py``
into bytes. RESP3 changes only nulls (``_``) and maps (``%``), so Disque's flat
array replies keep their RESP2 shape on RESP3 connections.
"""

from __future__ import annotations

from typing import Any

import hiredis

from workers.replies import NULL_ARRAY, Error, Status

# Redis' PROTO_INLINE_MAX_SIZE: an inline line or a header line with no newline
# after this many bytes is garbage, not a slow client.
inline_line_bytes_max = 64 * 1024


class ProtocolError(Exception):
    """The client broke RESP; the text is Redis' (``Protocol error: ...``)."""


_HIREDIS_TEXTS = (
    ("multi-bulk", "Protocol error: invalid multibulk length"),
    ("bulk", "Protocol error: invalid bulk length"),
)


def _redis_text(hiredis_msg: str) -> str:
    low = hiredis_msg.lower()
    for key, text in _HIREDIS_TEXTS:
        if key in low:
            return text
    if "reply type byte" in low:  # e.g. `Protocol error, got ":" as reply type byte`
        quoted = hiredis_msg.split('"')
        got = quoted[1] if len(quoted) > 2 else "?"
        return f"Protocol error: expected '$', got '{got}'"
    return "Protocol error: " + hiredis_msg


def _canonical_len(cmd: Any) -> int:
    """Bytes of ``cmd`` on the wire; exact because hiredis rejects non-canonical numbers."""
    if cmd is None:
        return 5  # *-1\r\n
    total = 3 + len(str(len(cmd)))
    for arg in cmd:
        n = len(arg)
        total += n + 5 + len(str(n))
    return total


class _Walker:
    """Follows one incomplete multibulk command to check its bounds early."""

    __slots__ = ("line", "args_left", "skip", "total", "bulk_max", "args_max", "total_max")

    def __init__(self, bulk_max: int, args_max: int, total_max: int) -> None:
        self.line = b""
        self.args_left = -1  # -1: the *N header is not read yet
        self.skip = 0
        self.total = 0
        self.bulk_max = bulk_max
        self.args_max = args_max
        self.total_max = total_max

    def feed(self, data: bytes, pos: int) -> int:
        """Index in ``data`` just past the command's end, or -1 if it goes on."""
        self.total += len(data) - pos
        if self.total > self.total_max:
            raise ProtocolError("Protocol error: client query buffer over its limit")
        n = len(data)
        while True:
            if self.skip:
                take = min(self.skip, n - pos)
                self.skip -= take
                pos += take
                if self.skip:
                    return -1
                if self.args_left == 0:
                    return pos
            nl = data.find(b"\n", pos)
            if nl < 0:
                self.line += data[pos:]
                if len(self.line) > inline_line_bytes_max:
                    raise ProtocolError("Protocol error: too big count string")
                return -1
            line = self.line + data[pos : nl + 1]
            self.line = b""
            pos = nl + 1
            if self._header(line):
                return pos

    def _header(self, line: bytes) -> bool:
        """Apply one header line; True when the command ends with it."""
        number = line[1:].rstrip(b"\r\n")
        if self.args_left < 0:
            count = _int_or(number, -2)
            if count > self.args_max or count < -1:
                raise ProtocolError("Protocol error: invalid multibulk length")
            self.args_left = max(count, 0)
            return self.args_left == 0
        if line[:1] != b"$":
            raise ProtocolError(f"Protocol error: expected '$', got '{line[:1].decode('latin-1')}'")
        size = _int_or(number, -1)
        if size < 0 or size > self.bulk_max:
            raise ProtocolError("Protocol error: invalid bulk length")
        self.skip = size + 2
        self.args_left -= 1
        return False


def _int_or(raw: bytes, default: int) -> int:
    try:
        return int(raw)
    except ValueError:
        return default


class RequestParser:
    """Incremental, bounded parser of client requests (multibulk and inline)."""

    __slots__ = ("_reader", "_walker", "_inline", "bulk_max", "args_max", "buffer_max")

    def __init__(self, bulk_max: int, args_max: int, buffer_max: int) -> None:
        self._reader = hiredis.Reader()
        self._walker: _Walker | None = None
        self._inline = b""  # partial inline line
        self.bulk_max = bulk_max
        self.args_max = args_max
        self.buffer_max = buffer_max

    def buffered(self) -> bool:
        """True when part of a command is buffered (nothing may move the socket then)."""
        return bool(self._inline) or self._reader.has_data()

    def feed(self, data: bytes) -> tuple[list[list[bytes]], str | None]:
        cmds: list[list[bytes]] = []
        try:
            self._feed(data, cmds)
        except ProtocolError as exc:
            return cmds, str(exc)
        return cmds, None

    def _feed(self, data: bytes, cmds: list[list[bytes]]) -> None:
        while data:
            at_boundary = self._walker is None and not self._reader.has_data()
            if at_boundary and (self._inline or data[0] != 42):  # 42 = '*'
                data = self._feed_inline(data, cmds)
            else:
                data = self._feed_multibulk(data, cmds)

    def _feed_multibulk(self, data: bytes, cmds: list[list[bytes]]) -> bytes:
        """Parse with hiredis; return the bytes left for the inline parser, if any."""
        end = 0
        if self._walker is not None:
            end = self._walker.feed(data, 0)
            if end >= 0:
                self._walker = None
        reader = self._reader
        reader.feed(data)
        items: list[Any] = []  # every request hiredis returned, to locate a pending one
        try:
            while True:
                cmd = reader.gets()
                if cmd is False:
                    break
                items.append(cmd)
                if cmd:  # `*0` and `*-1` are ignored, as in Redis
                    _check_args(cmd)
                    cmds.append(cmd)
        except hiredis.ProtocolError as exc:
            return self._after_error(data, items, end, str(exc))
        if self._walker is None and reader.has_data():
            self._start_walker(data, items, end)
        return b""

    def _after_error(self, data: bytes, items: list[Any], end: int, msg: str) -> bytes:
        """hiredis met a byte that starts no RESP value: an inline command after
        multibulk ones in the same read (Redis takes it), or garbage."""
        if end >= 0 and "reply type byte" in msg:
            start = end + sum(_canonical_len(c) for c in items[1 if end else 0 :])
            if start < len(data) and data[start] != 42:
                self._reader = hiredis.Reader()
                self._walker = None
                return data[start:]
        raise ProtocolError(_redis_text(msg))

    def _start_walker(self, data: bytes, items: list[Any], end: int) -> None:
        start = end
        for cmd in items[1 if end else 0 :]:
            start += _canonical_len(cmd)
        if start >= len(data):
            return
        walker = _Walker(self.bulk_max, self.args_max, self.buffer_max)
        if walker.feed(data, start) < 0:
            self._walker = walker

    def _feed_inline(self, data: bytes, cmds: list[list[bytes]]) -> bytes:
        """Consume inline lines; return what follows them (a multibulk request)."""
        buf = self._inline + data
        pos = 0
        self._inline = b""
        while pos < len(buf) and buf[pos] != 42:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                if len(buf) - pos > inline_line_bytes_max:
                    raise ProtocolError("Protocol error: too big inline request")
                self._inline = buf[pos:]
                return b""
            args = split_inline(buf[pos:nl].rstrip(b"\r"))
            if len(args) > self.args_max:
                raise ProtocolError("Protocol error: invalid multibulk length")
            if args:
                cmds.append(args)
            pos = nl + 1
        return buf[pos:]


def _check_args(cmd: Any) -> None:
    if type(cmd) is not list:  # `+x`, `:1`, `$3` at top level after a multibulk
        raise ProtocolError("Protocol error: expected '*', got a RESP reply value")
    for arg in cmd:
        if type(arg) is not bytes:
            got = ":" if isinstance(arg, int) else "*" if isinstance(arg, list) else "?"
            raise ProtocolError(f"Protocol error: expected '$', got '{got}'")


def split_inline(line: bytes) -> list[bytes]:
    """Split an inline request like Redis' sdssplitargs (quotes, escapes)."""
    if b'"' not in line and b"'" not in line:
        return line.split()
    args: list[bytes] = []
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i] in b" \t":
            i += 1
        if i >= n:
            break
        cur = bytearray()
        while i < n and line[i] not in b" \t":
            ch = line[i]
            if ch in b"\"'":
                i = _quoted(line, i, cur)
            else:
                cur.append(ch)
                i += 1
        args.append(bytes(cur))
    return args


_ESCAPES = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("b"): 8, ord("a"): 7}


def _quoted(line: bytes, i: int, cur: bytearray) -> int:
    quote = line[i]
    i += 1
    while i < len(line):
        ch = line[i]
        if ch == quote:
            if i + 1 < len(line) and line[i + 1] not in b" \t":
                break  # closing quote must be followed by a space (Redis)
            return i + 1
        if ch == 92 and quote == 34 and i + 1 < len(line):  # backslash in "..."
            i += 1
            cur.append(_ESCAPES.get(line[i], line[i]))
        else:
            cur.append(ch)
        i += 1
    raise ProtocolError("Protocol error: unbalanced quotes in request")


# ----- encoding -------------------------------------------------------------

CRLF = b"\r\n"
NULL_BULK2 = b"$-1\r\n"
NULL_ARRAY2 = b"*-1\r\n"
NULL3 = b"_\r\n"
OK_REPLY = b"+OK\r\n"
PONG_REPLY = b"+PONG\r\n"


def encode(value: Any, resp3: bool = False) -> bytes:
    t = type(value)
    if t is Status:
        return b"+" + value.encode() + CRLF
    if t is int:
        return b":%d\r\n" % value
    if t is bytes:
        return b"$%d\r\n%s\r\n" % (len(value), value)
    if t is Error:
        return b"-" + value.encode() + CRLF
    out: list[bytes] = []
    _encode_into(value, out, resp3)
    return b"".join(out)


def _encode_into(value: Any, out: list[bytes], resp3: bool) -> None:
    t = type(value)
    if t is bytes:
        out.append(b"$%d\r\n%s\r\n" % (len(value), value))
    elif t is int:
        out.append(b":%d\r\n" % value)
    elif t is list or t is tuple:
        out.append(b"*%d\r\n" % len(value))
        for item in value:
            _encode_into(item, out, resp3)
    elif t is Status:
        out.append(b"+" + value.encode() + CRLF)
    elif t is Error:
        out.append(b"-" + value.encode() + CRLF)
    elif t is str:
        raw = value.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    elif value is None:
        out.append(NULL3 if resp3 else NULL_BULK2)
    elif value is NULL_ARRAY:
        out.append(NULL3 if resp3 else NULL_ARRAY2)
    elif t is dict:
        _encode_map(value, out, resp3)
    elif t is bool:
        out.append(b":1\r\n" if value else b":0\r\n")
    else:
        raise TypeError(f"cannot encode {t.__name__} as RESP")


def _encode_map(value: dict[Any, Any], out: list[bytes], resp3: bool) -> None:
    # RESP2 has no map: Redis sends the same pairs as a flat array.
    out.append((b"%%%d\r\n" if resp3 else b"*%d\r\n") % (len(value) if resp3 else 2 * len(value)))
    for key, item in value.items():
        _encode_into(key, out, resp3)
        _encode_into(item, out, resp3)
