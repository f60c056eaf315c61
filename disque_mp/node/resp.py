"""RESP for the client side: request parsing (bounded) and reply encoding.

Parsing: ``RequestParser.feed(data)`` returns the complete commands in ``data``
(each a list of bytes) and, if the stream turned bad, the protocol error text to
send before closing. Multibulk and inline requests (``PING\\r\\n`` typed in
telnet) are both accepted at every command boundary, as Redis does.

hiredis parses a read that holds only whole multibulk commands (about 0.3 us
per pipelined ADDJOB against 2 us in Python). It cannot be trusted with the
rest: it consumes a multibulk header and each finished element into hidden
state, so a caller cannot tell where a pending command starts nor check its
declared sizes; a client announcing ``*1000000000`` or ``$999999999999`` would
make it buffer without bound. Such reads go to the Python parser, where every
header is checked as soon as its line is complete (``proto_max_multibulk_len``,
``proto_max_bulk_len``), a pending command never grows past
``client_query_buffer_bytes_max``, and a large bulk that arrives in pieces is
collected in a list and joined once (no quadratic re-copying).

Encoding: ``encode(value, resp3)`` turns the values of ``workers/replies.py``
into bytes. RESP3 changes only nulls (``_``) and maps (``%``), so Disque's flat
array replies keep their RESP2 shape on RESP3 connections.
"""

from __future__ import annotations

from typing import Any, Final

import hiredis

from workers.replies import NULL_ARRAY, Error, Status

# Redis' PROTO_INLINE_MAX_SIZE: an inline line or a header line with no newline
# after this many bytes is garbage, not a slow client.
inline_line_bytes_max = 64 * 1024
# A bulk this large that is still incomplete is collected chunk by chunk.
big_bulk_bytes_min = 64 * 1024


class ProtocolError(Exception):
    """The client broke RESP; the text is Redis' (``Protocol error: ...``)."""


class _SlowPath(Exception):
    """This read needs the exact parser."""


class RequestParser:
    """Incremental, bounded parser of client requests (multibulk and inline).

    A multibulk cut by a read is never parsed twice: its finished arguments are
    kept (``_args``, ``_left`` still to come, ``_held`` bytes they took) and the
    next read resumes at the argument that was cut, so each byte is looked at
    once however many arguments a command declares.

    ``restrict`` lowers the multibulk bounds for a client that has not
    authenticated (Redis' 10 arguments and 16 KB bulks, with its error texts);
    ``feed(data, once=True)`` then returns one command at a time, so an AUTH takes
    effect before the commands behind it are parsed."""

    __slots__ = ("_buf", "_off", "_chunks", "_have", "_need", "_reader", "_args", "_left", "_held",
                 "_pending", "_mb_error", "_bulk_error", "bulk_max", "args_max", "buffer_max",
                 "inline_bulk_max", "inline_args_max", "raw", "ends")

    def __init__(self, bulk_max: int, args_max: int, buffer_max: int) -> None:
        self._buf = b""  # unparsed tail: the start of a pending command or argument
        self._off = 0  # ... from this offset (``once``: one command at a time, no copies)
        self._chunks: list[bytes] = []  # a big pending bulk, joined once complete
        self._have = 0
        self._need = 0
        self._reader = hiredis.Reader()
        self._args: list[bytes] | None = None  # a pending multibulk's finished arguments
        self._left = 0  # ... and how many are still to come
        self._held = 0  # bytes of the pending multibulk already parsed into _args
        self._pending = False  # any of the above: the next read resumes in Python
        self._mb_error = "Protocol error: invalid multibulk length"
        self._bulk_error = "Protocol error: invalid bulk length"
        self.bulk_max = bulk_max
        self.args_max = args_max
        self.buffer_max = buffer_max
        self.inline_bulk_max = bulk_max  # inline lines keep the full bounds (as Redis)
        self.inline_args_max = args_max
        # the last read the fast path parsed whole, and where each of its commands
        # ends (None: the commands came from the exact parser, spans unknown)
        self.raw = b""
        self.ends: list[int] | None = None

    def span(self, i: int) -> bytes:
        """The bytes of command ``i`` of the last ``feed`` as the client sent them
        (canonical RESP: the same bytes ``append_request`` would write), or b"" when
        the exact parser read them."""
        ends = self.ends
        if ends is None or i >= len(ends):
            return b""
        return self.raw[ends[i - 1] if i else 0 : ends[i]]

    def restrict(self, args_max: int, bulk_max: int) -> None:
        """Bounds for a client that has not authenticated yet."""
        self.args_max = min(args_max, self.inline_args_max)
        self.bulk_max = min(bulk_max, self.inline_bulk_max)
        self._mb_error = "Protocol error: unauthenticated multibulk length"
        self._bulk_error = "Protocol error: unauthenticated bulk length"

    def unrestrict(self) -> None:
        self.args_max = self.inline_args_max
        self.bulk_max = self.inline_bulk_max
        self._mb_error = "Protocol error: invalid multibulk length"
        self._bulk_error = "Protocol error: invalid bulk length"

    def hold(self, data: bytes) -> str | None:
        """Keep ``data`` unparsed for a later ``feed`` (a client made to wait, its
        reading paused): None, or the error when the buffer's bound is passed."""
        if self._chunks:
            self._chunks.append(data)
            self._have += len(data)
            size = self._have
        else:
            self._buf = (self._buf[self._off :] if self._off else self._buf) + data
            self._off = 0
            size = len(self._buf)
        self._pending = True
        if self._held + size > self.buffer_max:
            return self._fail("Protocol error: client query buffer over its limit")
        return None

    def buffered(self) -> bool:
        """True when part of a command is buffered (nothing may move the socket then)."""
        return self._pending

    def feed(self, data: bytes, once: bool = False) -> tuple[list[list[bytes]], str | None]:
        """Commands complete in what was fed so far, and the error that ends the stream
        (``once``: at most one command, the rest stays buffered)."""
        if self._pending or once or data[:1] != b"*":
            self.ends = None
            return self._feed_python(data, once)
        # Fast path: a read that holds only whole multibulk commands (the usual
        # case, pipelined or not) is parsed by hiredis. Anything else (a command
        # cut by the read, inline text, a bound exceeded, odd types) is parsed
        # again from the start of this read by the exact Python parser.
        #
        # hiredis does not say where it stopped, so the read is walked along the
        # values it returned, each in its canonical form (``*N``, then ``$L`` + L
        # bytes per argument, every header's type byte and CRLF where it must be):
        # the read held exactly these multibulks when the walk ends at its length.
        # A partial command hiredis keeps to itself, a RESP3 set, push or boolean
        # it took from inline text, a simple string, a nested array or a padded
        # length inside a multibulk: each breaks the walk, and the slow path runs.
        reader = self._reader
        reader.feed(data)
        cmds: list[list[bytes]] = []
        ends: list[int] | None = []
        args_max, bulk_max = self.args_max, self.bulk_max
        at = 0
        try:
            while (cmd := reader.gets()) is not False:
                if type(cmd) is not list:
                    raise _SlowPath
                n = len(cmd)
                if n > args_max:
                    raise _SlowPath
                at = _canonical_header(data, at, 42, n)  # *N
                for arg in cmd:
                    if type(arg) is not bytes:
                        raise _SlowPath
                    size = len(arg)
                    if size > bulk_max:
                        raise _SlowPath
                    at = _canonical_header(data, at, 36, size) + size  # $L, then the bytes
                    if data[at] != 13 or data[at + 1] != 10:
                        raise _SlowPath
                    at += 2
                if n:  # `*0` is ignored, as in Redis
                    cmds.append(cmd)
                    if ends is not None:
                        ends.append(at)
                else:
                    ends = None  # a span would hold the `*0`: forwarded ones re-encode
            if at != len(data):
                raise _SlowPath
        except (hiredis.ProtocolError, TypeError, IndexError, _SlowPath):
            self._reader = hiredis.Reader()
            self.ends = None
            return self._feed_python(data, False)
        self.raw = data
        self.ends = ends
        return cmds, None

    def _feed_python(self, data: bytes, once: bool = False) -> tuple[list[list[bytes]], str | None]:
        cmds: list[list[bytes]] = []
        if self._chunks:
            self._chunks.append(data)
            self._have += len(data)
            if self._have + self._held > self.buffer_max:
                return cmds, self._fail("Protocol error: client query buffer over its limit")
            if self._have < self._need:
                return cmds, None
            data = b"".join(self._chunks)
            self._chunks = []
        elif self._buf:
            if not self._off:
                data = self._buf + data
            elif data:
                data = self._buf[self._off :] + data
            else:
                data = self._buf
        start = self._off if data is self._buf else 0
        try:
            pos = self._parse(data, cmds, once, start)
        except ProtocolError as exc:
            return cmds, self._fail(str(exc))
        left = len(data) - pos
        if self._held + left > self.buffer_max:
            return cmds, self._fail("Protocol error: client query buffer over its limit")
        self._off = 0
        if self._need > left:
            self._chunks = [data[pos:]]
            self._have = left
            self._buf = b""
        elif once and cmds and left:
            # One command of a read that holds many (before AUTH): the rest stays where
            # it is, not copied once per command (a 256 KB read of PINGs would be
            # copied 40,000 times).
            self._buf, self._off = data, pos
        else:
            self._buf = data[pos:] if pos else data
        self._pending = bool(left) or self._args is not None or bool(self._chunks)
        return cmds, None

    def _fail(self, error: str) -> str:
        self._buf = b""
        self._off = 0
        self._chunks = []
        self._args = None
        self._held = 0
        self._pending = False
        return error

    def _parse(self, data: bytes, cmds: list[list[bytes]], once: bool, start: int = 0) -> int:
        """Append complete commands from ``data[start:]``; return where the unparsed
        rest starts (a pending multibulk's finished arguments stay in ``_args``).
        One flat loop with locals only: this is the per-command hot path."""
        pos, n, find, bulk_max, append = start, len(data), data.find, self.bulk_max, cmds.append
        self._need = 0
        # a multibulk cut by the last read: resume it at ``start``
        args, left, held = self._args, self._left, self._held
        while True:
            if args is None:
                if pos >= n:
                    break
                if data[pos] != 42:  # not '*': an inline command
                    nl = self._inline(data, pos, cmds)
                    if nl < 0:
                        break
                    pos = nl
                    if once and cmds:
                        break
                    continue
                nl = find(b"\r\n", pos)
                if nl < 0:
                    if n - pos > inline_line_bytes_max:
                        raise ProtocolError("Protocol error: too big mbulk count string")
                    break
                try:
                    left = int(data[pos + 1 : nl])
                except ValueError:
                    raise ProtocolError("Protocol error: invalid multibulk length") from None
                if left > self.args_max:
                    raise ProtocolError(self._mb_error)
                pos = nl + 2
                args = []
                held = 0
            p = pos
            add = args.append
            while left > 0:
                nl = find(b"\r\n", p)
                if nl < 0 or data[p] != 36:  # no line yet, or not '$'
                    if p < n and data[p] != 36:
                        raise ProtocolError(f"Protocol error: expected '$', got '{chr(data[p])}'")
                    if n - p > inline_line_bytes_max:
                        raise ProtocolError("Protocol error: too big bulk count string")
                    break
                try:
                    size = int(data[p + 1 : nl])
                except ValueError:
                    raise ProtocolError("Protocol error: invalid bulk length") from None
                if not 0 <= size <= bulk_max:
                    raise ProtocolError(self._bulk_error)
                end = nl + 2 + size
                if end + 2 > n:
                    if end + 2 - p >= big_bulk_bytes_min:
                        self._need = end + 2 - p
                    break
                add(data[nl + 2 : end])
                p = end + 2
                left -= 1
            if left > 0:  # cut by the read: keep what is parsed, resume at ``p``
                self._args, self._left, self._held = args, left, held + p - pos
                return p
            if args:  # `*0` and `*-1` are ignored, as in Redis
                append(args)
            args, pos = None, p
            if once and cmds:
                break
        self._args, self._held = None, 0
        return pos
    def _inline(self, data: bytes, pos: int, cmds: list[list[bytes]]) -> int:
        """Parse one inline line; where the next command starts, or -1 (incomplete)."""
        nl = data.find(b"\n", pos)
        if nl < 0:
            if len(data) - pos > inline_line_bytes_max:
                raise ProtocolError("Protocol error: too big inline request")
            return -1
        args = split_inline(data[pos:nl].rstrip(b"\r"))
        if len(args) > self.inline_args_max:
            raise ProtocolError("Protocol error: invalid multibulk length")
        if args:
            # an inline line is at most 64 KB, but proto-max-bulk-len may be set lower
            if max(map(len, args)) > self.inline_bulk_max:
                raise ProtocolError("Protocol error: invalid bulk length")
            cmds.append(args)
        return nl + 1


def _canonical_header(data: bytes, at: int, kind: int, n: int) -> int:
    """Where the value after the header ``<kind>n\r\n`` starting at ``at`` begins,
    if ``data`` has that header there in its canonical form (else _SlowPath;
    IndexError past the end)."""
    end = at + 1 + _digits(n)
    if data[at] != kind or data[end] != 13 or data[end + 1] != 10:  # CRLF after the digits
        raise _SlowPath
    return end + 2


def _digits(n: int) -> int:
    """Decimal digits of a length (>= 0)."""
    if n < 10:
        return 1
    if n < 100:
        return 2
    if n < 1000:
        return 3
    return len(str(n))


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

CRLF: Final = b"\r\n"
NULL_BULK2: Final = b"$-1\r\n"
NULL_ARRAY2: Final = b"*-1\r\n"
NULL3: Final = b"_\r\n"


def append_request(parts: list[bytes], args: list[bytes], raw: bytes = b"") -> None:
    """``args`` as the RESP multibulk a client sends, appended to ``parts`` (the
    router's RAW mesh frames, the HTTP endpoint's commands): ``raw`` where the
    client's own bytes of it are known (``RequestParser.span``), else encoded. The
    headers of small counts and sizes are pre-built (a ``%d`` format costs more than
    the rest of a forwarded ADDJOB's encoding)."""
    if raw:
        parts.append(raw)
        return
    n = len(args)
    parts.append(_MULTI_HEADS[n] if n < multi_head_cache_max else b"*%d\r\n" % n)
    heads = _BULK_HEADS
    for arg in args:
        size = len(arg)
        parts.append(heads[size] if size < bulk_head_cache_max else b"$%d\r\n" % size)
        parts.append(arg)
        parts.append(CRLF)


def encode_request(args: list[bytes]) -> bytes:
    parts: list[bytes] = []
    append_request(parts, args)
    return b"".join(parts)


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


# GETJOB of one job from a queue: the reply starts with the same bytes every time
# (array headers, queue name, ID header), so they are kept per queue name.
job_head_cache_max = 4096  # queue names are unbounded: cleared when full
bulk_head_cache_max: Final = 1024  # `$N\r\n` headers of bodies up to this size, pre-built
_job_heads: dict[bytes, bytes] = {}  # "*1" and an entry's head, per queue
_entry_heads: dict[bytes, bytes] = {}  # an entry's head alone, per queue
_BULK_HEADS: Final = [b"$%d\r\n" % n for n in range(bulk_head_cache_max)]
multi_head_cache_max: Final = 64  # `*N\r\n` of requests of up to this many arguments, pre-built
_MULTI_HEADS: Final = [b"*%d\r\n" % n for n in range(multi_head_cache_max)]


def _queue_head(cache: dict[bytes, bytes], prefix: bytes, queue: bytes) -> bytes:
    """The bytes every job entry of ``queue`` starts with (after ``prefix``), up to its
    ID's length: the same for every job of a queue, kept per queue name."""
    head = cache.get(queue)
    if head is None:
        if len(cache) >= job_head_cache_max:
            cache.clear()
        head = cache[queue] = prefix + b"*3\r\n$%d\r\n%s\r\n$40\r\n" % (len(queue), queue)
    return head


def entry_resp(entry: list[Any]) -> bytes:
    """One job of a GETJOB answer as RESP (the same bytes in RESP2 and RESP3): what an
    owner sends a coordinator, spliced into the client's reply as it is."""
    if len(entry) == 3:
        queue, job_id, body = entry
        if type(job_id) is str and len(job_id) == 40 and type(queue) is bytes and type(body) is bytes:
            head = _queue_head(_entry_heads, b"", queue)
            n = len(body)
            size = _BULK_HEADS[n] if n < bulk_head_cache_max else b"$%d\r\n" % n
            return b"".join((head, job_id.encode(), CRLF, size, body, CRLF))
    return encode(entry)  # WITHCOUNTERS (or an ID of another shape): the generic encoder


def encode_jobs(entries: list[list[Any]]) -> bytes:
    """GETJOB's reply: entries of (queue, ID, body) in one format each, no generic walk."""
    if len(entries) == 1 and len(entries[0]) == 3:
        queue, job_id, body = entries[0]
        if type(job_id) is str and len(job_id) == 40 and type(queue) is bytes and type(body) is bytes:
            head = _queue_head(_job_heads, b"*1\r\n", queue)
            n = len(body)
            size = _BULK_HEADS[n] if n < bulk_head_cache_max else b"$%d\r\n" % n
            return b"".join((head, job_id.encode(), CRLF, size, body, CRLF))
    out = [b"*%d\r\n" % len(entries)]
    add = out.append
    for entry in entries:
        if len(entry) == 3:
            queue, job_id, body = entry
            if type(job_id) is str and type(queue) is bytes and type(body) is bytes:
                add(b"*3\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
                    len(queue), queue, len(job_id), job_id.encode(), len(body), body))
                continue
        _encode_into(entry, out, False)
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
