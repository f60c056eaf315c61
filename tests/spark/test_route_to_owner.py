"""Option ``route_to_owner``: the ``disque`` source's clients send job commands to the
owning worker's own port (``worker-ports-base``), so the node forwards none of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from disque_mp.client import Disque
from tests.node.test_worker_ports import PortsNode, forwarded
from tests.nodeproc import unique_queue as _queue
from tests.nodeproc import wait_until

pytestmark = pytest.mark.spark

rows = 300
queues_per_write = 40


@pytest.fixture(scope="module")
def ports_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PortsNode]:
    with PortsNode(Path(tmp_path_factory.mktemp("spark-wports"))) as proc:
        yield proc


def _write(spark: Any, node: PortsNode, tag: str, **options: str) -> list[str]:
    """``rows`` jobs over ``queues_per_write`` queues (queue column); the queues."""
    queues = [_queue(f"{tag}-{i}") for i in range(queues_per_write)]
    data = [(queues[i % len(queues)], f"{tag}-{i}") for i in range(rows)]
    writer = (spark.createDataFrame(data, "queue string, body string").repartition(2)
              .write.format("disque").option("nodes", f"127.0.0.1:{node.port}"))
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.mode("append").save()
    return queues


def _drain(node: PortsNode, queues: list[str]) -> list[str]:
    """Every job of the queues, taken with GETJOB and acknowledged; their bodies."""
    bodies: list[str] = []
    with Disque([f"127.0.0.1:{node.port}"], socket_timeout=30) as d:
        for q in queues:
            jobs = d.get_jobs(q, nohang=True, count=rows)
            assert d.qlen(q) == 0
            bodies += [j.body.decode() for j in jobs]
            if jobs:
                assert d.fast_ack([j.id for j in jobs]) == len(jobs)
    return bodies


def test_write_with_route_to_owner_is_never_forwarded(spark: Any,
                                                      ports_node: PortsNode) -> None:
    before = forwarded(ports_node.port)
    queues = _write(spark, ports_node, "routed", route_to_owner="true")
    assert forwarded(ports_node.port) == before
    with Disque([f"127.0.0.1:{ports_node.port}"], socket_timeout=30) as d:
        assert sum(d.qlen(q) for q in queues) == rows
    assert sorted(_drain(ports_node, queues)) == sorted(f"routed-{i}" for i in range(rows))


def test_write_without_the_option_is_forwarded(spark: Any, ports_node: PortsNode) -> None:
    before = forwarded(ports_node.port)
    queues = _write(spark, ports_node, "plain", route_to_owner="false")
    assert forwarded(ports_node.port) > before  # about half the ADDJOBs hop
    assert sorted(_drain(ports_node, queues)) == sorted(f"plain-{i}" for i in range(rows))


def test_stream_with_route_to_owner_takes_and_acks_every_job(spark: Any, ports_node: PortsNode,
                                                             tmp_path: Path) -> None:
    queue = _queue("stream-routed")
    with Disque([f"127.0.0.1:{ports_node.port}"], socket_timeout=30) as d:
        ids = d.add_jobs(((queue, f"s{i}") for i in range(200)), retry=120)
        seen: list[Any] = []
        before = forwarded(ports_node.port)
        query = (spark.readStream.format("disque")
                 .option("nodes", f"127.0.0.1:{ports_node.port}").option("queue", queue)
                 .option("route_to_owner", "true").option("max_jobs_per_batch", "80")
                 .load().writeStream.foreachBatch(lambda df, _: seen.extend(df.collect()))
                 .trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "ck")).start())
        assert query.awaitTermination(180)
        assert query.exception() is None
        assert sorted(r.id for r in seen) == sorted(ids)
        wait_until(lambda: all(d.show(i) is None for i in ids), 180, "every ACK")
        # GETJOB of one queue, WORKING and ACKJOB (the IDs of one queue: one owner) went
        # to the owner's port; only AvailableNow's QLEN (never routed) may have hopped
        assert forwarded(ports_node.port) - before <= 1
