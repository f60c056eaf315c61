"""The one catalogue of cluster message kinds (workers/messages.py): every kind has
a check that the edge runs and a handler that the shard dispatches to."""

from __future__ import annotations

import random

import pytest

from bus.messages import BadMessage, check_job
from workers import messages
from workers.shard import Shard

NODE = "a" * 40


def _shard() -> Shard:
    return Shard(NODE, 0, 1, b"seed", random.Random(1), 1_000_000)


def test_every_kind_has_a_check_and_a_handler() -> None:
    s = _shard()
    names = [k.name for k in messages.KINDS]
    assert len(set(names)) == len(names) == len(messages.CATALOGUE)
    handlers = s.handlers()
    assert set(handlers) == set(messages.CATALOGUE)  # a handler for every kind, no other
    for k in messages.KINDS:
        assert callable(k.check), k.name
        assert callable(handlers[k.name]), k.name
        assert handlers[k.name].__name__ == "on_" + k.name.lower(), k.name


@pytest.mark.parametrize("kind", list(messages.CATALOGUE))
def test_the_edge_checks_every_kind_by_its_catalogue_rule(kind: str) -> None:
    # an empty meta is wrong for every kind but REPLJOB / YOURJOBS, whose bodies
    # are then missing: each kind's rule runs and refuses it
    with pytest.raises(BadMessage):
        check_job({"k": kind, "s": 0, "m": {}}, [])


def test_an_unknown_kind_passes_the_edge_only_without_bodies_and_is_dropped() -> None:
    assert check_job({"k": "NEWER", "s": 1, "m": {"x": 1}}, []) == ("NEWER", 1, {"x": 1})
    with pytest.raises(BadMessage, match="unknown job message"):
        check_job({"k": "NEWER", "s": 1, "m": {}}, [b"x"])
    s = _shard()
    s.on_message(NODE.replace("a", "b"), "NEWER", {}, [], 1_000_000)
    assert s.take_effects() == []


def test_every_senders_meta_passes_its_kinds_check() -> None:
    """What the catalogue's meta functions build is what the kind's check accepts
    (the sender's side and the edge agree), with each field only when set."""
    from workers.ids import slot_of, slot_of_job_id

    jid = "D-aaaaaaaa-" + "A" * 24 + "-05a1"
    jslot = slot_of_job_id(jid)
    queue = b"q"
    qslot = slot_of(queue)
    nodes = ("b" * 40, "c" * 40)
    sent = [
        (messages.GOTJOB, jslot, messages.job_meta(jid), []),
        (messages.ENQUEUE, jslot, messages.enqueue_meta(jid, nodes), []),
        (messages.QUEUED, jslot, messages.queued_meta(jid), []),
        (messages.QUEUED, jslot, messages.queued_meta(jid, 2, wait_ms=5000), []),
        (messages.QUEUED, jslot, messages.queued_meta(jid, 4, dead=True, reason=b"why"), []),
        (messages.QUEUED, jslot, messages.queued_meta(jid, redrive=True), []),
        (messages.SETACK, jslot, messages.setack_meta(jid, 0), []),
        (messages.SETACK, jslot, messages.setack_meta(jid, 2, nodes), []),
        (messages.GOTACK, jslot, messages.gotack_meta(jid, False), []),
        (messages.NEEDJOBS, qslot, messages.needjobs_meta(5), [queue]),
        (messages.PAUSE, qslot, messages.pause_meta(3), [queue]),
        (messages.QLIMIT, qslot, messages.qlimit_meta(5, 50, 2), [queue]),
        (messages.QLENASK, qslot, messages.request_meta(7), [queue]),
        (messages.QLENIS, qslot, messages.qlenis_meta(7, 12), []),
        (messages.DELQDONE, qslot, messages.request_meta(7), [jid.encode()]),
    ]
    for kind, slot, meta, bodies in sent:
        assert messages.check(kind, slot, meta, bodies) is None, (kind, meta)
    assert messages.queued_meta(jid) == {"j": jid}
    assert list(messages.queued_meta(jid, 4, dead=True, reason=b"r")) == ["j", "dl", "f", "why"]
    assert messages.setack_meta(jid, 0) == {"j": jid, "m": 0}
