"""The TAKES layout has one codec: ``write_take`` writes a take into a batch's words
and names, ``TakesReader`` reads the frame's takes back in order, and stops at a
take whose words run past the frame (``broken``) without reading its rest."""

from __future__ import annotations

import array

from bus import mesh as meshmod


def _bodies(words: list[int], names: list[bytes]) -> list[bytes]:
    return [array.array("q", words).tobytes(), b"".join(names)]


def _read(bodies: list[bytes]) -> tuple[list[tuple[int, int, bool, list[bytes], list[int] | None]], bool]:
    takes = meshmod.TakesReader(bodies)
    out = []
    while takes.next():
        out.append((takes.rid, takes.count, takes.withcounters, takes.queues, takes.hints))
    return out, takes.broken


def test_what_write_take_writes_the_reader_reads_back() -> None:
    words: list[int] = []
    names: list[bytes] = []
    meshmod.write_take(words, names, 7, 4, False, None, [b"q1", b"queue-3"])
    meshmod.write_take(words, names, 8, 1, True, [-1, 7, -1, -2], [b"a", b"bb"])
    meshmod.write_take(words, names, 2**32 - 1, 100, False, None, [b""])
    assert _read(_bodies(words, names)) == ([
        (7, 4, False, [b"q1", b"queue-3"], None),
        (8, 1, True, [b"a", b"bb"], [-1, 7, -1, -2]),
        (2**32 - 1, 100, False, [b""], None),
    ], False)


def test_an_empty_frame_has_no_take() -> None:
    assert _read(_bodies([], [])) == ([], False)


def test_a_take_running_past_the_frame_is_broken_and_the_rest_unread() -> None:
    words: list[int] = []
    names: list[bytes] = []
    meshmod.write_take(words, names, 1, 2, False, None, [b"q"])
    meshmod.write_take(words, names, 2, 2, True, [-1, 3], [b"r", b"s"])
    cut = words[:-1]  # the second take's last hint is missing
    taken, broken = _read(_bodies(cut, names))
    assert taken == [(1, 2, False, [b"q"], None)] and broken
