"""The cluster bus: TCP between hosts, run by worker 0 of each host.

Worker 0 listens on ``bind:port+10000``, keeps one outbound link to every known
node (PING/MEET out, PONG back on the same link, job messages out), and accepts
inbound links (PING/MEET in, PONG out, FAIL and job messages in). Membership
rules live in ``bus/membership.py``; this module only does the I/O and the
routing. See docs/cluster.md for the protocol.

Frames are ``bus/frames.py`` frames. Bus frame kinds:

    HANDSHAKE  first frame each way: {"proto": BUS_PROTO, "id": node ID, "port": client port}
               (the acceptor answers with its own once it has the dialer's); with a
               cluster secret both carry a nonce "n", the answer a proof "p"
    AUTH       {"p": proof}: the dialer's proof (bus/auth.py); then each write is
               one SEALED frame (the write's frames as its body) plus a MAC
    PING/MEET  header + gossip (membership.make_ping)        outbound link
    PONG       header + gossip, the reply to PING/MEET        same link, back
    FAIL       {"id": failing node ID}                         outbound link
    JOB        {"k": kind, "s": slot, "m": meta} + raw bodies  outbound link or data link
    JOBS       {"b": [[kind, slot, meta, nbodies], ...]} + the bodies in order: the job
               messages of one loop turn to one peer in one frame (sent only to a peer
               whose HANDSHAKE answer or DATA_READY says "jb": 1; else one JOB each)
    DATA_READY {"proto", "id", "w": worker}                    data link, acceptor's answer
    SCHED      {"op": ...} + raw bodies: node-wide schedules     outbound link
               (disque_mp/node/schedule_host.py; checked by messages.check_schedule)

A data link (bus/datalink.py) is a connection from worker k of a host whose
HANDSHAKE carries ``"data": k``: it only carries JOB frames. Worker 0 hands its
socket to its worker ``k % workers`` (``adopt_data``), which answers DATA_READY
and reads it; when that is not possible worker 0 answers and reads it itself.

A JOB frame is delivered to the worker owning its slot on the receiving host
(``slot % workers``); other workers hand their ``Send`` effects to worker 0 over
the local mesh (``mesh_bus_out``) and get incoming ones back (``mesh_bus_in``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import ssl
from collections.abc import Callable, Iterable
from typing import Any, Final, cast

from bus import auth, frames, messages, nodes_conf, seeds
from bus import membership as mb
from bus.clock import mono_ms, wall_offset_ms
from bus.meetlog import MeetLog
from bus.membership import Broadcast, DropLink, Membership, Node, Ping

log = logging.getLogger("disque.cluster")

BUS_PORT_OFFSET = 10000
BUS_PROTO = 1  # bus protocol version, checked in the handshake both ways

# Bus frame kinds (u8). Final: compiled, each is a C constant, not a lookup per frame.
K_HANDSHAKE: Final = 1
K_PING: Final = 2
K_PONG: Final = 3
K_MEET: Final = 4
K_FAIL: Final = 5
K_JOB: Final = 6
K_DATA_READY: Final = 7
K_AUTH: Final = 8
# With a secret, after the handshake: the frames of one write inside one frame (its one
# body), and that frame carries the MAC. One MAC per write instead of one per frame:
# under load a write holds dozens of job messages (measured: docs/security.md).
K_SEALED: Final = 9
K_JOBS: Final = 10
K_SCHED: Final = 11
BUS_KINDS: Final = frozenset({K_HANDSHAKE, K_PING, K_PONG, K_MEET, K_FAIL, K_JOB, K_DATA_READY, K_AUTH,
                       K_SEALED, K_JOBS, K_SCHED})

# Mesh frame kinds (u8) for cluster traffic between the workers of one host; kept
# far from the front end's own kinds (bus/mesh.py) so both can share one reader.
MESH_BUS_OUT: Final = 0xC0  # worker k -> worker 0: put this Send on the bus
MESH_BUS_IN: Final = 0xC1  # worker 0 -> owner of the slot: a job message from the bus
MESH_VIEW: Final = 0xC2  # worker 0 -> every worker: the membership snapshot

peer_output_bytes_max: Final = 256 << 20  # unsent bytes to one peer: over it the link is dropped
# (a peer that cannot drain that much is stuck; the state machine resends what matters)
tick_interval_ms_max = 100  # membership tick: PINGs, PFAIL, reconnects, saves
# A node alone (no other node known, no link, no cluster-seeds) has nothing to ping:
# its tick waits this long, or until a membership change (CLUSTER MEET) or a link in
alone_tick_ms = 1000
connect_backoff_ms_min = 50  # reconnect delay after a failed connect, doubling ...
# ... up to this: a restarted peer is found within the reference's cron period (it
# redials a node without a link on every 100 ms clusterCron), so its PFAIL clears
# (our PING, its PONG) before it serves clients
connect_backoff_ms_max = 100
auth_failed_redial_ms = 1000  # a peer that failed the handshake: redial once a second
connect_timeout_s = 2.0  # a connect that hangs longer counts as failed
read_chunk_bytes = 1 << 16
# Before the handshake a peer is nobody: its frames are tiny (HANDSHAKE and AUTH are
# a few hundred bytes), its link has a deadline, and links in handshake are capped.
handshake_frame_bytes_max = 4096
handshake_buffer_bytes_max = 16 * 1024
handshake_timeout_ms = 5000  # connect to AUTH on loopback or a LAN takes milliseconds
inbound_links_max = 4096  # every peer host keeps one bus link to worker 0 (data links move on)
inbound_handshakes_max = 64  # inbound links still in their handshake
# ... of which one remote address holds at most this share. A new inbound link always
# gets a slot: over either bound, the oldest link in handshake of the address holding
# the most is closed (a stranger's flood churns its own links, a member's handshake,
# done in milliseconds, gets in).
inbound_handshakes_per_addr_max = 16
# After the handshake: one job record (a body up to proto-max-bulk-len) or a YOURJOBS
# batch (bodies up to 4 MB, workers/federation.py) plus its metadata.
peer_frame_overhead_bytes = 8 << 20
sealed_batch_bytes_max: Final = 1 << 20  # frames joined under one MAC (a larger frame goes alone)
# One JOBS frame holds the job messages of a loop turn to one peer, up to these (then a
# new one starts): a receiver decodes one header and one metadata object per frame, not
# per message (messages.check_jobs bounds what it accepts the same way).
job_batch_messages_max: Final = 1024
job_batch_bytes_max: Final = 1 << 20
# What a client sees of the membership (HELLO's priorities, CLUSTER NODES, -LEAVING) is
# current on every worker of every node once CLUSTER LEAVING has answered: the node that
# changed its flag answers once each linked peer has PONGed the PING that carries it, and
# a peer PONGs a PING that changed its view once its workers have applied that view.
# Each wait is bounded (a stalled worker or peer delays the answer, never blocks it):
view_apply_wait_ms_max = 500  # a PONG held for our workers' view, at most this long
held_pongs_max = 64  # PONGs held on one link (pings every 20 ms at most: ~25 in 500 ms)
leaving_wait_ms_max = 2000  # CLUSTER LEAVING answers after this even if a peer is silent
refusal_log_interval_ms = 60_000  # a stranger redials every second: log its refusal once a minute
refusals_logged_max = 1024  # (address, reason) pairs remembered for that
peer_frame_bytes_max = (512 << 20) + peer_frame_overhead_bytes  # follows proto-max-bulk-len

# deliver(worker_index, sender_node_id, kind, slot, meta, bodies)
Deliver = Callable[[int, str, str, int, dict[str, Any], list[bytes]], None]
# publish(view): the membership snapshot changed (see membership.snapshot)
Publish = Callable[[dict[str, Any]], None]


class Later:
    """A reply that comes later (CLUSTER LEAVING waits until the cluster knows):
    ``then(done)`` registers who gets it, ``resolve(reply)`` hands it on, once."""

    def __init__(self) -> None:
        self.resolved = False
        self.reply: Any = None
        self.waiters: list[Callable[[Any], None]] = []

    def then(self, done: Callable[[Any], None]) -> None:
        if self.resolved:
            done(self.reply)
        else:
            self.waiters.append(done)

    def resolve(self, reply: Any) -> None:
        if self.resolved:
            return
        self.resolved, self.reply = True, reply
        waiters, self.waiters = self.waiters, []
        for done in waiters:
            done(reply)


class _LeavingWait:
    """A CLUSTER LEAVING waiting for our workers (view ``seq``) and for the PONG of each
    peer it pinged (the link's PING count when it wrote its PING: PONGs come back on
    the same link, one per PING, in order)."""

    def __init__(self, later: Later, seq: int, targets: dict[_Link, int], deadline_ms: int) -> None:
        self.later = later
        self.seq = seq
        self.targets = targets
        self.deadline_ms = deadline_ms


def bus_port(client_port: int) -> int:
    return client_port + BUS_PORT_OFFSET


def set_peer_frame_max(proto_max_bulk_len: int) -> None:
    """The bound of an authenticated peer's frames follows the largest job body."""
    global peer_frame_bytes_max
    peer_frame_bytes_max = max(peer_frame_bytes_max, proto_max_bulk_len + peer_frame_overhead_bytes)


def check_proto(meta: dict[str, Any]) -> str:
    """A HANDSHAKE (or DATA_READY) of our protocol -> the sender's node ID."""
    if meta.get("proto") != BUS_PROTO:
        raise messages.BadMessage(f"it speaks bus protocol {str(meta.get('proto'))[:16]}, "
                                  f"we speak {BUS_PROTO}")
    sender = meta.get("id")
    if not isinstance(sender, str) or not mb.is_node_id(sender):
        raise messages.BadMessage("its handshake has no valid node ID")
    return sender


async def dial(factory: Callable[[], asyncio.Protocol], ip: str, client_port: int,
               tls: ssl.SSLContext | None = None) -> None:
    """Connect to the bus port of the node at ``ip:client_port`` (bus and data links),
    over TLS with ``tls`` (tls-cluster): TimeoutError past connect_timeout_s, OSError
    when refused (ssl.SSLError, a certificate refused, is an OSError)."""
    loop = asyncio.get_running_loop()
    await asyncio.wait_for(loop.create_connection(factory, ip, bus_port(client_port), ssl=tls),
                           connect_timeout_s)


def next_backoff_ms(last_ms: int | None, min_ms: int, max_ms: int) -> int:
    """The delay before redialing after a failure: ``min_ms`` first, doubling up to ``max_ms``."""
    return min((min_ms // 2 if last_ms is None else last_ms) * 2, max_ms)


def close_links_of_removed_keys(keyring: auth.Keyring, links: Iterable[PeerLink]) -> int:
    """Close the ``links`` whose session came from a key ``keyring`` no longer holds
    (the secret file changed); how many. Bus and data links alike."""
    stale = [link for link in links if not keyring.holds(link.sealer)]
    for link in stale:
        log.warning("%s: its cluster key was removed from cluster-secret-file, closing",
                    link.drop_notice())
        link.close()
    return len(stale)


class BatchedLink(asyncio.Protocol):
    """A connection whose frames of one loop turn leave in one write (measured with
    bench/bus_bench.py: see docs/cluster.md). Bus links, data links and the
    agent's local links share it; each keeps its own output bound and its own
    answer to a peer that does not drain."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.outq: list[bytes] = []  # frames of this loop turn, flushed in one write
        self.outq_bytes = 0
        # the loop's call_soon, bound at the first frame (asyncio.get_running_loop() and
        # the method lookup per loop turn were a tenth of the link's own time)
        self.call_soon: Callable[[Callable[[], None]], Any] | None = None

    def writable(self) -> bool:
        return self.transport is not None

    def pending_bytes(self) -> int:
        """Output the peer has not taken yet: the transport's buffer and this turn's frames."""
        buffered = self.transport.get_write_buffer_size() if self.transport is not None else 0
        return buffered + self.outq_bytes

    def enqueue(self, frame: bytes) -> None:
        if not self.outq:
            self.flush_soon()
        self.outq.append(frame)
        self.outq_bytes += len(frame)

    def flush_soon(self) -> None:
        """This turn's first frame: the flush at the end of the turn."""
        call_soon = self.call_soon
        if call_soon is None:
            call_soon = self.call_soon = asyncio.get_running_loop().call_soon
        call_soon(self.flush)

    def flush(self) -> None:
        if self.transport is not None and self.writable() and self.outq:
            self.transport.write(b"".join(self.outq) if len(self.outq) > 1 else self.outq[0])
        self.outq.clear()
        self.outq_bytes = 0


class PeerLink(BatchedLink):
    """A link to another node (a bus link or a data link): frames must carry object
    metadata, and a peer that sends garbage loses its link; nothing it sends may
    hurt us."""

    def __init__(self, kinds: frozenset[int]) -> None:
        super().__init__()
        self.reader = frames.FrameReader(kinds, handshake_frame_bytes_max,
                                         handshake_buffer_bytes_max)
        self.closed = False
        self.sealer: auth.Sealer | None = None  # set once authenticated: MAC every frame
        self.batch_jobs = False  # the peer reads JOBS frames (its answer said "jb")
        self.jobs: list[bytes] = []  # this turn's job messages: [kind, slot, meta, nbodies]
        self.job_bodies: list[Any] = []
        self.jobs_bytes = 0

    def writable(self) -> bool:
        return self.transport is not None and not self.closed

    def loosen(self) -> None:
        """The handshake is done: the peer may send frames of any sensible size."""
        self.reader.frame_max = peer_frame_bytes_max
        self.reader.buffer_max = peer_frame_bytes_max + read_chunk_bytes + auth.mac_bytes

    def start_mac(self, sealer: auth.Sealer, opener: auth.Opener) -> None:
        BatchedLink.flush(self)  # the handshake's own frames leave plain
        self.sealer = sealer
        self.reader.mac = opener

    def put(self, frame: bytes) -> None:
        if self.jobs:
            self.close_jobs()  # frames keep the order they were written in
        self.enqueue(frame)

    def put_job(self, kind: str, slot: int, meta: dict[str, Any], bodies: list[Any]) -> None:
        """A job message: one JOB frame, or (to a peer that reads them) a place in this
        turn's JOBS frame. Its metadata is encoded now (the caller may reuse the dict)."""
        if not self.batch_jobs:
            self.enqueue(frames.encode(K_JOB, {"k": kind, "s": slot, "m": meta}, bodies))
            return
        if self.jobs and len(self.job_bodies) + len(bodies) > frames.frame_bodies_max:
            self.close_jobs()  # (a frame counts its bodies in 16 bits)
        if not self.jobs and not self.outq:
            self.flush_soon()
        entry = frames.dumps([kind, slot, meta, len(bodies)])
        self.jobs.append(entry)
        size = len(entry)
        for b in bodies:
            self.job_bodies.append(b)
            size += len(b) + 4
        self.jobs_bytes += size
        if len(self.jobs) >= job_batch_messages_max or self.jobs_bytes >= job_batch_bytes_max:
            self.close_jobs()

    def close_jobs(self) -> None:
        """This turn's job messages as one frame, queued behind the frames before them."""
        jobs, bodies = self.jobs, self.job_bodies
        self.jobs, self.job_bodies, self.jobs_bytes = [], [], 0
        self.enqueue(frames.encode_raw_meta(K_JOBS, b'{"b":[' + b",".join(jobs) + b"]}", bodies))

    def pending_bytes(self) -> int:
        return BatchedLink.pending_bytes(self) + self.jobs_bytes

    def flush(self) -> None:
        if self.jobs:
            self.close_jobs()
        sealer = self.sealer
        if sealer is None or self.transport is None or not self.writable() or not self.outq:
            super().flush()
            return
        out: list[bytes] = []
        batch: list[bytes] = []
        size = 0
        for frame in self.outq:
            if batch and size + len(frame) > sealed_batch_bytes_max:
                _seal_batch(sealer, batch, out)
                batch, size = [], 0
            batch.append(frame)
            size += len(frame)
        _seal_batch(sealer, batch, out)
        self.outq.clear()
        self.outq_bytes = 0
        self.transport.write(b"".join(out))

    def unseal(self, bodies: list[bytes]) -> None:
        """A sealed batch (its MAC already checked by the reader): its frames, in order."""
        if self.reader.mac is None or len(bodies) != 1:
            raise frames.FrameError("a sealed batch without a session")
        inner = frames.FrameReader(self.reader.kinds, self.reader.frame_max,
                                   self.reader.frame_max + read_chunk_bytes)
        inner.feed(bodies[0])
        while not self.closed and (frame := inner.next()) is not None:
            kind, meta, inner_bodies = frame
            if kind == K_SEALED or not isinstance(meta, dict):
                raise frames.FrameError("a bad frame in a sealed batch")
            self.on_frame(kind, meta, inner_bodies)
        if not self.closed and inner.buffered():
            raise frames.FrameError("a truncated frame in a sealed batch")

    def data_received(self, data: bytes) -> None:
        # Only FrameError (BadMessage among them) and AuthError are the peer's fault;
        # anything else is our bug and must not be swallowed here.
        try:
            self.reader.feed(data)
            while not self.closed and (frame := self.reader.next()) is not None:
                kind, meta, bodies = frame
                if kind == K_SEALED:
                    self.unseal(bodies)
                    continue
                if self.reader.mac is not None:
                    raise frames.FrameError("a frame outside a sealed batch")
                if not isinstance(meta, dict):
                    raise frames.FrameError("frame metadata is not an object")
                self.on_frame(kind, meta, bodies)
        except auth.AuthError as exc:
            auth.count("auth_failures")
            self.auth_failed(str(exc))
            self.close()
        except frames.FrameError as exc:
            auth.count("bad_frames")
            log.warning("%s: %s", self.drop_notice(), exc)
            self.close()

    def auth_failed(self, reason: str) -> None:
        log.warning("%s: authentication failed: %s (check cluster-secret-file)",
                    self.drop_notice(), reason)

    def on_frame(self, kind: int, meta: dict[str, Any], bodies: list[bytes]) -> None:
        raise NotImplementedError

    def drop_notice(self) -> str:
        """The log line's start when the peer's bytes make us drop the link."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _Link(PeerLink):
    """One TCP connection of the bus, either direction."""

    def __init__(self, bus: ClusterBus, node: Node | None) -> None:
        super().__init__(BUS_KINDS)
        self.bus = bus
        self.node = node  # outbound: the node we dialed; inbound: None
        self.addr = (node.ip, node.port) if node is not None else ("", 0)  # as dialed
        self.sender_id = ""  # inbound: who the handshake says is on the other end
        self.peer_id = ""  # outbound: who the answer to our handshake says it is
        self.peer_ip = ""
        self.local_ip = ""
        keys = bus.keyring.keys
        self.auth = auth.LinkAuth(keys, node is not None, bus.my_id) if keys else None
        # outbound links without a secret may speak at once; others after the handshake
        self.ready = node is not None and self.auth is None
        self.answered = False  # outbound: the acceptor's HANDSHAKE arrived
        self.data_worker = -1  # inbound data link: the sender's worker
        self.created_ms = mono_ms()
        self.failed = ""  # why authentication failed (outbound: shown in CLUSTER NODES)
        self.linger = False  # close after writing what is queued (a refusal the peer should read)
        self.pings_sent = 0  # outbound: PINGs and MEETs written ...
        self.pongs_seen = 0  # ... and PONGs read back
        # inbound: PONGs waiting for our workers to apply a view (seq, until ms, meta), in order
        self.held_pongs: list[tuple[int, int, dict[str, Any]]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername") or ("", 0)
        local = transport.get_extra_info("sockname") or ("", 0)
        self.peer_ip, self.local_ip = str(peer[0]), str(local[0])
        if self.node is not None:  # the dialer speaks first
            meta = self.bus.handshake_meta()
            if self.auth is not None:
                meta.update(self.auth.hello())
            self.write(K_HANDSHAKE, meta)
        self.bus.link_made(self)

    def on_frame(self, kind: int, meta: dict[str, Any], bodies: list[bytes]) -> None:
        self.bus.on_frame(self, kind, meta, bodies)

    def drop_notice(self) -> str:
        who = self.node.node_id[:8] if self.node is not None else self.sender_id[:8]
        return f"cluster bus: dropping link to {self.peer_ip} ({who or 'unknown'})"

    def auth_failed(self, reason: str) -> None:
        self.failed = reason
        self.bus.auth_failed(self, reason)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.bus.link_gone(self)

    def write(self, kind: int, meta: dict[str, Any], bodies: list[bytes] | None = None) -> bool:
        if not self._room(self.ready or kind in (K_HANDSHAKE, K_AUTH)):
            return False
        self.put(frames.encode(kind, meta, bodies or ()))
        self.bus.m.stats_sent += 1
        return True

    def write_job(self, kind: str, slot: int, meta: dict[str, Any], bodies: list[bytes]) -> bool:
        """A job message to this link's node (``write``'s checks, then ``put_job``)."""
        if not self._room(self.ready):
            return False
        self.put_job(kind, slot, meta, bodies)
        self.bus.m.stats_sent += 1
        return True

    def _room(self, may_speak: bool) -> bool:
        """The link may take a frame now (``may_speak``: its handshake allows it); a
        peer that does not drain its output loses the link."""
        if not self.writable() or not may_speak:
            return False
        if self.pending_bytes() > peer_output_bytes_max:
            log.warning("cluster bus: peer %s does not drain its output, dropping link",
                        self.peer_ip)
            self.close()
            return False
        return True

    def answer_ping(self, seq: int, pong: dict[str, Any]) -> None:
        """PONG a PING; once its view (``seq``, 0: none) is applied by our workers and
        behind any PONG still held, so PONGs keep their PINGs' order."""
        if not self.held_pongs and (seq == 0 or self.bus.views_applied(seq)):
            self.write(K_PONG, pong)
            return
        self.held_pongs.append((seq, mono_ms() + view_apply_wait_ms_max, pong))
        if len(self.held_pongs) > held_pongs_max:
            self.release_pongs(force=True)
            return
        asyncio.get_running_loop().call_later(view_apply_wait_ms_max / 1000, self.release_pongs)

    def release_pongs(self, force: bool = False) -> None:
        """Write the held PONGs whose view our workers have applied (or whose wait is over)."""
        held = self.held_pongs
        t = mono_ms()
        while held and (force or held[0][1] <= t or held[0][0] == 0
                        or self.bus.views_applied(held[0][0])):
            self.write(K_PONG, held.pop(0)[2])

    def session(self) -> dict[str, Any] | None:
        """The MAC state, for a worker this data link is handed to."""
        if self.sealer is None or self.reader.mac is None:
            return None
        return auth.export_session(self.sealer, self.reader.mac)

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            if self.linger:
                self.transport.close()  # writes what is buffered first
            else:
                self.transport.abort()
            self.bus.link_gone(self)

    def refuse(self, meta: dict[str, Any], reason: str) -> None:
        """Answer the dialer's handshake so it can tell why, then drop the link."""
        if self.transport is not None and not self.closed:
            self.transport.write(frames.encode(K_HANDSHAKE, meta))
            self.linger = True
        raise auth.AuthError(reason)

    def reader_pending(self) -> bool:
        return self.reader.buffered() > 0


class _Summary:
    """Bus links closed before their handshake, logged at most once per
    ``refusal_log_interval_ms`` with counts (a flood must not flood the log)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self.logged_ms = -refusal_log_interval_ms

    def add(self, t: int, ip: str, what: str) -> None:
        key = (ip, what)
        if key in self.counts or len(self.counts) < refusals_logged_max:
            self.counts[key] = self.counts.get(key, 0) + 1
        self.flush(t)

    def flush(self, t: int) -> None:
        if not self.counts or t - self.logged_ms < refusal_log_interval_ms:
            return
        self.logged_ms = t
        for (addr, reason), n in sorted(self.counts.items(), key=lambda kv: -kv[1])[:5]:
            log.warning("cluster bus: %d link(s) from %s %s%s", n, addr or "?", reason,
                        "" if n == 1 else f" (in the last {refusal_log_interval_ms // 1000} s)")
        self.counts.clear()


class ClusterBus:
    """Membership owner and bus I/O of one host (runs in worker 0)."""

    def __init__(self, cfg: Any, node_id: str, deliver: Deliver, publish: Publish,
                 workers: int, rng: random.Random | None = None,
                 keyring: auth.Keyring | None = None,
                 tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None) -> None:
        self.cfg = cfg
        self.tls = tls  # tls-cluster: (server, client) contexts  # read live: CONFIG SET cluster-node-timeout takes effect next tick
        self.deliver = deliver
        self.publish = publish
        self.workers = workers
        self.conf_path = cfg.cluster_config_file
        self.conf_vars: dict[str, str] = {"currentEpoch": "0"}
        ip = _first_bind(cfg.bind)
        self.m = Membership(node_id, ip, cfg.port, rng or random.Random(os.urandom(16)), mono_ms(),
                            cfg.cluster_node_timeout)
        self.out: dict[Node, _Link] = {}  # outbound link per node (keyed by identity)
        self.connecting: dict[Node, asyncio.Task[None]] = {}
        self.retry_at_ms: dict[Node, int] = {}
        self.backoff_ms: dict[Node, int] = {}
        self.inbound: set[_Link] = set()
        self.keyring = keyring if keyring is not None else auth.Keyring()
        self.auth_errors: dict[Node, str] = {}  # outbound links refused for the secret
        self.refusals_logged: dict[tuple[str, str], int] = {}  # (ip, reason) -> when, ms
        self.churn = _Summary()  # handshakes closed for room or time: logged once a minute
        self.job_frames_received = 0  # JOB frames read by this process (not data links)
        # adopt_data(link, sender_worker) -> True when the link was handed to another
        # worker of this host (set by the agent; None: worker 0 reads data links itself)
        self.adopt_data: Callable[[_Link, int], bool] | None = None
        self.server: asyncio.AbstractServer | None = None
        self.ticker: asyncio.Task[None] | None = None
        self.ticks = 0  # membership ticks run, and when the last one did (monotonic ms)
        self.last_tick_ms = 0
        self.tick_wake: asyncio.Future[None] | None = None  # ends an alone tick's wait early
        self.view_seq = 0  # bumped at each publish; the workers acknowledge what they applied
        # views_applied(seq): every worker of ours has applied view ``seq`` (set by the
        # agent; alone in a process, as in tests, there is nobody to wait for)
        self.views_applied: Callable[[int], bool] = lambda seq: True
        self.leaving_waits: list[_LeavingWait] = []
        # batch(True) before a JOBS frame's messages are delivered, batch(False) after:
        # the worker carries out their effects once, not once per message (set by the agent)
        self.batch: Callable[[bool], None] | None = None
        self.seeder = seeds.SeedDialer(cfg, cfg.port)  # cluster-seeds: MEET them while alone
        self.meet_log = MeetLog()  # a CLUSTER MEET that fails says why (bus/meetlog.py)
        # on_schedule(sender, meta, bodies): a checked SCHED frame from a member (set by
        # worker 0's schedules; None: SCHED frames are read and dropped)
        self.on_schedule: Callable[[str, dict[str, Any], list[bytes]], None] | None = None

    # ---- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        self._load_conf()
        loop = asyncio.get_running_loop()
        hosts = self.cfg.bind.split() or ["0.0.0.0"]
        self.server = await loop.create_server(lambda: _Link(self, None), hosts,
                                               bus_port(self.cfg.port), reuse_address=True,
                                               ssl=self.tls[0] if self.tls else None)
        self._after_change()
        self.ticker = asyncio.create_task(self._tick_loop())

    async def close(self) -> None:
        if self.ticker is not None:
            self.ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.ticker
        await self.seeder.close()
        for task in list(self.connecting.values()):
            task.cancel()
        for link in list(self.out.values()) + list(self.inbound):
            link.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    def _load_conf(self) -> None:
        try:
            nc = nodes_conf.load(self.conf_path)
        except (nodes_conf.NodesConfError, OSError) as exc:
            log.warning("cluster bus: cannot read %s: %s", self.conf_path, exc)
            return
        if nc is None:
            return
        if nc.node_id != self.m.my_id:  # a RESET HARD after the supervisor read it
            del self.m.nodes[self.m.my_id]
            self.m.myself.node_id = nc.node_id
            self.m.nodes[nc.node_id] = self.m.myself
        self.conf_vars = dict(nc.vars)
        self.m.load_conf(nc, mono_ms())
        self.m.dirty = True  # publish the loaded view

    # ---- API for worker 0 --------------------------------------------------------

    def send(self, node_id: str, kind: str, slot: int, meta: dict[str, Any],
             bodies: list[bytes] | None = None) -> int:
        """Send a job message; ``"*"`` = every node with a link. Returns the number
        of links written (0 = dropped: messages are best effort, the state machine
        retries what matters)."""
        parts = bodies if bodies is not None else []
        if node_id == "*":
            return sum(link.write_job(kind, slot, meta, parts) for link in list(self.out.values())
                       if not link.node or not link.node.handshake)
        node = self.m.nodes.get(node_id)
        link = self.out.get(node) if node is not None else None
        if link is None or node is None or node.handshake:
            return 0
        return int(link.write_job(kind, slot, meta, parts))

    def send_schedule(self, node_id: str, meta: dict[str, Any], bodies: list[bytes]) -> int:
        """A SCHED frame to ``node_id`` (``"*"``: every member with a link); the links written."""
        sent = 0
        for node, link in list(self.out.items()):
            if not node.handshake and (node_id == "*" or node.node_id == node_id):
                sent += int(link.write(K_SCHED, meta, bodies))
        return sent

    def view(self) -> dict[str, Any]:
        view = mb.snapshot(self.m, wall_offset_ms())
        view["vs"] = self.view_seq
        if self.auth_errors:  # CLUSTER NODES shows why a MEET or a peer does not answer
            failed = {n.node_id for n in self.auth_errors}
            for entry in view["nodes"]:
                if entry[0] in failed:
                    entry[3] = [*entry[3], "auth-failed"]
        return view

    @property
    def my_id(self) -> str:
        return self.m.my_id

    def meet(self, ip: str, port: int, watch: bool = True) -> None:
        """CLUSTER MEET (``watch``: log a failed one; cluster-seeds logs its own attempts)."""
        node = self.m.meet(ip, port, mono_ms())
        if node is not None and watch:
            self.meet_log.watch(node, mono_ms())
        self._after_change()

    def meet_seed(self, ip: str, port: int) -> None:
        self.meet(ip, port, watch=False)

    def forget(self, node_id: str) -> str | None:
        err = self.m.forget(node_id, mono_ms())
        self._after_change()
        return err

    def reset(self, hard: bool) -> None:
        self.m.reset(hard, mono_ms())
        self._after_change()

    def set_leaving(self, leaving: bool) -> Later:
        """CLUSTER LEAVING: set the flag, PING every peer and publish; the ``Later``
        resolves once our workers have the view and every peer pinged on a ready
        link has PONGed (it applied the flag, and its workers did), at most
        ``leaving_wait_ms_max`` from now."""
        actions = self.m.set_leaving(leaving, mono_ms())
        self._carry_out(actions)
        self._after_change()
        targets: dict[_Link, int] = {}
        for a in actions:
            link = self.out.get(a.node) if isinstance(a, Ping) else None
            if link is not None and not link.closed and link.pings_sent > link.pongs_seen:
                targets[link] = link.pings_sent
        later = Later()
        self.leaving_waits.append(_LeavingWait(later, self.view_seq, targets,
                                               mono_ms() + leaving_wait_ms_max))
        self.check_leaving_waits()
        if not later.resolved:
            asyncio.get_running_loop().call_later(leaving_wait_ms_max / 1000 + 0.01,
                                                  self.check_leaving_waits)
        return later

    def check_leaving_waits(self) -> None:
        """Resolve the CLUSTER LEAVINGs whose peers and workers all know (or whose
        wait is over)."""
        t = mono_ms()
        waiting: list[_LeavingWait] = []
        for w in self.leaving_waits:
            for link in [k for k, need in w.targets.items() if k.closed or k.pongs_seen >= need]:
                del w.targets[link]
            if (not w.targets and self.views_applied(w.seq)) or t >= w.deadline_ms:
                w.later.resolve(None)
            else:
                waiting.append(w)
        self.leaving_waits = waiting

    def on_views_applied(self) -> None:
        """A worker of ours acknowledged a view: PONGs and LEAVINGs waiting for it go."""
        for link in self.inbound:
            if link.held_pongs:
                link.release_pongs()
        if self.leaving_waits:
            self.check_leaving_waits()

    # ---- mesh side (frames between the workers of this host) ----------------------

    def on_mesh_frame(self, kind: int, meta: dict[str, Any], bodies: list[bytes]) -> None:
        """A MESH_BUS_OUT frame from another worker: put it on the bus."""
        if kind == MESH_BUS_OUT:
            self.send(str(meta.get("n", "")), str(meta.get("k", "")), int(meta.get("s", 0)),
                      meta.get("m") or {}, bodies)

    # ---- links --------------------------------------------------------------------

    def handshake_meta(self) -> dict[str, Any]:
        # "jb": we read JOBS frames (a dialer batches its job messages to us once our
        # answer says so; a peer without it gets one JOB frame a message)
        return {"proto": BUS_PROTO, "id": self.m.my_id, "port": self.m.myself.port, "jb": 1}

    def link_made(self, link: _Link) -> None:
        if link.node is None:
            if len(self.inbound) >= inbound_links_max:
                auth.count("links_refused")
                self.churn.add(mono_ms(), link.peer_ip, "refused (inbound_links_max)")
                link.close()
                return
            self._room_for_handshake(link.peer_ip)
            self.inbound.add(link)
            self._tick_now()  # alone no more: a MEET on it must not wait out its handshake
            return
        node = link.node
        self.out[node] = link
        self.backoff_ms.pop(node, None)
        self.m.link_connected(node, mono_ms())
        if link.ready:
            self._link_ready(link)

    def drop_links_of_removed_keys(self) -> int:
        """After the secret file changed: close the links whose session came from a key
        no longer in it (they redial and authenticate with the keys there are)."""
        return close_links_of_removed_keys(self.keyring, [*self.inbound, *self.out.values()])

    def _room_for_handshake(self, ip: str) -> None:
        """Make room for a new inbound link from ``ip``: past its address's share, or
        with every slot taken, close the oldest link in handshake of the address that
        holds the most (never a link done with its handshake)."""
        by_addr: dict[str, list[_Link]] = {}
        for other in self.inbound:
            if not other.ready:
                by_addr.setdefault(other.peer_ip, []).append(other)
        total = sum(map(len, by_addr.values()))
        mine = by_addr.get(ip, [])
        if len(mine) >= inbound_handshakes_per_addr_max:
            victims = mine
        elif total >= inbound_handshakes_max:
            victims = max(by_addr.values(), key=len)
        else:
            return
        oldest = min(victims, key=lambda other: other.created_ms)
        auth.count("links_refused")
        self.churn.add(mono_ms(), oldest.peer_ip, "closed in handshake to make room")
        self.inbound.discard(oldest)
        oldest.close()

    def _link_ready(self, link: _Link) -> None:
        """Our outbound link may carry PINGs and jobs (at once without a secret)."""
        assert link.node is not None
        if self.auth_errors.pop(link.node, None) is not None:
            self.m.dirty = True
        self._carry_out([self.m.ping(link.node, mono_ms())])

    def link_gone(self, link: _Link) -> None:
        if link.node is None:
            self.inbound.discard(link)
            return
        if self.out.get(link.node) is link:
            del self.out[link.node]
            self.m.link_lost(link.node)
            self._after_change_if_dirty()  # workers stop moving jobs to it at once
            wait = auth_failed_redial_ms if link.failed else connect_backoff_ms_min
            self.retry_at_ms[link.node] = mono_ms() + wait
            if self.leaving_waits:
                self.check_leaving_waits()  # its PONG will not come

    def auth_failed(self, link: _Link, reason: str) -> None:
        """A peer failed the handshake: log it once per node and reason (redials
        would repeat it every second) and flag our outbound link's node."""
        node = link.node
        if node is None:
            t = mono_ms()
            last = self.refusals_logged.get((link.peer_ip, reason))
            if last is None or t - last > refusal_log_interval_ms:
                if len(self.refusals_logged) >= refusals_logged_max:
                    self.refusals_logged.clear()
                self.refusals_logged[(link.peer_ip, reason)] = t
                log.warning("cluster bus: refusing %s (claims node %s): %s "
                            "(check cluster-secret-file)", link.peer_ip,
                            link.sender_id[:8] or "?", reason)
            return
        if self.auth_errors.get(node) != reason:
            log.warning("cluster bus: node %s at %s:%d refused: %s (check cluster-secret-file)",
                        node.node_id[:8] if not node.handshake else "(meet)", node.ip,
                        bus_port(node.port), reason)
            self.auth_errors[node] = reason
            self.m.dirty = True
            self._after_change_if_dirty()

    def is_member(self, node_id: str) -> bool:
        node = self.m.nodes.get(node_id)
        return node is not None and not node.handshake and not node.myself

    def on_frame(self, link: _Link, kind: int, meta: dict[str, Any], bodies: list[bytes]) -> None:
        self.m.stats_received += 1
        if not link.ready or (link.node is not None and not link.answered):
            self._on_handshake_frame(link, kind, meta)
        elif kind == K_JOB:
            self._on_job(link, meta, bodies)
        elif kind == K_JOBS:
            self._on_jobs(link, meta, bodies)
        elif kind in (K_PING, K_MEET):
            self._on_ping(link, kind, meta)
        elif kind == K_PONG and link.node is not None:
            self._on_pong(link, meta)
        elif kind == K_FAIL and link.node is None:
            self._on_fail(link, meta)
        elif kind == K_SCHED and link.node is None:
            self._on_schedule(link, meta, bodies)
        else:
            raise messages.BadMessage(f"unexpected frame kind {kind} on this link")

    def _on_handshake_frame(self, link: _Link, kind: int, meta: dict[str, Any]) -> None:
        """Who speaks, before what it says: HANDSHAKE (and AUTH with a secret) first."""
        if link.node is not None:
            if kind != K_HANDSHAKE:
                raise messages.BadMessage("a frame before the answer to our handshake")
            self._on_answer(link, meta)
        elif kind == K_HANDSHAKE and not link.sender_id:
            self._on_handshake(link, meta)
        elif kind == K_AUTH and link.sender_id and link.auth is not None:
            link.auth.check_auth(meta)
            assert link.auth.sealer is not None and link.auth.opener is not None
            link.start_mac(link.auth.sealer, link.auth.opener)
            self._inbound_ready(link, answered=True)
        else:
            raise messages.BadMessage("a frame before the handshake")

    def _on_answer(self, link: _Link, meta: dict[str, Any]) -> None:
        """The acceptor's HANDSHAKE on our outbound link."""
        link.peer_id = check_proto(meta)
        link.answered = True
        link.batch_jobs = meta.get("jb") == 1
        if link.auth is None:
            if "p" in meta or "secret" in meta:
                raise auth.AuthError("it uses a cluster secret and we have none")
            link.loosen()
            return
        if "p" not in meta:
            raise auth.AuthError("it has no cluster secret")
        reply = link.auth.check_answer(link.peer_id, meta)
        link.write(K_AUTH, reply)
        assert link.auth.sealer is not None and link.auth.opener is not None
        link.start_mac(link.auth.sealer, link.auth.opener)
        link.ready = True
        link.loosen()
        self._link_ready(link)

    def _on_handshake(self, link: _Link, meta: dict[str, Any]) -> None:
        """The dialer's HANDSHAKE on an inbound link."""
        link.sender_id = check_proto(meta)
        data = meta.get("data")
        if data is not None:
            if type(data) is not int or not 0 <= data < 1 << 16:
                raise messages.BadMessage("bad data link worker")
            link.data_worker = data
        if link.auth is None:
            if "n" in meta:
                link.refuse(self.handshake_meta(), "it uses a cluster secret and we have none")
            self._inbound_ready(link, answered=False)
            return
        if "n" not in meta:
            link.refuse({**self.handshake_meta(), "secret": "required"}, "it has no cluster secret")
        link.write(K_HANDSHAKE, {**self.handshake_meta(), **link.auth.answer(link.sender_id, meta)})

    def _inbound_ready(self, link: _Link, answered: bool) -> None:
        link.ready = True
        link.loosen()
        if link.data_worker >= 0:
            self._on_data_link(link, link.data_worker)
        elif not answered:
            link.write(K_HANDSHAKE, self.handshake_meta())

    def _on_data_link(self, link: _Link, sender_worker: int) -> None:
        if link.reader_pending():
            link.close()  # the dialer must wait for DATA_READY before sending
            return
        if self.adopt_data is not None and self.adopt_data(link, sender_worker):
            return
        link.write(K_DATA_READY, {"proto": BUS_PROTO, "id": self.m.my_id, "w": 0, "jb": 1})

    def _on_ping(self, link: _Link, kind: int, meta: dict[str, Any]) -> None:
        if link.node is not None:
            return  # PINGs travel on the sender's outbound link only
        sender = messages.check_header(meta)
        if sender != link.sender_id:
            auth.count("rejected_messages")
            raise messages.BadMessage(f"a PING from {sender[:8]} on {link.sender_id[:8]}'s link")
        pong = self.m.on_ping(meta, kind == K_MEET, link.peer_ip, link.local_ip, mono_ms())
        seq = 0
        if self.m.dirty:  # (a flag a client sees changed: our workers learn it first)
            self._after_change()
            seq = self.view_seq
        if pong is not None:
            link.answer_ping(seq, pong)
        self._redial_now(sender)

    def _redial_now(self, node_id: str) -> None:
        """A PING from a node our outbound link to is down (it restarted): dial it
        now rather than at the end of its backoff, so the PONG that clears its PFAIL
        comes in one round trip."""
        node = self.m.nodes.get(node_id)
        if node is None or node.myself or node.noaddr or node.handshake \
                or node in self.out or node in self.connecting or self.auth_errors.get(node):
            return
        self.retry_at_ms.pop(node, None)
        self.backoff_ms.pop(node, None)
        self.connecting[node] = asyncio.create_task(self._connect(node))

    def _on_pong(self, link: _Link, meta: dict[str, Any]) -> None:
        assert link.node is not None
        sender = messages.check_header(meta)
        if sender != link.peer_id:
            auth.count("rejected_messages")
            raise messages.BadMessage(f"a PONG from {sender[:8]} on {link.peer_id[:8]}'s link")
        link.pongs_seen += 1
        self._carry_out(self.m.on_pong(link.node, meta, mono_ms()))
        self._after_change_if_dirty()
        if self.leaving_waits:
            self.check_leaving_waits()

    def _on_fail(self, link: _Link, meta: dict[str, Any]) -> None:
        messages.check_fail(meta)
        if not self.is_member(link.sender_id):
            auth.count("rejected_messages")
            return  # failure reports count from current members only
        self.m.on_fail(link.sender_id, meta, mono_ms())
        self._after_change_if_dirty()

    def _on_schedule(self, link: _Link, meta: dict[str, Any], bodies: list[bytes]) -> None:
        messages.check_schedule(meta, bodies)
        if not self.is_member(link.sender_id):
            auth.count("rejected_messages")
            return  # schedules from current members only
        if self.on_schedule is not None:
            self.on_schedule(link.sender_id, meta, bodies)

    def _on_job(self, link: _Link, meta: dict[str, Any], bodies: list[bytes]) -> None:
        kind, slot, inner = messages.check_job(meta, bodies)
        sender = link.sender_id if link.node is None else link.node.node_id
        if not self.is_member(sender):
            auth.count("rejected_messages")
            return  # job traffic from current members only
        self.job_frames_received += 1
        self.deliver(slot % self.workers, sender, kind, slot, inner, bodies)

    def _on_jobs(self, link: _Link, meta: dict[str, Any], bodies: list[bytes]) -> None:
        batch = messages.check_jobs(meta, bodies)  # the whole frame, before any delivery
        sender = link.sender_id if link.node is None else link.node.node_id
        if not self.is_member(sender):
            auth.count("rejected_messages")
            return
        self.job_frames_received += len(batch)
        deliver, workers = self.deliver, self.workers
        deliver_jobs(batch, self.batch, lambda kind, slot, inner, parts:
                     deliver(slot % workers, sender, kind, slot, inner, parts))

    # ---- time -----------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        """The membership tick: every half ping interval (at most ``tick_interval_ms_max``)
        while there is another node, a link or a seed; alone, every ``alone_tick_ms``
        or at once after a membership change or an inbound link (``_tick_now``)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                self.tick()
            except Exception:  # a bug here must not silence the bus for good
                log.exception("cluster bus tick failed")
            if not self._alone():
                await asyncio.sleep(min(tick_interval_ms_max, self.m.ping_interval_ms() // 2) / 1000)
                continue
            wake = self.tick_wake = loop.create_future()
            timer = loop.call_later(alone_tick_ms / 1000, _settle, wake)
            try:
                await wake
            finally:
                timer.cancel()
                self.tick_wake = None

    def _alone(self) -> bool:
        """Nothing for the tick to ping, dial, expire or seed."""
        return (not self.inbound and not self.out and not self.connecting
                and not getattr(self.cfg, "cluster_seeds", "") and next(self.m.others(), None) is None)

    def tick(self) -> None:
        self.m.set_node_timeout(int(self.cfg.cluster_node_timeout))
        t = mono_ms()
        self.ticks += 1
        self.last_tick_ms = t
        self._expire_handshakes(t)
        self._carry_out(self.m.tick(t))
        self.meet_log.sweep(self.m, t)
        self._reconcile_links(t)
        self.seeder.tick(t, self.m.others(), self.meet_seed)
        self._after_change_if_dirty()

    def _expire_handshakes(self, t: int) -> None:
        self.churn.flush(t)
        for link in [*self.inbound, *self.out.values()]:
            if (not link.ready or not link.answered and link.node is not None) \
                    and t - link.created_ms > handshake_timeout_ms:
                auth.count("handshake_timeouts")
                self.churn.add(t, link.peer_ip or link.addr[0],
                               f"no handshake within {handshake_timeout_ms} ms")
                link.close()

    def _carry_out(self, actions: list[mb.Action]) -> None:
        for a in actions:
            if isinstance(a, Ping):
                link = self.out.get(a.node)
                if link is not None and link.write(K_MEET if a.meet else K_PING,
                                                   self.m.make_ping(a.node)):
                    link.pings_sent += 1
            elif isinstance(a, Broadcast):
                for link in list(self.out.values()):
                    link.write(K_FAIL, a.meta)
            elif isinstance(a, DropLink):
                link = self.out.get(a.node)
                if link is not None:
                    link.close()

    def _reconcile_links(self, t: int) -> None:
        live = {n for n in self.m.others() if not n.noaddr}
        for node in [n for n in self.auth_errors if n not in live]:
            del self.auth_errors[node]  # an expired handshake or a forgotten node
        for node, link in list(self.out.items()):
            if node not in live or link.addr != (node.ip, node.port):
                link.close()  # forgotten, or it moved (restarted on another address)
                self.out.pop(node, None)
        for node in list(self.connecting):
            if node not in live:
                self.connecting.pop(node).cancel()
        for node in list(self.retry_at_ms):
            if node not in live:
                del self.retry_at_ms[node]
                self.backoff_ms.pop(node, None)
        for node in live:
            if node not in self.out and node not in self.connecting \
                    and t >= self.retry_at_ms.get(node, 0):
                self.connecting[node] = asyncio.create_task(self._connect(node))

    async def _connect(self, node: Node) -> None:
        try:
            await dial(lambda: _Link(self, node), node.ip, node.port,
                       self.tls[1] if self.tls else None)
        except (TimeoutError, OSError) as exc:
            self.meet_log.dial_failed(node, exc)
            backoff = next_backoff_ms(self.backoff_ms.get(node), connect_backoff_ms_min,
                                      connect_backoff_ms_max)
            self.backoff_ms[node] = backoff
            self.retry_at_ms[node] = mono_ms() + backoff
        finally:
            self.connecting.pop(node, None)

    # ---- changes: save nodes.conf, tell the other workers ---------------------------

    def _after_change_if_dirty(self) -> None:
        if self.m.dirty:
            self._after_change()

    def _tick_now(self) -> None:
        """End an alone tick's wait (a node met, forgotten or reset; a link in)."""
        if self.tick_wake is not None:
            _settle(self.tick_wake)

    def _after_change(self) -> None:
        self._tick_now()
        self.m.dirty = False
        self.view_seq += 1
        try:
            nodes_conf.save(self.conf_path, self.m.to_conf(self.conf_vars))
        except OSError as exc:
            log.warning("cluster bus: cannot save %s: %s", self.conf_path, exc)
        self.publish(self.view())


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def deliver_jobs(batch: list[tuple[str, int, dict[str, Any], list[bytes]]],
                 around: Callable[[bool], None] | None,
                 each: Callable[[str, int, dict[str, Any], list[bytes]], None]) -> None:
    """A JOBS frame's checked messages (``messages.check_jobs``) to ``each`` in order,
    between ``around(True)`` and ``around(False)`` (the worker carries out their
    effects once, after the last); bus links and data links alike."""
    if around is not None:
        around(True)
    try:
        for kind, slot, inner, parts in batch:
            each(kind, slot, inner, parts)
    finally:
        if around is not None:
            around(False)


def _seal_batch(sealer: auth.Sealer, batch: list[bytes], out: list[bytes]) -> None:
    frame = frames.encode(K_SEALED, {}, [b"".join(batch) if len(batch) > 1 else batch[0]])
    out.append(frame)
    out.append(sealer.seal(frame))


def _first_bind(bind: str) -> str:
    for addr in bind.split():
        if addr not in ("0.0.0.0", "::", "*"):
            return addr
    return ""


# ---- mesh frames (workers other than 0) ---------------------------------------------

def mesh_bus_out(node_id: str, kind: str, slot: int, meta: dict[str, Any],
                 bodies: list[bytes]) -> bytes:
    """A worker's ``Send`` effect as a mesh frame for worker 0."""
    return frames.encode(MESH_BUS_OUT, {"n": node_id, "k": kind, "s": slot, "m": meta}, bodies)


def mesh_bus_in(sender: str, kind: str, slot: int, meta: dict[str, Any],
                bodies: list[bytes]) -> bytes:
    """A job message from the bus, as a mesh frame for the slot's owner."""
    return frames.encode(MESH_BUS_IN, {"f": sender, "k": kind, "s": slot, "m": meta}, bodies)


def mesh_view(view: dict[str, Any]) -> bytes:
    return frames.encode(MESH_VIEW, view)
