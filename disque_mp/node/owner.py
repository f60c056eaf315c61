"""The owner side: what this worker's shard runs, whoever asked.

A command reaches the shard that owns its queue or job IDs either from a client of
ours (``router.py``) or from another worker over the mesh (``peers.py`` decodes the
frame); both call ``Owner``, which holds every shape the owner runs:

    run            a ``queue``- or ``ids``-routed command by the command table's
                   handler, with the AOF hold: under ``appendfsync always`` a reply
                   whose records are not on disk yet waits for the loop turn's commit
                   (``aof.hold``), and a reply that comes later (a ``Wake``) waits for
                   its records too (``durable``)
    *_here         the hot shapes (``ADDJOB q body timeout``, a NOHANG GETJOB, ACKJOB /
                   FASTACK of valid IDs): the fast paths' shard calls and encoders, the
                   same for a client of ours and for a RAW frame's command
    ack_share      our part of an ACK split over owners (counted by its coordinator)
    take           a GETJOB coordinator's take (TAKES): our part of the one-shard answer
    block, unblock a waiter for a peer's blocked GETJOB (BLOCK, answered by WAKE), dropped
                   by UNBLOCK or when the peer's link goes (``asker_lost``)
    give_back      jobs a GETJOB took and no longer wants (RETURN), requeued uncounted
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Final

from bus import mesh as meshmod
from bus.clock import wall_ms
from bus.frames import FrameError
from bus.mesh import Link
from disque_mp.node.commands import jobs as cmd_jobs
from disque_mp.node.commands.jobs import GetJobArgs
from disque_mp.node.commands.table import TABLE, run_on_shard
from disque_mp.node.connection import CommandStats
from disque_mp.node.core import WorkerCore
from disque_mp.node.errors import ERR_INTERNAL
from disque_mp.node.getjob import encode_getjob, share_of_held, took_bytes
from disque_mp.node.resp import encode
from workers.invariant import InvariantError
from workers.replies import PENDING, Error

log = logging.getLogger("disque_mp.node.owner")
_perf_ns: Final = time.perf_counter_ns  # INFO commandstats; compiled in, no lookup per command

Deliver = Callable[[Any], None]


class Owner:
    """Runs the commands this worker owns (one per worker); ``stats`` counts the
    hot shapes it runs (a forwarded general command is counted by ``serve_general``)."""

    def __init__(self, w: WorkerCore, stats: CommandStats) -> None:
        self.w = w
        self.stats = stats
        self.cfg = w.cfg
        # ``run_on_shard``'s table, looked up here: that function runs interpreted, a
        # Python frame per command (~2k instructions of a forwarded QLEN's ~15k)
        self.handlers: dict[bytes, Callable[..., Any]] = {
            name: c.handler for name, c in TABLE.items()
            if c.route in ("queue", "ids") and c.handler is not None}
        # the waiters peers registered (BLOCK), by the link they came on: the asker's
        # GETJOB token -> our shard token
        self.blocked: dict[Link, dict[int, int]] = {}

    # ------------------------------------------------------------------ the general shape

    def run(self, name: bytes, args: list[bytes], later: Callable[[], Deliver],
            peer: bool = False) -> Any:
        """Run ``name args`` (``name`` lowercase) on our shard: the reply, or
        ``PENDING`` once ``later()`` (how to deliver it) waits for the AOF or for the
        command's ``Wake``. ``peer``: another worker asked; a failure is logged and
        answered ``ERR_INTERNAL`` (the asker would wait forever)."""
        w = self.w
        token = w.new_token()
        aof = w.aof
        before = aof.appended if aof is not None else 0
        try:
            handler = self.handlers.get(name)
            if handler is None:  # its error
                reply = run_on_shard(w.shard, name, args, token, w.now_ms)
            else:
                reply = handler(w.shard, args, token, w.now_ms)
        except InvariantError:
            raise
        except Exception:
            if not peer:
                raise
            log.exception("command %r from a peer failed", name)
            reply = ERR_INTERNAL
        if aof is not None and w.cfg.appendfsync == "always" and self.must_hold(before, reply):
            aof.hold(aof.appended, later(), reply)
            return PENDING
        if reply is PENDING:
            w.tokens[token] = self.durable(later())
        return reply

    def serve_general(self, name: bytes, cmd: list[bytes], later: Callable[[], Deliver]) -> Any:
        """A command another worker sent as RESP that no fast path took (options,
        peers, appendfsync always; the general path's QLEN, SHOW, NACK ...): ``run``,
        counted here (the asker does not count it)."""
        t0 = _perf_ns()
        reply = self.run(name, cmd[1:], later, True)
        self.stats.count(name.decode(), t0, cmd)
        return reply

    def must_hold(self, before: int, reply: Any) -> bool:
        """appendfsync always: a reply whose records are not durable yet waits for
        the loop turn's commit (``aof.hold``; it becomes the AOF error if that fails)."""
        aof = self.w.aof
        if aof is None or reply is PENDING or not aof.holds_replies():
            return False
        self.w.drain_effects()
        return bool(aof.appended != before)

    def durable(self, deliver: Deliver) -> Deliver:
        """A reply completed later (Wake) waits for its records under appendfsync always."""
        aof = self.w.aof
        if aof is None or self.w.cfg.appendfsync != "always":
            return deliver
        return aof.when_durable(deliver)

    # ------------------------------------------------------------------ the hot shapes
    #
    # Each returns the encoded reply, or None before doing anything when the command
    # is not of its shape (appendfsync always, a reply that waits for replication):
    # the general shape (``run``) then runs it. The work done is exactly the general
    # path's for that shape (the same parser and shard call, the same counters).

    def addjob_here(self, cmd: list[bytes]) -> bytes | None:
        """``ADDJOB q body timeout`` of a queue we own, or None for the general path."""
        w = self.w
        shard = w.shard
        if self.cfg.appendfsync == "always" or shard.has_peers():
            return None  # it waits for replication: the general path defers the reply
        t0 = _perf_ns()
        w.next_token = token = w.next_token + 1
        reply = cmd_jobs.addjob_plain(shard, cmd[1], cmd[2], cmd[3], token, w.now_ms, False)
        self.stats.count("addjob", t0, cmd)
        if type(reply) is str:  # the job's ID
            return b"+%s\r\n" % reply.encode()
        return encode(reply)  # an error (same bytes in RESP2 and 3): with no peers nothing is PENDING

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
        self.stats.count("getjob", t0, cmd)
        return encode_getjob(reply, spec.withcounters, resp3)

    def ack_here(self, ids: list[str], fast: bool, cmd: list[bytes]) -> bytes | None:
        """ACKJOB / FASTACK of valid IDs we own, or None for the general path."""
        if self.cfg.appendfsync == "always":
            return None
        w = self.w
        t0 = _perf_ns()
        if fast:
            acked = w.shard.op_fastack(ids, w.now_ms)
            self.stats.count("fastack", t0, cmd)
        else:
            acked = w.shard.op_ackjob(ids, w.now_ms)
            self.stats.count("ackjob", t0, cmd)
        return b":%d\r\n" % acked

    def ack_share(self, part_cmd: list[bytes], fast: bool) -> int:
        """Our part of an ACKJOB / FASTACK split over owners (``part_cmd``: the name
        then our IDs, each valid): how many were acked. Not counted: the whole command
        is counted by the owners that ran its parts."""
        w = self.w
        part = [part_cmd[i].decode("ascii") for i in range(1, len(part_cmd))]
        return w.shard.op_fastack(part, w.now_ms) if fast else w.shard.op_ackjob(part, w.now_ms)

    # ------------------------------------------------------------------ GETJOB's takes and waiters

    def take(self, count: int, withcounters: bool, hints: list[int] | None,
             queues: list[bytes]) -> bytes:
        """A coordinator's take: the jobs (``getjob.took_bytes``; empty for none), and when
        it tells what the other queues hold (``hints``, sent only when its own queues hold
        jobs) what each of ours held before: then only the part we can win
        (``take_share``), else up to COUNT jobs of our queues."""
        shard = self.w.shard
        held: list[int] = []
        if hints is not None:
            held = shard.op_takeable(queues, self.w.now_ms)
            if hints.count(-1) == len(queues):
                count = min(count, share_of_held(hints, queues, held, count))
        # even for 0 jobs: a take creates the queues it names, as one shard's GETJOB does
        entries = shard.op_take(queues, count, withcounters, self.w.now_ms)
        if not entries and not held:
            return b""  # nothing to tell: no body to pack or read
        return took_bytes(queues, held, entries)

    def block(self, link: Link, remote: int, queues: list[bytes], count: int,
              withcounters: bool) -> None:
        """A waiter for the GETJOB ``remote`` of the worker on ``link``: our shard's
        jobs for it, when some come, leave as a WAKE on that link (or go back to their
        queues when the asker is gone, or the jobs do not fit one frame)."""
        w = self.w
        token = w.new_token()
        blocked = self.blocked.get(link)
        if blocked is None:
            blocked = self.blocked[link] = {}
        blocked[remote] = token

        def wake(entries: Any) -> None:
            blocked.pop(remote, None)
            if isinstance(entries, Error):
                if link.transport is not None:
                    link.send(meshmod.K_WAKE, {"t": remote, "e": str(entries)})
                return
            if link.transport is None:  # asker is gone: give the jobs back
                w.shard.op_return([e[1] for e in entries], w.now_ms)
                return
            try:
                link.send(meshmod.K_WAKE, {"t": remote}, [took_bytes(queues, [], entries)])
            except FrameError:  # more than a frame carries: give them back
                w.shard.op_return([e[1] for e in entries], w.now_ms)
                w.mesh.count_refused()
                link.send(meshmod.K_WAKE, {"t": remote, "e": meshmod.ERR_TOO_BIG})

        w.tokens[token] = wake
        w.shard.op_block(token, queues, count, withcounters, w.now_ms)

    def unblock(self, link: Link, remote: int, forget_queues: bool) -> None:
        """The asker's GETJOB ``remote`` no longer waits (UNBLOCK)."""
        blocked = self.blocked.get(link)
        token = blocked.pop(remote, None) if blocked is not None else None
        if token is not None:
            w = self.w
            w.tokens.pop(token, None)
            w.shard.op_unblock(token, w.now_ms, forget_queues=forget_queues)

    def asker_lost(self, link: Link) -> None:
        """The link of a peer is gone: the waiters it registered go too."""
        w = self.w
        blocked = self.blocked.pop(link, None)
        if blocked:
            for token in blocked.values():
                w.tokens.pop(token, None)
                w.shard.op_unblock(token, wall_ms())
        w.drain_effects()

    def give_back(self, ids: list[str]) -> None:
        """Jobs a GETJOB took and no longer wants (RETURN): requeued uncounted."""
        self.w.shard.op_return(ids, self.w.now_ms)
