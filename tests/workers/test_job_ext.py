"""The job's extension fields (GROUP, DEDUP, dead-letter reason): kept in the
record (AOF, REPLJOB, YOURJOBS), shown by SHOW only when set, parsed by ADDJOB."""

from __future__ import annotations

import random

import pytest

from disque_mp.node.commands.jobs import ERR_DEDUP, ERR_GROUP, parse_addjob
from tests.sim.net import Net
from tests.workers.test_shard import Env
from workers.job import (
    FLAG_IN_DEQUE,
    FLAG_WILLQUEUE_SENT,
    Job,
    JobExt,
    dead_reason_bytes_max,
    job_id_of_record,
    maxdeliver_max,
)


def test_a_job_with_extension_fields_round_trips_in_version_3() -> None:
    env = Env()
    jid = env.add(maxdeliver=3, ext=JobExt(group=b"tenant-a", dedup=b"k1"))
    job = env.s.lookup(jid)
    assert job is not None
    job.set_ext(reason=b"x" * dead_reason_bytes_max)
    rec = job.to_record()
    assert rec[0] == 3 and job_id_of_record(rec) == jid
    back = Job.from_record(rec)
    assert (back.group, back.dedup, back.dead_reason) == (b"tenant-a", b"k1", b"x" * 1024)
    assert back.maxdeliver == 3 and back.body == job.body and back.queue == b"q"
    assert Job.from_record(back.to_record()).to_record() == rec
    for cut in (10, len(rec) - 1):
        with pytest.raises(ValueError):
            Job.from_record(rec[:cut])
    with pytest.raises(ValueError):
        Job.from_record(rec + b"z")


def test_clearing_every_field_writes_the_old_versions_again() -> None:
    env = Env()
    plain = env.s.lookup(env.add(ext=JobExt(group=b"g")))
    assert plain is not None and plain.to_record()[0] == 3
    plain.set_ext(group=b"")
    assert plain.ext is None and plain.to_record()[0] == 1


def test_show_lists_the_fields_only_when_set() -> None:
    env = Env()
    plain = env.add()
    assert not {b"group", b"dedup", b"dead-reason"} & set(env.show_all(plain))
    grouped = env.add(ext=JobExt(group=b"g1", dedup=b"d1"))
    shown = env.show_all(grouped)
    assert shown[b"group"] == b"g1" and shown[b"dedup"] == b"d1" and b"dead-reason" not in shown


def test_addjob_parses_group_and_dedup_with_their_bounds() -> None:
    a = parse_addjob([b"q", b"body", b"0", b"GROUP", b"t1", b"dedup", b"key", b"RETRY", b"5"])
    assert not isinstance(a, type(ERR_GROUP))
    assert a.ext is not None and (a.ext.group, a.ext.dedup) == (b"t1", b"key") and a.retry_s == 5
    assert parse_addjob([b"q", b"b", b"0", b"GROUP", b""]) is ERR_GROUP
    assert parse_addjob([b"q", b"b", b"0", b"GROUP", b"g" * 257]) is ERR_GROUP
    assert parse_addjob([b"q", b"b", b"0", b"DEDUP", b"k" * 257]) is ERR_DEDUP
    plain = parse_addjob([b"q", b"b", b"0", b"RETRY", b"5"])
    assert not isinstance(plain, type(ERR_GROUP)) and plain.ext is None


def test_replicated_copies_carry_the_fields() -> None:
    net = Net(3, seed=5)
    a, b, c = net.ids
    r = net.addjob(a, replicate=3, ext=JobExt(group=b"tenant", dedup=b"once"))
    net.run(50)
    jid = str(net.reply(a, r))
    for n in (b, c):
        copy = net.nodes[n].shard.lookup(jid)
        assert copy is not None and (copy.group, copy.dedup) == (b"tenant", b"once")
    net.check()


def test_a_plain_record_with_node_lists_round_trips_and_every_cut_is_refused() -> None:
    node = "ab" * 20
    job = Job("D-03ba2ca4-IaqLzxg45TsVrduvnBtH4dPM-003d", b"queue", b"body", 1, 3, 3600,
              1_700_000_000_000_000, 5, 60, 0, (node, "cd" * 20, "ef" * 20), (node,))
    job.nacks, job.additional_deliveries = 2, 7
    rec = job.to_record()
    back = Job.from_record(rec)
    assert back.to_record() == rec
    assert (back.delivered, back.confirmed) == (job.delivered, job.confirmed)
    assert (back.nacks, back.additional_deliveries, back.ctime_us, back.delay_s) == (
        2, 7, 1_700_000_000_000_000, 5)
    for cut in range(len(rec)):  # inside the head, the strings and every node length
        with pytest.raises(ValueError):
            Job.from_record(rec[:cut])


def _to_record_before(job: Job) -> bytes:
    """``Job.to_record`` as it was written first (one Struct per version, the fields
    packed from a tuple): the oracle of the bound-pack form."""
    import struct

    jid = job.id.encode()
    nodes = [n.encode() for n in job.delivered] + [n.encode() for n in job.confirmed]
    ext = job.ext
    version = 3 if ext is not None else (2 if job.maxdeliver else 1)
    fields = (version, job.state, job.flags & 0xFF & ~(FLAG_IN_DEQUE | FLAG_WILLQUEUE_SENT),
              job.repl, job.ttl_s, job.ctime_us * 1000, job.delay_s, job.retry_s, job.nacks,
              job.additional_deliveries, job.qtime_ms, len(job.delivered), len(job.confirmed),
              len(jid), len(job.queue), len(job.body))
    if ext is not None:
        parts = [struct.pack(">BBBHQQQQQQQHHHIIHHHH", *fields, job.maxdeliver, len(ext.group),
                             len(ext.dedup), len(ext.reason)),
                 jid, job.queue, job.body, ext.group, ext.dedup, ext.reason]
    else:
        head = (struct.pack(">BBBHQQQQQQQHHHII", *fields) if not job.maxdeliver
                else struct.pack(">BBBHQQQQQQQHHHIIH", *fields, job.maxdeliver))
        parts = [head, jid, job.queue, job.body]
    for n in nodes:
        parts += [struct.pack(">H", len(n)), n]
    return b"".join(parts)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_to_record_writes_the_bytes_it_wrote_before(seed: int) -> None:
    """Random jobs of every version (MAXDELIVER, GROUP, DEDUP, a reason, nodes, DELAY,
    counters, flags): the same record, byte for byte, and it reads back."""
    rnd = random.Random(seed)
    env = Env()
    for k in range(300):
        delay = rnd.choice([0, 0, 5])
        ext = JobExt(group=rnd.choice([b"", b"g"]), dedup=rnd.choice([b"", b"d%d" % k]))
        jid = env.add(queue=b"q%d" % rnd.randrange(3), body=rnd.randbytes(rnd.randrange(40)),
                      delay_s=delay, retry_s=rnd.choice([None, 0, 30]),
                      ttl_s=rnd.choice([60, 86400]) + delay,
                      maxdeliver=rnd.choice([0, 0, 1, maxdeliver_max]),
                      ext=ext if ext.group or ext.dedup else None)
        job = env.s.lookup(jid)
        assert job is not None, jid
        if rnd.random() < 0.2:
            job.set_ext(reason=rnd.randbytes(rnd.randrange(1, 30)))
        job.nacks, job.additional_deliveries = rnd.randrange(1000), rnd.randrange(10**6)
        job.qtime_ms = rnd.randrange(2**40)
        job.delivered = tuple(f"{rnd.getrandbits(160):040x}" for _ in range(rnd.randrange(4)))
        job.confirmed = job.delivered[:rnd.randrange(len(job.delivered) + 1)]
        rec = job.to_record()
        assert rec == _to_record_before(job), (seed, k)
        assert Job.from_record(rec).to_record() == rec
