"""Whatever a peer sends, the edge (bus/messages.py) either refuses it or it is safe
for the state machines behind it: the shard and membership no longer catch
KeyError/TypeError, so a message that passes the checks must never raise."""

from __future__ import annotations

import base64
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus.membership import Membership
from bus.messages import BadMessage, check_fail, check_header, check_job
from tests.sim.net import Net
from workers.job import Job

KINDS = ["REPLJOB", "GOTJOB", "ENQUEUE", "WILLQUEUE", "QUEUED", "WORKING", "SETACK", "GOTACK",
         "DELJOB", "NEEDJOBS", "YOURJOBS", "PAUSE", "NOSUCH"]


def job_id_for(slot: int) -> str:
    return "D-00000000-" + base64.b64encode(slot.to_bytes(2, "big") + bytes(16)).decode() + "-0001"


def _record(slot: int) -> bytes:
    job = Job(job_id_for(slot), b"q", b"body", 0, 3, 3600, 1_795_301_808_328_000, 0, 60, 0,
              (), ())
    return job.to_record()


scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.text(max_size=50),
                    st.sampled_from([job_id_for(7), "a" * 40, "D-" + "x" * 38]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=8)
inner_meta = st.dictionaries(st.sampled_from(["j", "d", "m", "k", "c", "f", "x"]), values,
                             max_size=4)
bodies = st.lists(st.one_of(st.binary(max_size=40), st.just(b"q"), st.just(_record(7))),
                  max_size=3)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), slot=st.one_of(st.just(7), st.integers(-5, 20000), values),
       inner=st.one_of(inner_meta, values), body_list=bodies)
def test_job_messages_refused_or_safe(kind: str, slot: Any, inner: Any,
                                      body_list: list[bytes]) -> None:
    net = Net(2, seed=1)
    a, b = net.ids
    shard = net.nodes[a].shard
    try:
        k, s, m = check_job({"k": kind, "s": slot, "m": inner}, body_list)
    except BadMessage:
        return
    shard.on_message(b, k, m, body_list, net.now)  # must not raise
    shard.check()


@settings(max_examples=300, deadline=None)
@given(meta=st.dictionaries(st.sampled_from(["id", "port", "leaving", "gossip", "hv"]),
                            st.one_of(values, st.just("b" * 40), st.just(7712),
                                      st.lists(st.integers(-1, 1 << 63), max_size=3),
                                      st.lists(st.lists(values, max_size=7), max_size=3)),
                            max_size=5),
       meet=st.booleans())
def test_membership_frames_refused_or_safe(meta: dict[str, Any], meet: bool) -> None:
    m = Membership("a" * 40, "127.0.0.1", 7711, random.Random(1), 1000, 15000)
    known = m.meet("127.0.0.1", 7712, 1000)
    assert known is not None
    try:
        check_header(meta)
    except BadMessage:
        return
    m.on_ping(meta, meet, "127.0.0.1", "127.0.0.1", 2000)  # must not raise
    m.on_pong(known, meta, 2000)
    m.tick(3000)


@settings(max_examples=100, deadline=None)
@given(meta=st.dictionaries(st.sampled_from(["id", "x"]), values, max_size=2))
def test_fail_refused_or_safe(meta: dict[str, Any]) -> None:
    m = Membership("a" * 40, "127.0.0.1", 7711, random.Random(1), 1000, 15000)
    try:
        check_fail(meta)
    except BadMessage:
        return
    m.on_fail("b" * 40, meta, 2000)
