"""Hot commands forwarded to their queue's owner as RESP (mesh RAW frames): replies
spliced into the client's stream in order, in the client's protocol, counted once,
and an error (not silence) when the owner dies with requests in flight."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from disque_mp.node.resp import RequestParser
from tests.nodeproc import NodeProc
from tests.rawclient import (
    NULL_ARRAY,
    Err,
    RawClient,
    Status,
    connect_to_worker,
    encode_command,
)
from workers.ids import owner_of_queue

pytestmark = pytest.mark.integration


def queues_of(index: int, n: int, prefix: str) -> list[str]:
    out = [f"{prefix}{i}" for i in range(2000) if owner_of_queue(f"{prefix}{i}".encode(), 2) == index]
    return out[:n]


def test_pipelined_mixed_owners_keep_order_and_protocol(node2: NodeProc) -> None:
    mine, theirs = queues_of(0, 4, "fw"), queues_of(1, 4, "fw")
    for resp3 in (False, True):
        c = connect_to_worker(node2.port, 0)
        if resp3:
            assert isinstance(c.call("HELLO", 3), dict)
        batch, queues = [], []
        for i in range(40):  # alternate owners: the connection is never handed over
            q = (mine if i % 2 else theirs)[i % 4]
            queues.append(q)
            batch.append(encode_command("ADDJOB", q, f"body{i}", 0))
        c.send(b"".join(batch))
        ids = [c.read() for _ in range(40)]
        assert all(isinstance(i, Status) for i in ids), ids
        batch = [encode_command("GETJOB", "NOHANG", "FROM", q) for q in queues]
        batch.append(encode_command("GETJOB", "NOHANG", "FROM", theirs[0]))  # now empty
        c.send(b"".join(batch))
        got = [c.read() for _ in range(41)]
        for i, q in enumerate(queues):
            assert got[i][0][0] == q.encode()
        assert {g[0][1].decode() for g in got[:40]} == set(ids)
        assert got[40] == (None if resp3 else NULL_ARRAY)  # RESP3 null from the owner
        c.send(b"".join(encode_command("ACKJOB", i) for i in ids) + encode_command("FASTACK", ids[0]))
        assert [c.read() for _ in range(41)] == [1] * 40 + [0]
        assert c.call("ACKJOB", "not-an-id") == Err("BADID Invalid Job ID format.")
        assert c.call("ADDJOB", theirs[0], "x", "-1") == Err("ERR timeout is negative")
        # forwarded from a read with a `*0` (encoded again) and from one cut mid-command
        other = queues_of(1, 2, "fz")  # not read back by the next round's GETJOBs
        cut = encode_command("ADDJOB", other[0], "y", 0)
        c.send(b"*0\r\n" + encode_command("ADDJOB", other[1], "z", 0) + cut[:7])
        c.send(cut[7:])
        assert all(isinstance(c.read(), Status) for _ in range(2))
        c.close()
    stats = RawClient(node2.port).call("INFO", "commandstats").decode()
    assert "cmdstat_addjob:calls=86," in stats, stats  # 2 x 40 + the two errors + 2 x 2
    assert "cmdstat_getjob:calls=82," in stats, stats
    assert "cmdstat_ackjob:calls=82," in stats, stats  # a BADID is a call too (as in Redis)


def test_forwarded_options_take_the_general_path_at_the_owner(node2: NodeProc) -> None:
    q = queues_of(1, 1, "opt")[0]
    c = connect_to_worker(node2.port, 0)
    job_id = c.call("ADDJOB", q, "delayed", 0)
    assert c.call("GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", q)[0][:3] == [
        q.encode(), job_id.encode(), b"delayed"]
    assert c.call("GETJOB", "NOHANG", "COUNT", "x", "FROM", q) == Err(
        "ERR value is not an integer or out of range")
    c.close()


def test_owner_killed_with_forwarded_commands_in_flight(node2: NodeProc) -> None:
    q = queues_of(1, 1, "kill")[0]
    c = connect_to_worker(node2.port, 0)
    info = c.call("INFO", "workers").decode()
    pid1 = int(info.split("worker1:pid=")[1].split(",")[0])
    job_id = c.call("ADDJOB", q, "shown", 0)
    os.kill(pid1, signal.SIGSTOP)  # requests queue up at the owner, unanswered
    try:
        # hot commands and general-path ones (QLEN, SHOW, QPEEK: RAW frames too); fewer
        # than the 16 in a row that hand the connection to the owner
        c.send(b"".join(encode_command("ADDJOB", q, f"x{i}", 0) + encode_command("QLEN", q)
                        + encode_command("SHOW", job_id) + encode_command("QPEEK", q, 1)
                        for i in range(3)))
        time.sleep(0.3)
    finally:
        os.kill(pid1, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):  # the supervisor may have reaped it
            os.kill(pid1, signal.SIGCONT)
    replies = [c.read() for _ in range(12)]
    assert all(r == Err("ERR worker 1 is unavailable, try again") for r in replies), replies
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the restarted owner serves again
        reply = c.call("ADDJOB", q, "after", 0)
        if isinstance(reply, Status):
            break
        time.sleep(0.05)
    assert isinstance(reply, Status)
    c.close()

def test_replies_of_several_clients_in_one_frame_each_in_its_stream(node2: NodeProc) -> None:
    """Forwarded commands of several clients of one worker travel in one RAW frame per
    loop turn and come back in one RAWREPLIES frame: each reply lands in its own
    client's stream, in order with the commands answered at home, in its protocol;
    a client that leaves with replies in flight loses only its own."""
    theirs, mine = queues_of(1, 25, "multi"), queues_of(0, 24, "multi")
    empty = theirs.pop()
    filler = RawClient(node2.port)
    filler.send(b"".join(encode_command("ADDJOB", q, f"{q}-body", 0) for q in theirs + mine))
    assert all(isinstance(filler.read(), Status) for _ in range(48))
    clients = [connect_to_worker(node2.port, 0) for _ in range(4)]
    assert isinstance(clients[1].call("HELLO", 3), dict)
    leaving = connect_to_worker(node2.port, 0)
    plans = [[q for i in range(6) for q in (theirs[6 * k + i], mine[6 * k + i])] for k in range(4)]
    leaving.send(b"".join(encode_command("ADDJOB", theirs[0], "gone", 0) for _ in range(50)))
    leaving.close()
    for c, plan in zip(clients, plans, strict=True):  # all sent before any is read
        c.send(b"".join(encode_command("GETJOB", "NOHANG", "FROM", q) for q in plan)
               + encode_command("GETJOB", "NOHANG", "FROM", empty))
    for k, (c, plan) in enumerate(zip(clients, plans, strict=True)):
        got = [c.read() for _ in range(len(plan) + 1)]
        assert [(g[0][0].decode(), g[0][2].decode()) for g in got[:-1]] \
            == [(q, f"{q}-body") for q in plan], got
        assert got[-1] == (None if k == 1 else NULL_ARRAY)  # RESP3 null on the HELLO 3 client
        c.close()
    assert all(filler.call("QLEN", q) == 0 for q in mine + theirs[1:])
    assert filler.call("PING") == Status("PONG")



def test_ack_over_several_owners_one_summed_reply_in_order(node2: NodeProc) -> None:
    """ACKJOB / FASTACK with IDs of both workers: our part on our shard, the other's as
    one forwarded command, one reply with the sum, in its place in the pipeline."""
    queues = queues_of(0, 2, "ak") + queues_of(1, 2, "ak")
    for worker in (0, 1):
        for resp3 in (False, True):
            c = connect_to_worker(node2.port, worker)
            if resp3:
                assert isinstance(c.call("HELLO", 3), dict)
            c.send(b"".join(encode_command("ADDJOB", q, f"{q}-{k}", 0) for k in range(2) for q in queues))
            ids = [str(c.read()) for _ in range(8)]
            got = c.call("GETJOB", "NOHANG", "COUNT", 8, "FROM", *queues)
            assert sorted(g[1].decode() for g in got) == sorted(ids)
            mixed = [ids[0], ids[1], ids[2], ids[3], ids[4]]  # both owners
            c.send(encode_command("ACKJOB", *mixed)
                   + encode_command("ADDJOB", queues[3], "after", 0)
                   + encode_command("FASTACK", *ids[5:])
                   + encode_command("ACKJOB", ids[0], ids[7]))  # gone already
            replies = [c.read() for _ in range(4)]
            assert replies[0] == 5 and replies[2] == 3 and replies[3] == 0, replies
            assert isinstance(replies[1], Status), replies
            assert [c.call("QLEN", q) for q in queues] == [0, 0, 0, 1]
            got = c.call("GETJOB", "NOHANG", "FROM", queues[3])
            assert c.call("FASTACK", got[0][1].decode(), ids[1]) == 1
            c.close()


def test_parser_spans_are_the_clients_bytes() -> None:
    """A forward copies a command's bytes as the client sent them: the parser's span
    of each command of a read parsed whole is exactly its canonical encoding; a read
    the exact parser took (cut, `*0`, inline) has no spans."""
    p = RequestParser(1 << 20, 1 << 10, 1 << 24)
    cmds = [("ADDJOB", "q1", "body", 0), ("addjob", "q" * 300, "b" * 70000, 10), ("PING",)]
    data = b"".join(encode_command(*c) for c in cmds)
    got, err = p.feed(data)
    assert err is None and len(got) == 3
    assert [p.span(i) for i in range(3)] == [encode_command(*c) for c in cmds]
    assert p.span(3) == b""
    for read in (b"*0\r\n" + data, data[:10], b"PING\r\n"):
        p = RequestParser(1 << 20, 1 << 10, 1 << 24)
        got, err = p.feed(read)
        assert err is None and p.span(0) == b""
