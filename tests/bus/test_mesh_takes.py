"""The mesh's TAKES batch: every take a worker sends one owner during a loop turn
leaves in one frame, in the order sent, after the RAW or CMDS commands queued
before it and before those queued after it; the owner's answers come back in one
TOOKS frame, each to its waiter; a lost link answers the takes in flight empty."""

from __future__ import annotations

import asyncio

import pytest

from bus import mesh as meshmod
from bus.frames import FrameReader


class _Handler:
    """What the mesh asks of its handler in these tests: its log."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, text: str) -> None:
        self.lines.append(text)

    def raw_failed(self, waiting: list[object], text: str) -> None:
        self.lines.append(text)


@pytest.fixture
def mesh(mesh_loop: asyncio.AbstractEventLoop) -> meshmod.Mesh:
    return meshmod.Mesh(0, "ab" * 20, 0, 2, handler=_Handler())


def _frames(link: meshmod.Link) -> list[tuple[int, dict[str, object], list[bytes]]]:
    link.flush()  # no transport: the frames stay queued
    reader = FrameReader(meshmod.KINDS)
    reader.feed(b"".join(link.outq))
    out = []
    while (frame := reader.next()) is not None:
        out.append(frame)
    return out


def _takes(body0: bytes, names: bytes) -> list[tuple[int, int, bool, list[bytes], list[int] | None]]:
    """A TAKES frame's takes: rid, count, withcounters, queues, hints."""
    words = meshmod.i64s(body0)
    out = []
    i = at = 0
    while i < len(words):
        rid, count, wc, nq, nh = words[i : i + meshmod.TAKE_HEAD_WORDS]
        i += meshmod.TAKE_HEAD_WORDS
        queues = []
        for n in words[i : i + nq]:
            queues.append(names[at : at + n])
            at += n
        i += nq
        out.append((rid, count, wc == 1, queues, words[i : i + nh] if nh else None))
        i += nh
    assert at == len(names)
    return out


def test_a_turns_takes_to_one_owner_leave_in_one_frame(mesh: meshmod.Mesh) -> None:
    link = mesh.links[1]
    assert link is not None
    got: list[bytes] = []
    mesh.take(1, 4, False, None, [b"q1", b"queue-3"], got.append)
    mesh.take(1, 1, True, [-1, 7, -1, -2], [b"a", b"bb"], got.append)
    mesh.take(1, 100, False, None, [b"x"], got.append)
    frames = _frames(link)
    assert [(kind, meta, len(bodies)) for kind, meta, bodies in frames] == [(meshmod.K_TAKES, {}, 2)]
    takes = _takes(*frames[0][2])
    assert [t[1:] for t in takes] == [(4, False, [b"q1", b"queue-3"], None),
                                      (1, True, [b"a", b"bb"], [-1, 7, -1, -2]),
                                      (100, False, [b"x"], None)]
    # the owner's answers, in one TOOKS frame, each to its waiter
    rids = [t[0] for t in takes]
    answers = [meshmod.pack_took([], [0], [b"*2\r\n$1\r\nq\r\n$1\r\ni\r\n"]), b"",
               meshmod.pack_took([3], [], [])]
    back = meshmod.Link(mesh, -1)
    back.transport = object()  # type: ignore[assignment]  # an incoming link, still open
    back.tooks([w for rid, a in zip(rids, answers, strict=True) for w in (rid, len(a))], answers)
    back.transport = None
    (kind, meta, bodies), = _frames(back)
    assert kind == meshmod.K_TOOKS
    mesh.dispatch(link, kind, meta, bodies)
    assert got == answers and not link.take_pending


def test_takes_keep_their_order_with_forwarded_commands(mesh: meshmod.Mesh) -> None:
    """A RAW command before a take leaves before it, one after it leaves after it:
    the owner runs one client's pipeline in its order."""
    link = mesh.links[1]
    assert link is not None
    link.add_raw(False, "w1").append(b"*2\r\n$4\r\nPING\r\n$1\r\na\r\n")
    mesh.take(1, 1, False, None, [b"q"], lambda blob: None)
    mesh.take(1, 1, False, None, [b"r"], lambda blob: None)
    link.add_raw(False, "w2").append(b"*2\r\n$4\r\nPING\r\n$1\r\nb\r\n")
    mesh.command(1, "qlen", [b"q"], lambda meta, bodies: None)
    mesh.take(1, 1, False, None, [b"s"], lambda blob: None)
    kinds = [kind for kind, _, _ in _frames(link)]
    assert kinds == [meshmod.K_RAW, meshmod.K_TAKES, meshmod.K_RAW, meshmod.K_CMDS, meshmod.K_TAKES]


def test_a_lost_link_answers_its_takes_empty(mesh: meshmod.Mesh) -> None:
    link = mesh.links[1]
    assert link is not None
    got: list[bytes] = []
    mesh.take(1, 2, False, None, [b"q"], got.append)
    link.flush()  # its frame queued (no transport yet)
    mesh.take(1, 2, False, None, [b"r"], got.append)  # still in the open batch
    mesh.closing = True  # no redial in this test
    mesh.lost(link)
    assert got == [b"", b""] and not link.take_pending and not link.take_rids
