"""The frame reader (bus/frames.py) under hypothesis: frames fed byte by byte come
out as they went in, and any input either yields frames or raises FrameError."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from bus import frames

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_frame = st.tuples(st.integers(0, 255), st.dictionaries(st.text(max_size=8), _json, max_size=5),
                   st.lists(st.binary(max_size=60), max_size=4))


def _drain(reader: frames.FrameReader) -> list[tuple[int, dict[str, Any], list[bytes]]]:
    out = []
    while (f := reader.next()) is not None:
        out.append(f)
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(_frame, min_size=1, max_size=5))
def test_frames_fed_byte_by_byte_come_out_whole(sent: list[tuple[int, dict[str, Any], list[bytes]]]) -> None:
    data = b"".join(frames.encode(k, m, b) for k, m, b in sent)
    reader = frames.FrameReader()
    got = []
    for i in range(len(data)):
        reader.feed(data[i : i + 1])
        got += _drain(reader)
    assert got == [(k, m, b) for k, m, b in sent]
    assert reader.buffered() == 0


_garbage = st.one_of(
    st.binary(max_size=80),
    _frame.map(lambda f: frames.encode(*f)),
    # a valid header with lengths and metadata of its own choosing
    st.tuples(st.integers(0, 255), st.integers(0, 64), st.lists(st.integers(0, 64), max_size=3),
              st.binary(max_size=80))
    .map(lambda t: frames._HEAD.pack(frames.MAGIC, frames.VERSION, t[0], t[1], len(t[2]))
         + b"".join(frames._LEN.pack(n) for n in t[2]) + t[3]),
    # well-formed JSON metadata that is not an object
    _json.map(orjson.dumps).map(
        lambda m: frames._HEAD.pack(frames.MAGIC, frames.VERSION, 1, len(m), 0) + m),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_garbage, max_size=5), st.integers(1, 7))
def test_any_input_gives_frames_with_object_metadata_or_frame_error(pieces: list[bytes], step: int) -> None:
    data = b"".join(pieces)
    reader = frames.FrameReader()
    try:
        for i in range(0, len(data), step):
            reader.feed(data[i : i + step])
            for kind, meta, bodies in _drain(reader):
                assert 0 <= kind <= 255
                assert isinstance(meta, dict)  # every receiver calls meta.get()
                assert all(isinstance(b, bytes) for b in bodies)
    except frames.FrameError:
        pass  # the link is dropped: that is the contract
