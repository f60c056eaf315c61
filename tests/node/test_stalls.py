"""Nothing a client sends stalls a worker, on a real node (two workers): moves of
many jobs out of a long queue and back, a queue of many groups and its bound
(queue-groups-max); the costs themselves are counted in tests/workers
(test_queue_moves.py, test_group_order.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.nodeproc import NodeProc, wait_until
from tests.nodeproc import unique_queue as _q

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with NodeProc(Path(tmp_path_factory.mktemp("stalls")), workers=2) as n:
        yield n


def _r(node: NodeProc) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=node.port, protocol=2, socket_timeout=30)


def _add_many(r: redis.Redis, q: str, n: int, *extra: str) -> list[str]:
    pipe = r.pipeline(transaction=False)
    for _ in range(n):
        pipe.execute_command("ADDJOB", q, "x", 0, "REPLICATE", 1, "RETRY", 60, *extra)
    return [jid.decode() for jid in pipe.execute()]


def test_deadletter_and_redrive_of_the_newest_jobs_of_a_long_queue(node: NodeProc) -> None:
    r = _r(node)
    q = _q("long")
    jids = _add_many(r, q, 4000)
    newest = jids[-1000:]
    assert r.execute_command("DEADLETTER", *newest, "REASON", "bad") == 1000
    assert r.execute_command("QLEN", q) == 3000 and r.execute_command("QLEN", "dead:" + q) == 1000
    assert r.ping()
    assert [e[1].decode() for e in r.execute_command("QPEEK", q, -2)] == jids[2999:2997:-1]
    assert r.execute_command("DEQUEUE", *jids[:2000]) == 2000  # stale entries ahead
    assert r.execute_command("REDRIVE", "dead:" + q, "COUNT", 600) == 600
    assert r.execute_command("REDRIVE", "dead:" + q) == 400
    assert r.execute_command("QLEN", q) == 2000
    peek = [e[1].decode() for e in r.execute_command("QPEEK", q, 2000)]
    assert peek == jids[2000:]  # back in creation order
    got = r.execute_command("GETJOB", "NOHANG", "COUNT", 2000, "FROM", q)
    assert [e[1].decode() for e in got] == jids[2000:]


def test_a_queue_of_many_groups_and_queue_groups_max(node: NodeProc) -> None:
    r = _r(node)
    q = _q("groups")
    assert r.execute_command("CONFIG", "SET", "queue-groups-max", 300) == b"OK"
    try:
        pipe = r.pipeline(transaction=False)
        for g in range(300):
            pipe.execute_command("ADDJOB", q, "x", 0, "REPLICATE", 1, "GROUP", f"g{g:04d}")
        pipe.execute()
        with pytest.raises(redis.ResponseError) as exc:
            r.execute_command("ADDJOB", q, "x", 0, "REPLICATE", 1, "GROUP", "one-more")
        assert str(exc.value) == "too many groups in this queue (at most 300, queue-groups-max)"
        _add_many(r, q, 2, "GROUP", "g0299")  # a group already there still takes jobs
        assert r.execute_command("QLEN", q) == 302
        assert r.execute_command("QGROUPS", q, "COUNT", 3) == [
            [b"g0299", 3], [b"g0000", 1], [b"g0001", 1]]
        assert len(r.execute_command("QGROUPS", q, "COUNT", 1000)) == 300
        first = r.execute_command("QPEEK", q, 1)
        last = r.execute_command("QPEEK", q, -1)
        assert len(first) == 1 and len(last) == 1
        stat = r.execute_command("QSTAT", q)
        fields = dict(zip(stat[::2], stat[1::2], strict=True))
        assert fields[b"groups"] == 300 and fields[b"len"] == 302
        got = r.execute_command("GETJOB", "NOHANG", "COUNT", 302, "FROM", q)
        assert got[0][1] == first[0][1] and len(got) == 302
        # empty again: the groups are gone, the bound counts groups with queued jobs
        r.execute_command("ADDJOB", q, "x", 0, "REPLICATE", 1, "GROUP", "one-more")
        assert r.execute_command("QGROUPS", q) == [[b"one-more", 1]]
    finally:
        r.execute_command("CONFIG", "SET", "queue-groups-max", 100_000)


def _connected(r: redis.Redis) -> int:
    return int(r.info("clients")["connected_clients"])


def test_a_client_that_leaves_behind_a_waitjob_frees_its_replies_at_once(node: NodeProc) -> None:
    """Replies pile behind a WAITJOB that never answers, over the soft output limit
    (the node stops reading the client): the client leaves, and its connection and
    replies go at once, not when the job is done or after the soft seconds."""
    r = _r(node)
    q = _q("pile")
    pin = _add_many(r, _q("pin"), 1)[0]
    for _ in range(16):
        r.execute_command("ADDJOB", q, b"x" * 65536, 0, "REPLICATE", 1)
    r.execute_command("CONFIG", "SET", "client-output-buffer-limit", "normal 0 1048576 3600")
    try:
        before = _connected(r)
        peeks = _qpeeks(r)
        with socket.create_connection(("127.0.0.1", node.port)) as s:
            s.sendall(_resp("WAITJOB", pin, "TIMEOUT", 0) + _resp("QPEEK", q, 16) * 40)
            # its replies pile (1 MB each) behind the WAITJOB, past the soft limit
            wait_until(lambda: _qpeeks(r) >= peeks + 3, 15, "the piled QPEEKs")
            # (>=: INFO asks each worker in turn, so a connection moving meanwhile to
            # the worker that owns its queue can be counted by both)
            assert _connected(r) >= before + 1
        wait_until(lambda: _connected(r) <= before, 15, "the client that left to be freed")
        assert r.ping()
    finally:
        r.execute_command("CONFIG", "SET", "client-output-buffer-limit",
                          "normal 1073741824 268435456 60")


def _qpeeks(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_qpeek", {}).get("calls", 0))


def _resp(*args: object) -> bytes:
    out = b"*%d\r\n" % len(args)
    for a in args:
        data = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(data), data)
    return out


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    """One worker: every client and queue on the same event loop (a flood is cut at
    64 MB of unread replies, not the default 1 GB)."""
    with NodeProc(Path(tmp_path_factory.mktemp("stalls-one")), workers=1,
                  conf={"client-output-buffer-limit": "normal 64mb 16mb 60"}) as n:
        yield n


def test_a_flood_of_heavy_reads_leaves_room_for_other_clients(single: NodeProc) -> None:
    """A client pipelines 300 QPEEK q 1000 over 2 KB jobs (600 MB of replies) and
    reads nothing: its commands run a turn's share at a time, none while it does
    not read, so another client's PING is answered with most of them not run."""
    r = _r(single)
    q = _q("flood")
    pipe = r.pipeline(transaction=False)
    for _ in range(1000):
        pipe.execute_command("ADDJOB", q, b"x" * 2048, 0, "REPLICATE", 1)
    pipe.execute()
    base = _qpeeks(r)
    with socket.create_connection(("127.0.0.1", single.port)) as flood:
        flood.sendall(_resp("QPEEK", q, 1000) * 300)
        wait_until(lambda: _qpeeks(r) > base, 30, "the flood to start")
        assert r.ping()
        ran = _qpeeks(r) - base
        assert ran < 300, ran  # all 300 ran before another client's command did
        assert r.execute_command("QLEN", q) == 1000


def test_a_flood_of_heavy_reads_for_another_workers_queue_leaves_its_owner_room(
        node: NodeProc) -> None:
    """The same flood through the mesh: a client on worker 0 pipelines QPEEK q 1000
    for a queue worker 1 owns; worker 1 builds a frame's replies a turn's share at a
    time, so a client of worker 1 is answered before the frame's window (32 commands,
    forwarded-commands-max) has run."""
    from tests.rawclient import connect_to_worker
    from workers.ids import owner_of_queue

    r = _r(node)
    q = next(name for i in range(200)
             if owner_of_queue((name := _q(f"flood2-{i}")).encode(), 2) == 1)
    pipe = r.pipeline(transaction=False)
    for _ in range(1000):
        pipe.execute_command("ADDJOB", q, b"x" * 2048, 0, "REPLICATE", 1)
    pipe.execute()
    owner_client = connect_to_worker(node.port, 1)
    flood = connect_to_worker(node.port, 0)
    try:
        base = _qpeeks(r)
        flood.send(_resp("QPEEK", q, 1000) * 300)
        wait_until(lambda: _qpeeks(r) > base, 30, "the flood to start")
        assert owner_client.call("PING") == "PONG"
        ran = _qpeeks(r) - base
        assert ran < 32, ran  # the whole window ran before worker 1 read another client
    finally:
        flood.close()
        owner_client.close()
    wait_until(lambda: r.execute_command("QLEN", q) == 1000, 30, "the queue untouched")
