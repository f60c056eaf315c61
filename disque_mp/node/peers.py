"""This worker's end of the local mesh: the frames the other workers send it,
decoded into calls of the side each belongs to.

``Peers`` is the ``Mesh``'s handler (``bus/mesh.py``, ``MeshHandler``). As the owner
of queues and jobs it decodes the other workers' requests into ``Owner`` calls:

    RAW       commands of one owner as RESP, answered with RAWREPLIES already
              encoded: the owner's hot shapes (``addjob_here``, ``getjob_here``,
              ``ack_here``), else its general shape (``serve_general``), as for a
              client of ours (the general path's single-owner commands come this way too)
    CMD(S)    job commands by name, answered with REPLY(IES): WAITJOB (its client ID
              goes first) and the parts of a command split over several owners
    TAKES     the GETJOB coordinators' non-blocking takes of one loop turn
              (``Owner.take``), answered with one TOOKS frame
    BLOCK     a waiter for a peer's blocked GETJOB (``Owner.block``), answered later
              with WAKE; UNBLOCK drops it, and so does the loss of the peer's link
    RETURN    jobs a GETJOB took and no longer wants (``Owner.give_back``)
    SCATTER   this worker's part of a node-wide command (``local_op``: ``Worker.local_op``)

As the asker it hands RAWREPLIES and lost RAW requests to the asking side
(``forward.Forward``), and WAKE for its own blocked GETJOBs and the
(re)connection of a peer, which may have lost the GETJOB waiters registered with
it, to ``getjob.GetJobs``.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import hiredis

from bus import mesh as meshmod
from bus.clock import wall_ms
from bus.mesh import Link
from disque_mp.node.connection import turn_reply_bytes_max
from disque_mp.node.core import WorkerCore
from disque_mp.node.errors import ERR_INTERNAL
from disque_mp.node.forward import Forward
from disque_mp.node.getjob import GetJobs
from disque_mp.node.owner import Owner
from disque_mp.node.resp import encode
from workers.invariant import InvariantError
from workers.replies import PENDING

log = logging.getLogger("disque_mp.node.peers")


# The hot commands a RAW frame carries (``_raw_kind``): the fast path each one takes.
_RAW_ADDJOB: Final = 1
_RAW_GETJOB: Final = 2
_RAW_ACKJOB: Final = 3
_RAW_FASTACK: Final = 4
_ERR_INTERNAL_RESP: Final = encode(ERR_INTERNAL)
_MULTI_HEADS: Final = [b"*%d\r\n" % n for n in range(256)]  # a RAW frame's array header

LocalOp = Callable[[str, Any], Any]  # this worker's part of a node-wide command


class Peers:
    """The other workers, as worker ``w`` serves and hears them on the mesh: the
    ``owner`` runs their requests, ``fwd`` takes the answers to ours, ``getjobs`` the
    WAKEs for our GETJOBs, ``local_op`` answers SCATTER."""

    def __init__(self, w: WorkerCore, owner: Owner, fwd: Forward, getjobs: GetJobs,
                 local_op: LocalOp) -> None:
        self.w = w
        self.owner = owner
        self.fwd = fwd
        self.getjobs = getjobs
        self.local_op = local_op
        self.raw_reader = hiredis.Reader()  # parses the RAW frames peers send us
        # RAW commands left for a later loop turn, per asking link, in order: one
        # peer's frame builds at most turn_reply_bytes_max of replies a turn (as one
        # client's read does, connection.py), so a pipeline of heavy reads forwarded
        # from another worker leaves room for our own clients in between
        self.raw_backlog: dict[Link, deque[tuple[int, bytes, list[Any], int]]] = {}
        self.raw_resume_due = False

    def log(self, text: str) -> None:
        self.w.log(text)

    # ------------------------------------------------------------------ requests

    def on_request(self, link: Link, kind: int, meta: dict[str, Any], bodies: list[bytes]) -> None:
        w = self.w
        w.now_ms = wall_ms()
        if kind == meshmod.K_RAW:
            # its effects now (a waiter its ADDJOBs served wakes before a later frame of
            # the read, its UNBLOCK, drops the handler: the jobs were lost to it until
            # their RETRY); the tick once for the read (``after_batch``)
            self._serve_raw(link, bodies)
            w.carry_out_effects()
            return
        if kind == meshmod.K_CMDS:
            self._serve_cmds(link, meta, bodies)
        elif kind == meshmod.K_CMD:
            self._serve_one(link, meta["r"], meta["n"].encode(), bodies)
        elif kind == meshmod.K_TAKES:
            self._serve_takes(link, bodies)
        elif kind == meshmod.K_BLOCK:
            self.owner.block(link, meta["t"], bodies, meta["c"], meta["w"])
        elif kind == meshmod.K_UNBLOCK:
            self.owner.unblock(link, meta["t"], bool(meta.get("f")))
        elif kind == meshmod.K_RETURN:
            self.owner.give_back([b.decode() for b in bodies])
        elif kind == meshmod.K_SCATTER:
            try:
                reply = self.local_op(meta["op"], meta.get("a"))
            except InvariantError:
                raise
            except Exception:  # a bug: answer it, or the asking client waits forever
                log.exception("node operation %r failed", meta.get("op"))
                reply = ERR_INTERNAL
            link.reply(meta["r"], reply)
        # per frame: a waiter a BLOCK served at once wakes before a later frame of the
        # same read (its UNBLOCK) drops the handler; the AOF and the tick once per read
        w.drain_effects()

    def _serve_cmds(self, link: Link, meta: dict[str, Any], bodies: list[bytes]) -> None:
        """A CMDS frame: the job commands a peer forwarded during one loop turn."""
        at = 0
        for rid, name, argc in zip(meta["r"], meta["n"], meta["c"], strict=True):
            self._serve_one(link, rid, name.encode(), bodies[at : at + argc])
            at += argc

    def _serve_one(self, link: Link, rid: int, name: bytes, args: list[bytes]) -> None:
        reply = self.owner.run(name, args, lambda: lambda value: link.reply(rid, value), True)
        if reply is not PENDING:
            link.reply(rid, reply)

    def _serve_takes(self, link: Link, bodies: list[bytes]) -> None:
        """A TAKES frame: the takes a coordinator sent us during one loop turn
        (``meshmod.TakesReader`` reads what ``Link.add_take`` wrote), answered in one
        TOOKS frame."""
        if link.transport is None:
            return  # the asker is gone
        takes = meshmod.TakesReader(bodies)
        words: list[Any] = []  # each answer's request id and length (``Link.tooks``)
        out: list[bytes] = []
        while takes.next():
            try:
                took = self.owner.take(takes.count, takes.withcounters, takes.hints, takes.queues)
            except InvariantError:
                raise
            except Exception:  # a bug: answer it (nothing taken), or the client waits forever
                log.exception("a take from a peer failed")
                took = b""
            words.append(takes.rid)
            words.append(len(took))
            out.append(took)
        if takes.broken:
            log.error("a TAKES frame from a peer is broken")  # a bug: its rest unread
        link.tooks(words, out)

    def on_incoming_lost(self, link: Link) -> None:
        self.owner.asker_lost(link)

    # ------------------------------------------------------------------ RAW (hot commands)

    def _serve_raw(self, link: Link, bodies: list[bytes]) -> None:
        """A RAW frame: a peer's hot commands of one loop turn, as RESP. The fast
        paths' replies are collected here and handed to the link at once."""
        if link.transport is None:
            return  # the asker is gone
        if len(bodies) != 2 or len(bodies[0]) < 4:
            log.error("a RAW frame from a peer is broken")  # a bug: nothing to answer
            return
        head = bodies[0]  # the first request id, then a flag per command
        first = meshmod.raw_first_id(head)
        cmds = self._raw_commands(bodies[1], len(head) - 4)
        backlog = self.raw_backlog.get(link)
        if backlog is not None:
            backlog.append((first, head, cmds, 0))  # behind that link's earlier commands
            return
        self._serve_raw_from(link, first, head, cmds, 0)

    def _serve_raw_from(self, link: Link, first: int, head: bytes, cmds: list[Any],
                        start: int) -> bool:
        """Serve a RAW frame's commands from ``start`` (``head``: its first request id,
        then a flag per command); past turn_reply_bytes_max of replies the rest waits
        for a later turn (True: the frame is done)."""
        words: list[Any] = []  # each answer's request id and length (``Link.raw_replies``)
        out: list[bytes] = []
        spent = 0
        n = len(head) - 4
        for i in range(start, n):
            if spent > turn_reply_bytes_max:  # this turn's share is built: the rest later
                link.raw_replies(words, out)
                self._defer_raw(link, (first, head, cmds, i))
                return False
            rid = (first + i) & 0xFFFFFFFF
            cmd: Any = cmds[i]
            resp3 = head[4 + i] == 1
            reply = _ERR_INTERNAL_RESP
            if cmd is not None:
                try:
                    got = self._serve_raw_one(cmd, resp3)
                    if got is None:
                        spent += self._serve_raw_general(link, rid, cmd[0].lower(), cmd, resp3)
                        continue
                    reply = got
                except InvariantError:
                    raise
                except Exception:  # a bug: answer it, or the asking client waits forever
                    log.exception("command %r from a peer failed", cmd)
                    reply = _ERR_INTERNAL_RESP
            words.append(rid)
            words.append(len(reply))
            out.append(reply)
            spent += len(reply)
        link.raw_replies(words, out)
        return True

    def _defer_raw(self, link: Link, rest: tuple[int, bytes, list[Any], int]) -> None:
        backlog = self.raw_backlog.get(link)
        if backlog is None:
            backlog = self.raw_backlog[link] = deque()
        backlog.appendleft(rest)
        if not self.raw_resume_due:
            self.raw_resume_due = True
            self.w.loop.call_soon(self._resume_raw)

    def _resume_raw(self) -> None:
        """A later loop turn: each asking link's held RAW commands, a turn's share each."""
        self.raw_resume_due = False
        self.w.now_ms = wall_ms()
        for link, backlog in list(self.raw_backlog.items()):
            if self.raw_backlog.get(link) is not backlog:
                continue
            del self.raw_backlog[link]  # put back by _defer_raw when a frame stops again
            while backlog:
                if link.transport is None:
                    break  # the asker is gone: its commands with it
                first, head, cmds, start = backlog.popleft()
                if not self._serve_raw_from(link, first, head, cmds, start):
                    held = self.raw_backlog[link]
                    held.extend(backlog)  # the frames behind it stay behind it
                    break
        self.after_batch()

    def _raw_commands(self, body: bytes, n: int) -> list[Any]:
        """The ``n`` commands of a RAW frame's body (``read_raw``); a broken frame
        (a bug) is read again as far as it goes (``read_broken_raw``)."""
        cmds = read_raw(self.raw_reader, body, n)
        if cmds is None:
            self.raw_reader = hiredis.Reader()  # the old one holds the broken frame's state
            log.error("a RAW frame of %d commands from a peer is broken", n)
            cmds = read_broken_raw(body, n)
        return cmds

    def _serve_raw_one(self, cmd: list[bytes], resp3: bool) -> bytes | None:
        """A RAW command in a fast path's shape: its reply, else None."""
        kind = _raw_kind(cmd[0])
        owner = self.owner
        if kind == _RAW_ADDJOB:  # with options: the general path (it came that way)
            return owner.addjob_here(cmd) if len(cmd) == 4 else None
        if kind == _RAW_GETJOB:
            return owner.getjob_here(cmd, resp3)
        if kind == _RAW_ACKJOB or kind == _RAW_FASTACK:
            return owner.ack_here(_ids_of(cmd), kind == _RAW_FASTACK, cmd)
        return None

    def _serve_raw_general(self, link: Link, rid: int, name: bytes, cmd: list[bytes],
                           resp3: bool) -> int:
        """What a RAW command's fast path does not take (options, peers, appendfsync
        always), and the general path's commands a peer forwarded
        (``Forward.general``: QLEN, SHOW, NACK ...): the owner's general shape, as for
        a client of ours, counted there (the asker does not count them)."""
        # a partial, not a closure: the deliverer is made only for a reply that waits
        reply = self.owner.serve_general(name, cmd, functools.partial(_raw_deliverer, link, rid, resp3))
        if reply is PENDING:
            return 0
        data = encode(reply, resp3)
        link.raw_reply(rid, data)
        return len(data)

    # ------------------------------------------------------------------ answers to our requests

    def on_raw_replies(self, link: Link, bodies: list[bytes]) -> None:
        self.fwd.on_raw_replies(link, bodies)

    def raw_failed(self, waiting: list[Any], text: str) -> None:
        self.fwd.raw_failed(waiting, text)

    def on_wake(self, peer: int, meta: dict[str, Any], bodies: list[bytes]) -> None:
        self.getjobs.on_wake(peer, meta, bodies)

    def on_peer_up(self, peer: int) -> None:
        self.getjobs.on_peer_up(peer)

    def after_batch(self) -> None:
        """After a read of mesh frames: reply callbacks may have called the shard
        (a GETJOB blocking here after remote owners had nothing); this read's AOF
        records go to the kernel before any reply frame leaves (``Mesh.flush`` runs
        later in the loop turn, never inside a read); then the tick follows the
        earliest timer, once for the whole read (``drain_effects`` reschedules it)."""
        w = self.w
        w.drain_effects()
        w.aof_before_replies()


def read_raw(reader: Any, body: bytes, n: int) -> list[Any] | None:
    """The ``n`` commands of a RAW frame's body, by one ``gets`` of ``reader`` (a
    ``hiredis.Reader``): behind an array header the body is one reply, the array of
    its commands. One ``gets`` per command cost ~350 instructions more per command, a
    compiled reader of our own ~250 more (bench/results/history/owner-side-2026-11-28.md).
    None when the body is not exactly ``n`` values: the reader then holds its state."""
    reader.feed(_MULTI_HEADS[n] if n < len(_MULTI_HEADS) else b"*%d\r\n" % n)
    reader.feed(body)
    try:
        cmds = reader.gets()
    except hiredis.ProtocolError:
        return None
    if type(cmds) is not list or reader.has_data():
        return None
    return cmds


def read_broken_raw(body: bytes, n: int) -> list[Any]:
    """A broken RAW body's commands one at a time, as far as they read as arrays;
    None for each of the ``n`` it does not hold."""
    one = hiredis.Reader()
    one.feed(body)
    out: list[Any] = []
    for _ in range(n):
        try:
            cmd = one.gets()
        except hiredis.ProtocolError:
            break
        if type(cmd) is not list:
            break
        out.append(cmd)
    return out + [None] * (n - len(out))


def _raw_kind(name: bytes) -> int:
    """Which fast path a RAW command's name takes (0: none). Byte compares, the usual
    spellings first: a dict lookup hashed the name (~420 instructions), ``lower()``
    was a Python-level method call (~330)."""
    if name == b"ADDJOB" or name == b"addjob":
        return _RAW_ADDJOB
    if name == b"ACKJOB" or name == b"ackjob":
        return _RAW_ACKJOB
    if name == b"GETJOB" or name == b"getjob":
        return _RAW_GETJOB
    if name == b"FASTACK" or name == b"fastack":
        return _RAW_FASTACK
    if len(name) == 6 or len(name) == 7:  # another mix of cases: rare
        lower = name.lower()
        if lower != name:
            return _raw_kind(lower)
    return 0


def _raw_deliverer(link: Link, rid: int, resp3: bool) -> Callable[[Any], None]:
    """How a RAW command's reply that comes later (a ``Wake``, the AOF) reaches its asker."""
    return lambda value: link.raw_reply(rid, encode(value, resp3))


def _ids_of(cmd: list[bytes]) -> list[str]:
    """A forwarded ACK's job IDs as the shard's keys (str; the asker checked each with
    ``slot_of_valid_id``). One decode per ID: joined, decoded once and split again
    cost ~700 instructions per ID against ~250 (``str.split`` makes each string)."""
    return [cmd[i].decode("ascii") for i in range(1, len(cmd))]

