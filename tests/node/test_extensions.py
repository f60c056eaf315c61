"""The extensions (docs/extensions.md) on real nodes: one node with two workers,
and three nodes joined with CLUSTER MEET where the semantics span nodes. Spoken
to with redis-py, redis-cli and the project's client."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from disque_mp.client import Disque
from disque_mp.client.aio import AsyncDisque
from tests.nodeproc import NodeProc, node_cluster, wait_until
from tests.nodeproc import unique_queue as _q
from workers.ids import owner_of_job_id

pytestmark = pytest.mark.integration

wait_s = 30.0
EXTENSIONS = ("waitjob", "globalqlen", "delqueue")


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with NodeProc(Path(tmp_path_factory.mktemp("ext-one")), workers=2) as n:
        yield n


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProc]]:
    with node_cluster(tmp_path_factory.mktemp("ext-three"), 3, workers=2,
                      node_timeout_ms=2000) as nodes:
        yield nodes


def _r(node: NodeProc) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=node.port, protocol=2, socket_timeout=20)


def _show(r: redis.Redis, jid: str) -> dict[str, Any]:
    reply = r.execute_command("SHOW", jid)
    return {k.decode(): v for k, v in zip(reply[::2], reply[1::2], strict=True)}


def _err(r: redis.Redis, *args: Any) -> str:
    with pytest.raises(redis.ResponseError) as exc:
        r.execute_command(*args)
    return str(exc.value)


def _two_owner_queues() -> tuple[str, str]:
    """Two queue names whose jobs land on different workers of a 2-worker node."""
    a = _q()
    from workers.ids import owner_of_queue
    while True:
        b = _q()
        if owner_of_queue(b.encode(), 2) != owner_of_queue(a.encode(), 2):
            return a, b


# ------------------------------------------------------------------ one node


def test_bad_arguments_get_clear_errors_and_the_connection_serves(one: NodeProc) -> None:
    r = _r(one)
    q = _q()
    jid = r.execute_command("ADDJOB", q, "x", 0).decode()
    assert _err(r, "NACK", jid, "DELAY", "-1") == "Delay time must be a non negative number"
    assert _err(r, "NACK", jid, "DELAY", "soon") == "Delay time must be a non negative number"
    assert _err(r, "NACK", jid, "DELAY", str(10**12)).startswith("DELAY time must be at most")
    assert _err(r, "ADDJOB", q, "x", 0, "MAXDELIVER", 0) == "MAXDELIVER must be between 1 and 10000"
    assert _err(r, "ADDJOB", q, "x", 0, "MAXDELIVER", 10001) == \
        "MAXDELIVER must be between 1 and 10000"
    assert _err(r, "WAITJOB", jid, "TIMEOUT", "-5") == "timeout is negative"
    assert _err(r, "WAITJOB", "nope") == "BADID Invalid Job ID format."
    assert _err(r, "DELQUEUE", q, "EVERYWHERE") == "syntax error"
    assert _err(r, "GLOBALQLEN").startswith("wrong number of arguments")
    assert r.execute_command("PING") in (b"PONG", True)
    assert r.execute_command("QLEN", q) == 1  # nothing above touched the job


def test_command_lists_the_extensions(one: NodeProc) -> None:
    r = _r(one)
    table = r.execute_command("COMMAND")  # redis-py: name -> details
    assert set(EXTENSIONS) | {"nack", "addjob"} <= set(table)
    assert [table[n]["arity"] for n in EXTENSIONS] == [-2, 2, -2]


def test_nack_delay_and_maxdeliver_on_one_node(one: NodeProc) -> None:
    r = _r(one)
    q = _q()
    jid = r.execute_command("ADDJOB", q, "x", 0, "RETRY", 60, "MAXDELIVER", 2).decode()
    assert r.execute_command("GETJOB", "NOHANG", "FROM", q)[0][1].decode() == jid
    assert r.execute_command("NACK", jid, "DELAY", 1) == 1
    assert r.execute_command("QLEN", q) == 0 and _show(r, jid)["state"] == b"active"
    wait_until(lambda: r.execute_command("QLEN", q) == 1, wait_s, "the NACK's delay to end")
    show = _show(r, jid)
    assert show["nacks"] == 1 and show["additional-deliveries"] == 0 and show["maxdeliver"] == 2
    r.execute_command("GETJOB", "NOHANG", "FROM", q)
    assert r.execute_command("NACK", jid) == 1  # second delivery: dead-lettered
    assert r.execute_command("QLEN", q) == 0 and r.execute_command("QLEN", "dead:" + q) == 1
    got = r.execute_command("GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "dead:" + q)[0]
    assert got[1].decode() == jid and got[4] == 2


def test_waitjob_over_both_workers(one: NodeProc) -> None:
    r = _r(one)
    qa, qb = _two_owner_queues()
    ids = [r.execute_command("ADDJOB", q, "x", 0).decode() for q in (qa, qb, qa, qb)]
    assert len({owner_of_job_id(i, 2) for i in ids}) == 2
    assert r.execute_command("WAITJOB", *ids, "TIMEOUT", 50) == 0
    r.execute_command("ACKJOB", ids[0])
    assert r.execute_command("WAITJOB", *ids, "TIMEOUT", 50) == 1
    timer = threading.Timer(0.3, lambda: _r(one).execute_command("ACKJOB", *ids[1:]))
    timer.start()
    try:
        assert r.execute_command("WAITJOB", *ids) == 4  # TIMEOUT 0: until done
    finally:
        timer.join()


def test_globalqlen_and_delqueue_alone_are_local(one: NodeProc) -> None:
    r = _r(one)
    q = _q()
    for _ in range(3):
        r.execute_command("ADDJOB", q, "x", 0)
    jid = r.execute_command("ADDJOB", q, "x", 0, "DELAY", 60).decode()
    assert r.execute_command("GLOBALQLEN", q) == 3
    assert r.execute_command("DELQUEUE", q) == 4  # queued and delayed
    assert r.execute_command("SHOW", jid) is None and r.execute_command("GLOBALQLEN", q) == 0


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli not installed")
def test_redis_cli_speaks_the_extensions(one: NodeProc) -> None:
    q = _q()
    cli = ["redis-cli", "-p", str(one.port)]
    jid = subprocess.run([*cli, "ADDJOB", q, "x", "0", "MAXDELIVER", "3"], capture_output=True,
                         text=True, timeout=20, check=True).stdout.strip()
    out = subprocess.run([*cli, "GLOBALQLEN", q], capture_output=True, text=True, timeout=20,
                         check=True).stdout.strip()
    assert out == "(integer) 1" or out == "1"
    out = subprocess.run([*cli, "WAITJOB", jid, "TIMEOUT", "10"], capture_output=True, text=True,
                         timeout=20, check=True).stdout.strip()
    assert out in ("(integer) 0", "0")
    out = subprocess.run([*cli, "DELQUEUE", q, "LOCAL"], capture_output=True, text=True,
                         timeout=20, check=True).stdout.strip()
    assert out in ("(integer) 1", "1")


def test_client_methods(one: NodeProc) -> None:
    q = _q()
    with Disque(f"127.0.0.1:{one.port}", socket_timeout=20) as d:
        jid = d.add_job(q, b"x", retry=60, maxdeliver=5)
        assert d.show(jid)["maxdeliver"] == 5  # type: ignore[index]
        job = d.get_job(q, nohang=True)
        assert job is not None and d.nack(job, delay=30) == 1
        assert d.qlen(q) == 0 and d.global_qlen(q) == 0
        assert d.wait_jobs(jid, timeout_ms=20) == 0
        assert d.del_queue(q, local=True) == 1
        assert d.wait_jobs(jid) == 1


# ------------------------------------------------------------------ three nodes


def test_globalqlen_sums_the_cluster(three: list[NodeProc]) -> None:
    q = _q()
    for i, n in enumerate(three):
        for _ in range(i + 1):
            _r(n).execute_command("ADDJOB", q, "x", 0, "REPLICATE", 1)
    for n in three:
        assert _r(n).execute_command("QLEN", q) <= 3
        assert _r(n).execute_command("GLOBALQLEN", q) == 6
    with Disque(f"127.0.0.1:{three[1].port}", socket_timeout=20) as d:
        assert d.global_qlen(q) == 6
    if shutil.which("redis-cli"):
        out = subprocess.run(["redis-cli", "-p", str(three[2].port), "GLOBALQLEN", q],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        assert out.strip() in ("6", "(integer) 6")


def test_nack_delay_no_copy_queues_it_earlier(three: list[NodeProc]) -> None:
    q = _q()
    a = _r(three[0])
    jid = a.execute_command("ADDJOB", q, "x", 0, "REPLICATE", 3, "RETRY", 1).decode()
    assert a.execute_command("GETJOB", "NOHANG", "FROM", q)[0][1].decode() == jid
    assert a.execute_command("NACK", jid, "DELAY", 4) == 1
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3.0:  # three RETRY periods: any copy would have queued it
        assert sum(_r(n).execute_command("QLEN", q) for n in three) == 0
        time.sleep(0.2)
    wait_until(lambda: sum(_r(n).execute_command("QLEN", q) for n in three) == 1, wait_s,
               "the job queued after the delay")
    assert all(_show(_r(n), jid)["nacks"] == 1 for n in three)


def test_maxdeliver_dead_letter_spans_the_copies(three: list[NodeProc]) -> None:
    q = _q()
    a = _r(three[0])
    jid = a.execute_command("ADDJOB", q, "x", 0, "REPLICATE", 3, "RETRY", 60,
                            "MAXDELIVER", 1).decode()
    for n in three:
        assert _show(_r(n), jid)["maxdeliver"] == 1  # REPLJOB carried it
    a.execute_command("GETJOB", "NOHANG", "FROM", q)
    a.execute_command("NACK", jid)
    wait_until(lambda: all(_show(_r(n), jid)["queue"] == ("dead:" + q).encode() for n in three),
               wait_s, "every copy in the dead-letter queue")
    assert a.execute_command("GLOBALQLEN", "dead:" + q) == 1


def test_waitjob_ends_on_an_ack_elsewhere(three: list[NodeProc]) -> None:
    q = _q()
    a, b = _r(three[0]), _r(three[1])
    ids = [a.execute_command("ADDJOB", q, "x", 0, "REPLICATE", 2).decode() for _ in range(3)]
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(_r(three[0]).execute_command(
        "WAITJOB", *ids, "TIMEOUT", 20_000)))
    t.start()
    try:
        time.sleep(0.2)
        b.execute_command("ACKJOB", *ids)  # b may hold no copy: the ACK still spreads
    finally:
        t.join(30)
    assert result == [3]


def test_delqueue_removes_every_copy_cluster_wide(three: list[NodeProc]) -> None:
    q = _q()
    a, c = _r(three[0]), _r(three[2])
    ids = [a.execute_command("ADDJOB", q, "x", 0, "REPLICATE", 3, "RETRY", 1).decode()
           for _ in range(3)]
    ids.append(c.execute_command("ADDJOB", q, "x", 0, "REPLICATE", 1).decode())
    a.execute_command("GETJOB", "NOHANG", "FROM", q)  # one active
    with Disque(f"127.0.0.1:{three[0].port}", socket_timeout=20) as d:
        assert d.del_queue(q) == 4
    time.sleep(2.5)  # past RETRY: a copy left anywhere would be queued again
    for n in three:
        r = _r(n)
        assert r.execute_command("QLEN", q) == 0
        assert all(r.execute_command("SHOW", j) in (None,) or _show(r, j)["state"] == b"acked"
                   for j in ids)


def test_async_client_methods(one: NodeProc) -> None:
    async def go() -> None:
        q = _q()
        d = AsyncDisque(f"127.0.0.1:{one.port}", socket_timeout=20)
        try:
            jid = await d.add_job(q, b"x", retry=60, maxdeliver=1)
            job = await d.get_job(q, nohang=True)
            assert job is not None and await d.nack(job, delay=0) == 1
            assert await d.qlen("dead:" + q) == 1 and await d.global_qlen("dead:" + q) == 1
            assert await d.wait_jobs(jid, timeout_ms=10) == 0
            assert await d.del_queue("dead:" + q) == 1
            assert await d.wait_jobs(jid) == 1
        finally:
            await d.aclose()

    asyncio.run(go())


def test_maxdeliver_and_nack_delay_survive_a_restart(tmp_path: Path) -> None:
    """The AOF keeps the cap (a version 2 record), the dead letter's queue and a
    NACK's pending delay; jobs without the extension keep version 1 records."""
    q = _q()
    with NodeProc(tmp_path / "aof", workers=1, conf={"appendonly": "yes",
                                                     "appendfsync": "always"}) as n:
        r = _r(n)
        plain = r.execute_command("ADDJOB", q, "x", 0).decode()
        dead = r.execute_command("ADDJOB", q, "x", 0, "RETRY", 60, "MAXDELIVER", 1).decode()
        later = r.execute_command("ADDJOB", q, "x", 0, "RETRY", 60, "MAXDELIVER", 9).decode()
        taken = {j[1].decode() for j in r.execute_command("GETJOB", "COUNT", 3, "FROM", q)}
        assert taken == {plain, dead, later}
        assert r.execute_command("NACK", dead) == 1
        assert r.execute_command("NACK", later, "DELAY", 600) == 1
        n.restart()
        r = _r(n)
        assert b"maxdeliver" not in _show(r, plain)
        show = _show(r, dead)
        assert show["queue"] == ("dead:" + q).encode() and show["maxdeliver"] == 1
        show = _show(r, later)
        assert show["maxdeliver"] == 9 and show["nacks"] == 1 and show["state"] == b"active"
        assert show["next-requeue-within"] > 500_000  # still waiting for the delay (ms)
        # queued before the restart: active now, queued again after RETRY (the AOF
        # load rule, docs/persistence.md), into the dead-letter queue


# ------------------------------------------------------------------ DEDUP (idempotent adds)


def _stat(r: redis.Redis, name: str) -> int:
    return int(r.info("stats")[name])


def test_dedup_on_one_node_from_redis_py_cli_and_the_clients(one: NodeProc) -> None:
    r = _r(one)
    q = _q()
    hits = _stat(r, "dedup_hits")
    jid = r.execute_command("ADDJOB", q, "x", 0, "DEDUP", "order-1").decode()
    assert r.execute_command("ADDJOB", q, "y", 0, "RETRY", 5, "DEDUP", "order-1").decode() == jid
    assert r.execute_command("QLEN", q) == 1 and _show(r, jid)["dedup"] == b"order-1"
    assert _stat(r, "dedup_hits") == hits + 1 and _stat(r, "dedup_keys") >= 1
    if shutil.which("redis-cli") is not None:
        out = subprocess.run(["redis-cli", "-p", str(one.port), "ADDJOB", q, "z", "0",
                              "DEDUP", "order-1"], capture_output=True, text=True, timeout=20,
                             check=True).stdout.strip()
        assert out == jid
    with Disque(f"127.0.0.1:{one.port}", socket_timeout=20) as d:
        assert d.add_job(q, b"w", dedup="order-1") == jid
        assert d.ack(jid) == 1
        fresh = d.add_job(q, b"w", dedup="order-1")  # acknowledged: the key is free
        assert fresh != jid and d.qlen(q) == 1

    async def go() -> None:
        a = AsyncDisque(f"127.0.0.1:{one.port}", socket_timeout=20)
        try:
            assert await a.add_job(q, b"v", dedup=b"order-1") == fresh
        finally:
            await a.aclose()

    asyncio.run(go())
    assert _err(r, "ADDJOB", q, "x", 0, "DEDUP", "k" * 257) == "DEDUP key must be 1 to 256 bytes"
    assert r.execute_command("CONFIG", "GET", "dedup-keys-max") == [b"dedup-keys-max", b"1000000"]
    assert _err(r, "CONFIG", "SET", "dedup-keys-max", "0") == \
        "Invalid argument '0' for CONFIG SET 'dedup-keys-max'"
    assert r.execute_command("DELJOB", fresh) == 1


def test_dedup_keys_max_forgets_the_oldest_key(one: NodeProc) -> None:
    r = _r(one)
    q = _q()
    forgotten = _stat(r, "dedup_keys_forgotten")
    keys = _stat(r, "dedup_keys")
    assert r.execute_command("CONFIG", "SET", "dedup-keys-max", 1) == b"OK"
    try:
        first = r.execute_command("ADDJOB", q, "x", 0, "DEDUP", "a").decode()
        r.execute_command("ADDJOB", q, "x", 0, "DEDUP", "b")  # same worker: forgets a
        assert r.execute_command("ADDJOB", q, "x", 0, "DEDUP", "a").decode() != first
        assert r.execute_command("QLEN", q) == 3
        assert _stat(r, "dedup_keys_forgotten") >= forgotten + 2
    finally:
        assert r.execute_command("CONFIG", "SET", "dedup-keys-max", 1_000_000) == b"OK"
    r.execute_command("DELQUEUE", q)
    assert _stat(r, "dedup_keys") <= keys


def test_dedup_a_resend_to_a_node_with_a_copy_answers_the_same_id(
        three: list[NodeProc]) -> None:
    q = _q()
    rs = [_r(n) for n in three]
    jid = rs[0].execute_command("ADDJOB", q, "x", 0, "REPLICATE", 2, "DEDUP", "pay-9").decode()
    holders = [i for i, r in enumerate(rs) if r.execute_command("SHOW", jid)]
    assert len(holders) == 2 and 0 in holders
    copy = next(i for i in holders if i != 0)
    other = next(i for i in range(3) if i not in holders)
    # the producer timed out and re-sends, to the same node or to the one with a copy
    assert rs[0].execute_command("ADDJOB", q, "x", 0, "DEDUP", "pay-9").decode() == jid
    assert rs[copy].execute_command("ADDJOB", q, "x", 0, "DEDUP", "pay-9").decode() == jid
    assert sum(r.execute_command("QLEN", q) for r in rs) == 1
    # a node with no copy cannot know the key (best effort across nodes)
    elsewhere = rs[other].execute_command("ADDJOB", q, "x", 0, "REPLICATE", 1,
                                          "DEDUP", "pay-9").decode()
    assert elsewhere != jid
    rs[other].execute_command("DELJOB", elsewhere)
    # once acknowledged, every holder frees the key
    assert rs[0].execute_command("ACKJOB", jid) == 1
    wait_until(lambda: not any(r.execute_command("SHOW", jid) for r in rs), wait_s,
               "the acknowledged job gone from every node")
    again = rs[copy].execute_command("ADDJOB", q, "x", 0, "REPLICATE", 2, "DEDUP", "pay-9")
    assert again.decode() != jid
    rs[copy].execute_command("DELQUEUE", q)
# ------------------------------------------------------------------ dead letters you act on


def _cli(node: NodeProc, *args: str) -> str:
    return subprocess.run(["redis-cli", "-p", str(node.port), *args], capture_output=True,
                          text=True, timeout=20, check=True).stdout.strip()


def test_deadletter_and_redrive_raw_on_one_node(one: NodeProc) -> None:
    r = _r(one)
    qa, qb = _two_owner_queues()
    ids = [r.execute_command("ADDJOB", q, "x", 0, "RETRY", 60, "MAXDELIVER", 3).decode()
           for q in (qa, qb, qa)]
    assert len({owner_of_job_id(i, 2) for i in ids}) == 2  # split by owner, counts merged
    assert r.execute_command("GETJOB", "NOHANG", "FROM", qa)[0][1].decode() == ids[0]
    r.execute_command("NACK", ids[0])  # nacks 1, kept by the move
    assert r.execute_command("DEADLETTER", *ids, "REASON", "bad payload: é") == 3
    assert r.execute_command("DEADLETTER", *ids, "REASON", "again") == 0  # already dead
    assert r.execute_command("QLEN", qa) == 0 and r.execute_command("QLEN", "dead:" + qa) == 2
    show = _show(r, ids[0])
    assert show["queue"] == ("dead:" + qa).encode() and show["nacks"] == 1
    assert show["dead-reason"] == "bad payload: é".encode() and show["maxdeliver"] == 3
    assert r.execute_command("REDRIVE", "dead:" + qa, "COUNT", 1) == 1  # the oldest
    assert r.execute_command("QLEN", qa) == 1 and _show(r, ids[0])["queue"] == qa.encode()
    back = _show(r, ids[0])
    assert back["nacks"] == 0 and "dead-reason" not in back and back["retry"] == 60
    assert r.execute_command("REDRIVE", "dead:" + qa) == 1 and r.execute_command("QLEN", qa) == 2
    assert r.execute_command("REDRIVE", "dead:" + qb) == 1
    assert r.execute_command("REDRIVE", "dead:" + qb) == 0
    # ID: those jobs only, routed by the queue (a dead letter has its queue's slot)
    more = [r.execute_command("ADDJOB", qa, "y", 0).decode() for _ in range(2)]
    assert r.execute_command("DEADLETTER", *more) == 2
    assert r.execute_command("REDRIVE", "dead:" + qa, "ID", more[1], ids[1]) == 1
    assert _show(r, more[1])["queue"] == qa.encode()
    assert _show(r, more[0])["queue"] == ("dead:" + qa).encode()
    assert _err(r, "REDRIVE", "dead:" + qa, "ID", "nope") == "BADID Invalid Job ID format."


def test_deadletter_and_redrive_errors_and_command(one: NodeProc) -> None:
    r = _r(one)
    q = _q()
    jid = r.execute_command("ADDJOB", q, "x", 0).decode()
    assert _err(r, "DEADLETTER", jid, "REASON", "x" * 1025) == \
        "REASON must be at most 1024 bytes"
    assert _err(r, "DEADLETTER", "nope") == "BADID Invalid Job ID format."
    assert _err(r, "DEADLETTER").startswith("wrong number of arguments")
    assert _err(r, "REDRIVE", q).startswith("REDRIVE takes a dead-letter queue")
    assert _err(r, "REDRIVE", "dead:" + q, "COUNT", 0) == "COUNT must be a number greater than zero"
    assert _err(r, "REDRIVE", "dead:" + q, "COUNT", "many").startswith("value is not an integer")
    assert _err(r, "REDRIVE", "dead:" + q, "LIMIT", 3) == "syntax error"
    assert r.execute_command("QLEN", q) == 1  # nothing above touched the job
    table = r.execute_command("COMMAND")
    assert table["deadletter"]["arity"] == -2 and table["redrive"]["arity"] == -2


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli not installed")
def test_redis_cli_deadletter_and_redrive(one: NodeProc) -> None:
    q = _q()
    jid = _cli(one, "ADDJOB", q, "x", "0")
    assert _cli(one, "DEADLETTER", jid, "REASON", "by hand") in ("(integer) 1", "1")
    assert _cli(one, "QLEN", "dead:" + q) in ("(integer) 1", "1")
    assert _cli(one, "REDRIVE", "dead:" + q, "COUNT", "10") in ("(integer) 1", "1")
    assert _cli(one, "QLEN", q) in ("(integer) 1", "1")


def test_client_dead_letter_and_redrive(one: NodeProc) -> None:
    q = _q()
    with Disque(f"127.0.0.1:{one.port}", socket_timeout=20) as d:
        jid = d.add_job(q, b"x", retry=60)
        assert d.dead_letter(jid, reason="no handler") == 1
        assert d.show(jid)["dead-reason"] == "no handler"  # type: ignore[index]
        assert d.redrive("dead:" + q) == 1 and d.qlen(q) == 1

    async def go() -> None:
        d = AsyncDisque(f"127.0.0.1:{one.port}", socket_timeout=20)
        try:
            assert await d.dead_letter(jid) == 1 and await d.qlen("dead:" + q) == 1
            assert await d.redrive("dead:" + q, count=5) == 1 and await d.qlen(q) == 1
        finally:
            await d.aclose()

    asyncio.run(go())


def test_deadletter_and_redrive_every_copy_follows(three: list[NodeProc]) -> None:
    q = _q()
    a = _r(three[0])
    jid = a.execute_command("ADDJOB", q, "x", 0, "REPLICATE", 3, "RETRY", 60,
                            "MAXDELIVER", 5).decode()
    a.execute_command("GETJOB", "NOHANG", "FROM", q)
    a.execute_command("NACK", jid)
    wait_until(lambda: all(_show(_r(n), jid)["nacks"] == 1 for n in three), wait_s,
               "every copy counted the NACK")
    holder = next(n for n in three if _r(n).execute_command("QLEN", q) == 1)
    assert _r(holder).execute_command("DEADLETTER", jid, "REASON", "poison") == 1
    wait_until(lambda: all(_show(_r(n), jid)["queue"] == ("dead:" + q).encode()
                           and _show(_r(n), jid).get("dead-reason") == b"poison"
                           for n in three), wait_s, "every copy dead-lettered with its reason")
    assert sum(_r(n).execute_command("QLEN", "dead:" + q) for n in three) == 1
    assert a.execute_command("GLOBALQLEN", q) == 0
    with Disque(f"127.0.0.1:{holder.port}", socket_timeout=20) as d:
        assert d.redrive("dead:" + q) == 1
    wait_until(lambda: all(_show(_r(n), jid)["queue"] == q.encode()
                           and "dead-reason" not in _show(_r(n), jid)
                           and _show(_r(n), jid)["nacks"] == 0 for n in three),
               wait_s, "every copy back in its queue, counters reset")
    assert a.execute_command("GLOBALQLEN", q) == 1
    assert a.execute_command("GLOBALQLEN", "dead:" + q) == 0


# ------------------------------------------------------------------ fair tenants (GROUP)


def _pairs(reply: list[Any]) -> dict[str, Any]:
    return {k.decode(): v for k, v in zip(reply[::2], reply[1::2], strict=True)}


def test_groups_rotate_and_qstat_qgroups_command_show_them(one: NodeProc) -> None:
    r = _r(one)
    q = _q("fair")
    for i in range(20):
        r.execute_command("ADDJOB", q, f"a{i}", 0, "GROUP", "A")
    b_ids = [r.execute_command("ADDJOB", q, f"b{i}", 0, "GROUP", "B").decode() for i in range(3)]
    for i in range(2):
        r.execute_command("ADDJOB", q, f"p{i}", 0)
    assert _show(r, b_ids[0])["group"] == b"B"
    assert _pairs(r.execute_command("QSTAT", q))["groups"] == 3
    assert r.execute_command("QGROUPS", q) == [[b"A", 20], [b"B", 3], [b"", 2]]
    assert r.execute_command("QGROUPS", q, "count", 1) == [[b"A", 20]]
    assert r.execute_command("QGROUPS", _q()) == []
    got = [e[2] for e in r.execute_command("GETJOB", "NOHANG", "COUNT", 7, "FROM", q)]
    assert got == [b"a0", b"b0", b"p0", b"a1", b"b1", b"p1", b"a2"]
    assert _err(r, "QGROUPS", q, "COUNT", "many") == "value is not an integer or out of range"
    assert _err(r, "QGROUPS", q, "LIMIT", 1) == "syntax error"
    assert _err(r, "QGROUPS").startswith("wrong number of arguments")
    assert _err(r, "ADDJOB", q, "x", 0, "GROUP", "").startswith("GROUP name must be")
    table = r.execute_command("COMMAND")
    assert table["qgroups"]["arity"] == -2
    if shutil.which("redis-cli"):
        out = subprocess.run(["redis-cli", "-p", str(one.port), "QGROUPS", q], text=True,
                             capture_output=True, timeout=20, check=True).stdout.split()
        assert out == ["A", "17", "B", "1"], out


def test_group_client_methods(one: NodeProc) -> None:
    q = _q("fair")
    with Disque(f"127.0.0.1:{one.port}", socket_timeout=20) as d:
        d.add_job(q, b"x", group="tenant-1")
        d.add_job(q, b"y", group=b"tenant-2")
        d.add_job(q, b"z", group="tenant-2")
        assert d.qgroups(q) == [("tenant-2", 2), ("tenant-1", 1)]
        assert d.qgroups(q, count=1) == [("tenant-2", 2)]
        assert d.qstat(q)["groups"] == 2  # type: ignore[index]

    async def go() -> None:
        d = AsyncDisque(f"127.0.0.1:{one.port}", socket_timeout=20)
        try:
            await d.add_job(q, b"w")
            assert await d.qgroups(q, count=5) == [("tenant-2", 2), ("", 1), ("tenant-1", 1)]
        finally:
            await d.aclose()

    asyncio.run(go())


def test_groups_travel_by_federation_and_rotate_on_the_importer(three: list[NodeProc]) -> None:
    """A's jobs queued on one node, B's few after them; a consumer on another node
    imports them (NEEDJOBS / YOURJOBS): the copies keep their group and B's jobs come
    early, not after A's backlog."""
    src, dst, _ = three
    q = _q("fair")
    rs, rd = _r(src), _r(dst)
    for i in range(60):
        rs.execute_command("ADDJOB", q, f"a{i}", 0, "REPLICATE", 1, "GROUP", "A")
    b_ids = [rs.execute_command("ADDJOB", q, f"b{i}", 0, "REPLICATE", 1, "GROUP", "B").decode()
             for i in range(5)]
    got: list[bytes] = []
    for _ in range(200):  # bounded: GETJOB waits up to 1 s each
        reply = rd.execute_command("GETJOB", "TIMEOUT", 1000, "COUNT", 10, "FROM", q)
        for e in reply or []:
            if e[1].decode() == b_ids[0]:
                assert _show(rd, b_ids[0])["group"] == b"B"  # the copy carries it
            got.append(e[2])
            rd.execute_command("ACKJOB", e[1])
        if len(got) >= 65:
            break
    assert len(got) == 65, got
    last_b = max(i for i, body in enumerate(got) if body.startswith(b"b"))
    assert last_b < 30, got
