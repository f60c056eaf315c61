"""Results, progress and dedup that remembers (workers/results.py, workers/dedup.py)
on one shard and in a simulated 3-node cluster (tests/sim/net.py): ACKJOB ... RESULT
stores the value, RESULT answers or waits, the value travels with the SETACK to every
holder and a node that never held the job asks the others; WORKING ... PROGRESS;
DEDUP-KEEP keeps the key answering after the ACK."""

from __future__ import annotations

from typing import Any

import pytest

from tests.sim.net import Net
from tests.workers.test_shard import Env
from workers.effects import AofAppend, Wake
from workers.job import KEPT_KEY_RECORD_TAG, RESULT_RECORD_TAG, Job, JobExt
from workers.replies import PENDING, Error, Status
from workers.results import parse_result_record
from workers.shard import Shard


@pytest.fixture
def env() -> Env:
    return Env()


def _wakes(s: Shard) -> dict[int, Any]:
    return {e.token: e.reply for e in s.take_effects() if type(e) is Wake}


def test_ack_with_result_then_result_answers_the_value(env: Env) -> None:
    jid = env.add()
    assert env.s.op_result(1, jid, None, env.now) is None  # queued, no progress
    env.take()
    assert env.s.op_ack_result(jid, b"42", env.now) == 1
    env.s.check()
    assert env.s.lookup(jid) is None  # acked on a node alone: gone at once
    assert env.s.op_result(2, jid, None, env.now) == b"42"
    assert env.s.op_result(3, jid, 5000, env.now) == b"42"
    assert env.s.results_info()["results"] == 1
    twice = env.add()
    env.s.op_ack_result(twice, b"first", env.now)
    env.s.op_ack_result(twice, b"second", env.now)  # gone: 0, the first stays
    assert env.s.op_result(4, twice, None, env.now) == b"first"


def test_result_waits_for_a_pending_job_and_is_woken_by_its_ack(env: Env) -> None:
    jid = env.add()
    assert env.s.op_result(7, jid, 0, env.now) is PENDING
    env.s.take_effects()
    env.s.op_ack_result(jid, b"done", env.now)
    assert _wakes(env.s) == {7: b"done"}
    # a plain ACKJOB wakes it with null (no result)
    jid2 = env.add()
    assert env.s.op_result(8, jid2, 10_000, env.now) is PENDING
    env.s.op_ackjob([jid2], env.now)
    assert _wakes(env.s) == {8: None}


def test_result_timeout_answers_progress_or_null(env: Env) -> None:
    jid = env.add(retry_s=60)
    env.take()
    assert env.s.op_working(jid, env.now, b"40%") == 60
    assert env.s.op_result(1, jid, None, env.now) == [b"progress", b"40%"]
    assert env.show_all(jid)[b"progress"] == b"40%"
    assert env.s.op_result(2, jid, 1000, env.now) is PENDING
    env.s.take_effects()
    env.advance(1500)
    assert _wakes(env.s) == {2: [b"progress", b"40%"]}
    other = env.add(queue=b"q2")
    assert env.s.op_result(3, other, 500, env.now) is PENDING
    env.advance(600)
    assert _wakes(env.s) == {3: None}
    # the ACK drops the progress: RESULT answers the result, SHOW is gone
    env.s.op_ack_result(jid, b"100%", env.now)
    assert env.s.op_result(4, jid, None, env.now) == b"100%"
    assert env.s.results_info()["progress_jobs"] == 0


def test_bounds_refuse_and_change_nothing(env: Env) -> None:
    env.s.results.value_bytes_max = 4
    env.s.results.progress_bytes_max = 2
    jid = env.add(retry_s=60)
    env.take()
    err = env.s.op_ack_result(jid, b"12345", env.now)
    assert isinstance(err, Error) and "result-bytes-max" in str(err)
    err = env.s.op_working(jid, env.now, b"123")
    assert isinstance(err, Error) and "progress-bytes-max" in str(err)
    assert env.state(jid) is not None and env.s.results_info()["results"] == 0
    assert b"progress" not in env.show_all(jid)


def test_results_expire_and_the_store_bound_drops_the_oldest(env: Env) -> None:
    r = env.s.results
    r.ttl_s = 10
    ids = [env.add() for _ in range(3)]
    for jid in ids:
        env.s.op_ack_result(jid, b"v" * 100, env.now)
    assert env.s.results_info()["results"] == 3
    env.advance(11_000)
    assert env.s.results_info()["results"] == 0 and r.expired == 3 and r.held_bytes == 0
    assert env.s.op_result(1, ids[0], None, env.now) is None
    r.store_bytes_max = 700  # two values and their entries
    for _ in ids:
        env.s.op_ack_result(env.add(), b"v" * 100, env.now)
    assert env.s.results_info()["results"] == 2 and r.evicted == 1
    assert env.s.op_evict_results(10) == 2 and r.held_bytes == 0


def test_result_records_load_back_until_they_expire(env: Env) -> None:
    env.s.aof = True
    jid = env.add()
    env.s.take_effects()
    env.s.op_ack_result(jid, b"kept", env.now)
    recs = [e.record for e in env.s.take_effects() if type(e) is AofAppend]
    (rec,) = [r for r in recs if r[0] == RESULT_RECORD_TAG]
    assert parse_result_record(rec)[:2] == (jid, b"kept")
    fresh = Env(env.now)
    fresh.s.load_record(rec, False, env.now)
    assert fresh.s.op_result(1, jid, None, env.now) == b"kept"
    late = Env(env.now + 3601 * 1000)
    late.s.load_record(rec, False, late.now)
    assert late.s.op_result(1, jid, None, late.now) is None
    assert fresh.s.result_record_of("r:" + jid) == rec
    assert fresh.s.result_keys() == ["r:" + jid]


def test_flushall_answers_waiting_results_with_null(env: Env) -> None:
    jid = env.add()
    env.s.op_ack_result(env.add(), b"x", env.now)
    assert env.s.op_result(5, jid, 0, env.now) is PENDING
    env.s.take_effects()
    env.s.op_flushall()
    assert _wakes(env.s) == {5: None}
    assert env.s.results_info()["results"] == 0


# ------------------------------------------------------------------ dedup keep


def _add_keep(env: Env, keep_s: int, key: bytes = b"k") -> Any:
    return env.add(ext=JobExt(dedup=key, keep_s=keep_s))


def test_dedup_keep_answers_the_first_id_after_the_ack(env: Env) -> None:
    jid = _add_keep(env, 10)
    env.take()
    env.s.op_ackjob([jid], env.now)
    env.s.check()
    assert env.s.lookup(jid) is None
    env.now += 5000
    assert _add_keep(env, 10) == jid and env.s.op_qlen(b"q") == 0  # nothing added
    env.now += 6000
    again = _add_keep(env, 10)
    assert isinstance(again, Status) and again != jid  # the keep is over
    # without DEDUP-KEEP the key is forgotten at the ACK (as before)
    plain = env.add(queue=b"p", ext=JobExt(dedup=b"k"))
    env.s.op_ackjob([plain], env.now)
    assert env.add(queue=b"p", ext=JobExt(dedup=b"k")) != plain
    assert env.s.results_info()["dedup_keys_kept"] == 0  # the expired one went


def test_kept_keys_count_in_the_bound_and_go_first(env: Env) -> None:
    env.s.set_dedup_keys_max(2)
    first = _add_keep(env, 100, b"a")
    env.s.op_ackjob([first], env.now)
    _add_keep(env, 100, b"b")
    _add_keep(env, 100, b"c")  # at the bound: the kept key goes, not b's
    env.s.check()
    assert env.s.dedup.count() == 2 and not env.s.dedup.kept
    assert env.s.extra_bytes == 0


def test_a_kept_key_is_an_aof_record_loaded_back_until_it_expires(env: Env) -> None:
    env.s.aof = True
    jid = _add_keep(env, 60)
    env.s.take_effects()
    env.s.op_ackjob([jid], env.now)
    (rec,) = [e.record for e in env.s.take_effects()
              if type(e) is AofAppend and e.record[0] == KEPT_KEY_RECORD_TAG]
    assert env.s.result_keys() == ["k:" + jid] and env.s.result_record_of("k:" + jid) == rec
    fresh = Env(env.now + 1000)
    fresh.s.load_record(rec, False, fresh.now)
    assert _add_keep(fresh, 60) == jid and fresh.s.op_qlen(b"q") == 0
    late = Env(env.now + 61_000)
    late.s.load_record(rec, False, late.now)
    _add_keep(late, 60)
    assert late.s.op_qlen(b"q") == 1  # expired: a job was added


def test_dedup_keep_travels_in_the_record() -> None:
    job = Job("D-dcb833cf-wOGMXiTRcfClcTt6WDuzWlmo-05a1", b"q", b"x", 1, 1, 60, 1, 0, 6, 0,
              ("n",))
    job.ext = JobExt(dedup=b"k", keep_s=30)
    back = Job.from_record(job.to_record())
    assert back.ext is not None and back.ext.keep_s == 30 and back.dedup == b"k"


# ------------------------------------------------------------------ cluster


def _replicated(net: Net, node: str, **kw: Any) -> str:
    return net.added(node, 100, replicate=3, **kw)


def test_the_result_travels_with_the_ack_to_every_holder() -> None:
    net = Net(3, seed=11)
    a, b, c = net.ids
    jid = _replicated(net, a)
    net.take(a)
    assert net.nodes[b].shard.op_ack_result(jid, b"r", net.now) == 1
    net.drain(b)
    net.run(100)
    for n in (a, b, c):
        assert net.nodes[n].shard.op_result(1, jid, None, net.now) == b"r", n
    assert net.holders(jid) == {}
    assert sum(net.nodes[n].shard.results.stored for n in (a, b, c)) == 3  # once each
    net.check()


def test_a_node_that_never_held_the_job_asks_the_others() -> None:
    net = Net(3, seed=12)
    a, b, c = net.ids
    jid = net.added(a, 100, replicate=2)
    holders = set(net.holders(jid))
    (outsider,) = {a, b, c} - holders
    shard = net.nodes[outsider].shard
    tok = net.token()
    assert shard.op_result(tok, jid, None, net.now) is PENDING
    net.drain(outsider)
    net.run(50)
    assert net.wakes[(outsider, tok)] is None  # pending, no progress
    holder = next(iter(holders))
    net.nodes[holder].shard.op_ack_result(jid, b"v", net.now)
    net.drain(holder)
    net.run(100)
    tok = net.token()
    assert shard.op_result(tok, jid, None, net.now) is PENDING
    net.drain(outsider)
    net.run(50)
    assert net.wakes[(outsider, tok)] == b"v"


def test_result_of_an_id_no_node_made_is_an_error() -> None:
    net = Net(2, seed=13)
    a, _b = net.ids
    r = net.nodes[a].shard.op_result(1, "D-00000000-wOGMXiTRcfClcTt6WDuzWlmo-05a1", None, net.now)
    assert isinstance(r, Error) and "unknown job ID" in str(r)


def test_the_part_hears_job_events_only_while_it_holds_progress_or_a_wait(env: Env) -> None:
    """A plain job's ACK and removal call nothing of workers/results.py."""
    r = env.s.results
    hears = lambda: r in env.s.core._after_job_gone and r in env.s.core._after_ack  # noqa: E731
    jid = env.add(retry_s=60)
    assert not hears()
    env.take()
    env.s.op_working(jid, env.now, b"p")
    assert hears()
    env.s.op_ackjob([jid], env.now)
    assert not hears() and env.s.results_info()["progress_jobs"] == 0
    other = env.add()
    assert env.s.op_result(1, other, 0, env.now) is PENDING and hears()
    env.s.op_ack_result(other, b"v", env.now)
    assert not hears() and _wakes(env.s) == {1: b"v"}
