"""QLIMIT on one shard (workers/limits.py, the core's ``take_limited``): ACTIVE,
RATE and GROUP-ACTIVE bound the deliveries; a GETJOB passes over a queue at its
limit and a blocked one wakes when the limit frees (ACK, NACK, RETRY elapsing, the
next token). ``Shard.check`` (which checks the limits) runs after every step."""

from __future__ import annotations

from typing import Any

import pytest

from tests.workers.test_shard import Env
from workers import messages as msg
from workers.effects import AofAppend, Send, Wake
from workers.job import JobExt
from workers.limit import limit_record, parse_limit_record
from workers.queue import LIMITED


@pytest.fixture
def env() -> Env:
    return Env()


def _limit(env: Env, queue: bytes = b"q", active: int | None = None, rate: int | None = None,
           group_active: int | None = None, bcast: bool = False) -> dict[bytes, Any]:
    r = env.s.op_qlimit(queue, (active, rate, group_active), bcast, 100, env.now)
    env.s.check()
    assert isinstance(r, list)
    return dict(zip(r[::2], r[1::2], strict=True))


def _wakes(env: Env) -> dict[int, Any]:
    return {e.token: e.reply for e in env.s.take_effects() if isinstance(e, Wake)}


def _block(env: Env, token: int, *queues: bytes, count: int = 1) -> None:
    env.s.op_block(token, list(queues or [b"q"]), count, False, env.now)
    env.s.check()


def test_active_bounds_the_jobs_delivered_and_not_done(env: Env) -> None:
    for i in range(10):
        env.add(body=b"%d" % i, retry_s=30)
    assert _limit(env, active=3)[b"active"] == 3
    got = env.take(count=10)
    assert len(got) == 3
    assert env.take() == []  # at its limit: nothing more until one is done
    shown = _limit(env, active=None)  # nothing given: QLIMIT q shows them
    assert shown[b"in-use"] == 3 and shown[b"active"] == 3
    assert env.s.op_ackjob([got[0][1]], env.now) == 1
    env.s.check()
    assert len(env.take(count=10)) == 1  # one more room, one more job
    qstat = env.s.op_qstat(b"q", env.now)
    limits = dict(zip(qstat[-1][::2], qstat[-1][1::2], strict=True))
    assert qstat[-2] == b"limits" and limits[b"in-use"] == 3 and limits[b"active"] == 3


def test_a_getjob_over_several_queues_answers_from_the_others(env: Env) -> None:
    for _ in range(3):
        env.add(b"a")
        env.add(b"b")
    _limit(env, b"a", active=1)
    got = env.take(b"a", b"b", count=6)
    assert [e[0] for e in got] == [b"a", b"b", b"b", b"b"]
    assert env.s.op_takeable([b"a", b"b"], env.now) == [0, 0]


def test_a_blocked_getjob_wakes_on_ack_nack_and_retry(env: Env) -> None:
    for i in range(4):
        env.add(body=b"%d" % i, retry_s=5)
    _limit(env, active=1)
    first = env.take()[0][1]
    _block(env, 1)
    assert _wakes(env) == {}  # jobs queued, but the limit holds it
    env.s.op_ackjob([first], env.now)
    second = _wakes(env)[1][0][1]  # the ACK freed the room
    _block(env, 2)
    env.s.op_nack([second], env.now)
    env.s.check()
    third = _wakes(env)[2][0][1]  # NACK ends the delivery (and queues the job again)
    _block(env, 3)
    assert _wakes(env) == {}
    env.advance(6000)  # the third job's RETRY elapses: queued again, room again
    woke = _wakes(env)
    assert list(woke) == [3] and len(woke[3]) == 1
    assert env.s.lookup(third) is not None


def test_rate_is_a_token_bucket_and_the_next_token_wakes_a_waiter(env: Env) -> None:
    for _ in range(30):
        env.add()
    shown = _limit(env, rate=10)
    assert shown[b"tokens"] == 10
    assert len(env.take(count=30)) == 10  # a full bucket: one second's worth
    assert env.take() == []
    _block(env, 1, count=5)
    nxt = env.s.next_due()
    assert nxt is not None and nxt <= env.now + 110  # the next token: 1000 / 10 ms (+ resolution)
    env.advance(110)
    assert len(_wakes(env)[1]) == 1  # one token, one job
    env.advance(1000)
    assert len(env.take(count=30)) == 10  # refilled, never past the bucket


def test_group_active_bounds_each_group_and_serves_the_others(env: Env) -> None:
    for tenant in (b"A", b"B", b"C"):
        for _ in range(5):
            env.add(ext=JobExt(group=tenant), retry_s=30)
    _limit(env, group_active=2)
    got = env.take(count=15)
    groups = [env.s.lookup(e[1]).group for e in got]  # type: ignore[union-attr]
    assert sorted(groups) == [b"A", b"A", b"B", b"B", b"C", b"C"]
    assert env.take() == []
    env.s.op_ackjob([got[groups.index(b"B")][1]], env.now)
    env.s.check()
    again = env.take(count=15)
    assert [env.s.lookup(e[1]).group for e in again] == [b"B"]  # type: ignore[union-attr]


def test_lowering_active_below_what_is_in_use_delivers_nothing_until_below(env: Env) -> None:
    for _ in range(6):
        env.add(retry_s=30)
    got = env.take(count=4)
    _limit(env, active=2)  # four are out already: allowed, none more
    assert env.take() == []
    env.s.op_ackjob([got[0][1], got[1][1]], env.now)
    assert env.take() == []  # two out, ACTIVE 2
    env.s.op_ackjob([got[2][1]], env.now)
    assert len(env.take(count=5)) == 1
    env.s.check()


def test_reset_takes_the_limits_away(env: Env) -> None:
    for _ in range(5):
        env.add()
    _limit(env, active=1)
    env.take()
    _block(env, 9, count=4)
    assert _wakes(env) == {}
    r = env.s.op_qlimit(b"q", (0, 0, 0), False, 100, env.now)
    assert r[1] == 0 and env.s.core.limit_of(b"q") is None
    assert len(_wakes(env)[9]) == 4  # the waiter gets what the limit held back
    q = env.s.core.find_queue(b"q")
    assert q is not None and not q.paused & LIMITED


def test_limits_belong_to_the_name_and_bound_the_queues_with_limits(env: Env) -> None:
    _limit(env, b"later", active=2)  # no queue made for it
    assert env.s.core.find_queue(b"later") is None
    env.add(b"later")
    q = env.s.core.find_queue(b"later")
    assert q is not None and q.paused & LIMITED
    err = env.s.op_qlimit(b"more", (1, None, None), False, 1, env.now)
    assert str(err).startswith("ERR too many queues with limits")
    assert env.s.core.limit_of(b"more") is None


def test_bcast_sends_the_resulting_limits_and_a_peer_sets_them(env: Env) -> None:
    env.s.set_peers(["b" * 40])
    _limit(env, active=3, bcast=True)
    _limit(env, rate=7, bcast=True)
    sends = [e for e in env.s.take_effects() if isinstance(e, Send)]
    assert [(e.kind, e.meta, e.bodies) for e in sends] == [
        (msg.QLIMIT, msg.qlimit_meta(3, 0, 0), [b"q"]),
        (msg.QLIMIT, msg.qlimit_meta(3, 7, 0), [b"q"]),
    ]
    other = Env()
    assert msg.check(msg.QLIMIT, sends[1].slot, sends[1].meta, sends[1].bodies) is None
    other.s.on_message("a" * 40, msg.QLIMIT, sends[1].meta, sends[1].bodies, other.now)
    lim = other.s.core.limit_of(b"q")
    assert lim is not None and (lim.active, lim.rate, lim.group_active) == (3, 7, 0)


def test_the_limits_have_an_aof_record_and_load_from_it(env: Env) -> None:
    env.s.aof = True
    _limit(env, active=4, group_active=2)
    recs = [e.record for e in env.s.take_effects() if isinstance(e, AofAppend)]
    assert recs == [limit_record(b"q", 4, 0, 2)]
    assert parse_limit_record(recs[0]) == (b"q", 4, 0, 2)
    assert env.s.limit_records() == recs
    fresh = Env()
    fresh.s.load_record(recs[0], False, fresh.now)
    lim = fresh.s.core.limit_of(b"q")
    assert lim is not None and (lim.active, lim.group_active) == (4, 2)
    fresh.s.load_record(limit_record(b"q", 0, 0, 0), False, fresh.now)  # a RESET's record
    assert fresh.s.core.limit_of(b"q") is None
    fresh.s.check()


def test_a_pause_keeps_rates_next_token_and_keeps_the_limits(env: Env) -> None:
    for _ in range(5):
        env.add()
    _limit(env, rate=1)
    assert len(env.take(count=5)) == 1
    _block(env, 4)
    assert env.s.op_pause(b"q", ["in"], env.now) == "in"  # still serving: the timer stays
    env.advance(1010)
    assert len(_wakes(env)[4]) == 1
    assert env.s.op_pause(b"q", ["none"], env.now) == "none"
    q = env.s.core.find_queue(b"q")
    assert q is not None and q.paused & LIMITED  # PAUSE's state is not QLIMIT's
