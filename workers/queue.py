"""A named queue: jobs ordered by creation time, plus the queue's bookkeeping;
and ``Fed``, the queue's federation state (recent sources, NEEDJOBS backoff,
import rate) that workers/federation.py keeps for queues with consumers.

Structure: one ``collections.deque`` of job records sorted by ``ctime_us``
(unique per creating node; ties keep arrival order), with lazy deletion.

- The common case is an append of a job newer than the tail (ADDJOB on this
  node): ``deque.append``, O(1), 8 bytes per job.
- Pop-oldest (GETJOB) is ``popleft``, O(1).
- Re-queued jobs are usually older than everything queued: ``appendleft``;
  otherwise a bisection by ctime and ``deque.insert`` (O(n), rare).
- Remove-by-job (DEQUEUE, ACKJOB, TTL, DELJOB of a queued job) only changes the
  job's state and a counter: the record stays in the deque as a *stale* entry,
  skipped by pop and peek. A stale entry sits exactly where the job would be
  inserted again (ctime never changes), so re-queueing a job that still has
  one revives it in place. Stale entries are purged when they outnumber the
  live ones (amortised O(1) per removal).

A job is a live entry iff ``job.state == QUEUED``; ``FLAG_IN_DEQUE`` says the
record is physically in the deque. Compared (bench/test_micro.py: test_queue_* against test_baseline_*)
with a heap with lazy deletion and with sortedcontainers: the deque is the
fastest on append/pop and the smallest (a heap entry needs a tuple, ~70
bytes per job; a SortedKeyList ~2 list slots plus a key per job).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Iterator
from typing import Any, Final

from workers.job import QUEUED, Job, Timed

# Purge stale entries once there are more than this many and more than live ones:
# small queues never pay for a purge, big ones pay O(n) only after n removals.
stale_entries_purge_min = 64

PAUSED_IN: Final = 1
PAUSED_OUT: Final = 2
PAUSE_NAMES = ("none", "in", "out", "all")


def _ctime(job: Job) -> int:
    return job.ctime_us


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
    )

    def __init__(self, name: bytes, slot: int, now_ms: int) -> None:
        self.name = name
        self.slot = slot
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

    def __len__(self) -> int:
        return self.live

    def push(self, job: Job) -> None:
        """Insert a job whose state the caller has just set to QUEUED."""
        self.live += 1
        if job.in_deque():
            self.stale -= 1  # revive the stale entry: it is already in ctime position
            return
        job.mark_in_deque()
        dq = self._dq
        if not dq or dq[-1].ctime_us <= job.ctime_us:
            dq.append(job)
        elif dq[0].ctime_us > job.ctime_us:
            dq.appendleft(job)
        else:
            dq.insert(bisect_right(dq, job.ctime_us, key=_ctime), job)

    def pop(self) -> Job | None:
        """Remove and return the oldest queued job (its state is still QUEUED)."""
        dq = self._dq
        while dq:
            job = dq.popleft()
            job.unmark_in_deque()
            if job.state == QUEUED:
                self.live -= 1
                return job
            self.stale -= 1
        return None

    def remove(self, job: Job) -> None:
        """The caller is moving a QUEUED job out of this queue (its entry goes stale)."""
        self.live -= 1
        self.stale += 1
        if self.stale > stale_entries_purge_min and self.stale > self.live:
            self._purge()

    def detach(self, job: Job) -> None:
        """A job whose entry here is stale moves to another queue (dead letter,
        REDRIVE): drop the entry, else pushing it there would revive it here.
        O(the entry's position): REDRIVE takes the oldest, near the front."""
        self._dq.remove(job)
        job.unmark_in_deque()
        self.stale -= 1

    def _purge(self) -> None:
        keep: deque[Job] = deque()
        for job in self._dq:
            if job.state == QUEUED:
                keep.append(job)
            else:
                job.unmark_in_deque()
        self._dq = keep
        self.stale = 0

    def drop_all(self) -> None:
        """Forget every entry (queue evicted or flushed): clear deque membership."""
        for job in self._dq:
            job.unmark_in_deque()
        self._dq.clear()
        self.live = 0
        self.stale = 0

    def oldest(self, count: int) -> list[Job]:
        out: list[Job] = []
        if count <= 0:
            return out
        for job in self._dq:
            if job.state == QUEUED:
                out.append(job)
                if len(out) >= count:
                    break
        return out

    def newest(self, count: int) -> list[Job]:
        out: list[Job] = []
        if count <= 0:
            return out
        for job in reversed(self._dq):
            if job.state == QUEUED:
                out.append(job)
                if len(out) >= count:
                    break
        return out

    def __iter__(self) -> Iterator[Job]:
        return (job for job in self._dq if job.state == QUEUED)

    def check(self) -> str | None:
        """Describe a broken invariant of this queue, or None (tests, invariant())."""
        live = 0
        prev = -1
        seen: set[int] = set()
        for job in self._dq:
            if id(job) in seen:
                return f"job {job.id} twice in queue {self.name!r}"
            seen.add(id(job))
            if not job.in_deque():
                return f"job {job.id} in deque without FLAG_IN_DEQUE"
            if job.ctime_us < prev:
                return f"queue {self.name!r} out of ctime order at {job.id}"
            prev = job.ctime_us
            if job.state == QUEUED:
                if job.queue != self.name:
                    return f"job {job.id} of {job.queue!r} queued in {self.name!r}"
                live += 1
        if live != self.live or len(self._dq) - live != self.stale:
            return f"queue {self.name!r} counts live={self.live}/{live} stale={self.stale}"
        return None


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
