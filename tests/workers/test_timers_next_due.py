"""``Timers.next_due`` drops a top bucket whose every entry went stale (so the
worker's tick is not planned for it), and keeps one that may still hold a live
target: a target scheduled again into the same bucket, or a bucket a capped tick
left half drained."""

from __future__ import annotations

from workers.job import Timed
from workers.timers import Timers, timer_resolution_ms


def _targets(n: int) -> list[Timed]:
    out = []
    for _ in range(n):
        t = Timed()
        t.awake_ms = 0
        out.append(t)
    return out


def test_a_top_bucket_of_stale_entries_is_dropped_the_next_live_one_answers() -> None:
    timers = Timers()
    a, b, c = _targets(3)
    timers.schedule(a, 100)
    timers.schedule(b, 100)
    timers.schedule(c, 200)
    assert timers.next_due() == 100
    timers.unschedule(a)
    assert timers.next_due() == 100  # b is still due then
    timers.unschedule(b)
    assert timers.next_due() == 200
    assert timers.heap == [200] and list(timers.buckets) == [200]
    timers.check()
    timers.unschedule(c)
    assert timers.next_due() is None and not timers.heap and not timers.buckets
    assert timers.next_fired(10**6, 100) is None


def test_a_target_scheduled_again_into_its_bucket_keeps_it() -> None:
    timers = Timers()
    (a,) = _targets(1)
    timers.schedule(a, 100)
    timers.unschedule(a)
    timers.schedule(a, 100)  # two entries, one unschedule: live
    assert timers.next_due() == 100
    assert timers.next_fired(100, 100) is a and timers.next_fired(100, 100) is None


def test_a_bucket_a_capped_tick_left_half_drained_is_kept() -> None:
    timers = Timers()
    live, dead = _targets(2)
    timers.schedule(live, 100)
    timers.schedule(dead, 100)  # drained first (last in)
    timers.unschedule(dead)
    timers.start_firing()
    assert timers.next_fired(100, 1) is None and timers.capped  # took the stale entry only
    assert timers.next_due() == 100  # the counts say all stale; live is not fired yet
    timers.start_firing()
    assert timers.next_fired(100, 10) is live
    assert timers.next_fired(100, 10) is None and timers.next_due() is None
    assert timer_resolution_ms == 10  # the due times above are bucket keys as they are


def test_times_1000_is_the_product_for_every_time_scale() -> None:
    """The shift form of ``n * 1000`` (kept off the compiled long multiplication) is
    exact for small, negative and epoch-scale times in ms and in us."""
    from workers.job import times_1000

    for n in (0, 1, -1, 999, -12345, 2**30, 1_796_174_594_385, 1_796_174_594_385_123,
              2**52 - 1, -(2**52)):
        assert times_1000(n) == n * 1000


def test_a_due_time_is_rounded_up_to_the_resolution() -> None:
    for due in (1_796_174_594_380, 1_796_174_594_381, 1_796_174_594_389, 10, 11):
        timers = Timers()
        (target,) = _targets(1)
        timers.schedule(target, due)
        assert target.awake_ms == -(-due // timer_resolution_ms) * timer_resolution_ms
