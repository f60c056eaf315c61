"""Empty-queue hints (disque_mp/node/hints.py) on a real 2-worker node: a GETJOB
NOHANG whose other-worker queues are known empty is answered without asking their
owner, never wrongly empty after an acknowledged ADDJOB, the queue created again
after it vanished (DEBUG FLUSHALL, a worker restarted), the same bytes as a
1-worker node, and INFO workers' ``getjob_skipped=`` counting the skips."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nodeproc import NodeProc
from tests.rawclient import NULL_ARRAY, RawClient, Status, connect_to_worker, encode_command
from workers.ids import owner_of_queue

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with NodeProc(Path(tmp_path_factory.mktemp("hints")), workers=2) as n:
        yield n


def queues_of(index: int, n: int, prefix: str) -> list[str]:
    out = [f"{prefix}{i}" for i in range(2000) if owner_of_queue(f"{prefix}{i}".encode(), 2) == index]
    return out[:n]


def celery(prefix: str) -> list[str]:
    """Five queues over both workers, as bench.instructions --celery names them."""
    a, b = queues_of(0, 3, prefix), queues_of(1, 2, prefix)
    return [a[0], b[0], a[1], b[1], a[2]]


def skipped(c: RawClient, worker: int) -> int:
    info = c.call("INFO", "workers").decode()
    line = next(x for x in info.splitlines() if x.startswith(f"worker{worker}:"))
    return int(line.split("getjob_skipped=")[1].split(",")[0])


def raw_reply(c: RawClient, *args: object) -> bytes:
    """The bytes of one reply that is a single line (a null, a status)."""
    c.send(encode_command(*args))
    while b"\r\n" not in c.buf:
        c._fill()
    line, c.buf = c.buf.split(b"\r\n", 1)
    return line + b"\r\n"


def test_no_false_empty_after_an_acknowledged_addjob(node: NodeProc) -> None:
    consumer, producer = connect_to_worker(node.port, 0), connect_to_worker(node.port, 1)
    theirs, mine = queues_of(1, 1, "nf")[0], queues_of(0, 1, "nfm")[0]
    five = celery("nf5-")
    before = skipped(consumer, 0)
    for i in range(150):  # bounded rounds: empty polls, then a job the producer was told of
        assert consumer.call("GETJOB", "NOHANG", "FROM", theirs) == NULL_ARRAY
        assert consumer.call("GETJOB", "NOHANG", "COUNT", 4, "FROM", *five) == NULL_ARRAY
        job = producer.call("ADDJOB", theirs, f"j{i}", 0)
        assert isinstance(job, Status), job
        got = consumer.call("GETJOB", "NOHANG", "FROM", theirs)
        assert [g[1].decode() for g in got] == [str(job)], i
        queue = five[1 + 2 * (i % 2)]  # one of worker 1's queues among the five
        job = producer.call("ADDJOB", queue, f"k{i}", 0)
        got = consumer.call("GETJOB", "NOHANG", "COUNT", 4, "FROM", *five)
        assert [g[1].decode() for g in got] == [str(job)], i
        # a command for our own worker: the connection is not handed to worker 1
        assert consumer.call("GETJOB", "NOHANG", "FROM", mine) == NULL_ARRAY
    # every round's two empty polls but the first rounds' skipped worker 1
    assert skipped(consumer, 0) - before >= 2 * 150 - 6
    assert consumer.call("INFO", "workers").decode().count("connection_worker:0") == 1
    consumer.close()
    producer.close()


def test_the_skip_counter_moves_for_empty_polls_only(node: NodeProc) -> None:
    c = connect_to_worker(node.port, 0)
    theirs = queues_of(1, 1, "sc")[0]
    for _ in range(2):  # asked: known from the second take on (hints.Hints.saw)
        assert c.call("GETJOB", "NOHANG", "FROM", theirs) == NULL_ARRAY
    before = skipped(c, 0)
    assert c.call("GETJOB", "NOHANG", "FROM", theirs) == NULL_ARRAY
    assert skipped(c, 0) == before + 1
    job = c.call("ADDJOB", theirs, "x", 0)
    got = c.call("GETJOB", "NOHANG", "FROM", theirs)
    assert [g[1].decode() for g in got] == [str(job)]
    assert skipped(c, 0) == before + 1  # a queue with a job is asked
    # pipelined behind an ADDJOB whose reply is not back: asked, and the job is there
    c.send(encode_command("ADDJOB", theirs, "y", 0) + encode_command("GETJOB", "NOHANG", "FROM", theirs))
    job = c.read()
    got = c.read()
    assert [g[1].decode() for g in got] == [str(job)]
    c.close()


def _known_empty(c: RawClient, queue: str, five: list[str]) -> None:
    for _ in range(3):
        assert c.call("GETJOB", "NOHANG", "FROM", queue) == NULL_ARRAY
        assert c.call("GETJOB", "NOHANG", "COUNT", 4, "FROM", *five) == NULL_ARRAY


def _created_again(c: RawClient, queue: str, five: list[str]) -> None:
    """The next polls ask the owner, whose take creates the queues again."""
    before = skipped(c, 0)
    assert c.call("GETJOB", "NOHANG", "FROM", queue) == NULL_ARRAY
    assert c.call("GETJOB", "NOHANG", "COUNT", 4, "FROM", *five) == NULL_ARRAY
    assert skipped(c, 0) == before
    for q in [queue, *five]:
        stat = c.call("QSTAT", q)
        assert isinstance(stat, list) and stat[stat.index(b"len") + 1] == 0, (q, stat)


def test_a_flushed_queue_is_created_again_by_the_next_poll(node: NodeProc) -> None:
    c = connect_to_worker(node.port, 0)
    theirs, five = queues_of(1, 1, "fl")[0], celery("fl5-")
    _known_empty(c, theirs, five)
    assert c.call("DEBUG", "FLUSHALL") == Status("OK")
    assert c.call("QSTAT", theirs) == NULL_ARRAY  # gone, with its generation
    _created_again(c, theirs, five)
    c.close()


def test_a_restarted_worker_is_asked_again(node: NodeProc) -> None:
    c = connect_to_worker(node.port, 0)
    producer = connect_to_worker(node.port, 0)
    theirs, five = queues_of(1, 1, "rs")[0], celery("rs5-")
    _known_empty(c, theirs, five)
    info = c.call("INFO", "workers").decode()
    pid1 = int(info.split("worker1:pid=")[1].split(",")[0])
    os.kill(pid1, signal.SIGKILL)

    def back() -> bool:
        try:  # while worker 1 restarts: errors, or a connection it held reset
            probe = RawClient(node.port)
            try:
                text, qlen = probe.call("INFO", "workers"), probe.call("QLEN", theirs)
            finally:
                probe.close()
        except OSError:
            return False
        if not isinstance(text, bytes) or not isinstance(qlen, int):
            return False
        pid = text.decode().split("worker1:pid=")[1].split(",")[0] if b"worker1:pid=" in text else "0"
        return pid.isdigit() and int(pid) not in (0, pid1)

    node.wait_for(back, 30, "worker 1 restarted")
    _created_again(c, theirs, five)
    for i in range(20):  # and no false empty with the new worker's cells
        job = producer.call("ADDJOB", theirs, f"r{i}", 0)
        got = c.call("GETJOB", "NOHANG", "FROM", theirs)
        assert [g[1].decode() for g in got] == [str(job)], i
        assert c.call("GETJOB", "NOHANG", "FROM", theirs) == NULL_ARRAY
    c.close()
    producer.close()


def test_skipped_replies_are_a_one_worker_nodes_bytes(node: NodeProc, tmp_path: Path) -> None:
    theirs, five = queues_of(1, 1, "bb")[0], celery("bb5-")
    shapes = [("GETJOB", "NOHANG", "FROM", theirs),
              ("GETJOB", "NOHANG", "COUNT", 4, "FROM", *five),
              ("GETJOB", "NOHANG", "COUNT", 4, "WITHCOUNTERS", "FROM", *five)]
    with NodeProc(tmp_path, workers=1) as one:
        for resp in (2, 3):
            c, ref = connect_to_worker(node.port, 0), RawClient(one.port)
            if resp == 3:
                assert isinstance(c.call("HELLO", 3), dict) and isinstance(ref.call("HELLO", 3), dict)
            before = skipped(c, 0)
            for shape in shapes:
                want = raw_reply(ref, *shape)
                assert want == (b"_\r\n" if resp == 3 else b"*-1\r\n")
                for _ in range(3):  # the first two ask the owner, then skipped
                    assert raw_reply(c, *shape) == want, (resp, shape)
            assert skipped(c, 0) - before >= 4
            c.close()
            ref.close()
