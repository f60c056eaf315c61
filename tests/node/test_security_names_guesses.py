"""What a client sends cannot hurt other clients or the cluster: a queue name the
bus could not carry is refused at the command layer (with room for ``dead:``), an
option without the job IDs it applies to is an arity error, a read of many tiny
commands before AUTH is not copied once per command, and wrong passwords are
slowed node-wide, not only per connection. One node serves every test here."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from disque_mp.node.config import Config
from disque_mp.node.resp import RequestParser
from tests.nodeproc import NodeProc, unique_queue
from tests.rawclient import Err, RawClient, Status, encode_command
from workers.ids import DEAD_PREFIX
from workers.job import queue_name_bytes_max as record_queue_name_bytes_max
from workers.messages import queue_name_bytes_max as bus_queue_name_bytes_max

pytestmark = pytest.mark.integration

PASSWORD = "guard-pass"
read_timeout_s = 20.0
name_max = 0xFFFF - len(DEAD_PREFIX)  # a job record's name field holds dead:<name>


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with NodeProc(tmp_path_factory.mktemp("guard"), workers=2) as n:
        r = n.client()  # readiness is checked without a password
        assert r.execute_command("CONFIG", "SET", "requirepass", PASSWORD) == b"OK"
        r.close()
        yield n


def client(node: NodeProc) -> redis.Redis:
    return node.client(password=PASSWORD, protocol=2, socket_timeout=read_timeout_s)


def error_of(r: redis.Redis, *args: object) -> str:
    with pytest.raises(redis.ResponseError) as exc:
        r.execute_command(*args)
    return str(exc.value)


def test_the_default_leaves_room_for_the_dead_letter_prefix() -> None:
    assert Config().queue_name_bytes_max == name_max
    assert name_max + len(DEAD_PREFIX) == record_queue_name_bytes_max
    assert name_max + len(DEAD_PREFIX) <= bus_queue_name_bytes_max


def test_a_queue_name_longer_than_the_bound_is_refused(node: NodeProc) -> None:
    r = client(node)
    too_long = unique_queue().encode().ljust(name_max + 1, b"x")
    longest = too_long[:-1]
    want = f"queue name too long (at most {name_max} bytes)"
    for cmd in (("ADDJOB", too_long, "x", 0), ("ADDJOB", too_long, "x", 0, "MAXDELIVER", 2),
                ("GETJOB", "NOHANG", "FROM", "q", too_long),
                ("GETJOB", "TIMEOUT", 50, "FROM", too_long),
                ("PAUSE", too_long, "out", "bcast"), ("GLOBALQLEN", too_long),
                ("DELQUEUE", too_long)):
        assert error_of(r, *cmd) == want, cmd[0]
    assert r.execute_command("QLEN", too_long) == 0  # a read keeps the reference's reply
    # the longest name is a queue like any other, and so is its dead-letter queue
    job_id = r.execute_command("ADDJOB", longest, "x", 0, "MAXDELIVER", 1)
    assert job_id.startswith(b"D-")
    assert r.execute_command("GETJOB", "FROM", longest)[0][1] == job_id
    r.execute_command("NACK", job_id)  # its one delivery spent: to dead:<name>
    assert r.execute_command("QLEN", DEAD_PREFIX + longest) == 1
    assert r.execute_command("SHOW", job_id)[3] == DEAD_PREFIX + longest
    assert r.execute_command("PAUSE", longest, "out", "bcast") == b"out"
    r.execute_command("PAUSE", longest, "none")
    assert r.execute_command("CONFIG", "SET", "queue-name-bytes-max", 8) == b"OK"
    try:
        assert error_of(r, "ADDJOB", "123456789", "x", 0) == \
            "queue name too long (at most 8 bytes)"
        assert r.execute_command("ADDJOB", "12345678", "x", 0).startswith(b"D-")
    finally:
        r.execute_command("CONFIG", "SET", "queue-name-bytes-max", name_max)
    assert "queue-name-bytes-max" in error_of(r, "CONFIG", "SET", "queue-name-bytes-max",
                                              name_max + 1)
    assert r.ping()
    r.close()


def test_an_option_without_job_ids_is_an_arity_error(node: NodeProc) -> None:
    r = client(node)
    assert error_of(r, "NACK", "DELAY", 5) == "wrong number of arguments for 'nack' command"
    assert error_of(r, "WAITJOB", "TIMEOUT", 5) == \
        "wrong number of arguments for 'waitjob' command"
    assert r.execute_command("NACK") == 0  # the reference's reply to a bare NACK
    job_id = r.execute_command("ADDJOB", unique_queue(), "x", 0).decode()
    assert r.execute_command("NACK", job_id, "DELAY", 5) == 0  # queued, not active
    r.close()


def test_one_client_holds_only_its_share_of_the_waitjob_table(node: NodeProc) -> None:
    """waitjob-entries-per-client-max: a client past its share of a worker's WAITJOB
    table gets an error (its entries outlive its timed-out waits), while a second
    client still waits and is woken."""
    r = client(node)
    q = unique_queue("share")  # one queue: every job on its owner's table
    jobs = [r.execute_command("ADDJOB", q, "x", 0).decode() for _ in range(5)]
    assert r.execute_command("CONFIG", "SET", "waitjob-entries-per-client-max", 3) == b"OK"
    try:
        a = RawClient(node.port, timeout_s=read_timeout_s)
        assert a.call("AUTH", PASSWORD) == Status("OK")
        assert a.call("WAITJOB", *jobs[:3], "TIMEOUT", 10) == 0  # three entries kept
        assert a.call("WAITJOB", jobs[3], "TIMEOUT", 10) == Err(
            "ERR too many jobs waited on by this client: at most 3 per worker, try later")
        b = RawClient(node.port, timeout_s=read_timeout_s)
        assert b.call("AUTH", PASSWORD) == Status("OK")
        assert b.call("WAITJOB", jobs[3], jobs[4], "TIMEOUT", 10) == 0  # its own share
        b.send(encode_command("WAITJOB", jobs[3]))  # waits until the job is done
        assert r.execute_command("ACKJOB", jobs[3]) == 1
        assert b.read() == 1
        r.execute_command("ACKJOB", *jobs[:3])  # done: the first client's share is free
        assert a.call("WAITJOB", jobs[4], "TIMEOUT", 10) == 0
        a.close()
        b.close()
    finally:
        r.execute_command("CONFIG", "SET", "waitjob-entries-per-client-max", 100_000)
    assert "waitjob-entries-per-client-max" in error_of(
        r, "CONFIG", "SET", "waitjob-entries-per-client-max", 0)
    r.close()


def test_one_command_at_a_time_before_auth_copies_nothing() -> None:
    """Before AUTH the parser gives one command per call: the rest of the read stays
    where it is (a 256 KB read of PINGs was copied once per command)."""
    p = RequestParser(512 << 20, 1 << 20, 1 << 30)
    p.restrict(10, 16 * 1024)
    data = b"PING\r\n" * 40_000 + encode_command("QLEN", "q")
    cmds, err = p.feed(data, once=True)
    got = len(cmds)
    while cmds:
        assert p._buf is data or not p.buffered()  # the read itself, from an offset
        cmds, err = p.feed(b"", once=True)
        got += len(cmds)
        assert err is None
    assert got == 40_001 and not p.buffered()


def read_exactly(s: socket.socket, size: int) -> bytes:
    s.settimeout(read_timeout_s)
    got = b""
    while len(got) < size:
        chunk = s.recv(1 << 20)
        assert chunk, got[-200:]
        got += chunk
    return got


def test_a_big_read_before_auth_is_answered_in_order(node: NodeProc) -> None:
    noauth = b"-NOAUTH Authentication required.\r\n"
    with socket.create_connection(("127.0.0.1", node.port), timeout=read_timeout_s) as s:
        s.sendall(b"QLEN q\r\n" * 30_000 + encode_command("AUTH", PASSWORD) + b"PING\r\n")
        assert read_exactly(s, len(noauth) * 30_000 + 12) == noauth * 30_000 + b"+OK\r\n+PONG\r\n"


guessers = 12
rate_per_s = 10  # node-wide: a share of 2 workers / 10 per second = 0.2 s per worker


def test_wrong_passwords_are_slowed_node_wide(node: NodeProc) -> None:
    """Each connection gives one wrong password, so the per-connection delay (0
    here) never applies; the node-wide rate still spaces them: a worker takes at
    least guessers / 2 of them, one share apart (a lower bound only)."""
    r = client(node)
    r.execute_command("CONFIG", "SET", "auth-failures-per-second-max", rate_per_s)
    r.execute_command("CONFIG", "SET", "auth-failure-delay-ms", 0)
    socks = [socket.create_connection(("127.0.0.1", node.port), timeout=read_timeout_s)
             for _ in range(guessers)]
    try:
        start = time.monotonic()
        for s in socks:
            s.sendall(encode_command("AUTH", "wrong"))
        want = b"-ERR invalid password\r\n"
        for s in socks:
            assert read_exactly(s, len(want)) == want
        took_s = time.monotonic() - start
    finally:
        for s in socks:
            s.close()
        r.execute_command("CONFIG", "SET", "auth-failures-per-second-max", 100)
        r.execute_command("CONFIG", "SET", "auth-failure-delay-ms", 100)
    share_s = node.workers / rate_per_s
    assert took_s >= (guessers // node.workers - 1) * share_s * 0.9, took_s
    late = client(node)  # the right password still gets in
    assert late.ping()
    late.close()
    r.close()


def test_an_aof_part_that_cannot_be_loaded_fails_the_start(tmp_path: Path) -> None:
    """A broken install (the AOF part's names cannot be imported) is a failed start
    with its reason in the log, never a node serving without persistence."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import disque_mp.node.aof as m\ndel m.AofManager\n")
    node = NodeProc(tmp_path / "node", workers=1, conf={"appendonly": "yes"},
                    env={"PYTHONPATH": str(site)})
    try:
        node.start(wait=False)
        code = node.wait_exit(timeout_s=30)
    finally:
        node.stop()
    assert code != 0
    assert "the AOF part cannot be loaded" in node.output(), node.output()
