"""The mesh's RAW and RAWREPLIES batches: a RAW frame names its first request id
and the others follow it (across the u32 wrap); the owner's answers, in or out of
order, come back as id and length pairs; a loop turn's flush writes each link once
and leaves no other flush behind it."""

from __future__ import annotations

import asyncio

import pytest

from bus import mesh as meshmod
from bus.frames import FrameReader


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)


class _Handler:
    def __init__(self) -> None:
        self.replies: list[list[bytes]] = []

    def log(self, text: str) -> None:
        pass

    def on_raw_replies(self, link: meshmod.Link, bodies: list[bytes]) -> None:
        self.replies.append(bodies)


@pytest.fixture
def mesh(mesh_loop: asyncio.AbstractEventLoop) -> meshmod.Mesh:
    return meshmod.Mesh(0, "ab" * 20, 0, 2, handler=_Handler())  # type: ignore[arg-type]


def _read(data: bytes) -> list[tuple[int, dict[str, object], list[bytes]]]:
    reader = FrameReader(meshmod.KINDS)
    reader.feed(data)
    out = []
    while (frame := reader.next()) is not None:
        out.append(frame)
    return out


def test_a_raw_batch_names_its_first_id_and_its_flags_across_the_wrap(mesh: meshmod.Mesh) -> None:
    link = mesh.links[1]
    assert link is not None
    link.raw_rid = 0xFFFFFFFD
    cmds = [b"*2\r\n$4\r\nQLEN\r\n$1\r\n%d\r\n" % i for i in range(3)]
    for i, cmd in enumerate(cmds):
        link.add_raw(i == 1, f"w{i}").append(cmd)
    link.flush()  # no transport: the frame stays queued
    (kind, meta, bodies), = _read(b"".join(link.outq))
    assert (kind, meta, len(bodies)) == (meshmod.K_RAW, {}, 2)
    head = bodies[0]
    assert meshmod.raw_ids(head) == [0xFFFFFFFE, 0xFFFFFFFF, 0] == list(link.raw_pending)
    assert list(head[4:]) == [0, 1, 0] and bodies[1] == b"".join(cmds)


def test_raw_replies_travel_as_id_and_length_pairs(mesh: meshmod.Mesh) -> None:
    back = meshmod.Link(mesh, -1)
    back.transport = _Transport()  # type: ignore[assignment]
    back.raw_reply(9, b"+later\r\n")  # a reply that waited, ahead of a frame's answers
    back.raw_replies([7, 4, 8, 5], [b":1\r\n", b"$1\r\nx\r\n"])
    mesh.flush()
    (kind, _, bodies), = _read(back.transport.writes[0])  # type: ignore[attr-defined]
    assert kind == meshmod.K_RAWREPLIES
    assert meshmod.u32s(bodies[0]) == [9, 8, 7, 4, 8, 5]
    assert bodies[1] == b"+later\r\n:1\r\n$1\r\nx\r\n"


def test_a_flush_writes_each_link_once_and_schedules_no_other(mesh: meshmod.Mesh) -> None:
    link = mesh.links[1]
    assert link is not None
    link.transport = _Transport()  # type: ignore[assignment]
    link.add_raw(False, "w").append(b"*1\r\n$4\r\nPING\r\n")
    link.add_raw(False, "v").append(b"*1\r\n$4\r\nPING\r\n")
    assert mesh._flush_scheduled
    mesh.flush()
    assert len(link.transport.writes) == 1  # type: ignore[attr-defined]
    assert not mesh._flush_scheduled and not mesh._dirty and not link.dirty


def test_a_read_of_raw_replies_alone_skips_the_end_of_read_work(mesh: meshmod.Mesh) -> None:
    calls: list[str] = []
    mesh.handler.after_batch = lambda: calls.append("after")  # type: ignore[method-assign]
    link = mesh.links[1]
    assert link is not None
    back = meshmod.Link(mesh, -1)
    back.transport = _Transport()  # type: ignore[assignment]
    back.raw_replies([1, 4], [b":1\r\n"])
    mesh.flush()
    link.data_received(back.transport.writes[0])  # type: ignore[attr-defined]
    assert calls == [] and len(mesh.handler.replies) == 1  # type: ignore[attr-defined]
    back.reply(3, 5)  # a REPLIES frame: callbacks that may call the shard
    mesh.flush()
    link.data_received(back.transport.writes[1])  # type: ignore[attr-defined]
    assert calls == ["after"]
