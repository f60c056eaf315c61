"""workers/evict.py on a real in-memory shard: what goes under memory pressure, what stays."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from workers import evict
from workers.effects import AofAppend
from workers.job import ACKED, ACTIVE, DEL_RECORD_TAG, FLAG_DELIVERED, QUEUED, job_id_of_record
from workers.replies import ERR_OOM
from workers.shard import Shard

NODE = "739317b21b9046a3454204425426c55a12ccc07a"
OTHER = "a" * 40
T0 = 1_795_301_808_328


def shard() -> Shard:
    return Shard(NODE, 0, 1, b"seed", random.Random(3), T0)


def add(s: Shard, queue: bytes = b"q", body: bytes = b"body", **kw: Any) -> str:
    args: dict[str, Any] = dict(timeout_ms=0, replicate=None, delay_s=0, retry_s=None,
                                ttl_s=86400, maxlen=0, async_=False, token=0)
    args.update(kw)
    reply = s.op_addjob(queue, body, now_ms=T0, **args)
    assert isinstance(reply, str) and reply.startswith("D-"), reply
    return str(reply)


def acked_kept(s: Shard, queue: bytes = b"acks") -> str:
    """An ACK the shard keeps: another node may hold a copy (so it is not GCed at once)."""
    jid = add(s, queue)
    job = s.lookup(jid)
    assert job is not None
    job.delivered = (NODE, OTHER)
    assert s.op_ackjob([jid], T0) == 1
    assert s.lookup(jid) is not None and s.lookup(jid).state == ACKED  # type: ignore[union-attr]
    return jid


def body_sum(s: Shard) -> int:
    return sum(len(j.body) for j in s.jobs())


def test_job_evictable_predicate() -> None:
    s = shard()
    queued0 = add(s, b"a", retry_s=0, replicate=1)
    queued = add(s, b"b")
    delivered0 = add(s, b"c", retry_s=0, replicate=1)
    delivered = add(s, b"d")
    s.op_take([b"c"], 1, False, T0)
    s.op_take([b"d"], 1, False, T0)
    acked = acked_kept(s)
    dequeued0 = add(s, b"e", retry_s=0, replicate=1)
    s.op_dequeue([dequeued0], T0)
    want = {queued0: False, queued: False, delivered0: True, delivered: False, acked: True,
            dequeued0: False}
    for jid, expected in want.items():
        job = s.lookup(jid)
        assert job is not None
        assert evict.job_evictable(job) is expected, (job, job.retry_s, job.flags & FLAG_DELIVERED)


def test_evict_step_drops_only_what_breaks_no_guarantee() -> None:
    s = shard()
    s.aof = True
    keep = [add(s, b"work", b"x" * 100) for _ in range(20)]  # queued at-least-once
    keep += [add(s, b"amo", b"y" * 100, retry_s=0, replicate=1) for _ in range(5)]  # queued RETRY 0
    gone = [add(s, b"amo2", b"z" * 100, retry_s=0, replicate=1) for _ in range(7)]
    assert len(s.op_take([b"amo2"], 7, False, T0)) == 7  # delivered RETRY 0
    inflight = [add(s, b"inflight", b"w" * 10) for _ in range(3)]
    assert len(s.op_take([b"inflight"], 3, False, T0)) == 3  # delivered, RETRY > 0: stays
    keep += inflight
    gone += [acked_kept(s) for _ in range(4)]
    s.op_take([b"empty"], 1, False, T0)  # creates an empty queue
    s.op_pause(b"paused", ["in"], T0)  # paused empty queue: goes too (workers/pause.py)
    add(s, b"pausedfull")
    s.op_pause(b"pausedfull", ["in"], T0)  # paused with a job: stays
    s.op_block(99, [b"watched"], 1, False, T0)  # a waiter: stays
    s.take_effects()

    cursor = evict.EvictCursor()
    jobs, queues = evict.evict_step(s, cursor, T0)
    s.check()
    assert jobs == len(gone)
    for jid in gone:
        assert s.lookup(jid) is None
    for jid in keep:
        assert s.lookup(jid) is not None
    assert all(s.lookup(j).state == QUEUED for j in keep[:25])  # type: ignore[union-attr]
    assert all(s.lookup(j).state == ACTIVE for j in inflight)  # type: ignore[union-attr]
    names = set(s.core.queues)
    # empty queues go, even one whose jobs are in flight: a requeue creates it again
    assert names.isdisjoint({b"empty", b"amo2", b"acks", b"inflight", b"paused"})
    assert {b"work", b"amo", b"pausedfull", b"watched"} <= names
    assert s.op_qstat(b"pausedfull", T0)[19] == "in" and s.op_qstat(b"watched", T0)[9] == 1
    assert queues == 5
    # every eviction is in the AOF as a deletion record
    dels = [e.record for e in s.take_effects() if isinstance(e, AofAppend)]
    assert all(r[0] == DEL_RECORD_TAG for r in dels)
    assert sorted(job_id_of_record(r) for r in dels) == sorted(gone)
    assert s.body_bytes == body_sum(s)
    assert s.op_nack(inflight, T0) == 3  # in-flight jobs lost nothing
    assert s.op_qlen(b"inflight") == 3
    s.check()


def test_op_evict_queue_refuses_watched_and_nonempty_queues_not_paused_ones() -> None:
    s = shard()
    s.op_pause(b"p", ["in"], T0)
    s.op_block(5, [b"w"], 1, False, T0)
    s.op_pause(b"w", ["out"], T0)
    add(s, b"full")
    s.op_pause(b"full", ["all"], T0)
    assert [s.op_evict_queue(n) for n in (b"w", b"full", b"nosuch")] == [False] * 3
    assert s.op_evict_queue(b"p")  # paused, empty, unwatched: memory pressure takes it
    s.op_unblock(5, T0)
    assert s.op_evict_queue(b"w")
    assert set(s.core.queues) == {b"full"}
    s.check()


def test_past_maxmemory_pause_creates_no_queue() -> None:
    s = shard()
    s.op_pause(b"old", ["in"], T0)
    s.set_memory_level(3)
    assert s.op_pause(b"new", ["in"], T0) == ERR_OOM
    assert s.op_pause(b"new", ["none"], T0) == "none"  # nothing to create: no refusal
    assert s.op_pause(b"new", [], T0) == "none"  # a state query
    assert s.op_pause(b"old", ["all"], T0) == "all"  # an existing queue: allowed
    assert s.op_pause(b"old", ["none"], T0) == "none"
    s.on_message("b" * 40, "PAUSE", {"f": 1}, [b"frompeer"], T0)
    assert b"new" not in s.core.queues and b"frompeer" not in s.core.queues
    s.set_memory_level(2)
    assert s.op_pause(b"new", ["in"], T0) == "in"
    s.check()


def test_bounded_passes_cover_the_whole_shard() -> None:
    s = shard()
    gone = []
    for i in range(300):
        gone.append(add(s, b"q%d" % (i % 7), b"b" * (i % 50), retry_s=0, replicate=1))
        add(s, b"keep", b"k")
    for i in range(7):
        s.op_take([b"q%d" % i], 1000, False, T0)
    cursor = evict.EvictCursor()
    total = passes = 0
    while True:
        jobs, _ = evict.evict_step(s, cursor, T0, visit_jobs_max=16, visit_queues_max=2)
        total += jobs
        passes += 1
        s.check()
        if cursor.jobs == 0:
            break
        assert passes < 1000
    assert passes > 1  # the bound was effective
    assert total == len(gone)
    assert all(s.lookup(j) is None for j in gone)
    assert s.op_qlen(b"keep") == 300
    assert s.body_bytes == body_sum(s) == 300


def test_body_bytes_follows_every_path() -> None:
    s = shard()
    ids = [add(s, b"q", b"x" * n) for n in range(0, 2000, 100)]
    assert s.body_bytes == body_sum(s) == sum(range(0, 2000, 100))
    s.op_ackjob(ids[:3], T0)
    s.op_deljob(ids[3:5], T0)
    s.op_fastack(ids[5:6], T0)
    assert s.body_bytes == body_sum(s)
    add(s, b"ttl", b"t" * 1000, ttl_s=1)
    s.tick(T0 + 2000)
    assert s.body_bytes == body_sum(s)
    s.op_flushall()
    assert s.body_bytes == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("add add0 delay take ack ackk nack deq enq work tick".split()),
                          st.integers(0, 40)), max_size=120),
       st.integers(1, 64))
def test_random_histories_never_lose_a_guaranteed_job(ops: list[tuple[str, int]], visit: int) -> None:
    """Whatever happened before, a full eviction cycle drops exactly the evictable
    jobs: every queued job and every unacked at-least-once job stays."""
    s = shard()
    now = T0
    ids: list[str] = []
    for op, k in ops:
        q = b"q%d" % (k % 3)
        jid = ids[k % len(ids)] if ids else None
        if op in ("add", "add0", "delay"):
            kw: dict[str, Any] = {"retry_s": 0, "replicate": 1} if op == "add0" else {}
            reply = s.op_addjob(q, b"x" * k, timeout_ms=0, replicate=kw.get("replicate"),
                                delay_s=1 if op == "delay" else 0, retry_s=kw.get("retry_s"),
                                ttl_s=3600, maxlen=0, async_=False, token=0, now_ms=now)
            ids.append(str(reply))
        elif op == "take":
            s.op_take([q], 1 + k % 3, False, now)
        elif jid is None:
            continue
        elif op == "ack":
            s.op_ackjob([jid], now)
        elif op == "ackk":  # an ACK kept because another node may hold a copy
            job = s.lookup(jid)
            if job is not None:
                job.delivered = (NODE, OTHER)
                s.op_ackjob([jid], now)
        elif op == "nack":
            s.op_nack([jid], now)
        elif op == "deq":
            s.op_dequeue([jid], now)
        elif op == "enq":
            s.op_enqueue([jid], now)
        elif op == "work":
            s.op_working(jid, now)
        else:
            now += 100 * k
            while (due := s.tick(now)) is not None and due <= now:
                pass
    s.check()
    before = {j.id: (j.state, j.retry_s, bool(j.flags & FLAG_DELIVERED)) for j in s.jobs()}
    cursor = evict.EvictCursor()
    while True:
        evict.evict_step(s, cursor, now, visit_jobs_max=visit, visit_queues_max=visit)
        if cursor.jobs == 0:
            break
    s.check()
    after = {j.id for j in s.jobs()}
    for jid, (state, retry_s, delivered) in before.items():
        garbage = state == ACKED or (state == ACTIVE and retry_s == 0 and delivered)
        assert (jid not in after) == garbage, (jid, state, retry_s, delivered)
    assert s.body_bytes == body_sum(s)


def test_results_go_first_then_acknowledged_jobs() -> None:
    """Stored results (ACKJOB ... RESULT) are evicted before any acknowledged job."""
    s = shard()
    kept = acked_kept(s)
    for _ in range(3):
        s.op_ack_result(add(s, b"r"), b"v" * 50, T0)
    assert s.extra_bytes > 0 and s.results_info()["results"] == 3
    cursor = evict.EvictCursor()
    assert evict.evict_step(s, cursor, T0, visit_jobs_max=2) == (2, 0)  # results only
    assert s.lookup(kept) is not None and s.results_info()["results"] == 1
    assert evict.evict_step(s, cursor, T0) == (1, 0)
    assert s.results_info()["results"] == 0 and s.extra_bytes == 0
    assert s.lookup(kept) is not None
    jobs, _queues = evict.evict_step(s, cursor, T0)  # no result left: the ACK goes
    assert jobs == 1 and s.lookup(kept) is None
