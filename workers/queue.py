"""A named queue: jobs ordered by creation time, plus the queue's bookkeeping;
and ``Fed``, the queue's federation state (recent sources, NEEDJOBS backoff,
import rate) that workers/federation.py keeps for queues with consumers.

Structure: one ``collections.deque`` of job records sorted by ``ctime_us``
(unique per creating node; ties keep arrival order), with lazy deletion.

- The common case is an append of a job newer than the tail (ADDJOB on this
  node): ``deque.append``, O(1), 8 bytes per job.
- Pop-oldest (GETJOB) is ``popleft``, O(1).
- Re-queued jobs are usually older than everything queued: ``appendleft``;
  otherwise a search by ctime galloping from both ends (``_position``: probes
  cost the distance from the nearer end) and ``deque.insert`` (O(that distance)).
- Remove-by-job (DEQUEUE, ACKJOB, TTL, DELJOB of a queued job) only changes the
  job's state and a counter: the record stays in the deque as a *stale* entry,
  skipped by pop and peek. A stale entry sits exactly where the job would be
  inserted again (ctime never changes), so re-queueing a job that still has
  one revives it in place. Stale entries are purged when they outnumber the
  live ones (amortised O(1) per removal).
- A job that moves to another queue (dead letter, REDRIVE) leaves its stale
  entry where it is, as a *ghost*: the queue's ``ghosts`` set names the jobs
  whose entry here is no longer theirs (the job may be queued elsewhere, so its
  state alone cannot tell). A ghost counts as a stale entry (purged with them);
  the job coming back revives it in place. So a move costs O(1) whatever the
  queue's length, where removing the entry from the deque would scan it.
- Reads from the head (QPEEK, REDRIVE, the oldest age) drop the stale entries
  they find before the first live one, as a pop would: a run of stale entries
  is paid for once, not by every read.

Groups (ADDJOB ... GROUP): a queue whose jobs all belong to one group (most
queues: every job ungrouped) is the single deque above, labelled ``group0``, and
costs nothing more. When a job of a second group arrives, the queue splits into
one ``Lane`` per group (each the same ctime-ordered deque with lazy deletion)
and a ``ring`` of lanes served in rotation: ``pop`` takes the oldest job of the
lane at the head of the ring and puts that lane at the tail. A lane leaves when
its last queued job is taken or a purge finds it empty (its stale entries are
dropped with it); when one lane is left the queue goes back to the single deque.
The shard's ``LaneCount`` follows: one more per lane made, one less per lane
gone or unsplit (the memory estimate reads it, no walk).

An entry is live iff ``job.state == QUEUED`` and the job is not one of the
queue's ghosts; ``FLAG_IN_DEQUE`` says the record is physically in the deque of
the queue it belongs to (``job.queue``), never of one where it is a ghost. Compared (bench/test_micro.py: test_queue_* against test_baseline_*)
with a heap with lazy deletion and with sortedcontainers: the deque is the
fastest on append/pop and the smallest (a heap entry needs a tuple, ~70
bytes per job; a SortedKeyList ~2 list slots plus a key per job).

Priorities (ADDJOB ... PRIORITY p, 0..9, higher served first): a queue that never
held a job above priority 0 is the structure above and pays one ``is None`` test on
push and remove (and on a pop that finds its deque empty). The first job above 0
makes ``tiers``, one ``Level`` per priority in use (index = priority), each a full
ctime deque with lazy deletion and its own GROUP lanes; the entries held so far
change hands to level 0 (``_hand_over``: O(1)), and the queue's own deque, lanes and
ghosts stay empty while ``live`` counts every level's jobs. ``pop`` takes from the
highest level holding a queued job; a level found without one goes with its stale
entries (their jobs unmarked, as a lane that goes); when level 0 alone is left its
entries come back to the queue. A job's priority never changes, so every move
(remove, detach, revive) finds its level from the job. Levels publish nothing
(``Unpublished`` cells): the queue's ``live`` is what its slot's cell counts.

``Cells``: what the queues of each slot publish to the other workers of the host
(how many hold jobs, and a generation bumped when one vanishes), so that a GETJOB
coordinated elsewhere can skip an owner whose queues are known empty
(disque_mp/node/hints.py). A queue counts in its slot's ``nonempty`` cell while
``live > 0``: every place that changes ``live`` tells the cell on its 0 -> 1 and
1 -> 0 transitions, and ``drop_all`` (the queue vanishes) bumps the slot's ``gen``.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any, Final

from workers.ids import SLOTS
from workers.invariant import InvariantError
from workers.job import QUEUED, Job, Timed, priority_max
from workers.lanes import (
    GroupOrder,
    Lane,
    LaneCount,
    forget_entry,
    group_of,
    live_entry,
    priority_of,
    queued_only,
    trim_head,
)

# Purge stale entries once there are more than this many and more than live ones:
# small queues never pay for a purge, big ones pay O(n) only after n removals.
stale_entries_purge_min = 64

PAUSED_IN: Final = 1
PAUSED_OUT: Final = 2
PAUSE_NAMES = ("none", "in", "out", "all")


cells_bytes: Final = 2 * SLOTS * 4  # two u32 cells per slot: nonempty, then gen
_U32_MASK: Final = 0xFFFFFFFF


class Cells:
    """Two u32 cells per slot over a buffer (the host's shared mapping, or a private
    bytearray): ``nonempty[slot]``, how many of the slot's queues hold a queued job,
    and ``gen[slot]``, bumped whenever a queue of the slot vanishes (evicted,
    flushed) and when the slot's worker (re)starts. Only the slot's owner writes
    them; any worker of the host reads them. Pure: the buffer is given."""

    __slots__ = ("nonempty", "gen")

    def __init__(self, buf: Any) -> None:
        words = memoryview(buf).cast("I")
        if len(words) != 2 * SLOTS:
            raise InvariantError(f"cells: {len(words)} words, not {2 * SLOTS}")
        self.nonempty: memoryview = words[:SLOTS]
        self.gen: memoryview = words[SLOTS:]

    @staticmethod
    def private() -> Cells:
        """Cells no other worker reads (a shard alone: tests, the simulation)."""
        return Cells(bytearray(cells_bytes))

    def inc(self, slot: int) -> None:
        self.nonempty[slot] += 1

    def dec(self, slot: int) -> None:
        self.nonempty[slot] -= 1  # below 0 raises (ValueError): a missed transition

    def bump(self, slot: int) -> None:
        self.gen[slot] = (self.gen[slot] + 1) & _U32_MASK

    def restart(self, index: int, workers: int) -> None:
        """Worker ``index`` of ``workers`` (re)starts with no queue: its slots hold
        none with jobs, and any queue another worker saw there is gone."""
        nonempty, gen = self.nonempty, self.gen
        for slot in range(index, SLOTS, workers):
            nonempty[slot] = 0
            gen[slot] = (gen[slot] + 1) & _U32_MASK

    def known_empty(self, slot: int, gen: int) -> bool:
        """No queue of ``slot`` holds a job and none vanished since generation ``gen``."""
        return self.nonempty[slot] == 0 and self.gen[slot] == gen


class Unpublished(Cells):
    """The cells of a queue's priority levels: a level publishes nothing (its queue's
    ``live``, the total, is what the slot's cell counts), so a level handed the
    queue's jobs, or dropped with some, never moves a count."""

    __slots__ = ()

    def inc(self, slot: int) -> None:
        pass

    def dec(self, slot: int) -> None:
        pass

    def bump(self, slot: int) -> None:
        pass


# Queues made without the shard's cells and lane count (tests of a queue alone)
# count here.
_SCRATCH_CELLS: Final = Cells.private()
_SCRATCH_LANES: Final = LaneCount()
_LEVEL_CELLS: Final = Unpublished(bytearray(cells_bytes))


def _ctime(job: Job) -> int:
    return job.ctime_us


def _insert(dq: deque[Job], job: Job) -> None:
    """Put a job in ctime position (the append of a job newer than the tail first)."""
    if not dq or dq[-1].ctime_us <= job.ctime_us:
        dq.append(job)
    elif dq[0].ctime_us > job.ctime_us:
        dq.appendleft(job)
    else:
        dq.insert(_position(dq, job.ctime_us), job)


def _position(dq: deque[Job], ctime_us: int) -> int:
    """Where ``bisect_right`` would put ``ctime_us`` in a deque whose head is not
    newer and whose tail is newer: galloping from both ends at once, so the probes
    (a deque's index walks from its nearer end) cost what the distance from the
    nearer end does, not the deque's length (a NACKed job goes near the front)."""
    lo, hi = 0, len(dq) - 1  # dq[lo] <= ctime_us < dq[hi]
    step = 1
    while hi - lo > 1:
        i = lo + step
        if i >= hi:
            break
        if dq[i].ctime_us > ctime_us:
            hi = i
            break
        lo = i
        j = hi - step
        if j <= lo:
            break
        if dq[j].ctime_us <= ctime_us:
            lo = j
            break
        hi = j
        step *= 2
    return bisect_right(dq, ctime_us, lo + 1, hi, key=_ctime)


class Queue(Timed):
    __slots__ = (
        "name",
        "slot",
        "_dq",
        "live",
        "stale",
        "ctime_ms",
        "atime_ms",
        "jobs_in",
        "jobs_out",
        "paused",
        "waiters",
        "scan_idx",
        "group0",
        "lanes",
        "ring",
        "groups_live",
        "cells",
        "ghosts",
        "order",
        "lane_count",
        "tiers",
        "priority",
    )

    def __init__(self, name: bytes, slot: int, now_ms: int, cells: Cells | None = None,
                 lane_count: LaneCount | None = None) -> None:
        self.name = name
        self.slot = slot
        self.cells = _SCRATCH_CELLS if cells is None else cells  # the slot's nonempty cell
        # the shard's lanes, counted as this queue makes and drops them (while split)
        self.lane_count = _SCRATCH_LANES if lane_count is None else lane_count
        self._dq: deque[Job] = deque()
        self.live = 0  # jobs queued (live entries)
        self.stale = 0  # entries whose job left the queue
        self.ctime_ms = now_ms
        self.atime_ms = now_ms  # last enqueue or dequeue (QSTAT idle, eviction)
        self.jobs_in = 0
        self.jobs_out = 0
        self.paused = 0  # PAUSED_IN | PAUSED_OUT bits
        # token -> blocked GETJOB waiting on this queue, oldest first; None when empty
        self.waiters: dict[int, Any] | None = None
        self.scan_idx = -1  # position in the shard's QSCAN table
        self.awake_ms = 0  # timer bucket (eviction check), 0 = none
        # Groups: while ``lanes`` is None every entry of ``_dq`` is of group ``group0``.
        self.group0 = b""
        self.lanes: dict[bytes, Lane] | None = None  # group -> lane, 2 or more
        self.ring: deque[Lane] | None = None  # the lanes in serving order
        self.groups_live = 0  # lanes with queued jobs (while split)
        self.order: GroupOrder | None = None  # the lanes by head, tail, count (while split)
        # jobs whose (stale) entry here is not theirs any more: moved to another queue
        self.ghosts: set[Job] | None = None
        # Priorities: None until a job with a PRIORITY above 0 arrives; then one
        # ``Level`` per priority in use (index = priority) holds the entries, and the
        # fields above (deque, lanes, ghosts, stale) are unused; ``live`` is the total.
        self.tiers: list[Level | None] | None = None
        self.priority = 0  # of every job with an entry here: 0, or a Level's own

    def __len__(self) -> int:
        return self.live

    def push(self, job: Job) -> None:
        """Insert a job whose state the caller has just set to QUEUED."""
        if (job.ext is not None or self.group0 or self.lanes is not None
                or self.tiers is not None) and self._push_ext(job):
            return
        self.live += 1
        if self.live == 1:
            self.cells.inc(self.slot)
        if job.in_deque() or (self.ghosts and self._unghost(job)):
            self.stale -= 1  # revive the stale entry: it is already in ctime position
            return
        job.mark_in_deque()
        _insert(self._dq, job)

    def _unghost(self, job: Job) -> bool:
        """The job comes back to a queue where it left a ghost: the entry is its own
        again (in ctime position, as a stale entry is); False when it left none."""
        ghosts = self.ghosts
        if not ghosts or job not in ghosts:
            return False
        ghosts.discard(job)
        job.mark_in_deque()
        return True

    def pop(self) -> Job | None:
        """Remove and return the oldest queued job (its state is still QUEUED); of
        the next group in rotation when the queue holds several."""
        if self.lanes is not None:
            return self._pop_lane()
        dq = self._dq
        while dq:
            job = dq.popleft()
            if job.state == QUEUED and not (self.ghosts and job in self.ghosts):
                job.unmark_in_deque()
                self.live -= 1
                if not self.live:
                    self.cells.dec(self.slot)
                return job
            forget_entry(job, self.ghosts)
            self.stale -= 1
        return None if self.tiers is None else self._pop_tier()

    def remove(self, job: Job) -> None:
        """The caller is moving a QUEUED job out of this queue (its entry goes stale)."""
        self.live -= 1
        if not self.live:
            self.cells.dec(self.slot)
        tiers = self.tiers
        if tiers is not None:
            _level(tiers, job).remove(job)
            return
        self.stale += 1
        if self.lanes is not None and self.order is not None:
            lane = self.lanes[group_of(job)]
            lane.live -= 1
            lane.stale += 1
            self.order.changed(lane)
            if not lane.live:
                self.groups_live -= 1
        if self.stale > stale_entries_purge_min and self.stale > self.live:
            self._purge()

    def detach(self, job: Job) -> None:
        """A job whose entry here is stale moves to another queue (dead letter,
        REDRIVE): its entry stays as a ghost, O(1) (else pushing the job there would
        revive it here). It still counts as stale, in the lane of the job's group
        when the queue is split, and goes with the purge, the pop that reaches it
        or its lane; the job coming back here revives it."""
        tiers = self.tiers
        if tiers is not None:
            _level(tiers, job).detach(job)
            return
        job.unmark_in_deque()
        if self.ghosts is None:
            self.ghosts = set()
        self.ghosts.add(job)

    def _purge(self) -> None:
        if self.lanes is not None:
            self._purge_lanes()
            return
        self._dq = queued_only(self._dq, self.ghosts)
        self.stale = 0
        self.ghosts = None

    def drop_all(self) -> None:
        """Forget every entry (queue evicted or flushed): clear deque membership. The
        queue object leaves its table: its slot's generation moves on."""
        if self.live:
            self.cells.dec(self.slot)
        self.cells.bump(self.slot)
        if self.tiers is not None:
            for tier in self.tiers:
                if tier is not None:
                    tier.drop_all()
            self.tiers = None
        for job in self._dq:
            forget_entry(job, self.ghosts)
        self._dq.clear()
        if self.lanes is not None:
            for lane in self.lanes.values():
                lane.clear(self.ghosts)
            self._unsplit(None)
        self.group0 = b""
        self.live = 0
        self.stale = 0
        self.ghosts = None

    # ---- priorities

    def _push_ext(self, job: Job) -> bool:
        """push's path for a job with extension fields or a queue that is not plain:
        True when the job went to a lane or a level, False when push goes on."""
        if self.tiers is None and not priority_of(job):
            return self._push_grouped(job)
        tiers = self.tiers
        if tiers is None:
            tiers = self._tier()
        p = priority_of(job)
        level = tiers[p]
        if level is None:
            level = tiers[p] = Level(p, self)
        level.push(job)
        self.live += 1
        if self.live == 1:
            self.cells.inc(self.slot)
        return True

    def _tier(self) -> list[Level | None]:
        """A first job with a priority above 0: the entries held so far become
        level 0 (O(1): the deque or the lanes change hands)."""
        tiers: list[Level | None] = [None] * (priority_max + 1)
        if self._dq or self.lanes is not None:
            base = tiers[0] = Level(0, self)
            self._hand_over(base)
        self.group0 = b""  # an empty deque's label: the next group-0 job sets level 0's
        self.tiers = tiers
        return tiers

    def _pop_tier(self) -> Job | None:
        """pop for a queue with levels: the highest level with a queued job; a level
        left without one goes (its stale entries with it), and when level 0 alone
        is left its entries come back to the queue's own deque or lanes."""
        tiers = self.tiers
        if tiers is None:
            return None
        got: Job | None = None
        for p in range(priority_max, -1, -1):
            level = tiers[p]
            if level is None:
                continue
            if level.live:
                got = level.pop()
            if not level.live:
                level.drop_all()
                tiers[p] = None
            if got is not None:
                break
        if got is not None:
            self.live -= 1
            if not self.live:
                self.cells.dec(self.slot)
        if not _above_zero(tiers):
            self.tiers = None
            if tiers[0] is not None:
                tiers[0]._hand_over(self)
        return got

    def _hand_over(self, dst: Queue) -> None:
        """Move this object's entries (deque or lanes, ghosts, counts) to ``dst``,
        whose own are empty: O(1). ``live`` stays too (a queue counts its levels')."""
        dst._dq, self._dq = self._dq, deque()
        dst.group0, self.group0 = self.group0, b""
        dst.lanes, self.lanes = self.lanes, None
        dst.ring, self.ring = self.ring, None
        dst.order, self.order = self.order, None
        dst.groups_live, self.groups_live = self.groups_live, 0
        dst.ghosts, self.ghosts = self.ghosts, None
        dst.stale, self.stale = self.stale, 0
        dst.live = self.live

    def priority_counts(self) -> list[tuple[int, int]]:
        """(priority, queued jobs) of each level with queued jobs, highest first;
        empty while no job above priority 0 is queued (QSTAT ``priorities``)."""
        tiers = self.tiers
        if tiers is None:
            return []
        out: list[tuple[int, int]] = []
        for p in range(priority_max, -1, -1):
            level = tiers[p]
            if level is not None and level.live:
                out.append((p, level.live))
        return out if out and out[0][0] else []

    def lanes_held(self) -> int:
        """The lanes of this queue's groups, over its levels (the core's check)."""
        if self.tiers is not None:
            return sum(level.lanes_held() for level in self.tiers if level is not None)
        return 0 if self.lanes is None else len(self.lanes)

    def _levels(self) -> list[Level]:
        return [] if self.tiers is None else [x for x in self.tiers if x is not None]

    # ---- groups

    def _push_grouped(self, job: Job) -> bool:
        """push's path for a grouped job or a queue that is not plain: True when
        the job went to a lane, False when push goes on with the single deque."""
        group = group_of(job)
        if self.lanes is None:
            if group == self.group0:
                return False
            if not self._dq:
                self.group0 = group  # empty: the deque takes the new group's label
                return False
            self._split()
        lanes = self.lanes
        ring = self.ring
        order = self.order
        if lanes is None or ring is None or order is None:
            raise InvariantError(f"queue {self.name!r}: lanes without a ring")
        lane = lanes.get(group)
        if lane is None:
            lane = order.new_lane(group, deque(), 0, 0)
            ring.append(lane)
        was = lane.live
        if not was:
            self.groups_live += 1
        lane.live = was + 1
        order.changed(lane)
        self.live += 1
        if self.live == 1:
            self.cells.inc(self.slot)
        if job.in_deque() or (self.ghosts and self._unghost(job)):
            lane.stale -= 1  # revive the stale entry, as push does
            self.stale -= 1
        else:
            job.mark_in_deque()
            _insert(lane.dq, job)
        dq = lane.dq
        if not was or dq[0] is job:
            order.head_moved(lane)
        if not was or dq[-1] is job:
            order.tail_moved(lane)
        return True

    def _split(self) -> None:
        """A second group arrives: the deque becomes the first lane of the ring."""
        self.lanes = {}
        self.order = GroupOrder(self.lanes, self.lane_count)
        first = self.order.new_lane(self.group0, self._dq, self.live, self.stale)
        self.ring = deque((first,))
        self.groups_live = 1 if self.live else 0
        self._dq = deque()
        self.group0 = b""

    def _unsplit(self, last: Lane | None) -> None:
        """One lane (or none) is left: back to the single deque."""
        if self.order is not None:
            self.order.dissolve()
        if last is None:
            self._dq = deque()
            self.group0 = b""
        else:
            self._dq = last.dq
            self.group0 = last.group
        self.lanes = None
        self.ring = None
        self.order = None
        self.groups_live = 0

    def _pop_lane(self) -> Job | None:
        lanes = self.lanes
        ring = self.ring
        order = self.order
        if lanes is None or ring is None or order is None:
            raise InvariantError(f"queue {self.name!r}: lanes without a ring")
        while ring:
            lane = ring.popleft()
            job, skipped = lane.take(self.ghosts)
            self.stale -= skipped
            if job is not None:
                order.changed(lane)
                self.live -= 1
                if not self.live:
                    self.cells.dec(self.slot)
                if lane.live:
                    ring.append(lane)
                    return job
                self.groups_live -= 1
            self.stale -= lane.stale  # the lane goes with its stale entries
            lane.clear(self.ghosts)
            order.drop(lane)
            if len(lanes) <= 1:
                self._unsplit(ring[0] if ring else None)
                return job if job is not None else self.pop()
            if job is not None:
                return job
        return None

    def _purge_lanes(self) -> None:
        lanes = self.lanes
        ring = self.ring
        order = self.order
        if lanes is None or ring is None or order is None:
            raise InvariantError(f"queue {self.name!r}: lanes without a ring")
        kept: deque[Lane] = deque()
        for lane in ring:
            if lane.live:
                lane.dq = queued_only(lane.dq, self.ghosts)
                lane.stale = 0
                kept.append(lane)
            else:
                lane.clear(self.ghosts)
                order.drop(lane)
        self.stale = 0
        self.ghosts = None
        self.ring = kept
        if len(lanes) <= 1:
            self._unsplit(kept[0] if kept else None)

    def has_named_groups(self) -> bool:
        """The queue holds jobs added with GROUP (QSTAT then shows ``groups``)."""
        if self.tiers is not None:
            return any(level.has_named_groups() for level in self._levels())
        return self.lanes is not None or bool(self.group0)

    def groups(self) -> int:
        """How many groups have queued jobs (QSTAT groups); with priorities, a group
        counts once per priority it has queued jobs at (each is a lane of its own)."""
        if self.tiers is not None:
            return sum(level.groups() for level in self._levels())
        if self.lanes is None:
            return 1 if self.live else 0
        return self.groups_live

    def largest_groups(self, count: int) -> list[tuple[bytes, int]]:
        """Up to ``count`` (group, queued jobs) of the groups with queued jobs,
        largest first, ties by name (QGROUPS): O(count log groups); with priorities,
        summed over the levels (O(lanes))."""
        if self.tiers is not None:
            return _summed_groups(self._levels(), count)
        if self.order is None:
            return [(self.group0, self.live)] if self.live and count > 0 else []
        return self.order.largest(count)

    def adds_group(self, group: bytes) -> bool:
        """A job of ``group`` queued here would be a group more (queue-groups-max)."""
        if self.tiers is not None:
            return all(level.adds_group(group) for level in self._levels())
        if self.lanes is None:
            return bool(self.live) and group != self.group0
        lane = self.lanes.get(group)
        return lane is None or not lane.live

    def _entries(self) -> list[deque[Job]]:
        if self.lanes is None:
            return [self._dq]
        return [lane.dq for lane in self.lanes.values()]

    def _first_lanes(self, count: int, tail: bool) -> list[deque[Job]]:
        """The deques of the ``count`` lanes whose oldest (``tail``: newest) jobs
        come first: a read of ``count`` jobs merges no other lane."""
        if self.order is None:
            return self._entries()
        lanes, dropped = self.order.first_lanes(count, self.ghosts, tail)
        self.stale -= dropped
        return [lane.dq for lane in lanes]

    def oldest(self, count: int) -> list[Job]:
        """The ``count`` oldest queued jobs (the stale entries ahead of the first
        live one are dropped on the way, as pop would)."""
        out: list[Job] = []
        if count <= 0:
            return out
        if self.tiers is not None:
            return list(islice(heapq.merge(*(level.oldest(count) for level in self._levels()),
                                           key=_ctime), count))
        ghosts = self.ghosts
        if self.lanes is None:
            self.stale -= trim_head(self._dq, ghosts)
        entries: Iterable[Job] = self._dq if self.lanes is None else heapq.merge(
            *self._first_lanes(count, False), key=_ctime)
        for job in entries:
            if live_entry(job, ghosts):
                out.append(job)
                if len(out) >= count:
                    break
        return out

    def newest(self, count: int) -> list[Job]:
        out: list[Job] = []
        if count <= 0:
            return out
        if self.tiers is not None:
            return list(islice(heapq.merge(*(level.newest(count) for level in self._levels()),
                                           key=_ctime, reverse=True), count))
        entries: Iterable[Job] = reversed(self._dq) if self.lanes is None else heapq.merge(
            *(reversed(dq) for dq in self._first_lanes(count, True)), key=_ctime,
            reverse=True)
        ghosts = self.ghosts
        for job in entries:
            if live_entry(job, ghosts):
                out.append(job)
                if len(out) >= count:
                    break
        return out

    def __iter__(self) -> Iterator[Job]:
        if self.tiers is not None:
            return (job for level in self._levels() for job in level)
        ghosts = self.ghosts
        return (job for dq in self._entries() for job in dq if live_entry(job, ghosts))

    def check(self) -> str | None:
        """Describe a broken invariant of this queue, or None (tests, invariant())."""
        if self.tiers is not None:
            return self._check_tiers(self.tiers)
        seen: set[int] = set()
        err = self._check_entries(seen)
        if err is None and self.ghosts and not {id(job) for job in self.ghosts} <= seen:
            err = f"queue {self.name!r}: a ghost without an entry"
        return err

    def _check_tiers(self, tiers: list[Level | None]) -> str | None:
        """A queue with levels: its own entries handed over, each level holding the
        jobs of its priority only (``_check_deque``), the levels' counts summed, a
        level above 0 present (else the queue would have handed back to level 0)."""
        if self._dq or self.lanes is not None or self.stale or self.ghosts or self.group0:
            return f"queue {self.name!r} has levels and entries of its own"
        if len(tiers) != priority_max + 1 or not _above_zero(tiers):
            return f"queue {self.name!r} has levels but none above priority 0"
        live = 0
        for p, level in enumerate(tiers):
            if level is None:
                continue
            if level.priority != p or level.tiers is not None or level.name != self.name:
                return f"queue {self.name!r}: level {level.priority} at priority {p}"
            err = level.check()
            if err is not None:
                return err
            live += level.live
        if live != self.live:
            return f"queue {self.name!r} levels hold {live} jobs, live={self.live}"
        return None

    def _check_entries(self, seen: set[int]) -> str | None:
        if self.lanes is None:
            return self._check_deque(self._dq, self.group0, self.live, self.stale, seen)
        err = self._check_lanes()
        if err is not None:
            return err
        live = stale = groups_live = 0
        for group, lane in self.lanes.items():
            if lane.group != group:
                return f"queue {self.name!r}: lane {lane.group!r} under {group!r}"
            err = self._check_deque(lane.dq, group, lane.live, lane.stale, seen)
            if err is not None:
                return err
            live += lane.live
            stale += lane.stale
            groups_live += 1 if lane.live else 0
        if live != self.live or stale != self.stale or groups_live != self.groups_live:
            return (f"queue {self.name!r} lane totals live={self.live}/{live} "
                    f"stale={self.stale}/{stale} groups={self.groups_live}/{groups_live}")
        return None

    def _check_lanes(self) -> str | None:
        """A split queue: two lanes or more, each once in the ring, the deque unused."""
        lanes = self.lanes
        ring = self.ring
        if lanes is None or ring is None:
            return f"queue {self.name!r} has lanes but no ring"
        if len(lanes) < 2:
            return f"queue {self.name!r} split with {len(lanes)} lane(s)"
        if self._dq:
            return f"queue {self.name!r} split but its single deque holds jobs"
        if len(ring) != len(lanes) or {id(x) for x in ring} != {id(x) for x in lanes.values()}:
            return f"queue {self.name!r} ring and lanes differ"
        if self.order is None or self.order.lanes is not lanes:
            return f"queue {self.name!r} split without its group order"
        return self.order.check()

    def _check_deque(self, dq: deque[Job], group: bytes, live_count: int,
                     stale_count: int, seen: set[int]) -> str | None:
        live = 0
        prev = -1
        ghosts = self.ghosts or set()
        for job in dq:
            if id(job) in seen:
                return f"job {job.id} twice in queue {self.name!r}"
            seen.add(id(job))
            ghost = job in ghosts
            if not ghost and not job.in_deque():
                return f"job {job.id} in deque without FLAG_IN_DEQUE"
            if ghost and job.queue == self.name and job.state == QUEUED:
                return f"job {job.id} queued in {self.name!r} behind its own ghost"
            if job.ctime_us < prev:
                return f"queue {self.name!r} out of ctime order at {job.id}"
            if group_of(job) != group:
                return f"job {job.id} of group {group_of(job)!r} in lane {group!r}"
            if priority_of(job) != self.priority:  # GETJOB's order: highest first
                return f"job {job.id} of priority {priority_of(job)} at level {self.priority}"
            prev = job.ctime_us
            if live_entry(job, ghosts):
                if job.queue != self.name:
                    return f"job {job.id} of {job.queue!r} queued in {self.name!r}"
                live += 1
        if live != live_count or len(dq) - live != stale_count:
            return f"queue {self.name!r} counts live={live_count}/{live} stale={stale_count}"
        return None


class Level(Queue):
    """The jobs of one priority in a queue that holds several (``Queue.tiers``): the
    same ctime-ordered deque with lazy deletion, split into lanes by GROUP, as a
    queue's own. Its counters other than the entries' are unused; it publishes
    nothing (``Unpublished``: the queue's ``live`` counts for the slot's cell)."""

    __slots__ = ()

    def __init__(self, priority: int, queue: Queue) -> None:
        super().__init__(queue.name, queue.slot, queue.ctime_ms, _LEVEL_CELLS, queue.lane_count)
        self.priority = priority

    def _push_ext(self, job: Job) -> bool:
        return self._push_grouped(job)  # a level holds one priority: no levels inside


def _level(tiers: list[Level | None], job: Job) -> Level:
    level = tiers[priority_of(job)]
    if level is None:
        raise InvariantError(f"job {job.id}: no level {priority_of(job)} in its queue")
    return level


def _above_zero(tiers: list[Level | None]) -> bool:
    """A level above priority 0 is there (with queued jobs or stale entries only:
    a level's truth is its ``live``, so ``any`` would not do)."""
    for level in tiers[1:]:
        if level is not None:
            return True
    return False


def _summed_groups(levels: list[Level], count: int) -> list[tuple[bytes, int]]:
    """QGROUPS over the levels of a queue: each group's queued jobs summed."""
    total: dict[bytes, int] = {}
    for level in levels:
        for group, n in level.largest_groups(level.groups()):
            total[group] = total.get(group, 0) + n
    return sorted(total.items(), key=lambda x: (-x[1], x[0]))[:max(count, 0)]


# Federation: a source forgets a node as a recent provider after this long
# without jobs from it.
responders_ttl_ms = 10_000


class Fed(Timed):
    """Federation state of one queue: recent sources, NEEDJOBS backoff, import rate."""

    __slots__ = ("queue", "responders", "adhoc_ms", "adhoc_attempt", "bcast_ms",
                 "bcast_attempt", "rate_sec", "rate_now", "rate_prev")

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.responders: dict[str, int] = {}  # node -> last time it sent us jobs (ms)
        self.adhoc_ms = 0
        self.adhoc_attempt = 0
        self.bcast_ms = 0
        self.bcast_attempt = 0
        self.rate_sec = 0  # second the rate_now counter is about
        self.rate_now = 0  # jobs imported during rate_sec
        self.rate_prev = 0  # jobs imported during the second before
        self.awake_ms = 0  # timer bucket (shard heap)

    def import_rate(self, now_ms: int) -> int:
        sec = now_ms // 1000
        if sec == self.rate_sec:
            return max(self.rate_now, self.rate_prev)
        if sec == self.rate_sec + 1:
            return self.rate_now
        return 0

    def count_import(self, n: int, now_ms: int) -> None:
        sec = now_ms // 1000
        if sec != self.rate_sec:
            self.rate_prev = self.rate_now if sec == self.rate_sec + 1 else 0
            self.rate_now = 0
            self.rate_sec = sec
        self.rate_now += n

    def expire(self, now_ms: int) -> None:
        if self.responders:
            old = [n for n, t in self.responders.items() if now_ms - t > responders_ttl_ms]
            for n in old:
                del self.responders[n]
