"""The JSON admin API: every endpoint and action against the commands it runs, and
each error case (status code and JSON error body)."""

from __future__ import annotations

import socket
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from tests.httpclient import get, post, request
from tests.nodeproc import NodeProc, free_port, unique_queue

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    port = free_port()
    with NodeProc(tmp_path_factory.mktemp("httpa"), workers=2,
                  conf={"http-port": port, "http-api-jobs-max": 50}) as n:
        n.http_port = port  # type: ignore[attr-defined]
        yield n


def hp(node: NodeProc) -> int:
    return int(node.http_port)  # type: ignore[attr-defined]


def q_path(q: str) -> str:
    return "/api/queues/" + urllib.parse.quote(q, safe="")


def j_path(job_id: str) -> str:
    return "/api/jobs/" + urllib.parse.quote(job_id, safe="")


def show(r: Any, job_id: str) -> dict[str, Any] | None:
    raw = r.execute_command("SHOW", job_id)
    if raw is None:
        return None
    return {raw[i].decode(): raw[i + 1] for i in range(0, len(raw), 2)}


def error_of(reply: Any, status: int) -> str:
    assert reply.status == status, reply
    body = reply.json()
    assert body["status"] == status and body["error"]
    return str(body["error"])


def test_queues_list_and_one_queue(node: NodeProc) -> None:
    r = node.client(protocol=2)
    q = unique_queue("api")
    ids = [r.execute_command("ADDJOB", q, f"body {i}", 0).decode() for i in range(4)]
    [[_, taken, _]] = r.execute_command("GETJOB", "FROM", q)
    listed = {x["name"]: x for x in get(hp(node), "/api/queues").json()["queues"]}
    assert listed[q]["queued"] == r.execute_command("QLEN", q) == 3
    assert listed[q]["active"] == 1 and listed[q]["jobs_in"] == 4 and listed[q]["jobs_out"] == 1
    assert listed[q]["pause"] == "none" and listed[q]["oldest_age_s"] >= 0
    assert "in_rate" in listed[q] and "out_rate" in listed[q]
    one = get(hp(node), q_path(q)).json()
    assert one["queue"]["len"] == 3 and one["queue"]["jobs-in"] == 4
    assert [j["id"] for j in one["jobs"]] == ids[1:]  # QPEEK order: oldest first
    assert [j["id"] for j in one["active"]] == [taken.decode()]
    assert one["active"][0]["state"] == "active"
    assert len(get(hp(node), q_path(q) + "?count=1").json()["jobs"]) == 1
    error_of(get(hp(node), q_path(unique_queue("nope"))), 404)
    error_of(get(hp(node), "/api/queues?limit=x"), 400)


def test_delayed_jobs_apart_from_delivered_ones_and_run_now(node: NodeProc) -> None:
    """SHOW says ``active`` for both: the queue view tells a job delivered to a
    client (``active``) from one waiting for its DELAY (``delayed``); ENQUEUE runs
    a delayed one now."""
    r = node.client(protocol=2)
    q = unique_queue("dl")
    later = [r.execute_command("ADDJOB", q, f"later {i}", 0, "DELAY", 600).decode()
             for i in range(2)]
    r.execute_command("ADDJOB", q, "now", 0)
    [[_, taken, _]] = r.execute_command("GETJOB", "FROM", q)
    one = get(hp(node), q_path(q)).json()
    assert one["queue"]["active"] == 1 and one["queue"]["delayed"] == 2 and one["jobs"] == []
    assert [(j["id"], j["kind"]) for j in one["active"]] == [(taken.decode(), "delivered")]
    assert sorted((j["id"], j["kind"]) for j in one["delayed"]) == sorted(
        (i, "delayed") for i in later)
    assert {j["delay"] for j in one["delayed"]} == {600}
    assert get(hp(node), j_path(later[0])).json()["kind"] == "delayed"
    assert get(hp(node), j_path(taken.decode())).json()["kind"] == "delivered"

    ran = post(hp(node), j_path(later[0]) + "/enqueue").json()
    assert ran["queued"] == 1 and ran["job"]["state"] == "queued"
    assert r.execute_command("QLEN", q) == 1
    assert "kind" not in get(hp(node), j_path(later[0])).json()  # queued: no kind
    error_of(post(hp(node), j_path(later[0]) + "/enqueue"), 409)  # queued already
    r.execute_command("ACKJOB", later[1])
    error_of(post(hp(node), j_path(later[1]) + "/enqueue"), 404)


def test_one_dead_letter_requeued_and_reasons_on_the_queue_view(node: NodeProc) -> None:
    r = node.client(protocol=2)
    q = unique_queue("d1")
    dead = "dead:" + q
    ids = [r.execute_command("ADDJOB", q, f"poison {i}", 0).decode() for i in range(3)]
    assert r.execute_command("DEADLETTER", *ids, "REASON", "bad input") == 3
    view = get(hp(node), q_path(q)).json()
    assert view["queue"]["dead-len"] == 3
    assert [(j["id"], j["dead-reason"], j["queue"]) for j in view["dead"]] == [
        (i, "bad input", dead) for i in ids]
    back = post(hp(node), q_path(dead) + "/requeue", {"id": ids[1]}).json()
    assert back == {"from": dead, "to": q, "requeued": 1, "id": ids[1], "left": 2}
    assert (show(r, ids[1]) or {})["queue"] == q.encode()
    assert [e[1].decode() for e in r.execute_command("QPEEK", dead, 10)] == [ids[0], ids[2]]
    left = get(hp(node), q_path(dead)).json()
    assert [(j["id"], j["dead-reason"]) for j in left["jobs"]] == [
        (ids[0], "bad input"), (ids[2], "bad input")]
    assert left["dead"] == []  # a dead-letter queue has no dead:dead:q of its own
    error_of(post(hp(node), q_path(dead) + "/requeue", {"id": ids[1]}), 404)  # not dead now
    error_of(post(hp(node), q_path(dead) + "/requeue", {"id": "nope"}), 400)
    r.execute_command("PAUSE", q, "in")
    assert "PAUSED" in error_of(post(hp(node), q_path(dead) + "/requeue", {"id": ids[0]}), 409)
    r.execute_command("PAUSE", q, "none")
    assert r.execute_command("QLEN", dead) == 2


def test_pause_and_resume(node: NodeProc) -> None:
    r = node.client(protocol=2)
    q = unique_queue("p")
    r.execute_command("ADDJOB", q, "x", 0)

    def pause_state() -> bytes:
        raw = r.execute_command("QSTAT", q)
        return dict(zip(raw[::2], raw[1::2], strict=True))[b"pause"]

    assert post(hp(node), q_path(q) + "/pause", {}).json()["pause"] == "all"
    assert pause_state() == b"all"
    assert post(hp(node), q_path(q) + "/pause", {"state": "in"}).json()["pause"] == "in"
    assert pause_state() == b"in"
    assert post(hp(node), q_path(q) + "/resume").json()["pause"] == "none"
    assert pause_state() == b"none"
    error_of(post(hp(node), q_path(q) + "/pause", {"state": "sideways"}), 400)
    error_of(post(hp(node), q_path(q) + "/pause", b"{not json"), 400)
    error_of(post(hp(node), q_path(q) + "/pause", [1]), 400)
    error_of(post(hp(node), q_path(q) + "/pause", b"{}", json_body=False), 415)
    error_of(post(hp(node), q_path(unique_queue("nope")) + "/pause", {}), 404)
    assert pause_state() == b"none"


def test_limits_shown_and_set(node: NodeProc) -> None:
    r = node.client(protocol=2)
    q = unique_queue("lim")
    shown = get(hp(node), q_path(q) + "/limits").json()
    assert shown == {"queue": q, "active": 0, "rate": 0, "group-active": 0, "in-use": 0,
                     "tokens": -1, "full-groups": 0}
    got = post(hp(node), q_path(q) + "/limits", {"active": 3, "rate": 20}).json()
    assert (got["active"], got["rate"], got["tokens"]) == (3, 20, 20)
    assert r.execute_command("QLIMIT", q)[:4] == [b"active", 3, b"rate", 20]
    assert post(hp(node), q_path(q) + "/limits", {"group_active": 1}).json()["active"] == 3
    assert "must be between 0 and" in error_of(
        post(hp(node), q_path(q) + "/limits", {"active": -1}), 400)
    error_of(post(hp(node), q_path(q) + "/limits", {"active": "3"}), 400)
    error_of(post(hp(node), q_path(q) + "/limits", {}), 400)
    error_of(post(hp(node), q_path(q) + "/limits", {"reset": True, "rate": 1}), 400)
    assert get(hp(node), q_path(q) + "/limits").json()["group-active"] == 1  # nothing changed
    assert post(hp(node), q_path(q) + "/limits", {"reset": True}).json()["active"] == 0
    error_of(request(hp(node), "DELETE", q_path(q) + "/limits"), 405)


def test_job_show_ack_nack_delete(node: NodeProc) -> None:
    r = node.client(protocol=2)
    q = unique_queue("j")
    a, b, c = (r.execute_command("ADDJOB", q, f"job {i}", 0).decode() for i in range(3))
    shown = get(hp(node), j_path(a)).json()
    expect = show(r, a)
    assert expect is not None
    assert shown["id"] == a and shown["queue"] == q and shown["body"] == "job 0"
    assert shown["state"] == expect["state"].decode() == "queued" and shown["ttl"] == expect["ttl"]
    assert get(hp(node), "/api/jobs/" + a).status == 200  # the '/' of an ID may stay raw

    error_of(post(hp(node), j_path(a) + "/nack"), 409)  # queued: NACK does not apply
    taken = r.execute_command("GETJOB", "FROM", q)
    assert taken[0][1].decode() == a
    nacked = post(hp(node), j_path(a) + "/nack").json()
    assert nacked["nacked"] == 1 and nacked["job"]["nacks"] == 1
    assert nacked["job"]["state"] == "queued"

    assert post(hp(node), j_path(b) + "/ack").json()["acked"] == 1
    assert show(r, b) is None
    error_of(post(hp(node), j_path(b) + "/ack"), 404)
    error_of(post(hp(node), j_path(b) + "/nack"), 404)

    assert request(hp(node), "DELETE", j_path(c)).json()["deleted"] == 1
    assert show(r, c) is None
    error_of(request(hp(node), "DELETE", j_path(c)), 404)
    error_of(get(hp(node), j_path(c)), 404)
    error_of(get(hp(node), "/api/jobs/not-an-id"), 400)
    error_of(post(hp(node), "/api/jobs/D-123/ack"), 400)


def test_a_job_shows_its_progress(node: NodeProc) -> None:
    """WORKING ... PROGRESS: the job's JSON (the dashboard's job page) has ``progress``."""
    r = node.client(protocol=2)
    q = unique_queue("p")
    jid = r.execute_command("ADDJOB", q, "x", 0, "RETRY", 60).decode()
    assert "progress" not in get(hp(node), j_path(jid)).json()
    r.execute_command("GETJOB", "FROM", q)
    r.execute_command("WORKING", jid, "PROGRESS", "7 of 9")
    assert get(hp(node), j_path(jid)).json()["progress"] == "7 of 9"
    r.execute_command("ACKJOB", jid)


def test_dead_letter_and_requeue(node: NodeProc) -> None:
    r = node.client(protocol=2)
    q = unique_queue("d")
    dead = "dead:" + q
    ids = [r.execute_command("ADDJOB", q, f"poison {i}", 0, "TTL", 600).decode() for i in range(3)]
    r.execute_command("GETJOB", "FROM", q)  # ids[0] is active, the others queued
    for job_id in ids[:2]:
        moved = post(hp(node), j_path(job_id) + "/dead").json()
        assert moved == {"id": job_id, "moved_to": dead, "new_id": job_id}  # DEADLETTER: same ID
    moved = post(hp(node), j_path(ids[2]) + "/dead", {"reason": "bad input"}).json()
    assert moved["new_id"] == ids[2]
    for job_id in ids:
        job = show(r, job_id)
        assert job is not None and job["queue"] == dead.encode() and job["state"] == b"queued"
    assert (show(r, ids[2]) or {})["dead-reason"] == b"bad input"
    assert (show(r, ids[0]) or {})["dead-reason"] == b"moved from the HTTP API"
    error_of(post(hp(node), j_path(ids[1]) + "/dead", {"reason": "x" * 1025}), 400)
    assert r.execute_command("QLEN", q) == 0
    assert r.execute_command("QLEN", dead) == 3
    in_dead = r.execute_command("QPEEK", dead, 10)
    assert sorted(e[2] for e in in_dead) == [b"poison 0", b"poison 1", b"poison 2"]
    dead_job = show(r, in_dead[0][1].decode())
    assert dead_job is not None and 1 <= dead_job["ttl"] <= 600  # keeps what was left of its TTL
    error_of(post(hp(node), j_path(in_dead[0][1].decode()) + "/dead"), 409)

    lst = {x["name"]: x for x in get(hp(node), "/api/queues").json()["queues"]}
    assert lst[dead]["queued"] == 3
    back = post(hp(node), q_path(dead) + "/requeue").json()
    assert back == {"from": dead, "to": q, "requeued": 3, "left": 0}
    assert r.execute_command("QLEN", q) == 3 and r.execute_command("QLEN", dead) == 0
    error_of(post(hp(node), q_path(q) + "/requeue"), 400)  # not a dead-letter queue
    error_of(post(hp(node), q_path("dead:" + unique_queue("none")) + "/requeue"), 404)


def test_requeue_is_bounded_and_stops_at_a_paused_queue(node: NodeProc) -> None:
    r = node.client(protocol=2)
    q = unique_queue("b")
    dead = "dead:" + q
    for i in range(60):  # http-api-jobs-max is 50 on this node
        r.execute_command("ADDJOB", dead, f"j{i}", 0)
    first = post(hp(node), q_path(dead) + "/requeue").json()
    assert (first["requeued"], first["left"]) == (50, 10)
    r.execute_command("PAUSE", q, "in")
    msg = error_of(post(hp(node), q_path(dead) + "/requeue"), 409)
    assert "PAUSED" in msg
    assert r.execute_command("QLEN", dead) == 10  # given back, nothing lost
    r.execute_command("PAUSE", q, "none")
    assert post(hp(node), q_path(dead) + "/requeue").json()["requeued"] == 10
    assert r.execute_command("QLEN", q) == 60


def test_nodes_and_overview(node: NodeProc) -> None:
    r = node.client(protocol=2)
    nodes = get(hp(node), "/api/nodes").json()
    myid = r.execute_command("CLUSTER", "MYID").decode()
    assert nodes["myid"] == myid
    me = [n for n in nodes["nodes"] if n["myself"]]
    assert len(me) == 1 and me[0]["id"] == myid and me[0]["port"] == node.port
    ov = get(hp(node), "/api/overview").json()
    assert ov["node_id"] == myid and ov["workers"] == 2 and len(ov["per_worker"]) == 2
    assert ov["jobs"] == sum(w["jobs"] for w in ov["per_worker"])


def test_schedules(node: NodeProc) -> None:
    r = node.client(protocol=2)
    assert get(hp(node), "/api/schedules").json() == {"schedules": []}
    q = unique_queue("sched")
    r.execute_command("SCHEDULE", "SET", "api", "EVERY", "3600", "ADDJOB", q, "body", "0")
    try:
        (one,) = get(hp(node), "/api/schedules").json()["schedules"]
        assert one["name"] == "api" and one["rule"] == "EVERY 3600" and one["firer"] == "yes"
        assert one["addjob"] == [q, "body", "0"] and one["next-fire"] % 3_600_000 == 0
        assert one["fired"] == 0 and one["last-job-id"] == ""
    finally:
        r.execute_command("SCHEDULE", "DEL", "api")


def test_methods_paths_and_static_files(node: NodeProc) -> None:
    wrong = post(hp(node), "/api/queues")
    error_of(wrong, 405)
    assert "GET" in wrong.headers["allow"]
    assert "POST" in request(hp(node), "GET", q_path("x") + "/pause").headers["allow"]
    error_of(request(hp(node), "PUT", j_path("x")), 405)
    error_of(get(hp(node), "/api/nothing"), 404)
    error_of(get(hp(node), "/static/secret.txt"), 404)
    page = get(hp(node), "/")
    assert page.status == 200 and page.headers["content-type"].startswith("text/html")
    for asset in (b"/static/app.js", b"/static/app.css", b"/static/schedules.js"):
        assert asset in page.body
        assert get(hp(node), asset.decode()).status == 200
    assert b"http://" not in get(hp(node), "/static/app.js").body  # nothing fetched from elsewhere
    head = request(hp(node), "HEAD", "/api/overview")
    assert head.status == 200 and head.body == b"" and int(head.headers["content-length"]) > 0


def raw_http(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def test_bad_requests_get_an_error_and_the_node_keeps_serving(node: NodeProc) -> None:
    assert raw_http(hp(node), b"NONSENSE\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw_http(hp(node), b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    big = b"GET / HTTP/1.1\r\nX-Big: " + b"a" * (2 << 20) + b"\r\n\r\n"
    assert raw_http(hp(node), big).startswith(b"HTTP/1.1 413 ")
    chunked = b"POST /api/queues/x/pause HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    assert raw_http(hp(node), chunked).startswith(b"HTTP/1.1 501 ")
    # two pipelined requests on one keep-alive connection: two answers, in order
    two = (b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
           b"GET /api/nothing HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    out = raw_http(hp(node), two)
    assert out.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 404 " in out
    assert get(hp(node), "/api/overview").status == 200
    assert node.client().ping()
