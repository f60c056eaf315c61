"""The ``disque`` Spark data source against a real disque-mp node (local[2])."""

from __future__ import annotations

import json
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from disque_mp.client import Disque
from tests.nodeproc import NodeProc, wait_until
from tests.nodeproc import unique_queue as _queue

pytestmark = pytest.mark.spark

query_timeout_s = 180  # the first Python data-source query alone can take ~20 s on 2 busy cores
requeue_wait_s = 60  # RETRY 2 s jobs come back well within this, even under load


def _client(node: NodeProc) -> Disque:
    return Disque([f"127.0.0.1:{node.port}"], socket_timeout=30)


def _wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    wait_until(predicate, timeout_s, what, poll_s=0.2)  # a Spark count is not cheap


def _wait_all_acked(d: Disque, ids: list[str], what: str = "every ACK") -> None:
    """Until no job of ``ids`` is known: on one node an ACKed job is gone at once."""
    _wait_for(lambda: all(d.show(i) is None for i in ids), query_timeout_s, what)


def _queue_with_jobs(d: Disque, name: str, bodies: Any, retry: int) -> tuple[str, list[str]]:
    """A new queue named after ``name`` holding one job per body: (queue, job IDs)."""
    queue = _queue(name)
    return queue, d.add_jobs(((queue, body) for body in bodies), retry=retry)


def _run_available_now(writer: Any, checkpoint: Path) -> Any:
    """Start ``writer`` (a DataStreamWriter) with the availableNow trigger, wait until
    it has taken everything there was, check it did not fail; the query."""
    query = (writer.trigger(availableNow=True)
             .option("checkpointLocation", str(checkpoint)).start())
    assert query.awaitTermination(query_timeout_s)
    assert query.exception() is None
    return query


def _failure_text(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    return str(excinfo.value)


# ----------------------------------------------------------------------------- bad options


def test_bad_options_say_what_to_fix(spark: Any, node: NodeProc, tmp_path: Path) -> None:
    df = spark.createDataFrame([("a",), ("b",)], "body string")
    addr = f"127.0.0.1:{node.port}"

    with pytest.raises(Exception) as bad_column:
        (df.write.format("disque").option("nodes", addr).option("queue_column", "nosuch")
         .mode("append").save())
    assert "no queue column 'nosuch'" in _failure_text(bad_column)
    assert "queue_column" in _failure_text(bad_column)

    with pytest.raises(Exception) as no_queue:
        df.write.format("disque").option("nodes", addr).mode("append").save()
    assert "set option queue" in _failure_text(no_queue)

    with pytest.raises(Exception) as bad_addr:
        (df.write.format("disque").option("nodes", "127.0.0.1:notaport").option("queue", "q")
         .mode("append").save())
    assert "option nodes='127.0.0.1:notaport'" in _failure_text(bad_addr)
    assert "host:port" in _failure_text(bad_addr)

    with pytest.raises(Exception) as bad_int:
        (df.write.format("disque").option("nodes", addr).option("queue", "q")
         .option("retry", "soon").mode("append").save())
    assert "option retry='soon' must be an integer" in _failure_text(bad_int)

    with pytest.raises(Exception) as typo:
        (df.write.format("disque").option("nodes", addr).option("queue", "q")
         .option("replicat", "2").mode("append").save())
    assert "unknown option(s) replicat" in _failure_text(typo)

    with pytest.raises(Exception) as bad_body:
        (spark.createDataFrame([(1,)], "body int").write.format("disque")
         .option("nodes", addr).option("queue", "q").mode("append").save())
    assert "cast it to string or binary" in _failure_text(bad_body)

    with pytest.raises(Exception) as two_queues:
        df.write.format("disque").option("nodes", addr).option("queue", "a,b").mode("append").save()
    assert "writing takes one queue" in _failure_text(two_queues)

    with pytest.raises(Exception) as bad_state:
        (spark.read.format("disque").option("nodes", addr).option("queue", "q")
         .option("states", "queued,bogus").load().collect())
    assert "unknown state(s) bogus" in _failure_text(bad_state)

    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{closed.getsockname()[1]}"
        with pytest.raises(Exception) as unreachable:
            spark.read.format("disque").option("nodes", dead).option("queue", "q").load().collect()
    assert "check the addresses" in _failure_text(unreachable)

    query = (spark.readStream.format("disque").option("nodes", addr).load()
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
             .start())
    with pytest.raises(Exception) as no_read_queue:
        query.awaitTermination(query_timeout_s)
    assert "needs option queue" in _failure_text(no_read_queue)


def test_refused_addjob_fails_the_task_with_the_server_error(spark: Any, node: NodeProc) -> None:
    queue = _queue("paused")
    with _client(node) as d:
        d.pause(queue, "in")
        df = spark.createDataFrame([("x",)], "body string")
        with pytest.raises(Exception) as refused:
            (df.write.format("disque").option("nodes", f"127.0.0.1:{node.port}")
             .option("queue", queue).mode("append").save())
        assert "PAUSED Queue paused in input" in _failure_text(refused)
        d.pause(queue, "none")


# ----------------------------------------------------------------------------- batch


def test_batch_write_then_read_back_exactly(spark: Any, node: NodeProc, tmp_path: Path) -> None:
    queue = _queue("batch")
    report = tmp_path / "report.jsonl"
    rows = 10_000
    df = spark.range(rows).selectExpr("concat('row-', cast(id as string)) as body").repartition(2)
    (df.write.format("disque").option("nodes", f"127.0.0.1:{node.port}").option("queue", queue)
     .option("retry", "300").option("report_file", str(report)).mode("append").save())

    reports = [json.loads(line) for line in report.read_text().splitlines()]
    assert [r["jobs_added"] for r in reports] == [rows]
    assert reports[0]["tasks"] == 2

    with _client(node) as d:
        assert d.qlen(queue) == rows
        back = (spark.read.format("disque").option("nodes", f"127.0.0.1:{node.port}")
                .option("queue", queue).load().collect())
        assert len(back) == rows
        assert {bytes(r.body).decode() for r in back} == {f"row-{i}" for i in range(rows)}
        assert len({r.id for r in back}) == rows
        assert {r.queue for r in back} == {queue}
        assert {r.state for r in back} == {"queued"}
        assert all(r.ctime > 0 and r.nacks == 0 for r in back)
        assert d.qlen(queue) == rows  # reading did not consume


def test_batch_write_queue_column_and_binary_body(spark: Any, node: NodeProc) -> None:
    q1, q2 = _queue("col-a"), _queue("col-b")
    data = [(q1 if i % 3 else q2, bytes([i, 0, 255])) for i in range(30)]
    df = spark.createDataFrame(data, "queue string, body binary")
    (df.write.format("disque").option("nodes", f"127.0.0.1:{node.port}")
     .option("ttl", "600").mode("append").save())
    with _client(node) as d:
        assert d.qlen(q1) == 20 and d.qlen(q2) == 10
        got = {j.body for j in d.qpeek(q2, 100)}
        assert got == {bytes([i, 0, 255]) for i in range(0, 30, 3)}
        assert all(d.show(j)["ttl"] == 600 for j in d.qpeek(q1, 100))


# ----------------------------------------------------------------------------- streaming


def _stream(spark: Any, node: NodeProc, queue: str, **options: str) -> Any:
    reader = (spark.readStream.format("disque").option("nodes", f"127.0.0.1:{node.port}")
              .option("queue", queue))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_stream_acks_only_after_the_sink_committed(spark: Any, node: NodeProc,
                                                   tmp_path: Path) -> None:
    with _client(node) as d:
        queue, ids = _queue_with_jobs(d, "stream", (f"job-{i}" for i in range(500)), 120)
        states_in_sink: list[str] = []
        seen: list[Any] = []

        def sink(batch_df: Any, batch_id: int) -> None:
            rows = batch_df.collect()
            seen.extend(rows)
            # While the sink runs, its jobs are taken but not acknowledged yet.
            states_in_sink.extend(d.show(r.id)["state"] for r in rows[:20])

        query = _run_available_now(_stream(spark, node, queue, max_jobs_per_batch="200",
                                           count="50").writeStream.foreachBatch(sink),
                                   tmp_path / "ck")

        assert sorted(r.id for r in seen) == sorted(ids)
        assert {bytes(r.body).decode() for r in seen} == {f"job-{i}" for i in range(500)}
        assert set(states_in_sink) == {"active"}
        batches = [p["numInputRows"] for p in query.recentProgress]
        assert max(batches) <= 200  # admission control
        # every job acknowledged once its batch committed (acked jobs are gone on one node);
        # the source's acker thread sends the ACKs right after commit()
        assert d.qlen(queue) == 0
        _wait_all_acked(d, ids)


def test_stream_into_memory_sink_with_processing_time_trigger(spark: Any, node: NodeProc,
                                                              tmp_path: Path) -> None:
    with _client(node) as d:
        queue, ids = _queue_with_jobs(d, "mem", (f"m{i}" for i in range(300)), 120)
        name = "disque_mem_" + uuid.uuid4().hex[:6]
        # prefetch: the next batch's jobs are taken while Spark runs this one
        query = (_stream(spark, node, queue, prefetch="true", max_jobs_per_batch="100")
                 .writeStream.format("memory").queryName(name)
                 .trigger(processingTime="500 milliseconds")
                 .option("checkpointLocation", str(tmp_path / "ck")).start())
        try:
            _wait_for(lambda: spark.table(name).count() == 300, query_timeout_s,
                      "300 rows in the memory sink")
            # the queue is idle now: the source still gets its last batch committed
            _wait_all_acked(d, ids, "every job acknowledged")
        finally:
            query.stop()
        got = spark.table(name).collect()
        assert sorted(r.id for r in got) == sorted(ids)


def test_stream_failing_before_commit_leaves_jobs_for_redelivery(spark: Any, node: NodeProc,
                                                                 tmp_path: Path) -> None:
    with _client(node) as d:
        queue, ids = _queue_with_jobs(d, "crash", (f"c{i}" for i in range(50)), 2)

        def failing_sink(batch_df: Any, batch_id: int) -> None:
            if batch_df.count():
                raise RuntimeError("sink down")

        query = (_stream(spark, node, queue, heartbeat="false").writeStream
                 .foreachBatch(failing_sink).trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "ck1")).start())
        with pytest.raises(Exception, match="sink down"):
            query.awaitTermination(query_timeout_s)

        # nothing was acknowledged: every job is still known, and comes back after RETRY
        assert all(d.show(i) is not None for i in ids)
        _wait_for(lambda: d.qlen(queue) == 50, requeue_wait_s, "the 50 jobs queued again")

        # restart from the same checkpoint: Spark re-plans the failed batch, whose jobs
        # the new source process never took (empty), then takes the requeued jobs
        seen: list[Any] = []
        _run_available_now(_stream(spark, node, queue).writeStream
                           .foreachBatch(lambda df, _: seen.extend(df.collect())),
                           tmp_path / "ck1")
        assert sorted(r.id for r in seen) == sorted(ids)
        assert all(r.additional_deliveries >= 1 for r in seen)
        _wait_all_acked(d, ids)


def test_stream_heartbeat_keeps_slow_batches_alive(spark: Any, node: NodeProc,
                                                   tmp_path: Path) -> None:
    with _client(node) as d:
        queue, ids = _queue_with_jobs(d, "slow", (f"s{i}" for i in range(20)), 2)
        seen: list[Any] = []

        def slow_sink(batch_df: Any, batch_id: int) -> None:
            rows = batch_df.collect()
            if rows:
                time.sleep(4.5)  # well past RETRY 2 s: only WORKING keeps the jobs active
                assert d.qlen(queue) == 0
                assert {d.show(r.id)["state"] for r in rows} == {"active"}
            seen.extend(rows)

        _run_available_now(_stream(spark, node, queue).writeStream.foreachBatch(slow_sink),
                           tmp_path / "ck")
        assert sorted(r.id for r in seen) == sorted(ids)
        assert all(r.additional_deliveries == 0 for r in seen)


def test_stream_write_moves_jobs_between_queues(spark: Any, node: NodeProc,
                                               tmp_path: Path) -> None:
    dst = _queue("dst")
    with _client(node) as d:
        src, _ = _queue_with_jobs(d, "src", (f"w{i}" for i in range(100)), 60)
        _run_available_now(_stream(spark, node, src)
                           .selectExpr("upper(cast(body as string)) as body")
                           .writeStream.format("disque").option("nodes", f"127.0.0.1:{node.port}")
                           .option("queue", dst).option("retry", "60"), tmp_path / "ck")
        assert d.qlen(dst) == 100
        assert {j.body for j in d.qpeek(dst, 200)} == {f"W{i}".encode() for i in range(100)}
        assert d.qlen(src) == 0
