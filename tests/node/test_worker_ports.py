"""Worker ports (``worker-ports-base``): worker k also listens alone on base + k, and
``Disque(route_to_owner=True)`` sends job commands straight to the owner's port."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from disque_mp.client import Disque
from disque_mp.client.core import WorkerLayout, parse_info
from tests.nodeproc import NodeProc, free_port, port_free
from tests.nodeproc import unique_queue as _q
from workers.ids import owner_of_queue

pytestmark = pytest.mark.integration


def free_worker_ports(n: int, avoid: int) -> int:
    """A base with ``n`` free ports from it, none of them ``avoid`` or its bus port."""
    for _ in range(100):
        base = free_port()
        ports = range(base, base + n)
        if avoid in ports or avoid + 10000 in ports:
            continue
        if all(port_free(p) for p in ports):
            return base
    raise RuntimeError("no free worker port range")


class PortsNode(NodeProc):
    """A 2-worker node with worker ports from ``base``."""

    def __init__(self, workdir: Path) -> None:
        port = free_port()
        self.base = free_worker_ports(2, port)
        super().__init__(workdir, workers=2, port=port, conf={"worker-ports-base": self.base})


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PortsNode]:
    proc = PortsNode(Path(tmp_path_factory.mktemp("wports")))
    with proc:
        yield proc


def _redis(port: int) -> redis.Redis:
    r = redis.Redis(host="127.0.0.1", port=port, protocol=2, socket_timeout=30)
    r.response_callbacks.pop("INFO", None)
    return r


def _info_workers(port: int) -> dict[str, str]:
    r = _redis(port)
    try:
        return parse_info(r.execute_command("INFO", "workers"))
    finally:
        r.close()


def forwarded(port: int) -> int:
    """Commands the node's workers sent to another worker over the mesh, so far."""
    info = _info_workers(port)
    return sum(int(v.split("forwarded=")[1].split(",")[0]) for k, v in info.items()
               if k.startswith("worker") and "forwarded=" in v)


def _queue_of(owner: int, workers: int = 2) -> str:
    while True:
        q = _q("wp")
        if owner_of_queue(q.encode(), workers) == owner:
            return q


def test_worker_ports_answer_and_are_announced(node: PortsNode) -> None:
    base = node.base
    info = _info_workers(node.port)
    assert info["worker_ports"] == f"{base},{base + 1}"
    for k in (0, 1):
        r = _redis(base + k)
        try:
            assert r.ping()
            assert r.execute_command("CONFIG", "GET", "worker-ports-base") == \
                [b"worker-ports-base", str(base).encode()]
            # a worker port is that worker's alone
            assert parse_info(r.execute_command("INFO", "workers"))["connection_worker"] == str(k)
        finally:
            r.close()


def test_a_queue_reached_on_its_owners_port_is_not_forwarded(node: PortsNode) -> None:
    base = node.base
    q = _queue_of(1)
    before = forwarded(node.port)
    r = _redis(base + 1)
    try:
        job_id = r.execute_command("ADDJOB", q, "body", 0).decode()
        [[queue, got, body]] = r.execute_command("GETJOB", "NOHANG", "FROM", q)
        assert (queue, got, body) == (q.encode(), job_id.encode(), b"body")
        assert r.execute_command("ACKJOB", job_id) == 1
    finally:
        r.close()
    assert forwarded(node.port) == before
    # the other worker's port still serves it, over the mesh (fewer commands than a handoff)
    r = _redis(base)
    try:
        job_id = r.execute_command("ADDJOB", q, "body", 0).decode()
        assert r.execute_command("FASTACK", job_id) == 1
    finally:
        r.close()
    assert forwarded(node.port) == before + 2


def _workload(d: Disque, tag: str) -> list[str]:
    """Jobs over many queues, every command of one queue or one job; the IDs left
    to acknowledge."""
    queues = [f"{tag}-{i}" for i in range(200)]
    ids = d.add_jobs([(q, f"a-{q}") for q in queues])
    ids += [d.add_job(q, f"b-{q}") for q in queues[:20]]
    seen: dict[str, bytes] = {}
    for q in queues:
        for job in d.get_jobs(q, nohang=True, count=10):
            assert job.queue == q
            seen[job.id] = job.body
    assert sorted(seen) == sorted(ids)
    assert d.get_job(queues[2], nohang=True) is None  # its jobs are all out
    assert d.show(ids[0])["queue"] == queues[0]  # type: ignore[index]
    assert d.working(ids[0]) > 0
    assert d.nack(ids[1]) == 1
    again = d.get_jobs(queues[1], nohang=True)
    assert [j.id for j in again] == [ids[1]]
    assert sum(d.ack(i) for i in ids[:100]) == 100
    return ids[100:]


def test_route_to_owner_adds_gets_acks_without_the_hop(node: PortsNode) -> None:
    with Disque([f"127.0.0.1:{node.port}"], socket_timeout=30) as plain:
        plain.ping()
        assert plain.routes is None
        before = forwarded(node.port)
        rest = _workload(plain, _q("plain"))
        assert forwarded(node.port) - before > 100
        assert plain.fast_ack(rest) == len(rest)
    with Disque([f"127.0.0.1:{node.port}"], socket_timeout=30, route_to_owner=True) as d:
        d.ping()
        base = node.base
        assert d.routes is not None and d.routes.layout == WorkerLayout(2, (base, base + 1))
        before = forwarded(node.port)
        rest = _workload(d, _q("routed"))
        assert forwarded(node.port) - before == 0
        # IDs of both workers in one call: the main connection, the node splits it
        assert d.fast_ack(rest) == len(rest)
        assert forwarded(node.port) - before > 0


def test_a_fresh_clients_first_pipeline_is_routed_too(node: PortsNode) -> None:
    """The client learns the ports when it connects; with route_to_owner it connects
    before its first command, so even a first pipeline takes no hop."""
    from disque_mp.client.aio import AsyncDisque

    tag = _q("fresh")
    queues = [f"{tag}-{i}" for i in range(60)]
    before = forwarded(node.port)
    with Disque([f"127.0.0.1:{node.port}"], socket_timeout=30, route_to_owner=True) as d:
        ids = d.add_jobs([(q, "x") for q in queues])
        assert forwarded(node.port) == before
        assert d.fast_ack(*ids) == len(ids)

    async def run() -> int:
        async with AsyncDisque([f"127.0.0.1:{node.port}"], socket_timeout=30,
                               route_to_owner=True) as a:
            before = forwarded(node.port)
            ids = await a.add_jobs([(q, "y") for q in queues])
            assert len(ids) == len(queues)
            return forwarded(node.port) - before

    assert asyncio.run(run()) == 0


def test_a_worker_port_that_fails_sends_its_commands_the_normal_way(node: PortsNode) -> None:
    with socket.socket() as closed, \
            Disque([f"127.0.0.1:{node.port}"], socket_timeout=30, route_to_owner=True) as d:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        dead = closed.getsockname()[1]
        d.ping()
        assert d.routes is not None
        base = node.base
        d.routes.layout = WorkerLayout(2, (base, dead))  # worker 1 announced wrong
        q0, q1 = _queue_of(0), _queue_of(1)
        ids = d.add_jobs([(q0, "x"), (q1, "y")] * 5)
        ids.append(d.add_job(q1, "z"))
        assert 1 in d.routes.down_until and 0 not in d.routes.down_until
        assert len(d.get_jobs(q1, nohang=True, count=100)) == 6
        assert len(d.get_jobs(q0, nohang=True, count=100)) == 5
        assert d.ack(ids) == 11


def test_route_to_owner_against_a_node_without_worker_ports(tmp_path: Path) -> None:
    with NodeProc(tmp_path, workers=2) as plain_node, \
            Disque([f"127.0.0.1:{plain_node.port}"], socket_timeout=30,
                   route_to_owner=True) as d:
        assert d.ping()
        assert d.routes is None
        assert _info_workers(plain_node.port)["worker_ports"] == ""
        q = _q("np")
        job_id = d.add_job(q, "x")
        assert [j.id for j in d.get_jobs(q, nohang=True)] == [job_id]
        assert d.ack(job_id) == 1


def test_async_route_to_owner_without_the_hop(node: PortsNode) -> None:
    from disque_mp.client.aio import AsyncDisque

    async def run() -> None:
        async with AsyncDisque([f"127.0.0.1:{node.port}"], socket_timeout=30,
                               route_to_owner=True) as d:
            await d.ping()
            assert d.routes is not None
            assert d.routes.layout == WorkerLayout(2, (node.base, node.base + 1))
            tag = _q("aio")
            queues = [f"{tag}-{i}" for i in range(100)]
            ids = await d.add_jobs([(q, "x") for q in queues])
            ids.append(await d.add_job(queues[0], "y"))
            got = [j for q in queues for j in await d.get_jobs(q, nohang=True, count=5)]
            assert sorted(j.id for j in got) == sorted(ids)
            assert sum([await d.ack(i) for i in ids]) == len(ids)

    before = forwarded(node.port)
    asyncio.run(run())
    assert forwarded(node.port) == before


def test_worker_ports_ask_for_the_password_too(tmp_path: Path) -> None:
    port = free_port()
    base = free_worker_ports(2, port)
    with NodeProc(tmp_path, workers=2, port=port, conf={"worker-ports-base": base}):
        r = _redis(port)  # readiness is checked without a password: set it once up
        try:
            assert r.execute_command("CONFIG", "SET", "requirepass", "s3cret") == b"OK"
        finally:
            r.close()
        r = _redis(base + 1)
        try:
            with pytest.raises(redis.AuthenticationError):
                r.execute_command("ADDJOB", _queue_of(1), "x", 0)
        finally:
            r.close()
        with Disque([f"127.0.0.1:{port}"], socket_timeout=30, password="s3cret",
                    route_to_owner=True) as d:
            assert d.ping() and d.routes is not None
            q = _queue_of(1)
            job_id = d.add_job(q, "x")
            assert d.ack(job_id) == 1
            assert 1 not in d.routes.down_until and 1 in d._workers
