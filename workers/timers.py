"""The shard's timers: ONE heap of due times (ms, rounded up to
``timer_resolution_ms``, or coarser for a timer set far ahead: ``resolution_for``); each due time has a bucket of targets (jobs, queues,
federation states, gathers: any ``workers.job.Timed``). A target records the
bucket it sits in (``awake_ms``); moving or deleting it leaves a stale entry,
counted and purged when the bucket is half stale. Sharing one int key and one
list slot per job keeps ~1M waiting timers cheap.

The shard owns one ``Timers``; ``Lifecycle.tick`` (workers/lifecycle.py, which
``Shard.tick`` calls) takes the due targets from it one by one with
``next_fired`` and fires each: what a firing means is the lifecycle's business,
how the heap is drained (and bounded per tick) is this module's.
"""

from __future__ import annotations

import heapq
from typing import Final

from workers.invariant import invariant
from workers.job import Timed

# Timers fire at most this late: due times are rounded up to it so that jobs
# created in the same few ms share one heap entry and one int key.
timer_resolution_ms: Final = 10
# A timer set at least this far ahead (a TTL, a RETRY, an idle queue's check) is
# rounded up to the coarser resolution beside it: at most 1 % late past 10 s, 1.7 %
# past a minute, and the jobs of a second share a bucket (a paced producer's jobs,
# a millisecond apart, each made a bucket, a heap entry and a dict entry of its own).
timer_far_ms: Final = 10_000
timer_far_resolution_ms: Final = 100
timer_farther_ms: Final = 60_000
timer_farther_resolution_ms: Final = 1000


def resolution_for(span_ms: int) -> int:
    """The rounding of a timer set ``span_ms`` ahead."""
    if span_ms >= timer_farther_ms:
        return timer_farther_resolution_ms
    if span_ms >= timer_far_ms:
        return timer_far_resolution_ms
    return timer_resolution_ms
# Purge a timer bucket once it has this many stale entries and they are half of it.
timer_stale_purge_min: Final = 32


class TimerBucket:
    __slots__ = ("key", "items", "stale")

    def __init__(self, key: int) -> None:
        self.key = key
        self.items: list[Timed] = []  # jobs, queues, federation states, gathers
        self.stale = 0


class Timers:
    """Due time -> targets. ``firing_key``: the bucket ``next_fired`` is draining
    (0 = none); a target scheduled in the past joins it."""

    def __init__(self) -> None:
        self.buckets: dict[int, TimerBucket] = {}
        self.heap: list[int] = []
        self.firing_key = 0
        self.popped = 0  # entries taken since ``start_firing`` (stale ones too)
        self.capped = False  # ``next_fired`` stopped at its bound: more is due now
        # The two buckets used last: a job is scheduled at its TTL when queued, moved
        # to its RETRY when delivered and unscheduled when acknowledged, and the jobs
        # of one pipelined batch share both keys, so most calls find their bucket
        # here by a compare of native ints instead of a dict lookup of a boxed one.
        self._recent: TimerBucket | None = None
        self._before: TimerBucket | None = None

    def start_firing(self) -> None:
        """A tick begins: its bound on entries taken starts again."""
        self.popped = 0
        self.capped = False

    def next_fired(self, now_ms: int, pops_max: int) -> Timed | None:
        """The next target due at ``now_ms``, its timer cleared; None when nothing
        more is due, or when ``pops_max`` entries (stale ones count: purging them
        is work too) were taken since ``start_firing`` (``capped`` then says so)."""
        heap = self.heap
        while heap and heap[0] <= now_ms:
            key = heap[0]
            items = self.buckets[key].items
            self.firing_key = key
            while items:
                if self.popped >= pops_max:
                    self.firing_key = 0
                    self.capped = True
                    return None
                t = items.pop()
                self.popped += 1
                if t.awake_ms != key:
                    continue  # stale entry: moved to another bucket or deleted
                t.awake_ms = 0
                return t
            self.firing_key = 0
            invariant(heapq.heappop(heap) == key, "timer heap top changed while firing")
            self._drop(key)
        return None

    def _bucket(self, key: int) -> TimerBucket | None:
        """The bucket of ``key``, if there is one (the two used last first)."""
        b = self._recent
        if b is not None and b.key == key:
            return b
        b = self._before
        if b is not None and b.key == key:
            self._before = self._recent
            self._recent = b
            return b
        b = self.buckets.get(key)
        if b is not None:
            self._before = self._recent
            self._recent = b
        return b

    def _drop(self, key: int) -> None:
        """Bucket ``key`` is done (its heap entry popped)."""
        del self.buckets[key]
        self._recent = self._before = None

    def schedule(self, target: Timed, due_ms: int, span_ms: int = 0) -> None:
        """Make sure ``target`` is examined at ``due_ms`` or earlier (never before due);
        ``span_ms``: how far ahead the caller set it (its rounding: ``resolution_for``)."""
        # rounded up to the resolution: a remainder, as a product of a time since the
        # epoch leaves mypyc's inline int path (see workers.job.times_1000)
        key = due_ms + -due_ms % resolution_for(span_ms)
        if key < self.firing_key:
            key = self.firing_key  # already due: join the bucket tick() is draining
        cur = target.awake_ms
        if cur:
            if cur <= key:
                return
            self.unschedule(target)
        b = self._bucket(key)
        if b is None:
            b = self.buckets[key] = TimerBucket(key)
            heapq.heappush(self.heap, key)
            self._before = self._recent
            self._recent = b
        target.awake_ms = b.key  # one shared int object for every target in the bucket
        b.items.append(target)

    def unschedule(self, target: Timed) -> None:
        key = target.awake_ms
        if not key:
            return
        target.awake_ms = 0
        b = self._bucket(key)
        if b is None:
            return
        b.stale += 1
        if b.stale > timer_stale_purge_min and b.stale * 2 > len(b.items):
            b.items = [t for t in b.items if t.awake_ms == key]
            b.stale = 0

    def next_due(self) -> int | None:
        """The earliest due time that still has a target, or None. A top bucket whose
        every entry went stale (a replicated job's copies answered before its 50 ms
        step, an ACK before a WAITJOB's timeout) is dropped here, so the worker does
        not keep a tick planned for it; not while a capped tick left the top bucket
        half drained (its count of stale entries no longer adds up then)."""
        heap = self.heap
        while heap:
            key = heap[0]
            if self.capped or self.firing_key:
                return key
            b = self.buckets[key]
            if b.stale < len(b.items):  # fewer unschedules than entries: one may be live
                return key
            heapq.heappop(heap)
            self._drop(key)
        return None

    def holds(self, target: Timed) -> bool:
        """``target`` sits in the bucket it records (tests; O(bucket))."""
        b = self.buckets.get(target.awake_ms)
        return b is not None and target in b.items

    def check(self) -> None:
        invariant(len(self.heap) == len(self.buckets), "timer heap and buckets differ")
