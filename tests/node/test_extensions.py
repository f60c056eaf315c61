"""The extensions (docs/extensions.md) on real nodes: one node with two workers,
and three nodes joined with CLUSTER MEET where the semantics span nodes. Spoken
to with redis-py, redis-cli and the project's client."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
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


# ------------------------------------------------------------------ results, progress, DEDUP-KEEP


def test_result_progress_and_their_errors_on_one_node(one: NodeProc) -> None:
    r = _r(one)
    q = _q()
    jid = r.execute_command("ADDJOB", q, "x", 0, "RETRY", 60).decode()
    assert r.execute_command("RESULT", jid) is None  # queued, no progress
    r.execute_command("GETJOB", "FROM", q)
    assert r.execute_command("WORKING", jid, "PROGRESS", "40%") == 60
    assert _show(r, jid)["progress"] == b"40%"
    assert r.execute_command("RESULT", jid) == [b"progress", b"40%"]
    assert r.execute_command("RESULT", jid, "TIMEOUT", 100) == [b"progress", b"40%"]
    # bad input: a clear error, nothing changed
    assert _err(r, "RESULT", "nope") == "BADID Invalid Job ID format."
    assert _err(r, "RESULT", jid, jid) == "RESULT takes exactly one job ID"
    other = r.execute_command("ADDJOB", _two_owner_queues()[0], "x", 0).decode()
    assert _err(r, "RESULT", jid, other) == "RESULT takes exactly one job ID"
    assert _err(r, "ACKJOB", jid, other, "RESULT", "v") == \
        "ACKJOB ... RESULT takes exactly one job ID"
    assert _err(r, "RESULT", jid, "TIMEOUT", "-1") == "timeout is negative"
    assert _err(r, "RESULT", "D-00000000-wOGMXiTRcfClcTt6WDuzWlmo-05a1") == \
        "unknown job ID: no node of this cluster created it"
    assert _err(r, "WORKING", jid, other).startswith("wrong number of arguments")
    assert r.execute_command("CONFIG", "SET", "result-bytes-max", 4) == b"OK"
    assert r.execute_command("CONFIG", "SET", "progress-bytes-max", 2) == b"OK"
    try:
        assert _err(r, "ACKJOB", jid, "RESULT", "12345") == \
            "RESULT value too large (at most 4 bytes: result-bytes-max)"
        assert _err(r, "WORKING", jid, "PROGRESS", "123") == \
            "PROGRESS value too large (at most 2 bytes: progress-bytes-max)"
    finally:
        r.execute_command("CONFIG", "SET", "result-bytes-max", 1 << 20)
        r.execute_command("CONFIG", "SET", "progress-bytes-max", 4096)
    assert _err(r, "CONFIG", "SET", "result-ttl", "0").startswith("Invalid argument")
    assert _show(r, jid)["state"] == b"active" and _show(r, jid)["progress"] == b"40%"
    # a RESULT waiting on the job answers when it is acknowledged with its result
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(_r(one).execute_command(
        "RESULT", jid, "TIMEOUT", 20_000)))
    t.start()
    try:
        time.sleep(0.2)
        assert r.execute_command("ACKJOB", jid, "RESULT", "done") == 1
    finally:
        t.join(30)
    assert got == [b"done"]
    assert r.execute_command("RESULT", jid) == b"done"
    assert r.execute_command("SHOW", jid) is None
    assert int(r.info("stats")["results"]) >= 1
    r.execute_command("DELJOB", other)


def test_result_client_methods_and_dedup_keep(one: NodeProc) -> None:
    from disque_mp.client import Progress

    q = _q()
    with Disque(f"127.0.0.1:{one.port}", socket_timeout=20) as d:
        jid = d.add_job(q, b"x", retry=60, dedup="k-1", dedup_keep=30)
        (job,) = d.get_jobs(q, count=1)
        assert d.working(job, progress=b"half") == 60
        assert d.result(jid) == Progress(b"half")
        with pytest.raises(ValueError):
            d.ack(jid, jid, result=b"no")
        assert d.ack(job, result=b"\x00binary") == 1
        assert d.result(jid, timeout_ms=1000) == b"\x00binary"
        # the key keeps answering after the ACK: a re-send adds nothing
        assert d.add_job(q, b"x", dedup="k-1", dedup_keep=30) == jid and d.qlen(q) == 0
        assert d.show(jid) is None

    async def go() -> None:
        a = AsyncDisque(f"127.0.0.1:{one.port}", socket_timeout=20)
        try:
            assert await a.result(jid) == b"\x00binary"
            j2 = await a.add_job(q, b"y", retry=60)
            (job2,) = await a.get_jobs(q, count=1)
            assert await a.working(job2, progress="p") == 60
            assert await a.result(j2) == Progress(b"p")
            assert await a.ack(job2, result="ok") == 1
            assert await a.result(j2, timeout_ms=0) == b"ok"
        finally:
            await a.aclose()

    asyncio.run(go())
    r = _r(one)
    assert _err(r, "ADDJOB", q, "x", 0, "DEDUP-KEEP", 5) == "DEDUP-KEEP needs a DEDUP key"
    assert _err(r, "ADDJOB", q, "x", 0, "DEDUP", "a", "DEDUP-KEEP", 0).startswith(
        "DEDUP-KEEP must be between 1 and")
    assert r.execute_command("CONFIG", "SET", "dedup-keep-max", 60) == b"OK"
    try:
        assert _err(r, "ADDJOB", q, "x", 0, "DEDUP", "a", "DEDUP-KEEP", 61) == \
            "DEDUP-KEEP must be between 1 and 60 seconds (dedup-keep-max)"
    finally:
        r.execute_command("CONFIG", "SET", "dedup-keep-max", 604800)
    assert r.execute_command("QLEN", q) == 0


def test_the_result_travels_with_the_ack_and_others_ask(three: list[NodeProc]) -> None:
    q = _q()
    rs = [_r(n) for n in three]
    jid = rs[0].execute_command("ADDJOB", q, "x", 0, "REPLICATE", 2).decode()
    holders = [i for i, r in enumerate(rs) if r.execute_command("SHOW", jid)]
    other = next(i for i in range(3) if i not in holders)
    rs[0].execute_command("GETJOB", "FROM", q)
    # acknowledged on the node that holds no copy: the ACK and its result spread
    assert rs[other].execute_command("ACKJOB", jid, "RESULT", "42") == 0
    wait_until(lambda: not any(r.execute_command("SHOW", jid) for r in rs), wait_s,
               "the acknowledged job gone from every node")
    for r in rs:  # the holders got it with the SETACK, the other one stored it
        assert r.execute_command("RESULT", jid) == b"42"
    # a node that never held a job asks the others
    j2 = rs[0].execute_command("ADDJOB", q, "y", 0, "REPLICATE", 2).decode()
    holders = [i for i, r in enumerate(rs) if r.execute_command("SHOW", j2)]
    outsider = next(i for i in range(3) if i not in holders)
    (entry,) = rs[holders[0]].execute_command("GETJOB", "FROM", q)
    assert entry[1].decode() == j2
    rs[holders[0]].execute_command("WORKING", j2, "PROGRESS", "p1")
    assert rs[outsider].execute_command("RESULT", j2) == [b"progress", b"p1"]
    assert rs[holders[0]].execute_command("ACKJOB", j2, "RESULT", "r2") == 1
    wait_until(lambda: rs[outsider].execute_command("RESULT", j2) == b"r2", wait_s,
               "the result answered on the node that never held the job")


def test_results_survive_a_restart_with_the_aof(tmp_path: Path) -> None:
    q = _q()
    with NodeProc(tmp_path / "aof", workers=2, conf={"appendonly": "yes",
                                                     "appendfsync": "always"}) as n:
        r = _r(n)
        ids = [r.execute_command("ADDJOB", q, f"x{i}", 0).decode() for i in range(4)]
        for i, jid in enumerate(ids):
            assert r.execute_command("ACKJOB", jid, "RESULT", f"r{i}") == 1
        kept = r.execute_command("ADDJOB", q, "k", 0, "DEDUP", "z", "DEDUP-KEEP", 600).decode()
        n.restart()
        r = _r(n)
        assert [r.execute_command("RESULT", jid) for jid in ids] == [b"r0", b"r1", b"r2", b"r3"]
        assert _show(r, kept)["dedup"] == b"z"  # the DEDUP-KEEP job (record version 5)
        assert r.execute_command("ADDJOB", q, "k", 0, "DEDUP", "z").decode() == kept
        assert r.execute_command("BGREWRITEAOF")
        wait_until(lambda: r.info("persistence")["aof_rewrite_in_progress"] == 0, wait_s,
                   "the rewrite done")
        n.restart()
        r = _r(n)
        assert [r.execute_command("RESULT", jid) for jid in ids] == [b"r0", b"r1", b"r2", b"r3"]


# ------------------------------------------------------------------ PRIORITY


def test_priority_orders_getjob_and_shows_in_show_and_qstat(one: NodeProc) -> None:
    """Highest priority first, then groups in rotation within a priority, then age;
    SHOW lists ``priority``, QSTAT ``priorities``; a plain job's replies are the
    reference's; a bad PRIORITY is an ERR and adds nothing."""
    r = _r(one)
    q = _q("prio")
    plain = [r.execute_command("ADDJOB", q, f"p{i}", 0).decode() for i in range(3)]
    assert "priority" not in _show(r, plain[0]) and "priorities" not in _pairs(
        r.execute_command("QSTAT", q))
    high = [r.execute_command("ADDJOB", q, f"h{g}{i}", 0, "PRIORITY", 9, "GROUP", g).decode()
            for g in ("A", "A", "B") for i in range(1)]
    mid = r.execute_command("ADDJOB", q, "m", 0, "priority", "4").decode()
    zero = r.execute_command("ADDJOB", q, "z", 0, "PRIORITY", 0).decode()
    assert _show(r, high[0])["priority"] == 9 and _show(r, mid)["priority"] == 4
    assert "priority" not in _show(r, zero)
    assert _pairs(r.execute_command("QSTAT", q))["priorities"] == [9, 3, 4, 1, 0, 4]
    for bad in ("10", "-1", "x", "2.5"):
        assert _err(r, "ADDJOB", q, "x", 0, "PRIORITY", bad) == \
            "PRIORITY must be an integer from 0 to 9"
    assert r.execute_command("QLEN", q) == 8
    got = r.execute_command("GETJOB", "COUNT", 8, "FROM", q)
    assert [e[2] for e in got] == [b"hA0", b"hB0", b"hA0", b"m", b"p0", b"p1", b"p2", b"z"]
    r.execute_command("ACKJOB", *[e[1] for e in got])
    assert "priorities" not in _pairs(r.execute_command("QSTAT", q))


def test_priority_client_methods(one: NodeProc) -> None:
    q = _q("prio")
    with Disque(f"127.0.0.1:{one.port}", socket_timeout=20) as d:
        d.add_job(q, b"low")
        jid = d.add_job(q, b"high", priority=7)
        d.add_job(q, b"none", priority=0)
        assert (d.show(jid) or {})["priority"] == 7
        assert [j.body for j in d.get_jobs(q, count=1, nohang=True)] == [b"high"]

    async def go() -> None:
        d = AsyncDisque(f"127.0.0.1:{one.port}", socket_timeout=20)
        try:
            await d.add_job(q, b"async-high", priority=9)
            jobs = await d.get_jobs(q, count=3, nohang=True)
            assert [j.body for j in jobs] == [b"async-high", b"low", b"none"]
        finally:
            await d.aclose()

    asyncio.run(go())


def test_priority_survives_a_restart_a_rewrite_and_a_killed_worker(tmp_path: Path) -> None:
    """The AOF keeps PRIORITY (a version 4 record) through a rewrite; a worker killed
    by SIGKILL is restarted by the supervisor and loads it again: once requeued (the
    AOF load rule: after RETRY) the order holds."""
    q = _q("prio")
    with NodeProc(tmp_path / "aof", workers=1, conf={"appendonly": "yes",
                                                     "appendfsync": "always"}) as n:
        r = _r(n)
        for i in range(5):
            r.execute_command("ADDJOB", q, f"low{i}", 0, "RETRY", 1)
        hid = r.execute_command("ADDJOB", q, "high", 0, "RETRY", 1, "PRIORITY", 8).decode()
        r.execute_command("ADDJOB", q, "mid", 0, "RETRY", 1, "PRIORITY", 2, "GROUP", "g")
        n.restart()
        r = _r(n)
        assert _show(r, hid)["priority"] == 8
        wait_until(lambda: r.execute_command("QLEN", q) == 7, wait_s, "the jobs requeued")
        assert _pairs(r.execute_command("QSTAT", q))["priorities"] == [8, 1, 2, 1, 0, 5]
        r.execute_command("BGREWRITEAOF")
        wait_until(lambda: int(r.info("persistence")["aof_rewrite_in_progress"]) == 0, wait_s,
                   "the rewrite")
        r.execute_command("ADDJOB", q, "top", 0, "RETRY", 1, "PRIORITY", 9)
        (pid,) = n.worker_pids()
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: n.worker_pids() not in ([], [pid]), wait_s, "the worker restarted")
        r = _r(n)
        wait_until(lambda: _ping(r) and r.execute_command("QLEN", q) == 8, wait_s,
                   "the restarted worker's jobs requeued")
        got = r.execute_command("GETJOB", "COUNT", 8, "FROM", q)
        assert [e[2] for e in got] == [b"top", b"high", b"mid", *(b"low%d" % i for i in range(5))]


def _ping(r: redis.Redis) -> bool:
    try:
        return bool(r.ping())
    except redis.RedisError:
        return False


def test_priority_travels_to_copies_and_by_federation(three: list[NodeProc]) -> None:
    """REPLICATE 3 copies carry the priority; 60 plain jobs then 5 of priority 9 on one
    node, a consumer on another imports them (NEEDJOBS / YOURJOBS): the exporter
    sends its highest priorities first, so they come first."""
    src, dst, third = three
    rs, rd = _r(src), _r(dst)
    q = _q("prio")
    jid = rs.execute_command("ADDJOB", q, "copied", 0, "REPLICATE", 3, "PRIORITY", 6).decode()
    assert all(_show(_r(n), jid)["priority"] == 6 for n in three)
    rs.execute_command("ACKJOB", jid)
    q = _q("prio")
    for i in range(60):
        rs.execute_command("ADDJOB", q, f"low{i}", 0, "REPLICATE", 1)
    for i in range(5):
        rs.execute_command("ADDJOB", q, f"high{i}", 0, "REPLICATE", 1, "PRIORITY", 9)
    got: list[bytes] = []
    for _ in range(200):  # bounded: GETJOB waits up to 1 s each
        reply = rd.execute_command("GETJOB", "TIMEOUT", 1000, "COUNT", 10, "FROM", q)
        for e in reply or []:
            got.append(e[2])
            rd.execute_command("ACKJOB", e[1])
        if len(got) >= 65:
            break
    assert sorted(got) == sorted([b"low%d" % i for i in range(60)] +
                                 [b"high%d" % i for i in range(5)]), got
    assert max(i for i, body in enumerate(got) if body.startswith(b"high")) < 10, got
    _ = third


# ------------------------------------------------------------------ QLIMIT (limits per node)


def _limits(r: redis.Redis, q: str) -> dict[str, int]:
    return {k: int(v) for k, v in _pairs(r.execute_command("QLIMIT", q)).items()}


def test_qlimit_active_skips_the_queue_and_a_blocked_getjob_wakes_on_ack(one: NodeProc) -> None:
    r = _r(one)
    limited, other = _two_owner_queues()  # one queue per worker: the GETJOB spans both
    assert _pairs(r.execute_command("QLIMIT", limited, "ACTIVE", 2))["active"] == 2
    for i in range(5):
        r.execute_command("ADDJOB", limited, f"l{i}", 0, "RETRY", 60)
        r.execute_command("ADDJOB", other, f"o{i}", 0)
    got = r.execute_command("GETJOB", "NOHANG", "COUNT", 10, "FROM", limited, other)
    assert sorted(e[0].decode() for e in got) == sorted([limited] * 2 + [other] * 5)
    assert r.execute_command("GETJOB", "NOHANG", "FROM", limited) is None  # at its limit
    stat = _pairs(r.execute_command("QSTAT", limited))
    assert _pairs(stat["limits"])["in-use"] == 2 and stat["len"] == 3
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(_r(one).execute_command(
        "GETJOB", "TIMEOUT", 20_000, "FROM", limited)))
    t.start()
    wait_until(lambda: _pairs(r.execute_command("QSTAT", limited))["blocked"] == 1, wait_s,
               "the GETJOB blocked on the queue at its limit")
    assert result == []
    mine = next(e[1] for e in got if e[0].decode() == limited)
    assert r.execute_command("ACKJOB", mine) == 1
    t.join(wait_s)
    assert result and result[0][0][0].decode() == limited  # the ACK made room
    assert _limits(r, limited)["in-use"] == 2
    assert r.execute_command("QLIMIT", limited, "RESET")[1] == 0
    assert len(r.execute_command("GETJOB", "NOHANG", "COUNT", 10, "FROM", limited)) == 2


def test_qlimit_bad_input_changes_nothing(one: NodeProc) -> None:
    r = _r(one)
    q = _q()
    r.execute_command("QLIMIT", q, "ACTIVE", 3)
    for args, text in ((["ACTIVE", -1], "ACTIVE must be between 0 and 1000000"),
                       (["RATE", 10**7], "RATE must be between 0 and 1000000"),
                       (["GROUP-ACTIVE", "x"], "value is not an integer or out of range"),
                       (["LIMIT", 1], "syntax error"), (["ACTIVE"], "syntax error"),
                       (["RESET", "ACTIVE", 1], "syntax error"), (["BCAST"], "syntax error")):
        assert _err(r, "QLIMIT", q, *args).startswith(text), args
    assert _err(r, "QLIMIT", "x" * 70_000).startswith("queue name too long")
    assert _err(r, "QLIMIT").startswith("wrong number of arguments")
    assert _limits(r, q)["active"] == 3 and r.ping()
    r.execute_command("CONFIG", "SET", "qlimit-value-max", "10")
    try:
        assert _err(r, "QLIMIT", q, "RATE", 11).startswith("RATE must be between 0 and 10")
    finally:
        r.execute_command("CONFIG", "SET", "qlimit-value-max", "1000000")
    assert r.execute_command("COMMAND")["qlimit"]["arity"] == -2


def test_qlimit_rate_and_group_active_and_the_clients(one: NodeProc) -> None:
    q = _q("lim")
    with Disque(f"127.0.0.1:{one.port}", socket_timeout=20) as d:
        assert d.set_limit(q, rate=5)["tokens"] == 5
        for i in range(9):
            d.add_job(q, f"j{i}".encode(), group=f"t{i % 3}", retry=60)
        assert len(d.get_jobs(q, count=9, nohang=True)) == 5  # the bucket's 5 tokens
        d.set_limit(q, rate=0, group_active=1)  # RATE off; one job a tenant at a time
        got = d.get_jobs(q, count=9, nohang=True)
        limits = d.limits(q)
        assert limits["group-active"] == 1 and limits["rate"] == 0
        assert len(got) <= 3 and limits["full-groups"] == 3
        assert d.reset_limits(q)["group-active"] == 0

    async def go() -> None:
        a = AsyncDisque(f"127.0.0.1:{one.port}", socket_timeout=20)
        try:
            assert (await a.set_limit(q, active=7))["active"] == 7
            assert (await a.limits(q))["active"] == 7
            assert (await a.reset_limits(q))["active"] == 0
        finally:
            await a.aclose()

    asyncio.run(go())
    if shutil.which("redis-cli"):
        out = subprocess.run(["redis-cli", "-p", str(one.port), "QLIMIT", q, "ACTIVE", "4"],
                             text=True, capture_output=True, timeout=20, check=True).stdout.split()
        assert out[:2] == ["active", "4"], out


def test_qlimit_bcast_sets_every_node(three: list[NodeProc]) -> None:
    q = _q("lim")
    a = _r(three[0])
    a.execute_command("QLIMIT", q, "ACTIVE", 3, "RATE", 50, "BCAST")
    wait_until(lambda: all(_limits(_r(n), q)["active"] == 3 and _limits(_r(n), q)["rate"] == 50
                           for n in three), wait_s, "every node has the limits")
    _r(three[1]).execute_command("QLIMIT", q, "RESET", "BCAST")
    wait_until(lambda: all(_limits(_r(n), q)["active"] == 0 for n in three), wait_s,
               "every node reset")


def test_qlimit_survives_a_restart_a_rewrite_and_a_killed_worker(tmp_path: Path) -> None:
    qa, qb = _two_owner_queues()
    with NodeProc(tmp_path / "aof", workers=2, conf={"appendonly": "yes",
                                                     "appendfsync": "always"}) as n:
        r = _r(n)
        r.execute_command("QLIMIT", qa, "ACTIVE", 2, "GROUP-ACTIVE", 1)
        r.execute_command("QLIMIT", qb, "RATE", 9)
        r.execute_command("QLIMIT", qb, "ACTIVE", 4)  # RATE kept: a later record adds to it

        def kept() -> bool:
            rr = _r(n)
            la, lb = _limits(rr, qa), _limits(rr, qb)
            return (la["active"], la["group-active"], lb["rate"], lb["active"]) == (2, 1, 9, 4)

        n.restart()
        assert kept()
        assert _r(n).execute_command("BGREWRITEAOF")
        wait_until(lambda: int(_r(n).info("persistence")["aof_rewrite_in_progress"]) == 0,
                   wait_s, "the rewrite done")
        n.restart()
        assert kept()
        for pid in n.worker_pids():
            os.kill(pid, signal.SIGKILL)  # the supervisor restarts each from its AOF
        wait_until(lambda: len(n.worker_pids()) == 2, wait_s, "both workers back")
        wait_until(lambda: _ping_quiet(n) and kept(), wait_s, "the limits back with the workers")


def _ping_quiet(n: NodeProc) -> bool:
    try:
        return bool(_r(n).ping())
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False
