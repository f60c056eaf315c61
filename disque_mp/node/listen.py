"""Listening sockets: the client port, the worker ports, the TLS port and the HTTP
port all bind the same way; ``port_busy`` tells, before any worker binds, that
one of them is taken and by whom."""

from __future__ import annotations

import errno
import os
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


proc_scan_max = 65536  # processes looked at to name a port's holder (a host has far fewer)
proc_fds_max = 100_000  # descriptors looked at per process


def port_busy(bind: str, port: int) -> str:
    """"" when every ``bind`` address can take ``port``, else one line naming the port
    and who holds it. Probed without SO_REUSEPORT, so a listener of another node (ours
    bind with it) counts: the supervisor asks this before any worker starts."""
    for addr in bind.split() or ["0.0.0.0"]:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((addr, port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                return f"can't bind {addr}:{port}: {e.strerror}"
            return f"{addr}:{port} is already in use ({port_holder(port)})"
        finally:
            sock.close()
    return ""


def port_holder(port: int) -> str:
    """Who listens on TCP ``port``: "held by pid N (command line)" from /proc, or why
    it can't be told (a process of another user hides its descriptors)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return "held by a process this user can't see"
    for pid in _pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds[:proc_fds_max]:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return f"held by pid {pid}: {_command_line(pid)}"
    return "held by a process of another user"


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            # local address "HEX_IP:HEX_PORT", state 0A = LISTEN, inode in column 9
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rpartition(":")[2], 16) == port:
                inodes.add(cols[9])
    return inodes


def _pids() -> list[int]:
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit())[:proc_scan_max]


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read(4096).split(b"\0")
    except OSError:
        return "(gone)"
    text = " ".join(w.decode(errors="replace") for w in words if w)
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        comm = ""
    return f"{comm} ({text})" if comm and not text.startswith(comm) else text or comm
