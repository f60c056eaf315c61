"""Micro benchmarks (pytest-benchmark): the pieces on the request path, in memory.

    .venv/bin/python -m pytest bench/test_micro.py --benchmark-enable

Not part of ``make test`` (pytest's testpaths is ``tests/``). Parts that do not
exist yet are skipped with the missing module's name.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable
from typing import Any

import hiredis
import pytest

from bench.loadgen import encode as resp_request

PIPELINE = 32  # commands per read, the depth of the pipelined macro runs
QUEUE_JOBS = 1000  # jobs pushed and popped per ordered-queue round
BODY = b"x" * 100  # the memory target's body size
NODE_ID = "0123456789abcdef0123456789abcdef01234567"


def addjob_batch(n: int = PIPELINE) -> bytes:
    return resp_request(b"ADDJOB", b"queue", BODY, b"0") * n


def taken_until(take: Callable[[], Any], end: Any) -> int:
    """How many items ``take()`` returns before it returns ``end`` (a drain loop)."""
    n = 0
    while take() is not end:
        n += 1
    return n


# ------------------------------------------------------------------ RESP


def test_parse_hiredis_addjob_x32(benchmark: Any) -> None:
    data = addjob_batch()

    def parse() -> int:
        r = hiredis.Reader()
        r.feed(data)
        return taken_until(r.gets, False)

    assert benchmark(parse) == PIPELINE


def test_parse_request_parser_addjob_x32(benchmark: Any) -> None:
    resp = pytest.importorskip("disque_mp.node.resp")
    data = addjob_batch()

    def parse() -> int:
        p = resp.RequestParser(512 << 20, 1 << 20, 1 << 30)
        cmds, err = p.feed(data)
        assert err is None
        return len(cmds)

    assert benchmark(parse) == PIPELINE


def test_parse_request_parser_addjob_x1(benchmark: Any) -> None:
    """One command per read: the -P 1 case, where the per-read checks weigh most."""
    resp = pytest.importorskip("disque_mp.node.resp")
    data = b"*4\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$1\r\nx\r\n$1\r\n0\r\n"
    p = resp.RequestParser(512 << 20, 1 << 20, 1 << 30)

    def parse() -> int:
        cmds, err = p.feed(data)
        assert err is None
        return len(cmds)

    assert benchmark(parse) == 1


def test_encode_addjob_reply(benchmark: Any) -> None:
    resp = pytest.importorskip("disque_mp.node.resp")
    from workers.replies import Status

    job_id = Status("D-01234567-AAECAwQFBgcICQoLDA0ODxAR-05a1")
    assert benchmark(resp.encode, job_id).startswith(b"+D-")


def test_encode_getjob_reply_x32(benchmark: Any) -> None:
    resp = pytest.importorskip("disque_mp.node.resp")
    reply = [[b"queue", "D-01234567-AAECAwQFBgcICQoLDA0ODxAR-05a1", BODY]] * PIPELINE
    assert benchmark(resp.encode, reply).startswith(b"*32\r\n")


# ------------------------------------------------------------------ job IDs


def test_job_id_make(benchmark: Any) -> None:
    from workers.ids import JobIdGen

    gen = JobIdGen(NODE_ID, b"seed")
    assert len(benchmark(gen.make, 1234, 86400, 300)) == 40


def test_slot_of_queue(benchmark: Any) -> None:
    from workers.ids import slot_of

    assert 0 <= benchmark(slot_of, b"queue") < 16384


def test_owner_of_job_id(benchmark: Any) -> None:
    from workers.ids import JobIdGen, owner_of_job_id

    job_id = JobIdGen(NODE_ID, b"seed").make(77, 86400, 300)
    assert benchmark(owner_of_job_id, job_id, 2) == 77 % 2


# ------------------------------------------------------------------ ordered queues


def make_jobs(n: int) -> list[Any]:
    from workers.job import QUEUED, Job

    return [Job(f"D-{i:038d}", b"q", BODY, QUEUED, 1, 86400, 1_000_000 + i, 0, 300, 0, ())
            for i in range(n)]


@pytest.fixture
def jobs() -> list[Any]:
    """QUEUE_JOBS jobs for the queue benchmarks (skipped where workers.queue is not there)."""
    pytest.importorskip("workers.queue")
    return make_jobs(QUEUE_JOBS)


def push_pop_round(jobs: list[Any]) -> Callable[[], int]:
    """A fresh queue, every job pushed, then popped until empty: how many came out."""
    from workers.queue import Queue

    def round_trip() -> int:
        q = Queue(b"q", 0, 0)
        for j in jobs:
            q.push(j)
        return taken_until(q.pop, None)

    return round_trip


def test_queue_push_pop(benchmark: Any, jobs: list[Any]) -> None:
    """workers/queue.py as the shard uses it: append newest, pop oldest."""
    assert benchmark(push_pop_round(jobs)) == QUEUE_JOBS


def test_queue_push_pop_priorities(benchmark: Any, jobs: list[Any]) -> None:
    """The same with PRIORITY 0..9 in turn (ADDJOB ... PRIORITY): one level per
    priority, each pop from the highest level with a job (against test_queue_push_pop)."""
    from workers.job import JobExt

    for i, j in enumerate(jobs):
        j.ext = JobExt(priority=i % 10) if i % 10 else None
    assert benchmark(push_pop_round(jobs)) == QUEUE_JOBS


def test_queue_push_remove_half_pop(benchmark: Any, jobs: list[Any]) -> None:
    """Remove by job (ACK of a queued job, DEQUEUE) leaves stale entries to skip."""
    from workers.job import ACKED, QUEUED
    from workers.queue import Queue

    def round_trip() -> int:
        q = Queue(b"q", 0, 0)
        for j in jobs:
            j.state, j.flags = QUEUED, 0
            q.push(j)
        for j in jobs[::2]:
            j.state = ACKED
            q.remove(j)
        return taken_until(q.pop, None)

    assert benchmark(round_trip) == QUEUE_JOBS // 2


def test_baseline_heap_push_pop(benchmark: Any) -> None:
    """The alternative the shard did not pick: a heap of (ctime, seq, job)."""
    jobs = list(range(QUEUE_JOBS))

    def round_trip() -> int:
        h: list[tuple[int, int]] = []
        for i in jobs:
            heapq.heappush(h, (1_000_000 + i, i))
        n = 0
        while h:
            heapq.heappop(h)
            n += 1
        return n

    assert benchmark(round_trip) == QUEUE_JOBS


def test_baseline_deque_push_pop(benchmark: Any) -> None:
    """Lower bound for any ordered queue in Python: bare deque append/popleft."""
    jobs = list(range(QUEUE_JOBS))

    def round_trip() -> int:
        d: deque[int] = deque()
        for i in jobs:
            d.append(i)
        n = 0
        while d:
            d.popleft()
            n += 1
        return n

    assert benchmark(round_trip) == QUEUE_JOBS


# ------------------------------------------------------------------ the shard


def new_shard() -> Any:
    shard_mod = pytest.importorskip("workers.shard")
    return shard_mod.Shard(NODE_ID, 0, 1, b"seed", random.Random(1), 1_000_000)


def addjob(shard: Any, now_ms: int) -> Any:
    return shard.op_addjob(b"q", BODY, timeout_ms=0, replicate=1, delay_s=0, retry_s=300,
                           ttl_s=86400, maxlen=0, async_=False, token=0, now_ms=now_ms)


def test_shard_addjob(benchmark: Any) -> None:
    shard = new_shard()
    assert str(benchmark(addjob, shard, 1_000_000)).startswith("D-")


def test_shard_add_take_ack_x32(benchmark: Any) -> None:
    """One consumer batch: 32 ADDJOB, GETJOB COUNT 32, ACKJOB of the 32 IDs."""
    shard = new_shard()

    def cycle() -> int:
        for _ in range(PIPELINE):
            addjob(shard, 1_000_000)
        got = shard.op_take([b"q"], PIPELINE, False, 1_000_000)
        ids = [entry[1] for entry in got]
        n = shard.op_ackjob(ids, 1_000_000)
        shard.take_effects()
        return int(n)

    assert benchmark(cycle) == PIPELINE


# ------------------------------------------------------------------ GC and a big job table

GC_PREFILL_JOBS = 200_000  # a job table big enough for full collections to hurt
GC_TIMED_JOBS = 200_000  # timed on top: enough new long-lived objects for full collections (> 25 %)


@pytest.mark.parametrize("gc_on", [True, False], ids=["gc-on", "gc-off"])
def test_shard_addjob_on_big_table(benchmark: Any, gc_on: bool) -> None:
    """200,000 ADDJOB on a shard already holding 200,000 jobs, with Python's cyclic
    collector on (the default) and off: what the collector's rescans cost."""
    import gc

    def setup() -> tuple[tuple[Any], dict[str, Any]]:
        shard = new_shard()
        for i in range(GC_PREFILL_JOBS):
            addjob_to(shard, b"q%d" % (i % 16), 1_000_000 + i // 1000)
        gc.collect()
        return (shard,), {}

    def add_more(shard: Any) -> int:
        was = gc.isenabled()
        gc.enable() if gc_on else gc.disable()
        try:
            for i in range(GC_TIMED_JOBS):
                addjob_to(shard, b"q%d" % (i % 16), 2_000_000 + i // 1000)
        finally:
            gc.enable() if was else gc.disable()
        return GC_TIMED_JOBS

    assert benchmark.pedantic(add_more, setup=setup, rounds=3, iterations=1) == GC_TIMED_JOBS


def addjob_to(shard: Any, queue: bytes, now_ms: int) -> Any:
    return shard.op_addjob(queue, BODY, timeout_ms=0, replicate=1, delay_s=0, retry_s=300,
                           ttl_s=86400, maxlen=0, async_=False, token=0, now_ms=now_ms)
