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
_pack_head: Final = _HEAD.pack
_unpack_head: Final = _HEAD.unpack_from
_pack_len: Final = _LEN.pack
_unpack_len: Final = _LEN.unpack_from
# the lengths of a frame of two or three bodies (the local mesh's batches): a
# format built per frame (f">{n}I") cost a string and the struct module's cache
_unpack_lens2: Final = struct.Struct(">II").unpack_from
_unpack_lens3: Final = struct.Struct(">III").unpack_from
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
    followed by a MAC trailer of ``size`` bytes, checked before the frame is parsed."""

    __slots__ = ("_buf", "_pos", "kinds", "frame_max", "buffer_max", "mac")

    def __init__(self, kinds: frozenset[int] | None = None, frame_max: int = frame_bytes_max,
                 buffer_max: int = reader_buffer_bytes_max) -> None:
        self._buf = bytearray()
        self._pos = 0
        self.kinds = kinds
        self.frame_max = frame_max
        self.buffer_max = buffer_max
        self.mac: Any = None

    def feed(self, data: Any) -> None:
        if len(self._buf) - self._pos + len(data) > self.buffer_max:
            raise FrameError("frame reader buffer over its bound")
        self._buf += data

    def buffered(self) -> int:
        """Bytes fed but not yet returned as frames."""
        return len(self._buf) - self._pos

    def next(self) -> tuple[int, dict[str, Any], list[bytes]] | None:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < _HEAD_SIZE:
            return None
        # Typed, the header's integers are machine integers in the compiled reader; untyped,
        # every sum and comparison below was a generic object call (a fifth of its work).
        magic: bytes
        version: int
        kind: int
        meta_len: int
        n: int
        magic, version, kind, meta_len, n = _unpack_head(buf, pos)
        if magic != MAGIC:
            raise FrameError("bad frame magic")
        if version != VERSION:
            raise FrameError(f"unsupported frame version {version}")
        if self.kinds is not None and kind not in self.kinds:
            raise FrameError(f"unknown frame kind {kind}")
        if meta_len > frame_meta_bytes_max or _HEAD_SIZE + 4 * n + meta_len > self.frame_max:
            raise FrameError("frame metadata over its bound")
        lens_at = pos + _HEAD_SIZE
        have = len(buf) - pos
        if have - _HEAD_SIZE < 4 * n:
            return None
        # No sum() for the usual: a cluster frame's one body or none, a mesh batch's two or three
        lens: tuple[int, ...] = ()
        bodies_len = 0
        if n == 1:
            bodies_len = _unpack_len(buf, lens_at)[0]
        elif n == 3:
            lens = _unpack_lens3(buf, lens_at)
            bodies_len = lens[0] + lens[1] + lens[2]
        elif n == 2:
            lens = _unpack_lens2(buf, lens_at)
            bodies_len = lens[0] + lens[1]
        elif n > 1:
            lens = struct.unpack_from(f">{n}I", buf, lens_at)
            bodies_len = sum(lens)
        total = _HEAD_SIZE + 4 * n + meta_len + bodies_len
        if total > self.frame_max:
            raise FrameError("frame over its bound")
        trailer: int = 0 if self.mac is None else self.mac.size
        if have < total + trailer:
            return None
        if trailer and not self.mac.check(buf, pos, total):
            raise FrameError("bad frame MAC")
        at = lens_at + 4 * n
        try:
            # the metadata is small: one copy of its slice is cheaper than a memoryview
            meta: Any = _loads(buf[at : at + meta_len]) if meta_len else {}
        except orjson.JSONDecodeError as exc:
            raise FrameError(f"bad frame metadata: {exc}") from None
        if not isinstance(meta, dict):  # every receiver reads it with meta.get()
            raise FrameError("frame metadata is not an object")
        at += meta_len
        bodies: list[bytes] = []
        if n:
            view = memoryview(buf)
            if n == 1:
                bodies.append(bytes(view[at : at + bodies_len]))  # one copy (a slice is two)
            else:
                for ln in lens:
                    bodies.append(bytes(view[at : at + ln]))
                    at += ln
            view.release()  # the buffer may be resized again
        self._pos = pos + total + trailer
        if self._pos > 65536 and self._pos * 2 > len(buf):
            del buf[: self._pos]
            self._pos = 0
        return kind, meta, bodies
