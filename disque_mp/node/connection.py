"""Client connections of one worker: listener, parsing, replies in request order.

Every worker binds the client port itself with SO_REUSEPORT, so the kernel
spreads new connections over the workers. A connection is an asyncio Protocol
(not streams: one callback per read, no per-command coroutine).

Replies: each read is parsed into commands that run in order; a reply that is
ready goes to ``out``; a reply that will come later (forwarded to another
worker, blocked GETJOB, node-wide gather) reserves a ``PendingReply``, and every later
reply queues behind it in ``slots`` until the slot is filled. Whatever is ready
when a read has been handled leaves in one ``transport.write``; replies
completed by other callbacks (mesh, timers) are written once per loop turn by
the worker's ``flush_dirty``.

A connection sees its worker as a ``ClientHost``: ``core.WorkerCore`` plus the
worker's connections (admission, the dirty list, the byte counters) and the two
parts a connection calls, typed by their native bases defined here: the
``CommandPath`` each command takes (``router.Router``) and the ``Mover`` that
hands a connection to another worker (``handoff.Handoff``); and the accounting
of what ran (``CommandStats``). ``worker.Worker``
extends ``ClientHost``; this module imports nothing above ``core.py``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import time
from typing import Any, Final

from disque_mp.node.authgate import auth_gate
from disque_mp.node.config import Config
from disque_mp.node.core import WorkerCore
from disque_mp.node.resp import RequestParser, encode
from disque_mp.node.slowlog import SlowLog
from workers.replies import Error

log = logging.getLogger("disque_mp.node.connection")
_perf_ns: Final = time.perf_counter_ns  # INFO commandstats; compiled in, no lookup per command


# The commands that may authenticate a connection (AUTH, HELLO ... AUTH): before
# AUTH each runs alone, so the bounds can change right after it.
_AUTH_WORDS: Final = frozenset((b"auth", b"hello"))




class PendingReply:
    """A reply that is not known yet; ``data`` is set once it is. ``conn``: the
    client of a command forwarded to its owner (``ClientConn.defer_raw``), whose
    reply bytes the mesh hands back with the slot alone. ``windowed``: a general-path
    command's (``ClientConn.defer_general``), whose reply frees a place in the
    connection's window of forwarded work."""

    __slots__ = ("data", "conn", "windowed")

    def __init__(self, conn: ClientConn | None = None) -> None:
        self.data: bytes | None = None
        self.conn = conn
        self.windowed = False


# The slots of forwarded commands (``defer_raw``) once their reply has left, kept for
# the next forward: a new object per forwarded command, its allocation and its
# freeing, cost ~300 instructions more than reusing one. Bounded: a burst of
# forwards past it allocates, and the pool never holds more than this many.
raw_slots_free_max = 4096
_raw_slots_free: Final[list[PendingReply]] = []


class ClientConn(asyncio.Protocol):
    __slots__ = (
        "node", "transport", "parser", "out", "slots", "resp3", "authed", "name",
        "lib_name", "lib_ver", "id", "ctime_s", "last_cmd", "last_s", "closing",
        "waiters", "dirty", "streak_owner", "streak", "handoffs", "addr", "gone",
        "close_after_write", "soft_since_s", "unsent", "unfilled", "forwarded", "out_bytes",
        "auth_fails", "throttled", "slots_bytes", "write_paused", "pile_paused",
        "cmd_at", "cmd_now", "departure", "backlog",
    )

    def __init__(self, node: ClientHost, state: dict[str, Any] | None = None) -> None:
        self.node = node
        self.transport: asyncio.Transport | None = None
        cfg = node.cfg
        self.parser = RequestParser(cfg.proto_max_bulk_len, cfg.proto_max_multibulk_len,
                                    cfg.client_query_buffer_bytes_max)
        # the command ``run_commands`` is running (``request_bytes``) and its place in the read
        self.cmd_now: list[bytes] | None = None
        self.cmd_at = 0
        self.out: list[bytes] = []
        self.out_bytes = 0  # bytes in ``out`` (the output limits' count between writes)
        # (a list, not a deque: mypyc compiles a list's append, index and slice
        # deletion natively, a deque's are generic method calls, ~500 instructions
        # more per reply that waits here)
        self.slots: list[bytes | PendingReply] | None = None
        # bytes of the replies ready in ``slots`` (waiting behind one not known yet):
        # they count against the output limits as the written ones do
        self.slots_bytes = 0
        # reading paused: the client reads too slowly (``pause_writing``), or the
        # replies piled behind a blocked one are over the soft output limit
        self.write_paused = False
        self.pile_paused = False
        self.departure: DepartureWatch | None = None  # while reading is paused
        self.backlog: Backlog | None = None  # commands of a read left for a later turn
        self.resp3 = False
        self.authed = not cfg.requirepass
        self.name = b""
        self.lib_name = b""
        self.lib_ver = b""
        self.id = node.new_client_id()
        self.ctime_s = time.time()
        self.last_cmd = "NULL"
        self.last_s = self.ctime_s
        self.closing = False  # no more commands are read (QUIT, protocol error)
        self.close_after_write = False
        self.gone = False  # connection lost or handed to another worker
        self.waiters: set[Any] = set()  # blocked GETJOBs to cancel on disconnect
        self.dirty = False
        self.streak_owner = -1  # handoff: the owner the last commands went to
        self.streak = 0
        self.handoffs = 0
        self.addr = ""
        self.soft_since_s = 0.0  # output over the soft limit since then (0: it is not)
        # Bytes the transport held after our last write: what it holds now or more (it
        # only drains between our writes), so the output limits' room read from it is
        # never larger than the truth; ``check_output`` reads the true size.
        self.unsent = 0
        self.unfilled = 0  # deferred replies not known yet
        self.forwarded = 0  # ... of which hot commands forwarded to their owner (RAW)
        self.auth_fails = 0  # wrong passwords given (each delays the next command)
        self.throttled = False  # reading paused after a wrong password
        if state:
            self._restore(state)

    # --- asyncio callbacks ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.addr = f"{peer[0]}:{peer[1]}"
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            _tune(sock, self.node.cfg.tcp_keepalive)
        self.node.conn_opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        self.transport = None
        # replies piled behind a blocked one go with the client (a blocked GETJOB
        # may keep this object alive until its timeout)
        self.slots = None
        self.slots_bytes = 0
        self.node.conn_closed(self)

    def pause_writing(self) -> None:
        # The client does not read its replies: stop reading its commands
        # (backpressure bounds the output buffer instead of letting it grow).
        self.write_paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.read_again()

    def read_again(self) -> None:  # unless its output, a password, a pile or a backlog holds it
        if self.transport is not None and not self.closing and not self.throttled \
                and not self.pile_paused and not self.write_paused and self.backlog is None:
            self.transport.resume_reading()

    def _follow_pile(self, soft: int) -> None:
        """Stop reading while the replies piled behind a blocked one are over the soft
        output limit (they cannot leave, so the client's next commands would only
        pile more until the soft seconds close it); read again once under it."""
        transport = self.transport
        over = bool(soft) and self.slots_bytes > soft
        if transport is None or over == self.pile_paused:
            return
        self.pile_paused = over
        if over:
            transport.pause_reading()
            DepartureWatch.watch(self)
        else:
            self.read_again()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.node.net_in_bytes += len(data)
        if not self.authed:
            self._unauthed_received(data)
            return
        cmds, error = self.parser.feed(data)
        if self.backlog is not None:  # read while earlier commands wait: after them
            self.backlog.more(cmds, error)
            return
        self.run_commands(cmds, error)

    def request_bytes(self, cmd: list[bytes]) -> bytes:
        """``cmd``'s bytes as this client sent them, when it is the command ``run_commands``
        is running and the read was parsed whole by the fast path (a forward copies
        them instead of encoding the arguments again); else b""."""
        if cmd is not self.cmd_now:
            return b""
        return self.parser.span(self.cmd_at)

    def _unauthed_received(self, data: bytes) -> None:
        """Before AUTH the parser holds the small bounds and gives one command at a
        time: once one authenticates, the rest of the read is parsed with the full
        bounds (as Redis, which parses one command, runs it, parses the next). The
        commands that cannot authenticate run together (one batch, one write)."""
        parser = self.parser
        cfg = self.node.cfg  # Redis' bounds before AUTH (CVE-2021-32675)
        parser.restrict(cfg.unauth_multibulk_len_max, cfg.unauth_bulk_bytes_max)
        if data and not self.throttled and auth_gate.ahead():
            # wrong passwords are being tried on this worker: a new read waits its turn
            error = parser.hold(data)
            if error is None:
                self._throttle(auth_gate.turn(cfg))
                return
            cmds: list[list[bytes]] = []
        else:
            cmds, error = parser.feed(data, once=True)
        batch: list[list[bytes]] = []
        while cmds and error is None and not self.closing:
            if cmds[0][0].lower() not in _AUTH_WORDS:
                batch += cmds  # answered NOAUTH (or PING, QUIT): nothing changes the bounds
                cmds, error = parser.feed(b"", once=True)
                continue
            if batch:
                self.run_commands(batch, None)
                batch = []
                if self.closing:
                    break
            fails = self.auth_fails
            self.run_commands(cmds, None)
            if self.auth_fails != fails and not self.authed:
                self._throttle(auth_gate.failed(cfg))  # the rest stays in the parser
                return
            if self.authed:
                parser.unrestrict()
                cmds, error = parser.feed(b"")
                break
            cmds, error = parser.feed(b"", once=True)
        self.run_commands([] if self.closing else batch + cmds, error)  # nothing runs after QUIT or POST

    def _throttle(self, until_s: float) -> None:
        """Read the next command at ``until_s`` (the loop's clock): after a wrong
        password, or while wrong passwords are being tried on this worker
        (``AuthGate``). Redis answers at once."""
        transport = self.transport
        if transport is None:
            return
        self.throttled = True
        transport.pause_reading()
        asyncio.get_running_loop().call_at(until_s, self._unthrottle)

    def _unthrottle(self) -> None:
        self.throttled = False
        if self.transport is None or self.closing:
            return
        self.transport.resume_reading()
        self._unauthed_received(b"")  # what was read behind the wrong password

    def run_commands(self, cmds: list[list[bytes]], error: str | None) -> None:
        node = self.node
        if cmds:
            node.begin_batch()
            self.last_s = node.now_ms / 1000
            lim = output_limits(node.cfg.client_output_buffer_limit)
            router = node.router
            # A pipeline of big replies is cut as it grows: ``check_output`` runs once
            # this read's replies pass the smaller limit (less what is still buffered).
            room = lim.room(self.unsent)
            queued = 0
            spent = 0  # reply bytes built this turn (turn_reply_bytes_max)
            for i, cmd in enumerate(cmds):
                self.cmd_at = i
                self.cmd_now = cmd
                reply = router.execute(self, cmd)  # a native call (no bound method)
                if reply is not None:
                    spent += len(reply)
                    if self.slots:
                        self.slots.append(reply)
                        self.slots_bytes += len(reply)
                        if queued + self.slots_bytes > room:
                            self.check_output(queued, lim)
                    else:
                        self.out.append(reply)
                        self.out_bytes += len(reply)
                        queued += len(reply)
                        if queued > room:
                            self.check_output(queued, lim)
                if self.closing:
                    break
                if spent > turn_reply_bytes_max and i + 1 < len(cmds) and self.authed:
                    self.backlog, error = Backlog(self, cmds[i + 1:], error), None  # later
                    break
            self.cmd_now = None
            self.parser.raw = b""  # an idle connection keeps no copy of its last read
            node.end_batch()
        if error is not None and not self.closing:
            self.reply(encode(Error("ERR " + error)))
            self.closing = True
            self.close_after_write = True
            node.log(f"client {self.addr}: {error}, closing")
        if not self.unfilled or self.unfilled != self.forwarded or self.close_after_write:
            self.write_out()
        # else every reply still missing is a forwarded hot command, due within one
        # mesh round trip: the ready prefix leaves with them in one write (``fill``),
        # not in a write of its own (each loopback send also wakes the client).
        if not self.closing and self.streak >= node.handoff.streak_min:
            node.handoff.consider(self)

    def cross_protocol(self) -> bytes:
        """An HTTP request line or header sent as a command (a web page making a
        browser POST to this port): close without a reply and without running what
        follows, as Redis does."""
        self.closing = True
        self.close_after_write = True
        log.warning("Possible SECURITY ATTACK detected. It looks like somebody is sending "
                    "POST or Host: commands to Disque. This is likely due to an attacker "
                    "attempting to use Cross Protocol Scripting to compromise your Disque "
                    "instance. Connection aborted. (client %s)", self.addr)
        return b""

    # --- replies ---

    def reply(self, data: bytes) -> None:
        if self.slots:
            self.slots.append(data)
            self.slots_bytes += len(data)
        else:
            self.out.append(data)
            self.out_bytes += len(data)

    def toward(self, owner: int) -> None:
        """A command of this client went to worker ``owner``: the streak of
        consecutive ones to one other worker that hands the connection off to it."""
        if self.streak_owner == owner:
            self.streak += 1
        else:
            self.streak_owner = owner
            self.streak = 1

    def defer(self) -> PendingReply:
        self.unfilled += 1
        slot = PendingReply()
        if self.slots is None:
            self.slots = []
        self.slots.append(slot)
        return slot

    def defer_raw(self) -> PendingReply:
        """The slot of a hot command forwarded to its owner: it knows its client, and
        counts in ``forwarded`` until ``put_raw``."""
        self.forwarded += 1
        return self._pooled_slot()

    def defer_general(self) -> PendingReply:
        """The slot of a general-path command forwarded in a RAW frame
        (``forward.Forward.general``): ``defer_raw``'s, ``windowed``, and not counted in
        ``forwarded`` (its reply may wait long: ADDJOB ... REPLICATE, GLOBALQLEN, so
        the replies ready before it leave at once, as for one worker)."""
        slot = self._pooled_slot()
        slot.windowed = True
        return slot

    def _pooled_slot(self) -> PendingReply:
        """A forwarded command's reply slot, in order behind the others: a reused one
        (``_raw_slots_free``) or a new one, ``unfilled`` until its reply comes."""
        self.unfilled += 1
        if _raw_slots_free:
            slot = _raw_slots_free.pop()
            slot.conn = self
        else:
            slot = PendingReply(self)
        if self.slots is None:
            self.slots = []
        self.slots.append(slot)
        return slot

    def put_raw(self, slot: PendingReply, data: bytes) -> bool:
        """A forwarded command's reply, stored in its slot without moving anything
        (the mesh stores a frame's replies, then ``advance``s each client once).
        False when the client is gone or closed (nothing to advance)."""
        if not slot.windowed:
            self.forwarded -= 1
        if slot.data is None:
            self.unfilled -= 1
        slot.data = data
        if self.slots is None or self.gone:
            return False
        self.slots_bytes += len(data)
        return True

    def fill(self, slot: PendingReply, data: bytes) -> None:
        """Complete a deferred reply; the ready prefix is written this loop turn."""
        if slot.data is None:
            self.unfilled -= 1
        slot.data = data
        if self.slots is None or self.gone:
            return
        self.slots_bytes += len(data)
        self.advance()

    def advance(self) -> None:
        """Move the ready prefix of the deferred replies to the output (written this
        loop turn), against the output limits."""
        slots = self.slots
        if slots is None or self.gone:
            return
        moved = 0
        out = self.out
        i = 0
        n = len(slots)
        while i < n:
            head = slots[i]
            ready: bytes
            if type(head) is PendingReply:
                if head.data is None:
                    break
                ready = head.data
                if head.conn is not None and len(_raw_slots_free) < raw_slots_free_max:
                    # a forwarded command's slot, filled and now passed: nothing else
                    # holds it (the link dropped it when its reply came), reused
                    head.data = None
                    head.conn = None
                    head.windowed = False
                    _raw_slots_free.append(head)
            else:
                ready = head  # type: ignore[assignment]
            out.append(ready)
            moved += len(ready)
            i += 1
        if i == n:
            slots.clear()
        elif i:
            del slots[:i]
        self.slots_bytes -= moved
        self.out_bytes += moved
        lim = output_limits(self.node.cfg.client_output_buffer_limit)
        if self.pile_paused:
            self._follow_pile(lim.soft)
        # replies from other workers count as they arrive, written or piled
        if self.out_bytes + self.slots_bytes > lim.room(self.unsent):
            self.check_output(self.out_bytes, lim)
        if self.out:  # else a reply behind one still missing: nothing new to write
            self.node.mark_dirty(self)

    def write_out(self) -> None:
        self.dirty = False
        transport = self.transport
        if transport is None:
            self.out.clear()
            self.out_bytes = 0
            return
        out = self.out
        if out:
            data = out[0] if len(out) == 1 else b"".join(out)
            out.clear()
            self.out_bytes = 0
            self.node.net_out_bytes += len(data)
            transport.write(data)
            self.unsent = transport.get_write_buffer_size()
            lim = output_limits(self.node.cfg.client_output_buffer_limit)
            if self.soft_since_s or lim.room(self.unsent) < 0:
                self.check_output(0, lim)
        if self.close_after_write and not self.slots:
            transport.close()

    def check_output(self, queued: int, lim: OutputLimits) -> None:
        """Redis' client-output-buffer-limit: past ``hard`` bytes of unread replies,
        or past ``soft`` for more than ``soft_s`` seconds, the client is closed
        (and logged); what it has not read is dropped."""
        transport = self.transport
        if transport is None or self.closing:
            return
        hard, soft, soft_s = lim.hard, lim.soft, lim.soft_s
        size = queued + self.slots_bytes + transport.get_write_buffer_size()
        over = bool(hard) and size > hard
        if not over and soft and size > soft:
            now = time.monotonic()
            if self.slots_bytes > soft:
                self._follow_pile(soft)
            if not self.soft_since_s:
                self.soft_since_s = now  # the first time: not closed yet (as Redis)
                # A client that reads nothing sends nothing either (backpressure stops
                # reading it): look again once its seconds are over.
                asyncio.get_running_loop().call_later(soft_s + soft_recheck_s, self._recheck_soft)
            elif now - self.soft_since_s > soft_s:
                over = True
        elif not over:
            self.soft_since_s = 0.0
        if over:
            self.drop(f"Client id={self.id} addr={self.addr} closed for overcoming of output "
                      f"buffer limits ({size} bytes unread)")

    def drop(self, why: str) -> None:
        """Close now (logged), and what the client has not read goes with it."""
        self.closing = True
        self.out.clear()
        self.out_bytes = 0
        self.slots = None
        self.slots_bytes = 0
        self.node.log(why)
        if self.transport is not None:
            self.transport.abort()

    def _recheck_soft(self) -> None:
        lim = output_limits(self.node.cfg.client_output_buffer_limit)
        if self.soft_since_s and lim.soft:
            self.check_output(self.out_bytes, lim)

    def pending(self) -> bool:
        return bool(self.slots) or bool(self.out) or self.backlog is not None

    # --- handoff state ---

    def state(self) -> dict[str, Any]:
        return {"resp3": self.resp3, "authed": self.authed, "name": self.name.decode("latin-1"),
                "lib_name": self.lib_name.decode("latin-1"), "lib_ver": self.lib_ver.decode("latin-1"),
                "id": self.id, "ctime": self.ctime_s, "handoffs": self.handoffs + 1}

    def _restore(self, state: dict[str, Any]) -> None:
        self.resp3 = bool(state.get("resp3"))
        self.authed = bool(state.get("authed", self.authed))
        self.name = str(state.get("name", "")).encode("latin-1")
        self.lib_name = str(state.get("lib_name", "")).encode("latin-1")
        self.lib_ver = str(state.get("lib_ver", "")).encode("latin-1")
        self.id = int(state.get("id", self.id))
        self.ctime_s = float(state.get("ctime", self.ctime_s))
        self.handoffs = int(state.get("handoffs", 0))


soft_recheck_s = 0.1  # past the soft seconds, when to look at a silent client again
departure_probe_s = 1.0  # while a client is not read, how often to see whether it left
# Reply bytes one connection's commands build in one loop turn: past them, the rest
# of its read waits for the next turn (``Backlog``), so other clients are served
# in between (a pipeline of 300 QPEEK q 1000 over 2 KB jobs is 600 MB of replies)
turn_reply_bytes_max = 1 << 20

# TCP states (linux/tcp_states.h) of a socket whose peer has closed its end
_TCP_CLOSE: Final = 7
_TCP_CLOSE_WAIT: Final = 8


class Backlog:
    """The commands of a connection's read that wait for a later loop turn: its
    replies passed ``turn_reply_bytes_max`` this turn. Reading stays paused
    meanwhile (what is read anyway goes after them, ``more``); each turn runs the
    next share, so the worker's other clients are served in between, and the
    output limits cut a client that reads nothing as before (Redis' semantics);
    when they are done, the client is read again."""

    __slots__ = ("conn", "cmds", "error")

    def __init__(self, conn: ClientConn, cmds: list[list[bytes]], error: str | None) -> None:
        self.conn = conn
        self.cmds = cmds
        self.error = error  # the read's protocol error, answered after its commands
        if conn.transport is not None:
            conn.transport.pause_reading()
        asyncio.get_running_loop().call_soon(self.run)

    def more(self, cmds: list[list[bytes]], error: str | None) -> None:
        self.conn.parser.raw = b""  # they run later: no span of this read is theirs
        self.cmds += cmds
        if self.error is None:
            self.error = error
        if self.conn.transport is not None:
            self.conn.transport.pause_reading()

    def run(self) -> None:
        conn = self.conn
        if conn.backlog is not self:
            return
        conn.backlog = None
        if conn.transport is not None and not conn.gone and not conn.closing:
            conn.run_commands(self.cmds, self.error)
            conn.read_again()


class DepartureWatch:
    """A connection whose reading is paused (replies piled behind a blocked one over
    the soft output limit, commands held for the forwarded window) reads no end of
    file: a client that left would keep its replies until one is written, and a
    WAITJOB may never answer. Every ``departure_probe_s`` while reading stays
    paused, ask the socket (``peer_left``); a client that left is dropped at once,
    its replies with it (as Redis frees a client on a read of 0 bytes)."""

    __slots__ = ("conn",)

    def __init__(self, conn: ClientConn) -> None:
        self.conn = conn
        asyncio.get_running_loop().call_later(departure_probe_s, self.probe)

    @staticmethod
    def watch(conn: ClientConn) -> None:
        """Reading ``conn`` was paused: watch it, unless it is watched already."""
        if conn.departure is None and conn.transport is not None:
            conn.departure = DepartureWatch(conn)

    def probe(self) -> None:
        conn = self.conn
        transport = conn.transport
        if transport is None or conn.gone or conn.closing or transport.is_reading():
            conn.departure = None  # gone, closing, or read again: its end of file is read
        elif peer_left(transport.get_extra_info("socket")):
            conn.departure = None
            conn.drop(f"Client id={conn.id} addr={conn.addr} left while its replies waited")
        else:
            asyncio.get_running_loop().call_later(departure_probe_s, self.probe)


class OutputLimits:
    """``client-output-buffer-limit`` ("normal H S T", as the config keeps it),
    parsed once per value: bytes (0 = no such limit) and the soft limit's seconds."""

    __slots__ = ("text", "hard", "soft", "soft_s", "low")

    def __init__(self) -> None:
        self.text = ""
        self.hard = self.soft = self.soft_s = 0
        self.low = 0  # the smaller limit there is (0: none)

    def parse(self, text: str) -> None:
        words = text.split()
        try:
            self.hard, self.soft, self.soft_s = int(words[1]), int(words[2]), int(words[3])
        except (IndexError, ValueError):
            self.hard = self.soft = self.soft_s = 0
        hard, soft = self.hard, self.soft
        self.low = hard if not soft or (hard and hard < soft) else soft
        self.text = text

    def room(self, unsent: int) -> int:
        """Bytes of replies that still fit under the smaller limit beside ``unsent``
        bytes not yet sent (a huge number when there is no limit). The caller's
        ``ClientConn.unsent``: one read of the transport per write, not per use."""
        if not self.low:
            return 1 << 62
        return self.low - unsent


_limits: Final = OutputLimits()


def output_limits(text: str) -> OutputLimits:
    """The parsed limits of ``text`` (the same object while the value stays)."""
    if text is not _limits.text:
        _limits.parse(text)
    return _limits


def peer_left(sock: Any) -> bool:
    """The client closed its end (FIN or RST) though nothing reads it: TCP_INFO's
    state (its first byte) is CLOSE_WAIT or CLOSE, whatever input is still unread;
    a Unix socket: a peek reads its end of file. False when it cannot tell."""
    if sock is None:
        return False
    try:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
            return state in (_TCP_CLOSE, _TCP_CLOSE_WAIT)
        with socket.socket(fileno=os.dup(sock.fileno())) as peek:
            return peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (OSError, AttributeError, ValueError, IndexError):
        return False  # no data (BlockingIOError), or nothing to ask: still there


def _tune(sock: Any, keepalive_s: int) -> None:
    """TCP_NODELAY (replies are small and must not wait) and Redis' tcp-keepalive."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if keepalive_s > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, keepalive_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, keepalive_s // 3))
    except (OSError, AttributeError):
        pass  # not every platform has every option: keep the defaults


# ---------------------------------------------------------------------- the worker's side

# Redis' text, word for word (redis-cli users search for it)
DENIED_PROTECTED: Final = (
    b"-DENIED Redis is running in protected mode because protected mode is enabled and no "
    b"password is set for the default user. In this mode connections are only accepted from "
    b"the loopback interface. If you want to connect from external computers to Redis you may "
    b"adopt one of the following solutions: 1) Just disable protected mode sending the command "
    b"'CONFIG SET protected-mode no' from the loopback interface by connecting to Redis from the "
    b"same host the server is running, however MAKE SURE Redis is not publicly accessible from "
    b"internet if you do so. Use CONFIG REWRITE to make this change permanent. 2) Alternatively "
    b"you can just disable the protected mode by editing the Redis configuration file, and "
    b"setting the protected mode option to 'no', and then restarting the server. 3) If you "
    b"started the server manually just for testing, restart it with the '--protected-mode no' "
    b"option. 4) Set up an authentication password for the default user. NOTE: You only need "
    b"to do one of the above things in order for the server to start accepting connections "
    b"from the outside.\r\n")


def is_loopback_addr(addr: str, with_port: bool = True) -> bool:
    """``addr`` is ``ip:port`` as ClientConn.addr holds it (or a bare IP with
    ``with_port=False``); "" (a Unix socket) and "localhost" count as loopback."""
    if not addr or addr == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(addr.rpartition(":")[0] if with_port else addr)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


class CmdStat:
    """One command's INFO commandstats entry: its calls and their time (ns). Native
    attributes: a hot command's count adds to two machine ints (a list of two boxed
    ints took an allocation and two generic adds per command)."""

    __slots__ = ("calls", "ns")

    def __init__(self) -> None:
        self.calls = 0
        self.ns = 0


class CommandStats:
    """The accounting of the commands a worker runs, which INFO and the slowlog
    read: the client side counts what it answers, the owner side what it runs for
    another worker, the asking side what it forwards."""

    def __init__(self, slowlog: SlowLog) -> None:
        self.commands_processed = 0
        self.forwarded = 0  # commands sent to their owner over the mesh (INFO workers)
        self.cmdstats: dict[str, CmdStat] = {}  # INFO commandstats: name -> calls, ns
        self.slowlog = slowlog
        self.slowlog_min_ns = slowlog.min_ns  # read per command: a native attribute

    def entry(self, name: str) -> CmdStat:
        """Command ``name``'s entry, made on first use."""
        stat = self.cmdstats.get(name)
        if stat is None:
            stat = self.cmdstats[name] = CmdStat()
        return stat

    def count(self, name: str, t0: int, cmd: list[bytes]) -> None:
        """A fast path's command ran from ``t0``: ``account`` of its entry by name."""
        self.account(self.cmdstats[name], t0, cmd)

    def account(self, stat: CmdStat, t0: int, cmd: list[bytes]) -> None:
        """A command ran from ``t0`` (``stat``: its commandstats entry)."""
        took = _perf_ns() - t0
        stat.calls += 1
        stat.ns += took
        if took >= self.slowlog_min_ns >= 0:
            self.slowlog.add(cmd, took)
        self.commands_processed += 1

    def snapshot(self) -> dict[str, list[int]]:
        """The entries that counted a call, as INFO's report carries them: name ->
        [calls, ns]."""
        return {k: [v.calls, v.ns] for k, v in self.cmdstats.items() if v.calls}

    def reset(self) -> None:
        """CONFIG RESETSTAT: every entry, and the counters, back to 0."""
        for stat in self.cmdstats.values():
            stat.calls = stat.ns = 0
        self.commands_processed = 0
        self.forwarded = 0


class CommandPath:
    """What a connection runs each of its commands through (``router.Router``)."""

    def execute(self, conn: ClientConn, cmd: list[bytes]) -> bytes | None:
        """One command's encoded reply, or None when it will come later."""
        raise NotImplementedError


class Mover:
    """What moves a connection to the worker its traffic goes to (``handoff.Handoff``)."""

    def __init__(self, streak_min: int) -> None:
        self.streak_min = streak_min  # consecutive commands for one other worker
        self.handed_off = 0  # INFO: connections given away

    def start(self) -> None:
        """Inside the running loop: open the way to the other workers."""

    def close(self) -> None:
        """At shutdown."""

    def consider(self, conn: ClientConn) -> None:
        """Hand ``conn`` over unless something still ties it here."""
        raise NotImplementedError


class ClientHost(WorkerCore):
    """A worker as its client connections see it: the shared core, its
    connections, and the parts they call (set by ``Worker``)."""

    router: CommandPath
    handoff: Mover

    def __init__(self, cfg: Config, index: int, node_id: str) -> None:
        super().__init__(cfg, index, node_id)
        self.conns: set[ClientConn] = set()
        self.dirty: list[ClientConn] = []  # replies completed outside their read
        self.flush_scheduled = False
        self.next_client = 0
        # stats (INFO; the router counts the commands)
        self.net_in_bytes = 0
        self.net_out_bytes = 0
        self.connections_received = 0
        self.rejected_connections = 0
        # protected mode (Redis'): no password and bound beyond loopback -> loopback clients only
        self.protected_bind = any(not is_loopback_addr(a, False) for a in cfg.bind.split() or ["*"])

    def new_client_id(self) -> int:
        self.next_client += 1
        return self.next_client * self.workers + self.index  # unique over the node

    def conn_opened(self, conn: ClientConn) -> None:
        if self.protected_bind and self.cfg.protected_mode and not self.cfg.requirepass \
                and not conn.handoffs and not is_loopback_addr(conn.addr):
            self._refuse(conn, DENIED_PROTECTED)
            return
        if len(self.conns) * self.workers >= self.cfg.maxclients:
            self._refuse(conn, b"-ERR max number of clients reached\r\n")
            return
        self.conns.add(conn)
        if not conn.handoffs:  # a connection moved here was counted where it arrived
            self.connections_received += 1

    def _refuse(self, conn: ClientConn, reply: bytes) -> None:
        self.rejected_connections += 1
        transport = conn.transport
        if transport is not None:
            transport.write(reply)
            transport.close()
        conn.closing = True

    def conn_closed(self, conn: ClientConn) -> None:
        self.conns.discard(conn)
        for waiter in list(conn.waiters):
            waiter.cancel()

    def mark_dirty(self, conn: ClientConn) -> None:
        if not conn.dirty:
            conn.dirty = True
            self.dirty.append(conn)
            if not self.flush_scheduled:
                self.flush_scheduled = True
                self.loop.call_soon(self.flush_dirty)

    def flush_dirty(self) -> None:
        """Replies completed outside a client's read: one write per connection per turn."""
        self.flush_scheduled = False
        dirty, self.dirty = self.dirty, []
        self.aof_before_replies()
        for conn in dirty:
            conn.write_out()
            if conn.streak >= self.handoff.streak_min and not conn.closing:
                self.handoff.consider(conn)

    def connection(self) -> ClientConn:
        """A connection of this worker with no client behind it, never registered
        (not in INFO or CLIENT LIST): the HTTP API runs its commands on one."""
        return ClientConn(self)
