"""Idempotent adds (ADDJOB ... DEDUP, workers/dedup.py): on one shard (every path
a job enters or leaves the table by), through the AOF, and in a simulated 3-node
cluster where a node holding a copy deduplicates."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.sim.net import Net
from tests.workers.test_shard import NODE, T0, Env
from workers.effects import AofAppend
from workers.ids import JobIdGen, slot_of
from workers.job import ACKED, ACTIVE, Job, JobExt
from workers.replies import Status
from workers.shard import Shard


@pytest.fixture
def env() -> Env:
    return Env()


def _add(env: Env, key: bytes = b"k", queue: bytes = b"q", **kw: Any) -> Any:
    return env.add(queue, ext=JobExt(dedup=key), **kw)


def _info(env: Env) -> tuple[int, int, int]:
    i = env.s.dedup_info()
    return i["dedup_keys"], i["dedup_hits"], i["dedup_keys_forgotten"]


def test_a_second_add_with_the_key_adds_nothing_and_answers_the_first_id(env: Env) -> None:
    jid = _add(env)
    assert isinstance(jid, Status)
    again = _add(env, body=b"other body")
    assert again == jid and isinstance(again, Status)
    assert env.s.op_qlen(b"q") == 1 and env.s.info()["registered_jobs"] == 1
    assert _info(env) == (1, 1, 0)
    # another key, another queue, or no key: new jobs
    assert _add(env, b"k2") != jid
    assert _add(env, queue=b"q2") != jid
    assert env.add() != jid
    assert env.s.op_qlen(b"q") == 3 and _info(env) == (3, 1, 0)


def test_the_key_is_held_while_delayed_active_or_requeued(env: Env) -> None:
    delayed = _add(env, b"d", delay_s=10)
    assert _add(env, b"d") == delayed and env.s.op_qlen(b"q") == 0
    jid = _add(env, retry_s=30)
    assert env.take()[0][1] == jid  # active: delivered, not acked
    assert _add(env) == jid and env.s.op_qlen(b"q") == 0
    assert env.s.op_nack([jid], env.now) == 1  # queued again
    assert _add(env) == jid and env.s.op_qlen(b"q") == 1
    env.advance(11_000)  # the delayed one is queued now
    assert _add(env, b"d") == delayed and env.s.op_qlen(b"q") == 2


def test_ack_fastack_deljob_and_ttl_free_the_key(env: Env) -> None:
    for free in ("ack", "fastack", "deljob"):
        jid = _add(env)
        getattr(env.s, f"op_{free}" if free != "ack" else "op_ackjob")([jid], env.now)
        env.s.check()
        assert env.s.lookup(jid) is None and _info(env)[0] == 0
        fresh = _add(env)
        assert fresh != jid
        env.s.op_deljob([fresh], env.now)
    jid = _add(env, ttl_s=5, retry_s=1)
    env.advance(6_000)
    assert env.s.lookup(jid) is None and _info(env)[0] == 0
    assert _add(env) != jid


def test_a_dead_letter_keeps_its_key_in_its_queue(env: Env) -> None:
    jid = _add(env, maxdeliver=1, retry_s=60)
    assert env.take()[0][1] == jid
    env.s.op_nack([jid], env.now)
    assert env.s.op_qlen(b"dead:q") == 1
    assert _add(env) == jid  # a re-send finds the dead letter
    assert _add(env, queue=b"dead:q") == jid  # dead:q shares q's keys
    assert env.s.op_qlen(b"q") == 0
    assert env.take(b"dead:q")[0][1] == jid
    env.s.op_ackjob([jid], env.now)
    env.s.check()
    assert _add(env) != jid


def test_at_the_bound_the_oldest_key_is_forgotten() -> None:
    env = Env()
    env.s.set_dedup_keys_max(2)
    a, b = _add(env, b"a"), _add(env, b"b")
    c = _add(env, b"c")  # forgets a (its job stays)
    assert _info(env) == (2, 0, 1) and env.s.op_qlen(b"q") == 3
    assert _add(env, b"b") == b and _add(env, b"c") == c
    a2 = _add(env, b"a")  # a new job: its key was forgotten; forgets b
    assert a2 not in (a, b, c) and env.s.op_qlen(b"q") == 4 and _info(env) == (2, 2, 2)
    env.s.set_dedup_keys_max(1)  # lower: the oldest go at once
    assert _info(env) == (1, 2, 3) and _add(env, b"a") == a2
    env.s.check()
    env.s.op_flushall()
    assert _info(env)[0] == 0
    env.s.check()


def test_the_bound_is_a_shard_argument() -> None:
    s = Shard(NODE, 0, 1, b"seed", random.Random(1), T0, dedup_keys_max=1)
    for key in (b"a", b"b"):
        s.op_addjob(b"q", b"x", timeout_ms=0, replicate=None, delay_s=0, retry_s=None,
                    ttl_s=60, maxlen=0, async_=False, token=0, now_ms=T0,
                    ext=JobExt(dedup=key))
    assert s.dedup_info()["dedup_keys"] == 1 and s.dedup_info()["dedup_keys_forgotten"] == 1


def test_a_hit_comes_before_maxlen_and_pause_but_after_argument_errors(env: Env) -> None:
    jid = _add(env)
    assert _add(env, maxlen=1) == jid  # nothing is added: the queue's length is no matter
    env.s.op_pause(b"q", ["in"], env.now)
    assert _add(env) == jid
    assert not isinstance(_add(env, delay_s=10, ttl_s=5), Status)  # DELAY > TTL: the error


def test_the_aof_reload_holds_the_keys_of_unacked_jobs() -> None:
    env = Env()
    env.s.aof = True
    queued, acked = _add(env, b"a"), _add(env, b"b")
    env.s.set_view(NODE, [("b" * 40, True, False)], False)  # a peer: the ACK is not final
    job = env.s.lookup(acked)
    assert job is not None
    job.delivered = (NODE, "b" * 40)
    env.s.op_ackjob([acked], env.now)
    assert env.state(acked) == ACKED and env.s.dedup_info()["dedup_keys"] == 1
    records = [e.record for e in env.s.take_effects() if isinstance(e, AofAppend)]
    back = Env()
    back.s = Shard(NODE, 0, 1, b"restarted", random.Random(8), back.now)  # fresh IDs
    for rec in records:
        back.s.load_record(rec, True, back.now)
    back.s.check()
    assert back.state(acked) == ACKED
    assert _add(back, b"a") == queued and back.s.dedup_info()["dedup_keys"] == 1
    assert _add(back, b"b") != acked


# ------------------------------------------------------------------ 3 nodes


def test_a_node_holding_a_copy_answers_the_same_id() -> None:
    net = Net(3, seed=31)
    a, b, c = net.ids
    key = JobExt(dedup=b"order-7")
    jid = net.added(a, 50, replicate=2, ext=key)
    holder = next(n for n in net.holders(jid) if n != a)
    other = next(n for n in (b, c) if n != holder)
    # a resend to the origin or to the node with a copy: the same job, nothing added
    assert net.addjob(a, ext=JobExt(dedup=b"order-7")) == jid
    assert net.addjob(holder, ext=JobExt(dedup=b"order-7")) == jid
    net.run(50)
    assert set(net.holders(jid)) == {a, holder}
    assert net.nodes[holder].shard.dedup_info()["dedup_hits"] == 1
    # a node without a copy cannot know it (best effort across nodes)
    other_id = net.added(other, 50, replicate=1, ext=JobExt(dedup=b"order-7"))
    assert other_id != jid
    net.check()
    # the ACK frees the key on every holder
    assert net.ack(a, [jid]) == 1
    net.run(2_000)
    assert not net.holders(jid)
    again = net.added(holder, 50, replicate=2, ext=JobExt(dedup=b"order-7"))
    assert again != jid
    net.check()


def test_an_add_waiting_for_copies_is_answered_at_once_by_a_resend() -> None:
    net = Net(3, seed=32)
    a = net.ids[0]
    first = net.addjob(a, replicate=3, ext=JobExt(dedup=b"k"))
    assert first[0] == "pending"
    jid = net.nodes[a].shard.jobs()[0].id
    assert net.addjob(a, replicate=3, ext=JobExt(dedup=b"k")) == jid  # at once
    net.run(50)
    assert net.reply(a, first) == jid and len(net.holders(jid)) == 3
    net.check()


def test_a_job_moved_by_federation_is_deduplicated_where_it_arrived() -> None:
    net = Net(3, seed=16)
    a, b, _c = net.ids
    tok = net.block(b)
    net.run(10)
    jid = net.added(a, 10, replicate=1, ext=JobExt(dedup=b"k"))
    rep = net.wakes.get((b, tok))
    assert rep is not None and rep[0][1] == jid  # came by YOURJOBS, delivered at b
    assert net.addjob(b, ext=JobExt(dedup=b"k")) == jid
    assert net.nodes[b].shard.op_qlen(b"q") == 0
    net.check()


def test_two_jobs_with_one_key_on_a_node_answer_one_after_the_other(env: Env) -> None:
    first = _add(env)
    # the same key added on another node that had no copy of ours; its job came here
    other_id = JobIdGen("d" * 40, b"seed").make(slot_of(b"q"), 3600, 60)  # a job of q's slot
    other = Job(other_id, b"q", b"y", ACTIVE, 1, 3600,
                (env.now - 5) * 1000, 0, 60, 0, ("d" * 40,))
    other.ext = JobExt(dedup=b"k")
    env.s.load_record(other.to_record(), True, env.now)
    env.s.check()
    assert env.s.dedup_info()["dedup_keys"] == 2 and _add(env) == first
    env.s.op_deljob([first], env.now)
    env.s.check()
    assert _add(env) == other.id and env.s.dedup_info()["dedup_keys"] == 1
    env.s.op_deljob([other.id], env.now)
    assert env.s.dedup_info()["dedup_keys"] == 0 and _add(env) not in (first, other.id)
