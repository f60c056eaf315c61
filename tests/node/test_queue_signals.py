"""A queue's load signals (queued, active, delayed, oldest queued job's age, jobs in
its dead-letter queue) read from one live 2-worker node, for a queue owned by
each worker, through QSTAT (raw RESP, the sync and the asyncio client), the JSON
API and /metrics over real HTTP."""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from disque_mp.client import Disque
from disque_mp.client.aio import AsyncDisque
from tests.httpclient import get
from tests.nodeproc import NodeProc, free_port, unique_queue, wait_until
from workers.ids import owner_of_queue

pytestmark = pytest.mark.integration

age_wait_s = 20.0  # the oldest job reaches 1 s of age: generous on shared cores
SIGNALS = {"len": 2, "active": 1, "delayed": 1, "dead-len": 1}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    port = free_port()
    with NodeProc(tmp_path_factory.mktemp("signals"), workers=2,
                  conf={"http-port": port}) as n:
        n.http_port = port  # type: ignore[attr-defined]
        yield n


@pytest.fixture(scope="module")
def loaded(node: NodeProc) -> list[str]:
    """Two queues, one owned by each worker, each with 2 queued jobs, 1 delivered
    and not acked, 1 waiting for its DELAY, and 1 moved to dead:<queue> by
    MAXDELIVER; their oldest queued job >= 1 s old."""
    names: dict[int, str] = {}
    for _ in range(1000):  # each worker owns about half of the names: bounded
        q = unique_queue("sig")
        names.setdefault(owner_of_queue(q.encode(), 2), q)
        if len(names) == 2:
            break
    assert sorted(names) == [0, 1]
    queues = [names[0], names[1]]
    r = node.client(protocol=2)
    for q in queues:
        _load(r, q)
    for q in queues:
        wait_until(lambda q=q: qstat(r, q)["oldest-age"] >= 1, age_wait_s, "oldest-age >= 1 s",
                   detail=lambda q=q: repr(qstat(r, q)))
    r.close()
    return queues


def _load(r: Any, q: str) -> None:
    poison = r.execute_command("ADDJOB", q, "poison", 0, "RETRY", 30, "MAXDELIVER", 1)
    assert r.execute_command("GETJOB", "NOHANG", "FROM", q)[0][1] == poison
    assert r.execute_command("NACK", poison) == 1  # its one delivery spent: dead-lettered
    for body in ("a", "b", "c"):
        r.execute_command("ADDJOB", q, body, 0, "RETRY", 600)
    r.execute_command("ADDJOB", q, "later", 0, "DELAY", 3600)
    assert r.execute_command("GETJOB", "NOHANG", "FROM", q)[0][2] == b"a"


def qstat(r: Any, q: str) -> dict[str, Any]:
    raw = r.execute_command("QSTAT", q)
    return {raw[i].decode(): raw[i + 1] for i in range(0, len(raw), 2)}


def test_qstat_appends_the_signals(node: NodeProc, loaded: list[str]) -> None:
    r = node.client(protocol=2)
    try:
        for q in loaded:
            raw = r.execute_command("QSTAT", q)
            st = qstat(r, q)
            assert raw[:4] == [b"name", q.encode(), b"len", 2]
            assert list(st)[-4:] == ["active", "delayed", "oldest-age", "dead-len"]
            assert {k: st[k] for k in SIGNALS} == SIGNALS
            assert st["oldest-age"] >= 1
    finally:
        r.close()


def test_the_clients_read_them(node: NodeProc, loaded: list[str]) -> None:
    with Disque([f"127.0.0.1:{node.port}"], socket_timeout=30) as d:
        stats = [d.qstat(q) for q in loaded]

    async def read() -> list[dict[str, Any] | None]:
        async with AsyncDisque([f"127.0.0.1:{node.port}"]) as a:
            return [await a.qstat(q) for q in loaded]

    for st in stats + asyncio.run(read()):
        assert st is not None and {k: st[k] for k in SIGNALS} == SIGNALS
        assert st["oldest-age"] >= 1


def test_the_json_api_reads_them(node: NodeProc, loaded: list[str]) -> None:
    port = int(node.http_port)  # type: ignore[attr-defined]
    for q in loaded:
        reply = get(port, "/api/queues/" + urllib.parse.quote(q, safe=""))
        assert reply.status == 200, reply
        st = reply.json()["queue"]
        assert {k: st[k] for k in SIGNALS} == SIGNALS and st["oldest-age"] >= 1
    reply = get(port, "/api/queues")
    assert reply.status == 200, reply
    rows = {r["name"]: r for r in reply.json()["queues"]}
    for q in loaded:
        row = rows[q]
        assert (row["queued"], row["active"], row["delayed"], row["dead"]) == (2, 1, 1, 1)
        assert row["oldest_age_s"] >= 1


def test_metrics_read_them(node: NodeProc, loaded: list[str]) -> None:
    reply = get(int(node.http_port), "/metrics")  # type: ignore[attr-defined]
    assert reply.status == 200, reply
    got: dict[str, dict[str, float]] = {q: {} for q in loaded}
    for family in text_string_to_metric_families(reply.body.decode()):
        for s in family.samples:
            if s.labels.get("queue") in got:
                got[s.labels["queue"]][s.name] = s.value
    for q in loaded:
        assert got[q]["disque_queue_jobs_queued"] == 2
        assert got[q]["disque_queue_jobs_active"] == 1
        assert got[q]["disque_queue_jobs_delayed"] == 1
        assert got[q]["disque_queue_oldest_job_age_seconds"] >= 1
        assert got[q]["disque_queue_dead_jobs"] == 1
