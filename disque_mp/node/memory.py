"""Memory accounting and the maxmemory levels (spec: "What happens when a node
runs out of memory?"; docs/memory.md has the measurements behind the numbers).

Used memory is an estimate of the live data, not RSS: CPython rarely gives
memory back to the OS after frees (pymalloc arenas, glibc heap), so an RSS
basis would never lift a level again, and the interpreter's own ~30 MB per
worker is not data an eviction or a refusal can change. Per worker:

    used = jobs * job_overhead_bytes + sum(len(body) + extension fields)
           + queues * queue_overhead_bytes + lanes * lane_overhead_bytes

(the shard keeps the sum of the bodies and of the extension fields' estimate in
``body_bytes``, and counts its jobs, queues and lanes (one per group of a queue
holding several) as they come and go: a sample reads four integers, whatever
the number of queues). ``maxmemory`` is a budget for
the whole node: every worker samples its own figure each period and, when it
changed, tells it to the other workers over the mesh (``local_op("memory")``,
answered with theirs), so each worker sees the node total at most one sample
period (plus a mesh round trip) old and all of them agree on the level. A figure
that did not change is not sent again: an idle node exchanges nothing, and a
quiet monitor (``Monitor.quiet``) stops sampling while its worker is idle
(``Worker.on_tick``) until something runs there again (``Worker.on_wake``):

    level 0  below 75 %
    level 1  >= 75 %: ADDJOB replicates to other nodes only (shard.set_memory_level)
    level 2  >= 95 %: evict what breaks no guarantee (workers/evict.py), each tick
    level 3  >= 100 %: commands flagged ``denyoom`` answer ERR_OOM

Why node-wide and not maxmemory / workers: one busy queue lives on one worker,
so a per-worker split would refuse jobs at 1/N of the budget.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from bus import mesh as meshmod
from bus.clock import wall_ms
from bus.mesh import unpack
from disque_mp.node.log import VERBOSE
from workers.evict import EvictCursor, evict_step

if TYPE_CHECKING:
    from disque_mp.node.view import MemoryHost

log = logging.getLogger("disque_mp.node.memory")

# Measured with tracemalloc (docs/memory.md): a registered job costs about 370
# bytes beyond its body in the compiled build and 430 in plain Python (record, ID
# string, ints, table/timer/deque slots, the body object's header); the estimate
# sits between them, within 5 % below and 15 % above either.
job_overhead_bytes = 415
# An empty queue: record, deque with its first block, dict and scan-table slots (~1045 B).
queue_overhead_bytes = 1100
# A lane: one group's deque in a queue that holds several groups (workers/queue.py):
# the Lane record, its deque with its first block, the lanes dict, ring and dirty
# list slots, its rank and its key in the group order's heads (workers/lanes.py
# GroupOrder): 990 B measured with tracemalloc, 20,000 distinct groups (a QPEEK
# with a negative count adds a tails key, ~105 B, a QGROUPS the buckets' ~64 B;
# docs/memory.md). A job's own extension fields (GROUP, DEDUP, dead-letter reason)
# are counted with its body (workers/job.py ``ext_mem_bytes``).
lane_overhead_bytes = 1000

# Give freed heap back to the OS (glibc malloc_trim) once this worker's data shrank
# by this much since its high mark and then held still for a sample (a drain or an
# eviction is over): measured, 10k 20 KB bodies freed left RSS at 211 MB, a trim
# brought it to 25 MB in ~15 ms; small objects (pymalloc arenas) are not helped.
# At most once per trim_interval_ms: a trim stalls the loop for ~2-15 ms.
trim_drop_bytes = 16 << 20
trim_interval_ms = 1_000

LEVEL_WARN, LEVEL_EVICT, LEVEL_OOM = 1, 2, 3
warn_percent = 75
evict_percent = 95

# Sample period: the level follows memory within this (plus one mesh round trip
# for the peers' figures); also the overshoot window of a fast producer at 100 %.
sample_ms = 100
# Within near_percent points below the next threshold, sample this often: a fast
# producer crosses a threshold by less (the extra mesh requests only happen there).
sample_near_ms = 20
near_percent = 5
# Eviction at level 2 runs in passes of evict_visit_jobs_max jobs (~1-10 ms each:
# ~1 us per job visited, ~5-10 us per job evicted) for this share of the sample
# period (20 ms of 100, 4 ms of 20): one loop stall stays short, and eviction takes
# about a fifth of the worker while it lasts (~20k-40k jobs/s, docs/memory.md).
evict_duty = 0.2
evict_passes_per_sample_max = 64  # backstop if the clock misbehaves
# After a whole cycle over the shard found nothing to evict, rest this long
# before scanning again: a node full of queued jobs must not burn a core looking.
evict_rest_ms = 1000


def _load_malloc_trim() -> Any:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None


_malloc_trim = _load_malloc_trim()
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """This process's resident set size (bytes; 0 where /proc cannot tell)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return 0


def level_of(used: int, maxmemory: int) -> int:
    """The memory warning level of ``used`` bytes against ``maxmemory`` (0 = no limit)."""
    if maxmemory <= 0:
        return 0
    if used > maxmemory:
        return LEVEL_OOM  # Redis refuses when used memory > maxmemory
    if used * 100 >= maxmemory * evict_percent:
        return LEVEL_EVICT
    if used * 100 >= maxmemory * warn_percent:
        return LEVEL_WARN
    return 0


def near_threshold(used: int, maxmemory: int) -> bool:
    """True when ``used`` is within ``near_percent`` points below 75, 95 or 100 %."""
    if maxmemory <= 0:
        return False
    pct = used * 100 / maxmemory
    if warn_percent - near_percent <= pct < warn_percent:
        return True
    return evict_percent - near_percent <= pct <= 100  # level 3 starts above 100 %


def shard_used_bytes(jobs: int, body_bytes: int, queues: int) -> int:
    return jobs * job_overhead_bytes + body_bytes + queues * queue_overhead_bytes


def human(n: int) -> str:
    """Redis' bytesToHuman: B, K, M, G with two decimals."""
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n}B"


class Monitor:
    """One per worker: samples memory, sets the level, evicts at level 2."""

    def __init__(self, w: MemoryHost) -> None:
        self.w = w
        self.peers: dict[int, int] = {}  # worker index -> its last reported used bytes
        self.asking: set[int] = set()  # peers with a request in flight (at most one each)
        self.told: dict[int, int] = {}  # worker index -> our figure it last acknowledged
        # worker index -> when its figure in ``peers`` was read (its monotonic clock, ns:
        # one clock for the host, so it orders figures across a restart too). A figure
        # comes two ways, a worker's own telling and its answer to ours, on two mesh
        # links with no order between them: the older one must not win.
        self.peer_read_ns: dict[int, int] = {}
        self.level = 0
        self.used = 0  # node total at the last sample
        self.peak = 0
        self.evicted_jobs = 0
        self.evicted_queues = 0
        self.cursor = EvictCursor()
        self.cycle_evicted = 0  # evicted since the job cursor last wrapped
        self.rest_until_ms = 0
        self.handle: Any = None
        self.period_ms = sample_ms  # until the next sample
        self.trim_high = 0  # local used since the last trim, highest
        self.trim_at_ms = 0
        self.last_local = 0

    def start(self) -> None:
        self.sample()

    def close(self) -> None:
        self.sleep()

    def sleep(self) -> None:
        """No more samples until ``wake`` (its worker is idle: ``quiet`` said so)."""
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def wake(self) -> None:
        """Its worker runs again: sample at the loop's next turn, then each period
        (no-op while sampling). Never inline: a sample's eviction drains effects,
        and a drain may wake its worker (``Worker.on_wake``) again."""
        if self.handle is None:
            self.handle = self.w.loop.call_soon(self.sample)

    def quiet(self) -> bool:
        """Nothing for the samples to do while nothing runs: level 0, not near a
        threshold, every other worker has our current figure, no request in flight."""
        if self.level or self.asking or near_threshold(self.used, self.w.cfg.maxmemory):
            return False
        local = self.local_used()
        return all(self.told.get(j) == local for j in range(self.w.workers) if j != self.w.index)

    def exchange(self, arg: Any) -> list[int]:
        """Another worker's figure, told as ``[index, read_ns, used]`` (its sample
        found it changed): kept for our total; the answer is our own, ``[read_ns, used]``."""
        if isinstance(arg, list) and len(arg) == 3 and all(type(x) is int for x in arg) \
                and 0 <= arg[0] < self.w.workers and arg[0] != self.w.index:
            self._keep(arg[0], arg[1], arg[2])
        return [time.monotonic_ns(), self.local_used()]

    def _keep(self, j: int, read_ns: int, used: int) -> None:
        if read_ns >= self.peer_read_ns.get(j, 0):
            self.peer_read_ns[j] = read_ns
            self.peers[j] = used

    def local_used(self) -> int:
        """This worker's estimate: O(1), from the counts the shard keeps."""
        c = self.w.shard.core
        return (shard_used_bytes(c.job_count(), c.body_bytes_held(), c.queue_count())
                + c.lane_count() * lane_overhead_bytes + self.w.shard.extra_bytes)

    def sample(self) -> None:
        try:
            self._tell_peers()
            self.update()
        finally:  # an error is logged by the loop; the limits must keep working
            near = near_threshold(self.used, self.w.cfg.maxmemory)
            self.period_ms = sample_near_ms if near else sample_ms
            if self.handle is not None:  # the one that ran this sample, or a wake's meanwhile
                self.handle.cancel()
            self.handle = self.w.loop.call_later(self.period_ms / 1000, self.sample)

    def update(self) -> None:
        """Recompute the node total and the level; evict while at level 2 or more."""
        used = self._total()
        level = self._set_level(used)
        now = wall_ms()
        t0 = time.perf_counter()
        budget_s = self.period_ms * evict_duty / 1000
        passes = 0
        while level >= LEVEL_EVICT and passes < evict_passes_per_sample_max:
            if now < self.rest_until_ms or time.perf_counter() - t0 > budget_s:
                break
            passes += 1
            self._evict_pass(now)
            used = self._total()
            level = self._set_level(used)
        self.used = used
        self._maybe_trim(now)
        if used > self.peak:
            self.peak = used

    def flushed(self) -> None:
        """DEBUG FLUSHALL or CLUSTER RESET emptied every worker: their last figures
        are stale now, and the level must lift at once (the next sample corrects
        any job added meanwhile)."""
        for j in self.peers:
            self.peers[j] = 0
        self.update()

    def _maybe_trim(self, now: int) -> None:
        local = self.local_used()
        still, self.last_local = local == self.last_local, local
        self.trim_high = max(self.trim_high, local)
        if (not still or self.trim_high - local < trim_drop_bytes
                or now - self.trim_at_ms < trim_interval_ms):
            return
        self.trim_high = local
        self.trim_at_ms = now
        if _malloc_trim is not None:
            before = rss_bytes()
            _malloc_trim(0)
            log.log(VERBOSE, "malloc_trim after the data shrank: RSS %s -> %s", human(before),
                     human(rss_bytes()))

    def _evict_pass(self, now: int) -> None:
        jobs, queues = evict_step(self.w.shard, self.cursor, now)
        self.w.drain_effects()  # DELJOB's AOF records
        self.evicted_jobs += jobs
        self.evicted_queues += queues
        self.cycle_evicted += jobs + queues
        if self.cursor.jobs == 0:  # wrapped: a whole cycle is done
            if not self.cycle_evicted:
                self.rest_until_ms = now + evict_rest_ms
            self.cycle_evicted = 0

    def _total(self) -> int:
        return self.local_used() + sum(self.peers.values())

    def _set_level(self, used: int) -> int:
        level = level_of(used, self.w.cfg.maxmemory)
        if level != self.level:
            log.log(logging.WARNING if level > self.level else logging.INFO,
                    "Memory level %d -> %d (used %s of maxmemory %s)", self.level, level,
                    human(used), human(self.w.cfg.maxmemory))
            self.level = level
            self.w.shard.set_memory_level(level)
            self.w.oom = level >= LEVEL_OOM
        return level

    def _tell_peers(self) -> None:
        """Our figure to each other worker that does not have it yet (it changed, or
        that worker restarted or was down): its answer is its own figure."""
        w = self.w
        local = self.local_used()
        for j in range(w.workers):
            if j == w.index or j in self.asking or self.told.get(j) == local:
                continue
            self.asking.add(j)
            w.mesh.request(j, meshmod.K_SCATTER,
                           {"op": "memory", "a": [w.index, time.monotonic_ns(), local]}, (),
                           self._reply(j, local))

    def _reply(self, j: int, local: int) -> Any:
        def got(meta: dict[str, Any], bodies: list[bytes]) -> None:
            self.asking.discard(j)
            value = unpack(meta.get("v"), bodies)
            # an Error means that worker is down: keep its last figure
            if isinstance(value, list) and len(value) == 2 and all(type(x) is int for x in value):
                self._keep(j, value[0], value[1])
                self.told[j] = local

        return got

    def stats(self) -> dict[str, int]:
        """This worker's part of INFO memory (worker.local_stats)."""
        return {"used": self.local_used(), "peak": self.peak, "level": self.level,
                "evicted_jobs": self.evicted_jobs, "evicted_queues": self.evicted_queues}


def info_fields(maxmemory: int, policy: str, parts: list[Any]) -> list[tuple[str, Any]]:
    """INFO memory: the reference's fields in its order, then ours (docs/memory.md)."""
    mem = [p.get("mem") or {} for p in parts]
    used = sum(int(m.get("used", 0)) for m in mem)
    rss = sum(int(p.get("rss", 0)) for p in parts)
    peak = max([used] + [int(m.get("peak", 0)) for m in mem])
    ratio = f"{rss / used:.2f}" if used else "0.00"
    # Workers agree on the level within one sample; during a change both ends show.
    levels = [int(m.get("level", 0)) for m in mem] or [0]
    return [
        ("used_memory", used), ("used_memory_human", human(used)), ("used_memory_rss", rss),
        ("used_memory_peak", peak), ("used_memory_peak_human", human(peak)),
        ("mem_fragmentation_ratio", ratio), ("mem_allocator", "pymalloc+libc"),
        ("maxmemory", maxmemory), ("maxmemory_human", human(maxmemory)),
        ("maxmemory_policy", policy), ("memory_warning_level", max(levels)),
        ("memory_warning_level_min", min(levels)),
        ("evicted_jobs", sum(int(m.get("evicted_jobs", 0)) for m in mem)),
        ("evicted_queues", sum(int(m.get("evicted_queues", 0)) for m in mem)),
    ]  # fmt: skip
