"""Dead letters you act on, on the shard and in the seeded simulation:
DEADLETTER (``Shard.op_deadletter``) and REDRIVE (``Shard.op_redrive``), the
core's ``dead_letter`` / ``redrive`` verbs that MAXDELIVER's move shares, and the
other holders following both (QUEUED "dl" with its "why", QUEUED "rd")."""

from __future__ import annotations

from typing import Any

import pytest

from bus.messages import BadMessage, check_job
from tests.sim.net import Net
from tests.workers.test_shard import Env
from workers.effects import AofAppend, Effect, Send
from workers.ids import slot_of_job_id
from workers.job import ACTIVE, QUEUED, Job, dead_reason_bytes_max
from workers.replies import ERR_PAUSED


@pytest.fixture
def env() -> Env:
    return Env()


def test_deadletter_moves_queued_and_active_jobs_now_with_the_reason(env: Env) -> None:
    active = env.add(retry_s=60)
    assert env.take()[0][1] == active
    queued = env.add(retry_s=60, maxdeliver=5)
    for _ in range(2):  # delivered and NACKed twice: nacks 2
        assert env.take()[0][1] == queued
        env.s.op_nack([queued], env.now)
    assert env.state(queued) == QUEUED and env.state(active) == ACTIVE
    assert env.s.op_deadletter([queued, active], b"bad input", env.now) == 2
    env.s.check()
    assert env.s.op_qlen(b"q") == 0 and env.s.op_qlen(b"dead:q") == 2
    shown = env.show_all(queued)
    assert shown[b"queue"] == b"dead:q" and shown[b"state"] == "queued"
    assert shown[b"dead-reason"] == b"bad input" and shown[b"nacks"] == 2  # counters kept
    assert shown[b"maxdeliver"] == 5 and shown[b"id"] == queued
    assert env.s.metrics(0, env.now)["dead_lettered"] == 2
    assert {j[1] for j in env.take(b"dead:q", count=5)} == {queued, active}


def test_deadletter_leaves_unknown_acked_and_dead_jobs_uncounted(env: Env) -> None:
    jid = env.add(retry_s=60)
    acked = env.add(retry_s=60)
    env.s.op_ackjob([acked], env.now)
    unknown = jid[:-6] + "ZZZZ" + jid[-2:]
    assert env.s.op_deadletter([jid], None, env.now) == 1
    assert b"dead-reason" not in env.show_all(jid)  # no REASON: none set
    assert env.s.op_deadletter([jid, acked, unknown, jid], b"again", env.now) == 0
    assert b"dead-reason" not in env.show_all(jid)  # an already dead job keeps its state
    env.s.check()


def test_an_at_most_once_job_is_moved_only_while_never_delivered(env: Env) -> None:
    delivered = env.add(retry_s=0)
    queued = env.add(retry_s=0)
    assert env.take(count=1)[0][1] == delivered
    assert env.s.op_deadletter([delivered], b"x", env.now) == 0  # never delivered twice
    assert env.s.op_deadletter([queued], b"x", env.now) == 1
    assert env.take(b"dead:q")[0][1] == queued
    env.s.check()


def test_a_job_waiting_its_delay_is_dead_lettered_at_once(env: Env) -> None:
    jid = env.add(retry_s=60, delay_s=30)
    assert env.s.metrics(0, env.now)["delayed"]  # counted as delayed in q
    assert env.s.op_deadletter([jid], b"", env.now) == 1
    env.s.check()  # the per-queue tallies follow the move (delayed, delivered)
    assert env.state(jid) == QUEUED and env.s.op_qlen(b"dead:q") == 1
    env.advance(31_000)
    assert env.s.op_qlen(b"q") == 0 and env.s.op_qlen(b"dead:q") == 1


def test_the_reason_is_bounded_and_kept_in_the_record(env: Env) -> None:
    jid = env.add(retry_s=60)
    reason = b"r" * dead_reason_bytes_max
    env.s.core.set_aof(True)
    assert env.s.op_deadletter([jid], reason, env.now) == 1
    recs = [e.record for e in env.s.take_effects() if type(e) is AofAppend]
    back = Job.from_record(recs[-1])
    assert back.queue == b"dead:q" and back.dead_reason == reason


def test_redrive_moves_back_same_id_ttl_retry_maxdeliver_counters_reset(env: Env) -> None:
    jid = env.add(retry_s=60, ttl_s=3600, maxdeliver=2)
    for _ in range(2):
        assert env.take()[0][1] == jid
        env.s.op_nack([jid], env.now)
    assert env.s.op_qlen(b"dead:q") == 1  # MAXDELIVER moved it, with the same verb
    env.s.op_deadletter([jid], b"ignored: already dead", env.now)
    job = env.s.lookup(jid)
    assert job is not None
    job.set_ext(reason=b"by hand")
    before = env.show_all(jid)
    assert env.s.op_redrive(b"dead:q", 100, env.now) == 1
    env.s.check()
    after = env.show_all(jid)
    assert after[b"queue"] == b"q" and after[b"state"] == "queued"
    assert after[b"nacks"] == 0 and after[b"additional-deliveries"] == 0
    assert b"dead-reason" not in after
    for k in (b"id", b"ttl", b"retry", b"maxdeliver", b"ctime"):
        assert after[k] == before[k], k
    assert env.s.op_qlen(b"dead:q") == 0 and env.s.op_redrive(b"dead:q", 100, env.now) == 0
    assert env.take()[0][1] == jid  # deliverable again, MAXDELIVER counts anew
    env.s.op_nack([jid], env.now)
    assert env.state(jid) == QUEUED and env.s.op_qlen(b"q") == 1


def test_redrive_count_takes_the_oldest_and_a_plain_queue_is_refused(env: Env) -> None:
    ids = [env.add(retry_s=60) for _ in range(5)]
    assert env.s.op_deadletter(ids, b"x", env.now) == 5
    assert env.s.op_redrive(b"q", 10, env.now) == 0  # not a dead-letter queue
    assert env.s.op_redrive(b"dead:other", 10, env.now) == 0
    assert env.s.op_redrive(b"dead:q", 2, env.now) == 2
    assert [j[1] for j in env.take(count=5)] == ids[:2]
    env.s.op_pause(b"q", ["in"], env.now)  # refused as ADDJOB is, nothing moved
    assert env.s.op_redrive(b"dead:q", 10, env.now) is ERR_PAUSED
    env.s.op_pause(b"q", ["none"], env.now)
    assert env.s.op_redrive(b"dead:q", 10, env.now) == 3
    env.s.check()


def test_redrive_ids_moves_those_jobs_only(env: Env) -> None:
    ids = [env.add(retry_s=60) for _ in range(3)]
    other = env.add(queue=b"other", retry_s=60)
    assert env.s.op_deadletter(ids, b"x", env.now) == 3
    # the newest one back, the older two stay; a job not dead, or of another
    # dead-letter queue, is not counted
    assert env.s.op_redrive_ids(b"dead:q", [ids[2], other], env.now) == 1
    assert env.state(ids[2]) == QUEUED and env.show_all(ids[2])[b"queue"] == b"q"
    assert env.s.op_qlen(b"dead:q") == 2 and env.s.op_qlen(b"q") == 1
    assert env.s.op_redrive_ids(b"dead:q", [ids[2]], env.now) == 0  # already back
    assert env.s.op_redrive_ids(b"q", [ids[0]], env.now) == 0  # not a dead-letter queue
    env.s.op_pause(b"q", ["in"], env.now)  # refused as ADDJOB is, nothing moved
    assert env.s.op_redrive_ids(b"dead:q", [ids[0]], env.now) is ERR_PAUSED
    env.s.op_pause(b"q", ["none"], env.now)
    assert env.s.op_redrive_ids(b"dead:q", ids[:2], env.now) == 2
    env.s.check()


def test_redrive_serves_a_blocked_getjob(env: Env) -> None:
    jid = env.add(retry_s=60)
    env.s.op_deadletter([jid], None, env.now)
    env.s.op_block(9, [b"q"], 1, False, env.now)
    env.s.take_effects()
    assert env.s.op_redrive(b"dead:q", 1, env.now) == 1
    woke = [e for e in env.s.take_effects() if getattr(e, "token", None) == 9]
    assert woke and env.state(jid) == ACTIVE


# ------------------------------------------------------------------ several nodes


def _checked(node_id: str, effects: list[Effect]) -> None:
    """Every message the moves send passes the edge's shape check."""
    for e in effects:
        if type(e) is Send:
            try:
                check_job({"k": e.kind, "s": e.slot, "m": e.meta}, list(e.bodies))
            except BadMessage as err:  # pragma: no cover - the failure's text
                raise AssertionError(f"{e.kind} {e.meta}: {err}") from err


def _copies(net: Net, jid: str) -> list[Job]:
    out = []
    for n in net.ids:
        job = net.nodes[n].shard.lookup(jid)
        assert job is not None, n
        out.append(job)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_three_nodes_copies_follow_deadletter_then_redrive(seed: int) -> None:
    net = Net(3, seed=seed)
    net.watch = _checked
    a, b, c = net.ids
    r = net.addjob(a, replicate=3, retry_s=30, maxdeliver=4)
    net.run(50)
    jid = str(net.reply(a, r))
    assert net.take(a)[0][1] == jid
    net.nodes[a].shard.op_nack([jid], net.now)  # a counter the copies hear of
    net.drain(a)
    net.run(50)
    held = next(n for n in net.ids if net.nodes[n].shard.lookup(jid).state == QUEUED)  # type: ignore[union-attr]
    assert net.nodes[held].shard.op_deadletter([jid], b"poison \xe9", net.now) == 1
    net.drain(held)
    net.run(100)
    for job in _copies(net, jid):
        assert job.queue == b"dead:q" and job.dead_reason == b"poison \xe9"
        assert job.nacks == 1
    assert sum(net.nodes[n].shard.op_qlen(b"dead:q") for n in net.ids) == 1
    assert sum(net.nodes[n].shard.op_qlen(b"q") for n in net.ids) == 0
    net.check()
    assert net.nodes[held].shard.op_redrive(b"dead:q", 10, net.now) == 1
    net.drain(held)
    net.run(100)
    for job in _copies(net, jid):
        assert job.queue == b"q" and job.dead_reason == b"" and job.nacks == 0
        assert job.maxdeliver == 4 and job.retry_s == 30
    assert sum(net.nodes[n].shard.op_qlen(b"q") for n in net.ids) == 1
    assert sum(net.nodes[n].shard.op_qlen(b"dead:q") for n in net.ids) == 0
    net.check()
    # the copies requeue in the original queue from now on (their retry fires)
    net.run(70_000)
    assert all(j.queue == b"q" for j in _copies(net, jid))
    net.check()


def test_the_edge_refuses_a_reason_past_its_bound() -> None:
    env = Env()
    jid = env.add()
    slot = slot_of_job_id(jid)

    def queued(meta: dict[str, Any]) -> None:
        check_job({"k": "QUEUED", "s": slot, "m": {"j": jid, **meta}}, [])

    queued({"dl": 1, "why": "x" * dead_reason_bytes_max})
    queued({"rd": 1})
    for bad in ({"why": "x" * (dead_reason_bytes_max + 1)}, {"why": "\u20ac"}, {"why": 3},
                {"rd": 2}):
        with pytest.raises(BadMessage):
            queued({"dl": 1, **bad})


def test_a_job_with_a_stale_entry_moves_without_reviving_it(env: Env) -> None:
    """DEQUEUE leaves the job's entry stale in ``q``: the move drops it there, so
    queueing the job in ``dead:q`` (and back) keeps both queues' counts right."""
    jid = env.add(retry_s=60)
    assert env.s.op_dequeue([jid], env.now) == 1
    assert env.s.op_deadletter([jid], b"x", env.now) == 1
    env.s.check()
    assert env.s.op_qlen(b"q") == 0 and env.s.op_qlen(b"dead:q") == 1
    assert env.s.op_dequeue([jid], env.now) == 1
    job = env.s.lookup(jid)
    assert job is not None
    env.s.core.redrive(job, env.now)
    env.s.check()
    assert env.s.op_qlen(b"q") == 1 and env.s.op_qlen(b"dead:q") == 0


def test_maxdeliver_after_a_dequeue_moves_through_the_same_verb(env: Env) -> None:
    jid = env.add(retry_s=60, maxdeliver=2)
    assert env.take()[0][1] == jid
    env.s.op_nack([jid], env.now)  # nacks 1, queued in q
    assert env.s.op_dequeue([jid], env.now) == 1  # stale entry in q
    env.s.op_nack([jid], env.now)  # nacks 2: MAXDELIVER's move
    env.s.check()
    assert env.s.op_qlen(b"q") == 0 and env.s.op_qlen(b"dead:q") == 1
