"""What one client sends never breaks the mesh between the workers or piles memory
on them: a forwarded command too big for one frame gets an error and the link
keeps working, the batch of one loop turn is cut at the frame's bound, replies
waiting behind a blocked one count against the output limits (and go with the
client), and a flood of heavy forwarded reads does not keep other clients
waiting. One node serves every test here (module scope)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from bus import mesh as meshmod
from bus.frames import FrameReader, frame_bodies_max
from tests.nodeproc import NodeProc, unique_queue
from tests.rawclient import Err, RawClient, Status, connect_to_worker, encode_command
from workers.ids import JobIdGen, owner_of_queue

pytestmark = pytest.mark.integration

ids_n = frame_bodies_max + 4465  # 70,000: more than one frame carries


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    conf = {"client-output-buffer-limit": "normal 8mb 0 0"}
    with NodeProc(tmp_path_factory.mktemp("meshb") / "n", workers=2, conf=conf) as n:
        yield n


def _queue_of(index: int, prefix: str) -> str:
    return next(f"{prefix}{i}" for i in range(2000)
                if owner_of_queue(f"{prefix}{i}".encode(), 2) == index)


def _ids_of(index: int, n: int) -> list[str]:
    gen = JobIdGen("ab" * 20, b"seed")
    slot = 1 if index == 1 else 2  # owner(slot) = slot % 2
    return [gen.make(slot, 3600, 300) for _ in range(n)]


def _link_works(port: int) -> None:
    """A command forwarded from worker 0 to worker 1 (general path) and INFO (both)."""
    c = connect_to_worker(port, 0)
    q = _queue_of(1, unique_queue("alive"))
    assert c.call("QLEN", q) == 0
    assert b"worker1:" in c.call("INFO", "workers")
    c.close()


def test_waitjob_with_more_ids_than_a_frame_carries_is_refused_and_the_link_lives(
        node: NodeProc) -> None:
    c = connect_to_worker(node.port, 0)
    before = _mesh_counters(c)
    reply = c.call("WAITJOB", *_ids_of(1, ids_n))
    assert isinstance(reply, Err) and "too many arguments" in reply, reply
    assert c.call("PING") == Status("PONG")
    _link_works(node.port)
    after = _mesh_counters(c)  # INFO shows the refusal, and no link was reset
    assert after["mesh_frames_refused"] >= before["mesh_frames_refused"] + 1, after
    assert after["mesh_link_resets"] == before["mesh_link_resets"], after


def _mesh_counters(c: RawClient) -> dict[str, int]:
    lines = c.call("INFO", "workers").decode().split("\r\n")
    fields = dict(line.split(":", 1) for line in lines if line.startswith("mesh_"))
    return {k: int(v) for k, v in fields.items()}


def test_pause_with_70000_words_is_answered_and_the_link_lives(node: NodeProc) -> None:
    # a command of one other owner travels as one RESP body of a RAW frame, however
    # many words it has: answered as one worker answers it
    c = connect_to_worker(node.port, 0)
    q = _queue_of(1, unique_queue("pause"))
    assert c.call("PAUSE", q, *(["none"] * ids_n)) == "none"
    _link_works(node.port)


def test_many_clients_acking_at_once_past_a_frame_in_one_turn(node: NodeProc) -> None:
    # Each ACKJOB names IDs of both workers, so it takes the general path (CMDS); the
    # turns that gather several of them would pass the frame's body count.
    ids = _ids_of(1, 2100) + _ids_of(0, 1)
    payload = encode_command("ACKJOB", *ids)
    clients = [connect_to_worker(node.port, 0) for _ in range(40)]
    barrier = threading.Barrier(len(clients))

    def send(c: RawClient) -> None:
        barrier.wait()
        c.send(payload)

    threads = [threading.Thread(target=send, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [c.read() for c in clients] == [0] * len(clients)  # unknown IDs: none acked
    _link_works(node.port)


class _LogLines:
    """The mesh's handler as far as this test reaches it: its log."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, text: str) -> None:
        self.lines.append(text)


def test_a_turns_commands_leave_in_frames_under_the_body_bound() -> None:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        mesh = meshmod.Mesh(0, "ab" * 20, 0, 2, handler=_LogLines())
        link = mesh.links[1]
        assert link is not None
        got: list[object] = []
        for _ in range(40):  # 40 x 2,101 arguments: 84,040, more than one frame carries
            mesh.command(1, "ackjob", [b"x"] * 2101, lambda meta, bodies: got.append(meta))
        mesh.command(1, "ackjob", [b"x"] * ids_n, lambda meta, bodies: got.append(meta))
        link.flush()  # no transport: the frames stay queued
        reader = FrameReader(meshmod.KINDS)
        reader.feed(b"".join(link.outq))
        rids: list[int] = []
        while (frame := reader.next()) is not None:
            kind, meta, bodies = frame
            assert kind == meshmod.K_CMDS and len(bodies) <= frame_bodies_max
            rids.extend(meta["r"])
        assert len(rids) == 40 and len(link.outq) == 2
        assert got == [{"v": {"e": meshmod.ERR_TOO_BIG}}]  # the one too big alone
        assert mesh.refused == 1 and "too big" in mesh.handler.lines[0]
        # nothing is left behind: the next command opens a fresh batch
        mesh.command(1, "qlen", [b"q"], lambda meta, bodies: None)
        assert link.cmd_rids and len(link.cmd_args) == 1
    finally:
        asyncio.set_event_loop(None)
        loop.close()



def _fill_queue(port: int, q: str, n: int, body: str) -> None:
    filler = RawClient(port)
    filler.send(b"".join(encode_command("ADDJOB", q, body, 0) for _ in range(n)))
    assert all(isinstance(filler.read(), Status) for _ in range(n))
    filler.close()


def test_replies_piled_behind_a_blocked_getjob_count_against_the_output_limit(
        node: NodeProc) -> None:
    q = _queue_of(1, unique_queue("pile"))
    _fill_queue(node.port, q, 4, "p" * (1 << 20))
    c = connect_to_worker(node.port, 0)
    blocked = encode_command("GETJOB", "TIMEOUT", 0, "FROM", unique_queue("never"))
    # 300 MB of QPEEK replies behind a GETJOB that never answers: past the 8 MB limit
    # the client is cut, its pile dropped
    c.send(blocked + encode_command("QPEEK", q, 1) * 300)
    assert c.closed()
    assert b"used_memory" in RawClient(node.port).call("INFO", "memory")
    assert RawClient(node.port).call("QLEN", q) == 4  # the node serves on


def test_a_flood_of_forwarded_reads_leaves_the_node_answering(node: NodeProc) -> None:
    q = _queue_of(1, unique_queue("flood"))
    _fill_queue(node.port, q, 1000, "f" * 2048)
    flooders = [connect_to_worker(node.port, 0) for _ in range(4)]
    for f in flooders:  # each asks for 600 MB and reads none of it
        f.send(encode_command("QPEEK", q, 1000) * 300)
    other = RawClient(node.port)
    assert other.call("PING") == Status("PONG")
    assert b"worker1:" in other.call("INFO", "workers")
    assert all(f.closed() for f in flooders)  # cut by the 8 MB output limit
    assert RawClient(node.port).call("QLEN", q) == 1000


def _unread_bytes(port: int, client_port: int) -> int:
    """Bytes the node has not read yet from the client at ``client_port`` (the
    kernel's receive queue of the node's socket, /proc/net/tcp)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            rows = [line.split() for line in f.read().splitlines()[1:]]
        for row in rows:
            if int(row[1].rsplit(":", 1)[1], 16) == port \
                    and int(row[2].rsplit(":", 1)[1], 16) == client_port:
                return int(row[4].split(":")[1], 16)
    return 0


def test_a_pile_over_the_soft_limit_stops_reading_until_it_leaves(node: NodeProc) -> None:
    """Replies piled behind a blocked GETJOB past the soft limit pause reading (the
    client's next command stays in the node's socket, not run); once the blocked
    reply comes and the pile leaves, the node reads and runs it."""
    q = _queue_of(0, unique_queue("soft"))
    side = unique_queue("side")
    never = unique_queue("never")
    _fill_queue(node.port, q, 1, "s" * (1 << 20))
    admin = RawClient(node.port)
    assert admin.call("CONFIG", "SET", "client-output-buffer-limit", "normal 0 2mb 3600") \
        == Status("OK")
    try:
        c = connect_to_worker(node.port, 0)
        c.send(encode_command("GETJOB", "TIMEOUT", 0, "FROM", never)
               + encode_command("QPEEK", q, 1) * 3)  # 3 MB piled: over the 2 MB soft limit
        client_port = c.sock.getsockname()[1]
        # The ADDJOB goes only once the node has read the first commands: sent at once,
        # a node slow to be scheduled (a loaded host) reads both in one read, and the
        # ADDJOB sits in its buffer, read before the pile existed.
        for _ in range(1000):
            if not _unread_bytes(node.port, client_port):
                break
            threading.Event().wait(0.01)
        c.send(encode_command("ADDJOB", side, "x", 0))
        for _ in range(1000):  # the node leaves the ADDJOB unread
            if _unread_bytes(node.port, client_port):
                break
            threading.Event().wait(0.01)
        assert _unread_bytes(node.port, client_port), "the node read past the soft limit"
        assert admin.call("QLEN", side) == 0
        assert isinstance(admin.call("ADDJOB", never, "wake", 0), Status)
        got = c.read()  # the blocked GETJOB's job, then the pile, then the ADDJOB
        assert got[0][0] == never.encode(), got
        assert all(len(c.read()) == 1 for _ in range(3))
        assert isinstance(c.read(), Status)
        assert admin.call("QLEN", side) == 1
        c.close()
    finally:
        admin.call("CONFIG", "SET", "client-output-buffer-limit", "normal 8mb 0 0")
        admin.close()
