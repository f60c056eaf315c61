"""/metrics on a 2-worker node with traffic, parsed with prometheus_client's own
parser: every value checked against QLEN / QSTAT / INFO for the same moment."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.httpclient import get
from tests.nodeproc import NodeProc, free_port, unique_queue
from tests.rawclient import RawClient

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    port = free_port()
    with NodeProc(tmp_path_factory.mktemp("httpm"), workers=2, conf={"http-port": port}) as n:
        n.http_port = port  # type: ignore[attr-defined]
        yield n


def scrape(node: NodeProc) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """name (sample name) -> {sorted labels: value}."""
    reply = get(node.http_port, "/metrics")  # type: ignore[attr-defined]
    assert reply.status == 200, reply
    assert reply.headers["content-type"].startswith("text/plain")
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def one(m: dict[str, Any], name: str, **labels: str) -> float:
    return m[name][tuple(sorted(labels.items()))]


def info(node: NodeProc) -> dict[str, str]:
    raw = RawClient(node.port)
    try:
        text = raw.call("INFO", "all").decode()
    finally:
        raw.close()
    return dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line and not line.startswith("#"))


def qstat(r: Any, q: str) -> dict[str, Any]:
    raw = r.execute_command("QSTAT", q)
    return {raw[i].decode(): raw[i + 1] for i in range(0, len(raw), 2)}


def test_metrics_match_the_commands(node: NodeProc) -> None:
    r = node.client(protocol=2)
    queues = [unique_queue("m") for _ in range(6)]  # spread over both workers
    for i, q in enumerate(queues):
        for j in range(i + 1):
            r.execute_command("ADDJOB", q, f"job {j}", 0)
    r.execute_command("ADDJOB", queues[0], "later", 0, "DELAY", 3600)
    taken = r.execute_command("GETJOB", "COUNT", 3, "FROM", queues[5])
    r.execute_command("ACKJOB", taken[0][1])
    r.execute_command("NACK", taken[1][1])
    r.execute_command("PAUSE", queues[4], "all")

    m = scrape(node)
    for q in queues:
        st = qstat(r, q)
        assert one(m, "disque_queue_jobs_queued", queue=q) == r.execute_command("QLEN", q) == st["len"]
        assert one(m, "disque_queue_jobs_in_total", queue=q) == st["jobs-in"]
        assert one(m, "disque_queue_jobs_out_total", queue=q) == st["jobs-out"]
        assert one(m, "disque_queue_blocked_clients", queue=q) == st["blocked"]
        paused = {"none": 0, "in": 1, "out": 2, "all": 3}[st["pause"].decode()]
        assert one(m, "disque_queue_paused", queue=q) == paused
    assert one(m, "disque_queue_paused", queue=queues[4]) == 3
    assert one(m, "disque_queue_jobs_active", queue=queues[5]) == 1  # 3 taken, 1 acked, 1 nacked
    assert one(m, "disque_queue_jobs_delayed", queue=queues[0]) == 1
    assert one(m, "disque_queue_oldest_job_age_seconds", queue=queues[3]) >= 0

    inf = info(node)
    assert one(m, "disque_jobs_registered") == int(inf["registered_jobs"])
    assert one(m, "disque_queues_registered") == int(inf["registered_queues"])
    assert one(m, "disque_connected_clients") == int(inf["connected_clients"]) - 1  # INFO's own
    assert one(m, "disque_blocked_clients") == int(inf["blocked_clients"])
    assert one(m, "disque_memory_max_bytes") == int(inf["maxmemory"])
    assert one(m, "disque_memory_level") == int(inf["memory_warning_level"])
    assert one(m, "disque_aof_state", state=inf["aof_state"]) == 1
    assert one(m, "disque_aof_last_write_ok") == (1 if inf["aof_last_write_status"] == "ok" else 0)
    for cmd in ("addjob", "getjob", "ackjob", "nack", "pause"):  # all ran before the scrape
        calls = int(inf[f"cmdstat_{cmd}"].split(",")[0].split("=")[1])
        assert one(m, "disque_commands_total", command=cmd) == calls
    assert one(m, "disque_slowlog_length") == r.execute_command("SLOWLOG", "LEN")
    workers = [one(m, "disque_worker_jobs", worker=str(i)) for i in range(2)]
    assert sum(workers) == int(inf["registered_jobs"])
    assert [one(m, "disque_worker_up", worker=str(i)) for i in range(2)] == [1, 1]
    assert one(m, "disque_cluster_reachable_nodes") == 0
    assert one(m, "disque_build_info", **{k: v for k, v in next(iter(m["disque_build_info"]))}) == 1


def test_node_counters_and_histograms(node: NodeProc) -> None:
    r = node.client(protocol=2)
    before = scrape(node)
    q = unique_queue("h")
    ids = [r.execute_command("ADDJOB", q, f"b{i}", 0).decode() for i in range(5)]
    got = r.execute_command("GETJOB", "COUNT", 5, "FROM", q)
    assert len(got) == 5
    r.execute_command("ACKJOB", ids[0], ids[1])
    r.execute_command("FASTACK", ids[2])
    r.execute_command("NACK", ids[3])
    r.execute_command("ENQUEUE", ids[4])
    after = scrape(node)

    def delta(name: str, **labels: str) -> float:
        return one(after, name, **labels) - one(before, name, **labels)

    assert delta("disque_jobs_added_total") == 5
    assert delta("disque_jobs_delivered_total") == 5
    assert delta("disque_jobs_acked_total") == 3
    assert delta("disque_jobs_nacked_total") == 1
    assert delta("disque_jobs_requeued_total", reason="nack") == 1
    assert delta("disque_jobs_requeued_total", reason="enqueue") == 1
    assert delta("disque_jobs_requeued_total", reason="retry") == 0
    assert delta("disque_job_wait_seconds_count") == 5  # first deliveries
    assert delta("disque_job_processing_seconds_count") == 3  # the acknowledged ones
    inf_bucket = one(after, "disque_job_wait_seconds_bucket", le="+Inf")
    assert inf_bucket == one(after, "disque_job_wait_seconds_count")
    assert one(after, "disque_job_processing_seconds_sum") >= 0


def test_the_queue_cap_keeps_the_largest(node: NodeProc) -> None:
    r = node.client(protocol=2)
    big = [unique_queue("big") for _ in range(2)]
    for q in big:
        for i in range(50):
            r.execute_command("ADDJOB", q, f"x{i}", 0)
    assert r.execute_command("CONFIG", "SET", "http-metrics-queues-max", "2") == b"OK"
    try:
        m = scrape(node)
        labelled = {dict(k)["queue"] for k in m["disque_queue_jobs_queued"]}
        assert labelled == set(big)
        assert one(m, "disque_metrics_queues_exported") == 2
    finally:
        r.execute_command("CONFIG", "SET", "http-metrics-queues-max", "100")


def test_metrics_need_the_password_when_one_is_set(tmp_path: Path) -> None:
    port = free_port()
    with NodeProc(tmp_path / "auth", workers=2, conf={"http-port": port}) as n:
        assert get(port, "/metrics").status == 200
        n.client().config_set("requirepass", "s3cret")  # every worker, at once
        denied = get(port, "/metrics")
        assert denied.status == 401
        assert denied.headers["www-authenticate"].startswith("Basic")
        assert get(port, "/metrics", password="wrong").status == 401
        ok = get(port, "/metrics", password="s3cret")
        assert ok.status == 200 and b"disque_jobs_added_total" in ok.body
        assert get(port, "/api/overview", password="s3cret").status == 200
