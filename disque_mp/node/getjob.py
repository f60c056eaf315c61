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
from collections.abc import Callable
from typing import Any

from bus import mesh as meshmod
from bus.clock import wall_ms
from bus.mesh import unpack
from disque_mp.node.connection import ClientConn, PendingReply
from disque_mp.node.core import WorkerCore
from disque_mp.node.errors import ERR_LEAVING
from disque_mp.node.resp import NULL3, NULL_ARRAY2, encode, encode_jobs
from workers.ids import owner_of_job_id
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

    __slots__ = ("w", "jobs", "conn", "spec", "runs", "i", "got", "asked", "taken", "token", "slot",
                 "blocked_at", "timer", "done", "flushed")

    def __init__(self, jobs: GetJobs, conn: ClientConn, spec: Any, runs: Runs) -> None:
        """``runs``: the queues cut into runs of one owner, in the client's order."""
        self.w = jobs.w
        self.jobs = jobs
        self.conn = conn
        self.spec = spec
        self.runs = runs
        self.i = 0
        self.got: list[Any] = []  # taken here, not yet answered
        self.asked = 0  # other owners whose TAKE is unanswered
        self.taken: list[tuple[int, list[Any]]] = []  # (owner, entries) of each take with jobs
        self.token = 0
        self.slot: PendingReply | None = None
        self.blocked_at: dict[int, list[bytes]] = {}
        self.timer: asyncio.TimerHandle | None = None
        self.done = False
        self.flushed = False  # released by DEBUG FLUSHALL / CLUSTER RESET

    def start(self) -> Any:
        """Fast path: everything local and answered at once; else PENDING."""
        reply = self._take_local_prefix()
        if reply is not None:
            return reply
        self.slot = self.conn.defer()
        self.conn.waiters.add(self)
        self._step()
        return PENDING

    def _take_local_prefix(self) -> Any:
        """Take from our leading queues; the answer when that already settles it: COUNT
        jobs from the first pass, so no queue further right could be among them."""
        w, spec = self.w, self.spec
        owner, queues = self.runs[0]
        if owner != w.index:
            return None
        got = self.got = w.shard.op_take(queues, spec.count, spec.withcounters, w.now_ms)
        self.i = 1
        if len(got) >= spec.count and (spec.count == 1 or len({e[0] for e in got}) == len(got)):
            return got
        if got:
            self.taken.append((w.index, got))
        return None

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
        """Ask every owner at once: our other queues inline, one TAKE per other owner
        (each for up to COUNT jobs of its queues, in the client's order)."""
        w, spec = self.w, self.spec
        here: list[bytes] = []
        remote: dict[int, list[bytes]] = {}
        for owner, queues in self.runs[self.i:]:
            if owner == w.index:
                here += queues
            else:
                remote.setdefault(owner, []).extend(queues)
        if here:
            got = w.shard.op_take(here, spec.count, spec.withcounters, w.now_ms)
            if got:
                self.got = self.got + got  # a new list: the prefix's is in self.taken
                self.taken.append((w.index, got))
        self.asked = len(remote)
        if not remote:
            self._gathered()  # every queue is ours (not from the router)
            return
        known = self._known_here()
        for owner, queues in remote.items():
            hints = [-1 if o == owner else k for o, k in known]
            meta: dict[str, Any] = {"c": spec.count, "w": spec.withcounters, "k": hints}
            w.mesh.request(owner, meshmod.K_TAKE, meta, queues, self._take_reply(owner))

    def _known_here(self) -> list[tuple[int, int]]:
        """(owner, jobs it is known to hold) for each queue named, in the client's order:
        what our takes got from our queues (a queue named again: -2 - its first
        place), 0 for the other owners'. A TAKE carries them (``take_share``) so that an owner
        takes about what it can win instead of COUNT jobs, most of them surplus."""
        w = self.w
        got: dict[bytes, int] = {}
        for owner, entries in self.taken:
            if owner == w.index:
                for e in entries:
                    name = e[0] if type(e[0]) is bytes else str(e[0]).encode()
                    got[name] = got.get(name, 0) + 1
        known: list[tuple[int, int]] = []
        first: dict[bytes, int] = {}
        for owner, queues in self.runs:
            for q in queues:
                if owner != w.index:
                    known.append((owner, 0))
                elif q in first:  # named again: the same jobs, never counted twice
                    known.append((owner, -2 - first[q]))
                else:
                    first[q] = len(known)
                    known.append((owner, got.get(q, 0)))
        return known

    def _take_reply(self, owner: int) -> Callable[[dict[str, Any], list[bytes]], None]:
        return lambda meta, bodies: self._remote_took(owner, unpack(meta.get("v"), bodies))

    def _remote_took(self, owner: int, entries: Any) -> None:
        if isinstance(entries, Error):
            entries = []  # that worker is down: serve from the others
        if self.done:
            self.jobs.return_jobs(owner, entries)
            return
        if entries:
            self.taken.append((owner, entries))
        self.asked -= 1
        if self.asked == 0:
            self.w.now_ms = wall_ms()
            self._gathered()

    def _gathered(self) -> None:
        """Every owner answered: the jobs a single worker would have given, the rest
        handed back uncounted; or block when all were empty."""
        w, spec = self.w, self.spec
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
        self.got = chosen
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
            by_owner: dict[int, list[Any]] = {}
            for entry in self.got:
                by_owner.setdefault(self._owner_of(entry), []).append(entry)
            for owner, entries in by_owner.items():
                self.jobs.return_jobs(owner, entries)
            for owner, entries in self.taken:
                if owner != self.w.index:  # ours are in self.got
                    self.jobs.return_jobs(owner, entries)
            self.got = []
            self.taken = []

    def _owner_of(self, entry: Any) -> int:
        return owner_of_job_id(str(entry[1]), self.w.workers)

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
    total = mine = 0
    active = [k for k in keys if left[k] > 0]
    while active:
        again: list[Any] = []
        for k in active:
            n = left[k]
            if n <= 0:
                continue  # a queue named twice, emptied earlier in this pass
            left[k] = n - 1
            total += 1
            if type(k) is bytes:
                mine += 1
            if total >= count:
                return mine
            if n > 1:
                again.append(k)
        active = again
    return mine


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
    by_queue: dict[bytes, list[Any]] = {}
    owner_of: dict[bytes, int] = {}
    for owner, entries in taken:
        for e in entries:
            name = e[0] if type(e[0]) is bytes else str(e[0]).encode()
            by_queue.setdefault(name, []).append(e)
            owner_of[name] = owner
    next_of = dict.fromkeys(by_queue, 0)
    chosen: list[Any] = []
    while len(chosen) < count:
        before = len(chosen)
        for q in queues:
            jobs = by_queue.get(q)
            if jobs is not None and next_of[q] < len(jobs):
                chosen.append(jobs[next_of[q]])
                next_of[q] += 1
                if len(chosen) >= count:
                    break
        if len(chosen) == before:
            break
    surplus: dict[int, list[Any]] = {}
    for name, jobs in by_queue.items():
        if next_of[name] < len(jobs):
            surplus.setdefault(owner_of[name], []).extend(jobs[next_of[name]:])
    return chosen, surplus
