"""bus/frames.py: frames round-trip whole and byte by byte; empty metadata costs no JSON."""

from __future__ import annotations

import pytest

from bus.frames import FrameError, FrameReader, encode


def test_round_trip_with_and_without_metadata() -> None:
    frames = [encode(11, {}, [b"\x01\x00\x00\x00", b"\x00", b"*1\r\n$4\r\nPING\r\n"]),
              encode(3, {"r": 7, "c": 2, "w": False}, [b"q1", b""]),
              encode(5, {})]
    assert len(frames[2]) == 2 + 1 + 1 + 4 + 2  # header only: no "{}" for empty metadata
    reader = FrameReader(frozenset({3, 5, 11}))
    for byte in b"".join(frames):  # byte by byte: "need more data" until complete
        reader.feed(bytes([byte]))
    got = []
    while (frame := reader.next()) is not None:
        got.append(frame)
    assert got == [(11, {}, [b"\x01\x00\x00\x00", b"\x00", b"*1\r\n$4\r\nPING\r\n"]),
                   (3, {"r": 7, "c": 2, "w": False}, [b"q1", b""]),
                   (5, {}, [])]
    assert reader.buffered() == 0


def test_unknown_kind_is_refused() -> None:
    reader = FrameReader(frozenset({1}))
    reader.feed(encode(12, {}, [b"x"]))
    with pytest.raises(FrameError):
        reader.next()
