"""The client side: the path of one client command, on the worker that holds the connection.

``Router.execute(conn, cmd)`` is what ``ClientConn`` calls for every command.
It tries the command's **fast path** first (the common shapes of ADDJOB, GETJOB,
ACKJOB and FASTACK: no table lookup, no generic encoder), else the **general
path**: the command table (``commands/table.py``: arity, AUTH, OOM), then the
route (docs/architecture.md, "Invariants"):

    queue    owner of the queue's slot: inline when it is us, else forwarded on the mesh
    ids      every ID checked first (-BADID), split by owner, ints summed
    getjob   answered here when every queue is ours; else ``GetJob`` (getjob.py)
    scatter  node-wide commands (``commands/info.py``, ``server.py``) gathered from every worker
    local    answered here (``commands/clients.py``, ``server.py``, COMMAND in ``table.py``)

Where a queue- or ID-keyed command goes is decided once, by ``Router.route``: the
one owner of its keys (here, or another worker), an invalid ID, or the split over
several owners; every path (here, one owner, several owners, known empty) starts
from that answer. What runs here is the owner side's (``owner.py``); what goes to
another worker is carried by the asking side (``forward.py``). The router also
keeps the accounting of the commands it answers (``CommandStats``: INFO
commandstats, the slowlog, the counter).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Final

from disque_mp.node.commands import jobs as cmd_jobs
from disque_mp.node.commands.jobs import GetJobArgs
from disque_mp.node.commands.table import TABLE, Command
from disque_mp.node.connection import ClientConn, ClientHost, CmdStat, CommandPath, CommandStats
from disque_mp.node.errors import ERR_BADID, ERR_NOAUTH, ERR_OOM, err_arity, err_unknown
from disque_mp.node.forward import FORWARDED, Forward
from disque_mp.node.getjob import GetJob, GetJobs, Plan, Runs, encode_getjob
from disque_mp.node.owner import Owner
from disque_mp.node.resp import NULL3, NULL_ARRAY2, encode
from workers.ids import owner_of_queue, slot_of_valid_id
from workers.invariant import InvariantError
from workers.replies import PENDING, Error

owner_cache_max = 65536  # queue name -> owner memo; cleared when full (names are unbounded)
# GETJOB plans remembered by the request's bytes (a consumer asks the same queues every
# time): cleared when full, as requests are unbounded; a request over the key bound, or
# of fewer queues than the least, is routed afresh (a few queues cost less than the key).
getjob_plans_max: Final = 256
getjob_plan_key_bytes_max: Final = 8192
getjob_plan_queues_min: Final = 4
NOAUTH_OK: Final = frozenset({"auth", "hello", "quit"})
BADID: Final = -2  # ``Router.route``: a key is not a valid job ID

_perf_ns: Final = time.perf_counter_ns  # INFO commandstats; compiled in, no lookup per command


# The commands ``Router.execute`` runs by their own paths (the table marks them ``fast``).
FAST_NAMES: Final = ("addjob", "getjob", "ackjob", "fastack")


class Router(CommandPath):
    """The per-command path of worker ``w`` (one per worker): ``owner`` runs what
    our shard owns, ``fwd`` carries what other workers own, ``getjobs`` coordinates
    the GETJOBs it cannot answer alone; ``stats`` counts what it answers."""

    def __init__(self, w: ClientHost, stats: CommandStats, owner: Owner, fwd: Forward,
                 getjobs: GetJobs) -> None:
        self.w = w
        self.stats = stats
        self.owner = owner
        self.fwd = fwd
        self.getjobs = getjobs
        self.cfg = w.cfg
        self.index = w.index
        self.workers = w.workers
        self.owner_cache: dict[bytes, int] = {}
        self.getjob_plans: dict[bytes, Any] = {}  # request bytes -> its owner, or its Plan
        self.lookup = self._build_lookup()
        fast = {cmd.name for cmd in TABLE.values() if cmd.fast}
        if fast != set(FAST_NAMES):
            raise InvariantError(f"fast paths {sorted(FAST_NAMES)}, the table says {sorted(fast)}")

    def _build_lookup(self) -> dict[bytes, tuple[Command, Callable[..., Any], CmdStat]]:
        routes = {"queue": self.cmd_queue, "ids": self.cmd_ids, "getjob": self.cmd_getjob}
        out = {}
        for name, cmd in TABLE.items():
            handler = self.cmd_waitjob if name == b"waitjob" else routes.get(cmd.route)
            if handler is None:  # scatter and local: the table's handler, run here
                own = cmd.handler
                if own is None:
                    raise InvariantError(f"command {cmd.name} has no handler")
                handler = functools.partial(own, self.w)
            stat = self.stats.entry(cmd.name)
            entry = (cmd, handler, stat)
            out[name] = entry
            out[name.upper()] = entry
        return out

    def execute(self, conn: ClientConn, cmd: list[bytes]) -> bytes | None:
        """Run one command; its encoded reply, or None when it will come later."""
        # The hot commands' own paths, found by their two usual spellings: compares of
        # bytes and native calls, where a dict of bound methods hashed the name and
        # called through Python's protocol (FAST_NAMES: the table's ``fast`` ones).
        name = cmd[0]
        n = len(name)
        if (n == 6 or n == 7) and conn.authed and not self.w.oom:
            reply: bytes | None = None
            if n == 7:
                if name == b"FASTACK" or name == b"fastack":
                    reply = self._fast_fastack(conn, cmd)
            elif name == b"ADDJOB" or name == b"addjob":
                reply = self._fast_addjob(conn, cmd)
            elif name == b"GETJOB" or name == b"getjob":
                reply = self._fast_getjob(conn, cmd)
            elif name == b"ACKJOB" or name == b"ackjob":
                reply = self._fast_ackjob(conn, cmd)
            if reply is not None:
                return reply or None  # b"": forwarded, the reply comes later
        return self._execute(conn, cmd)

    def _execute(self, conn: ClientConn, cmd: list[bytes]) -> bytes | None:
        """The general path: table lookup, checks, route, generic encoding."""
        entry = self.lookup.get(cmd[0])
        if entry is None:
            entry = self.lookup.get(cmd[0].lower())
            if entry is None:
                return self._unknown(conn, cmd)
        command, handler, stat = entry
        n = len(cmd)
        arity = command.arity
        if (arity > 0 and n != arity) or n < -arity:
            return encode(err_arity(command.name))
        if not conn.authed and command.name not in NOAUTH_OK:
            return encode(ERR_NOAUTH)
        if self.w.oom and "denyoom" in command.flags:
            return encode(ERR_OOM)
        t0 = _perf_ns()
        reply = handler(conn, cmd)
        conn.last_cmd = command.name
        if reply is FORWARDED:  # the owner counts it, as it runs it (``Forward.general``)
            return None
        self.stats.account(stat, t0, cmd)
        if reply is PENDING:
            return None
        return encode(reply, conn.resp3)

    def _unknown(self, conn: ClientConn, cmd: list[bytes]) -> bytes:
        name = cmd[0].lower()
        if name == b"quit":
            conn.closing = True
            conn.close_after_write = True
            return b"+OK\r\n"
        if name == b"post" or name == b"host:":
            return conn.cross_protocol()
        return encode(err_unknown(cmd[0].decode("utf-8", "replace")))

    # ------------------------------------------------------------------ fast paths
    #
    # The common shapes of the hot commands. Each returns the encoded reply, or
    # None before doing anything when the command is not of its shape (options,
    # appendfsync always, a reply that waits for replication): the general path
    # then runs it. None after doing something would run the command twice, so a
    # reply that comes later is never a fast path's, except GETJOB's, whose
    # general path is the same ``getjob`` (b"": the reply comes later). The work
    # done is exactly the general path's for that shape (the same parser and
    # shard call, the same counters); only the table lookup, the route layers and
    # the generic encoder are skipped. ``peers.py`` runs the ``*_here`` parts for
    # the RAW frames other workers forward.

    def _fast_addjob(self, conn: ClientConn, cmd: list[bytes]) -> bytes | None:
        if len(cmd) != 4:
            return None
        if self.workers > 1:
            owner: int = self.route(cmd, 1, 2, False)
            if owner != self.index:
                return self.fwd.raw(conn, owner, cmd, "addjob")
        reply = self.owner.addjob_here(cmd)
        if reply is not None:
            conn.streak = 0
            conn.last_cmd = "addjob"
        return reply

    def _fast_getjob(self, conn: ClientConn, cmd: list[bytes]) -> bytes | None:
        spec = cmd_jobs.parse_getjob(cmd, 1)
        if not isinstance(spec, GetJobArgs):
            return None  # the general path answers the error
        route = self._getjob_route(conn, cmd, spec.queues)
        if spec.nohang and type(route) is int:
            owner: int = route
            if owner != self.index:
                # NOHANG never blocks: its owner answers (we do when known empty); else ``getjob``
                return self._answer_known_empty(conn, owner, cmd, spec.queues) or \
                    self.fwd.raw(conn, owner, cmd, "getjob")
        t0 = _perf_ns()
        reply = self.getjob(conn, spec, route)
        self.stats.count("getjob", t0, cmd)
        conn.last_cmd = "getjob"
        if reply is PENDING:
            return b""
        return encode_getjob(reply, spec.withcounters, conn.resp3)

    def _getjob_route(self, conn: ClientConn, cmd: list[bytes], queues: list[bytes]) -> Any:
        """``route`` of a GETJOB's queues, its split made once (a ``Plan``) and kept by the
        request's bytes, which name the same queues whenever they come again."""
        n = len(queues)
        if self.workers == 1 or n < getjob_plan_queues_min:
            return self.route(queues, 0, n, False)
        key = conn.request_bytes(cmd)
        if not key or len(key) > getjob_plan_key_bytes_max:
            return self.route(queues, 0, n, False)
        plans = self.getjob_plans
        plan = plans.get(key)
        if plan is None:
            if len(plans) >= getjob_plans_max:
                plans.clear()
            route = self.route(queues, 0, n, False)
            plan = plans[key] = route if type(route) is int else Plan(route, self.index)
        return plan

    def _answer_known_empty(self, conn: ClientConn, owner: int, cmd: list[bytes],
                            queues: list[bytes]) -> bytes | None:
        """A NOHANG GETJOB for another owner's queues: when they are known empty (hints.py;
        the client has no reply outstanding) the owner's answer, the null reply, given
        here (counted here, the connection's streak towards the owner kept); else None,
        the queues remembered as existing once the forwarded take has run (by a client
        that could skip: a pipelining one pays nothing here)."""
        if conn.unfilled:
            return None
        hints = self.getjobs.hints
        if not hints.known_empty(queues):
            hints.saw(queues)
            return None
        t0 = _perf_ns()
        hints.skipped += 1
        conn.toward(owner)  # a consumer of another worker's queue moves there
        self.stats.count("getjob", t0, cmd)
        conn.last_cmd = "getjob"
        return NULL3 if conn.resp3 else NULL_ARRAY2

    def _fast_ackjob(self, conn: ClientConn, cmd: list[bytes]) -> bytes | None:
        return self._fast_ack(conn, cmd, False)

    def _fast_fastack(self, conn: ClientConn, cmd: list[bytes]) -> bytes | None:
        return self._fast_ack(conn, cmd, True)

    def _fast_ack(self, conn: ClientConn, cmd: list[bytes], fast: bool) -> bytes | None:
        # ACKJOB / FASTACK id..., every ID valid: ``route``'s one pass over the IDs'
        # bytes checks each (the general path validates in the router and again in
        # cmd_jobs) and finds their owner, or their owners' groups. Only the IDs our
        # shard takes are decoded.
        n = len(cmd)
        if n < 2:
            return None
        route = self.route(cmd, 1, n, True)
        if type(route) is not int:
            return self._split_ack(conn, cmd[0], route, fast)
        owner: int = route
        if owner < 0:
            return None  # the general path answers -BADID
        if owner != self.index:
            return self.fwd.raw(conn, owner, cmd, "fastack" if fast else "ackjob")
        reply = self.owner.ack_here([cmd[i].decode("ascii") for i in range(1, n)], fast, cmd)
        if reply is not None:
            conn.streak = 0
            conn.last_cmd = "fastack" if fast else "ackjob"
        return reply

    def _split_ack(self, conn: ClientConn, name: bytes, groups: dict[int, list[bytes]],
                   fast: bool) -> bytes | None:
        """ACKJOB / FASTACK of valid IDs of several owners (``groups``: each owner's
        IDs): our part on our shard, each other owner's as one forwarded command, the
        counts summed into one reply (``Forward.ack_parts``). The owners count the
        command (commandstats), as for a forwarded one; our part is not counted again."""
        if self.cfg.appendfsync == "always" or self.fwd.holds(conn):
            return None  # our part waits for the AOF / behind held commands: general path
        parts: dict[int, list[bytes]] = {}
        for at, ids in groups.items():
            parts[at] = [name, *ids]
        mine = parts.pop(self.index, None)
        total = self.owner.ack_share(mine, fast) if mine is not None else 0
        conn.streak = 0
        conn.last_cmd = "fastack" if fast else "ackjob"
        return self.fwd.ack_parts(conn, parts, total)

    # ------------------------------------------------------------------ the route

    def owner_of(self, queue: bytes) -> int:
        owner = self.owner_cache.get(queue)
        if owner is None:
            if len(self.owner_cache) >= owner_cache_max:
                self.owner_cache.clear()
            owner = self.owner_cache[queue] = owner_of_queue(queue, self.workers)
        return owner

    def route(self, keys: list[bytes], start: int, end: int, ids: bool) -> Any:
        """Where a command keyed by ``keys[start:end]`` goes, decided once for every
        path: the worker owning every key (an ``int``: ``self.index`` runs it here,
        another index is its one owner), ``BADID`` for a key that is not a valid job
        ID (``ids``: the keys are job IDs, each checked before anything runs), or, the
        keys being of several owners, their split: the job IDs grouped by owner
        (``dict``), the queues cut into runs of consecutive queues of one owner, in
        the client's order (``Runs``: GETJOB's left-to-right priority)."""
        workers = self.workers
        if not ids:
            if workers == 1:
                return self.index
            if end - start == 1:  # one queue (ADDJOB, the ``queue`` route): its owner
                return self.owner_of(keys[start])
        owner = -1
        groups: dict[int, list[bytes]] | None = None
        runs: Runs | None = None
        for i in range(start, end):
            key = keys[i]
            if ids:
                slot = slot_of_valid_id(key)
                if slot < 0:
                    return BADID
                at = slot % workers
            else:
                at = self.owner_of(key)
            if groups is not None:
                part = groups.get(at)
                if part is None:
                    groups[at] = [key]
                else:
                    part.append(key)
            elif runs is not None:
                if runs[-1][0] == at:
                    runs[-1][1].append(key)
                else:
                    runs.append((at, [key]))
            elif owner < 0:
                owner = at
            elif at != owner:
                if ids:
                    groups = {owner: keys[start:i], at: [key]}
                else:
                    runs = [(owner, keys[start:i]), (at, [key])]
        if groups is not None:
            return groups
        if runs is not None:
            return runs
        return owner if owner >= 0 else self.index  # no key: here

    # ------------------------------------------------------------------ route: queue

    def cmd_queue(self, conn: ClientConn, cmd: list[bytes]) -> Any:
        owner: int = self.route(cmd, 1, 2, False)
        return self._run_at(conn, owner, cmd)

    def _run_at(self, conn: ClientConn, owner: int, cmd: list[bytes],
                head: list[bytes] | None = None) -> Any:
        """``head``: arguments put before the client's (WAITJOB's client ID)."""
        if owner != self.index and not head:  # as RESP in a RAW frame; else CMDS
            return self.fwd.general(conn, owner, cmd)
        name = cmd[0].lower()
        args = head + cmd[1:] if head else cmd[1:]
        if owner == self.index:
            conn.streak = 0
            return self.owner.run(name, args, lambda: self._later(conn))
        self.fwd.command(conn, owner, name, args)
        return PENDING

    @staticmethod
    def _later(conn: ClientConn) -> Callable[[Any], None]:
        """A reply that comes later: its slot in ``conn``'s replies, reserved now."""
        slot = conn.defer()
        return lambda value: conn.fill(slot, encode(value, conn.resp3))

    # ------------------------------------------------------------------ route: ids

    def cmd_waitjob(self, conn: ClientConn, cmd: list[bytes]) -> Any:
        """WAITJOB: routed by its IDs, each owner told the client (whose share of its
        WAITJOB table the entries count in: waitjob-entries-per-client-max)."""
        return self.cmd_ids(conn, cmd, [b"%d" % conn.id])

    def cmd_ids(self, conn: ClientConn, cmd: list[bytes],
                head: list[bytes] | None = None) -> Any:
        ids = cmd[1:]
        if self.workers == 1 or not ids:
            return self._run_at(conn, self.index, cmd, head)
        tail: list[bytes] = []
        words = TABLE[cmd[0].lower()].tail_opts
        if words:  # an extension's trailing option goes to every owner
            ids, word, value = cmd_jobs.split_tail(ids, words)
            if word is not None and value is not None:
                tail = [word, value]
        if len(ids) > 1:
            one = cmd_jobs.one_id_error(cmd[0].lower(), tail)
            if one is not None:
                return one  # RESULT, ACKJOB ... RESULT: never split over owners
        route = self.route(ids, 0, len(ids), True)  # -BADID before anything runs
        if type(route) is int:
            owner: int = route
            if owner < 0:
                return ERR_BADID
            if tail and tail[0] == b"result" and owner != self.index:
                # ACKJOB id RESULT value: as a command (a RAW ACKJOB is IDs only)
                self.fwd.command(conn, owner, b"ackjob", cmd[1:])
                return PENDING
            return self._run_at(conn, owner, cmd, head)
        return self._split_ids(conn, cmd[0].lower(), route, tail, head)

    def _split_ids(self, conn: ClientConn, name: bytes, groups: dict[int, list[bytes]],
                   tail: list[bytes] | None = None, head: list[bytes] | None = None) -> Any:
        conn.streak = 0
        results: list[Any] = []
        slot = conn.defer()

        def one(value: Any) -> None:
            results.append(value)
            if len(results) == len(groups):
                conn.fill(slot, encode(_merge_counts(results), conn.resp3))

        for owner, ids in groups.items():
            if tail:
                ids = ids + tail
            if head:
                ids = head + ids
            if owner == self.index:  # PENDING: our share answers later (WAITJOB, the AOF)
                value = self.owner.run(name, ids, lambda: one)
                if value is not PENDING:
                    one(value)
            else:
                self.fwd.ask(owner, name, ids, one)
        return PENDING

    # ------------------------------------------------------------------ route: getjob

    def cmd_getjob(self, conn: ClientConn, cmd: list[bytes]) -> Any:
        spec = cmd_jobs.parse_getjob(cmd, 1)
        if isinstance(spec, Error):
            return spec
        return self.getjob(conn, spec, self.route(spec.queues, 0, len(spec.queues), False))

    def getjob(self, conn: ClientConn, spec: GetJobArgs, route: Any) -> Any:
        """GETJOB for a client of ours (``route``: the owner of every queue, or their
        runs): answered by our shard when the queues are ours, else coordinated by
        ``GetJob``; the jobs, ``NULL_ARRAY``, an error or PENDING."""
        if type(route) is not int:
            return GetJob(self.getjobs, conn, spec, route).start()
        owner: int = route
        if owner == self.index:
            conn.streak = 0
            reply = cmd_jobs.getjob_now(self.w.shard, spec, self.w.now_ms)
            if reply is not None:
                return reply
            return GetJob(self.getjobs, conn, spec, [(owner, list(spec.queues))]).wait_here()
        conn.toward(owner)  # a consumer of another worker's queue moves there
        return GetJob(self.getjobs, conn, spec, [(owner, list(spec.queues))]).start()


def _merge_counts(results: list[Any]) -> Any:
    total = 0
    for value in results:
        if isinstance(value, Error):
            return value
        total += int(value)
    return total
