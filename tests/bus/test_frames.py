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


def test_one_body_and_bytes_like_bodies_round_trip() -> None:
    """A frame of one body (REPLJOB, the commonest bus frame) and bodies given as any
    bytes-like object (a bytearray, a memoryview) read back as bytes, compiled or not."""
    frame = encode(6, {"k": "REPLJOB", "s": 3, "m": {}}, [bytearray(b"rec")])
    frame += encode(6, {"k": "YOURJOBS"}, (memoryview(b"a"), b"", b"bc"))
    reader = FrameReader(frozenset({6}))
    reader.feed(bytearray(frame))
    assert reader.next() == (6, {"k": "REPLJOB", "s": 3, "m": {}}, [b"rec"])
    assert reader.next() == (6, {"k": "YOURJOBS"}, [b"a", b"", b"bc"])
    assert reader.next() is None


@pytest.mark.parametrize("meta", [b"{bad", b"[1, 2]"])
def test_bad_metadata_leaves_the_buffer_resizable(meta: bytes) -> None:
    """The reader parses metadata in place (a view of its buffer): a frame it refuses
    must not leave that view open, or the next feed cannot grow the buffer."""
    from bus.frames import _HEAD, MAGIC, VERSION

    reader = FrameReader(frozenset({1}))
    reader.feed(_HEAD.pack(MAGIC, VERSION, 1, len(meta), 0) + meta)
    with pytest.raises(FrameError):
        reader.next()
    reader.feed(b"x" * 100_000)  # BufferError if a view of the buffer were still open
    assert reader.buffered() == len(meta) + _HEAD.size + 100_000


def test_header_size_constant_matches_the_format() -> None:
    from bus.frames import _HEAD, _HEAD_SIZE

    assert _HEAD.size == _HEAD_SIZE


@pytest.mark.parametrize("bodies", [[b"x" * 200], [b"x" * 100, b"y" * 100]])
def test_bodies_over_the_frame_bound_are_refused(bodies: list[bytes]) -> None:
    """One body or several, their lengths count against the bound before any is read."""
    frame = encode(6, {"k": "REPLJOB"}, bodies)
    reader = FrameReader(frozenset({6}), frame_max=len(frame) - 1)
    reader.feed(frame[:30])  # the lengths are in: refused before the bodies arrive
    with pytest.raises(FrameError, match="frame over its bound"):
        reader.next()


@pytest.mark.parametrize("second", [None, b"", b"\x00\x01"])
@pytest.mark.parametrize("parts", [[], [b""], [b"*1\r\n$4\r\nPING\r\n"], [b"a", b"", b"bc" * 300]])
def test_a_mesh_batch_frame_is_the_frame_encode_gives(second: bytes | None, parts: list[bytes]) -> None:
    """``mesh.batch_frame`` (one header pack, one join) writes the bytes of
    ``encode(kind, {}, ...)``, and they read back as those bodies."""
    from bus.mesh import batch_frame

    first = b"\x01\x00\x00\x00\x02\x00\x00\x00"
    bodies = [first, b"".join(parts)] if second is None else [first, second, b"".join(parts)]
    frame = batch_frame(11, first, second, parts)
    assert frame == encode(11, {}, bodies)
    reader = FrameReader(frozenset({11}))
    reader.feed(frame)
    assert reader.next() == (11, {}, bodies)
    assert reader.next() is None


def test_a_big_frame_over_many_reads_and_frames_behind_it_read_back() -> None:
    """A frame that arrives in many chunks (each shorter than it), with the next frame's
    first bytes in its last chunk: nothing reads until it is whole, both come back, and
    the bytes held count all along."""
    big = encode(6, {"k": "YOURJOBS"}, [b"a" * 70_000, b"b" * 50_000])
    small = encode(5, {}, [b"tail"])
    data = big + small
    reader = FrameReader(frozenset({5, 6}))
    fed = 0
    for at in range(0, len(big) + 3, 4096):
        chunk = data[at : min(at + 4096, len(big) + 3)]
        reader.feed(chunk)
        fed += len(chunk)
        assert reader.buffered() == fed
        if fed < len(big):
            assert reader.next() is None
    assert reader.next() == (6, {"k": "YOURJOBS"}, [b"a" * 70_000, b"b" * 50_000])
    assert reader.next() is None  # 3 bytes of the next header
    reader.feed(data[len(big) + 3 :])
    assert reader.next() == (5, {}, [b"tail"])
    assert reader.next() is None
    assert reader.buffered() == 0


def test_lengths_over_the_bound_are_refused_when_they_arrive_in_pieces() -> None:
    frame = encode(6, {"k": "REPLJOB"}, [b"x" * 200])
    reader = FrameReader(frozenset({6}), frame_max=len(frame) - 1)
    for at in range(0, 14, 3):  # header and length, three bytes a read
        reader.feed(frame[at : min(at + 3, 14)])
    with pytest.raises(FrameError, match="frame over its bound"):
        reader.next()


def test_the_buffer_bound_counts_chunks_not_joined_yet() -> None:
    frame = encode(6, {}, [b"x" * 1000])
    reader = FrameReader(frozenset({6}), buffer_max=600)
    reader.feed(frame[:300])
    reader.feed(frame[300:600])
    with pytest.raises(FrameError, match="buffer over its bound"):
        reader.feed(frame[600:601])


def test_a_raw_frames_ids_follow_its_first_and_wrap() -> None:
    from bus.mesh import raw_first_id, raw_ids

    head = bytes([0xFE, 0xFF, 0xFF, 0xFF, 0, 1, 0])
    assert raw_first_id(head) == 0xFFFFFFFE
    assert raw_ids(head) == [0xFFFFFFFE, 0xFFFFFFFF, 0]
