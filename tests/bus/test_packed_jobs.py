"""The hot job messages without JSON (bus/messages.py, frame kind JOB_PACKED): the same
message arrives whichever form it took; a node sends the packed form only to a peer
whose handshake says it reads it, and keeps reading the JSON form an older node sends."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import uvloop

from bus import auth
from bus.frames import FrameError, FrameReader, encode
from bus.hostbus import (
    BUS_KINDS,
    BUS_PROTO,
    K_HANDSHAKE,
    K_JOB,
    K_JOB_PACKED,
    K_MEET,
    K_PING,
    K_PONG,
    job_frame,
)
from bus.messages import BadMessage, check_job, check_packed_job, pack_job, unpack_job
from tests.bus.test_cluster_bus import Host, job_id_for, until
from tests.nodeproc import free_port

SLOT = 12_345
JOB_ID = job_id_for(SLOT)
NODES = ["a" * 40, "b" * 40, "0123456789abcdef" * 2 + "01234567"]
RECORD = bytes(range(256)) * 4  # the bus carries a job record as raw bytes

# (kind, meta, bodies) of every hot message the shard sends, each with a packed form
HOT = [
    ("REPLJOB", {}, [RECORD]),
    ("GOTJOB", {"j": JOB_ID}, []),
    ("SETACK", {"j": JOB_ID, "m": 3, "d": NODES}, []),
    ("SETACK", {"j": JOB_ID, "m": 0, "d": []}, []),
    ("GOTACK", {"j": JOB_ID, "k": 1}, []),
    ("GOTACK", {"j": JOB_ID, "k": 0}, []),
    ("DELJOB", {"j": JOB_ID}, []),
]
# ... and messages that go as JSON whatever the peer reads
JSON_ONLY = [
    ("SETACK", {"j": JOB_ID, "m": 0}, []),  # no node list (a SETACK for a job we lost)
    ("ENQUEUE", {"j": JOB_ID, "d": NODES}, []),  # not a hot kind
    ("GOTJOB", {"j": JOB_ID, "x": 1}, []),  # a field the packed form cannot say
]


def _read(frame: bytes) -> tuple[int, dict[str, Any], list[bytes]]:
    reader = FrameReader(BUS_KINDS)
    reader.feed(frame)
    got = reader.next()
    assert got is not None and reader.buffered() == 0
    return got


@pytest.mark.parametrize(("kind", "meta", "bodies"), HOT)
def test_a_hot_message_reads_back_the_same_in_both_forms(kind: str, meta: dict[str, Any],
                                                         bodies: list[bytes]) -> None:
    as_json = _read(job_frame(False, kind, SLOT, meta, bodies))
    packed = _read(job_frame(True, kind, SLOT, meta, bodies))
    assert as_json[0] == K_JOB and packed[0] == K_JOB_PACKED and packed[1] == {}
    assert len(job_frame(True, kind, SLOT, meta, bodies)) < len(job_frame(False, kind, SLOT, meta, bodies))
    assert check_packed_job(packed[2]) == (kind, SLOT, meta, bodies)
    assert check_job(as_json[1], as_json[2]) == (kind, SLOT, meta)


@pytest.mark.parametrize(("kind", "meta", "bodies"), JSON_ONLY)
def test_what_the_packed_form_cannot_say_goes_as_json(kind: str, meta: dict[str, Any],
                                                      bodies: list[bytes]) -> None:
    assert pack_job(kind, SLOT, meta) is None
    assert _read(job_frame(True, kind, SLOT, meta, bodies))[0] == K_JOB


def _head(kind: str, meta: dict[str, Any]) -> bytes:
    head = pack_job(kind, SLOT, meta)
    assert head is not None
    return head


@pytest.mark.parametrize("bodies", [
    [], [b""], [b"\x00\x00"], [b"\x05\x00\x00"],  # too short; an unknown code
    [_head("REPLJOB", {}) + b"x"],  # REPLJOB's head is code and slot only
    [_head("GOTJOB", {"j": JOB_ID})[:-1]], [_head("GOTJOB", {"j": JOB_ID}) + b"x"],
    [_head("GOTJOB", {"j": JOB_ID})[:-1] + b"\xff"],  # not ASCII
    [_head("GOTACK", {"j": JOB_ID, "k": 1})[:-1]],
    [_head("SETACK", {"j": JOB_ID, "m": 1, "d": NODES})[:-1]],  # a node ID cut short
    [_head("SETACK", {"j": JOB_ID, "m": 1, "d": []})[:-1]],
])
def test_a_malformed_packed_head_is_refused(bodies: list[bytes]) -> None:
    with pytest.raises(BadMessage):
        unpack_job(bodies)


@pytest.mark.parametrize(("kind", "meta", "bodies", "why"), [
    ("GOTJOB", {"j": job_id_for(SLOT + 1)}, [], "job ID and slot disagree"),
    ("DELJOB", {"j": "D" * 40}, [], "bad job ID"),
    ("GOTACK", {"j": JOB_ID, "k": 1}, [b"x"], "unexpected bodies"),
    ("SETACK", {"j": JOB_ID, "m": 1, "d": ["A" * 40]}, [], "bad SETACK node list"),
    ("REPLJOB", {}, [], "REPLJOB carries one job record"),
])
def test_the_catalogue_checks_a_packed_message_as_a_json_one(kind: str, meta: dict[str, Any],
                                                             bodies: list[bytes], why: str) -> None:
    frame = _read(job_frame(True, kind, SLOT, meta, bodies))
    assert frame[0] == K_JOB_PACKED
    with pytest.raises(BadMessage, match=why):
        check_packed_job(frame[2])
    with pytest.raises(BadMessage, match=why):
        check_job({"k": kind, "s": SLOT, "m": meta}, bodies)


class OlderNode:
    """A node of the version before the packed form, written by hand on the wire: its
    handshake says nothing of the form, it sends job messages as JSON, and its reader
    knows only the kinds of its version (a JOB_PACKED frame would be an unknown kind
    and cost the link)."""

    kinds = BUS_KINDS - {K_JOB_PACKED}

    def __init__(self) -> None:
        self.node_id = "0123456789abcdef" * 2 + "fedcba98"
        self.port = free_port()
        self.jobs: list[tuple[int, dict[str, Any], list[bytes]]] = []
        self.refused: list[str] = []
        self.server: asyncio.AbstractServer | None = None

    def hello(self) -> dict[str, Any]:
        return {"proto": BUS_PROTO, "id": self.node_id, "port": self.port}

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port + 10000)

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        """A node's outbound link to us: answer its handshake and PINGs, keep its jobs."""
        reader = FrameReader(self.kinds)
        try:
            while data := await r.read(65536):
                reader.feed(data)
                while (frame := reader.next()) is not None:
                    kind, meta, bodies = frame
                    if kind == K_HANDSHAKE:
                        w.write(encode(K_HANDSHAKE, self.hello()))
                    elif kind in (K_PING, K_MEET):
                        w.write(encode(K_PONG, {**self.hello(), "leaving": False, "gossip": []}))
                    elif kind == K_JOB:
                        self.jobs.append((kind, meta, bodies))
        except FrameError as exc:
            self.refused.append(str(exc))
        w.close()

    async def dial(self, port: int) -> asyncio.StreamWriter:
        """Our link to the node at ``port``, its handshake answered."""
        r, w = await asyncio.open_connection("127.0.0.1", port + 10000)
        w.write(encode(K_HANDSHAKE, self.hello()))
        reader = FrameReader(self.kinds)
        while (frame := reader.next()) is None:
            reader.feed(await r.read(65536))
        assert frame[0] == K_HANDSHAKE
        return w

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def test_new_and_older_nodes_in_one_cluster(tmp_path: Path) -> None:
    uvloop.run(_mixed(tmp_path))


async def _mixed(tmp: Path) -> None:
    a, b, old = Host(tmp, "a", workers=1), Host(tmp, "b", workers=1), OlderNode()
    await old.start()
    for h in (a, b):
        await h.bus.start()
    messages = HOT + JSON_ONLY
    sent = [(0, kind, SLOT, meta, bodies) for kind, meta, bodies in messages]
    try:
        a.bus.meet("127.0.0.1", b.cfg.port)
        a.bus.meet("127.0.0.1", old.port)
        await until(lambda: old.node_id in a.bus.m.nodes and a.knows(b) and b.knows(a)
                    and not a.bus.m.nodes[old.node_id].handshake, "A knows B and the older node")
        await until(lambda: all(link.answered for link in a.bus.out.values())
                    and len(a.bus.out) == 2, "A's links answered")
        packed = {link.peer_id: link.packed for link in a.bus.out.values()}
        assert packed == {b.bus.my_id: True, old.node_id: False}
        bad_frames = auth.STATS.get("bad_frames", 0)
        # to a node of this version: the packed form where there is one
        for kind, meta, bodies in messages:
            assert a.bus.send(b.bus.my_id, kind, SLOT, meta, bodies) == 1
        await until(lambda: len(b.received) == len(messages), "B got every message")
        assert [(i, k, s_, m, bs) for i, _, k, s_, m, bs in b.received] == sent
        # to the older node: JSON only, which it reads
        for kind, meta, bodies in messages:
            assert a.bus.send(old.node_id, kind, SLOT, meta, bodies) == 1
        await until(lambda: len(old.jobs) == len(messages) or bool(old.refused), "older node's jobs")
        assert old.refused == []
        assert [(m["k"], m["s"], m["m"], bs) for _, m, bs in old.jobs] == \
            [(kind, SLOT, meta, bodies) for kind, meta, bodies in messages]
        # from the older node: its JSON frames are read as ever
        w = await old.dial(a.cfg.port)
        for kind, meta, bodies in messages:
            w.write(encode(K_JOB, {"k": kind, "s": SLOT, "m": meta}, bodies))
        await until(lambda: len(a.received) == len(messages), "A got the older node's messages")
        assert [(i, k, s_, m, bs) for i, _, k, s_, m, bs in a.received] == sent
        assert {r[1] for r in a.received} == {old.node_id}
        w.close()
        assert auth.STATS.get("bad_frames", 0) == bad_frames  # no link dropped for a frame
    finally:
        for h in (a, b):
            await h.bus.close()
        old.close()
