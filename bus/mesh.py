"""The local mesh: frames between the worker processes of one host.

Every worker listens on a Unix socket in the node's private socket directory
(``bus/peercred.py``: mode 0700, made by the supervisor) and opens one connection
to every other worker, after checking that the listener is another worker of ours. A worker's requests travel on its own outgoing connection and
their answers come back on it; so an owner never needs to know who is asking,
it answers on the link the request came from.

Frame kinds (meta is an orjson object, bodies raw bytes, see ``bus/frames.py``):

    CMD      {"r", "n": command}            bodies: args     -> REPLY {"r", "v"}
    TAKES    {}  bodies: [words, queue names joined]          -> TOOKS
             the non-blocking takes of the GETJOBs one worker coordinated during one
             loop turn, for one owner (``Link.add_take``): per take, native-endian
             i64 words rid, count, withcounters, the number of its queues, the number
             of hints, each queue name's length, the hints (only when the asker's
             queues hold jobs: one per queue of the GETJOB, -1 for the receiver's,
             else what the asker knows the queue holds: ``getjob.take_share``)
    TOOKS    {}  bodies: [(rid, took length) pairs, the tooks joined]
             the owner's answers, one per take, in one frame per turn (``Link.tooks``):
             u32 pairs, as RAWREPLIES'; each took is ``pack_took`` (what each of the
             receiver's queues could give before the take, when hinted, and the jobs
             taken, already RESP), empty when there is neither
    BLOCK    {"t": token, "c", "w"}        bodies: queues   -> later WAKE {"t"} [took],
                                                               or {"t", "e": error}
    UNBLOCK  {"t"}
    RETURN   {}                            bodies: job IDs (surplus of a GETJOB)
    SCATTER  {"r", "op", "a": JSON arg}    node-wide work    -> REPLY {"r", "v"}
    CMDS     {"r": [rid], "n": [command], "c": [argc]}  bodies: all args
    REPLIES  {"r": [rid], "v": [value]}   bodies: shared by the values
    REPLY / REPLIES carry packed reply values (``pack``/``unpack``).
    RAW      {}  bodies: [head, the commands as RESP]              -> RAWREPLIES
             head: the first command's request id (u32, little endian; the others
             follow it one by one, ``raw_ids``), then one RESP3 flag byte per command
    RAWREPLIES {}  bodies: [(request id, reply length) pairs, the replies as RESP bytes]

RAW is the hot path of forwarding (``node/forward.py``, ``Forward.raw``): the commands of
one loop turn travel as the RESP a client would send (the owner parses them
with hiredis, in C), and their answers come back already encoded for each
client's protocol, so the asking worker splices the bytes into the client's
reply stream without decoding anything. Ids and lengths are native-endian
u32 arrays (both ends are processes of one host); no JSON in either direction.
With many workers on few cores a RAW frame carries a command or two, so what a
frame costs apart from its commands is paid by each: a RAW frame's ids are its
first one alone (a batch's ids follow each other), a RAWREPLIES frame's ids and
lengths one array, and a read of RAWREPLIES alone skips the shard's end-of-read
work (its replies only go into client streams).

Job commands forwarded during one loop turn travel as one CMDS frame per
peer, and the answers ready in one turn as one REPLIES frame: a frame per
command cost about a fifth of both workers' time under mixed pipelined
traffic (py-spy: frame encode and decode). A batch is closed before any other
frame is queued on its link, so frames keep their order. Frames for one peer
produced during one loop turn leave in one write.

The TAKEs of a GETJOB over several owners batch the same way: every take this
worker sends one owner during a loop turn leaves in one TAKES frame, answered
by one TOOKS frame, with no JSON either way (a frame of its own per TAKE, with an
orjson meta and a REPLIES answer through ``pack``, cost more than the take's work
at the owner: bench/results/history/getjob-batch-2026-11-28.md). At most one of the RAW,
CMDS and TAKES batches is open on a link: opening one closes the other, so an
owner runs one client's pipelined ADDJOB and GETJOB (or GETJOB and ADDJOB) in the
order the client sent them, as a single worker would.

Connections (client sockets) move between workers over a datagram socket
beside the mesh (``bus/sockpass.py`` with ``HANDOFF_PURPOSE``): SCM_RIGHTS
carries the descriptor, the datagram the connection's state.
"""

from __future__ import annotations

import array
import asyncio
import logging
import socket
import struct
from collections.abc import Callable
from typing import Any, Final, Protocol

from bus import auth as bus_auth
from bus import frames, peercred
from bus.frames import FrameError, FrameReader, frame_bodies_max
from workers.invariant import InvariantError
from workers.replies import NULL_ARRAY, Error, Status

# The frame encoder, as a variable (read at each frame, not bound at compile time):
# bench/meshcount wraps it to count the frames by kind.
encode: Callable[..., bytes] = frames.encode
# A batch frame's header (``batch_frame``): ``frames``' header with its two or three
# body lengths, packed at once.
_BATCH_HEAD2: Final = struct.Struct(">2sBBIHII")
_BATCH_HEAD3: Final = struct.Struct(">2sBBIHIII")

K_CMD, K_REPLY, K_TAKES, K_BLOCK, K_UNBLOCK, K_WAKE, K_RETURN, K_SCATTER = range(1, 9)
K_CMDS, K_REPLIES = 9, 10
K_RAW, K_RAWREPLIES = 11, 12
K_TOOKS = 13
KINDS = frozenset(range(1, 14))
# the words of one take in a TAKES frame before its queue lengths (``Link.add_take``)
TAKE_HEAD_WORDS = 5

# Frames queued for a peer that is not connected yet (start-up, restart): past
# this the requests fail instead of growing memory without end.
backlog_bytes_max = 64 << 20
reconnect_delay_s = 0.05  # peers start within a few hundred ms of each other
# Connection handoff (bus/sockpass.py): worker i's datagram socket "...<i>.fd",
# beside its mesh listener "...<i>".
HANDOFF_PURPOSE = "{index}.fd"
handoff_state_bytes_max = 64 * 1024  # one datagram: a connection's small state
# A forwarded command travels with one frame body per argument (and a reply with one
# per bulk string): past the frame's body count it is refused with this error.
refused_log_every = 1000  # a client repeating a refused command must not flood the log
ERR_TOO_BIG = f"ERR too many arguments or reply parts to forward to another worker (max {frame_bodies_max})"


def socket_name(port: int, node_id: str, index: int) -> str:
    """Worker ``index``'s mesh listener, in the node's private socket directory."""
    return peercred.local_name(port, node_id, str(index))


def batch_frame(kind: int, first: bytes, second: bytes | None, parts: list[bytes]) -> bytes:
    """A batch frame without metadata (RAW, RAWREPLIES, TOOKS, TAKES), the bytes
    ``frames.encode(kind, {}, (first, [second,] b"".join(parts)))`` gives, built with
    one header pack and one join: the parts are copied once, into the frame (joined
    into a body first, then the bodies into the frame, they were copied twice, and
    the header and each length were a call of their own)."""
    size = 0
    for p in parts:
        size += len(p)
    out: list[bytes]
    if second is None:
        out = [_BATCH_HEAD2.pack(frames.MAGIC, frames.VERSION, kind, 0, 2, len(first), size), first]
    else:
        out = [_BATCH_HEAD3.pack(frames.MAGIC, frames.VERSION, kind, 0, 3, len(first), len(second),
                                 size), first, second]
    out.extend(parts)
    return b"".join(out)


# As ``encode``, a variable: bench/meshcount wraps it too.
encode_batch: Callable[[int, bytes, bytes | None, list[bytes]], bytes] = batch_frame


# ----- reply values over the mesh -------------------------------------------


def pack(value: Any, bodies: list[bytes]) -> Any:
    """A reply value as JSON, bytes moved to ``bodies`` (never base64)."""
    t = type(value)
    if t is int or t is float or value is None:
        return value
    if t is bytes:
        bodies.append(value)
        return {"b": len(bodies) - 1}
    if t is Status:
        return {"s": str(value)}
    if t is Error:
        return {"e": str(value)}
    if t is str:
        return {"t": value}
    if t is list or t is tuple:
        return [pack(v, bodies) for v in value]
    if value is NULL_ARRAY:
        return {"n": 1}
    if t is dict:
        return {"d": [[k, pack(v, bodies)] for k, v in value.items()]}
    if t is bool:
        return int(value)
    raise TypeError(f"cannot pack {t.__name__}")


def unpack(value: Any, bodies: list[bytes]) -> Any:
    if type(value) is dict:
        if "b" in value:
            return bodies[value["b"]]
        if "s" in value:
            return Status(value["s"])
        if "e" in value:
            return Error(value["e"])
        if "t" in value:
            return value["t"]
        if "n" in value:
            return NULL_ARRAY
        return {k: unpack(v, bodies) for k, v in value["d"]}
    if type(value) is list:
        return [unpack(v, bodies) for v in value]
    return value


def pack_took(held: list[int], qidx: list[int], parts: list[bytes]) -> bytes:
    """A TAKE's (or WAKE's) answer as one body, no JSON: native-endian u32s (the mesh
    joins processes forked from one supervisor, one code and one host) ``len(held)``,
    ``len(parts)``, ``held``, then per job the index of its queue among the request's
    and the length of its entry; then the entries, each already RESP (``parts`` is
    used up: the header goes in front of them)."""
    words = [len(held), len(parts)]
    words += held
    words += qidx
    for p in parts:
        words.append(len(p))
    parts.insert(0, array.array("I", words).tobytes())
    return b"".join(parts)


def unpack_took(blob: bytes) -> tuple[list[int], list[int], list[int], int]:
    """``pack_took``'s body: held, queue indexes, entry lengths and where the entries
    start; ValueError when the body is not of that shape."""
    if len(blob) < 8:
        raise ValueError("malformed TAKE answer")
    nheld, njobs = _took_counts(blob, 0)
    start = 8 + 4 * (nheld + 2 * njobs)
    if start > len(blob):
        raise ValueError("malformed TAKE answer")
    words = array.array("I")
    words.frombytes(blob[8:start])
    w = words.tolist()
    lens = w[nheld + njobs :]
    if start + sum(lens) != len(blob):
        raise ValueError("malformed TAKE answer")
    return w[:nheld], w[nheld : nheld + njobs], lens, start


_took_counts = struct.Struct("=II").unpack_from


# ----- the TAKES layout -------------------------------------------------------


def write_take(words: list[int], names: list[bytes], rid: int, count: int, withcounters: bool,
               hints: list[int] | None, queues: list[bytes]) -> None:
    """One take into a TAKES batch's words and names (the frame's shape: the module's
    docstring); ``TakesReader`` reads it back."""
    words.append(rid)
    words.append(count)
    words.append(1 if withcounters else 0)
    words.append(len(queues))
    words.append(0 if hints is None else len(hints))
    for q in queues:
        words.append(len(q))
    if hints is not None:
        words.extend(hints)
    names.extend(queues)


class TakesReader:
    """A TAKES frame's takes, one at a time, as ``write_take`` wrote them: each
    ``next()`` reads the next take into ``rid``, ``count``, ``withcounters``,
    ``queues`` and ``hints`` (None when the asker sent none); False at the end, or
    at a take whose words run past the frame (``broken``: a bug; its rest unread)."""

    __slots__ = ("words", "names", "i", "at", "rid", "count", "withcounters", "queues",
                 "hints", "broken")

    def __init__(self, bodies: list[bytes]) -> None:
        self.words = i64s(bodies[0])
        self.names = bodies[1]
        self.i = 0  # the next take's first word
        self.at = 0  # its first queue name's place in ``names``
        self.rid = 0
        self.count = 0
        self.withcounters = False
        self.queues: list[bytes] = []
        self.hints: list[int] | None = None
        self.broken = False

    def next(self) -> bool:
        words = self.words
        i = self.i
        if i + TAKE_HEAD_WORDS > len(words):
            return False
        nq = words[i + 3]
        nh = words[i + 4]
        end = i + TAKE_HEAD_WORDS + nq
        if end + nh > len(words):
            self.broken = True
            return False
        names = self.names
        at = self.at
        queues: list[bytes] = []
        for j in range(i + TAKE_HEAD_WORDS, end):
            queues.append(names[at : at + words[j]])
            at += words[j]
        self.at = at
        self.rid = words[i]
        self.count = words[i + 1]
        self.withcounters = words[i + 2] == 1
        self.queues = queues
        self.hints = words[end : end + nh] if nh else None
        self.i = end + nh
        return True


# ----- links ----------------------------------------------------------------

ReplyCallback = Callable[[dict[str, Any], list[bytes]], None]
# a take's answer: its ``pack_took`` bytes, empty for nothing taken or an owner gone
TookCallback = Callable[[bytes], None]


class Link(asyncio.Protocol):
    """One mesh connection. Outgoing links (``peer`` >= 0) carry our requests and
    survive reconnections; incoming links carry a peer's requests."""

    def __init__(self, mesh: Mesh, peer: int) -> None:
        self.mesh = mesh
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        self.reader = FrameReader(KINDS)
        self.outq: list[bytes] = []
        self.outq_bytes = 0
        self.pending: dict[int, ReplyCallback] = {}
        self.dirty = False
        # open batches (CMDS on outgoing links, REPLIES on incoming ones)
        self.cmd_rids: list[int] = []
        self.cmd_names: list[str] = []
        self.cmd_argc: list[int] = []
        self.cmd_args: list[bytes] = []
        self.reply_rids: list[int] = []
        self.reply_values: list[Any] = []
        self.reply_bodies: list[bytes] = []
        # open RAW batch (outgoing: ``add_raw``) and RAWREPLIES batch (incoming: ``raw_reply``)
        self.raw_rid = 0  # the last RAW request id on this link (u32, wraps)
        # (plain lists, packed once per frame: an array's append is a generic method
        # call, a list's is not) the RAW head's bytes: the first id's four, a flag
        # per command (``raw_head``); empty while no RAW batch is open
        self.raw_head: list[int] = []
        self.raw_parts: list[bytes] = []
        self.raw_pending: dict[int, Any] = {}  # rid -> the waiter given to ``add_raw``
        self.rawrep_words: list[int] = []  # rid, reply length, rid, reply length ...
        self.rawrep_parts: list[bytes] = []
        # open TAKES batch (outgoing: ``add_take``) and TOOKS batch (incoming: ``tooks``)
        self.take_rid = 0  # the last take's request id on this link (u32, wraps)
        self.take_words: list[int] = []
        self.take_names: list[bytes] = []
        self.take_rids: list[int] = []
        self.take_pending: dict[int, TookCallback] = {}  # rid -> the waiter of ``add_take``
        self.took_words: list[int] = []  # rid, took length, rid, took length ...
        self.took_parts: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.peer < 0 and not peercred.same_user(transport.get_extra_info("socket")):
            # behind the private directory, still: another local user must never
            # run node-wide commands (a flush) through us
            bus_auth.count("local_refused")
            self.mesh.log("mesh: refusing a local connection from another user")
            transport.abort()  # type: ignore[attr-defined]
            return
        self.transport = transport  # type: ignore[assignment]
        self.reader = FrameReader(KINDS)
        if self.outq:
            self.mesh.mark(self)

    def data_received(self, data: bytes) -> None:
        # a read of RAWREPLIES alone (an asking link's usual) only fills client
        # streams: the handler's end-of-read work on the shard has nothing to do
        settle = False
        try:
            self.reader.feed(data)
            while (frame := self.reader.next()) is not None:
                kind, meta, bodies = frame  # a native call (``*frame`` was a generic one)
                if kind != K_RAWREPLIES or self.peer < 0:
                    settle = True
                try:
                    self.mesh.dispatch(self, kind, meta, bodies)
                except InvariantError:
                    raise  # the shard is inconsistent: the worker must die
                except Exception:  # a bug in one handler must not cut the link
                    logging.getLogger("disque_mp.mesh").exception("mesh frame handler failed")
        except FrameError as exc:
            self.mesh.log(f"mesh frame error from worker {self.peer}: {exc}")
            self.mesh.resets += 1
            if self.transport is not None:
                self.transport.abort()
        if settle:
            self.mesh.after_batch()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.mesh.lost(self)

    def batch_open(self) -> bool:
        """Whether a batch of this turn (CMDS, REPLIES, RAW, RAWREPLIES, TAKES, TOOKS)
        is open: it leaves before any other frame, so frames keep their order."""
        return bool(self.cmd_rids or self.reply_rids or self.raw_head or self.rawrep_words
                    or self.take_rids or self.took_words)

    def queue(self, frame: bytes) -> None:
        if self.batch_open():
            self.close_batches()
        self._queue(frame)

    def _queue(self, frame: bytes) -> None:
        if self.transport is None and self.outq_bytes + len(frame) > backlog_bytes_max:
            raise ConnectionError(f"worker {self.peer} unreachable, mesh backlog full")
        self.outq.append(frame)
        self.outq_bytes += len(frame)
        if self.transport is not None:
            self.mesh.mark(self)

    def add_command(self, rid: int, name: str, args: list[bytes]) -> None:
        """Queue a job command in this turn's CMDS batch; a batch that the command
        would take past the frame's body count leaves first (``command`` refuses a
        single command that cannot fit alone)."""
        if self.raw_head or self.take_rids:
            self.close_batches()  # the RAW commands or takes before this one run first
        if self.cmd_rids and len(self.cmd_args) + len(args) > frame_bodies_max:
            self.close_batches()
        if not self.cmd_rids:
            self.mesh.mark(self)
        self.cmd_rids.append(rid)
        self.cmd_names.append(name)
        self.cmd_argc.append(len(args))
        self.cmd_args.extend(args)

    def add_raw(self, resp3: bool, waiter: Any) -> list[bytes]:
        """Open a place in this turn's RAW batch for one command and return the batch's
        request buffer: the caller appends the command to it at once, as the RESP
        request a client sends (``resp.append_request``, compiled). ``waiter`` (the
        client's reply slot) is handed back with the reply bytes
        (``handler.on_raw_replies``). A RAW frame carries its first request id (the
        others follow it), one flag byte per command (1: a RESP3 reply) and the
        requests, in order; commands queued before in a CMDS batch, or takes in a
        TAKES batch, leave first."""
        if self.cmd_rids or self.take_rids:
            self.close_batches()
        self.raw_rid = rid = (self.raw_rid + 1) & 0xFFFFFFFF
        head = self.raw_head
        if not head:
            self.mesh.mark(self)
            head.append(rid & 0xFF)
            head.append((rid >> 8) & 0xFF)
            head.append((rid >> 16) & 0xFF)
            head.append(rid >> 24)
        head.append(1 if resp3 else 0)
        self.raw_pending[rid] = waiter
        return self.raw_parts

    def add_take(self, count: int, withcounters: bool, hints: list[int] | None,
                 queues: list[bytes], waiter: TookCallback) -> None:
        """Queue a GETJOB's non-blocking take of ``queues`` in this turn's TAKES batch
        (the frame's shape: the module's docstring). ``waiter`` gets the owner's
        ``pack_took`` bytes, or empty bytes when nothing was taken or the owner is
        gone. RAW or CMDS commands queued before leave first."""
        if self.raw_head or self.cmd_rids:
            self.close_batches()
        rids = self.take_rids
        if not rids:
            self.mesh.mark(self)
        self.take_rid = rid = (self.take_rid + 1) & 0xFFFFFFFF
        rids.append(rid)
        write_take(self.take_words, self.take_names, rid, count, withcounters, hints, queues)
        self.take_pending[rid] = waiter

    def tooks(self, words: list[Any], parts: list[bytes]) -> None:
        """Answer a TAKES frame's takes at once (batched with this turn's others):
        ``words`` holds each take's request id and answer length, ``parts`` the answers."""
        self._add_answers(self.took_words, self.took_parts, words, parts)

    def reply(self, rid: int, value: Any) -> None:
        """Answer request ``rid`` (batched with the other answers of this turn). A
        reply that would take the batch past the frame's body count starts a new
        batch; one that cannot fit a frame alone is answered with an error."""
        if self.transport is None:
            return  # the asker is gone
        bodies = self.reply_bodies
        before = len(bodies)
        packed = pack(value, bodies)
        if len(bodies) > frame_bodies_max:
            del bodies[before:]
            if self.reply_rids:
                self.close_batches()
                bodies = self.reply_bodies
            packed = pack(value, bodies)
            if len(bodies) > frame_bodies_max:
                del bodies[:]
                self.mesh.count_refused()
                packed = pack(Error(ERR_TOO_BIG), bodies)
        if not self.reply_rids:
            self.mesh.mark(self)
        self.reply_rids.append(rid)
        self.reply_values.append(packed)

    def raw_reply(self, rid: int, data: bytes) -> None:
        """Answer RAW request ``rid`` with its encoded reply (batched per turn)."""
        if self.transport is None:
            return  # the asker is gone
        words = self.rawrep_words
        if not words:
            self.mesh.mark(self)
        words.append(rid)
        words.append(len(data))
        self.rawrep_parts.append(data)

    def raw_replies(self, words: list[Any], parts: list[bytes]) -> None:
        """Answer a RAW frame's requests at once (``raw_reply`` for each, in one call):
        ``words`` holds each one's request id and reply length, ``parts`` the replies."""
        self._add_answers(self.rawrep_words, self.rawrep_parts, words, parts)

    def _add_answers(self, into_words: list[int], into_parts: list[bytes], words: list[Any],
                     parts: list[bytes]) -> None:
        """Add a frame's answers to this turn's open batch of their kind (TOOKS or
        RAWREPLIES: ``into_*``, closed by ``close_batches``)."""
        if self.transport is None or not words:
            return  # the asker is gone
        if not into_words:
            self.mesh.mark(self)
        into_words.extend(words)
        into_parts.extend(parts)

    def close_raw(self) -> None:
        """Queue the open RAW batch (the worker calls it before a CMDS command)."""
        head = bytes(self.raw_head)
        frame = encode_batch(K_RAW, head, None, self.raw_parts)
        self.raw_head, self.raw_parts = [], []
        try:
            self._queue(frame)
        except ConnectionError as exc:
            self.mesh.fail_raw(self, raw_ids(head), f"ERR {exc}")

    def close_takes(self) -> None:
        """Queue the open TAKES batch; a take that cannot leave is answered empty (its
        owner's queues count as empty, as for an owner that is down)."""
        rids = self.take_rids
        frame = encode_batch(K_TAKES, array.array("q", self.take_words).tobytes(), None,
                             self.take_names)
        self.take_rids, self.take_words, self.take_names = [], [], []
        try:
            self._queue(frame)
        except ConnectionError:
            self.mesh.fail_takes(self, rids)

    def _queue_answers(self, kind: int, words: list[int], parts: list[bytes]) -> None:
        """Queue a batch of answers already encoded (RAWREPLIES, TOOKS): one u32 array
        of (request id, length) pairs, then the answers side by side."""
        frame = encode_batch(kind, array.array("I", words).tobytes(), None, parts)
        try:
            self._queue(frame)
        except ConnectionError:
            pass  # incoming links always have a transport while they exist

    def close_batches(self) -> None:
        """Queue the open batches. Each batch is taken off the link before it is
        encoded, so a batch that fails to encode never stays behind to fail every
        later send (its requests get the error instead)."""
        if self.raw_head:
            self.close_raw()
        if self.take_rids:
            self.close_takes()
        if self.took_words:
            words, parts = self.took_words, self.took_parts
            self.took_words, self.took_parts = [], []
            self._queue_answers(K_TOOKS, words, parts)
        if self.rawrep_words:
            words, parts = self.rawrep_words, self.rawrep_parts
            self.rawrep_words, self.rawrep_parts = [], []
            self._queue_answers(K_RAWREPLIES, words, parts)
        if self.cmd_rids:
            meta = {"r": self.cmd_rids, "n": self.cmd_names, "c": self.cmd_argc}
            args, rids = self.cmd_args, self.cmd_rids
            self.cmd_rids, self.cmd_names, self.cmd_argc, self.cmd_args = [], [], [], []
            try:
                self._queue(encode(K_CMDS, meta, args))
            except (ConnectionError, FrameError) as exc:
                self.mesh.fail(self, rids, f"ERR {exc}")
        if self.reply_rids:
            meta = {"r": self.reply_rids, "v": self.reply_values}
            bodies = self.reply_bodies
            self.reply_rids, self.reply_values, self.reply_bodies = [], [], []
            try:
                self._queue(encode(K_REPLIES, meta, bodies))
            except ConnectionError:
                pass  # incoming links always have a transport while they exist
            except FrameError as exc:  # a bug: ``reply`` keeps batches under the bound
                self.mesh.log(f"mesh: a reply batch for worker {self.peer} was dropped: {exc}")
                self.mesh.refused += 1

    def flush(self) -> None:
        if self.batch_open():
            self.close_batches()  # still marked: queuing their frames schedules no other flush
        self.dirty = False
        if self.transport is None or not self.outq:
            return
        data = b"".join(self.outq) if len(self.outq) > 1 else self.outq[0]
        self.outq.clear()
        self.outq_bytes = 0
        self.transport.write(data)

    def send(self, kind: int, meta: dict[str, Any], bodies: list[bytes] | tuple[bytes, ...] = ()) -> None:
        self.queue(encode(kind, meta, bodies))


class MeshHandler(Protocol):
    """What the mesh calls on the worker (``node/peers.py``'s ``Peers``). A Protocol,
    not a native base: the mesh's tests drive it with handlers of their own that
    answer only what they reach, and the calls are per frame or per read, never per
    command (a compiled call through a Protocol is a generic Python call, as it was
    through ``Any``)."""

    def log(self, text: str) -> None:
        """A line for the worker's log."""

    def on_request(self, link: Link, kind: int, meta: dict[str, Any], bodies: list[bytes]) -> None:
        """Serve a peer's request frame (answer on ``link``)."""

    def on_wake(self, peer: int, meta: dict[str, Any], bodies: list[bytes]) -> None:
        """A WAKE for one of our blocked GETJOBs."""

    def on_peer_up(self, peer: int) -> None:
        """Worker ``peer`` is (re)connected."""

    def on_incoming_lost(self, link: Link) -> None:
        """A peer's link is gone: drop what it registered with us."""

    def on_raw_replies(self, link: Link, bodies: list[bytes]) -> None:
        """A RAWREPLIES frame: splice the replies into the clients' streams."""

    def raw_failed(self, waiting: list[Any], text: str) -> None:
        """RAW requests that are lost (the waiters ``add_raw`` was given): answer ``text``."""

    def after_batch(self) -> None:
        """After a read of frames, unless it held RAWREPLIES alone (those only fill
        client streams): the shard's effects, the AOF and the tick, once per read."""


class Mesh:
    """Links to every other worker of this host; ``handler`` (a ``MeshHandler``)
    serves the peers' requests and takes in the answers to ours."""

    def __init__(self, port: int, node_id: str, index: int, workers: int,
                 handler: MeshHandler) -> None:
        self.port = port
        self.node_id = node_id
        self.index = index
        self.workers = workers
        self.handler = handler
        self.links: list[Link | None] = [
            None if j == index else Link(self, j) for j in range(workers)
        ]
        self.incoming: set[Link] = set()
        self._dirty: list[Link] = []
        self._flush_scheduled = False
        self._next_rid = 0
        self.refused = 0  # requests, replies and frames refused for not fitting one frame
        self.resets = 0  # links cut for a bad frame or a failed send (INFO mesh_link_resets)
        self._server: asyncio.AbstractServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.closing = False
        self.loop = asyncio.get_event_loop()

    def log(self, text: str) -> None:
        self.handler.log(text)

    async def start(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        peercred.bind_local(sock, socket_name(self.port, self.node_id, self.index))
        sock.listen(self.workers * 4)
        sock.setblocking(False)
        self._server = await self.loop.create_unix_server(self._incoming, sock=sock)
        for link in self.links:
            if link is not None:
                self._tasks.append(self.loop.create_task(self._connect(link)))

    def _incoming(self) -> Link:
        link = Link(self, -1)
        self.incoming.add(link)
        return link

    async def _connect(self, link: Link) -> None:
        name = socket_name(self.port, self.node_id, link.peer)
        while not self.closing:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                sock.connect(name)  # a local connect completes at once or fails
                if not peercred.sibling(sock):
                    # never send requests (client job bodies) to a stranger holding the name
                    bus_auth.count("local_refused")
                    self.log(f"mesh: worker {link.peer}'s socket is held by another process")
                    raise ConnectionRefusedError(name)
                await self.loop.create_unix_connection(lambda: link, sock=sock)
            except OSError:
                sock.close()
                await asyncio.sleep(reconnect_delay_s)
                continue
            self.handler.on_peer_up(link.peer)
            return

    def lost(self, link: Link) -> None:
        if link.peer < 0:
            self.incoming.discard(link)
            self.handler.on_incoming_lost(link)
            return
        pending, link.pending = link.pending, {}
        raw_pending, link.raw_pending = link.raw_pending, {}
        take_pending, link.take_pending = link.take_pending, {}
        link.cmd_rids, link.cmd_names, link.cmd_argc, link.cmd_args = [], [], [], []
        link.raw_head, link.raw_parts = [], []
        link.take_rids, link.take_words, link.take_names = [], [], []
        # Frames not written yet belong to requests failed below: a restarted
        # peer must not run them (their replies would go nowhere).
        link.outq.clear()
        link.outq_bytes = 0
        lost = Error(f"ERR worker {link.peer} is unavailable, try again")
        for callback in pending.values():
            callback({"v": {"e": str(lost)}}, [])
        if raw_pending:
            self.handler.raw_failed(list(raw_pending.values()), str(lost))
        for waiter in take_pending.values():
            waiter(b"")  # the owner's queues count as empty
        if not self.closing:
            self._tasks.append(self.loop.create_task(self._connect(link)))

    def close(self) -> None:
        self.closing = True
        for task in self._tasks:
            task.cancel()
        if self._server is not None:
            self._server.close()
        for link in [*self.links, *self.incoming]:
            if link is not None and link.transport is not None:
                link.transport.close()

    # --- sending ---

    def mark(self, link: Link) -> None:
        if not link.dirty:
            link.dirty = True
            self._dirty.append(link)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, []
        for link in dirty:
            try:
                link.flush()
            except Exception:  # a bug: a link that cannot send must not stay wedged
                logging.getLogger("disque_mp.mesh").exception(
                    "mesh: sending to worker %d failed; the link is reset", link.peer)
                self.reset(link)

    def reset(self, link: Link) -> None:
        """Drop a link's unsent frames and batches and close it: its requests fail
        at once (``lost``) and an outgoing link redials."""
        self.resets += 1
        link.cmd_rids, link.cmd_names, link.cmd_argc, link.cmd_args = [], [], [], []
        link.reply_rids, link.reply_values, link.reply_bodies = [], [], []
        link.rawrep_words, link.rawrep_parts = [], []
        link.took_words, link.took_parts = [], []
        link.outq.clear()
        link.outq_bytes = 0
        if link.transport is not None:
            link.transport.abort()

    def request(self, peer: int, kind: int, meta: dict[str, Any], bodies: Any, callback: ReplyCallback) -> None:
        link = self.links[peer]
        assert link is not None, "no mesh link to ourselves"
        self._next_rid += 1
        rid = self._next_rid
        meta["r"] = rid
        link.pending[rid] = callback
        try:
            link.send(kind, meta, bodies)
        except ConnectionError as exc:
            del link.pending[rid]
            callback({"v": {"e": f"ERR {exc}"}}, [])
        except FrameError:
            del link.pending[rid]
            self.count_refused()
            callback({"v": {"e": ERR_TOO_BIG}}, [])

    def command(self, peer: int, name: str, args: list[bytes], callback: ReplyCallback) -> None:
        """Run job command ``name`` on worker ``peer`` (batched per loop turn). A
        command with more arguments than a frame carries is refused here, with an
        error, before it touches the link."""
        link = self.links[peer]
        assert link is not None, "no mesh link to ourselves"
        if len(args) > frame_bodies_max:
            self.count_refused()
            callback({"v": {"e": ERR_TOO_BIG}}, [])
            return
        self._next_rid += 1
        rid = self._next_rid
        link.pending[rid] = callback
        link.add_command(rid, name, args)

    def fail(self, link: Link, rids: list[int], text: str) -> None:
        for rid in rids:
            callback = link.pending.pop(rid, None)
            if callback is not None:
                callback({"v": {"e": text}}, [])

    def take(self, peer: int, count: int, withcounters: bool, hints: list[int] | None,
             queues: list[bytes], waiter: TookCallback) -> None:
        """A GETJOB's take on worker ``peer`` (batched per loop turn: ``Link.add_take``)."""
        link = self.links[peer]
        assert link is not None, "no mesh link to ourselves"
        link.add_take(count, withcounters, hints, queues, waiter)

    def fail_takes(self, link: Link, rids: list[int]) -> None:
        """Takes that cannot reach their owner: answered empty (its queues count as empty)."""
        for rid in rids:
            waiter = link.take_pending.pop(rid, None)
            if waiter is not None:
                waiter(b"")

    def fail_raw(self, link: Link, rids: Any, text: str) -> None:
        waiting = [w for w in (link.raw_pending.pop(rid, None) for rid in rids) if w is not None]
        self.handler.raw_failed(waiting, text)

    def send(self, peer: int, kind: int, meta: dict[str, Any], bodies: Any = ()) -> None:
        link = self.links[peer]
        assert link is not None, "no mesh link to ourselves"
        try:
            link.send(kind, meta, bodies)
        except (ConnectionError, FrameError) as exc:
            self.log(f"mesh: dropped a frame for worker {peer}: {exc}")
            if isinstance(exc, FrameError):
                self.refused += 1

    def count_refused(self) -> None:
        """A request or reply too big for one frame was refused (logged, the first
        and then every ``refused_log_every``-th)."""
        self.refused += 1
        if self.refused % refused_log_every == 1:
            self.log(f"mesh: refused a request or reply too big for one frame "
                     f"({self.refused} so far)")

    # --- receiving ---

    def dispatch(self, link: Link, kind: int, meta: dict[str, Any], bodies: list[bytes]) -> None:
        if link.peer < 0:
            self.handler.on_request(link, kind, meta, bodies)
        elif kind == K_RAWREPLIES:
            self.handler.on_raw_replies(link, bodies)
        elif kind == K_TOOKS:
            self._tooks(link, bodies)
        elif kind == K_REPLIES:
            pending = link.pending
            for rid, value in zip(meta["r"], meta["v"], strict=True):
                callback = pending.pop(rid, None)
                if callback is not None:
                    callback({"v": value}, bodies)
        elif kind == K_REPLY:
            callback = link.pending.pop(meta["r"], None)
            if callback is not None:
                callback(meta, bodies)
        elif kind == K_WAKE:
            self.handler.on_wake(link.peer, meta, bodies)

    def _tooks(self, link: Link, bodies: list[bytes]) -> None:
        """A TOOKS frame: each take's answer to its waiter, in the order they were sent."""
        words = u32_keys(bodies[0])  # ids only popped: each kept as the object it is
        data = bodies[1]
        pending = link.take_pending
        at = 0
        for i in range(0, len(words) - 1, 2):
            size: int = words[i + 1]
            end = at + size
            waiter = pending.pop(words[i], None)
            if waiter is not None:
                try:
                    waiter(data[at:end])
                except InvariantError:
                    raise  # the shard is inconsistent: the worker must die
                except Exception:  # a bug in one GETJOB must not leave the others waiting
                    logging.getLogger("disque_mp.mesh").exception("mesh take answer failed")
            at = end

    def after_batch(self) -> None:
        self.handler.after_batch()


def raw_ids(head: bytes) -> list[int]:
    """The request ids of a RAW frame of ``head`` (``Link.add_raw``): its first, and one
    more per flag byte after it, wrapping at 2**32."""
    first = raw_first_id(head)
    return [(first + i) & 0xFFFFFFFF for i in range(len(head) - 4)]


def raw_first_id(head: bytes) -> int:
    """The first request id of a RAW frame's head (at least 4 bytes: the caller checks)."""
    return head[0] | (head[1] << 8) | (head[2] << 16) | (head[3] << 24)


def u32s(data: bytes) -> list[int]:
    """A mesh frame's native-endian u32 array (request ids, lengths) as a list."""
    values = array.array("I")
    values.frombytes(data)
    return values.tolist()


def u32_keys(data: bytes) -> list[Any]:
    """``u32s`` for ids that are only compared, stored and handed on: typed as
    ``Any``, compiled code keeps each int as the object it is (an ``int`` is unboxed when read
    from the list and boxed again, an allocation past 256, when stored or hashed)."""
    values = array.array("I")
    values.frombytes(data)
    out: list[Any] = values.tolist()
    return out


def i64s(data: bytes) -> list[int]:
    """A mesh frame's native-endian i64 array (a TAKES frame's words) as a list."""
    values = array.array("q")
    values.frombytes(data)
    return values.tolist()
