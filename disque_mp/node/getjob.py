"""GETJOB coordination: one client's GETJOB over queues that may belong to
several workers (docs/architecture.md, "Invariants": every owner asked at
once, the answers merged in the order one shard would give, a waiter at each
owner when all are empty, the first job offered wins, any surplus handed back
to its owner uncounted, waiters cancelled when the client leaves or times out).

A ``GetJob`` lives on the worker that holds the client's connection; it talks
to its own shard directly and to the other owners over the mesh (TAKE, BLOCK,
UNBLOCK, RETURN; the owners answer with REPLY and WAKE). ``GetJobs`` keeps the
worker's blocked ones by token: the mesh handler (``peers.py``) hands it the
owners' WAKEs and peer reconnections, DEBUG FLUSHALL releases them all."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from bus import mesh as meshmod
from bus.clock import wall_ms
from bus.mesh import unpack
from disque_mp.node.connection import ClientConn, PendingReply
from disque_mp.node.core import WorkerCore
from disque_mp.node.errors import ERR_LEAVING
from disque_mp.node.resp import NULL3, NULL_ARRAY2, encode, encode_jobs
from workers.replies import NULL_ARRAY, PENDING, Error

Runs = list[tuple[int, list[bytes]]]  # (owner, its queues): consecutive queues of one owner


class GetJobs:
    """The GETJOBs worker ``w`` coordinates and that wait (by token)."""

    def __init__(self, w: WorkerCore) -> None:
        self.w = w
        self.waiting: dict[int, GetJob] = {}

    def on_wake(self, peer: int, meta: dict[str, Any], bodies: list[bytes]) -> None:
        """An owner's WAKE: jobs (or the error) for one of ours, else given back."""
        entries = unpack(meta.get("v"), bodies)
        job = self.waiting.get(meta["t"])
        if job is None:
            if not isinstance(entries, Error):
                self.return_jobs(peer, entries)
        else:
            job.woken(peer, entries)

    def on_peer_up(self, peer: int) -> None:
        for job in list(self.waiting.values()):
            job.reblock(peer)

    def release_all(self) -> None:
        """DEBUG FLUSHALL and CLUSTER RESET: each answered as on timeout."""
        for job in list(self.waiting.values()):
            job.release()

    def return_jobs(self, owner: int, entries: list[Any]) -> None:
        """Give back jobs taken for a GETJOB that no longer wants them."""
        if not entries:
            return
        w = self.w
        ids = [str(e[1]) for e in entries]
        if owner == w.index:
            w.shard.op_return(ids, wall_ms())
            w.drain_effects()
        else:
            w.mesh.send(owner, meshmod.K_RETURN, {}, [i.encode() for i in ids])


class GetJob:
    """One GETJOB coordinated by this worker (docs/architecture.md, "Invariants")."""

    __slots__ = ("w", "jobs", "conn", "spec", "runs", "asked", "taken", "here", "sizes", "token", "slot",
                 "blocked_at", "timer", "done", "flushed")

    def __init__(self, jobs: GetJobs, conn: ClientConn, spec: Any, runs: Runs) -> None:
        """``runs``: the queues cut into runs of one owner, in the client's order."""
        self.w = jobs.w
        self.jobs = jobs
        self.conn = conn
        self.spec = spec
        self.runs = runs
        self.asked = 0  # other owners whose TAKE is unanswered
        self.taken: list[tuple[int, list[Any]]] = []  # (owner, entries) of each take with jobs
        self.here: list[bytes] = []  # our queues, in the client's order
        # what each queue named could give (our queues when the TAKEs left, the others'
        # from their answers): the one-shard answer's split between the owners
        self.sizes: dict[bytes, int] = {}
        self.token = 0
        self.slot: PendingReply | None = None
        self.blocked_at: dict[int, list[bytes]] = {}
        self.timer: asyncio.TimerHandle | None = None
        self.done = False
        self.flushed = False  # released by DEBUG FLUSHALL / CLUSTER RESET

    def start(self) -> Any:
        """Fast path: settled by our leading queues and answered at once; else the
        TAKEs leave (PENDING) and our part is taken when they are answered."""
        w, spec = self.w, self.spec
        here: list[bytes] = []
        for owner, queues in self.runs:
            if owner == w.index:
                here += queues
        self.here = here
        sizes = self.sizes
        held = w.shard.op_takeable(here)
        for i in range(len(here)):
            sizes[here[i]] = held[i]
        owner, lead = self.runs[0]
        if owner == w.index and spec.count <= len(lead) and \
                len({q for q in lead if sizes[q]}) >= spec.count:
            # COUNT distinct queues of ours with a job lead: the first pass fills it
            return w.shard.op_take(lead, spec.count, spec.withcounters, w.now_ms)
        self.slot = self.conn.defer()
        self.conn.waiters.add(self)
        self._step()
        return PENDING

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

    def _step(self) -> None:
        """Ask every other owner at once: one TAKE each, with what our queues hold,
        so that it takes its exact part of the one-shard answer and tells what its
        queues held; ours is taken when all have answered (``_gathered``)."""
        w, spec = self.w, self.spec
        remote: dict[int, list[bytes]] = {}
        for owner, queues in self.runs:
            if owner != w.index:
                got = remote.get(owner)
                if got is None:
                    remote[owner] = list(queues)
                else:
                    got += queues
        self.asked = len(remote)
        if not remote:
            self._gathered(spec.count)  # every queue is ours (not from the router)
            return
        sizes = self.sizes
        for owner, queues in remote.items():
            meta: dict[str, Any] = {"c": spec.count, "w": spec.withcounters,
                                    "k": self._hints(owner, sizes)}
            w.mesh.request(owner, meshmod.K_TAKE, meta, queues, self._take_reply(owner, queues))

    def _hints(self, to: int, sizes: dict[bytes, int]) -> list[int]:
        """One per queue named, in the client's order (``take_share``): -1 for the
        queues of owner ``to``, what ours hold (a queue named again: -2 - its first
        place), 0 for the other owners'."""
        me = self.w.index
        hints: list[int] = []
        first: dict[bytes, int] | None = None
        repeats = len(sizes) != len(self.here)  # one of our queues is named twice
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

    def _take_reply(self, owner: int, queues: list[bytes]) -> Callable[[dict[str, Any], list[bytes]], None]:
        return lambda meta, bodies: self._remote_took(owner, queues, unpack(meta.get("v"), bodies))

    def _remote_took(self, owner: int, queues: list[bytes], answer: Any) -> None:
        """A TAKE's answer: [the jobs taken, what each of its queues held], or an
        ``Error`` when that worker is down (then its queues count as empty)."""
        entries: list[Any] = []
        if not isinstance(answer, Error):
            entries = answer[0]
            held: list[int] = answer[1]
            sizes = self.sizes
            for i in range(len(queues)):
                sizes[queues[i]] = held[i]
        if self.done:
            self.jobs.return_jobs(owner, entries)
            return
        if entries:
            self.taken.append((owner, entries))
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
        if here:
            if share < 0:
                share = part_of(spec.queues, self.sizes, set(here), spec.count)
            # even for 0 jobs: a take creates the queues it names, as one shard's GETJOB does
            got = w.shard.op_take(here, share, spec.withcounters, w.now_ms)
            if got:
                self.taken.append((w.index, got))
        taken, self.taken = self.taken, []
        if len(taken) == 1:  # one take had jobs: already in one shard's order
            self._finish(taken[0][1])
            return
        if not taken:
            if spec.nohang:
                self._finish(NULL_ARRAY)
            elif w.leaving():
                self._finish(ERR_LEAVING)
            else:
                self._block()
            return
        chosen, surplus = pick_round_robin(spec.queues, taken, spec.count)
        for owner, entries in surplus.items():
            self.jobs.return_jobs(owner, entries)
        self._finish(chosen)

    def _block(self) -> None:
        w = self.w
        self.token = w.new_token()
        self.jobs.waiting[self.token] = self
        for owner, queues in self.runs:
            self.blocked_at.setdefault(owner, []).extend(queues)
        for owner, queues in self.blocked_at.items():
            self._block_at(owner, queues)
        timeout_ms = self.spec.timeout_ms
        if timeout_ms and not self.done:
            self.timer = w.loop.call_later(timeout_ms / 1000, self._timeout)

    def _block_at(self, owner: int, queues: list[bytes]) -> None:
        w = self.w
        if owner == w.index:
            w.tokens[self.token] = lambda entries: self.woken(w.index, entries)
            w.shard.op_block(self.token, queues, self.spec.count, self.spec.withcounters, w.now_ms)
        else:
            meta = {"t": self.token, "c": self.spec.count, "w": self.spec.withcounters}
            w.mesh.send(owner, meshmod.K_BLOCK, meta, queues)

    def reblock(self, peer: int) -> None:
        """A peer (re)connected: it lost our waiter if it restarted."""
        if not self.done and peer in self.blocked_at:
            self._block_at(peer, self.blocked_at[peer])

    def woken(self, owner: int, entries: Any) -> None:
        """Jobs from an owner this GETJOB blocked at, or the error that released the
        waiter there (-LEAVING): a list of entries or an ``Error``."""
        if isinstance(entries, Error):
            if not self.done:
                self._finish(entries, woken_by=owner)
            return
        if self.done:
            self.jobs.return_jobs(owner, entries)
            return
        if not entries:
            return
        self._finish(entries, woken_by=owner)

    def _timeout(self) -> None:
        self.timer = None
        if not self.done:
            self._finish(NULL_ARRAY)

    def release(self) -> None:
        """DEBUG FLUSHALL / CLUSTER RESET: answered as on timeout (the reference's
        flushServerData unblocks GETJOB clients with the timeout reply). Its UNBLOCKs
        say so: an owner that took our BLOCK after its own flush (the two come from
        different workers, in no set order) drops the empty queues it re-created."""
        self.flushed = True
        self._timeout()

    def _finish(self, reply: Any, woken_by: int = -1) -> None:
        self.done = True
        self._unblock(skip=woken_by)
        conn = self.conn
        conn.waiters.discard(self)
        if self.slot is not None:
            conn.fill(self.slot, encode_getjob(reply, self.spec.withcounters, conn.resp3))

    def cancel(self) -> None:
        """The client went away: nothing will be delivered to it."""
        if not self.done:
            self.done = True
            self._unblock()
            for owner, entries in self.taken:  # other owners' answers (ours is taken last)
                self.jobs.return_jobs(owner, entries)
            self.taken = []

    def _unblock(self, skip: int = -1) -> None:
        w = self.w
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.token:
            return
        self.jobs.waiting.pop(self.token, None)
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


def pick_round_robin(
    queues: list[bytes], taken: list[tuple[int, list[Any]]], count: int
) -> tuple[list[Any], dict[int, list[Any]]]:
    """What one shard holding every queue would have answered (one job per queue per
    pass, left to right, up to ``count``: the reference's order) from what each owner
    took (``taken``: (owner, entries), each owner's entries in its pop order, which is
    enough: the answer's jobs of any owner are a prefix of its own passes), and the
    surplus by owner."""
    by_queue: dict[bytes, deque[Any]] = {}
    owner_of: dict[bytes, int] = {}
    for owner, entries in taken:
        for e in entries:
            name = e[0]
            if type(name) is not bytes:
                name = str(name).encode()
            jobs = by_queue.get(name)
            if jobs is None:
                jobs = by_queue[name] = deque()
                owner_of[name] = owner
            jobs.append(e)
    chosen: list[Any] = []
    # a queue named twice is the same deque at both places, as in a shard's take
    active = [jobs for jobs in map(by_queue.get, queues) if jobs is not None]
    while active and len(chosen) < count:
        again: list[deque[Any]] = []
        for jobs in active:
            if jobs:
                chosen.append(jobs.popleft())
                if len(chosen) >= count:
                    break
                if jobs:
                    again.append(jobs)
        active = again
    surplus: dict[int, list[Any]] = {}
    for name, jobs in by_queue.items():
        if jobs:
            surplus.setdefault(owner_of[name], []).extend(jobs)
    return chosen, surplus
