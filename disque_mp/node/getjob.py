"""GETJOB coordination: one client's GETJOB over queues that may belong to
several workers (docs/architecture.md, "Invariants": every owner asked at
once, the answers merged in the order one shard would give, a waiter at each
owner when all are empty, the first job offered wins, any surplus handed back
to its owner uncounted, waiters cancelled when the client leaves or times out).

A ``GetJob`` lives on the worker that holds the client's connection; it talks
to its own shard directly and to the other owners over the mesh (TAKES, BLOCK,
UNBLOCK, RETURN; the owners answer with TOOKS and WAKE). The takes of every
GETJOB coordinated during one loop turn leave for each owner in one frame.
Its queues' split by owner is a ``Plan``, made once per request the router sees
again. The merge is ``merge_by_place`` (each job laid at its place in one shard's
order) when every job taken is in the answer, else ``pick_round_robin``.
``GetJobs`` keeps the worker's blocked ones by token: the mesh handler
(``peers.py``) hands it the owners' WAKEs and peer reconnections, DEBUG FLUSHALL
releases them all."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import hiredis

from bus import mesh as meshmod
from bus.clock import wall_ms
from bus.mesh import pack_took, unpack_took
from disque_mp.node.connection import ClientConn, PendingReply
from disque_mp.node.core import WorkerCore
from disque_mp.node.errors import ERR_LEAVING
from disque_mp.node.hints import Hints
from disque_mp.node.hints import cells as hints_cells
from disque_mp.node.resp import NULL3, NULL_ARRAY2, encode, encode_jobs, entry_resp
from workers.replies import NULL_ARRAY, PENDING, Error
from workers.timers import resolution_for

Runs = list[tuple[int, list[bytes]]]  # (owner, its queues): consecutive queues of one owner

# How many times a GETJOB over several workers asks its owners again when its own
# queues gave fewer jobs than its TAKEs were told (another GETJOB took them between).
retakes_max = 2

# Passes (jobs of one queue) the place-order merge lays out (``merge_by_place``: a list of
# this many times the queues named); a deeper answer takes the general merge.
merge_passes_max = 8


class TimeoutBucket:
    """The blocked GETJOBs whose TIMEOUT ends at one due time (``key``), and the
    loop's timer for them."""

    __slots__ = ("key", "handle", "jobs")

    def __init__(self, key: int) -> None:
        self.key = key
        self.handle: asyncio.TimerHandle | None = None
        self.jobs: dict[int, GetJob] = {}


class Timeouts:
    """A worker's GETJOB TIMEOUTs, in buckets of due times rounded up as the shard's
    timers are (``workers.timers.resolution_for``: 10 ms below 10 s): one loop timer a
    bucket, so consumers that block in turn share one, where each GETJOB made a libuv
    timer and cancelled it when woken (~4k instructions, the most of a paced job's
    wait). A TIMEOUT ends at its due time or up to the rounding later, never before."""

    def __init__(self, w: WorkerCore) -> None:
        self.w = w  # its loop is read when a bucket is made (the worker starts it later)
        self.buckets: dict[int, TimeoutBucket] = {}

    def arm(self, job: GetJob, timeout_ms: int, now_ms: int) -> int:
        """``job`` times out ``timeout_ms`` after ``now_ms``: its bucket's key."""
        due = now_ms + timeout_ms
        key = due + -due % resolution_for(timeout_ms)
        b = self.buckets.get(key)
        if b is None:
            b = self.buckets[key] = TimeoutBucket(key)
            b.handle = self.w.loop.call_later(max(0, key - wall_ms()) / 1000, self._fire, b)
        b.jobs[job.token] = job
        return key

    def disarm(self, key: int, token: int) -> None:
        """GETJOB ``token`` was answered before its TIMEOUT (bucket ``key``)."""
        b = self.buckets.get(key)
        if b is None:
            return
        if token in b.jobs:
            del b.jobs[token]
        if not b.jobs:
            del self.buckets[key]
            if b.handle is not None:
                b.handle.cancel()

    def _fire(self, b: TimeoutBucket) -> None:
        if self.buckets.get(b.key) is b:
            del self.buckets[b.key]
        for job in list(b.jobs.values()):
            job.timed_out()


class GetJobs:
    """The GETJOBs worker ``w`` coordinates and that wait (by token)."""

    def __init__(self, w: WorkerCore, hints: Hints | None = None) -> None:
        self.w = w
        self.waiting: dict[int, GetJob] = {}
        self.timeouts = Timeouts(w)
        # the other owners' queues known empty (hints.py): a take round skips them
        self.hints = Hints(hints_cells()) if hints is None else hints

    def on_wake(self, peer: int, meta: dict[str, Any], bodies: list[bytes]) -> None:
        """An owner's WAKE: jobs (``Took``) or the error for one of ours, else given back."""
        job = self.waiting.get(meta["t"])
        err = meta.get("e")
        answer: Any
        if err is not None:
            answer = Error(err)
        else:
            answer = Took.of(peer, job.blocked_at.get(peer, []) if job is not None else [], bodies[0])
        if job is None:
            if err is None:
                self.return_ids(peer, answer.ids())
        else:
            job.woken(peer, answer)

    def on_peer_up(self, peer: int) -> None:
        for job in list(self.waiting.values()):
            job.reblock(peer)

    def release_all(self) -> None:
        """DEBUG FLUSHALL and CLUSTER RESET: each answered as on timeout."""
        for job in list(self.waiting.values()):
            job.release()

    def return_ids(self, owner: int, ids: list[str]) -> None:
        """Give back jobs taken for a GETJOB that no longer wants them."""
        if not ids:
            return
        w = self.w
        if owner == w.index:
            w.shard.op_return(ids, wall_ms())
            w.drain_effects()
        else:
            w.mesh.send(owner, meshmod.K_RETURN, {}, [i.encode() for i in ids])


class Took:
    """The jobs one owner took for a GETJOB (a TAKE's or a WAKE's answer, ``pack_took``):
    their entries already RESP, one after the other in ``data`` from ``start``, and
    the index of each one's queue in ``queues`` (the request's)."""

    __slots__ = ("owner", "queues", "qidx", "lens", "data", "start")

    def __init__(self, owner: int, queues: list[bytes], qidx: list[int], lens: list[int],
                 data: bytes, start: int) -> None:
        self.owner = owner
        self.queues = queues
        self.qidx = qidx
        self.lens = lens
        self.data = data
        self.start = start

    @staticmethod
    def of(owner: int, queues: list[bytes], blob: bytes) -> Took:
        _, qidx, lens, start = unpack_took(blob)
        return Took(owner, queues, qidx, lens, blob, start)

    def names(self) -> list[bytes]:
        queues = self.queues
        return [queues[i] for i in self.qidx]

    def parts(self) -> list[bytes]:
        out: list[bytes] = []
        data, at = self.data, self.start
        for n in self.lens:
            out.append(data[at : at + n])
            at += n
        return out

    def reply(self) -> bytes:
        """The GETJOB's answer when these are all its jobs."""
        return b"*%d\r\n" % len(self.lens) + self.data[self.start :]

    def ids(self) -> list[str]:
        return ids_in(self.data[self.start :], len(self.lens))


class Plan:
    """A GETJOB's queues split by owner, as worker ``me`` coordinates them: ``runs`` (the
    router's route, ``Router.route``: runs of one owner in the client's order), our
    queues (``here``) and each other owner's (``remote``), each in the client's order,
    and for each place the client named its owner and its index in that owner's list
    (``owner_at``, ``index_at``), for each queue of an owner its place (``here_at``,
    ``remote_at``). Read-only once made: the router keeps the plan of a
    request it sees again (a consumer asks the same queues every time), shared by
    every GETJOB of it."""

    __slots__ = ("runs", "here", "remote", "owner_at", "index_at", "here_at", "remote_at",
                 "distinct")

    def __init__(self, runs: Runs, me: int) -> None:
        here: list[bytes] = []
        here_at: list[int] = []
        remote: dict[int, list[bytes]] = {}
        remote_at: dict[int, list[int]] = {}
        owner_at: list[int] = []
        index_at: list[int] = []
        for owner, queues in runs:
            if owner == me:
                mine, places = here, here_at
            else:
                got = remote.get(owner)
                if got is None:
                    got = remote[owner] = []
                    remote_at[owner] = []
                mine, places = got, remote_at[owner]
            for q in queues:
                places.append(len(owner_at))
                owner_at.append(owner)
                index_at.append(len(mine))
                mine.append(q)
        self.runs = runs
        self.here = here
        self.here_at = here_at
        self.remote = remote
        self.remote_at = remote_at
        self.owner_at = owner_at
        self.index_at = index_at
        self.distinct = -1  # no queue named twice (1), or one is (0): ``is_distinct``

    def is_distinct(self) -> bool:
        if self.distinct < 0:
            named: set[bytes] = set()
            for _, queues in self.runs:
                named.update(queues)
            self.distinct = 1 if len(named) == len(self.owner_at) else 0
        return self.distinct == 1


class GetJob:
    """One GETJOB coordinated by this worker (docs/architecture.md, "Invariants")."""

    __slots__ = ("w", "registry", "conn", "spec", "plan", "runs", "asked", "taken", "here",
                 "remote", "sizes", "hinted", "held", "held_here", "held_others", "answers",
                 "token", "slot", "blocked_at", "timeout_key", "done", "flushed", "retakes")

    def __init__(self, registry: GetJobs, conn: ClientConn, spec: Any, plan: Plan | Runs) -> None:
        """``plan``: its queues split by owner (a ``Plan``, or the router's runs, split
        here), which every step reads."""
        self.w = registry.w
        self.registry = registry
        self.conn = conn
        self.spec = spec
        if not isinstance(plan, Plan):
            plan = Plan(plan, self.w.index)
        self.plan = plan
        self.runs = plan.runs
        self.here = plan.here  # our queues, in the client's order
        self.remote = plan.remote  # each other owner's queues, in that order
        self.asked = 0  # other owners whose TAKE is unanswered
        self.taken: list[Took] = []  # the other owners' takes that got jobs
        # what each queue named could give (our queues when the TAKEs left, the others'
        # from their answers), by name: filled only where the lists below do not do
        # (``_sizes``: a queue named twice, an answer the first pass does not settle)
        self.sizes: dict[bytes, int] = {}
        self.held: list[int] = []  # what our queues held when the TAKEs left (``here``'s order)
        self.held_here = 0  # their sum
        self.held_others = 0  # the sum of what the other owners' answers said they held
        # those answers (what each queue of that owner held, by owner)
        self.answers: dict[int, list[int]] = {}
        # our queues held jobs when the TAKEs left: they carry hints and the answers
        # what each queue held (else our part is none, whatever the others hold)
        self.hinted = False
        self.token = 0
        self.slot: PendingReply | None = None
        self.blocked_at: dict[int, list[bytes]] = {}
        self.timeout_key = 0  # its TIMEOUT's bucket (``Timeouts``), 0: none armed
        self.done = False
        self.flushed = False  # released by DEBUG FLUSHALL / CLUSTER RESET
        self.retakes = 0  # rounds of TAKEs asked again (``_retake``)

    def start(self) -> Any:
        """Fast paths: the other owners' queues known empty (ours answer alone), or
        settled by our leading queues, answered at once; else the TAKEs leave
        (PENDING) and our part is taken when they are answered."""
        w, spec = self.w, self.spec
        here = self.here
        # no reply outstanding: every earlier command of the client has run (hints.py)
        quiet = self.conn.unfilled == 0
        if quiet and self._others_known_empty():
            return self._here_alone()
        if here:
            hinted = self._measure()
            owner, lead = self.runs[0]
            if hinted and owner == w.index and spec.count <= len(lead) and \
                    self._leading_with_jobs(lead) >= spec.count:
                # COUNT distinct queues of ours with a job lead: the first pass fills it
                return w.shard.op_take(lead, spec.count, spec.withcounters, w.now_ms)
        self.slot = self.conn.defer()
        self.conn.waiters.add(self)
        self._step(quiet)
        return PENDING

    def _leading_with_jobs(self, lead: list[bytes]) -> int:
        """How many distinct queues of ``lead`` (our first run: ``here``'s start) hold a job."""
        held = self.held
        return len({lead[i] for i in range(len(lead)) if held[i]})

    def _measure(self) -> bool:
        """What each of our queues holds now (``held``, the hints of the TAKEs): whether
        any holds a job (``hinted``)."""
        held = self.w.shard.op_takeable(self.here, self.w.now_ms)
        total = 0
        for n in held:
            total += n
        self.held = held
        self.held_here = total
        self.hinted = total > 0
        return total > 0

    def _others_known_empty(self) -> bool:
        """Every queue of another owner is known empty (hints.py): none is asked
        (each counted skipped), as if each had answered that they hold nothing."""
        hints = self.registry.hints
        for queues in self.remote.values():
            if not hints.known_empty(queues):
                return False
        hints.skipped += len(self.remote)
        return True

    def _here_alone(self) -> Any:
        """The other owners hold nothing: our queues answer as one shard's would (the
        jobs, or the null reply for NOHANG); a GETJOB that may block waits at every
        owner, as after a take round that found nothing."""
        w, spec = self.w, self.spec
        if self.here:
            got = w.shard.op_take(self.here, spec.count, spec.withcounters, w.now_ms)
            if got:
                return got
        if spec.nohang:
            return NULL_ARRAY
        return self.wait_here()

    def wait_here(self) -> Any:
        """Every queue is ours and had nothing for a GETJOB that may block: wait at
        our shard (PENDING), or ERR_LEAVING on a leaving node, which blocks no client
        (reference 03). The router calls it after its own take."""
        if self.w.leaving():
            return ERR_LEAVING
        self.slot = self.conn.defer()
        self.conn.waiters.add(self)
        self._block()
        return PENDING

    def _step(self, quiet: bool) -> None:
        """Ask every other owner at once: one TAKE each (with what our queues hold when
        they hold jobs, so that it takes its exact part of the one-shard answer and
        tells what its queues held); ours is taken when all have answered
        (``_gathered``). ``quiet`` (the client has no reply outstanding): an owner
        whose queues are all known empty (hints.py) is not asked, as if it had
        answered that they hold nothing (their sizes 0); a GETJOB that then blocks
        still waits at every owner (``_block``)."""
        w, spec = self.w, self.spec
        remote = self.remote
        known = self.registry.hints
        asked = list(remote)
        if quiet and len(asked) > 1:  # all of them known empty: ``start`` saw it
            asked = [owner for owner in asked if not known.known_empty(remote[owner])]
            known.skipped += len(remote) - len(asked)
        self.asked = len(asked)
        if not asked:
            self._gathered(spec.count)  # every queue is ours (not from the router)
            return
        mesh = w.mesh
        for owner in asked:
            queues = remote[owner]
            if quiet:  # a client that could skip (a pipelining one pays nothing here)
                known.saw(queues)
            hints = self._hints(owner) if self.hinted else None
            # a partial, not a closure: nothing left for the cycle collector
            mesh.take(owner, spec.count, spec.withcounters, hints, queues,
                      partial(self._remote_took, owner, queues))

    def _hints(self, to: int) -> list[int]:
        """One per queue named, in the client's order (``take_share``): -1 for the
        queues of owner ``to``, what ours hold (a queue named again: -2 - its first
        place), 0 for the other owners'."""
        me = self.w.index
        hints: list[int] = []
        plan = self.plan
        if plan.is_distinct():  # no queue named twice: ours from ``held``, place by place
            held = self.held
            owner_at, index_at = plan.owner_at, plan.index_at
            for p in range(len(owner_at)):
                owner = owner_at[p]
                if owner == me:
                    hints.append(held[index_at[p]])
                else:
                    hints.append(-1 if owner == to else 0)
            return hints
        sizes = self._sizes()
        repeats = len(sizes) != len(self.here)  # one of our queues is named twice
        first: dict[bytes, int] | None = None
        for owner, queues in self.runs:
            if owner == to:
                for _ in queues:
                    hints.append(-1)
            elif owner != me:
                for _ in queues:
                    hints.append(0)
            elif not repeats:
                for q in queues:
                    hints.append(sizes[q])
            else:
                for q in queues:
                    if first is None:
                        first = {}
                    at = first.get(q)
                    if at is None:
                        first[q] = len(hints)
                        hints.append(sizes[q])
                    else:  # named again: the same jobs, never counted twice
                        hints.append(-2 - at)
        return hints

    def _remote_took(self, owner: int, queues: list[bytes], blob: bytes) -> None:
        """A take's answer (``pack_took``: what each of its queues held when hinted, the
        jobs taken; empty when neither, or when that worker is down: its queues count
        as empty)."""
        took: Took | None = None
        if blob:
            held, qidx, lens, start = unpack_took(blob)
            if held:
                self.held_others += sum(held)
                self.answers[owner] = held
            if lens:
                took = Took(owner, queues, qidx, lens, blob, start)
        if self.done:
            if took is not None:
                self.registry.return_ids(owner, took.ids())
            return
        if took is not None:
            self.taken.append(took)
        self.asked -= 1
        if self.asked == 0:
            self.w.now_ms = wall_ms()
            self._gathered(-1)

    def _gathered(self, share: int) -> None:
        """Every owner answered: take our exact part (``part_of``: from what every
        queue held), then the jobs a single worker would have given, any surplus (a
        queue that changed meanwhile) handed back uncounted; or block when all
        were empty."""
        w, spec = self.w, self.spec
        here = self.here
        got: list[Any] = []
        if here:
            if share < 0:
                share = self._our_part() if self.hinted else 0
            # even for 0 jobs: a take creates the queues it names, as one shard's GETJOB does
            got = w.shard.op_take(here, share, spec.withcounters, w.now_ms)
        taken, self.taken = self.taken, []
        if len(got) < share and self.retakes < retakes_max and self._short(got, taken):
            self._retake(got, taken)
            return
        if not taken:
            if got:
                self._finish(got)
            elif spec.nohang:
                self._finish(NULL_ARRAY)
            elif w.leaving():
                self._finish(ERR_LEAVING)
            else:
                self._block()
            return
        if not got and len(taken) == 1:  # one take had jobs: already in one shard's order
            self._finish(taken[0].reply())
            return
        merged = merge_by_place(self.plan, got, taken, spec.count)
        if merged is not None:
            self._finish(merged)
            return
        takes = [(t.owner, t.names(), t.parts()) for t in taken]
        if got:
            takes.append((w.index, [e[0] for e in got], [entry_resp(e) for e in got]))
        chosen, surplus = pick_round_robin(spec.queues, takes, spec.count)
        for owner, parts in surplus.items():
            self.registry.return_ids(owner, ids_in(b"".join(parts), len(parts)))
        self._finish(b"*%d\r\n" % len(chosen) + b"".join(chosen))

    def _our_part(self) -> int:
        """Our part of the one-shard answer (``part_of``), from what every queue held:
        all our jobs when every job is in it (the sums, no queue named twice)."""
        spec = self.spec
        count = spec.count
        if self.plan.is_distinct():
            if self.held_here + self.held_others <= count:
                return self.held_here
            part = self._first_pass_part(count)
            if part >= 0:
                return part
        return part_of(spec.queues, self._sizes(), set(self.here), count)

    def _first_pass_part(self, count: int) -> int:
        """Our part when the first pass (one job per queue holding one, left to right)
        fills ``count``, read place by place from ``held`` and the answers; else -1."""
        me = self.w.index
        plan = self.plan
        owner_at, index_at = plan.owner_at, plan.index_at
        held, answers = self.held, self.answers
        total = part = 0
        for p in range(len(owner_at)):
            owner = owner_at[p]
            if owner == me:
                n = held[index_at[p]]
            else:
                theirs = answers.get(owner)
                n = theirs[index_at[p]] if theirs is not None else 0
            if n > 0:
                total += 1
                if owner == me:
                    part += 1
                if total >= count:
                    return part
        return -1

    def _sizes(self) -> dict[bytes, int]:
        """What each queue named held, by name: ours when the TAKEs left, the others'
        answers."""
        sizes = self.sizes
        here, held = self.here, self.held
        for i in range(len(held)):
            sizes[here[i]] = held[i]
        remote = self.remote
        for owner, held in self.answers.items():
            queues = remote[owner]
            for i in range(len(queues)):
                sizes[queues[i]] = held[i]
        return sizes

    def _short(self, got: list[Any], taken: list[Took]) -> bool:
        """Our queues gave fewer jobs than the hints the TAKEs carried said (another
        GETJOB took them since, one pipelined before this one among them): is the
        answer then short of what one shard gives, the other owners holding more than
        they took for it?"""
        spec = self.spec
        from_others = 0
        for t in taken:
            from_others += len(t.lens)
        if len(got) + from_others >= spec.count:
            return False
        mine = set(self.here)
        held = 0
        for q, n in self._sizes().items():
            if q not in mine:
                held += n
        return held > from_others

    def _retake(self, got: list[Any], taken: list[Took]) -> None:
        """Ask again with what our queues hold now: every job this round took goes back
        to its queue uncounted (``op_return``), then the TAKEs leave anew. Bounded by
        ``retakes_max``: past it the short answer stands (no job is lost or given twice)."""
        self.retakes += 1
        jobs = self.registry
        if got:
            jobs.return_ids(self.w.index, [e[1] for e in got])
        for t in taken:
            jobs.return_ids(t.owner, t.ids())
        self.sizes = {}
        self.answers = {}
        self.held_others = 0
        self.w.now_ms = wall_ms()
        self._measure()
        self._step(False)  # our reply is outstanding: no skip (hints.py)

    def _block(self) -> None:
        w = self.w
        self.token = w.new_token()
        self.registry.waiting[self.token] = self
        for owner, queues in self.runs:
            self.blocked_at.setdefault(owner, []).extend(queues)
        for owner, queues in self.blocked_at.items():
            self._block_at(owner, queues)
        timeout_ms = self.spec.timeout_ms
        if timeout_ms and not self.done:
            self.timeout_key = self.registry.timeouts.arm(self, timeout_ms, w.now_ms)

    def _block_at(self, owner: int, queues: list[bytes]) -> None:
        w = self.w
        if owner == w.index:
            w.tokens[self.token] = self._woken_here
            w.shard.op_block(self.token, queues, self.spec.count, self.spec.withcounters, w.now_ms)
        else:
            meta = {"t": self.token, "c": self.spec.count, "w": self.spec.withcounters}
            w.mesh.send(owner, meshmod.K_BLOCK, meta, queues)

    def reblock(self, peer: int) -> None:
        """A peer (re)connected: it lost our waiter if it restarted."""
        if not self.done and peer in self.blocked_at:
            self._block_at(peer, self.blocked_at[peer])

    def _woken_here(self, entries: Any) -> None:
        self.woken(self.w.index, entries)

    def woken(self, owner: int, answer: Any) -> None:
        """Jobs from an owner this GETJOB blocked at (entries from our shard, a
        ``Took`` from another owner), or the error that released the waiter there
        (-LEAVING, an ``Error``)."""
        if isinstance(answer, Error):
            if not self.done:
                self._finish(answer, woken_by=owner)
            return
        if self.done:
            self.registry.return_ids(owner, answer.ids() if type(answer) is Took else [e[1] for e in answer])
            return
        if not (answer.lens if type(answer) is Took else answer):
            return
        self._finish(answer.reply() if type(answer) is Took else answer, woken_by=owner)

    def timed_out(self) -> None:
        """Its TIMEOUT ended (``Timeouts``), or a flush released it: the null reply."""
        self.timeout_key = 0
        if not self.done:
            self._finish(NULL_ARRAY)

    def release(self) -> None:
        """DEBUG FLUSHALL / CLUSTER RESET: answered as on timeout (the reference's
        flushServerData unblocks GETJOB clients with the timeout reply). Its UNBLOCKs
        say so: an owner that took our BLOCK after its own flush (the two come from
        different workers, in no set order) drops the empty queues it re-created."""
        self.flushed = True
        self._disarm()
        self.timed_out()

    def _finish(self, reply: Any, woken_by: int = -1) -> None:
        """``reply``: the answer's value, or its bytes (``Took.reply``, a merge)."""
        self.done = True
        self._unblock(skip=woken_by)
        conn = self.conn
        conn.waiters.discard(self)
        if self.slot is not None:
            data = reply if type(reply) is bytes else encode_getjob(reply, self.spec.withcounters, conn.resp3)
            conn.fill(self.slot, data)

    def _disarm(self) -> None:
        if self.timeout_key:
            self.registry.timeouts.disarm(self.timeout_key, self.token)
            self.timeout_key = 0

    def cancel(self) -> None:
        """The client went away: nothing will be delivered to it."""
        if not self.done:
            self.done = True
            self._unblock()
            for took in self.taken:  # other owners' answers (ours is taken last)
                self.registry.return_ids(took.owner, took.ids())
            self.taken = []

    def _unblock(self, skip: int = -1) -> None:
        w = self.w
        self._disarm()
        if not self.token:
            return
        self.registry.waiting.pop(self.token, None)
        for owner in self.blocked_at:
            if owner == skip:
                continue
            if owner == w.index:
                w.tokens.pop(self.token, None)
                w.shard.op_unblock(self.token, wall_ms())
            else:
                meta = {"t": self.token, "f": 1} if self.flushed else {"t": self.token}
                w.mesh.send(owner, meshmod.K_UNBLOCK, meta)


def take_share(hints: list[int], own: list[bytes], lengths: dict[bytes, int], count: int) -> int:
    """How many jobs an owner takes for a TAKE: its part of what one shard holding every
    queue would answer (one job per queue per pass, left to right, up to ``count``).
    ``hints``: one per queue the client named, in its order: -1 for the owner's own
    queues (``own``, in that order, holding ``lengths``), -2 - i for a queue named
    at place i before, else a lower bound of what that queue holds (0 when unknown).
    Fewer jobs elsewhere and more here can only give this owner more places, so the
    share never falls short of its true part: the coordinator's merge (``pick_round_robin``) still picks the one-shard answer, and
    gives back what is over."""
    mine = sum(lengths.values())
    if mine + sum(h for h in hints if h > 0) <= count:  # every job is in the answer
        return mine
    if len(lengths) == len(own):  # none of ours named twice: does the first pass settle it?
        part = _first_pass_share(hints, [lengths[q] for q in own], count)
        if part >= 0:
            return part
    left: dict[Any, int] = {}
    keys: list[Any] = []
    j = 0
    for i, hint in enumerate(hints):
        if hint == -1:
            name = own[j]
            j += 1
            if name not in left:
                left[name] = lengths.get(name, 0)
            keys.append(name)
        elif hint < -1 and -2 - hint < i:
            keys.append(keys[-2 - hint])  # the same queue as at that place
        else:
            left[i] = max(hint, 0)  # an int key: never one of the owner's names (bytes)
            keys.append(i)
    return _mine_in_passes([k for k in keys if left[k] > 0], left, set(own), count)


def share_of_held(hints: list[int], own: list[bytes], held: list[int], count: int) -> int:
    """``take_share`` from what each of the owner's queues holds (``held``, in ``own``'s
    order): read from the list when none of them is named twice (all of them when
    every job named is in the answer, else the first pass when it settles it)."""
    if len(set(own)) == len(own):
        total = 0
        for n in held:
            total += n
        mine = total
        for h in hints:
            if h > 0:
                total += h
        if total <= count:
            return mine
        part = _first_pass_share(hints, held, count)
        if part >= 0:
            return part
    lengths: dict[bytes, int] = {}
    for i in range(len(own)):
        lengths[own[i]] = held[i]
    return take_share(hints, own, lengths, count)


def _first_pass_share(hints: list[int], held: list[int], count: int) -> int:
    """The owner's part when the first pass (one job per queue holding one, left to
    right) fills ``count`` (``take_share``'s hints; ``held``: what the owner's queues
    hold, none named twice); else -1, and -1 at a queue named twice."""
    total = part = j = 0
    for hint in hints:
        if hint == -1:
            if held[j] > 0:
                total += 1
                part += 1
            j += 1
        elif hint > 0:
            total += 1
        elif hint < -1:
            return -1  # a queue named twice: the general count
        if total >= count:
            return part
    return -1


def part_of(queues: list[bytes], sizes: dict[bytes, int], mine: set[bytes], count: int) -> int:
    """How many of the jobs one shard holding every queue would answer (one job per
    queue per pass, left to right, up to ``count``) come from the queues in ``mine``;
    ``sizes``: what each queue holds (a queue not in it: none)."""
    total = part = 0
    for q, n in sizes.items():
        total += n
        if q in mine:
            part += n
    if total <= count:  # every job is in the answer
        return part
    if len(sizes) == len(queues):  # no queue named twice: does the first pass settle it?
        total = part = 0
        for q in queues:
            if sizes[q] > 0:
                total += 1
                if q in mine:
                    part += 1
                if total >= count:
                    return part
    left: dict[Any, int] = dict(sizes)
    return _mine_in_passes([q for q in queues if left.get(q, 0) > 0], left, mine, count)


def _mine_in_passes(active: list[Any], left: dict[Any, int], mine: set[Any], count: int) -> int:
    """One job per queue per pass over ``active`` (left to right; ``left``: what each
    still holds), up to ``count`` jobs: how many come from the queues in ``mine``."""
    total = part = 0
    while active:
        again: list[Any] = []
        for k in active:
            n = left[k]
            if n <= 0:
                continue  # a queue named twice, emptied earlier in this pass
            left[k] = n - 1
            total += 1
            if k in mine:
                part += 1
            if total >= count:
                return part
            if n > 1:
                again.append(k)
        active = again
    return part


def encode_getjob(reply: Any, withcounters: bool, resp3: bool) -> bytes:
    """GETJOB's reply in the client's protocol: the jobs by the dedicated encoder (the
    same bytes in RESP2 and RESP3), anything else by the generic one."""
    if reply is NULL_ARRAY:
        return NULL3 if resp3 else NULL_ARRAY2
    if type(reply) is list and not withcounters:
        return encode_jobs(reply)
    return encode(reply, resp3)


def merge_by_place(plan: Plan, got: list[Any], taken: list[Took], count: int) -> bytes | None:
    """The usual merge, every job taken in the answer: the reply's bytes, each job at its
    place in one shard's order (its pass: how many of its queue's jobs came before it in
    its owner's pop order; then its queue's place in the client's order, from ``plan``),
    our ``got`` entries encoded once, the other owners' (``taken``, of ``plan``'s
    queues) spliced as they came. None for the rest (``pick_round_robin``): a queue
    named twice, more jobs than ``count`` (a surplus), more than ``merge_passes_max``
    passes."""
    total = len(got)
    for t in taken:
        total += len(t.lens)
    if total > count or not plan.is_distinct():
        return None
    n = len(plan.owner_at)
    seen = [0] * n  # jobs placed so far per place: the next one's pass
    slots: list[bytes | None] = [None] * n  # pass-major: pass k of place i at k * n + i
    here, here_at = plan.here, plan.here_at
    i = 0
    for e in got:  # in our pop order: each one's queue found walking on from the last one's
        i = _walk_to(here, i, e[0])
        if i < 0 or not _lay(slots, seen, here_at[i], entry_resp(e)):
            return None
    for t in taken:
        places = plan.remote_at.get(t.owner)
        if places is None or t.queues is not plan.remote[t.owner]:
            return None
        qidx, lens, data = t.qidx, t.lens, t.data
        start = t.start
        for j in range(len(lens)):
            end = start + lens[j]
            if not _lay(slots, seen, places[qidx[j]], data[start:end]):
                return None
            start = end
    out = [b"*%d\r\n" % total]
    for part in slots:
        if part is not None:
            out.append(part)
    return b"".join(out)


def _walk_to(queues: list[bytes], i: int, name: bytes) -> int:
    """The first place of ``name`` in ``queues`` walking on (round) from place ``i``; -1
    when it is not named."""
    n = len(queues)
    steps = 0
    while queues[i] != name:
        steps += 1
        if steps >= n:
            return -1
        i = i + 1 if i + 1 < n else 0
    return i


def _lay(slots: list[bytes | None], seen: list[int], at: int, part: bytes) -> bool:
    """Lay the next job of place ``at`` in its pass's row of ``slots`` (one row per pass,
    a slot per place, added as needed); False past ``merge_passes_max`` rows."""
    n = len(seen)
    k = seen[at]
    if k * n >= len(slots):
        if k >= merge_passes_max:
            return False
        slots.extend([None] * n)
    seen[at] = k + 1
    slots[k * n + at] = part
    return True


def pick_round_robin(
    queues: list[bytes], taken: list[tuple[int, list[bytes], list[Any]]], count: int
) -> tuple[list[Any], dict[int, list[Any]]]:
    """What one shard holding every queue would have answered (one job per queue per
    pass, left to right, up to ``count``: the reference's order) from what each owner
    took (``taken``: (owner, each job's queue, the jobs), each owner's jobs in its pop
    order, which is enough: the answer's jobs of any owner are a prefix of its own
    passes), and the surplus by owner."""
    # each queue's jobs, last first: a pass pops from the end (a queue named twice is
    # one list at both places: the same jobs, as in a shard's take)
    by_queue: dict[bytes, list[Any]] = {}
    total = 0
    for _, names, items in taken:
        total += len(items)
        for i in range(len(names)):
            jobs = by_queue.get(names[i])
            if jobs is None:
                by_queue[names[i]] = [items[i]]
            else:
                jobs.append(items[i])
    if total > len(by_queue):  # some queue gave several: each list last job first
        for jobs in by_queue.values():
            jobs.reverse()
    active: list[list[Any]] = []
    for q in queues:
        jobs = by_queue.get(q)
        if jobs is not None:
            active.append(jobs)
    chosen: list[Any] = []
    while active and len(chosen) < count:
        again: list[list[Any]] = []
        for jobs in active:
            if jobs:
                chosen.append(jobs.pop())
                if len(chosen) >= count:
                    break
                if jobs:
                    again.append(jobs)
        active = again
    surplus: dict[int, list[Any]] = {}
    if len(chosen) < total:  # the rare path: some owner took more than its part
        for owner, names, _ in taken:
            for name in dict.fromkeys(names):
                rest = by_queue.pop(name, None)
                if rest:
                    rest.reverse()  # back in pop order
                    surplus.setdefault(owner, []).extend(rest)
    return chosen, surplus


def took_bytes(queues: list[bytes], held: list[int], entries: list[list[Any]]) -> bytes:
    """An owner's answer to a TAKE or for a WAKE (``pack_took``): ``held``, then the
    ``entries`` its shard gave, each with its queue's place in ``queues``."""
    n = len(queues)
    qidx = [0] * len(entries) if n == 1 else _places_walked(queues, entries)
    if qidx is None:
        at: dict[bytes, int] = {}
        for i in range(n):
            if queues[i] not in at:
                at[queues[i]] = i
        qidx = [at[e[0]] for e in entries]
    return pack_took(held, qidx, [entry_resp(e) for e in entries])


def _places_walked(queues: list[bytes], entries: list[list[Any]]) -> list[int] | None:
    """Each entry's queue's place in ``queues`` for a take of at most one job per queue
    named (one pass, in the take's order): found walking on from the last one's, with
    no table; any place of a queue named twice will do (the coordinator reads its
    name). None for a longer take, or an entry of a queue not named."""
    n = len(queues)
    if len(entries) > n:
        return None
    out: list[int] = []
    i = 0
    for e in entries:
        i = _walk_to(queues, i, e[0])
        if i < 0:
            return None
        out.append(i)
    return out


def ids_in(data: bytes, n: int) -> list[str]:
    """The job IDs of ``n`` GETJOB entries, RESP one after the other (jobs given back:
    the rare path)."""
    reader = hiredis.Reader()
    reader.feed(data)
    return [reader.gets()[1].decode() for _ in range(n)]
