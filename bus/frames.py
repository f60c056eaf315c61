"""Frames between processes: the local mesh and the cluster bus use one format.

    frame := header meta bodies
    header := magic "DQ" | version u8 | kind u8 | meta_len u32 | nbodies u16 | body_len u32 * nbodies
    meta   := orjson object (meta_len bytes)
    bodies := raw bytes, one after the other (never base64)

All integers big endian. ``FrameReader.feed()`` then ``next()``: a frame or None
("need more data"); bad magic, version, kind or a length over its bound raises
``FrameError`` and the connection must be dropped.

Compiled with mypyc (disque_mp/compiled.py): every bus and mesh frame passes here.
Bodies are typed ``Any`` on the way in (bytes, or any bytes-like object a caller
joins), as they were before compilation.
"""

from __future__ import annotations

import struct
from typing import Any, Final

import orjson

MAGIC: Final = b"DQ"
VERSION: Final = 1
_HEAD: Final = struct.Struct(">2sBBIH")
_LEN: Final = struct.Struct(">I")
# Compiled, a Final is a C constant; a module attribute or a method looked up per frame
# was a dictionary lookup each (a tenth of the reader's time on a replica).
_HEAD_SIZE: Final = 10
_MAGIC0: Final = 0x44  # "D"
_MAGIC1: Final = 0x51  # "Q"
_pack_head: Final = _HEAD.pack
_pack_len: Final = _LEN.pack
_dumps: Final = orjson.dumps
_loads: Final = orjson.loads
frame_meta_bytes_max: Final = 16 << 20  # metadata is small: IDs, node lists, counters
frame_bodies_max: Final = 65535  # fits the u16 count; YOURJOBS batches stay well below
frame_bytes_max: Final = 1 << 32  # one job body may be up to 4 GB as in Disque
reader_buffer_bytes_max: Final = 1 << 33  # one maximal frame plus a partial next one


class FrameError(Exception):
    """Malformed frame: drop the connection."""


def encode(kind: int, meta: dict[str, Any], bodies: list[Any] | tuple[Any, ...] = ()) -> bytes:
    m = _dumps(meta) if meta else b""  # no metadata: the reader gives {}
    if not bodies:
        return _pack_head(MAGIC, VERSION, kind, len(m), 0) + m
    return encode_raw_meta(kind, m, bodies)


def encode_raw_meta(kind: int, meta: bytes, bodies: list[Any] | tuple[Any, ...]) -> bytes:
    """A frame whose metadata is already encoded (``meta``: an orjson object's bytes)."""
    n = len(bodies)
    if n > frame_bodies_max:
        raise FrameError(f"too many bodies in one frame: {n}")
    parts: list[Any] = [_pack_head(MAGIC, VERSION, kind, len(meta), n)]
    for b in bodies:
        parts.append(_pack_len(len(b)))
    parts.append(meta)
    parts.extend(bodies)
    return b"".join(parts)


def dumps(value: Any) -> bytes:
    return _dumps(value)


class FrameReader:
    """``frame_max`` / ``buffer_max`` default to the global bounds; a cluster bus link
    tightens them until the peer's handshake is done. With ``mac`` set (an object with
    ``size`` and ``check(buf, start, length) -> bool``, see bus/auth.py) every frame is
    followed by a MAC trailer of ``size`` bytes, checked before the frame is parsed.

    The frames are read from the chunk ``feed`` was given, as it came (a read of whole
    frames, the mesh's usual, is neither copied into a buffer nor compacted later); a
    chunk that ends inside a frame keeps the rest of it, and the chunks after it are
    only joined to it once the frame can go on (``_need``), so a big frame arriving in
    many reads is copied once, not once per read."""

    __slots__ = ("_buf", "_pos", "_parts", "_parts_len", "_need", "kinds", "frame_max",
                 "buffer_max", "mac")

    def __init__(self, kinds: frozenset[int] | None = None, frame_max: int = frame_bytes_max,
                 buffer_max: int = reader_buffer_bytes_max) -> None:
        self._buf = b""  # the chunk being read, from ``_pos``
        self._pos = 0
        self._parts: list[bytes] = []  # chunks fed after it, not joined to it yet
        self._parts_len = 0
        self._need = 0  # bytes from ``_pos`` the next frame waits for (``_short``)
        self.kinds = kinds
        self.frame_max = frame_max
        self.buffer_max = buffer_max
        self.mac: Any = None

    def feed(self, data: Any) -> None:
        left = len(self._buf) - self._pos
        if left + self._parts_len + len(data) > self.buffer_max:
            raise FrameError("frame reader buffer over its bound")
        chunk: bytes = data if type(data) is bytes else bytes(data)
        if left == 0 and not self._parts:
            self._buf = chunk
            self._pos = 0
            return
        self._parts.append(chunk)
        self._parts_len += len(chunk)
        if left + self._parts_len >= self._need:
            self._join()

    def _join(self) -> None:
        """The chunks fed since, joined behind what is left of the one being read."""
        parts = self._parts
        parts.insert(0, self._buf[self._pos :])
        self._buf = b"".join(parts)
        self._pos = 0
        self._parts = []
        self._parts_len = 0

    def buffered(self) -> int:
        """Bytes fed but not yet returned as frames."""
        return len(self._buf) - self._pos + self._parts_len

    def _short(self, need: int) -> tuple[int, dict[str, Any], list[bytes]] | None:
        """The frame at ``_pos`` needs ``need`` bytes: None until they are fed (joined
        now if they already were)."""
        self._need = need
        if self._parts and len(self._buf) - self._pos + self._parts_len >= need:
            self._join()
            return self.next()
        return None

    def next(self) -> tuple[int, dict[str, Any], list[bytes]] | None:
        buf, pos = self._buf, self._pos
        have = len(buf) - pos
        if have < _HEAD_SIZE:
            return self._short(_HEAD_SIZE)
        # The header byte by byte: compiled, each is a machine read of the bytes object
        # (struct's unpack_from was a generic call building a tuple of objects).
        if buf[pos] != _MAGIC0 or buf[pos + 1] != _MAGIC1:
            raise FrameError("bad frame magic")
        version: int = buf[pos + 2]
        if version != VERSION:
            raise FrameError(f"unsupported frame version {version}")
        kind: int = buf[pos + 3]
        if self.kinds is not None and kind not in self.kinds:
            raise FrameError(f"unknown frame kind {kind}")
        meta_len = _u32_at(buf, pos + 4)
        n: int = (buf[pos + 8] << 8) | buf[pos + 9]
        lens_at = pos + _HEAD_SIZE
        if meta_len > frame_meta_bytes_max or _HEAD_SIZE + 4 * n + meta_len > self.frame_max:
            raise FrameError("frame metadata over its bound")
        if have - _HEAD_SIZE < 4 * n:
            return self._short(_HEAD_SIZE + 4 * n)
        bodies_len = 0
        for i in range(n):
            bodies_len += _u32_at(buf, lens_at + 4 * i)
        total = _HEAD_SIZE + 4 * n + meta_len + bodies_len
        if total > self.frame_max:
            raise FrameError("frame over its bound")
        trailer: int = 0 if self.mac is None else self.mac.size
        if have < total + trailer:
            return self._short(total + trailer)
        if trailer and not self.mac.check(buf, pos, total):
            raise FrameError("bad frame MAC")
        at = lens_at + 4 * n
        try:
            meta: Any = _loads(buf[at : at + meta_len]) if meta_len else {}
        except orjson.JSONDecodeError as exc:
            raise FrameError(f"bad frame metadata: {exc}") from None
        if not isinstance(meta, dict):  # every receiver reads it with meta.get()
            raise FrameError("frame metadata is not an object")
        at += meta_len
        bodies: list[bytes] = []
        for i in range(n):
            end = at + _u32_at(buf, lens_at + 4 * i)
            bodies.append(buf[at:end])
            at = end
        pos += total + trailer
        if pos == len(buf):  # read to its end: not kept until the next feed
            self._buf = b""
            pos = 0
        self._pos = pos
        return kind, meta, bodies


def _u32_at(buf: bytes, at: int) -> int:
    """The big-endian u32 at ``buf[at:]`` (the caller checked that it is there)."""
    return (buf[at] << 24) | (buf[at + 1] << 16) | (buf[at + 2] << 8) | buf[at + 3]
