"""Local sockets: a private directory, and our own user only at both ends.

The mesh, the connection handoff, the cluster agent's socket and the data-link
descriptor passing are Unix sockets in one directory per node run, made by the
supervisor with a random name and mode 0700 (``make_socket_dir``): no other
local user can bind a name there, so none can take a dead worker's place, and
none can squat the names before start-up. On top of that, stream sockets check
the peer with SO_PEERCRED on both sides (``same_user`` when it connects,
``sibling`` on the connecting side: our uid and a worker of our supervisor);
datagram sockets (descriptor passing) turn on SO_PASSCRED and check the
SCM_CREDENTIALS the kernel attaches to each message.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import shutil
import socket
import stat
import struct
import tempfile
from typing import Any

_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
CRED_SPACE = socket.CMSG_SPACE(_CRED.size)  # ancillary room for SCM_CREDENTIALS

# The supervisor exports its socket directory to the workers it forks under this name.
SOCKET_DIR_ENV = "DISQUE_MP_SOCKET_DIR"
# sun_path holds 108 bytes: a temporary directory deeper than this falls back to /tmp
socket_dir_path_bytes_max = 60


def make_socket_dir() -> str:
    """A fresh private directory for this process's (and its children's) local
    sockets: random name, mode 0700, ours. Exported in the environment."""
    base = tempfile.gettempdir()
    if len(base.encode()) > socket_dir_path_bytes_max - 20:
        base = "/tmp"
    _sweep(base)
    path = tempfile.mkdtemp(prefix=f"disque-mp-{os.getpid()}-", dir=base)
    os.environ[SOCKET_DIR_ENV] = path
    return path


def _sweep(base: str) -> None:
    """Remove the socket directories of our uid left by processes that are gone (a
    supervisor killed with SIGKILL cannot remove its own)."""
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    for entry in entries:
        pid_text = entry.name.split("-")[2] if entry.name.startswith("disque-mp-") else ""
        if not pid_text.isdigit():
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            remove_socket_dir(entry.path)  # its process is gone
        except OSError:
            continue  # alive (EPERM: another user's process), or the entry vanished


def remove_socket_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def socket_dir() -> str:
    """The directory of the local sockets, checked private (a directory, ours, no
    access for group or others); made on first use outside a supervised node."""
    path = os.environ.get(SOCKET_DIR_ENV, "")
    if not path:
        path = make_socket_dir()
        atexit.register(remove_socket_dir, path)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"the local socket directory {path} is not private to uid "
                              f"{os.getuid()} (a directory of ours with mode 0700)")
    return path


def local_name(port: int, node_id: str, last: str) -> str:
    """The path of one of the node's local sockets (``last``: ``"1"``, ``"1.fd"``, ...)."""
    return os.path.join(socket_dir(), f"{port}.{node_id[:16]}.{last}")


def bind_local(sock: socket.socket, path: str) -> None:
    """Bind to a path of the private directory. A stale name (a dead worker's: nothing
    answers on it) is removed first; a live one is an error, as in the abstract
    namespace."""
    try:
        sock.bind(path)
        return
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
        with socket.socket(socket.AF_UNIX, sock.type) as probe:
            try:
                probe.connect(path)
            except ConnectionRefusedError:
                pass  # stale
            else:
                raise
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock.bind(path)


def peer_uid(sock: Any) -> int:
    """The uid of the process at the other end of a connected Unix stream socket; -1
    when it cannot be told."""
    return _peer(sock)[1]


def _peer(sock: Any) -> tuple[int, int]:
    if sock is None:
        return -1, -1
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    except OSError:
        return -1, -1
    pid, uid, _gid = _CRED.unpack(raw)
    return int(pid), int(uid)


def same_user(sock: Any) -> bool:
    """True when the process at the other end of a Unix socket runs as our user."""
    return peer_uid(sock) == os.getuid()


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read()
    except OSError:
        return -1
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses
    return int(stat_line[stat_line.rindex(b")") + 2:].split()[1])


def sibling(sock: Any) -> bool:
    """Connecting side: the listener is our user and this process or another child
    of our parent (another worker of our supervisor)."""
    pid, uid = _peer(sock)
    if uid != os.getuid() or pid <= 0:
        return False
    return pid == os.getpid() or _parent_of(pid) == os.getppid()


def pass_credentials(sock: socket.socket) -> None:
    """Datagram receivers: have the kernel attach the sender's credentials."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)


def sender_uid(ancdata: list[tuple[int, int, bytes]]) -> int:
    """The uid in a message's SCM_CREDENTIALS (-1 when absent)."""
    for level, kind, raw in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return int(_CRED.unpack(raw[: _CRED.size])[1])
    return -1
