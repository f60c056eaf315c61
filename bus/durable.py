"""Durable small-file writes shared by the bus (``nodes.conf``) and the node
(``CONFIG REWRITE``, the pid file, AOF renames): a crash leaves either the old
file or the new one, never a torn mix."""

from __future__ import annotations

import os


def fsync_dir(directory: str) -> None:
    """Make a rename (or a new file) in ``directory`` survive a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to a temp file beside ``path``, fsync it, rename it over
    ``path``, fsync the directory."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))
