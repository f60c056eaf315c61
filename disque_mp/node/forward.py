"""The asking side of the mesh: a client's command sent to the worker that owns it,
and its answer brought back into the client's reply stream.

``Forward`` (one per worker) holds every piece of that trip:

    raw            a hot command (ADDJOB, NOHANG GETJOB, ACKJOB, FASTACK) as the client's
                   RESP in this turn's RAW frame for its owner; its reply slot
                   (``ClientConn.defer_raw``) is filled with the owner's encoded bytes
    general        a general-path ``queue`` / ``ids`` command of one other owner, the same
                   way, within the connection's window of forwarded work
                   (``forwarded-commands-max``: ``windowed``, ``window_freed``)
    command        WAITJOB (its client ID goes before the IDs) by name in a CMDS frame,
                   within that window; ``ask`` sends a part of a command split over
                   owners the same way
    ack_parts      the other owners' parts of an ACKJOB / FASTACK split over owners, as
                   RAW commands whose counts are summed into one reply (``AckSum``)
    on_raw_replies a RAWREPLIES frame: each reply into its slot, each client advanced once
    raw_failed     RAW requests whose owner went away: the error in their place

The router decides where a command goes; this module only carries it there and
back. The owner runs what arrives (``peers.py`` decodes the frames, ``owner.py``
runs them).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from bus.mesh import Link, u32_keys, unpack
from disque_mp.node.connection import (
    ClientConn,
    ClientHost,
    CommandStats,
    DepartureWatch,
    PendingReply,
)
from disque_mp.node.resp import append_request, encode
from workers.invariant import InvariantError
from workers.replies import Error

# A general-path handler's answer for a command sent to its owner as RESP: the reply
# comes later and the owner counts the command (``Forward.general``).
FORWARDED: Final = object()


class Forward:
    """Worker ``w``'s forwarded commands: their frames, their window, their answers;
    ``stats`` counts them (INFO workers' ``forwarded``)."""

    def __init__(self, w: ClientHost, stats: CommandStats) -> None:
        self.w = w
        self.cfg = w.cfg
        self.stats = stats
        # The forwarded-work budget: general-path commands of one connection running on
        # another worker at once (config forwarded-commands-max), and the commands
        # held behind them in request order (their reply slots already reserved).
        self.in_flight: dict[ClientConn, int] = {}
        self.held: dict[ClientConn, deque[tuple[bool, Callable[[], None]]]] = {}

    def holds(self, conn: ClientConn) -> bool:
        """Commands of ``conn`` wait for room in its window: a later one goes behind them."""
        return bool(self.held) and conn in self.held

    # ------------------------------------------------------------------ RAW: hot commands

    def raw(self, conn: ClientConn, owner: int, cmd: list[bytes], name: str) -> bytes:
        """Send a hot command to its owner as RESP (mesh RAW); its reply bytes will
        fill a slot of ``conn`` (``on_raw_replies``). Returns b"" (the reply comes
        later). The owner counts the command (commandstats, slowlog), as it runs it."""
        conn.toward(owner)
        self.stats.forwarded += 1
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
        """``raw``'s held case apart: compiled, a lambda there put its every local in
        a closure object built on each call."""
        self.held[conn].append((False, lambda: self._send_raw(conn, owner, cmd, raw, slot)))

    def _send_raw(self, conn: ClientConn, owner: int, cmd: list[bytes], raw: bytes,
                  slot: PendingReply) -> None:
        link = self.w.mesh.links[owner]
        if link is None:
            raise InvariantError("a command forwarded to ourselves")
        append_request(link.add_raw(conn.resp3, slot), cmd, raw)

    def ack_parts(self, conn: ClientConn, groups: dict[int, list[bytes]], total: int) -> bytes:
        """The other owners' parts of an ACKJOB / FASTACK (``groups``: each owner's
        command, the name then its IDs; ``total``: what our own part acked), each as
        one RAW command, the counts summed into one reply (``AckSum``). The owners
        count the command (commandstats), as for a forwarded one. Returns b""."""
        self.stats.forwarded += len(groups)
        conn.forwarded += 1  # one reply slot, filled when every owner answered
        summed = AckSum(conn, conn.defer(), len(groups), total)
        for at, part_cmd in groups.items():
            link = self.w.mesh.links[at]
            if link is None:
                raise InvariantError("an ACK part forwarded to ourselves")
            append_request(link.add_raw(conn.resp3, summed), part_cmd)
        return b""

    # ------------------------------------------------------------------ the general path's

    def general(self, conn: ClientConn, owner: int, cmd: list[bytes]) -> Any:
        """A general-path command of one other owner (QLEN, SHOW, NACK ...: a ``queue``
        or ``ids`` route) sent as the hot ones are, RESP in the RAW frame (the client's
        own bytes when it has them), its reply coming back encoded in the client's
        protocol (a CMDS frame and a REPLIES frame through orjson cost about twice
        the work: bench/results/history/raw-general-2026-11-28.md). The owner runs it
        (``Owner.serve_general``) and counts it (commandstats, slowlog); so
        ``FORWARDED``, which the router does not count. It takes a place in the
        connection's window (``windowed``), freed by its reply (its slot is
        ``windowed``: ``on_raw_replies``, ``raw_failed``)."""
        conn.toward(owner)
        raw = conn.request_bytes(cmd)
        back = conn.defer_general()
        if (not self.held or conn not in self.held) and self.reserve_window(conn):
            self._send_general(conn, owner, cmd, raw, back)
        else:
            self.windowed(conn, True, functools.partial(self._send_general, conn, owner, cmd, raw, back))
        return FORWARDED

    def _send_general(self, conn: ClientConn, owner: int, cmd: list[bytes], raw: bytes,
                      back: PendingReply) -> None:
        self.stats.forwarded += 1
        self._send_raw(conn, owner, cmd, raw, back)

    def command(self, conn: ClientConn, owner: int, name: bytes, args: list[bytes]) -> None:
        """A command by name in a CMDS frame (WAITJOB: its client ID before the IDs),
        its reply into a slot of ``conn`` reserved now, within the window."""
        conn.toward(owner)
        # a partial: a nested def and its closure (compiled) make a cycle for the GC
        back = functools.partial(self._back, conn, conn.defer())
        self.windowed(conn, True, lambda: self.ask(owner, name, args, back))

    def _back(self, conn: ClientConn, slot: PendingReply, value: Any) -> None:
        """A CMDS command's reply from its owner (``command``)."""
        conn.fill(slot, encode(value, conn.resp3))
        self.window_freed(conn)

    def ask(self, owner: int, name: bytes, args: list[bytes], done: Callable[[Any], None]) -> None:
        """Run a job command on another worker (CMDS); ``done(reply value)``."""
        self.stats.forwarded += 1
        self.w.mesh.command(owner, name.decode(), args,
                            lambda meta, bodies: done(unpack(meta.get("v"), bodies)))

    # ------------------------------------------------------------------ the window

    def reserve_window(self, conn: ClientConn) -> bool:
        """Take a place in ``conn``'s window of general-path commands on other workers
        (``forwarded-commands-max``) if one is free; the caller holds the command if not."""
        n = self.in_flight.get(conn, 0)
        if n >= self.cfg.forwarded_commands_max:
            return False
        self.in_flight[conn] = n + 1
        return True

    def windowed(self, conn: ClientConn, counted: bool, send: Callable[[], None]) -> None:
        """Send a forwarded command now, or hold it (in order) while the connection has
        ``forwarded-commands-max`` general-path commands on other workers: a client
        that pipelines hundreds of heavy reads (QPEEK q 1000) for a queue another
        worker owns makes that worker build a window of replies at a time, and its
        output limits cut the rest (held commands of a closed client never run).
        ``counted``: the command takes a place in the window (a hot command only
        keeps its place in the order)."""
        held = self.held.get(conn)
        if held is None and (not counted or self.reserve_window(conn)):
            send()
            return
        if held is None:
            held = self.held[conn] = deque()
        if conn.transport is not None:
            conn.transport.pause_reading()  # its next commands wait for room
            DepartureWatch.watch(conn)  # a client that leaves meanwhile is seen
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

    # ------------------------------------------------------------------ the answers

    def on_raw_replies(self, link: Link, bodies: list[bytes]) -> None:
        """RAWREPLIES from an owner: each reply into its client's slot, then each
        client's ready prefix moved to its output once (not once per reply)."""
        words = u32_keys(bodies[0])  # each reply's request id, then its length
        data = bodies[1]
        pending = link.raw_pending
        touched: list[ClientConn] = []
        at = 0
        for i in range(0, len(words) - 1, 2):
            size: int = words[i + 1]
            end = at + size
            # one ``pop`` with the id as the object it is (a get, a del and the id
            # unboxed and boxed twice cost ~840 instructions per reply, this ~600)
            waiting = pending.pop(words[i], None)
            if type(waiting) is PendingReply:
                slot: PendingReply = waiting
                conn = slot.conn
                if conn is not None:
                    if conn.put_raw(slot, data[at:end]) and (not touched or touched[-1] is not conn):
                        touched.append(conn)
                    if slot.windowed:  # a general-path command's: its place in the window
                        self.window_freed(conn)
            elif waiting is not None:
                waiting.fill(None, data[at:end])  # a part of a split ACK (``AckSum``)
            at = end
        for conn in touched:
            conn.advance()

    def raw_failed(self, waiting: list[Any], text: str) -> None:
        """RAW requests whose owner went away: the client gets the error."""
        reply = encode(Error(text))
        for w in waiting:
            if type(w) is PendingReply:
                slot: PendingReply = w
                conn = slot.conn
                if conn is not None:
                    if conn.put_raw(slot, reply):
                        conn.advance()
                    if slot.windowed:
                        self.window_freed(conn)
            else:
                w.fill(None, reply)


class AckSum:
    """The reply of an ACKJOB / FASTACK split over owners: each owner's encoded count
    (or error) comes back through the mesh's RAW replies (``Forward.on_raw_replies``
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
