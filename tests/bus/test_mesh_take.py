"""The TAKE and BLOCK requests' fixed-shape heads (``bus.mesh.pack_take`` /
``pack_block``): what the coordinator packs is what the owner reads, and a body of
another shape is refused with ValueError, never read past its end."""

from __future__ import annotations

import pytest

from bus.mesh import pack_block, pack_take, unpack_block, unpack_take


@pytest.mark.parametrize("count, withcounters, hints", [
    (1, False, None),
    (4, True, None),
    (50, False, [-1, 0, 3, -1, -2, 0]),
    ((1 << 40) + 7, True, [(1 << 35), -1, -9]),  # no 32-bit truncation anywhere
    (1, False, []),
])
def test_take_head_round_trips(count: int, withcounters: bool, hints: list[int] | None) -> None:
    got = unpack_take(pack_take(count, withcounters, hints))
    # an empty hint list reads as none: both mean "nothing known of the other queues"
    assert got == (count, withcounters, hints or None)


def test_take_head_without_hints_is_two_words() -> None:
    assert len(pack_take(4, True, None)) == 16


@pytest.mark.parametrize("token, count, withcounters", [
    (1, 1, False), ((1 << 50) + 3, 500, True),
])
def test_block_head_round_trips(token: int, count: int, withcounters: bool) -> None:
    assert unpack_block(pack_block(token, count, withcounters)) == (token, count, withcounters)


@pytest.mark.parametrize("body", [b"", b"\x00" * 8, b"\x00" * 17, b"\x00" * 23])
def test_malformed_take_head_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError):
        unpack_take(body)


@pytest.mark.parametrize("body", [b"", b"\x00" * 16, b"\x00" * 25, b"\x00" * 32])
def test_malformed_block_head_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError):
        unpack_block(body)
