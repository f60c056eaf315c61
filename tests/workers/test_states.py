"""Disque's job state machine as a table (workers/job.py: ENTRY_STATES, MOVES):
the table says what the spec says, ``Job.move`` refuses any other move, and the
shard's table refuses a job in a state no job enters it in."""

from __future__ import annotations

import random

import pytest

from workers.effects import AofAppend
from workers.invariant import InvariantError
from workers.job import (
    ACKED,
    ACTIVE,
    DELETED,
    ENTRY_STATES,
    MOVES,
    QUEUED,
    STATE_NAMES,
    WAIT_REPL,
    Job,
)
from workers.shard import Shard

NODE = "739317b21b9046a3454204425426c55a12ccc07a"
T0 = 1_795_301_808_328
STATES = (WAIT_REPL, ACTIVE, QUEUED, ACKED, DELETED)


def _job(state: int) -> Job:
    job_id = "D-739317b2-" + "A" * 24 + "-05a1"
    return Job(job_id, b"q", b"body", state, 1, 3600, T0 * 1000, 0, 360, 0, (NODE,))


def test_the_table_is_the_spec_state_machine() -> None:
    assert len(MOVES) == len(STATE_NAMES) == len(STATES)
    assert set(ENTRY_STATES) == {WAIT_REPL, ACTIVE, ACKED}
    for state in (WAIT_REPL, ACTIVE, QUEUED, ACKED):
        assert DELETED in MOVES[state], STATE_NAMES[state]  # every job can go
        assert state not in MOVES[state]  # no move to itself
    assert MOVES[DELETED] == ()  # final
    assert all(WAIT_REPL not in tos for tos in MOVES)  # only a new ADDJOB waits for copies
    assert MOVES[ACKED] == (DELETED,)  # an ACK is never undone
    assert QUEUED not in MOVES[WAIT_REPL]  # queued only once replicated (active first)


@pytest.mark.parametrize("src", STATES, ids=lambda s: STATE_NAMES[s])
def test_move_follows_the_table_and_refuses_the_rest(src: int) -> None:
    for to in STATES:
        job = _job(src)
        if to in MOVES[src]:
            job.move(to)
            assert job.state == to
        else:
            with pytest.raises(InvariantError, match="not a move of the state machine"):
                job.move(to)
            assert job.state == src  # refused: unchanged


@pytest.mark.parametrize("state", STATES, ids=lambda s: STATE_NAMES[s])
def test_the_shard_registers_jobs_only_in_entry_states(state: int) -> None:
    s = Shard(NODE, 0, 1, b"seed", random.Random(1), T0)
    job = _job(state)
    if state in ENTRY_STATES:
        s.core.register(job)
        assert s.lookup(job.id) is job
    else:
        with pytest.raises(InvariantError, match="registered"):
            s.core.register(job)
        assert s.lookup(job.id) is None


def test_the_per_job_path_refuses_to_queue_a_job_that_is_not_active() -> None:
    """_enqueue checks the table's only move into queued (active -> queued) itself."""
    s = Shard(NODE, 0, 1, b"seed", random.Random(1), T0)
    q = s.core.queue(b"q", T0)
    for state in (ACKED, WAIT_REPL):
        job = _job(state)
        s.core.register(job)
        with pytest.raises(InvariantError, match="not a move of the state machine"):
            s.core.enqueue(job, q, T0)
        assert job.state == state and q.live == 0
        s.core.unregister(job, T0)


def test_a_job_walks_the_table_through_the_shard_ops() -> None:
    """ADDJOB, GETJOB, NACK, GETJOB, ACKJOB: active, queued, active, queued, active, gone."""
    s = Shard(NODE, 0, 1, b"seed", random.Random(1), T0)
    common = dict(timeout_ms=0, replicate=None, delay_s=0, retry_s=None, ttl_s=3600, maxlen=0,
                  async_=False, token=0, now_ms=T0)
    jid = str(s.op_addjob(b"q", b"x", **common))  # type: ignore[arg-type]
    job = s.lookup(jid)
    assert job is not None and job.state == QUEUED
    assert s.op_take([b"q"], 1, False, T0)[0][1] == jid and job.state == ACTIVE
    assert s.op_nack([jid], T0) == 1 and job.state == QUEUED
    assert s.op_take([b"q"], 1, False, T0)[0][1] == jid and job.state == ACTIVE
    assert s.op_ackjob([jid], T0) == 1 and job.state == DELETED and s.lookup(jid) is None
    s.check()


@pytest.mark.parametrize("state", STATES, ids=lambda s: STATE_NAMES[s])
def test_a_job_enters_a_table_only_in_an_entry_state(state: int) -> None:
    """``Job.enter`` sets the state a job not in a table yet enters it in, whatever
    its record said, and refuses any state that is not an entry state."""
    job = _job(QUEUED)  # a peer's YOURJOBS record says queued
    if state in ENTRY_STATES:
        job.enter(state)
        assert job.state == state
    else:
        with pytest.raises(InvariantError, match="cannot enter"):
            job.enter(state)
        assert job.state == QUEUED


@pytest.mark.parametrize("queued", [False, True], ids=["armed", "queued"])
@pytest.mark.parametrize("sender", ["", "f" * 40], ids=["aof", "peer"])
@pytest.mark.parametrize("state", (WAIT_REPL, ACTIVE, QUEUED, ACKED), ids=lambda s: STATE_NAMES[s])
def test_an_arriving_job_enters_active_or_stays_acked_from_the_aof(
        sender: str, state: int, queued: bool) -> None:
    """``Core.arrive``: from another node a record enters active, us and the sender
    among its holders, none confirmed, and its record is written; from the AOF an
    acked job stays acked and no record is written (it is in the file). Either way
    it takes its place: queued, or armed on its timers."""
    if queued and state == ACKED:
        return  # an acked record is never queued again
    s = Shard(NODE, 0, 1, b"seed", random.Random(1), T0)
    s.aof = True
    job = Job("D-739317b2-" + "A" * 24 + "-05a1", bytes(bytearray(b"q")), b"body", state, 1,
              3600, T0 * 1000, 0, 360, 0, (NODE,), (NODE,))
    q = s.core.queue(b"q", T0)
    s.take_effects()
    s.core.arrive(job, q, T0, sender, queued)
    assert s.lookup(job.id) is job and job.queue is q.name
    assert job.state == (QUEUED if queued else ACKED if state == ACKED and not sender
                         else ACTIVE)
    assert job.awake_ms and q.live == int(queued)
    if sender:
        assert job.delivered == (NODE, sender) and job.confirmed == ()
    else:
        assert job.delivered == (NODE,) and job.confirmed == (NODE,)
    records = [e.record for e in s.take_effects() if isinstance(e, AofAppend)]
    assert records == ([job.to_record()] if sender else [])
    s.check()
