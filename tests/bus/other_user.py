"""Running test code as another user: a forked child that drops to a uid (no
supplementary groups) and hands its result back as JSON over a pipe. Needs root."""

from __future__ import annotations

import json
import os
import pwd
import traceback
from collections.abc import Callable
from typing import Any

import pytest


def uid_of(name: str) -> int:
    """The uid of the user ``name``, -1 when there is none."""
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return -1


# The tests that run a helper as the user nobody: only as root, and with such a user.
needs_root_and_nobody = pytest.mark.skipif(
    os.getuid() != 0 or uid_of("nobody") < 0,
    reason="needs root to run a helper process as the user nobody")


def fork_as_user(uid: int, fn: Callable[[], Any]) -> tuple[int, int]:
    """Fork a child that switches to ``uid``, runs ``fn`` and writes its result as JSON
    to a pipe; returns (the child's pid, the pipe's read end). The child never returns
    into pytest: it exits 0 after writing, 1 with the traceback on its stderr."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.write(write_fd, json.dumps(fn()).encode())
            code = 0
        except BaseException:
            traceback.print_exc()  # shown by pytest as the child's stderr
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd
