"""Every worker's handle on the cluster.

Worker 0 owns the ``ClusterBus`` (membership, gossip, nodes.conf, all TCP links to
other hosts). The other workers reach it over a Unix socket of the cluster's own
(in the node's private socket directory, beside the front end's request/reply mesh in bus/mesh.py, so
neither has to know the other's frame kinds):

    worker k -> 0   AGENT_HELLO {"w": k}                  first frame
    worker k -> 0   MESH_BUS_OUT {"n", "k", "s", "m"} + bodies    a Send effect to put on the bus
                    (only while worker k has no ready data link to that node: bus/datalink.py)
    worker k -> 0   MESH_BUS_IN  {"f", "k", "s", "m"} + bodies    a job message that came on
                    k's data link but belongs to another worker's slot: worker 0 passes it on
    worker k -> 0   AGENT_CMD {"r": rid, "a": [args]}     a CLUSTER command, answered by
                    ({"r": rid, "x": area} + args as bodies: another area's command,
                    such as SCHEDULE, whose words may be any bytes)
    worker 0 -> k   AGENT_REPLY {"r": rid, "v": packed}
    worker 0 -> k   MESH_BUS_IN {"f", "k", "s", "m"} + bodies     a job message for k's slots
    worker 0 -> k   MESH_VIEW snapshot                    after every membership change
    worker k -> 0   AGENT_VIEW_ACK {"vs": seq}            view ``seq`` applied (worker 0 holds
                    the PONGs and CLUSTER LEAVING answers that wait for it: bus/hostbus.py)

So any worker can call ``send()`` with a shard's ``Send`` effect and receives the
job messages for its slots through ``on_message(sender, kind, slot, meta, bodies)``;
``view`` is the latest membership snapshot (HELLO, peers for the shard).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any, cast

from bus import auth, frames, hostbus, peercred
from bus.clock import mono_ms
from bus.datalink import FDPASS_PURPOSE, DataIn, DataLinks, fdpass_state_bytes_max
from bus.hostbus import (
    MESH_BUS_IN,
    MESH_BUS_OUT,
    MESH_VIEW,
    BatchedLink,
    ClusterBus,
    Later,
    mesh_bus_in,
    mesh_bus_out,
    mesh_view,
)
from bus.mesh import pack, unpack
from bus.peercred import same_user
from bus.sockpass import SocketPass
from workers.replies import Error

log = logging.getLogger("disque.cluster")

AGENT_HELLO, AGENT_CMD, AGENT_REPLY, AGENT_VIEW_ACK = 0xC3, 0xC4, 0xC5, 0xC6
AGENT_KINDS = frozenset({MESH_BUS_OUT, MESH_BUS_IN, MESH_VIEW, AGENT_HELLO, AGENT_CMD, AGENT_REPLY,
                         AGENT_VIEW_ACK})

reconnect_delay_s = 0.05  # worker 0 starts (or restarts) within a few hundred ms
owner_wait_s = 10.0  # at start, wait this long for worker 0 before serving anyway
agent_output_bytes_max = 256 << 20  # unsent bytes on one local link: over it, drop frames
# (the same bound as a bus peer: what worker 0 cannot pass on, the bus could not either)
pending_commands_max = 10_000  # CLUSTER commands in flight to worker 0 from one worker

OnMessage = Callable[[str, str, int, dict[str, Any], list[bytes]], None]
OnView = Callable[[dict[str, Any]], None]
Reply = Any
Done = Callable[[Reply], None]
Executor = Callable[[ClusterBus, list[bytes]], Reply]  # a reply, or a Later of one

ERR_OWNER_DOWN = Error("ERR cluster bus owner (worker 0) is unavailable, try again")


def socket_name(port: int, node_id: str) -> str:
    return peercred.local_name(port, node_id, "cluster")


class _Local(BatchedLink):
    """A connection between worker 0 and worker ``peer`` (either end)."""

    def __init__(self, agent: ClusterAgent, peer: int) -> None:
        super().__init__()
        self.agent = agent
        self.peer = peer  # worker at the other end (-1 until its AGENT_HELLO on worker 0)
        self.view_applied = 0  # worker 0: the newest view (its "vs") that worker applied
        self.reader = frames.FrameReader(AGENT_KINDS)
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        if not same_user(transport.get_extra_info("socket")):
            # Abstract sockets have no file permissions: any local user could connect
            # and run CLUSTER RESET or inject job messages. Only our own user may.
            auth.count("local_refused")
            log.warning("cluster agent: refusing a local connection from another user")
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        try:
            self.reader.feed(data)
            while (frame := self.reader.next()) is not None:
                self.agent.on_local_frame(self, *frame)
        except frames.FrameError as exc:
            log.warning("cluster agent: bad local frame: %s", exc)
            if self.transport is not None:
                self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.lost.done():
            self.lost.set_result(None)
        self.agent.local_lost(self)

    def write(self, frame: bytes) -> bool:
        if not self.writable():
            return False
        if self.pending_bytes() > agent_output_bytes_max:
            log.warning("cluster agent: worker %d does not drain, dropping a frame", self.peer)
            return False
        self.enqueue(frame)
        return True


class ClusterAgent:
    def __init__(self, cfg: Any, index: int, node_id: str, workers: int, on_message: OnMessage,
                 executor: Executor, on_view: OnView | None = None,
                 on_batch: Callable[[bool], None] | None = None) -> None:
        self.cfg = cfg
        self.index = index
        self.node_id = node_id  # as started: names the local socket even after RESET HARD
        self.workers = workers
        self.on_message = on_message
        self.on_view = on_view
        self.on_batch = on_batch  # around the messages of one JOBS frame (bus/hostbus.py)
        self.executor = executor
        # worker 0: other areas' executors (``command(..., area=)``), e.g. "schedule"
        self.executors: dict[str, Executor] = {}
        self.bus: ClusterBus | None = None
        self.view: dict[str, Any] = {"myid": node_id, "leaving": False, "size": 1, "sent": 0,
                                     "received": 0, "nodes": []}
        self.peers: dict[int, _Local] = {}  # worker 0: worker index -> link
        self.to_owner: _Local | None = None  # other workers: link to worker 0
        self.pending: dict[int, Done] = {}
        self.next_rid = 0
        self.server: asyncio.AbstractServer | None = None
        self.connector: asyncio.Task[None] | None = None
        self.closing = False
        self.fdpass: SocketPass | None = None
        self.data_out: DataLinks | None = None  # workers 1..: our data links to peers
        self.data_in: set[DataIn] = set()  # data links handed to us
        self.keyring = auth.Keyring()  # the cluster secret (bus/auth.py), shared by our links
        self.members: frozenset[str] = frozenset()  # data links: job traffic from these only
        # tls-cluster: (server, client) SSL contexts for bus and data links, set by make_agent
        self.tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None

    # ---- lifecycle --------------------------------------------------------------

    def configure_secret(self) -> str | None:
        """(Re)read ``cluster-secret-file``; the reason when it cannot be used (the keys
        in use then stay). Links already up keep their session keys."""
        try:
            self.keyring.configure(getattr(self.cfg, "cluster_secret_file", ""))
        except auth.SecretError as exc:
            return str(exc)
        # links made with a key that is gone now are closed (they redial)
        if self.bus is not None:
            self.bus.drop_links_of_removed_keys()
        if self.data_out is not None:
            self.data_out.drop_links_of_removed_keys(list(self.data_in))
        return None

    def _warn_open_bus(self) -> None:
        if self.keyring.enabled:
            return
        binds = str(self.cfg.bind).split() or ["0.0.0.0"]
        if any(not _loopback(addr) for addr in binds):
            log.warning("WARNING: the cluster bus (port %d) listens on %s without a cluster "
                        "secret: anyone who reaches it can join the cluster and read or inject "
                        "jobs. Set cluster-secret-file (see README, Security).",
                        self.cfg.port + hostbus.BUS_PORT_OFFSET, " ".join(binds))

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        err = self.configure_secret()
        if err is not None:
            log.warning("Fatal error in cluster-secret-file: %s", err)
            raise SystemExit(1)  # never run an open bus when a secret was asked for
        hostbus.set_peer_frame_max(int(getattr(self.cfg, "proto_max_bulk_len", 0)))
        if self.index == 0:
            self._warn_open_bus()
            self.fdpass = SocketPass(self.cfg.port, self.node_id, 0, FDPASS_PURPOSE,
                                     lambda sock, state: sock.close(), fdpass_state_bytes_max)
            self.bus = ClusterBus(self.cfg, self.node_id, self._deliver, self._publish,
                                  self.workers, keyring=self.keyring, tls=self.tls)
            self.bus.adopt_data = self._adopt_data
            self.bus.views_applied = self._views_applied
            self.bus.batch = self.on_batch
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            peercred.bind_local(sock, socket_name(self.cfg.port, self.node_id))
            sock.listen(self.workers * 4)
            sock.setblocking(False)
            self.server = await loop.create_unix_server(lambda: _Local(self, -1), sock=sock)
            await self.bus.start()
        else:
            self.fdpass = SocketPass(self.cfg.port, self.node_id, self.index, FDPASS_PURPOSE,
                                     self._on_data_socket, fdpass_state_bytes_max)
            self.data_out = DataLinks(self.index, self.cfg.port, lambda: str(self.view["myid"]),
                                      mono_ms, self.keyring,
                                      self.tls[1] if self.tls is not None else None)
            self.connector = asyncio.create_task(self._connect_loop())
            # Be ready only once CLUSTER and Sends can reach worker 0 (it starts at the
            # same time); if it does not come, start anyway and keep trying.
            deadline = loop.time() + owner_wait_s
            while self.to_owner is None and loop.time() < deadline:
                await asyncio.sleep(reconnect_delay_s / 5)

    async def close(self) -> None:
        self.closing = True
        if self.connector is not None:
            self.connector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.connector
        if self.bus is not None:
            await self.bus.close()
        if self.server is not None:
            self.server.close()
        if self.data_out is not None:
            self.data_out.close()
        for data_link in list(self.data_in):
            data_link.close()
        if self.fdpass is not None:
            self.fdpass.close()
        for link in list(self.peers.values()):
            if link.transport is not None:
                link.transport.close()

    async def _connect_loop(self) -> None:
        loop = asyncio.get_running_loop()
        name = socket_name(self.cfg.port, self.node_id)
        while not self.closing:
            try:
                link = await _connect_unix(loop, name, lambda: _Local(self, 0))
            except OSError:
                await asyncio.sleep(reconnect_delay_s)
                continue
            link.write(frames.encode(AGENT_HELLO, {"w": self.index}))
            self.to_owner = link
            await link.lost
            self.to_owner = None
            await asyncio.sleep(reconnect_delay_s)

    # ---- API for any worker -----------------------------------------------------------

    def send(self, node_id: str, kind: str, slot: int, meta: dict[str, Any],
             bodies: list[bytes] | None = None) -> bool:
        """Put a job message on the bus (a shard's ``Send`` effect). Best effort:
        dropped when worker 0 or the peer is not reachable right now. False when it
        was dropped here (no link to the node on worker 0; no direct data link and
        no local link to worker 0 elsewhere): the caller may undo what the message
        was to carry (a YOURJOBS' jobs go back to their queue)."""
        if self.bus is not None:
            return self.bus.send(node_id, kind, slot, meta, bodies) > 0
        direct = self.data_out.usable(node_id) if self.data_out is not None else None
        if direct is not None and direct.write_job(kind, slot, meta, bodies or []):
            return True
        if self.to_owner is not None:
            return self.to_owner.write(mesh_bus_out(node_id, kind, slot, meta, bodies or []))
        return False

    def command(self, args: list[bytes], done: Done, area: str = "") -> None:
        """Run a CLUSTER command (or, with ``area``, that area's) on worker 0;
        ``done(reply)`` gets the answer (at once on worker 0, after a round trip
        elsewhere)."""
        if self.bus is not None:
            reply = self._run(area, args)
            if isinstance(reply, Later):
                reply.then(done)
            else:
                done(reply)
            return
        if self.to_owner is None or len(self.pending) >= pending_commands_max:
            done(ERR_OWNER_DOWN)
            return
        self.next_rid += 1
        if area:
            frame = frames.encode(AGENT_CMD, {"r": self.next_rid, "x": area}, args)
        else:
            frame = frames.encode(AGENT_CMD, {"r": self.next_rid, "a": [
                a.decode("utf-8", "surrogateescape") for a in args]})
        if not self.to_owner.write(frame):
            done(ERR_OWNER_DOWN)
            return
        self.pending[self.next_rid] = done

    # ---- worker 0 side ---------------------------------------------------------------

    def _deliver(self, index: int, sender: str, kind: str, slot: int, meta: dict[str, Any],
                 bodies: list[bytes]) -> None:
        if index == 0:
            self.on_message(sender, kind, slot, meta, bodies)
            return
        link = self.peers.get(index)
        if link is not None:
            link.write(mesh_bus_in(sender, kind, slot, meta, bodies))

    def _adopt_data(self, link: Any, sender_worker: int) -> bool:
        """Worker 0: hand a data link from a peer's worker k to our worker k % N."""
        target = sender_worker % self.workers
        if target == 0 or target not in self.peers or self.fdpass is None or self.tls is not None:
            # (a TLS session lives in this process: worker 0 keeps reading the link)
            return False  # ours, or that worker is not up: worker 0 reads it
        sock = link.transport.get_extra_info("socket")
        if sock is None:
            return False
        link.transport.pause_reading()
        state = {"id": link.sender_id, "auth": link.session()}
        if not self.fdpass.give(target, sock.fileno(), state):
            link.transport.resume_reading()
            return False
        link.close()  # our descriptor only: the connection lives on in the target
        return True

    def _on_data_socket(self, sock: socket.socket, state: dict[str, Any]) -> None:
        """Workers 1..: a data link handed over by worker 0."""
        sender = state.get("id")
        if not isinstance(sender, str) or self.closing:
            sock.close()
            return
        session = auth.import_session(state.get("auth"))
        if session is None and (self.keyring.enabled or state.get("auth") is not None):
            sock.close()  # worker 0 authenticates every link before it hands it over
            return
        sock.setblocking(False)
        link = DataIn(sender, str(self.view["myid"]), self.index, self._on_data_job,
                      self.data_in.discard, session)
        link.batch = self.on_batch
        self.data_in.add(link)

        async def adopt() -> None:
            try:
                await asyncio.get_running_loop().create_connection(lambda: link, sock=sock)
            except OSError:
                sock.close()
                self.data_in.discard(link)

        asyncio.get_running_loop().create_task(adopt())

    def _on_data_job(self, sender: str, kind: str, slot: int, meta: dict[str, Any],
                     bodies: list[bytes]) -> None:
        if sender not in self.members:
            auth.count("rejected_messages")
            return  # job traffic from current members only (as the bus checks on worker 0)
        if slot % self.workers == self.index:
            self.on_message(sender, kind, slot, meta, bodies)
        elif self.to_owner is not None:  # hosts with different worker counts
            self.to_owner.write(mesh_bus_in(sender, kind, slot, meta, bodies))

    def _publish(self, view: dict[str, Any]) -> None:
        self.view = view
        if self.on_view is not None:
            self.on_view(view)
        frame = mesh_view(view)
        for link in self.peers.values():
            link.write(frame)

    # ---- frames between workers -------------------------------------------------------

    def on_local_frame(self, link: _Local, kind: int, meta: dict[str, Any],
                       bodies: list[bytes]) -> None:
        if self.bus is not None:
            self._on_frame_at_owner(link, kind, meta, bodies)
        elif kind == MESH_BUS_IN:
            self.on_message(str(meta.get("f")), str(meta.get("k")), int(meta.get("s", 0)),
                            meta.get("m") or {}, bodies)
        elif kind == MESH_VIEW:
            self.view = meta
            self.members = members_of(meta)
            if self.data_out is not None:
                self.data_out.on_view(meta)
            if self.on_view is not None:
                self.on_view(meta)
            link.write(frames.encode(AGENT_VIEW_ACK, {"vs": meta.get("vs", 0)}))
        elif kind == AGENT_REPLY:
            done = self.pending.pop(int(meta.get("r", 0)), None)
            if done is not None:
                done(unpack(meta.get("v"), bodies))

    def _on_frame_at_owner(self, link: _Local, kind: int, meta: dict[str, Any],
                           bodies: list[bytes]) -> None:
        assert self.bus is not None
        if kind == AGENT_HELLO:
            peer = meta.get("w")
            if isinstance(peer, int) and 0 < peer < self.workers:
                link.peer = peer
                self.peers[peer] = link
                link.write(mesh_view(self.bus.view()))
        elif kind == MESH_BUS_OUT:
            self.bus.on_mesh_frame(kind, meta, bodies)
        elif kind == MESH_BUS_IN:  # from a worker's data link, for another worker's slot
            slot = int(meta.get("s", 0))
            self._deliver(slot % self.workers, str(meta.get("f")), str(meta.get("k")), slot,
                          meta.get("m") or {}, bodies)
        elif kind == AGENT_VIEW_ACK:
            seq = meta.get("vs")
            if type(seq) is int and seq > link.view_applied:
                link.view_applied = seq
                self.bus.on_views_applied()
        elif kind == AGENT_CMD:
            area = meta.get("x")
            args = bodies if isinstance(area, str) else [
                str(a).encode("utf-8", "surrogateescape") for a in meta.get("a", [])]
            reply = self._run(area if isinstance(area, str) else "", args)
            rid = meta.get("r")
            if isinstance(reply, Later):
                reply.then(lambda value: _answer(link, rid, value))
            else:
                _answer(link, rid, reply)

    def _run(self, area: str, args: list[bytes]) -> Reply:
        assert self.bus is not None
        if not area:
            return self.executor(self.bus, args)
        executor = self.executors.get(area)
        return ERR_OWNER_DOWN if executor is None else executor(self.bus, args)

    def _views_applied(self, seq: int) -> bool:
        """Worker 0: every other worker connected to us has applied view ``seq`` (a
        worker that is down is not waited for: it gets the view when it comes back)."""
        return all(link.view_applied >= seq for link in self.peers.values())

    def local_lost(self, link: _Local) -> None:
        if self.bus is not None:
            if self.peers.get(link.peer) is link:
                del self.peers[link.peer]
                self.bus.on_views_applied()  # nobody waits for a worker that is gone
            return
        pending, self.pending = self.pending, {}
        for done in pending.values():
            done(ERR_OWNER_DOWN)


def _answer(link: _Local, rid: Any, reply: Reply) -> None:
    out: list[bytes] = []
    value = pack(reply, out)
    link.write(frames.encode(AGENT_REPLY, {"r": rid, "v": value}, out))


def members_of(view: dict[str, Any]) -> frozenset[str]:
    """The current members in a membership snapshot (handshakes and ourselves left out)."""
    return frozenset(str(n[0]) for n in view.get("nodes", [])
                     if "myself" not in n[3] and "handshake" not in n[3])


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


async def _connect_unix(loop: asyncio.AbstractEventLoop, name: str,
                        factory: Callable[[], _Local]) -> _Local:
    """Connect to worker 0's socket, and only if worker 0 holds it: another process
    there (a stranger in its place while it restarts) is never sent anything."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, name)
        if not peercred.sibling(sock):
            auth.count("local_refused")
            log.warning("cluster agent: worker 0's socket is held by another process")
            raise ConnectionRefusedError(name)
    except OSError:
        sock.close()
        raise
    _, link = await loop.create_unix_connection(factory, sock=sock)
    return link
