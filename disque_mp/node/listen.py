"""Listening sockets: the client port, the worker ports, the TLS port and the HTTP
port all bind the same way."""

from __future__ import annotations

import socket


def listen_sockets(bind: str, port: int, backlog: int, shared: bool = True) -> list[socket.socket]:
    """One listening socket per bind address. ``shared``: with SO_REUSEPORT, each worker
    binding its own on the client port; not shared: a worker port, one process's alone,
    so a second node configured onto it fails to bind instead of taking half of its
    connections."""
    socks: list[socket.socket] = []
    for addr in bind.split() or ["0.0.0.0"]:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if shared:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((addr, port))
            sock.listen(backlog)
            sock.setblocking(False)
        except OSError:
            sock.close()
            for s in socks:
                s.close()
            raise
        socks.append(sock)
    return socks
