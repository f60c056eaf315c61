"""The front end against real nodes: handshake, routing between workers, blocking
GETJOB across owners, pipelining, node-wide commands, connection handoff."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis

from tests.nodeproc import NodeProc, wait_until
from tests.rawclient import (
    NULL_ARRAY,
    NULL_BULK,
    Err,
    RawClient,
    Status,
    connect_to_worker,
    encode_command,
    worker_of,
)
from workers.ids import owner_of_queue

pytestmark = pytest.mark.integration


def queue_owned_by(index: int, workers: int = 2, prefix: str = "q") -> str:
    for n in range(10_000):
        name = f"{prefix}{n}"
        if owner_of_queue(name.encode(), workers) == index:
            return name
    raise AssertionError("no queue name found")


def test_redis_py8_default_handshake(node: NodeProc) -> None:
    r = node.client()
    assert r.connection_pool.connection_kwargs.get("protocol") in (None, 3, "3")
    job_id = r.execute_command("ADDJOB", "rq", "body", 0)
    assert job_id.startswith(b"D-")
    show = r.execute_command("SHOW", job_id)
    assert show[show.index(b"state") + 1] == b"queued"
    qstat = r.execute_command("QSTAT", "rq")
    assert qstat[:4] == [b"name", b"rq", b"len", 1]
    got = r.execute_command("GETJOB", "NOHANG", "FROM", "rq")
    assert got == [[b"rq", job_id, b"body"]]
    assert r.execute_command("ACKJOB", job_id) == 1
    assert r.execute_command("SHOW", job_id) is None
    assert r.execute_command("GETJOB", "NOHANG", "FROM", "rq") is None
    r.close()


def test_hello3_switches_protocol(node: NodeProc) -> None:
    c = RawClient(node.port)
    assert c.call("SHOW", "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1") is NULL_BULK
    hello = c.call("HELLO", "3")
    assert isinstance(hello, dict)
    assert hello[b"proto"] == 3 and hello[b"server"] == b"disque"
    assert set(hello) == {b"server", b"version", b"proto", b"id", b"mode", b"role", b"modules"}
    assert c.call("SHOW", "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1") is None  # RESP3 null
    assert c.call("GETJOB", "NOHANG", "FROM", "nothing") is None
    assert c.call("QSTAT", "nothing2") is None
    c.call("ADDJOB", "h3", "x", 0)
    assert c.call("QSTAT", "h3")[0] == b"name"  # flat array, not a map
    assert isinstance(c.call("HELLO", "2"), list)
    assert c.call("QSTAT", "nothing3") is NULL_ARRAY
    assert c.call("HELLO", "4") == Err("NOPROTO unsupported protocol version")
    disque_hello = c.call("HELLO")
    assert disque_hello[0] == 1 and len(disque_hello) == 3
    c.close()


def test_queue_of_worker1_through_worker0(node2: NodeProc) -> None:
    q = queue_owned_by(1)
    c = connect_to_worker(node2.port, 0)
    job_id = c.call("ADDJOB", q, "payload", 0)
    assert isinstance(job_id, Status)
    assert c.call("QLEN", q) == 1
    assert c.call("QPEEK", q, 1) == [[q.encode(), job_id.encode(), b"payload"]]
    assert c.call("SHOW", job_id)[5] == b"queued"
    info = c.call("INFO", "workers").decode()
    assert ",jobs=1," in info.split("worker1:")[1].split("\r\n")[0]
    assert c.call("GETJOB", "NOHANG", "FROM", q) == [[q.encode(), job_id.encode(), b"payload"]]
    assert c.call("WORKING", job_id) > 0
    assert c.call("NACK", job_id) == 1
    assert c.call("GETJOB", "COUNT", 3, "FROM", q)[0][1] == job_id.encode()
    assert c.call("ACKJOB", job_id) == 1
    assert c.call("QLEN", q) == 0
    c.close()


def test_ids_split_over_workers(node2: NodeProc) -> None:
    c = RawClient(node2.port)
    ids = [c.call("ADDJOB", queue_owned_by(i % 2, prefix=f"s{i}"), "x", 0) for i in range(6)]
    bogus = "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"
    assert c.call("DEQUEUE", *ids) == 6
    assert c.call("ENQUEUE", *ids, bogus) == 6
    assert c.call("ACKJOB", ids[0], "notanid", ids[1]) == Err("BADID Invalid Job ID format.")
    assert c.call("FASTACK", *ids[:3], bogus) == 3
    assert c.call("DELJOB", *ids) == 3
    assert c.call("INFO", "jobs") == b"# Jobs\r\nregistered_jobs:0\r\nqueued_jobs:0\r\nwait_repl_jobs:0\r\n"
    c.close()


def test_blocking_getjob_across_owners(node2: NodeProc) -> None:
    qa, qb = queue_owned_by(0, prefix="a"), queue_owned_by(1, prefix="b")
    waiter = RawClient(node2.port)
    waiter.send(encode_command("GETJOB", "TIMEOUT", 20000, "FROM", qa, qb))
    producer = RawClient(node2.port)
    _wait_blocked(producer, 1)
    job_id = producer.call("ADDJOB", qb, "wake", 0)
    assert waiter.read() == [[qb.encode(), job_id.encode(), b"wake"]]
    # the waiter is gone from the other owner: a job there stays queued
    _wait_blocked(producer, 0)
    producer.call("ADDJOB", qa, "stays", 0)
    assert producer.call("QLEN", qa) == 1
    assert producer.call("SHOW", job_id)[5] == b"active"
    assert producer.call("SHOW", job_id)[19] == 0  # additional-deliveries
    waiter.close()
    producer.close()


def test_getjob_timeout_and_disconnect(node2: NodeProc) -> None:
    qa, qb = queue_owned_by(0, prefix="ta"), queue_owned_by(1, prefix="tb")
    c = RawClient(node2.port)
    assert c.call("GETJOB", "TIMEOUT", 50, "FROM", qa, qb) is NULL_ARRAY
    gone = RawClient(node2.port)
    gone.send(encode_command("GETJOB", "FROM", qb, qa))
    _wait_blocked(c, 1)
    gone.close()
    _wait_blocked(c, 0)
    c.call("ADDJOB", qb, "kept", 0)
    assert c.call("QLEN", qb) == 1
    # Blocked GETJOBs share a loop timer per due time (10 ms buckets below 10 s): each
    # is answered by a job or at its TIMEOUT, never before it, and a bucket emptied by
    # answered waiters answers no later GETJOB early.
    waiters = [RawClient(node2.port) for _ in range(3)]
    t0 = time.monotonic()
    for i, w in enumerate(waiters):
        w.send(encode_command("GETJOB", "TIMEOUT", 1500 + 10 * i, "FROM", qa))
    _wait_blocked(c, 3)
    job_id = c.call("ADDJOB", qa, "first", 0)
    answers = [w.read() for w in waiters]
    assert [a[0][1] for a in answers if a is not NULL_ARRAY] == [job_id.encode()]
    assert sum(a is NULL_ARRAY for a in answers) == 2
    assert time.monotonic() - t0 >= 1.5
    c.call("ACKJOB", job_id)
    for _ in range(20):
        c.call("ADDJOB", qa, "x", 0)
        [[_, jid, _]] = waiters[0].call("GETJOB", "TIMEOUT", 5000, "FROM", qa)
        waiters[0].call("ACKJOB", jid)
    t1 = time.monotonic()
    assert waiters[0].call("GETJOB", "TIMEOUT", 200, "FROM", qa) is NULL_ARRAY
    assert time.monotonic() - t1 >= 0.2
    for w in waiters:
        w.close()
    c.close()


def _wait_blocked(c: RawClient, n: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        text = c.call("INFO", "clients").decode()
        if f"blocked_clients:{n}\r\n" in text:
            return
        time.sleep(0.02)
    raise AssertionError(f"blocked_clients never reached {n}: {text}")


def test_pipelining_keeps_order(node2: NodeProc) -> None:
    qa, qb = queue_owned_by(0, prefix="pa"), queue_owned_by(1, prefix="pb")
    c = RawClient(node2.port)
    batch = []
    for i in range(50):
        q = qa if i % 2 else qb
        batch += [encode_command("ADDJOB", q, f"b{i}", 0), encode_command("QLEN", q),
                  encode_command("PING"), encode_command("NOSUCH")]
    batch.append(encode_command("INFO", "queues"))
    c.send(b"".join(batch))
    for i in range(50):
        assert isinstance(c.read(), Status)
        assert c.read() == i // 2 + 1
        assert c.read() == Status("PONG")
        assert c.read() == Err("ERR unknown command 'NOSUCH'")
    assert c.read() == b"# Queues\r\nregistered_queues:2\r\n"
    c.close()


def test_inline_commands(node: NodeProc) -> None:
    c = RawClient(node.port)
    c.send(b"PING\r\nADDJOB \"in line\" 'a b' 0\r\n\r\nQLEN \"in line\"\n")
    assert c.read() == Status("PONG")
    assert isinstance(c.read(), Status)
    assert c.read() == 1
    c.send(b"*1\r\n$4\r\nPING\r\nPING\r\n")
    assert c.read() == Status("PONG") and c.read() == Status("PONG")
    c.close()


def test_arity_unknown_and_errors(node: NodeProc) -> None:
    c = RawClient(node.port)
    assert c.call("ADDJOB", "q") == Err("ERR wrong number of arguments for 'addjob' command")
    assert c.call("addjob", "q", "x") == Err("ERR wrong number of arguments for 'addjob' command")
    assert c.call("FooBar") == Err("ERR unknown command 'FooBar'")
    assert c.call("CONFIG", "SET", "notaconfig", "1") == Err("ERR Unsupported CONFIG parameter: notaconfig")
    assert c.call("INFO", "nosuchsection") == b""
    assert c.call("CLUSTER", "MYID") == c.call("HELLO")[1]
    c.close()


def test_node_wide_commands(node2: NodeProc) -> None:
    a, b = connect_to_worker(node2.port, 0), connect_to_worker(node2.port, 1)
    assert a.call("CONFIG", "SET", "maxmemory-samples", "7") == Status("OK")
    assert b.call("CONFIG", "GET", "maxmemory-samples") == [b"maxmemory-samples", b"7"]
    assert b.call("CONFIG", "REWRITE") == Status("OK")
    assert "maxmemory-samples 7" in node2.conf_path.read_text()
    everything = b.call("CONFIG", "GET", "*")
    assert everything[:4] == [b"requirepass", b"", b"unixsocket", b""]
    sections = [line for line in a.call("INFO").decode().split("\r\n") if line.startswith("#")]
    assert sections == ["# Server", "# Clients", "# Memory", "# Jobs", "# Queues", "# Persistence",
                        "# Stats", "# CPU", "# Workers"]
    assert "# Commandstats\r\ncmdstat_" in a.call("INFO", "all").decode()
    assert a.call("CLIENT", "SETNAME", "alpha") == Status("OK")
    assert a.call("CLIENT", "GETNAME") == b"alpha"
    assert b.call("CLIENT", "GETNAME") is NULL_BULK
    listing = b.call("CLIENT", "LIST").decode()
    assert "name=alpha" in listing and listing.count("\n") >= 2
    assert a.call("CLIENT", "ID") != b.call("CLIENT", "ID")
    assert a.call("CLIENT", "SETINFO", "LIB-NAME", "redis-py") == Status("OK")
    assert a.call("COMMAND", "COUNT") == len(a.call("COMMAND"))
    secs, usecs = a.call("TIME")
    assert abs(int(secs) - time.time()) < 60 and 0 <= int(usecs) < 1_000_000
    for i in range(30):
        a.call("ADDJOB", f"flush{i}", "x", 0)
    assert a.call("DEBUG", "FLUSHALL") == Status("OK")
    assert b.call("INFO", "jobs") == b"# Jobs\r\nregistered_jobs:0\r\nqueued_jobs:0\r\nwait_repl_jobs:0\r\n"
    a.close()
    b.close()


def test_scan_cursors_cover_all_workers(node2: NodeProc) -> None:
    c = RawClient(node2.port)
    names = {f"scan{i}" for i in range(40)}
    ids = {c.call("ADDJOB", n, "x", 0) for n in names}
    seen, cursor, calls = set(), "0", 0
    while True:
        cursor, part = c.call("QSCAN", cursor, "COUNT", 3)
        seen |= {p.decode() for p in part}
        calls += 1
        if cursor == b"0":
            break
    assert seen == names and calls > 1
    cursor, jobs = c.call("JSCAN", "0", "BUSYLOOP")
    assert cursor == b"0" and set(jobs) == ids
    cursor, jobs = c.call("JSCAN", "BUSYLOOP", "QUEUE", "scan1", "REPLY", "all")
    assert len(jobs) == 1 and jobs[0][0] == b"id"
    c.close()


def test_auth(tmp_path: Path) -> None:
    n = NodeProc(tmp_path / "auth", workers=2, conf={"requirepass": "s3cret"}).start(wait=False)
    try:  # NodeProc.wait_ready pings without the password
        _wait_auth_ready(n)
        c = RawClient(n.port)
        assert c.call("ADDJOB", "q", "x", 0) == Err("NOAUTH Authentication required.")
        assert c.call("AUTH", "wrong") == Err("ERR invalid password")
        assert c.call("AUTH", "s3cret") == Status("OK")
        assert c.call("QLEN", "q") == 0
        c.close()
        c = RawClient(n.port)
        assert c.call("HELLO", "3").startswith("NOAUTH HELLO must be called")
        assert c.call("HELLO", "3", "AUTH", "default", "bad").startswith("WRONGPASS")
        assert c.call("HELLO", "3", "AUTH", "default", "s3cret")[b"proto"] == 3
        assert c.call("QLEN", "q") == 0
        c.close()
        r = redis.Redis(port=n.port, password="s3cret", socket_timeout=10)
        assert r.execute_command("QLEN", "q") == 0
        r.close()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=n.port, password="nope", socket_timeout=10).ping()
    finally:
        n.stop()


def _wait_auth_ready(n: NodeProc) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if redis.Redis(port=n.port, password="s3cret", socket_timeout=2).ping():
                return
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            time.sleep(0.05)
    raise AssertionError(n.output())


def test_connection_handoff(node2: NodeProc) -> None:
    c = connect_to_worker(node2.port, 0)
    q = queue_owned_by(1, prefix="h")
    for i in range(40):
        assert c.call("QLEN", q) == 0
        c.send(encode_command("ADDJOB", q, f"j{i}", 0) * 2)
        assert isinstance(c.read(), Status) and isinstance(c.read(), Status)
        assert c.call("QLEN", q) == 2
        assert len(c.call("GETJOB", "COUNT", 2, "FROM", q)) == 2
    assert worker_of(c) == 1
    c.call("CLIENT", "SETNAME", "moved")
    assert c.call("CLIENT", "GETNAME") == b"moved"
    assert "handed_off=1" in c.call("INFO", "workers").decode()
    c.close()


def test_shutdown_exits_zero(tmp_path: Path) -> None:
    n = NodeProc(tmp_path / "sd", workers=2).start()
    try:
        c = RawClient(n.port)
        c.send(encode_command("SHUTDOWN", "NOSAVE"))
        assert c.closed()
        assert n.proc is not None and n.proc.wait(timeout=20) == 0
    finally:
        n.stop()


def test_blocked_getjob_survives_owner_restart(node2: NodeProc) -> None:
    """The owner of the queue is SIGKILLed and restarted by the supervisor: the
    blocked GETJOB held by the other worker registers again and is served."""
    q = queue_owned_by(1, prefix="r")
    waiter = connect_to_worker(node2.port, 0)
    info = waiter.call("INFO", "workers").decode()
    pid1 = int(info.split("worker1:pid=")[1].split(",")[0])
    waiter.send(encode_command("GETJOB", "TIMEOUT", 30000, "FROM", q))
    control = connect_to_worker(node2.port, 0)
    _wait_blocked(control, 1)
    os.kill(pid1, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until the restarted worker 1 answers
        reply = control.call("INFO", "workers")  # an error while worker 1 is down
        text = reply.decode() if isinstance(reply, bytes) else ""
        if "worker1:pid=" in text and f"worker1:pid={pid1}," not in text:
            break
        time.sleep(0.05)
    job_id = control.call("ADDJOB", q, "after-restart", 0)
    assert waiter.read() == [[q.encode(), job_id.encode(), b"after-restart"]]
    waiter.close()
    control.close()


def test_idle_timeout_closes_idle_clients_only(tmp_path: Path) -> None:
    with NodeProc(tmp_path / "idle", workers=2, conf={"timeout": "1"}) as n:
        idle, blocked, busy = RawClient(n.port), RawClient(n.port), RawClient(n.port)
        assert idle.call("PING") == Status("PONG")
        blocked.send(encode_command("GETJOB", "FROM", "idleq"))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not idle.closed_now():
            assert busy.call("PING") == Status("PONG")
            time.sleep(0.2)
        assert idle.closed_now()
        job_id = busy.call("ADDJOB", "idleq", "x", 0)
        assert blocked.read() == [[b"idleq", job_id.encode(), b"x"]]


def test_consumer_connection_moves_to_its_queue_owner(node2: NodeProc) -> None:
    q = queue_owned_by(1, prefix="cons")
    producer = RawClient(node2.port)
    consumer = connect_to_worker(node2.port, 0)
    for i in range(20):
        job_id = producer.call("ADDJOB", q, f"c{i}", 0)
        assert consumer.call("GETJOB", "FROM", q) == [[q.encode(), job_id.encode(), f"c{i}".encode()]]
        assert consumer.call("ACKJOB", job_id) == 1
    assert worker_of(consumer) == 1
    producer.close()
    consumer.close()


@pytest.mark.parametrize("held_by", [0, 1])
def test_hot_command_shapes_match_the_general_path(node2: NodeProc, held_by: int) -> None:
    """ADDJOB/GETJOB/ACKJOB in their fast-path shapes (upper or lower case, queue owned
    by the connection's worker or not) answer as the general path (mixed case) does."""
    q = queue_owned_by(0, prefix="fast")
    c = connect_to_worker(node2.port, held_by)
    for addjob, getjob, ackjob in (("ADDJOB", "GETJOB", "ACKJOB"), ("addjob", "getjob", "ackjob"),
                                   ("AddJob", "GetJob", "AckJob")):
        ids = [c.call(addjob, q, f"b{i}", 0) for i in range(6)]
        assert all(isinstance(i, Status) for i in ids)
        assert c.call(getjob, "NOHANG", "FROM", q) == [[q.encode(), ids[0].encode(), b"b0"]]
        assert c.call(getjob, "FROM", q) == [[q.encode(), ids[1].encode(), b"b1"]]
        assert c.call(getjob, "COUNT", 1, "FROM", q) == [[q.encode(), ids[2].encode(), b"b2"]]
        assert c.call(getjob, "NOHANG", "COUNT", 1, "FROM", q) == [[q.encode(), ids[3].encode(), b"b3"]]
        assert c.call(getjob, "TIMEOUT", 100, "COUNT", 5, "FROM", q) == [
            [q.encode(), ids[4].encode(), b"b4"], [q.encode(), ids[5].encode(), b"b5"]]
        assert c.call(getjob, "NOHANG", "FROM", q) == NULL_ARRAY
        assert c.call(getjob, "TIMEOUT", 50, "FROM", q) == NULL_ARRAY
        assert c.call(getjob, "TIMEOUT", "x", "FROM", q) == Err("ERR timeout is not an integer or out of range")
        assert c.call(getjob, "COUNT", 0, "FROM", q) == Err("ERR COUNT must be a number greater than zero")
        assert c.call(getjob, "NOHANG", "COUNT", "x", "FROM", q) == Err("ERR value is not an integer or out of range")
        assert c.call(addjob, q, "x", "-1") == Err("ERR timeout is negative")
        assert c.call(ackjob, *ids) == 6
        assert c.call(ackjob, ids[0]) == 0
        assert c.call(ackjob, ids[0], "bad") == Err("BADID Invalid Job ID format.")
        assert c.call("QLEN", q) == 0
    other = queue_owned_by(1, prefix="fast")
    mixed = [c.call("ADDJOB", q, "m", 0), c.call("ADDJOB", other, "m", 0)]
    assert c.call("ACKJOB", *mixed) == 2  # split over both owners
    assert c.call("GETJOB", "NOHANG", "FROM", other) == NULL_ARRAY
    for fastack in ("FASTACK", "fastack", "FastAck"):
        ids = [c.call("ADDJOB", q, "f", 0) for _ in range(3)]
        assert c.call(fastack, *ids[:2]) == 2
        assert c.call(fastack, *ids[:2]) == 0
        assert c.call(fastack, ids[2], "bad") == Err("BADID Invalid Job ID format.")
        assert c.call("QLEN", q) == 1
        mixed = [ids[2], c.call("ADDJOB", other, "f", 0)]
        assert c.call(fastack, *mixed) == 2
        assert c.call("QLEN", q) == 0 and c.call("QLEN", other) == 0
    stats = c.call("INFO", "commandstats").decode()
    assert "cmdstat_ackjob:calls=" in stats and "cmdstat_fastack:calls=" in stats
    c.close()


@pytest.mark.parametrize("held_by", [0, 1])
def test_getjob_shapes_take_one_path(node2: NodeProc, held_by: int) -> None:
    """GETJOB of several queues of one owner, WITHCOUNTERS and odd spellings answer
    alike whether the connection's worker owns the queues (taken here) or not (NOHANG
    goes to the owner as RAW, a GETJOB that may block through the coordinator), in
    RESP2 and RESP3, and in the queues' order."""
    a, b = queue_owned_by(0, prefix="ga"), queue_owned_by(0, prefix="gb")
    c = connect_to_worker(node2.port, held_by)
    for resp3 in (False, True):
        if resp3:
            assert c.call("HELLO", 3)[b"proto"] == 3
        empty = None if resp3 else NULL_ARRAY
        for getjob, nohang, frm in (("GETJOB", "NOHANG", "FROM"), ("GetJob", "NoHang", "From")):
            ja, jb = c.call("ADDJOB", a, "x", 0), c.call("ADDJOB", b, "y", 0)
            assert c.call(getjob, nohang, "COUNT", 3, frm, b, a) == [
                [b.encode(), jb.encode(), b"y"], [a.encode(), ja.encode(), b"x"]]
            jc = c.call("ADDJOB", b, "z", 0)
            got = c.call(getjob, nohang, "WITHCOUNTERS", frm, a, b)
            assert len(got) == 1 and len(got[0]) == 7
            assert got[0][:4] == [b.encode(), jc.encode(), b"z", b"nacks"]
            jd = c.call("ADDJOB", a, "w", 0)
            assert c.call(getjob, "TIMEOUT", 1000, "WITHCOUNTERS", frm, b, a)[0][:3] == [
                a.encode(), jd.encode(), b"w"]
            assert c.call(getjob, nohang, frm, a, b) == empty
            assert c.call(getjob, "TIMEOUT", 30, frm, a, b) == empty
            assert c.call(getjob, nohang, "COUNT", 0, frm, a) == Err(
                "ERR COUNT must be a number greater than zero")
    c.close()


def test_pure_python_on_request(tmp_path: Path) -> None:
    """DISQUE_MP_PURE=1 runs the plain source even where the mypyc build sits beside
    it; INFO says which build serves, and both serve the same replies."""
    from disque_mp import compiled

    built = compiled.summary()
    with NodeProc(tmp_path / "pure", workers=2, env={"DISQUE_MP_PURE": "1"}) as n:
        c = RawClient(n.port)
        assert "shard_build:pure" in c.call("INFO", "workers").decode()
        job_id = c.call("ADDJOB", "pq", "body", 0)
        assert c.call("GETJOB", "NOHANG", "FROM", "pq") == [[b"pq", job_id.encode(), b"body"]]
        assert c.call("ACKJOB", job_id) == 1
        c.close()
    if os.environ.get("DISQUE_MP_PURE"):
        return  # the whole session is pure: nothing else to compare
    with NodeProc(tmp_path / "built", workers=1) as n:
        c = RawClient(n.port)
        assert f"shard_build:{built}" in c.call("INFO", "workers").decode()
        c.close()


def test_client_kill(node2: NodeProc) -> None:
    """CLIENT KILL old style (ip:port) and with filters, for connections held by
    either worker, from a connection held by the other."""
    admin = connect_to_worker(node2.port, 0)
    victims = [connect_to_worker(node2.port, i) for i in (0, 1, 1)]
    ids = [v.call("CLIENT", "ID") for v in victims]
    assert admin.call("CLIENT", "KILL", "ID", ids[1]) == 1  # held by the other worker
    assert victims[1].closed()
    assert admin.call("CLIENT", "KILL", "ID", ids[1]) == 0
    addr = next(line.split()[1].split("=", 1)[1] for line in
                admin.call("CLIENT", "LIST").decode().splitlines() if f"id={ids[2]} " in line)
    assert admin.call("CLIENT", "KILL", addr) == Status("OK")
    assert victims[2].closed()
    assert admin.call("CLIENT", "KILL", addr) == Err("ERR No such client")
    assert admin.call("CLIENT", "KILL", "TYPE", "pubsub") == 0
    assert admin.call("CLIENT", "KILL", "TYPE", "bogus") == Err("ERR Unknown client type 'bogus'")
    assert admin.call("CLIENT", "KILL", "ID", "x") == Err("ERR value is not an integer or out of range")
    assert admin.call("CLIENT", "KILL", "ID") == Err("ERR No such client")  # old style, as Redis
    assert admin.call("CLIENT", "KILL", "ID", "1", "TYPE") == Err("ERR syntax error")
    assert admin.call("CLIENT", "KILL", "NOPE", "1") == Err("ERR syntax error")
    # SKIPME yes (the default) spares the caller; every other client goes
    assert admin.call("CLIENT", "KILL", "TYPE", "normal") == 1
    assert victims[0].closed()
    assert admin.call("PING") == Status("PONG")
    # the caller itself: answered, then closed
    assert admin.call("CLIENT", "KILL", "ID", admin.call("CLIENT", "ID"), "SKIPME", "no") == 1
    assert admin.closed()


def test_slowlog(node2: NodeProc) -> None:
    """SLOWLOG over both workers' logs: threshold and length from CONFIG SET, entries
    newest first in Redis 3's shape, long arguments and long commands cut, RESET, LEN."""
    c0, c1 = connect_to_worker(node2.port, 0), connect_to_worker(node2.port, 1)
    assert c0.call("CONFIG", "SET", "slowlog-log-slower-than", "0") == Status("OK")
    assert c0.call("SLOWLOG", "RESET") == Status("OK")

    def both_log() -> bool:  # the threshold reaches each worker within a tick
        for _ in range(200):
            c0.call("PING", "from-worker-0")
            c1.call("PING", "from-worker-1")
            logged = {bytes(e[3][1]) for e in c0.call("SLOWLOG", "GET", 100)
                      if len(e[3]) == 2 and e[3][0] == b"PING"}
            if {b"from-worker-0", b"from-worker-1"} <= logged:
                return True
            time.sleep(0.02)
        return False

    assert both_log()
    assert c0.call("SLOWLOG", "LEN") >= 1
    assert c0.call("SLOWLOG", "RESET") == Status("OK")
    q = queue_owned_by(1, prefix="slow")
    c1.call("ADDJOB", q, "y" * 200, 0)
    ids = ["D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"] * 40
    c0.call("SHOW", ids[0])
    c0.call("ACKJOB", *ids)
    log = c0.call("SLOWLOG", "GET", 100)
    assert all(isinstance(e, list) and len(e) == 4 and isinstance(e[3], list) for e in log)
    assert [e[1] for e in log] == sorted((e[1] for e in log), reverse=True)
    assert len({e[0] for e in log}) == len(log)  # IDs unique over the node
    args = [e[3] for e in log]
    add = next(a for a in args if a[0] == b"ADDJOB")
    assert add == [b"ADDJOB", q.encode(), b"y" * 128 + b"... (72 more bytes)", b"0"]
    ack = next(a for a in args if a[0] == b"ACKJOB")
    assert len(ack) == 32 and ack[-1] == b"... (10 more arguments)"
    assert any(a[0] == b"SHOW" for a in args)
    assert len(c0.call("SLOWLOG", "GET", 1)) == 1
    assert c0.call("SLOWLOG", "GET", "x") == Err("ERR value is not an integer or out of range")
    assert c0.call("SLOWLOG", "NOPE") == Err(
        "ERR Unknown SLOWLOG subcommand or wrong # of args. Try GET, RESET, LEN.")
    assert c0.call("CONFIG", "SET", "slowlog-log-slower-than", "-1") == Status("OK")

    def quiet() -> bool:  # off once each worker's tick applied it: nothing new is logged
        c0.call("SLOWLOG", "RESET")
        c1.call("PING")
        return c0.call("SLOWLOG", "LEN") == 0

    wait_until(quiet, 10.0, "the slowlog turned off on every worker")
