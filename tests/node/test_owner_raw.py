"""The owner's side of a forwarded hot command: a RAW frame's body read whole by one
hiredis call (``read_raw``), a broken one read as far as it goes
(``read_broken_raw``: ERR_INTERNAL for the rest), and a real 2-worker node answering
forwarded ADDJOB / GETJOB / ACKJOB / FASTACK in any spelling of their names, its
``ids`` route checking every ID before anything runs."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import hiredis
import pytest

from disque_mp.node.peers import read_broken_raw, read_raw
from disque_mp.node.resp import append_request, encode_request
from tests.nodeproc import NodeProc
from tests.rawclient import Err, RawClient, Status, connect_to_worker, encode_command
from workers.ids import owner_of_queue


def random_commands(rng: random.Random, n: int) -> list[list[bytes]]:
    sizes = (0, 1, 9, 10, 99, 100, 1023, 1024, 5000)
    return [[bytes(rng.randrange(256) for _ in range(rng.choice(sizes)))
             for _ in range(rng.randrange(1, 70))] for _ in range(n)]


def test_raw_frames_read_whole_one_after_the_other() -> None:
    rng = random.Random(27)
    reader = hiredis.Reader()  # one reader for every frame, as a worker keeps it
    for n in (1, 2, 7, 255, 256, 300):
        cmds = random_commands(rng, n) if n < 100 else [[b"ADDJOB", b"q%d" % i, b"x", b"0"] for i in range(n)]
        parts: list[bytes] = []
        for cmd in cmds:
            append_request(parts, cmd)
        assert read_raw(reader, b"".join(parts), n) == cmds


CMDS = [[b"ADDJOB", b"q", b"body\r\n*1\r\n", b"0"], [b"ackjob", b"D-" + b"x" * 38],
        [b"GETJOB", b"NOHANG", b"FROM", b"a", b"b"]]
DATA = b"".join(encode_request(c) for c in CMDS)
ENDS = [len(b"".join(encode_request(c) for c in CMDS[: i + 1])) for i in range(len(CMDS))]


def test_a_cut_frame_is_broken_and_its_whole_commands_still_read() -> None:
    for cut in range(len(DATA)):
        reader = hiredis.Reader()
        assert read_raw(reader, DATA[:cut], 3) is None, cut
        whole = [c for c, end in zip(CMDS, ENDS, strict=True) if end <= cut]
        assert read_broken_raw(DATA[:cut], 3) == whole + [None] * (3 - len(whole)), cut


@pytest.mark.parametrize("tail", [
    encode_request([b"PING"]),  # one more command than the frame says
    b"x",
    b"+OK\r\n",
])
def test_a_frame_with_more_than_its_commands_is_broken(tail: bytes) -> None:
    assert read_raw(hiredis.Reader(), DATA + tail, 3) is None
    assert read_broken_raw(DATA + tail, 3) == CMDS


@pytest.mark.parametrize("body", [b"*x\r\n", b"+OK\r\n", b":1\r\n", b"$1\r\na\r\n", b"!!!!\r\n"])
def test_a_frame_with_a_value_that_is_no_command_reads_up_to_it(body: bytes) -> None:
    data = encode_request([b"PING"]) + body + encode_request([b"PING"])
    got = read_raw(hiredis.Reader(), data, 3)
    assert got is None or got[0] == [b"PING"] and type(got[1]) is not list  # answered ERR_INTERNAL
    assert read_broken_raw(data, 3) == [[b"PING"], None, None]


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


def test_raw_names_and_forwarded_ids() -> None:
    from disque_mp.node.peers import _ids_of, _raw_kind
    kinds = {b"addjob": 1, b"getjob": 2, b"ackjob": 3, b"fastack": 4}
    for name, kind in kinds.items():
        for spelled in (name, name.upper(), name.capitalize(), name.swapcase()[:3] + name[3:]):
            assert _raw_kind(spelled) == kind, spelled
    for other in (b"qlen", b"ADDJOBS", b"addjo", b"", b"FASTACKX", b"g\xc3\xa9tjob"):
        assert _raw_kind(other) == 0, other
    ids = [f"D-dcb833cf-{i:024d}-05a1".encode() for i in range(3)]
    for n in range(4):
        assert _ids_of([b"ACKJOB", *ids[:n]]) == [i.decode() for i in ids[:n]]


@pytest.mark.integration
def test_forwarded_replies_fill_their_own_slots_round_after_round(node: NodeProc) -> None:
    """Forwarded ADDJOB / GETJOB / FASTACK of two clients of one worker, pipelined:
    each reply lands in its own command's place, round after round (the forwarded
    commands' reply slots are reused once their replies have left)."""
    theirs = owned_by(1, 8, "order")
    clients = [connect_to_worker(node.port, 0) for _ in range(2)]
    for rnd in range(4):
        for k, c in enumerate(clients):
            c.send(b"".join(encode_command("ADDJOB", q, f"{rnd}-{k}-{q}", 0)
                            + encode_command("GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", q)
                            for q in theirs))
        for k, c in enumerate(clients):
            got = [c.read() for _ in range(2 * len(theirs))]
            for i, q in enumerate(theirs):
                job_id, jobs = got[2 * i], got[2 * i + 1]
                assert isinstance(job_id, Status), got
                assert jobs[0][:3] == [q.encode(), str(job_id).encode(), f"{rnd}-{k}-{q}".encode()]
            c.send(b"".join(encode_command("FASTACK", str(got[2 * i])) for i in range(len(theirs))))
            assert [c.read() for _ in theirs] == [1] * len(theirs)
    for c in clients:
        c.close()
