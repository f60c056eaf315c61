"""The path of one client command, on the worker that holds the connection.

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

Forwarding to the owner: the commands of one other owner travel as RESP in RAW
frames and their replies come back already encoded (``peers.py`` splices them
in): the hot ones from their fast paths (``forward_raw``), the general path's
``queue`` and ``ids`` commands (``forward_general``) within the connection's
window of forwarded work (``_windowed``). The owner counts what it runs for a RAW
frame. WAITJOB (its client ID goes first) and the parts of a command split over
several owners travel as CMDS frames (``forward``). The router also keeps the
accounting of the commands it runs: INFO commandstats, the slowlog, the counter.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from bus.mesh import unpack
from disque_mp.node.commands import jobs as cmd_jobs
from disque_mp.node.commands.jobs import GetJobArgs
from disque_mp.node.commands.table import TABLE, Command
from disque_mp.node.connection import (
    ClientConn,
    ClientHost,
    CommandPath,
    DepartureWatch,
    PendingReply,
)
from disque_mp.node.errors import ERR_BADID, ERR_NOAUTH, ERR_OOM, err_arity, err_unknown
from disque_mp.node.getjob import GetJob, GetJobs, Runs, encode_getjob
from disque_mp.node.owner import Owner
from disque_mp.node.resp import NULL3, NULL_ARRAY2, append_request, encode
from workers.ids import owner_of_queue, slot_of_valid_id
from workers.invariant import InvariantError
from workers.replies import PENDING, Error, Status

owner_cache_max = 65536  # queue name -> owner memo; cleared when full (names are unbounded)
NOAUTH_OK: Final = frozenset({"auth", "hello", "quit"})

_perf_ns: Final = time.perf_counter_ns  # INFO commandstats; compiled in, no lookup per command
# A general-path handler's answer for a command sent to its owner as RESP: the reply
# comes later and the owner counts the command (``router.forward_general``).
FORWARDED: Final = object()

class Router(CommandPath):
    """The per-command path of worker ``w`` (one per worker): ``owner`` runs what
    our shard owns, ``getjobs`` coordinates the GETJOBs it cannot answer alone."""

    def __init__(self, w: ClientHost, owner: Owner, getjobs: GetJobs) -> None:
        super().__init__(w.slowlog)  # the accounting: commandstats, slowlog, counters
        self.w = w
        self.owner = owner
        self.getjobs = getjobs
        self.cfg = w.cfg
        self.index = w.index
        self.workers = w.workers
        self.owner_cache: dict[bytes, int] = {}
        self.lookup = self._build_lookup()
        self.fast = self._build_fast()
        # The forwarded-work budget: general-path commands of one connection running on
        # another worker at once (config forwarded-commands-max), and the commands
        # held behind them in request order (their reply slots already reserved).
        self.in_flight: dict[ClientConn, int] = {}
        self.held: dict[ClientConn, deque[tuple[bool, Callable[[], None]]]] = {}

    def _build_lookup(self) -> dict[bytes, tuple[Command, Callable[..., Any], list[int]]]:
        routes = {"queue": self.cmd_queue, "ids": self.cmd_ids, "getjob": self.cmd_getjob}
        out = {}
        for name, cmd in TABLE.items():
            handler = self.cmd_waitjob if name == b"waitjob" else routes.get(cmd.route)
            if handler is None:  # scatter and local: the table's handler, run here
                own = cmd.handler
                if own is None:
                    raise InvariantError(f"command {cmd.name} has no handler")
                handler = functools.partial(own, self.w)
            stat = self.cmdstats.setdefault(cmd.name, [0, 0])
            entry = (cmd, handler, stat)
            out[name] = entry
            out[name.upper()] = entry
        return out

    def execute(self, conn: ClientConn, cmd: list[bytes]) -> bytes | None:
        """Run one command; its encoded reply, or None when it will come later."""
        fast = self.fast.get(cmd[0])
        if fast is not None and conn.authed and not self.w.oom:
            reply = fast(conn, cmd)
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
        if reply is FORWARDED:  # the owner counts it, as it runs it (``forward_general``)
            conn.last_cmd = command.name
            return None
        self._account(stat, command.name, conn, t0, cmd)
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

    # ------------------------------------------------------------------ accounting

    def count(self, name: str, t0: int, cmd: list[bytes]) -> None:
        """A fast path's command ran from ``t0``: commandstats, slowlog, counters."""
        took = _perf_ns() - t0
        stat = self.cmdstats[name]
        stat[0] += 1
        stat[1] += took
        if took >= self.slowlog_min_ns >= 0:
            self.slowlog.add(cmd, took)
        self.commands_processed += 1

    def _account(self, stat: list[int], name: str, conn: ClientConn, t0: int,
                 cmd: list[bytes]) -> None:
        """A command ran from ``t0``: commandstats, the slowlog, INFO's counters."""
        took = _perf_ns() - t0
        stat[0] += 1
        stat[1] += took
        if took >= self.slowlog_min_ns >= 0:
            self.slowlog.add(cmd, took)
        self.commands_processed += 1
        conn.last_cmd = name

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

    def _build_fast(self) -> dict[bytes, Callable[[ClientConn, list[bytes]], bytes | None]]:
        out: dict[bytes, Callable[[ClientConn, list[bytes]], bytes | None]] = {}
        for name, cmd in TABLE.items():  # the table says which commands have one
            if not cmd.fast:
                continue
            fn = getattr(self, f"_fast_{cmd.name}")
            out[name] = out[name.upper()] = fn
        return out

    def _fast_addjob(self, conn: ClientConn, cmd: list[bytes]) -> bytes | None:
        if len(cmd) != 4:
            return None
        if self.workers > 1:
            owner = self.owner_of(cmd[1])
            if owner != self.index:
                return self.forward_raw(conn, owner, cmd, "addjob")
        reply = self.addjob_here(cmd)
        if reply is not None:
            conn.streak = 0
            conn.last_cmd = "addjob"
        return reply

    def addjob_here(self, cmd: list[bytes]) -> bytes | None:
        """``ADDJOB q body timeout`` of a queue we own, or None for the general path."""
        w = self.w
        shard = w.shard
        if self.cfg.appendfsync == "always" or shard.has_peers():
            return None  # it waits for replication: the general path defers the reply
        t0 = _perf_ns()
        w.next_token = token = w.next_token + 1
        reply = cmd_jobs.addjob_plain(shard, cmd[1], cmd[2], cmd[3], token, w.now_ms)
        self.count("addjob", t0, cmd)
        if type(reply) is Status:
            return f"+{reply}\r\n".encode()
        return encode(reply)  # an error (same bytes in RESP2 and 3): with no peers nothing is PENDING

    def _fast_getjob(self, conn: ClientConn, cmd: list[bytes]) -> bytes | None:
        spec = cmd_jobs.parse_getjob(cmd, 1)
        if not isinstance(spec, GetJobArgs):
            return None  # the general path answers the error
        owner = self.single_owner(spec.queues)
        if owner != self.index and owner >= 0 and spec.nohang:
            # NOHANG never blocks: its owner answers (we do when known empty); else ``getjob``
            return answer_known_empty(self, conn, owner, cmd, spec.queues) or \
                self.forward_raw(conn, owner, cmd, "getjob")
        t0 = _perf_ns()
        reply = self.getjob(conn, spec, owner)
        self.count("getjob", t0, cmd)
        conn.last_cmd = "getjob"
        if reply is PENDING:
            return b""
        return encode_getjob(reply, spec.withcounters, conn.resp3)

    def getjob_here(self, cmd: list[bytes], resp3: bool) -> bytes | None:
        """A NOHANG GETJOB another worker forwarded, its queues ours: the reply, or
        None for a command that does not parse (the general path answers it)."""
        spec = cmd_jobs.parse_getjob(cmd, 1)
        if not isinstance(spec, GetJobArgs):
            return None
        t0 = _perf_ns()
        reply = cmd_jobs.getjob_now(self.w.shard, spec, self.w.now_ms)
        if reply is None:
            return None  # not NOHANG: only the coordinator blocks (never forwarded)
        self.count("getjob", t0, cmd)
        return encode_getjob(reply, spec.withcounters, resp3)

    def _fast_ackjob(self, conn: ClientConn, cmd: list[bytes]) -> bytes | None:
        return self._fast_ack(conn, cmd, False)

    def _fast_fastack(self, conn: ClientConn, cmd: list[bytes]) -> bytes | None:
        return self._fast_ack(conn, cmd, True)

    def _fast_ack(self, conn: ClientConn, cmd: list[bytes], fast: bool) -> bytes | None:
        # ACKJOB / FASTACK id..., every ID valid: one pass over the IDs' bytes checks
        # each (the general path validates in the router and again in cmd_jobs), finds
        # its owner and, once a second owner shows, groups them for ``split_ack``. Only
        # the IDs our shard takes are decoded.
        n = len(cmd)
        if n < 2:
            return None
        workers = self.workers
        owner = -1
        groups: dict[int, list[bytes]] | None = None
        for i in range(1, n):
            raw = cmd[i]
            slot = slot_of_valid_id(raw)
            if slot < 0:
                return None  # the general path answers -BADID
            at = slot % workers
            if groups is not None:
                part = groups.get(at)
                if part is None:
                    groups[at] = [cmd[0], raw]
                else:
                    part.append(raw)
            elif owner < 0:
                owner = at
            elif at != owner:
                groups = {owner: cmd[:i], at: [cmd[0], raw]}
        if groups is not None:
            return split_ack(self, conn, groups, fast)
        if owner != self.index:
            return self.forward_raw(conn, owner, cmd, "fastack" if fast else "ackjob")
        reply = self.ack_here([cmd[i].decode("ascii") for i in range(1, n)], fast, cmd)
        if reply is not None:
            conn.streak = 0
            conn.last_cmd = "fastack" if fast else "ackjob"
        return reply

    def ack_here(self, ids: list[str], fast: bool, cmd: list[bytes]) -> bytes | None:
        """ACKJOB / FASTACK of valid IDs we own, or None for the general path."""
        if self.cfg.appendfsync == "always":
            return None
        w = self.w
        t0 = _perf_ns()
        if fast:
            acked = w.shard.op_fastack(ids, w.now_ms)
            self.count("fastack", t0, cmd)
        else:
            acked = w.shard.op_ackjob(ids, w.now_ms)
            self.count("ackjob", t0, cmd)
        return b":%d\r\n" % acked

    # ------------------------------------------------------------------ running here

    @staticmethod
    def _later(conn: ClientConn) -> Callable[[Any], None]:
        """A reply that comes later: its slot in ``conn``'s replies, reserved now."""
        slot = conn.defer()
        return lambda value: conn.fill(slot, encode(value, conn.resp3))

    # ------------------------------------------------------------------ route: queue

    def owner_of(self, queue: bytes) -> int:
        owner = self.owner_cache.get(queue)
        if owner is None:
            if len(self.owner_cache) >= owner_cache_max:
                self.owner_cache.clear()
            owner = self.owner_cache[queue] = owner_of_queue(queue, self.workers)
        return owner

    def cmd_queue(self, conn: ClientConn, cmd: list[bytes]) -> Any:
        owner = self.owner_of(cmd[1]) if self.workers > 1 else self.index
        return self._run_at(conn, owner, cmd)

    def _run_at(self, conn: ClientConn, owner: int, cmd: list[bytes],
                head: list[bytes] | None = None) -> Any:
        """``head``: arguments put before the client's (WAITJOB's client ID)."""
        if owner != self.index and not head:  # as RESP in a RAW frame; else CMDS
            return forward_general(self, conn, owner, cmd)
        name = cmd[0].lower()
        args = head + cmd[1:] if head else cmd[1:]
        if owner == self.index:
            conn.streak = 0
            return self.owner.run(name, args, lambda: self._later(conn))
        self._count_streak(conn, owner)
        # a partial: a nested def and its closure (compiled) make a cycle for the GC
        back = functools.partial(forwarded_back, self, conn, conn.defer())
        self._windowed(conn, True, lambda: self.forward(owner, name, args, back))
        return PENDING

    def _windowed(self, conn: ClientConn, counted: bool, send: Callable[[], None]) -> None:
        """Send a forwarded command now, or hold it (in order) while the connection has
        ``forwarded-commands-max`` general-path commands on other workers: a client
        that pipelines hundreds of heavy reads (QPEEK q 1000) for a queue another
        worker owns makes that worker build a window of replies at a time, and its
        output limits cut the rest (held commands of a closed client never run).
        ``counted``: the command takes a place in the window (a hot command only
        keeps its place in the order)."""
        held = self.held.get(conn)
        if held is None and (not counted or reserve_window(self, conn)):
            send()
            return
        if held is None:
            held = self.held[conn] = deque()
        if conn.transport is not None:
            conn.transport.pause_reading()  # its next commands wait for room
            DepartureWatch.watch(conn)
        held.append((counted, send))

    def window_freed(self, conn: ClientConn) -> None:
        """A forwarded general-path reply came back: send what was held behind it."""
        n = self.in_flight.get(conn, 1) - 1
        held = self.held.get(conn)
        if held is not None:
            if conn.gone or conn.slots is None:
                del self.held[conn]  # disconnected or closed by its output limits
            else:
                window = self.cfg.forwarded_commands_max
                while held and (not held[0][0] or n < window):
                    counted, send = held.popleft()
                    n += counted
                    send()
                if not held:
                    del self.held[conn]
                    if conn.transport is not None and not conn.closing:
                        conn.transport.resume_reading()
        if n > 0:
            self.in_flight[conn] = n
        else:
            self.in_flight.pop(conn, None)

    def _count_streak(self, conn: ClientConn, owner: int) -> None:
        if conn.streak_owner == owner:
            conn.streak += 1
        else:
            conn.streak_owner = owner
            conn.streak = 1

    def forward(self, owner: int, name: bytes, args: list[bytes], done: Callable[[Any], None]) -> None:
        """Run a job command on another worker; ``done(reply value)``."""
        self.forwarded += 1
        self.w.mesh.command(owner, name.decode(), args,
                            lambda meta, bodies: done(unpack(meta.get("v"), bodies)))

    def forward_raw(self, conn: ClientConn, owner: int, cmd: list[bytes], name: str) -> bytes:
        """Send a hot command to its owner as RESP (mesh RAW); its reply bytes will
        fill a slot of ``conn`` (``Peers.on_raw_replies``). Returns b"" (the reply
        comes later). The owner counts the command (commandstats, slowlog), as it
        runs it."""
        self._count_streak(conn, owner)
        self.forwarded += 1
        conn.last_cmd = name
        slot = conn.defer_raw()
        raw = conn.request_bytes(cmd)  # the client's own bytes: no encoding again
        if self.held and conn in self.held:  # behind general-path commands it waits for
            self._hold_raw(conn, owner, cmd, raw, slot)
            return b""
        self._send_raw(conn, owner, cmd, raw, slot)
        return b""

    def _hold_raw(self, conn: ClientConn, owner: int, cmd: list[bytes], raw: bytes,
                  slot: PendingReply) -> None:
        """``forward_raw``'s held case apart: compiled, a lambda there put its every
        local in a closure object built on each call."""
        self.held[conn].append((False, lambda: self._send_raw(conn, owner, cmd, raw, slot)))

    def _send_raw(self, conn: ClientConn, owner: int, cmd: list[bytes], raw: bytes,
                  slot: PendingReply) -> None:
        link = self.w.mesh.links[owner]
        if link is None:
            raise InvariantError("a command forwarded to ourselves")
        append_request(link.add_raw(conn.resp3, slot), cmd, raw)

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
        # one pass: each ID checked (-BADID before anything runs) and grouped by owner
        workers = self.workers
        groups: dict[int, list[bytes]] = {}
        for job_id in ids:
            slot = slot_of_valid_id(job_id)
            if slot < 0:
                return ERR_BADID
            groups.setdefault(slot % workers, []).append(job_id)
        if len(groups) <= 1:
            owner = next(iter(groups)) if groups else self.index
            return self._run_at(conn, owner, cmd, head)
        return self._split_ids(conn, cmd[0].lower(), groups, tail, head)

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
                self.forward(owner, name, ids, one)
        return PENDING

    # ------------------------------------------------------------------ route: getjob

    def cmd_getjob(self, conn: ClientConn, cmd: list[bytes]) -> Any:
        spec = cmd_jobs.parse_getjob(cmd, 1)
        if isinstance(spec, Error):
            return spec
        return self.getjob(conn, spec, self.single_owner(spec.queues))

    def getjob(self, conn: ClientConn, spec: GetJobArgs, owner: int) -> Any:
        """GETJOB for a client of ours (``owner``: of every queue, -1 when they are
        spread): answered by our shard when the queues are ours, else coordinated by
        ``GetJob``; the jobs, ``NULL_ARRAY``, an error or PENDING."""
        if owner == self.index:
            conn.streak = 0
            reply = cmd_jobs.getjob_now(self.w.shard, spec, self.w.now_ms)
            if reply is not None:
                return reply
            return GetJob(self.getjobs, conn, spec, [(owner, list(spec.queues))]).wait_here()
        if owner >= 0:
            self._count_streak(conn, owner)  # a consumer of another worker's queue moves there
        return GetJob(self.getjobs, conn, spec, owner_runs(self, spec.queues)).start()

    def single_owner(self, queues: list[bytes]) -> int:
        """The worker owning every queue named, or -1 when they are spread."""
        if self.workers == 1:
            return self.index
        owner = self.owner_of(queues[0])
        for i in range(1, len(queues)):
            if self.owner_of(queues[i]) != owner:
                return -1
        return owner


def answer_known_empty(self: Router, conn: ClientConn, owner: int, cmd: list[bytes],
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
    self._count_streak(conn, owner)  # a consumer of another worker's queue moves there
    self.count("getjob", t0, cmd)
    conn.last_cmd = "getjob"
    return NULL3 if conn.resp3 else NULL_ARRAY2


def owner_runs(self: Router, queues: list[bytes]) -> Runs:
    """Queues cut into runs of consecutive queues with one owner (left-to-right priority)."""
    runs: Runs = []
    for q in queues:
        owner = self.owner_of(q) if self.workers > 1 else self.index
        if runs and runs[-1][0] == owner:
            runs[-1][1].append(q)
        else:
            runs.append((owner, [q]))
    return runs


def split_ack(self: Router, conn: ClientConn, groups: dict[int, list[bytes]],
              fast: bool) -> bytes | None:
    """ACKJOB / FASTACK of valid IDs of several owners (``groups``: each owner's
    command, the name then its IDs): our part on our shard, each other owner's as
    one RAW command, the counts summed into one reply (``AckSum``). The owners
    count the command (commandstats), as for a forwarded one; our part is not
    counted again."""
    if self.cfg.appendfsync == "always" or (self.held and conn in self.held):
        return None  # our part waits for the AOF / behind held commands: general path
    mine = groups.pop(self.index, None)
    total = 0
    if mine is not None:
        w = self.w
        part = [mine[i].decode("ascii") for i in range(1, len(mine))]
        total = w.shard.op_fastack(part, w.now_ms) if fast else w.shard.op_ackjob(part, w.now_ms)
    conn.streak = 0
    conn.last_cmd = "fastack" if fast else "ackjob"
    self.forwarded += len(groups)
    conn.forwarded += 1  # one reply slot, filled when every owner answered
    summed = AckSum(conn, conn.defer(), len(groups), total)
    for at, part_cmd in groups.items():
        link = self.w.mesh.links[at]
        if link is None:
            raise InvariantError("an ACK part forwarded to ourselves")
        append_request(link.add_raw(conn.resp3, summed), part_cmd)
    return b""


def forward_general(self: Router, conn: ClientConn, owner: int, cmd: list[bytes]) -> Any:
    """A general-path command of one other owner (QLEN, SHOW, NACK ...: a ``queue``
    or ``ids`` route) sent as the hot ones are, RESP in the RAW frame (the client's
    own bytes when it has them), its reply coming back encoded in the client's
    protocol (a CMDS frame and a REPLIES frame through orjson cost about twice
    the work: bench/results/raw-general-2026-11-28.md). The owner runs it
    (``Peers._serve_raw_general``) and counts it (commandstats, slowlog); so
    ``FORWARDED``, which ``_execute`` does not count. It takes a place in the
    connection's window (``Router._windowed``), freed by its reply (its slot is
    ``windowed``: ``Peers.on_raw_replies``, ``raw_failed``)."""
    self._count_streak(conn, owner)
    raw = conn.request_bytes(cmd)
    back = conn.defer_general()
    if (not self.held or conn not in self.held) and reserve_window(self, conn):
        send_general(self, conn, owner, cmd, raw, back)
    else:
        self._windowed(conn, True, functools.partial(send_general, self, conn, owner, cmd, raw, back))
    return FORWARDED


def reserve_window(self: Router, conn: ClientConn) -> bool:
    """Take a place in ``conn``'s window of general-path commands on other workers
    (``forwarded-commands-max``) if one is free; the caller holds the command if not."""
    n = self.in_flight.get(conn, 0)
    if n >= self.cfg.forwarded_commands_max:
        return False
    self.in_flight[conn] = n + 1
    return True


def forwarded_back(self: Router, conn: ClientConn, slot: PendingReply, value: Any) -> None:
    """A CMDS command's reply from its owner (``Router._run_at``: WAITJOB)."""
    conn.fill(slot, encode(value, conn.resp3))
    self.window_freed(conn)


def send_general(self: Router, conn: ClientConn, owner: int, cmd: list[bytes], raw: bytes,
                 back: PendingReply) -> None:
    self.forwarded += 1
    self._send_raw(conn, owner, cmd, raw, back)


class AckSum:
    """The reply of an ACKJOB / FASTACK split over owners: each owner's encoded count
    (or error) comes back through the mesh's RAW replies (``Peers.on_raw_replies``
    and ``raw_failed`` call ``fill``); the sum, or the first error, fills the
    client's slot once all have answered."""

    __slots__ = ("conn", "slot", "left", "total", "error")

    def __init__(self, conn: ClientConn, slot: Any, parts: int, total: int) -> None:
        self.conn = conn
        self.slot = slot
        self.left = parts
        self.total = total
        self.error: bytes | None = None

    def fill(self, _slot: Any, data: bytes) -> None:
        if data[:1] == b":":
            self.total += int(data[1:-2])
        elif self.error is None:
            self.error = data
        self.left -= 1
        if self.left == 0:
            conn = self.conn
            conn.forwarded -= 1
            conn.fill(self.slot, self.error if self.error is not None else b":%d\r\n" % self.total)


def _merge_counts(results: list[Any]) -> Any:
    total = 0
    for value in results:
        if isinstance(value, Error):
            return value
        total += int(value)
    return total
