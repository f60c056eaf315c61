"""dead:<queue> in the HTTP API, for jobs MAXDELIVER moved there: the queue view
shows each job's counters, and a requeue (REDRIVE) moves the same job back with its
RETRY and MAXDELIVER (a requeued poison job gets its deliveries again, then comes back)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from tests.httpclient import get, post
from tests.nodeproc import NodeProc, free_port, unique_queue

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    port = free_port()
    with NodeProc(tmp_path_factory.mktemp("dead-api"), workers=2,
                  conf={"http-port": port}) as n:
        n.http_port = port  # type: ignore[attr-defined]
        yield n


def q_path(q: str) -> str:
    return "/api/queues/" + urllib.parse.quote(q, safe="")


def show(r: Any, job_id: str) -> dict[str, Any]:
    raw = r.execute_command("SHOW", job_id)
    assert raw is not None
    return {raw[i].decode(): raw[i + 1] for i in range(0, len(raw), 2)}


def poison(r: Any, q: str, deliveries: int) -> str:
    """A job with MAXDELIVER ``deliveries``, delivered and NACKed until it moves."""
    job_id = r.execute_command("ADDJOB", q, "poison", 0, "RETRY", 7, "TTL", 600,
                               "MAXDELIVER", deliveries).decode()
    for _ in range(deliveries):
        [[_, taken, _]] = r.execute_command("GETJOB", "NOHANG", "FROM", q)
        assert taken.decode() == job_id
        r.execute_command("NACK", job_id)
    return job_id


def test_the_dead_queue_view_shows_the_counters(node: NodeProc) -> None:
    r = node.client(protocol=2)
    q = unique_queue("dl")
    job_id = poison(r, q, 2)
    assert r.execute_command("QLEN", "dead:" + q) == 1
    view = get(node.http_port, q_path("dead:" + q)).json()  # type: ignore[attr-defined]
    [job] = view["jobs"]
    assert job["id"] == job_id and job["state"] == "queued"
    assert job["maxdeliver"] == 2
    assert job["nacks"] == show(r, job_id)["nacks"] >= 1
    assert "additional-deliveries" in job
    # the listing has it too, among the queues
    listed = {x["name"]: x for x in get(node.http_port,  # type: ignore[attr-defined]
                                        "/api/queues").json()["queues"]}
    assert listed["dead:" + q]["queued"] == 1


def test_requeue_keeps_retry_and_maxdeliver(node: NodeProc) -> None:
    r = node.client(protocol=2)
    q = unique_queue("dl")
    old_id = poison(r, q, 1)
    back = post(node.http_port, q_path("dead:" + q) + "/requeue").json()  # type: ignore[attr-defined]
    assert back == {"from": "dead:" + q, "to": q, "requeued": 1, "left": 0}
    [[_, new_id, body]] = r.execute_command("QPEEK", q, 1)
    assert body == b"poison" and new_id.decode() == old_id  # REDRIVE: the same job
    job = show(r, new_id.decode())
    assert job["retry"] == 7 and job["maxdeliver"] == 1 and job["nacks"] == 0
    # one more delivery without an ACK and it is back in dead:<queue>
    r.execute_command("GETJOB", "NOHANG", "FROM", q)
    r.execute_command("NACK", new_id)
    assert r.execute_command("QLEN", q) == 0 and r.execute_command("QLEN", "dead:" + q) == 1
