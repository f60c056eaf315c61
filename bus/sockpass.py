"""Passing a socket to another worker of this host: SCM_RIGHTS over a datagram socket.

Two uses, each with its own datagram socket per worker (its own ``purpose``):

- the front end's connection handoff (``disque_mp/node/handoff.py``): a client
  connection moves to the worker its commands go to, with the connection's state
  (RESP version, auth, name, id); bound by ``bus.mesh.handoff_state_bytes_max``;
- the data links (``bus/datalink.py``): worker 0 passes a data link's socket to
  the worker it belongs to, with the sender's node ID and the link's MAC state;
  bound by ``bus.datalink.fdpass_state_bytes_max``.

A datagram carries one descriptor and a small JSON object (the state). The sockets
live in the node's private socket directory (mode 0700, ``bus/peercred.py``), so
no other user can bind a name a descriptor is given to; on top of that each
receiver has the kernel attach the sender's credentials (SO_PASSCRED) and takes a
descriptor from our own user only (``bus/peercred.py``). Every other datagram is
dropped and every descriptor it carried closed: one from another user (counted in
``cluster_bus_local_refused``), without a descriptor, with a state over the bound
(truncated) or that is not a JSON object; of several descriptors only the first
is kept.
"""

from __future__ import annotations

import array
import asyncio
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

import orjson

from bus import auth, peercred

log = logging.getLogger("disque_mp.sockpass")

OnSocket = Callable[[socket.socket, dict[str, Any]], None]

# Room for a few descriptors (the extras are closed) and the sender's credentials.
_ANCILLARY_BYTES = socket.CMSG_SPACE(4 * array.array("i").itemsize) + peercred.CRED_SPACE
# Received descriptors are close-on-exec, like every socket Python opens.
_RECV_FLAGS = getattr(socket, "MSG_CMSG_CLOEXEC", 0)


def socket_name(port: int, node_id: str, index: int, purpose: str) -> str:
    """The path of worker ``index``'s socket for ``purpose`` in the node's private
    socket directory, a template of the name's last part with ``{index}`` in it
    (``"{index}.fd"``)."""
    return peercred.local_name(port, node_id, purpose.format(index=index))


def _descriptors(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, raw in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(raw[: len(raw) - len(raw) % arr.itemsize])
            fds.extend(arr)
    return fds


class SocketPass:
    """Worker ``index``'s datagram socket for ``purpose``: ``give`` sends a descriptor
    to another worker's, ``on_socket(sock, state)`` receives the ones sent to us.
    Create it inside the running event loop."""

    def __init__(self, port: int, node_id: str, index: int, purpose: str,
                 on_socket: OnSocket, state_bytes_max: int) -> None:
        self.port = port
        self.node_id = node_id
        self.purpose = purpose
        self.on_socket = on_socket
        self.state_bytes_max = state_bytes_max
        self.name = socket_name(port, node_id, index, purpose)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            peercred.bind_local(self.sock, self.name)
            # the kernel then attaches the sender's pid/uid/gid to every datagram
            peercred.pass_credentials(self.sock)
            self.sock.setblocking(False)
            self.loop = asyncio.get_running_loop()
            self.loop.add_reader(self.sock.fileno(), self._receive)
        except BaseException:
            self.sock.close()
            raise

    def give(self, peer: int, fd: int, state: dict[str, Any]) -> bool:
        """Send ``fd`` with ``state`` to worker ``peer``; False if it could not go (state
        over the bound, or that worker is down or restarting): the caller keeps it."""
        data = orjson.dumps(state)
        if len(data) > self.state_bytes_max:
            return False
        try:
            self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                        array.array("i", [fd]))],
                              0, socket_name(self.port, self.node_id, peer, self.purpose))
        except OSError:
            return False
        return True

    def _receive(self) -> None:
        while True:
            try:
                data, ancdata, flags, _addr = self.sock.recvmsg(
                    self.state_bytes_max, _ANCILLARY_BYTES, _RECV_FLAGS)
            except (BlockingIOError, InterruptedError):
                return
            fds = _descriptors(ancdata)
            uid = peercred.sender_uid(ancdata)
            keep = fds[:1] if uid == os.getuid() else []
            if uid != os.getuid():
                auth.count("local_refused")
                log.warning("%s: refusing a datagram from uid %d", self._label(), uid)
            for fd in fds[len(keep):]:  # one descriptor per datagram, never leak extras
                socket.close(fd)
            if not keep:
                continue  # from another user, or no descriptor: nothing to adopt
            sock = socket.socket(fileno=keep[0])
            state = self._state(data, flags)
            if state is None:
                sock.close()
                log.warning("%s: dropping a descriptor with a bad state", self._label())
                continue
            self.on_socket(sock, state)

    def _state(self, data: bytes, flags: int) -> dict[str, Any] | None:
        if flags & socket.MSG_TRUNC:
            return None  # over state_bytes_max: the sender never sends that
        if not data:
            return {}
        try:
            state = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        return state if isinstance(state, dict) else None

    def _label(self) -> str:
        return f"socket passing {os.path.basename(self.name)}"

    def close(self) -> None:
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
