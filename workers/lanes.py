"""The entries of a queue's ctime-ordered deques (live, stale, ghost), the lanes
of a queue split by groups, and ``GroupOrder``, the orders kept over those lanes
so that every read of a grouped queue costs what it asks, not how many groups the
queue holds (docs/shard.md).

An entry is live iff its job is QUEUED and not one of the queue's ghosts (jobs
whose entry there is no longer theirs: they moved to another queue).

``GroupOrder`` (one per split queue) keeps three orders, each lazily:

- ``heads``: a heap of (oldest entry's ctime, lane rank, lane). A key is pushed
  whenever a lane's first entry becomes older (a lane refilled, an insert at its
  front); a pop only makes a lane's head newer, so every lane's smallest key is a
  lower bound of its head, checked (and pushed again) when read. The ``count``
  lanes with the oldest heads hold the ``count`` oldest jobs: QPEEK, the oldest
  age (QSTAT, /metrics, the HTTP API) merge those lanes only, O(count log lanes).
- ``tails``: the same with the newest entry (QPEEK with a negative count), made
  on the first such read and kept from then on (an append pushes a key).
- ``buckets``: the lanes by queued count, each bucket a heap by name, with the
  distinct counts sorted (``counts``) and how many lanes hold each (``sizes``):
  QGROUPS walks the largest counts first, ties by name, O(count log lanes). A
  count change only marks its lane (``dirty``); the next read settles each
  marked lane once (one entry pushed), so a push or pop pays a flag test. Entries
  left behind are dropped when read or when they outnumber the lanes
  (``order_garbage_min`` and twice the lanes: amortised O(1) per change).

Lane ranks follow the lanes' creation, so ties between equal ctimes keep the
order a merge of every lane in creation order gave.

A lane that leaves (``drop``) may still be named by keys of the three orders and
by ``dirty``: each is rebuilt once it holds more than ``order_garbage_min`` and
twice the lanes, so a lane gone does not keep its record and deque alive for as
long as the queue stays split. ``LaneCount`` is how many lanes the queues of one
shard hold, kept as lanes are made and dropped (the memory estimate reads it).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import deque
from typing import Final

from workers.job import QUEUED, Job

# Rebuild an order once it holds more than this many entries and more than twice
# the lanes: stale keys cost memory, never correctness.
order_garbage_min: Final = 64


def live_entry(job: Job, ghosts: set[Job] | None) -> bool:
    """The entry is the job's own and the job is queued."""
    return job.state == QUEUED and not (ghosts and job in ghosts)


def forget_entry(job: Job, ghosts: set[Job] | None) -> None:
    """A stale entry leaves its deque: a ghost leaves the set (the job's flag is
    about its own queue's entry), any other entry unmarks its job."""
    if ghosts and job in ghosts:
        ghosts.discard(job)
    else:
        job.unmark_in_deque()


def queued_only(dq: deque[Job], ghosts: set[Job] | None) -> deque[Job]:
    """A purge: the live entries of ``dq``, in order; the stale ones leave."""
    keep: deque[Job] = deque()
    for job in dq:
        if live_entry(job, ghosts):
            keep.append(job)
        else:
            forget_entry(job, ghosts)
    return keep


def trim_head(dq: deque[Job], ghosts: set[Job] | None) -> int:
    """Drop the stale entries before the first live one; how many went."""
    n = 0
    while dq and not live_entry(dq[0], ghosts):
        forget_entry(dq.popleft(), ghosts)
        n += 1
    return n


def trim_tail(dq: deque[Job], ghosts: set[Job] | None) -> int:
    """Drop the stale entries after the last live one; how many went."""
    n = 0
    while dq and not live_entry(dq[-1], ghosts):
        forget_entry(dq.pop(), ghosts)
        n += 1
    return n


def group_of(job: Job) -> bytes:
    ext = job.ext
    return b"" if ext is None else ext.group


def priority_of(job: Job) -> int:
    ext = job.ext
    return 0 if ext is None else ext.priority


class LaneCount:
    """How many lanes the split queues of one shard hold (the memory estimate)."""

    __slots__ = ("lanes",)

    def __init__(self) -> None:
        self.lanes = 0


class Lane:
    """The jobs of one group in a queue that holds several: the same ctime-ordered
    deque with lazy deletion as a single-group queue's."""

    __slots__ = ("group", "dq", "live", "stale", "rank", "counted", "dirty")

    def __init__(self, group: bytes, dq: deque[Job], live: int, stale: int, rank: int) -> None:
        self.group = group
        self.dq = dq
        self.live = live
        self.stale = stale
        self.rank = rank  # creation order among the queue's lanes
        self.counted = 0  # ``live`` as the group order's buckets last counted it
        self.dirty = False  # ``live`` changed since (the order's ``dirty`` list)

    def take(self, ghosts: set[Job] | None) -> tuple[Job | None, int]:
        """Pop the oldest queued job; also how many stale entries were skipped."""
        dq = self.dq
        skipped = 0
        while dq:
            job = dq.popleft()
            if live_entry(job, ghosts):
                job.unmark_in_deque()
                self.live -= 1
                self.stale -= skipped
                return job, skipped
            forget_entry(job, ghosts)
            skipped += 1
        self.stale -= skipped
        return None, skipped

    def trim(self, ghosts: set[Job] | None, tail: bool) -> int:
        """Drop the stale entries at one end (a lane with a live entry); how many."""
        n = trim_tail(self.dq, ghosts) if tail else trim_head(self.dq, ghosts)
        self.stale -= n
        return n

    def clear(self, ghosts: set[Job] | None) -> None:
        for job in self.dq:
            forget_entry(job, ghosts)
        self.dq.clear()
        self.live = 0
        self.stale = 0


Key = tuple[int, int, Lane]  # (ctime, or minus it for tails; rank; lane)
Named = tuple[bytes, int, Lane]  # (group, rank, lane)


class GroupOrder:
    """The lanes of one split queue by head, by tail and by queued count (see the
    module's docstring). ``lanes`` is the queue's own table."""

    __slots__ = ("lanes", "ranks", "heads", "tails", "buckets", "sizes", "counts", "entries",
                 "dirty", "count")

    def __init__(self, lanes: dict[bytes, Lane], count: LaneCount) -> None:
        self.lanes = lanes
        self.count = count  # the shard's lanes: one more per lane made, one less per drop
        self.ranks = 0
        self.heads: list[Key] = []
        self.tails: list[Key] | None = None
        self.buckets: dict[int, list[Named]] = {}
        self.sizes: dict[int, int] = {}
        self.counts: list[int] = []  # the keys of ``sizes``, ascending
        self.entries = 0  # entries in the buckets' heaps
        self.dirty: list[Lane] = []  # lanes whose count changed since the buckets' last look

    def new_lane(self, group: bytes, dq: deque[Job], live: int, stale: int) -> Lane:
        lane = Lane(group, dq, live, stale, self.ranks)
        self.ranks += 1
        self.lanes[group] = lane
        self.count.lanes += 1
        if live:
            self.changed(lane)
            self.head_moved(lane)
            self.tail_moved(lane)
        return lane

    def drop(self, lane: Lane) -> None:
        """The lane leaves the queue (its jobs are gone): out of the table, and the
        orders' keys naming it rebuilt once they are mostly such leftovers."""
        del self.lanes[lane.group]
        self.count.lanes -= 1
        n = len(self.lanes)
        if n > 1:  # else the queue goes back to one deque and drops its order
            self._collect(max(order_garbage_min, 2 * n))

    def dissolve(self) -> None:
        """The queue goes back to one deque: the lanes left stop counting as lanes."""
        self.count.lanes -= len(self.lanes)

    def _collect(self, most: int) -> None:
        """Rebuild each order holding more than ``most`` entries."""
        if len(self.heads) > most:
            self.heads = self._keyed(False)
        if self.tails is not None and len(self.tails) > most:
            self.tails = self._keyed(True)
        if len(self.dirty) > most or self.entries > most:
            if self.sizes:  # the buckets are in use: settling drops the gone lanes
                self.settle()  # (and rebuilds the buckets past the same bound)
            else:  # no lane is in the buckets: the gone ones need no settling
                lanes = self.lanes
                self.dirty = [x for x in self.dirty if lanes.get(x.group) is x]

    # ---- the moves the queue reports

    def changed(self, lane: Lane) -> None:
        """The lane's queued count changed (or the lane went): the buckets hear of it
        at their next read (``settle``), once however many changes came between."""
        if not lane.dirty:
            lane.dirty = True
            self.dirty.append(lane)

    def settle(self) -> None:
        """Bring the buckets up to date with the lanes that changed."""
        sizes = self.sizes
        for lane in self.dirty:
            lane.dirty = False
            was = lane.counted
            now = lane.live if self.lanes.get(lane.group) is lane else 0
            if now == was:
                continue
            lane.counted = now
            if was:
                left = sizes[was] - 1
                if left:
                    sizes[was] = left
                else:
                    del sizes[was]
                    self.entries -= len(self.buckets.pop(was))
                    del self.counts[bisect_left(self.counts, was)]
            if now:
                n = sizes.get(now, 0)
                sizes[now] = n + 1
                if not n:
                    self.buckets[now] = []
                    insort(self.counts, now)
                heapq.heappush(self.buckets[now], (lane.group, lane.rank, lane))
                self.entries += 1
        self.dirty.clear()
        if self.entries > order_garbage_min and self.entries > 2 * len(self.lanes):
            self._rebuild_buckets()

    def head_moved(self, lane: Lane) -> None:
        """The lane's first entry is older than before (or the lane was empty)."""
        heads = self.heads
        heapq.heappush(heads, (lane.dq[0].ctime_us, lane.rank, lane))
        if len(heads) > order_garbage_min and len(heads) > 2 * len(self.lanes):
            self.heads = self._keyed(False)

    def tail_moved(self, lane: Lane) -> None:
        """The lane's last entry is newer than before (kept once a read asked)."""
        tails = self.tails
        if tails is None:
            return
        heapq.heappush(tails, (-lane.dq[-1].ctime_us, lane.rank, lane))
        if len(tails) > order_garbage_min and len(tails) > 2 * len(self.lanes):
            self.tails = self._keyed(True)

    # ---- the reads

    def first_lanes(self, count: int, ghosts: set[Job] | None, tail: bool) -> tuple[list[Lane], int]:
        """The ``count`` lanes whose oldest (``tail``: newest) queued jobs come first,
        in rank order; also how many stale entries were dropped on the way."""
        if tail and self.tails is None:
            self.tails = self._keyed(True)
        heap = self.tails if tail else self.heads
        if heap is None:
            return [], 0
        chosen: list[Lane] = []
        picked: set[int] = set()
        dropped = 0
        while heap and len(chosen) < count:
            key, rank, lane = heapq.heappop(heap)
            if self.lanes.get(lane.group) is not lane or not lane.live or rank in picked:
                continue  # the lane went, or is empty, or was picked already
            dropped += lane.trim(ghosts, tail)
            actual = -lane.dq[-1].ctime_us if tail else lane.dq[0].ctime_us
            if key < actual:  # a bound: the lane's end moved inwards since
                heapq.heappush(heap, (actual, rank, lane))
            elif key == actual:
                chosen.append(lane)
                picked.add(rank)
            # key > actual: an older key of a lane whose end moved out (pushed then)
        for lane in chosen:
            end = -lane.dq[-1].ctime_us if tail else lane.dq[0].ctime_us
            heapq.heappush(heap, (end, lane.rank, lane))
        chosen.sort(key=_rank)
        return chosen, dropped

    def largest(self, count: int) -> list[tuple[bytes, int]]:
        """Up to ``count`` (group, queued) pairs, largest first, ties by name."""
        self.settle()
        out: list[tuple[bytes, int]] = []
        for i in range(len(self.counts) - 1, -1, -1):
            if len(out) >= count:
                break
            n = self.counts[i]
            heap = self.buckets[n]
            kept: list[Named] = []
            picked: set[int] = set()
            while heap and len(out) < count:
                entry = heapq.heappop(heap)
                group, rank, lane = entry
                if self.lanes.get(group) is lane and lane.counted == n and rank not in picked:
                    out.append((group, n))
                    kept.append(entry)
                    picked.add(rank)
                else:
                    self.entries -= 1  # left behind by a change of count, or a lane gone
            for entry in kept:
                heapq.heappush(heap, entry)
        return out

    def check(self) -> str | None:
        """Describe a broken invariant of the orders, or None (tests; settles first)."""
        self.settle()
        sizes: dict[int, int] = {}
        live = [lane for lane in self.lanes.values() if lane.live]
        for lane in live:
            sizes[lane.live] = sizes.get(lane.live, 0) + 1
        if sizes != self.sizes or self.counts != sorted(sizes) or set(self.buckets) != set(sizes):
            return f"group order counts {self.sizes} / {sizes}"
        if self.entries != sum(len(h) for h in self.buckets.values()):
            return "group order entries miscounted"
        for tail, heap in ((False, self.heads), (True, self.tails)):
            if heap is None:
                continue
            best: dict[int, int] = {}
            for key, rank, _ in heap:
                best[rank] = min(best.get(rank, key), key)
            for lane in live:
                end = -lane.dq[-1].ctime_us if tail else lane.dq[0].ctime_us
                if best.get(lane.rank, end + 1) > end:
                    return f"lane {lane.group!r} without a bound in the {'tails' if tail else 'heads'}"
        return None

    # ---- rebuilding

    def _keyed(self, tail: bool) -> list[Key]:
        keys: list[Key] = [((-lane.dq[-1].ctime_us if tail else lane.dq[0].ctime_us),
                            lane.rank, lane) for lane in self.lanes.values() if lane.live]
        heapq.heapify(keys)
        return keys

    def _rebuild_buckets(self) -> None:
        buckets: dict[int, list[Named]] = {}
        for lane in self.lanes.values():  # settled: ``counted`` is ``live``
            if lane.counted:
                buckets.setdefault(lane.counted, []).append((lane.group, lane.rank, lane))
        for heap in buckets.values():
            heapq.heapify(heap)
        self.buckets = buckets
        self.entries = sum(len(h) for h in buckets.values())


def _rank(lane: Lane) -> int:
    return lane.rank
