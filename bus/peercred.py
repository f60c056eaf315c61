"""Local sockets accept our own user only.

The mesh, the connection handoff, the cluster agent's socket and the data-link
descriptor passing all live in the abstract Unix namespace, which has no file
permissions: any local user could connect. Stream sockets check the peer with
SO_PEERCRED when it connects; datagram sockets (descriptor passing) turn on
SO_PASSCRED and check the SCM_CREDENTIALS the kernel attaches to each message.
"""

from __future__ import annotations

import os
import socket
import struct
from typing import Any

_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
CRED_SPACE = socket.CMSG_SPACE(_CRED.size)  # ancillary room for SCM_CREDENTIALS


def peer_uid(sock: Any) -> int:
    """The uid of the process at the other end of a connected Unix stream socket; -1
    when it cannot be told."""
    if sock is None:
        return -1
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    except OSError:
        return -1
    return int(_CRED.unpack(raw)[1])


def same_user(sock: Any) -> bool:
    """True when the process at the other end of a Unix socket runs as our user."""
    return peer_uid(sock) == os.getuid()


def pass_credentials(sock: socket.socket) -> None:
    """Datagram receivers: have the kernel attach the sender's credentials."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)


def sender_uid(ancdata: list[tuple[int, int, bytes]]) -> int:
    """The uid in a message's SCM_CREDENTIALS (-1 when absent)."""
    for level, kind, raw in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return int(_CRED.unpack(raw[: _CRED.size])[1])
    return -1
