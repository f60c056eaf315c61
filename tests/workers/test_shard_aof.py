"""Job records (to_record/from_record, deletion records) and the shard's AOF side:
AofAppend effects when ``shard.aof`` is on, and ``load_record`` replay."""

from __future__ import annotations

import random
from typing import Any

import pytest

from workers.effects import AofAppend
from workers.ids import JobIdGen, slot_of
from workers.job import (
    ACKED,
    ACTIVE,
    DEL_RECORD_TAG,
    FLAG_DELIVERED,
    FLAG_IN_DEQUE,
    QUEUED,
    RECORD_VERSION,
    Job,
    del_record,
    delay_max_s,
    job_id_of_record,
    retry_max_s,
    ttl_max_s,
)
from workers.shard import Shard

NODE = "739317b21b9046a3454204425426c55a12ccc07a"
OTHER = "dcb833cf8f42fbb7924d92335ff6d67d3cea6e3d"
T0 = 1_795_301_808_328
# an ID of queue q (its slot): a loaded job of another slot is refused
JID = JobIdGen(OTHER, b"seed").make(slot_of(b"q"), 60, 6)


def fields(j: Job) -> tuple[Any, ...]:
    return (j.id, j.queue, j.body, j.state, j.repl, j.ttl_s, j.ctime_us, j.delay_s, j.retry_s,
            j.nacks, j.additional_deliveries, j.qtime_ms, j.delivered, j.confirmed,
            j.flags & ~FLAG_IN_DEQUE)


def test_record_round_trip() -> None:
    j = Job(JID, b"q\x00\xff", bytes(range(256)) * 40, QUEUED, 3, 86400, T0 * 1_000 + 7,
            5, 300, T0 + 300_000, (NODE, OTHER), (OTHER,))
    j.nacks, j.additional_deliveries, j.flags = 4, 9, FLAG_DELIVERED | FLAG_IN_DEQUE
    rec = j.to_record()
    assert rec[0] == RECORD_VERSION
    back = Job.from_record(rec)
    assert fields(back) == fields(j)
    assert not back.flags & FLAG_IN_DEQUE  # deque membership is not part of a job
    assert job_id_of_record(rec) == JID
    big = Job(JID, b"q", b"", ACKED, 1, ttl_max_s, 2**50, delay_max_s, retry_max_s, 2**63, ())
    assert fields(Job.from_record(big.to_record())) == fields(big)
    # Past the named maxima a record is refused: such a job could not be re-encoded
    # once its requeue time is computed.
    for ttl, delay, retry in ((2**40, 0, 1), (60, 2**33, 1), (60, 0, 2**33)):
        with pytest.raises(ValueError):
            Job.from_record(Job(JID, b"q", b"", ACKED, 1, ttl, 1, delay, retry, 0, ()).to_record())


@pytest.mark.parametrize("cut", [0, 1, 10, 60, -1])
def test_record_truncated_or_bad(cut: int) -> None:
    rec = Job(JID, b"q", b"body", ACTIVE, 1, 60, 1, 0, 6, 0, (NODE,)).to_record()
    with pytest.raises(ValueError):
        Job.from_record(rec[:cut])
    with pytest.raises(ValueError):
        Job.from_record(rec + b"x")
    with pytest.raises(ValueError):
        Job.from_record(bytes([99]) + rec[1:])


def test_del_record() -> None:
    rec = del_record(JID)
    assert rec[0] == DEL_RECORD_TAG and job_id_of_record(rec) == JID
    for bad in (b"", bytes([DEL_RECORD_TAG]), b"\x05garbage"):
        with pytest.raises(ValueError):
            job_id_of_record(bad)


class Env:
    def __init__(self, aof: bool = True) -> None:
        self.now = T0
        self.s = Shard(NODE, 0, 1, b"seed", random.Random(1), T0)
        self.s.aof = aof

    def add(self, queue: bytes = b"q", **kw: Any) -> str:
        args: dict[str, Any] = dict(timeout_ms=0, replicate=None, delay_s=0, retry_s=None,
                                    ttl_s=3600, maxlen=0, async_=False, token=0)
        args.update(kw)
        return str(self.s.op_addjob(queue, b"body", now_ms=self.now, **args))

    def records(self) -> list[bytes]:
        effs = self.s.take_effects()
        assert all(isinstance(e, AofAppend) for e in effs)
        return [e.record for e in effs if isinstance(e, AofAppend)]


def test_no_records_when_aof_off() -> None:
    e = Env(aof=False)
    a = e.add()
    e.s.op_nack([a], e.now)
    e.s.op_ackjob([a], e.now)
    assert e.s.take_effects() == []


def test_records_for_every_change() -> None:
    e = Env()
    a = e.add(retry_s=5)
    (rec,) = e.records()
    assert Job.from_record(rec).id == a and Job.from_record(rec).state == QUEUED
    e.s.op_take([b"q"], 1, False, e.now)
    assert e.records() == []  # deliveries are not persisted: reload makes jobs active anyway
    e.s.op_nack([a], e.now)
    assert Job.from_record(e.records()[0]).nacks == 1
    e.s.op_dequeue([a], e.now)
    assert Job.from_record(e.records()[0]).state == ACTIVE
    e.s.op_working(a, e.now)
    assert len(e.records()) == 1
    e.now += 6_000
    e.s.tick(e.now)
    assert Job.from_record(e.records()[0]).state == QUEUED  # timer requeue
    e.s.op_ackjob([a], e.now)
    assert e.records() == [del_record(a)]
    b = e.add(ttl_s=10)
    e.records()
    e.now += 11_000
    e.s.tick(e.now)
    assert e.records() == [del_record(b)]  # TTL expiry
    c = e.add()
    e.records()
    e.s.op_deljob([c], e.now)
    assert e.records() == [del_record(c)]


def test_replay_rebuilds_jobs_as_active() -> None:
    e = Env()
    a, b = e.add(), e.add(b"r", retry_s=0, replicate=1)
    d = e.add(delay_s=100, ttl_s=3600)
    gone = e.add()
    e.s.op_take([b"r"], 1, False, e.now)
    e.s.op_deljob([gone], e.now)
    log = e.records()
    r = Shard(NODE, 0, 1, b"seed2", random.Random(2), T0)
    for rec in log:
        r.load_record(rec, False, e.now + 1_000)
    r.check()
    assert r.lookup(gone) is None
    assert r.info()["registered_jobs"] == 3
    assert r.lookup(a).state == ACTIVE  # type: ignore[union-attr]
    assert r.op_qlen(b"q") == 0
    delayed = r.lookup(d)
    assert delayed is not None and delayed.qtime_ms == T0 + 100_000  # DELAY still pending
    at_most_once = r.lookup(b)
    assert at_most_once is not None and at_most_once.qtime_ms == 0
    r.tick(T0 + 400_000)
    assert r.op_qlen(b"q") == 2  # a requeued after RETRY, d after its DELAY
    assert r.op_qlen(b"r") == 0  # RETRY 0: never queued again
    r.check()


def test_replay_with_enqueue_restores_queues_in_order() -> None:
    e = Env()
    ids = [e.add() for _ in range(5)]
    e.s.op_take([b"q"], 1, False, e.now)
    log = e.records()
    r = Shard(NODE, 0, 1, b"seed2", random.Random(2), T0)
    for rec in reversed(log):  # file order does not matter for queue order
        r.load_record(rec, True, e.now)
    assert [x[1] for x in r.op_qpeek(b"q", 10)] == ids
    r.check()
    # new jobs get later ctimes than the loaded ones
    nid = r.op_addjob(b"q", b"n", timeout_ms=0, replicate=None, delay_s=0, retry_s=None,
                      ttl_s=60, maxlen=0, async_=False, token=0, now_ms=T0)
    assert r.op_qpeek(b"q", -1)[0][1] == nid


def test_replay_drops_expired_and_local_acks_and_replaces() -> None:
    r = Shard(NODE, 0, 1, b"seed", random.Random(1), T0)
    old = Job(JID, b"q", b"v1", QUEUED, 1, 60, T0 * 1_000, 0, 6, 0, (NODE,))
    r.load_record(old.to_record(), True, T0)
    old.body = b"v2"
    r.load_record(old.to_record(), True, T0)  # the later record wins
    assert r.op_qpeek(b"q", 5) == [[b"q", JID, b"v2"]]
    r.load_record(del_record(JID), True, T0)
    assert r.lookup(JID) is None and r.op_qlen(b"q") == 0
    r.load_record(old.to_record(), True, T0 + 61_000)  # expired while down
    assert r.lookup(JID) is None
    acked = Job(JID, b"q", b"", ACKED, 1, 60, T0 * 1_000, 0, 6, 0, (NODE,))
    r.load_record(acked.to_record(), True, T0)
    assert r.lookup(JID) is None  # nobody else holds a copy: the ACK is final
    acked.delivered = (NODE, OTHER)
    r.load_record(acked.to_record(), True, T0)
    assert r.lookup(JID).state == ACKED  # type: ignore[union-attr]
    r.check()
    with pytest.raises(ValueError):
        r.load_record(b"\x01short", True, T0)


def test_a_delayed_add_and_a_delayed_nack_each_write_one_record_after_the_move() -> None:
    """ADDJOB ... DELAY and NACK ... DELAY: the move writes one record, of the job as
    the move left it (active, its requeue time at the end of the delay)."""
    e = Env()
    a = e.add(retry_s=5, delay_s=30)
    (rec,) = e.records()
    job = Job.from_record(rec)
    assert job.id == a and job.state == ACTIVE and job.qtime_ms == e.now + 30_000
    e.now += 31_000
    e.s.tick(e.now)
    assert Job.from_record(e.records()[0]).state == QUEUED  # its DELAY ended
    e.s.op_take([b"q"], 1, False, e.now)
    e.records()
    assert e.s.op_nack([a], e.now, delay_s=20) == 1
    (rec,) = e.records()
    job = Job.from_record(rec)
    assert job.state == ACTIVE and job.nacks == 1 and job.qtime_ms == e.now + 20_000
