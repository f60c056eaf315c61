"""The shard's core: the job table, the queues, the blocked GETJOBs, the timer
heap and the effects, with the moves of a job between them (register,
enqueue, dequeue, deliver, unregister). Every other part of the shard
(``workers/shard.py`` wires them) changes jobs through a ``Core``'s verbs and
asks it for facts through methods, never through its fields: ``CoreState``
holds the tables and answers the read-only questions (``view()``, a
``ClusterView``; ``now_ms()``; ``tally()``, the /metrics ``Tally`` ...),
``Core`` extends it with the moves.

Data structures
- jobs: ``job_buckets`` fixed dicts keyed by job ID; the bucket comes from two
  random characters of the ID. Fixed buckets give JSCAN a stable cursor (a
  bucket index): a job never moves, so a scan never skips one that exists for
  the whole scan.
- queues: ``dict`` name -> ``Queue`` (``workers/queue.py``) plus a QSCAN table
  (list with a free list; a queue keeps its position while it exists).
- timers: ONE heap of due times with a bucket of targets each
  (``workers/timers.py``; ``workers/lifecycle.py`` drains it).

The parts above the core that must hear of a move (federation, the ack GC,
WAITJOB) subscribe to named events (``Events`` at the end of this module, as
Dramatiq's middleware hooks: ``after_ack``, ``after_job_gone`` ...): the core
calls the subscribers of an event, never a part it knows by a back-pointer.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, Final

from workers import messages as msg
from workers.effects import QUEUED_INCR_NACKS, AofAppend, Effect, Send, Wake
from workers.ids import DEAD_PREFIX, JobIdGen, slot_of, slot_of_job_id
from workers.invariant import InvariantError, invariant
from workers.job import (
    ACKED,
    ACTIVE,
    DELETED,
    ENTRY_STATES,
    MOVES,
    QUEUED,
    STATE_NAMES,
    US_PER_MS,
    WAIT_REPL,
    Job,
    Timed,
    del_record,
    ext_mem_bytes,
    times_1000,
    union,
)
from workers.lanes import LaneCount, group_of
from workers.limit import Limit, limit_record
from workers.queue import LIMITED, PAUSE_MASK, PAUSED_OUT, Cells, Queue
from workers.replies import ERR_LEAVING, Error
from workers.timers import Timers

# A synchronous ADDJOB whose job left before enough copies were made (timeout,
# TTL, DELJOB, FLUSHALL): the reference's text.
ERR_NOREPL_TIMEOUT: Final = Error(
    "NOREPL Timeout reached before replicating to the requested number of nodes")

time_error_ms: Final = 500  # Disque's DISQUE_TIME_ERR: requeue jitter; WILLQUEUE fires this early
# The jitter's stream: x -> (x * 69069 + 1) mod 2**28 (full period; the products stay
# below 2**45, inside mypyc's inline integers).
_JITTER_BITS: Final = 28
_JITTER_MASK: Final = (1 << _JITTER_BITS) - 1
_JITTER_MUL: Final = 69069

# Disque evicts idle empty queues from its cron; the spec only says "after some time".
queue_idle_evict_ms = 30_000

job_buckets: Final = 4096  # JSCAN cursor space; power of two
_JOB_BUCKET_MASK: Final = job_buckets - 1

# Observability (/metrics, disque_mp/node/http/): histogram bounds in ms of a job's wait
# (ADDJOB to its first delivery) and processing (a delivery to its ACK); one extra
# bucket past the last bound. The shard only counts; the HTTP side exports seconds.
latency_bounds_ms: Final = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000,
                            60_000, 300_000, 900_000, 3_600_000)


_K_NACKS: Final = b"nacks"
_K_ADD_DELIV: Final = b"additional-deliveries"


# The per-job path (ADDJOB, GETJOB, ACKJOB) changes a job's state without
# ``Job.move``'s table lookup: each such move has a precondition of one
# comparison, or none, that the state table (workers/job.py) implies. Here each
# one, by the verb it is written in: the states the verb takes a job from, and the
# state it writes; checked against the table below, once, at import
# (tests/test_code_shape.py checks that no other code writes ``job.state``). Every
# other move goes through ``Job.move``, every entry through ``Job.enter``.
INLINE_MOVES: Final[dict[str, tuple[tuple[int, ...], int]]] = {
    "enqueue": ((ACTIVE,), QUEUED),  # it raises on any other state
    "deliver": ((QUEUED,), ACTIVE),  # Queue.pop returns queued jobs only
    "unregister": ((WAIT_REPL, ACTIVE, QUEUED, ACKED), DELETED),  # any registered job
}


def _check_inline_moves() -> None:
    for verb, (sources, to) in INLINE_MOVES.items():
        for src in sources:
            invariant(to in MOVES[src], f"{verb}: {STATE_NAMES[src]} -> {STATE_NAMES[to]} "
                      "is not a move of the state machine")
    invariant({s for s, tos in enumerate(MOVES) if QUEUED in tos} == {ACTIVE},
              "enqueue: only an active job may be queued")
    invariant(set(INLINE_MOVES["unregister"][0]) == {s for s in range(len(MOVES)) if s != DELETED},
              "unregister: from every registered state")
    invariant(set(ENTRY_STATES) == {WAIT_REPL, ACTIVE, ACKED}, "register: entry states")


_check_inline_moves()


def latency_bucket(ms: int) -> int:
    """The histogram bucket of ``ms``: ``bisect_left(latency_bounds_ms, ms)``, the
    number of bounds below it (one bucket past the last bound). Written as compares
    with literals, the short times first: compiled, each is one machine compare (a
    loop over the bounds unboxed each; the Final tuple is built again at each use)."""
    if ms <= 5:
        return 0
    if ms <= 10:
        return 1
    if ms <= 25:
        return 2
    if ms <= 50:
        return 3
    if ms <= 100:
        return 4
    if ms <= 250:
        return 5
    if ms <= 500:
        return 6
    if ms <= 1_000:
        return 7
    if ms <= 2_500:
        return 8
    if ms <= 5_000:
        return 9
    if ms <= 10_000:
        return 10
    if ms <= 30_000:
        return 11
    if ms <= 60_000:
        return 12
    if ms <= 300_000:
        return 13
    if ms <= 900_000:
        return 14
    if ms <= 3_600_000:
        return 15
    return 16


def job_bucket(job_id: str) -> int:
    """JSCAN bucket: two characters of the random part of the ID (deterministic)."""
    return (ord(job_id[14]) * 97 + ord(job_id[15])) & _JOB_BUCKET_MASK


class Waiter:
    """A blocked GETJOB registered on this shard."""

    __slots__ = ("token", "queues", "count", "withcounters")

    def __init__(self, token: int, queues: list[bytes], count: int, withcounters: bool) -> None:
        self.token = token
        self.queues = queues
        self.count = count
        self.withcounters = withcounters


class ReplWait:
    """A synchronous ADDJOB waiting for GOTJOBs (the job is in ``wait-repl``)."""

    __slots__ = ("token", "deadline_ms", "flexible")

    def __init__(self, token: int, deadline_ms: int, flexible: bool) -> None:
        self.token = token
        self.deadline_ms = deadline_ms  # 0 = no timeout (ms-timeout 0): until the TTL
        # REPLICATE was not given: "the cluster size when smaller" follows the
        # reachable nodes while we wait (a node found dead lowers the goal).
        self.flexible = flexible


class Stats:
    """Totals for /metrics: monotonic over the process (FLUSHALL keeps them)."""

    def __init__(self) -> None:
        self.added = 0  # jobs created by ADDJOB here
        self.delivered = 0  # jobs taken from a queue for a GETJOB
        self.acked = 0  # known jobs acknowledged by ACKJOB / FASTACK
        self.nacked = 0  # requeued by NACK
        self.requeued_retry = 0  # requeued because RETRY elapsed without an ACK
        self.requeued_enqueue = 0  # requeued by ENQUEUE
        self.expired = 0  # deleted because their TTL elapsed
        self.dead_lettered = 0  # moved to dead:<queue> (MAXDELIVER, DEADLETTER)
        self.wait_counts = [0] * (len(latency_bounds_ms) + 1)
        self.wait_sum_ms = 0
        self.proc_counts = [0] * (len(latency_bounds_ms) + 1)
        self.proc_sum_ms = 0


class ClusterView:
    """Who this node is and whom it can reach (``Core.view``): the parts read it,
    only the core's ``set_view`` / ``set_peers`` / ``set_leaving`` change it."""

    __slots__ = ("node_id", "me", "peers", "known", "reach", "unlinked", "leaving",
                 "memory_level")

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.me: tuple[str, ...] = (node_id,)
        self.peers: tuple[str, ...] = ()  # replication targets: reachable, not leaving
        self.known: tuple[str, ...] = ()  # every other known node (cluster size - 1)
        self.reach: tuple[str, ...] | None = None  # reachable nodes, leaving too (set_view)
        # reachable peers our bus link has no PONG on yet (set_view): not sent YOURJOBS
        self.unlinked: frozenset[str] = frozenset()
        self.leaving: bool = False
        self.memory_level = 0  # Core.set_memory_level: 0 ok, 1 >= 75 %, 2 >= 95 %, 3 >= 100 %

    def set_peers(self, reachable_node_ids: list[str] | tuple[str, ...]) -> None:
        self.peers = tuple(n for n in reachable_node_ids if n != self.node_id)
        self.known = self.peers
        self.reach = None

    def set_members(self, peers: Sequence[tuple[Any, ...]]) -> None:
        me = self.node_id
        self.known = tuple(p[0] for p in peers if p[0] != me)
        self.peers = tuple(p[0] for p in peers if p[1] and not p[2] and p[0] != me)
        self.unlinked = frozenset(p[0] for p in peers if p[1] and len(p) > 3 and not p[3])
        # Every reachable node, leaving or not: they still hold jobs (GLOBALQLEN, DELQUEUE).
        self.reach = tuple(p[0] for p in peers if p[1] and p[0] != me)


class Tally:
    """What /metrics counts of the jobs (``Core.tally``): the totals (``stats``),
    the delivered and not acked jobs (their count, and per queue; each job keeps
    its delivery ms), the jobs waiting for their DELAY per queue. The per-queue
    entries exist only while non-zero. The core's moves keep it; the parts read it
    and count their own moves through its verbs (``count_added`` ...), never by
    writing a field."""

    def __init__(self) -> None:
        self.stats = Stats()
        # QLIMIT (workers/limits.py): the queues with limits, by name, and those where
        # a delivery ended since the shard last served their waiters (``Core.serve_ended``)
        self.limited: dict[bytes, Limit] = {}
        self.ended: set[bytes] = set()
        self.clear()

    def clear(self) -> None:
        """FLUSHALL: no job is delivered or delayed any more (the totals stay)."""
        self.outstanding = 0  # jobs delivered and not acked (Job.dtime_ms >= 0)
        self.active: dict[bytes, int] = {}
        self.delayed: dict[bytes, int] = {}
        self.limited.clear()  # the limits go with the queues
        self.ended.clear()

    def forget_delivery(self, job: Job) -> int:
        """The job is no longer delivered-and-unacked: its delivery ms, or -1."""
        at = job.dtime_ms
        if at >= 0:
            job.dtime_ms = -1
            self.outstanding -= 1
            n = self.active.get(job.queue, 0) - 1
            if n > 0:
                self.active[job.queue] = n
            else:
                self.active.pop(job.queue, None)
            if self.limited:  # plain queues: one test, only while some queue has limits
                lim = self.limited.get(job.queue)
                if lim is not None:
                    lim.release(job)
                    self.ended.add(job.queue)
        return at

    def leave_queue(self, job: Job) -> None:
        """An active job changes queue (dead letter, redrive): what is counted per
        queue leaves the old one; a pending DELAY or NACK DELAY ends."""
        self.forget_delivery(job)
        if job.waits_delay():
            self.undelay(job)
            job.end_delay()
        job.unmark_nack_delayed()

    def observe_processing(self, job: Job, now_ms: int) -> None:
        at = self.forget_delivery(job)
        if at >= 0:
            took_ms = now_ms - at if now_ms > at else 0
            st = self.stats
            st.proc_counts[latency_bucket(took_ms)] += 1
            st.proc_sum_ms += took_ms

    # ---- the counters of the parts' moves (/metrics totals, ``stats``)

    def count_added(self) -> None:
        """A job was created by ADDJOB here."""
        self.stats.added += 1

    def count_acked(self, n: int) -> None:
        """``n`` known jobs were acknowledged (ACKJOB, FASTACK)."""
        self.stats.acked += n

    def count_expired(self) -> None:
        """A job was deleted because its TTL elapsed."""
        self.stats.expired += 1

    def count_nack(self) -> None:
        """A job was NACKed (queued again, later, or dead-lettered)."""
        self.stats.nacked += 1

    def count_retry(self) -> None:
        """A job is queued again because its RETRY elapsed without an ACK."""
        self.stats.requeued_retry += 1

    def count_enqueue(self) -> None:
        """A job was queued again by ENQUEUE."""
        self.stats.requeued_enqueue += 1

    def undo_take(self, job: Job) -> None:
        """A take given back unsent (multi-owner GETJOB): it was no delivery. The
        delivered count and the job's outstanding delivery are undone, and when that
        take was the job's only delivery, its wait in the queue (counted by it) too."""
        st = self.stats
        at = self.forget_delivery(job)
        st.delivered -= 1
        if not job.nacks and not job.additional_deliveries:
            job.unmark_delivered()  # that take was its only delivery
            if at >= 0:
                wait_ms = at - job.ctime_us // US_PER_MS
                st.wait_counts[latency_bucket(wait_ms)] -= 1
                st.wait_sum_ms -= wait_ms

    def undelay(self, job: Job) -> None:
        n = self.delayed.get(job.queue, 0) - 1
        if n > 0:
            self.delayed[job.queue] = n
        else:
            self.delayed.pop(job.queue, None)


class CoreState:
    """What the core holds: jobs, queues, waiters, wait-repl ADDJOBs, timers and
    effects, the cluster view (who may take a copy), the clock, the counters; and
    the read-only facts the parts may ask of it. How a job moves between these
    tables is ``Core``'s (below): a part asks here, and moves through a verb there."""

    def __init__(self, node_id: str, index: int, seed: bytes, rng: random.Random, now_ms: int,
                 queue_idle_ms: int, cells: Cells | None = None, workers: int = 1) -> None:
        # The host's per-slot cells our queues publish to (``Cells``; private when
        # alone); we write those of our slots only: ``slot % workers == index``.
        self.cells = Cells.private() if cells is None else cells
        self.lanes_held = LaneCount()  # our queues' lanes, kept by the queues (memory estimate)
        self._index = index
        self._workers = workers
        # Every worker mints IDs from its own stream: mix the index into the seed.
        self._seed = seed + index.to_bytes(4, "big")
        self._ids = JobIdGen(node_id, self._seed)
        self._rng = rng
        # The requeue jitter's own stream (``jitter_ms``), seeded from ``rng``.
        self._jitter_state = rng.getrandbits(_JITTER_BITS)
        self._queue_idle_ms = queue_idle_ms
        self._view = ClusterView(node_id)
        self.effects: list[Effect] = []
        self._last_ctime_us = 0
        self._now_ms = now_ms
        # Emit AofAppend effects (job records, deletions): the worker sets this
        # while appendonly is on, so the records cost nothing otherwise.
        self._aof = False
        self._tally = Tally()
        self.reset()

    def reset(self) -> None:
        """Empty tables (FLUSHALL); the parts reset their own state."""
        self.job_buckets: list[dict[str, Job] | None] = [None] * job_buckets
        self.njobs = 0
        self.body_bytes = 0  # registered jobs' bodies and extension fields (job.ext_mem_bytes)
        self.queues: dict[bytes, Queue] = {}
        self.qscan: list[Queue | None] = []
        self._qscan_free: list[int] = []
        self.timers = Timers()
        self.waiters: dict[int, Waiter] = {}
        self.repl: dict[str, ReplWait] = {}  # wait-repl jobs -> the blocked ADDJOB
        self._tally.clear()

    def view(self) -> ClusterView:
        """Who we are and whom we reach (read only: the setters below change it)."""
        return self._view

    def set_memory_level(self, level: int) -> None:
        """Memory warning level (disque_mp/node/memory.py): from 1 (75 % of maxmemory)
        on, ADDJOB replicates externally only, like a leaving node."""
        self._view.memory_level = level

    def now_ms(self) -> int:
        """The time of the message or tick being handled (``set_now``)."""
        return self._now_ms

    def set_now(self, now_ms: int) -> None:
        self._now_ms = now_ms

    def random(self) -> random.Random:
        """The shard's seeded random source (replica choice, jitter)."""
        return self._rng

    def tally(self) -> Tally:
        """What /metrics counts (read it; count a part's own moves through its verbs)."""
        return self._tally

    def set_aof(self, on: bool) -> None:
        self._aof = on

    def aof_on(self) -> bool:
        return self._aof

    def job_count(self) -> int:
        return self.njobs

    def body_bytes_held(self) -> int:
        """Sum of len(body) of the registered jobs (memory accounting)."""
        return self.body_bytes

    def job_table(self) -> Sequence[Mapping[str, Job] | None]:
        """The job buckets, read only (JSCAN's cursor is a bucket index)."""
        return self.job_buckets

    def queue_scan_table(self) -> Sequence[Queue | None]:
        """The QSCAN table, read only (a queue keeps its position while it exists)."""
        return self.qscan

    def owned_slots(self) -> slice:
        """Our slots, as a slice of a per-slot array."""
        return slice(self._index, None, self._workers)

    def next_due(self) -> int | None:
        """The earliest due time in the timer heap (None: no timer)."""
        return self.timers.next_due()

    def check(self) -> None:
        """Every cross-structure invariant (tests; O(jobs); ``check_core``)."""
        check_core(self)

    def new_job_id(self, slot: int, ttl_s: int, retry_s: int) -> str:
        return self._ids.make(slot, ttl_s, retry_s)

    def next_ctime_us(self, now_ms: int) -> int:
        """A creation time after every one made or loaded here (the queues' order)."""
        ctime_us = times_1000(now_ms)  # now_ms * US_PER_MS, inline when compiled
        if ctime_us <= self._last_ctime_us:
            ctime_us = self._last_ctime_us + 1
        self._last_ctime_us = ctime_us
        return ctime_us

    def saw_ctime(self, ctime_us: int) -> None:
        """A loaded job's creation time: later ones come after it."""
        if ctime_us > self._last_ctime_us:
            self._last_ctime_us = ctime_us

    def wait_repl(self, job_id: str, rw: ReplWait) -> None:
        """A synchronous ADDJOB waits for the copies of ``job_id``."""
        self.repl[job_id] = rw

    def repl_wait(self, job_id: str) -> ReplWait | None:
        return self.repl.get(job_id) if self.repl else None

    def end_repl_wait(self, job_id: str) -> ReplWait | None:
        return self.repl.pop(job_id, None) if self.repl else None

    def repl_waits(self) -> list[ReplWait]:
        return list(self.repl.values())

    def lookup(self, job_id: str) -> Job | None:
        b = self.job_buckets[job_bucket(job_id)]
        return None if b is None else b.get(job_id)

    def job_of(self, meta: dict[str, Any]) -> Job | None:
        """The job a cluster message names (``meta["j"]``), if it is ours."""
        jid = meta["j"]
        if type(jid) is not str or len(jid) != 40:
            return None
        return self.lookup(jid)

    def jobs(self) -> list[Job]:
        """Every registered job (tests, AOF rewrite)."""
        return [j for b in self.job_buckets if b for j in b.values()]

    def find_queue(self, name: bytes) -> Queue | None:
        return self.queues.get(name)

    def queue_list(self) -> list[Queue]:
        """Every queue, in table order (a copy: the caller may evict as it walks)."""
        return list(self.queues.values())

    def queue_table(self) -> Mapping[bytes, Queue]:
        """The queues by name, read only (views; no copy)."""
        return self.queues

    def queue_count(self) -> int:
        return len(self.queues)

    def lane_count(self) -> int:
        """The lanes our split queues hold (workers/lanes.py ``LaneCount``)."""
        return self.lanes_held.lanes

    def qlen(self, queue: bytes) -> int:
        q = self.queues.get(queue)
        return 0 if q is None else q.live

    def blocked(self, token: int) -> bool:
        return token in self.waiters

    def limit_of(self, queue: bytes) -> Limit | None:
        """The queue's QLIMIT limits (None: none)."""
        return self._tally.limited.get(queue)

    def limit_count(self) -> int:
        return len(self._tally.limited)

    def limit_table(self) -> Mapping[bytes, Limit]:
        """The limits by queue name, read only (AOF rewrite)."""
        return self._tally.limited

    def check_limits(self) -> None:
        """Every limit agrees with the jobs it counted (tests; O(delivered jobs))."""
        check_limits(self)

    def waiter_list(self) -> list[Waiter]:
        return list(self.waiters.values())

    def waiter_count(self) -> int:
        return len(self.waiters)


class Core(CoreState):
    """The moves of a job between the tables of one shard (register, enqueue,
    dequeue, deliver, unregister ...), each with its flags, timers, AOF record and
    messages; and the named events the parts subscribe to."""

    def __init__(self, node_id: str, index: int, seed: bytes, rng: random.Random, now_ms: int,
                 queue_idle_ms: int, cells: Cells | None = None, workers: int = 1) -> None:
        super().__init__(node_id, index, seed, rng, now_ms, queue_idle_ms, cells, workers)
        # Each event's subscribers (``subscribe``), in subscription order.
        self._after_ack: tuple[Events, ...] = ()
        self._after_job_gone: tuple[Events, ...] = ()
        self._after_queue_evicted: tuple[Events, ...] = ()
        self._after_queued_unwatched: tuple[Events, ...] = ()
        self._after_queue_drained: tuple[Events, ...] = ()
        self._after_ext_registered: tuple[Events, ...] = ()
        self._after_ext_unregistered: tuple[Events, ...] = ()

    # ------------------------------------------------------------------ view

    def set_peers(self, reachable_node_ids: list[str] | tuple[str, ...]) -> None:
        """Other nodes, all reachable (``set_view`` gives the full picture). Empty: single node."""
        self._view.set_peers(reachable_node_ids)

    def set_view(self, myid: str, peers: Sequence[tuple[Any, ...]],
                 leaving: bool) -> None:
        """The membership view: our ID, every other known node as (id, reachable,
        leaving[, linked]), our own LEAVING flag. Replication targets are the
        reachable nodes that are not leaving. ``linked`` (default: reachable) is
        False while our bus link to the node has not carried a PONG: a message
        to it would be dropped (membership.Node.linked)."""
        v = self._view
        if myid and myid != v.node_id:
            # CLUSTER RESET HARD gave the node a new ID: new jobs carry it.
            v.node_id = myid
            v.me = (myid,)
            self._ids = JobIdGen(myid, self._seed)
        v.set_members(peers)
        self.set_leaving(leaving)

    def set_leaving(self, leaving: bool) -> None:
        """CLUSTER LEAVING: no new local copies, no NEEDJOBS, no dummy ACKs, and
        blocked clients are released with -LEAVING (spec, "Gracefully removal")."""
        v = self._view
        was = v.leaving
        v.leaving = leaving
        if leaving and not was:
            for w in list(self.waiters.values()):
                self._drop_waiter(w, self._now_ms)
                self.effects.append(Wake(w.token, ERR_LEAVING))

    # ------------------------------------------------------------------ events

    def subscribe(self, part: Events, *events: str) -> None:
        """``part`` hears ``events`` (names of ``Events``' methods) from now on."""
        for name in events:
            invariant(name in EVENTS, f"no event {name}")
            attr = "_" + name
            setattr(self, attr, (*getattr(self, attr), part))

    def unsubscribe(self, part: Events, *events: str) -> None:
        """``part`` no longer hears ``events`` (a part that needs them only while it
        holds something: the per-job path then pays nothing for it)."""
        for name in events:
            attr = "_" + name
            setattr(self, attr, tuple(p for p in getattr(self, attr) if p is not part))

    def acked(self, job_id: str) -> None:
        """Tell the subscribers the job was acknowledged here."""
        for sub in self._after_ack:
            sub.after_ack(job_id)

    def drained(self, q: Queue, now_ms: int) -> None:
        """Tell the subscribers a consumer took the last job of ``q``."""
        for sub in self._after_queue_drained:
            sub.after_queue_drained(q, now_ms)

    # ------------------------------------------------------------------ the job table

    def register(self, job: Job) -> None:
        if job.state == QUEUED or job.state == DELETED:  # not in ENTRY_STATES
            job.check_entry()  # raises
        jid = job.id
        i = job_bucket(jid)
        b = self.job_buckets[i]
        if b is None:
            b = self.job_buckets[i] = {}
        elif jid in b:
            raise InvariantError(f"job {jid} registered twice")
        b[jid] = job
        self.njobs += 1
        self.body_bytes += len(job.body)
        if job.waits_delay():
            d = self._tally.delayed
            d[job.queue] = d.get(job.queue, 0) + 1
        if job.ext is not None:  # plain jobs pay this test only
            self.body_bytes += ext_mem_bytes(job.ext)
            for sub in self._after_ext_registered:
                sub.after_ext_registered(job)

    def arrive(self, job: Job, q: Queue, now_ms: int, sender: str = "",
               queued: bool = False) -> None:
        """A job another node sent (``sender``: a REPLJOB copy, YOURJOBS), or our AOF
        holds (no sender), enters the table in ``q``, under its canonical name, and
        takes its place: queued (``queued``), else armed on its timers. From a node
        it enters active, whatever state the sender's record says, with us and the
        sender among the nodes that may hold it and none confirmed yet; queued, its
        other holders hear of it (QUEUED: their RETRY counts from now); its record
        is written. From the AOF it enters active too, but an acked job stays acked
        (its GC goes on), and a job only we hold shares the node tuple of the jobs
        made here; its record is in the file already."""
        job.queue = q.name
        v = self._view
        if sender:
            job.enter(ACTIVE)
            job.delivered = union(job.delivered, (v.node_id, sender))
            job.confirmed = ()
        else:
            job.enter(ACKED if job.state == ACKED else ACTIVE)
            if job.delivered == v.me:
                job.delivered = v.me
        self.register(job)
        if not queued:
            self.arm(job)
        elif sender:
            self.enqueue(job, q, now_ms, False)  # YOURJOBS serves waiters after its batch
            if job.retry_s:
                self.send_queued(job)
        else:
            self.enqueue(job, q, now_ms)
        if sender:
            self.log_job(job)

    def activate(self, job: Job, q: Queue, now_ms: int) -> None:
        """A job of ours, registered and active, no longer waits for copies (made
        with none needed, or replicated): queued in ``q`` now, or armed for the end
        of its DELAY; its record."""
        if job.delay_s:
            job.qtime_ms = now_ms + job.delay_s * 1000
            self.reschedule(job)
        else:
            job.qtime_ms = 0
            self.timers.unschedule(job)
            self.enqueue(job, q, now_ms)
        self.log_job(job)

    def unregister(self, job: Job, now_ms: int) -> None:
        jid = job.id
        b = self.job_buckets[job_bucket(jid)]
        if b is None or b.get(jid) is not job:  # get and del: native calls, where
            raise InvariantError(f"unregister of unknown job {jid}")  # pop(k, None) is a method call
        del b[jid]
        self.njobs -= 1
        self.body_bytes -= len(job.body)
        if self._aof:
            self.effects.append(AofAppend(del_record(jid)))  # the one deletion record
        if self.repl:
            rw = self.repl.pop(jid, None)
            if rw is not None:
                self.effects.append(Wake(rw.token, ERR_NOREPL_TIMEOUT))
        for sub in self._after_job_gone:
            sub.after_job_gone(jid)
        if job.ext is not None:
            self.body_bytes -= ext_mem_bytes(job.ext)
            for sub in self._after_ext_unregistered:
                sub.after_ext_unregistered(job)
        t = self._tally
        t.forget_delivery(job)
        if job.waits_delay():
            t.undelay(job)
        was = job.state
        job.state = DELETED  # from any registered state (MOVES)
        # Stale timer-bucket and deque entries keep the record until purged (up to
        # its TTL): they must not keep the body, which memory accounting no longer counts.
        job.body = b""
        if was == QUEUED:
            q = self.queues[job.queue]
            q.remove(job)
            self.maybe_idle(q, now_ms)
        self.timers.unschedule(job)

    def log_job(self, job: Job) -> None:
        """The AOF verb: the job's state after a move, as a record (while appendonly
        is on). Every move that changes what a restart must know ends with it."""
        if self._aof:
            self.effects.append(AofAppend(job.to_record()))

    def log_record(self, record: bytes) -> None:
        """The AOF verb of a record that is no job's (a stored result:
        workers/results.py), while appendonly is on (the caller checks ``aof_on``
        before it builds the record)."""
        if self._aof:
            self.effects.append(AofAppend(record))

    def unregister_quiet(self, job: Job, now_ms: int) -> None:
        """Unregister without an AOF deletion record (the record is not ours to log)."""
        aof, self._aof = self._aof, False
        try:
            self.unregister(job, now_ms)
        finally:
            self._aof = aof

    # ------------------------------------------------------------------ queues

    def queue(self, name: bytes, now_ms: int) -> Queue:
        q = self.queues.get(name)
        if q is None:
            q = self.create_queue(name, now_ms)
        return q

    def create_queue(self, name: bytes, now_ms: int) -> Queue:
        name = bytes(name)  # the canonical name object every job of the queue shares
        q = Queue(name, slot_of(name), now_ms, self.cells, self.lanes_held)
        if self._tally.limited and name in self._tally.limited:
            q.paused = LIMITED  # the limits belong to the name (workers/limits.py)
        self.queues[name] = q
        if self._qscan_free:
            q.scan_idx = self._qscan_free.pop()
            self.qscan[q.scan_idx] = q
        else:
            q.scan_idx = len(self.qscan)
            self.qscan.append(q)
        self.maybe_idle(q, now_ms)
        return q

    def maybe_idle(self, q: Queue, now_ms: int) -> None:
        """Arm the eviction check of a queue that has become empty and unwatched. A
        check already armed is never later than this one would be (``atime_ms`` only
        grows), so it stays: a take over empty queues re-arms nothing."""
        if not q.awake_ms and not q.live and q.waiters is None and not q.paused & PAUSE_MASK:
            self.timers.schedule(q, q.atime_ms + self._queue_idle_ms, self._queue_idle_ms)

    def fire_queue(self, q: Queue, now_ms: int) -> None:
        """The eviction check of an idle queue is due: evict it, or check again later."""
        if self.queues.get(q.name) is not q:
            return
        if q.live or q.waiters is not None or q.paused & PAUSE_MASK:
            if q.paused & LIMITED and q.waiters is not None and not q.paused & PAUSED_OUT:
                self.serve_waiters(q, now_ms)  # RATE's next token is due
            return  # re-armed when it becomes idle again
        if q.atime_ms + self._queue_idle_ms <= now_ms:
            self.evict(q)
        else:
            self.timers.schedule(q, q.atime_ms + self._queue_idle_ms, self._queue_idle_ms)

    def evict(self, q: Queue) -> None:
        del self.queues[q.name]
        self.qscan[q.scan_idx] = None
        self._qscan_free.append(q.scan_idx)
        q.drop_all()
        self.timers.unschedule(q)
        for sub in self._after_queue_evicted:
            sub.after_queue_evicted(q)

    # ------------------------------------------------------------------ moves

    def enqueue(self, job: Job, q: Queue, now_ms: int, serve: bool = True) -> None:
        """Disque's enqueueJob minus its checks: the job becomes QUEUED in ``q``.
        ``serve=False``: the caller queues a batch and serves waiters after it."""
        if job.state != ACTIVE:  # MOVES: only active -> queued
            raise InvariantError(f"job {job.id}: {STATE_NAMES[job.state]} -> queued is not "
                                 "a move of the state machine")
        job.state = QUEUED
        t = self._tally
        if job.waits_delay():
            t.undelay(job)
        t.forget_delivery(job)  # queued again (retry, NACK, ENQUEUE, a peer's QUEUED)
        job.mark_queued()
        job.qtime_ms = self.retry_at(job, now_ms)  # 0 at-most-once: never queued again
        q.push(job)
        q.atime_ms = now_ms
        q.jobs_in += 1
        self.arm_ttl(job)
        if not serve:
            return
        if q.waiters is not None:
            if not q.paused:
                self._serve(q, now_ms)
            elif not q.paused & PAUSED_OUT:
                self.serve_waiters(q, now_ms)  # within its limits when it has some
        elif q.live == 1:
            for sub in self._after_queued_unwatched:
                sub.after_queued_unwatched(q, now_ms)

    def requeue(self, job: Job, q: Queue, now_ms: int, incr: int = 0) -> None:
        """Queue a known job again (retry timer, NACK, ENQUEUE): QUEUED to the
        other holders as the re-queueing state machine says, and log the state.
        ``incr`` (QUEUED_INCR_*): the counter this requeue incremented here, which
        the other holders increment too."""
        self.enqueue(job, q, now_ms)
        if job.nodes[0] is not self._view.me and job.state == QUEUED:
            self.send_queued(job, incr)
        self.log_job(job)

    def dequeue(self, job: Job, now_ms: int, record: bool = False) -> None:
        """A QUEUED job goes back to ACTIVE without being delivered. ``record``: the
        move is whole (DEQUEUE), its record is written; else it is the first step of
        a move that writes its record at its end, or of a peer's that writes none."""
        job.move(ACTIVE)
        q = self.queues[job.queue]
        q.remove(job)
        self.maybe_idle(q, now_ms)
        if job.qtime_ms:
            self.timers.schedule(job, job.qtime_ms)
        if record:
            self.log_job(job)

    def working(self, job: Job, now_ms: int) -> int:
        """WORKING of a job we hold, half its TTL not elapsed: out of its queue, its
        requeue postponed by a RETRY here and on the other holders (WORKING), its
        record; the RETRY in seconds (the reply)."""
        if job.state == QUEUED:
            self.dequeue(job, now_ms)
        if job.retry_s and job.state != WAIT_REPL:
            self.postpone(job, self.retry_at(job, now_ms))
            if job.nodes[0] is not self._view.me:
                others = self.others(job)  # the other copies must not requeue it either
                if others:
                    self.send_job(others, msg.WORKING, job)
        self.log_job(job)
        return job.retry_s

    def nack_later(self, job: Job, delay_ms: int, now_ms: int) -> None:
        """NACK ... DELAY: the job stays active (not deliverable) until the delay
        ends, then is queued without counting a further delivery; every other
        holder pushes its own requeue past the delay (QUEUED with "w"); its record."""
        self._tally.forget_delivery(job)
        job.mark_nack_delayed()
        job.qtime_ms = now_ms + delay_ms
        self.reschedule(job)
        others = self.others(job)
        if others:
            self.send_job(others, msg.QUEUED, job,
                          msg.queued_meta(job.id, QUEUED_INCR_NACKS, wait_ms=delay_ms))
        self.log_job(job)

    def dead_letter(self, job: Job, now_ms: int, incr: int = 0, reason: bytes | None = None,
                    follow: bool = False) -> None:
        """The move to ``dead:<queue>`` (MAXDELIVER, DEADLETTER) of an active or queued
        job: same ID, counters kept, ``reason`` set (None: kept). Queued there, the
        other holders told (QUEUED "dl" with the reason and ``incr``, the counter
        this move counted). ``follow``: another holder moved it, our copy follows
        (points at the dead queue, not queued here)."""
        self._move_to(job, DEAD_PREFIX + job.queue, now_ms)
        if reason is not None:
            self.body_bytes += job.set_ext(reason=reason)
        if not follow:
            self._tally.stats.dead_lettered += 1
            self.enqueue(job, self.queues[job.queue], now_ms)
            others = self.others(job)
            if others:
                self.send_job(others, msg.QUEUED, job, msg.queued_meta(
                    job.id, incr, dead=True, reason=job.dead_reason))
        self.log_job(job)

    def redrive(self, job: Job, now_ms: int, follow: bool = False) -> None:
        """The reverse move (REDRIVE): a job of ``dead:<queue>`` back to ``<queue>``,
        same ID, TTL, RETRY and MAXDELIVER, its delivery counters reset and its
        reason cleared; queued there, the other holders told (QUEUED "rd").
        ``follow``: another holder moved it, our copy follows."""
        self._move_to(job, job.queue[len(DEAD_PREFIX):], now_ms)
        job.nacks = 0
        job.additional_deliveries = 0
        self.body_bytes += job.set_ext(reason=b"")
        if not follow:
            self.enqueue(job, self.queues[job.queue], now_ms)
            others = self.others(job)
            if others:
                self.send_job(others, msg.QUEUED, job, msg.queued_meta(job.id, redrive=True))
        self.log_job(job)

    def _move_to(self, job: Job, name: bytes, now_ms: int) -> None:
        """The job leaves its queue (active from now on) for queue ``name``."""
        if job.state == QUEUED:
            self.dequeue(job, now_ms)
        if job.in_deque():
            self.queues[job.queue].detach(job)
        self._tally.leave_queue(job)
        job.queue = self.queue(name, now_ms).name

    def deliver(self, job: Job, q: Queue, now_ms: int, withcounters: bool) -> list[Any]:
        """``job`` was just popped from ``q`` for a client: make it ACTIVE, build its entry."""
        job.state = ACTIVE  # queued -> active (Queue.pop returns queued jobs only)
        t = self._tally
        st = t.stats
        if not job.was_delivered():
            wait_ms = now_ms - job.ctime_us // US_PER_MS
            st.wait_counts[latency_bucket(wait_ms)] += 1
            st.wait_sum_ms += wait_ms
            job.mark_delivered()
        st.delivered += 1
        if job.dtime_ms < 0:
            t.active[q.name] = t.active.get(q.name, 0) + 1
            t.outstanding += 1
        job.dtime_ms = now_ms
        q.jobs_out += 1
        q.atime_ms = now_ms
        if job.qtime_ms:
            if job.qtime_ms <= now_ms:
                # It waited in the queue longer than RETRY: counting RETRY from the
                # queueing would requeue it at once, a certain duplicate delivery.
                job.qtime_ms = self.retry_at(job, now_ms)
            self.timers.schedule(job, job.qtime_ms, job.qtime_ms - now_ms)
        if withcounters:
            return [q.name, job.id, job.body, _K_NACKS, job.nacks,
                    _K_ADD_DELIV, job.additional_deliveries]
        return [q.name, job.id, job.body]

    def serve_waiters(self, q: Queue, now_ms: int) -> None:
        """GETJOBs blocked on ``q`` get its jobs (within its limits, when it has some)."""
        if q.paused & LIMITED:
            self._serve_limited(q, now_ms)
        else:
            self._serve(q, now_ms)

    def _serve(self, q: Queue, now_ms: int) -> None:
        while q.live and q.waiters:
            token = next(iter(q.waiters))
            w = self.waiters[token]
            self._drop_waiter(w, now_ms)
            entries: list[list[Any]] = []
            while len(entries) < w.count:
                job = q.pop()
                if job is None:
                    break
                entries.append(self.deliver(job, q, now_ms, w.withcounters))
            self.effects.append(Wake(token, entries))
        self.maybe_idle(q, now_ms)
        if not q.live:
            self.drained(q, now_ms)

    def _serve_limited(self, q: Queue, now_ms: int) -> None:
        while q.live and q.waiters:
            token = next(iter(q.waiters))
            w = self.waiters[token]
            entries = self.take_limited(q, w.count, w.withcounters, now_ms)
            if not entries:
                break  # at its limit: served again when a delivery ends or a token is due
            self._drop_waiter(w, now_ms)
            self.effects.append(Wake(token, entries))
        self.maybe_idle(q, now_ms)
        if not q.live:
            self.drained(q, now_ms)

    def serve_ended(self, now_ms: int) -> None:
        """Deliveries of queues with limits ended (ACK, NACK, gone ...): their
        blocked GETJOBs get what the limits allow now."""
        ended = self._tally.ended
        names = list(ended)
        ended.clear()
        for name in names:
            q = self.queues.get(name)
            if q is not None and q.live and q.waiters is not None and q.paused & LIMITED \
                    and not q.paused & PAUSED_OUT:
                self._serve_limited(q, now_ms)

    def take_limited(self, q: Queue, count: int, withcounters: bool,
                     now_ms: int) -> list[list[Any]]:
        """Up to ``count`` jobs of ``q``, a queue with limits, as its limits allow
        now (``deliver``'s entries): ACTIVE and RATE bound how many, the groups at
        GROUP-ACTIVE are passed over. At RATE's limit with jobs left, the queue's
        timer is armed for the next token (``fire_queue`` serves its waiters)."""
        lim = self._tally.limited[q.name]
        out: list[list[Any]] = []
        room = lim.room(self._tally.active.get(q.name, 0), now_ms)
        n = room if room < count else count
        full = lim.full_groups()
        while len(out) < n:
            job = q.pop_outside(full) if full else q.pop()
            if job is None:
                break
            group = group_of(job)
            out.append(self.deliver(job, q, now_ms, withcounters))
            if lim.took(job, group):
                full.add(group)
        if lim.rate and q.live and len(out) >= room and lim.tokens(now_ms) < 1:
            self.timers.schedule(q, lim.next_token_ms(now_ms))
        return out

    def set_limit(self, name: bytes, active: int, rate: int, group_active: int, now_ms: int,
                  log: bool = True) -> None:
        """QLIMIT: the queue's limits from now on (all 0: none); a queue that exists
        takes them at once, one made later when it is made (``create_queue``); its
        waiters get what the new limits allow; the record (``log``)."""
        t = self._tally
        lim = t.limited.get(name)
        q = self.queues.get(name)
        if active or rate or group_active:
            if lim is None:
                lim = t.limited[bytes(name)] = Limit(now_ms)
            lim.change(active, rate, group_active, t.active.get(name, 0), now_ms)
            if q is not None:
                q.paused |= LIMITED
        elif lim is not None:
            del t.limited[name]
            t.ended.discard(name)
            if q is not None:
                q.paused &= ~LIMITED
                self.maybe_idle(q, now_ms)
        if q is not None and q.waiters is not None and q.live and not q.paused & PAUSED_OUT:
            self.serve_waiters(q, now_ms)
        if log and self._aof:
            self.effects.append(AofAppend(limit_record(name, active, rate, group_active)))

    def block(self, w: Waiter, now_ms: int) -> list[Queue]:
        """A blocked GETJOB waits on its queues (a watched queue is not evicted);
        returns the queues nobody watched before. A queue's idle check stays armed: it
        finds the waiter and ends (``fire_queue``), and the waiter's leaving arms none
        while it is (``maybe_idle``), so a consumer that blocks after each job does not
        move the queue's timer twice a job."""
        self.waiters[w.token] = w
        fresh = []
        for name in w.queues:
            q = self.queue(name, now_ms)
            if q.waiters is None:
                q.waiters = {}
                fresh.append(q)
            q.waiters[w.token] = w
        return fresh

    def _drop_waiter(self, w: Waiter, now_ms: int) -> None:
        del self.waiters[w.token]
        for name in w.queues:
            q = self.queues.get(name)
            if q is not None and q.waiters is not None:
                if w.token in q.waiters:  # in and del: native calls, pop(k, None) a method call
                    del q.waiters[w.token]
                if not q.waiters:
                    q.waiters = None
                    self.maybe_idle(q, now_ms)

    def unblock(self, token: int, now_ms: int | None = None,
                forget_queues: bool = False) -> None:
        """Drop a waiter. ``forget_queues``: it was released by a flush of the node
        (DEBUG FLUSHALL, CLUSTER RESET) that this shard ran before the waiter came
        (another worker's BLOCK, sent before that flush); the queues it waited on
        that are empty and idle now go at once, as the flush would have taken them."""
        w = self.waiters.get(token)
        if w is None:
            return
        self._drop_waiter(w, self._now_ms if now_ms is None else now_ms)
        if forget_queues:
            for name in w.queues:
                q = self.queues.get(name)
                if q is not None and not q.live and q.waiters is None \
                        and not q.paused & PAUSE_MASK:
                    self.evict(q)

    # ------------------------------------------------------------------ timers

    def due(self, job: Job) -> int:
        """The job's next deadline: TTL; requeue (WILLQUEUE 500 ms earlier when other
        nodes may have a copy); next replication step (wait-repl); next GC (acked)."""
        etime = job.ctime_us // US_PER_MS + job.ttl_s * 1000
        qt = job.qtime_ms
        if qt and job.state != QUEUED:
            if (job.state == ACTIVE and not job.willqueue_sent()
                    and job.nodes[0] is not self._view.me):
                qt -= time_error_ms
            if qt < etime:
                return qt
        return etime

    def schedule(self, target: Timed, due_ms: int) -> None:
        """``target`` fires at ``due_ms`` or earlier (workers/timers.py)."""
        self.timers.schedule(target, due_ms)

    def unschedule(self, target: Timed) -> None:
        self.timers.unschedule(target)

    def arm_ttl(self, job: Job) -> None:
        """The job fires at its TTL or earlier (a queued job's one timer), rounded as
        a timer set that far ahead (``workers.timers.resolution_for``)."""
        ttl_ms = job.ttl_s * 1000
        self.timers.schedule(job, job.ctime_us // US_PER_MS + ttl_ms, ttl_ms)

    def arm(self, job: Job) -> None:
        """The job fires at its next deadline (``due``) or earlier."""
        self.timers.schedule(job, self.due(job))

    def start_firing(self) -> None:
        """A tick begins (``Lifecycle.tick``): see ``next_fired``."""
        self.timers.start_firing()

    def next_fired(self, now_ms: int, pops_max: int) -> Timed | None:
        """The next target due at ``now_ms``, or None (workers/timers.py)."""
        return self.timers.next_fired(now_ms, pops_max)

    def next_deadline(self, now_ms: int) -> int | None:
        """When the tick must run again: now when it stopped at its bound, else the
        earliest due time (None: no timer)."""
        t = self.timers
        return now_ms if t.capped else t.next_due()

    def reschedule(self, job: Job) -> None:
        self.timers.unschedule(job)
        self.timers.schedule(job, self.due(job))

    def retry_at(self, job: Job, now_ms: int, wait_ms: int = 0, retry_min_s: int = 0) -> int:
        """The requeue verb: when ``job`` is queued again unless acknowledged first,
        its RETRY counted from ``now_ms`` (after ``wait_ms``) plus up to
        ``time_error_ms`` of jitter, so that the holders' timers do not fire together
        (Disque's DISQUE_TIME_ERR); 0 for an at-most-once job (never queued again).
        ``retry_min_s``: at least this RETRY (a queue paused in input is tried again
        later even for an at-most-once job still waiting for its DELAY)."""
        retry_s = job.retry_s if job.retry_s >= retry_min_s else retry_min_s
        if not retry_s:
            return 0
        return now_ms + wait_ms + retry_s * 1000 + self.jitter_ms()

    def jitter_ms(self) -> int:
        """0 .. time_error_ms - 1, from a linear congruential stream of 28 bits (its
        top 16 bits): compiled, machine arithmetic, where ``random()`` and a float's
        product and int() took ~500 instructions for every job queued or delivered.
        Jitter needs spread, not secrecy."""
        x = (self._jitter_state * _JITTER_MUL + 1) & _JITTER_MASK
        self._jitter_state = x
        return (x >> (_JITTER_BITS - 16)) % time_error_ms

    def postpone(self, job: Job, qtime_ms: int) -> None:
        """The job's requeue time moves to ``qtime_ms`` (WORKING, a peer's QUEUED or
        WORKING, a YOURJOBS sent): a WILLQUEUE is due again before it, its timer follows."""
        job.qtime_ms = qtime_ms
        job.new_requeue_time()
        self.reschedule(job)

    # ------------------------------------------------------------------ messages out

    def wake(self, token: int, reply: Any) -> None:
        """Answer a client waiting on this shard (blocked GETJOB, ADDJOB, WAITJOB ...)."""
        self.effects.append(Wake(token, reply))

    def take_effects(self) -> list[Effect]:
        """The effects since the last call, in order (the worker carries them out)."""
        eff = self.effects
        if eff:
            self.effects = []
        return eff

    def send(self, node: str, kind: str, slot: int, meta: dict[str, Any],
              bodies: list[bytes] | None = None) -> None:
        self.effects.append(Send(node, kind, slot, meta, bodies if bodies is not None else []))

    def others(self, job: Job) -> list[str]:
        me = self._view.node_id
        return [n for n in job.delivered if n != me]

    def send_job(self, nodes: list[str] | tuple[str, ...], kind: str, job: Job,
                  meta: dict[str, Any] | None = None) -> None:
        slot = slot_of_job_id(job.id)
        m = msg.job_meta(job.id) if meta is None else meta
        for n in nodes:
            self.effects.append(Send(n, kind, slot, m, []))

    def send_queued(self, job: Job, incr: int = 0) -> None:
        others = self.others(job)
        if others:
            self.send_job(others, msg.QUEUED, job, msg.queued_meta(job.id, incr))


def check_core(c: CoreState) -> None:
    """Check every cross-structure invariant of the core's tables (tests; O(jobs))."""
    jobs = c.jobs()
    invariant(len(jobs) == c.njobs, f"job count {c.njobs} != {len(jobs)}")
    queued: dict[bytes, int] = {}
    for job in jobs:
        invariant(job.state in (WAIT_REPL, ACTIVE, QUEUED, ACKED), f"{job} bad state")
        if job.state == QUEUED:
            invariant(job.queue in c.queues, f"{job} queued in a missing queue")
            queued[job.queue] = queued.get(job.queue, 0) + 1
        invariant(job.awake_ms != 0, f"{job} has no timer (TTL would never fire)")
        invariant(c.timers.holds(job), f"{job} timer bucket lost")
    for name, q in c.queues.items():
        err = q.check()
        invariant(err is None, str(err))
        invariant(q.live == queued.get(name, 0), f"queue {name!r} live count wrong")
        invariant(c.qscan[q.scan_idx] is q, f"queue {name!r} not in scan table")
        if q.waiters is not None:
            for token in q.waiters:
                invariant(token in c.waiters, f"dangling waiter {token}")
            invariant(not q.live or q.paused & (PAUSED_OUT | LIMITED),
                      f"queue {name!r} has jobs and waiters")
    for w in c.waiters.values():
        for name in w.queues:
            wq = c.queues.get(name)
            invariant(wq is not None and wq.waiters and w.token in wq.waiters,
                      f"waiter {w.token} not on queue {name!r}")
    lanes = sum(q.lanes_held() for q in c.queues.values())
    invariant(c.lane_count() == lanes, f"lane count {c.lane_count()} != {lanes}")
    c.timers.check()
    _check_tally(c.tally(), jobs)
    check_limits(c)
    _check_cells(c)


def check_limits(c: CoreState) -> None:
    """Each queue with limits: never more delivered and not done than ACTIVE (past
    it only by the jobs delivered before ACTIVE was lowered, until the next
    delivery), nor per group than GROUP-ACTIVE; the jobs counted per group are
    delivered and not done (tests; O(delivered jobs))."""
    t = c.tally()
    for name, lim in t.limited.items():
        in_use = t.active.get(name, 0)
        if lim.active:
            invariant(in_use <= lim.active + lim.over,
                      f"queue {name!r}: {in_use} delivered and not done, ACTIVE {lim.active}")
        groups: dict[bytes, int] = {}
        for job, group in lim.counted.items():
            invariant(job.dtime_ms >= 0 and job.queue == name and group_of(job) == group,
                      f"{job} counted by the limits of {name!r} but not delivered there")
            groups[group] = groups.get(group, 0) + 1
        invariant(groups == lim.groups, f"queue {name!r}: groups {lim.groups} != {groups}")
        invariant(len(lim.counted) <= in_use, f"queue {name!r}: counted past the delivered")
        q = c.queues.get(name)
        invariant(q is None or bool(q.paused & LIMITED), f"queue {name!r} lost its LIMITED bit")
    for name, q in c.queues.items():
        invariant(not q.paused & LIMITED or name in t.limited, f"queue {name!r}: LIMITED, no limit")


def _check_cells(c: CoreState) -> None:
    """Each of our slots' ``nonempty`` cell counts its queues holding jobs (tests; O(queues)
    + O(our slots)): per slot where a queue holds jobs, and in total over our slots."""
    per_slot: dict[int, int] = {}
    for q in c.queues.values():
        if q.live:
            per_slot[q.slot] = per_slot.get(q.slot, 0) + 1
    nonempty = c.cells.nonempty
    for slot, n in per_slot.items():
        invariant(nonempty[slot] == n, f"slot {slot}: {nonempty[slot]} queues with jobs "
                  f"published, {n} hold some")
    total = sum(nonempty[c.owned_slots()])
    invariant(total == sum(per_slot.values()),
              f"{total} queues with jobs published over our slots, {sum(per_slot.values())} hold some")


def _check_tally(t: Tally, jobs: list[Job]) -> None:
    """The /metrics bookkeeping agrees with the jobs (tests; O(jobs))."""
    active: dict[bytes, int] = {}
    outstanding = 0
    for job in jobs:
        if job.dtime_ms >= 0:
            invariant(job.state in (ACTIVE, ACKED), f"delivered job {job.id} is not active")
            active[job.queue] = active.get(job.queue, 0) + 1
            outstanding += 1
    invariant(active == t.active, f"active per queue {t.active} != {active}")
    invariant(outstanding == t.outstanding,
              f"{t.outstanding} jobs counted outstanding, {outstanding} are")
    delayed: dict[bytes, int] = {}
    for job in jobs:
        if job.waits_delay():
            delayed[job.queue] = delayed.get(job.queue, 0) + 1
    invariant(delayed == t.delayed, f"delayed per queue {t.delayed} != {delayed}")


class Events:
    """The moments of a job's or a queue's life the core tells the parts of, as
    Dramatiq's middleware hooks: a part extends this, overrides the events it
    needs and subscribes to them (``Core.subscribe``); the core calls every
    subscriber of an event, never a part it knows by name. Alone, a core has none."""

    def after_ack(self, job_id: str) -> None:
        """The job was acknowledged here (it may stay, acked, for the GC)."""

    def after_job_gone(self, job_id: str) -> None:
        """The job left the job table (acked and collected, deleted, expired)."""

    def after_queue_evicted(self, q: Queue) -> None:
        """The queue left the queue table (idle, or memory pressure)."""

    def after_queued_unwatched(self, q: Queue, now_ms: int) -> None:
        """A job was queued in an otherwise empty queue with no local consumer."""

    def after_queue_drained(self, q: Queue, now_ms: int) -> None:
        """A consumer took the last job of the queue."""

    def after_ext_registered(self, job: Job) -> None:
        """A job with extension fields (``job.ext``) entered the job table, by any
        path (ADDJOB, a REPLJOB copy, YOURJOBS, AOF load). Plain jobs do not call it:
        the per-job path pays one test."""

    def after_ext_unregistered(self, job: Job) -> None:
        """A job with extension fields is leaving the job table (as
        ``after_job_gone``, with the job: still in its state and queue)."""


EVENTS: Final = frozenset(("after_ack", "after_job_gone", "after_queue_evicted",
                           "after_queued_unwatched", "after_queue_drained",
                           "after_ext_registered", "after_ext_unregistered"))
