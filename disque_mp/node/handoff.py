"""Moving a client connection to the worker that owns its traffic, and adopting one.

The kernel gives a new connection to any worker (SO_REUSEPORT); a connection
whose commands keep going to one other worker (the router counts the streak) is
handed to that worker once nothing is buffered or pending on it: forwarding
costs about a third of the throughput (measured with a throwaway sketch before
the node was built), moving the socket nothing. The descriptor travels with
SCM_RIGHTS and the connection's state (RESP3, AUTH, name, ID) in the same
datagram (``SocketPass`` in ``bus/sockpass.py``); the receiver ``adopt``s it.
A TLS connection stays where it is (its session lives in this process), and so
does one that keeps changing owner.
"""

from __future__ import annotations

import socket
from typing import Any

from bus.mesh import HANDOFF_PURPOSE, handoff_state_bytes_max
from bus.sockpass import SocketPass
from disque_mp.node.connection import ClientConn, ClientHost, Mover

handoff_streak_min = 16  # consecutive commands for one other worker before moving the socket
handoff_per_conn_max = 4  # a connection whose traffic keeps changing owner stays put after this


class Handoff(Mover):
    """Client connections leaving worker ``w`` for their owner, and arriving."""

    sockets: SocketPass  # created inside the running loop (``start``)

    def __init__(self, w: ClientHost) -> None:
        # ClientConn checks its streak against ``streak_min`` after each read
        super().__init__(handoff_streak_min if w.workers > 1 else 1 << 62)
        self.w = w

    def start(self) -> None:
        w = self.w
        self.sockets = SocketPass(w.cfg.port, w.node_id, w.index, HANDOFF_PURPOSE, self.adopt,
                                  handoff_state_bytes_max)

    def close(self) -> None:
        self.sockets.close()

    def consider(self, conn: ClientConn) -> None:
        """Hand ``conn`` to the worker its last ``streak_min`` commands went to,
        unless something still ties it here."""
        w = self.w
        owner = conn.streak_owner
        transport = conn.transport
        if (owner < 0 or owner == w.index or transport is None or conn.pending()
                or conn.waiters or conn.parser.buffered() or conn.handoffs >= handoff_per_conn_max
                or transport.get_write_buffer_size() or w.stopping):
            return
        sock = transport.get_extra_info("socket")
        if sock is None or transport.get_extra_info("sslcontext") is not None:
            conn.handoffs = handoff_per_conn_max  # TLS state lives here: forward, never hand off
            return
        if not self.sockets.give(owner, sock.fileno(), conn.state()):
            conn.streak = 0
            return
        self.handed_off += 1
        conn.gone = True
        w.conns.discard(conn)
        transport.pause_reading()
        transport.close()  # closes our descriptor only: no FIN while the peer holds it

    def adopt(self, sock: socket.socket, state: dict[str, Any]) -> None:
        """A connection handed to us by another worker."""
        w = self.w
        if w.stopping:
            sock.close()
            return
        sock.setblocking(False)

        async def connect() -> None:
            try:
                await w.loop.connect_accepted_socket(lambda: ClientConn(w, state), sock=sock)
            except OSError:
                sock.close()

        w.loop.create_task(connect())
