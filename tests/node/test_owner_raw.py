"""The owner's side of a forwarded hot command: ``RawRequests`` reads a RAW frame's
body (every command whole, or None from the first byte that is not one), and a real
2-worker node answers forwarded ADDJOB / GETJOB / ACKJOB / FASTACK in any spelling of
their names, and the ``ids`` route checks every ID before anything runs."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from disque_mp.node.resp import RawRequests, append_request, encode_request
from tests.nodeproc import NodeProc
from tests.rawclient import Err, RawClient, Status, connect_to_worker, encode_command
from workers.ids import owner_of_queue


def read_all(data: bytes) -> list[list[bytes] | None]:
    reader = RawRequests(data)
    out: list[list[bytes] | None] = []
    for _ in range(len(data) + 2):  # bounded: a command takes at least 4 bytes
        cmd = reader.next()
        out.append(cmd)
        if cmd is None:
            return out
    raise AssertionError("the reader never ended")


def random_commands(rng: random.Random, n: int) -> list[list[bytes]]:
    sizes = (0, 1, 9, 10, 99, 100, 1023, 1024, 5000)
    return [[bytes(rng.randrange(256) for _ in range(rng.choice(sizes)))
             for _ in range(rng.randrange(1, 70))] for _ in range(n)]


def test_raw_requests_read_what_append_request_writes() -> None:
    rng = random.Random(27)
    for _ in range(20):
        cmds = random_commands(rng, rng.randrange(1, 12))
        parts: list[bytes] = []
        for cmd in cmds:
            append_request(parts, cmd)
        assert read_all(b"".join(parts)) == [*cmds, None]


def test_raw_requests_cut_anywhere_give_the_whole_commands_then_none() -> None:
    cmds = [[b"ADDJOB", b"q", b"body\r\n*1\r\n", b"0"], [b"ackjob", b"D-" + b"x" * 38],
            [b"GETJOB", b"NOHANG", b"FROM", b"a", b"b"]]
    data = b"".join(encode_request(c) for c in cmds)
    ends = [len(b"".join(encode_request(c) for c in cmds[: i + 1])) for i in range(len(cmds))]
    for cut in range(len(data) + 1):
        whole = [c for c, end in zip(cmds, ends, strict=True) if end <= cut]
        assert read_all(data[:cut]) == [*whole, None], cut


@pytest.mark.parametrize("body", [
    b"*0\r\n",  # no command is empty
    b"*-1\r\n",
    b"*x\r\n$1\r\na\r\n",
    b"*\r\n",
    b"*1\n$1\r\na\r\n",  # LF alone
    b"*1\r\n$-1\r\n",  # a null is no argument
    b"*1\r\n:1\r\n",  # an integer is no argument
    b"*1\r\n$1\r\nab\r\n",  # the size is not the data's
    b"*1\r\n$1\r\na\n\r",
    b"*1\r\n$0000000000001\r\na\r\n",  # past raw_length_digits_max
    b"*2\r\n$1\r\na\r\n",  # an argument missing
    b"+OK\r\n",
    b"PING\r\n",  # no inline commands between workers
])
def test_raw_requests_broken_frames_end_the_reading(body: bytes) -> None:
    good = encode_request([b"PING"])
    assert read_all(good + body + good) == [[b"PING"], None]


def owned_by(index: int, n: int, prefix: str) -> list[str]:
    out = [f"{prefix}{i}" for i in range(2000) if owner_of_queue(f"{prefix}{i}".encode(), 2) == index]
    return out[:n]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with NodeProc(Path(tmp_path_factory.mktemp("owner-raw")) / "n", workers=2) as n:
        yield n


@pytest.mark.integration
def test_forwarded_hot_commands_in_any_case(node: NodeProc) -> None:
    theirs = owned_by(1, 2, "case")
    c = connect_to_worker(node.port, 0)  # every command crosses to worker 1
    names = [("addjob", "getjob", "ackjob", "fastack"), ("ADDJOB", "GETJOB", "ACKJOB", "FASTACK"),
             ("AddJob", "GetJob", "AckJob", "FastAck")]
    for add, get, ack, fast in names:
        c.send(b"".join(encode_command(add, q, f"{add}-{k}", 0) for k in range(2) for q in theirs))
        ids = [c.read() for _ in range(4)]
        assert all(isinstance(i, Status) for i in ids), ids
        got = c.call(get, "NOHANG", "COUNT", 4, "FROM", *theirs)
        assert sorted(g[1].decode() for g in got) == sorted(ids)
        c.send(encode_command(ack, *ids[:3]) + encode_command(fast, ids[3], ids[0]))
        assert [c.read(), c.read()] == [3, 1]
    c.close()
    stats = RawClient(node.port).call("INFO", "commandstats").decode()
    for name, calls in (("addjob", 12), ("getjob", 3), ("ackjob", 3), ("fastack", 3)):
        assert f"cmdstat_{name}:calls={calls}," in stats, stats


@pytest.mark.integration
def test_ids_route_checks_every_id_before_running(node: NodeProc) -> None:
    mine, theirs = owned_by(0, 1, "ids")[0], owned_by(1, 1, "ids")[0]
    c = connect_to_worker(node.port, 0)
    a, b = c.call("ADDJOB", mine, "a", 0), c.call("ADDJOB", theirs, "b", 0)
    bad = "D-" + "z" * 38
    for cmd in ("DELJOB", "ENQUEUE", "DEQUEUE"):  # the general path's ids route
        assert c.call(cmd, a, b, bad) == Err("BADID Invalid Job ID format.")
        assert c.call(cmd, a, bad[:-1]) == Err("BADID Invalid Job ID format.")
    assert [c.call("QLEN", mine), c.call("QLEN", theirs)] == [1, 1]  # nothing ran
    assert c.call("DEQUEUE", a, b) == 2  # both owners, summed
    assert c.call("DELJOB", b, a) == 2
    c.close()
