"""The schedules table without a node (disque_mp/node/schedules.py): the firer order,
one firing per fire time over three tables that hear each other's notes, a backup
taking over a silent firer, missed times (once | skip), newest-version-wins with
tombstones, the wire form and the bus edge's check of SCHED frames."""

from __future__ import annotations

import pytest

from bus.frames import FrameError
from bus.messages import check_schedule
from disque_mp.node import schedules as sch
from workers.replies import Error

NODES = [c * 40 for c in "abc"]
T0 = 1_700_000_000_000  # a whole second, epoch ms


def _spec(name: bytes = b"s", every_s: int = 1, set_ms: int = T0, origin: str = NODES[0],
          cron: str = "", tz: str = "UTC") -> sch.Spec:
    args = [name, b"EVERY", b"%d" % every_s] if not cron else [name, b"CRON", cron.encode(),
                                                                b"TZ", tz.encode()]
    spec = sch.parse_set([*args, b"ADDJOB", b"q", b"body", b"0", b"RETRY", b"5"], 1024)
    assert isinstance(spec, sch.Spec)
    spec.set_ms, spec.origin = set_ms, origin
    return spec


def _tables(start_ms: int = T0 - 10_000) -> list[sch.Table]:
    tables = [sch.Table(10, "once", 1000, start_ms) for _ in NODES]
    for t in tables:
        assert t.apply(_spec())
    return tables


def test_one_firer_and_the_next_in_order_takes_over() -> None:
    ranks = [sch.rank(b"s", me, NODES) for me in NODES]
    assert sorted(ranks) == [0, 1, 2]
    firer, backup = NODES[ranks.index(0)], NODES[ranks.index(1)]
    rest = [n for n in NODES if n != firer]
    assert sch.rank(b"s", backup, rest) == 0
    assert sch.rank(b"s", firer, rest) == 2  # leaving: after every node that may fire


def test_each_fire_time_fires_once_while_notes_arrive() -> None:
    tables = _tables()
    fired: dict[int, list[str]] = {}
    for now in range(T0, T0 + 20_000, 100):
        for me, table in zip(NODES, tables, strict=True):
            for f in table.due(now, me, NODES):
                fired.setdefault(f.fire_ms, []).append(me)
                assert f.args[-4:] == [b"DEDUP", b"schedule:s@%d" % f.fire_ms,
                                       b"DEDUP-KEEP", b"%d" % sch.firing_dedup_keep_s]
                for t in tables:  # the note reaches every node at once
                    t.note_fired(f.name, f.fire_ms, "D-job")
    assert sorted(fired) == list(range(T0 + 1000, T0 + 20_000, 1000))
    assert all(len(who) == 1 for who in fired.values())
    assert len({who[0] for who in fired.values()}) == 1


def test_a_silent_firer_is_replaced_after_the_takeover_wait() -> None:
    tables = _tables()
    firer = next(n for n in NODES if sch.rank(b"s", n, NODES) == 0)
    fired: list[tuple[int, str, int]] = []
    for now in range(T0, T0 + 6_000, 100):
        for me, table in zip(NODES, tables, strict=True):
            if me == firer:
                continue  # cut off: it fires nothing that reaches the others
            for f in table.due(now, me, NODES):
                fired.append((f.fire_ms, me, now))
                for t in tables:
                    t.note_fired(f.name, f.fire_ms, "D-job")
    assert [f[0] for f in fired] == list(range(T0 + 1000, T0 + 5_000, 1000))
    assert all(now - fire_ms >= 1000 for fire_ms, _, now in fired)  # rank 1 waited
    assert len({me for _, me, _ in fired}) == 1


def test_a_backup_waiting_longer_than_the_period_fires_every_time() -> None:
    tables = [sch.Table(10, "once", 2500, T0 - 10_000) for _ in NODES]
    for t in tables:
        t.apply(_spec())
    ranked = sorted(NODES, key=lambda n: sch.rank(b"s", n, NODES))
    last = tables[NODES.index(ranked[2])]  # the firer and the first backup are cut off
    fired = [f.fire_ms for now in range(T0, T0 + 12_000, 100)
             for f in last.due(now, ranked[2], NODES)]
    assert fired == list(range(T0 + 1000, T0 + 7_000, 1000))  # each waited 5 s, none lost


@pytest.mark.parametrize("policy", ["once", "skip"])
def test_times_missed_while_down(policy: str) -> None:
    table = sch.Table(10, policy, 1000, T0 + 10_500)  # started 10.5 s after the last firing
    table.apply(_spec())
    table.note_fired(b"s", T0, "D-old")
    assert table.due(T0 + 10_600, NODES[0], [NODES[0]]) == []  # the start's grace
    got = table.due(T0 + 11_500, NODES[0], [NODES[0]])
    entry = table.get(b"s")
    assert entry is not None
    if policy == "once":
        assert [f.fire_ms for f in got][:1] == [T0 + 10_000] and got[0].missed
        assert entry.skipped == 9  # 1..9 s: only the latest missed time fires
    else:
        assert all(not f.missed for f in got) and entry.skipped == 10


def test_newest_version_wins_and_a_tombstone_keeps_an_old_set_out() -> None:
    table = sch.Table(10)
    assert table.apply(_spec(every_s=5, set_ms=T0))
    assert not table.apply(_spec(every_s=7, set_ms=T0 - 1))  # older: ignored
    gone = sch.Spec(b"s", "", "UTC", 0, [], T0 + 1, NODES[1], True)
    assert table.apply(gone)
    assert table.get(b"s") is None and table.live() == []
    assert not table.apply(_spec(every_s=5, set_ms=T0))  # late SET: stays deleted
    assert table.apply(_spec(every_s=5, set_ms=T0 + 2))


def test_schedules_max_and_the_wire_form() -> None:
    table = sch.Table(1)
    assert table.apply(_spec(b"a"))
    assert table.full(b"b") and not table.full(b"a")
    assert not table.apply(_spec(b"b"))
    entry = table.get(b"a")
    assert entry is not None
    meta, bodies = sch.to_wire(entry)
    assert check_schedule(meta, bodies) == "set"
    back = sch.from_wire(meta, bodies, 1024)
    assert not isinstance(back, Error)
    assert back[0] == entry.spec
    assert isinstance(sch.from_wire(meta, bodies, 3), Error)  # over this node's body bound
    bad = {**meta, "every": 0, "cron": "61 * * * *", "tz": "UTC"}
    assert isinstance(sch.from_wire(bad, bodies, 1024), Error)


def test_two_tables_agree_after_exchanging() -> None:
    a, b = sch.Table(10), sch.Table(10)
    a.apply(_spec(b"x"))
    b.apply(_spec(b"y", origin=NODES[1]))
    assert a.digest() != b.digest()
    for src, dst in ((a, b), (b, a)):
        for e in list(src.entries.values()):
            meta, bodies = sch.to_wire(e)
            got = sch.from_wire(meta, bodies, 1024)
            assert not isinstance(got, Error)
            dst.apply(got[0])
    assert a.digest() == b.digest()


def test_cron_in_a_zone_and_many_due_at_once() -> None:
    spec = _spec(cron="30 2 * * *", tz="Asia/Tokyo")
    nxt = spec.next_after(T0)
    assert nxt % 60_000 == 0 and (nxt // 1000 // 60) % 60 == 30
    latest, count = spec.latest_due(nxt, nxt + 3 * 86_400_000)
    assert count == 4 and latest == nxt + 3 * 86_400_000


@pytest.mark.parametrize("meta,bodies", [
    ({"op": "boom"}, [b"s"]),
    ({"op": ["set"]}, [b"s"]),
    ({"op": {"x": 1}}, [b"s"]),
    ({"op": "sum"}, []),
    ({"op": "fired", "t": -1, "j": "x"}, [b"s"]),
    ({"op": "fired", "t": 1, "j": "x"}, []),
    ({"op": "set", "v": [1], "cron": "", "tz": "UTC", "every": 1, "del": False, "lf": 0,
      "lj": ""}, [b"s"]),
    ({"op": "set", "v": [1, "n"], "cron": "x" * 300, "tz": "UTC", "every": 1, "del": False,
      "lf": 0, "lj": ""}, [b"s"]),
])
def test_the_bus_edge_refuses_malformed_sched_frames(meta: dict, bodies: list[bytes]) -> None:
    with pytest.raises(FrameError):
        check_schedule(meta, bodies)


def test_a_later_note_does_not_cancel_an_earlier_time_the_firer_skipped() -> None:
    table = sch.Table(10, "once", 2000, T0 - 10_000)
    table.apply(_spec())
    backup = next(n for n in NODES if sch.rank(b"s", n, NODES) == 1)
    assert table.due(T0 + 1000, backup, NODES) == []  # T0+1000 waits 2 s for the firer
    assert table.note_fired(b"s", T0 + 2000, "D-next")  # the firer (just started) fired the next
    assert table.due(T0 + 2500, backup, NODES) == []
    late = table.due(T0 + 3000, backup, NODES)
    assert [f.fire_ms for f in late] == [T0 + 1000]
    assert table.note_fired(b"s", T0 + 1000, "D-late")  # our own firing: news, counted
    entry = table.get(b"s")
    assert entry is not None and entry.fired == 2 and entry.last_job_id == "D-next"


def test_the_timer_sleeps_until_the_next_thing_to_do() -> None:
    table = sch.Table(10, "once", 1000, T0 - 10_000)
    assert table.next_wake_ms(T0, NODES[0], NODES) is None  # nothing scheduled: no wake-up
    table.apply(_spec(every_s=60))
    assert table.next_wake_ms(T0, NODES[0], NODES) == T0 + 40_000  # T0 is 20 s past a minute
    backup = next(n for n in NODES if sch.rank(b"s", n, NODES) == 2)
    assert table.due(T0 + 40_000, backup, NODES) == []  # the time waits for the others
    assert table.next_wake_ms(T0 + 40_000, backup, NODES) == T0 + 42_000  # rank 2: 2 takeovers


def test_a_firing_keeps_its_key_past_the_ack_unless_the_options_say_how_long() -> None:
    """DEDUP-KEEP on every firing (a second firer after the first job's ACK adds
    nothing where a holder heard the ACK); a schedule's own DEDUP-KEEP stays."""
    spec = sch.parse_set([b"own", b"EVERY", b"5", b"ADDJOB", b"q", b"b", b"0",
                          b"DEDUP", b"k", b"DEDUP-KEEP", b"600"], 1024)
    assert not isinstance(spec, Error)
    assert spec.addjob_args(T0)[3:] == [b"DEDUP-KEEP", b"600", b"DEDUP", b"k@%d" % T0]
