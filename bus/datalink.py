"""Data links: job messages from worker k straight to the peer host's worker k.

Without them every job message of workers 1..N-1 takes two extra local hops
(to worker 0 here, from worker 0 there). With them, worker k dials the peer's
bus port itself; the HANDSHAKE says ``"data": k``; the peer's worker 0 passes the
socket (SCM_RIGHTS over a datagram socket, ``bus/sockpass.py``) to its worker
``k % workers``, which answers DATA_READY and reads JOB frames. With the same
number of workers on both hosts every frame on that link belongs to that
worker's slots (the sender only owns slots ``s % N == k``); other frames are
passed to their owner through worker 0.

With a cluster secret the dialer and the peer's worker 0 run the handshake of
bus/auth.py first (HANDSHAKE, HANDSHAKE with proof, AUTH); worker 0 then hands
the socket over with the link's MAC state, and DATA_READY is the first frame
with a MAC.

Until DATA_READY arrives, and whenever the link is down, the agent relays
through worker 0 as before, so data links only ever make things faster: messages
are never lost for want of one (they stay best effort, as on every bus path).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Any, cast

from bus import auth, frames, messages
from bus.hostbus import (
    BUS_PROTO,
    K_AUTH,
    K_DATA_READY,
    K_HANDSHAKE,
    K_JOB,
    K_JOBS,
    K_SEALED,
    PeerLink,
    check_proto,
    close_links_of_removed_keys,
    deliver_jobs,
    dial,
    handshake_timeout_ms,
    next_backoff_ms,
)

log = logging.getLogger("disque.cluster")

data_output_bytes_max = 256 << 20  # as a bus peer: a link that does not drain is dropped
data_backoff_ms_min = 100  # redial delay after a failure, doubling ...
data_backoff_ms_max = 2000  # ... up to this (meanwhile worker 0 relays)
# Worker 0 passes a data link to worker i over i's datagram socket "...cluster.fd.<i>"
# (bus/sockpass.py).
FDPASS_PURPOSE = "cluster.fd.{index}"
fdpass_state_bytes_max = 4096  # one datagram beside the descriptor: sender's ID, MAC state

OnJob = Callable[[str, str, int, dict[str, Any], list[bytes]], None]


class _DataConn(PeerLink):
    """One data link, either end: ``DataOut`` dials, ``DataIn`` was handed over."""

    kinds: frozenset[int] = frozenset()

    def __init__(self) -> None:
        super().__init__(self.kinds)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def drop_notice(self) -> str:
        return "cluster data link: dropping it"

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None

    def write(self, frame: bytes) -> bool:
        if not self._room():
            return False
        self.put(frame)
        return True

    def write_job(self, kind: str, slot: int, meta: dict[str, Any], bodies: list[bytes]) -> bool:
        if not self._room():
            return False
        self.put_job(kind, slot, meta, bodies)
        return True

    def _room(self) -> bool:
        if not self.writable():
            return False
        if self.pending_bytes() > data_output_bytes_max:
            log.warning("cluster data link: peer does not drain its output, dropping it")
            self.close()
            return False
        return True

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.abort()


class DataIn(_DataConn):
    """A data link handed to this worker: JOB frames from one sender node."""

    kinds = frozenset({K_JOB, K_JOBS, K_SEALED})

    def __init__(self, sender_id: str, my_id: str, index: int, on_job: OnJob,
                 on_lost: Callable[[DataIn], None],
                 session: tuple[auth.Sealer, auth.Opener] | None = None) -> None:
        super().__init__()
        self.sender_id = sender_id
        self.my_id = my_id
        self.index = index
        self.on_job = on_job
        self.on_lost = on_lost
        # batch(True) / batch(False) around a JOBS frame's messages (bus/hostbus.py)
        self.batch: Callable[[bool], None] | None = None
        self.loosen()  # worker 0 ran the handshake
        if session is not None:
            self.start_mac(*session)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.on_lost(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.write(frames.encode(K_DATA_READY, {"proto": BUS_PROTO, "id": self.my_id,
                                                "w": self.index, "jb": 1}))

    def on_frame(self, kind: int, meta: dict[str, Any], bodies: list[bytes]) -> None:
        if kind == K_JOBS:
            sender, on_job = self.sender_id, self.on_job
            deliver_jobs(messages.check_jobs(meta, bodies), self.batch,
                         lambda job_kind, slot, inner, parts:
                         on_job(sender, job_kind, slot, inner, parts))
            return
        job_kind, slot, inner = messages.check_job(meta, bodies)
        self.on_job(self.sender_id, job_kind, slot, inner, bodies)


class DataOut(_DataConn):
    """Our data link to one peer node; usable once the peer says DATA_READY."""

    kinds = frozenset({K_HANDSHAKE, K_DATA_READY, K_SEALED})

    def __init__(self, links: DataLinks, node_id: str, addr: tuple[str, int]) -> None:
        super().__init__()
        self.links = links
        self.node_id = node_id
        self.addr = addr
        self.ready = False
        self.created_ms = links.now_ms()
        keys = links.keyring.keys
        self.auth = auth.LinkAuth(keys, True, links.my_id()) if keys else None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        meta = self.links.handshake_meta()
        if self.auth is not None:
            meta.update(self.auth.hello())
        self.write(frames.encode(K_HANDSHAKE, meta))

    def drop_notice(self) -> str:
        return f"cluster data link to {self.node_id[:8]}: dropping it"

    def on_frame(self, kind: int, meta: dict[str, Any], bodies: list[bytes]) -> None:
        # The peer's frames stay tiny (HANDSHAKE, DATA_READY): the reader keeps its
        # handshake bounds for the whole life of the link.
        if self.ready:
            raise messages.BadMessage("a frame after DATA_READY")
        if check_proto(meta) != self.node_id:
            raise messages.BadMessage(f"data link answered by {str(meta.get('id'))[:8]}")
        if kind == K_HANDSHAKE:  # the answer with a secret, or a refusal
            if self.auth is None:
                raise auth.AuthError("it uses a cluster secret and we have none")
            if self.auth.done or "p" not in meta:
                raise auth.AuthError("its answer carries no proof")
            reply = self.auth.check_answer(self.node_id, meta)
            self.write(frames.encode(K_AUTH, reply))
            assert self.auth.sealer is not None and self.auth.opener is not None
            self.start_mac(self.auth.sealer, self.auth.opener)
        elif self.auth is None or self.auth.done:  # K_DATA_READY
            self.ready = True
            self.batch_jobs = meta.get("jb") == 1
        else:
            raise auth.AuthError("DATA_READY before the handshake")

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.links.lost(self)


class DataLinks:
    """Worker k's data links to every peer node (k > 0; worker 0 has the bus)."""

    def __init__(self, index: int, port: int, my_id: Callable[[], str],
                 now_ms: Callable[[], int], keyring: auth.Keyring | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.keyring = keyring if keyring is not None else auth.Keyring()
        self.tls = tls  # tls-cluster: dial over TLS
        self.index = index
        self.port = port
        self.my_id = my_id
        self.now_ms = now_ms
        self.addrs: dict[str, tuple[str, int]] = {}  # node ID -> (ip, client port)
        self.links: dict[str, DataOut] = {}
        self.retry_at_ms: dict[str, int] = {}
        self.backoff_ms: dict[str, int] = {}
        self.closing = False

    def handshake_meta(self) -> dict[str, Any]:
        return {"proto": BUS_PROTO, "id": self.my_id(), "port": self.port, "data": self.index}

    def usable(self, node_id: str) -> DataOut | None:
        """The ready data link to ``node_id``; else None after dialling it when due
        (the caller relays through worker 0 meanwhile)."""
        link = self.links.get(node_id)
        if link is not None:
            if not link.ready and self.now_ms() - link.created_ms > handshake_timeout_ms:
                auth.count("handshake_timeouts")
                link.close()  # the peer never finished: redial after the backoff
                self.lost(link)
            return link if link.ready and not link.closed else None
        if node_id in self.addrs and not self.closing \
                and self.now_ms() >= self.retry_at_ms.get(node_id, 0):
            self._dial(node_id, self.addrs[node_id])
        return None

    def on_view(self, view: dict[str, Any]) -> None:
        """Follow membership: links to forgotten or moved nodes are closed."""
        addrs = {}
        for node_id, ip, port, flags, *_ in view.get("nodes", []):
            if not any(f in flags for f in ("myself", "handshake", "noaddr")):
                addrs[node_id] = (ip, port)
        self.addrs = addrs
        for node_id, link in list(self.links.items()):
            if addrs.get(node_id) != link.addr:
                del self.links[node_id]
                link.close()

    def _dial(self, node_id: str, addr: tuple[str, int]) -> None:
        link = DataOut(self, node_id, addr)
        self.links[node_id] = link
        asyncio.get_running_loop().create_task(self._connect(link))

    async def _connect(self, link: DataOut) -> None:
        try:
            await dial(lambda: link, link.addr[0], link.addr[1], self.tls)
        except (OSError, TimeoutError):
            self.lost(link)

    def lost(self, link: DataOut) -> None:
        if self.links.get(link.node_id) is link:
            del self.links[link.node_id]
        backoff = next_backoff_ms(self.backoff_ms.get(link.node_id), data_backoff_ms_min,
                                  data_backoff_ms_max)
        if link.ready:
            backoff = data_backoff_ms_min  # it worked: redial soon
        self.backoff_ms[link.node_id] = backoff
        self.retry_at_ms[link.node_id] = self.now_ms() + backoff

    def drop_links_of_removed_keys(self, extra: list[Any]) -> int:
        """Close our data links (and ``extra``, those handed to us) whose session came
        from a key no longer in the secret file."""
        return close_links_of_removed_keys(self.keyring, [*self.links.values(), *extra])

    def close(self) -> None:
        self.closing = True
        for link in list(self.links.values()):
            link.close()
        self.links.clear()
