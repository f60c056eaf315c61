"""A queue's load signals (queued, active, delayed, oldest queued job's age, jobs in
its dead-letter queue) read from one live 2-worker node through QSTAT (raw RESP,
the sync and the asyncio client), the JSON API and /metrics over real HTTP."""

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
def loaded(node: NodeProc) -> str:
    """A queue with 2 queued jobs, 1 delivered and not acked, 1 waiting for its
    DELAY, and 1 moved to dead:<queue> by MAXDELIVER; its oldest job >= 1 s old."""
    q = unique_queue("sig")
    r = node.client(protocol=2)
    poison = r.execute_command("ADDJOB", q, "poison", 0, "RETRY", 30, "MAXDELIVER", 1)
    assert r.execute_command("GETJOB", "NOHANG", "FROM", q)[0][1] == poison
    assert r.execute_command("NACK", poison) == 1  # its one delivery spent: dead-lettered
    for body in ("a", "b", "c"):
        r.execute_command("ADDJOB", q, body, 0, "RETRY", 600)
    r.execute_command("ADDJOB", q, "later", 0, "DELAY", 3600)
    assert r.execute_command("GETJOB", "NOHANG", "FROM", q)[0][2] == b"a"
    wait_until(lambda: qstat(r, q)["oldest-age"] >= 1, age_wait_s, "oldest-age >= 1 s",
               detail=lambda: repr(qstat(r, q)))
    r.close()
    return q


def qstat(r: Any, q: str) -> dict[str, Any]:
    raw = r.execute_command("QSTAT", q)
    return {raw[i].decode(): raw[i + 1] for i in range(0, len(raw), 2)}


def test_qstat_appends_the_signals(node: NodeProc, loaded: str) -> None:
    r = node.client(protocol=2)
    try:
        raw = r.execute_command("QSTAT", loaded)
        st = qstat(r, loaded)
    finally:
        r.close()
    assert raw[:4] == [b"name", loaded.encode(), b"len", 2]
    assert [k for k in st][-4:] == ["active", "delayed", "oldest-age", "dead-len"]
    assert {k: st[k] for k in SIGNALS} == SIGNALS
    assert st["oldest-age"] >= 1


def test_the_clients_read_them(node: NodeProc, loaded: str) -> None:
    with Disque([f"127.0.0.1:{node.port}"], socket_timeout=30) as d:
        st = d.qstat(loaded)
    assert st is not None and {k: st[k] for k in SIGNALS} == SIGNALS and st["oldest-age"] >= 1

    async def read() -> dict[str, Any] | None:
        async with AsyncDisque([f"127.0.0.1:{node.port}"]) as a:
            return await a.qstat(loaded)

    ast = asyncio.run(read())
    assert ast is not None and {k: ast[k] for k in SIGNALS} == SIGNALS and ast["oldest-age"] >= 1


def test_the_json_api_reads_them(node: NodeProc, loaded: str) -> None:
    port = int(node.http_port)  # type: ignore[attr-defined]
    reply = get(port, "/api/queues/" + urllib.parse.quote(loaded, safe=""))
    assert reply.status == 200, reply
    st = reply.json()["queue"]
    assert {k: st[k] for k in SIGNALS} == SIGNALS and st["oldest-age"] >= 1
    reply = get(port, "/api/queues")
    assert reply.status == 200, reply
    row = next(r for r in reply.json()["queues"] if r["name"] == loaded)
    assert (row["queued"], row["active"], row["delayed"], row["dead"]) == (2, 1, 1, 1)
    assert row["oldest_age_s"] >= 1


def test_metrics_read_them(node: NodeProc, loaded: str) -> None:
    reply = get(int(node.http_port), "/metrics")  # type: ignore[attr-defined]
    assert reply.status == 200, reply
    got: dict[str, float] = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        for s in family.samples:
            if s.labels.get("queue") == loaded:
                got[s.name] = s.value
    assert got["disque_queue_jobs_queued"] == 2
    assert got["disque_queue_jobs_active"] == 1
    assert got["disque_queue_jobs_delayed"] == 1
    assert got["disque_queue_oldest_job_age_seconds"] >= 1
    assert got["disque_queue_dead_jobs"] == 1
