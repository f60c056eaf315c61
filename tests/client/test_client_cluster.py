"""The client against a real 3-node cluster: discovery, -LEAVING and drop failover,
following the producer, the consumer helper's WORKING and NACK on replicated jobs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis

from disque_mp.client import Disque, Job
from disque_mp.client.aio import AsyncDisque
from tests.nodeproc import NodeProc, cluster_form_timeout_s, node_cluster, wait_until
from tests.nodeproc import unique_queue as _q

pytestmark = pytest.mark.integration

leaving_seen_timeout_s = 30.0


def _addr(node: NodeProc) -> str:
    return f"127.0.0.1:{node.port}"


def _raw(node: NodeProc) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=node.port, protocol=2, socket_timeout=10)


def _hello_sizes(nodes: list[NodeProc]) -> list[int]:
    sizes = []
    for n in nodes:
        with Disque([_addr(n)]) as d:
            sizes.append(len(d.hello().nodes))
    return sizes


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProc]]:
    with node_cluster(tmp_path_factory.mktemp("client-cluster"), 3, workers=1) as nodes:
        # what the client discovers: every node lists all three in HELLO
        wait_until(lambda: _hello_sizes(nodes) == [3, 3, 3], cluster_form_timeout_s,
                  "every node to list 3 nodes in HELLO")
        yield nodes


def test_discovery_through_hello(cluster: list[NodeProc]) -> None:
    with Disque([_addr(cluster[0])]) as d:
        hello = d.hello()
        assert {n.port for n in hello.nodes} == {n.port for n in cluster}
        assert {n.priority for n in hello.nodes} == {1}
        assert len({n.id for n in hello.nodes}) == 3
        assert hello.nodes[0].id == hello.node_id  # ourselves first


def test_leaving_node_sends_clients_elsewhere(cluster: list[NodeProc]) -> None:
    leaving = cluster[1]
    raw = _raw(leaving)
    with Disque([_addr(leaving)]) as d:
        assert d.ping() and d.address == ("127.0.0.1", leaving.port)
        assert raw.execute_command("CLUSTER", "LEAVING", "yes") in (b"OK", True)
        try:
            wait_until(lambda: any(n.priority == 100 for n in d.hello().nodes),
                      leaving_seen_timeout_s, "HELLO to show the leaving node")
            # a blocking GETJOB gets -LEAVING: the client moves and retries there
            assert d.get_jobs(_q("lv"), timeout_ms=200) == []
            assert d.address is not None and d.address[1] != leaving.port
            # a new client seeded with the leaving node only moves on after HELLO
            with Disque([_addr(leaving)]) as fresh:
                fresh.ping()
                assert fresh.address is not None and fresh.address[1] != leaving.port
        finally:
            raw.execute_command("CLUSTER", "LEAVING", "no")


def test_async_client_fails_over_from_a_leaving_node(cluster: list[NodeProc]) -> None:
    leaving = cluster[2]
    raw = _raw(leaving)

    async def main() -> None:
        async with AsyncDisque([_addr(leaving)]) as a:
            assert await a.ping() and a.address == ("127.0.0.1", leaving.port)
            assert len((await a.hello()).nodes) == 3
            raw.execute_command("CLUSTER", "LEAVING", "yes")
            try:
                assert await a.get_jobs(_q("alv"), timeout_ms=200) == []
                assert a.address is not None and a.address[1] != leaving.port
            finally:
                raw.execute_command("CLUSTER", "LEAVING", "no")

    asyncio.run(main())


def test_consumer_helper_working_and_nack_on_replicated_jobs(cluster: list[NodeProc]) -> None:
    q = _q("cw")
    with Disque([_addr(cluster[0])]) as d, Disque([_addr(cluster[2])]) as other:
        slow_id = d.add_job(q, "slow", replicate=2, retry=2)
        seen: list[tuple[str, int | None]] = []

        def handler(job: Job) -> None:
            seen.append((job.id, job.nacks))
            if len(seen) == 1:
                time.sleep(3.5)  # past RETRY: WORKING keeps it active on every copy
                assert d.show(job.id)["state"] == "active"
                assert d.qlen(q) == 0
            elif len(seen) == 2:
                raise RuntimeError("fail once")

        assert d.consume(q, handler, max_jobs=1) == 1
        after = d.show(slow_id)  # acked, or already garbage-collected
        assert after is None or after["state"] == "acked"
        assert other.qlen(q) == 0

        flaky_id = d.add_job(q, "flaky", replicate=2, retry=60)
        assert d.consume(q, handler, max_jobs=2, poll_ms=200) == 2
        assert seen[1:] == [(flaky_id, 0), (flaky_id, 1)]


def test_prefer_producer_moves_to_the_producing_node(cluster: list[NodeProc]) -> None:
    q = _q("pp")
    producer, consumer_home = cluster[2], cluster[0]
    with Disque([_addr(producer)]) as p:
        p.add_jobs(((q, f"p{i}") for i in range(1200)), retry=60)
    with Disque([_addr(consumer_home)], prefer_producer=True) as c:
        c.ping()
        taken = 0
        deadline = time.monotonic() + 60
        while c.address == ("127.0.0.1", consumer_home.port) and time.monotonic() < deadline:
            jobs = c.get_jobs(q, count=200, timeout_ms=1000)  # federation brings them over
            if jobs:
                c.fast_ack(jobs)
                taken += len(jobs)
        assert c.address == ("127.0.0.1", producer.port)
        assert taken >= 1000


def test_dropped_node_sends_clients_elsewhere(cluster: list[NodeProc]) -> None:
    doomed = cluster[1]
    with Disque([_addr(doomed)]) as d:
        assert d.ping()
        assert len(d.topology.hello.nodes) == 3  # type: ignore[union-attr]
        doomed.stop()
        job_id = d.add_job(_q("drop"), "after the crash")
        assert d.address is not None and d.address[1] != doomed.port
        assert d.show(job_id) is not None
