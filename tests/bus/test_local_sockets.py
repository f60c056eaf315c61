"""The node's local sockets (mesh, connection handoff, cluster agent) refuse a
process of another uid, which cannot even reach their private directory; our own
uid still gets in (the positive control)."""

from __future__ import annotations

import array
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from bus import frames
from bus.mesh import K_SCATTER
from tests.bus.other_user import fork_as_user, needs_root_and_nobody, uid_of
from tests.nodeproc import NodeProc, unique_queue

pytestmark = pytest.mark.integration


def listed_prefix(port: int, node_id: str) -> str:
    """The common prefix of the node's local socket names, as any local user reads it
    in /proc/net/unix (an abstract name's leading NUL shows as "@")."""
    mark = f"{port}.{node_id[:16]}."
    for line in Path("/proc/net/unix").read_text().splitlines():
        name = line.split()[-1]
        if mark in name:
            name = "\0" + name[1:] if name.startswith("@") else name
            return name[: name.index(mark) + len(mark) - 1]
    raise AssertionError(f"no local socket of the node listed ({mark})")


def intrude(prefix: str, flush_frame: bytes) -> dict[str, str]:
    """What another user's process gets from each local socket (run in a forked child)."""

    def stream(name: str, payload: bytes) -> str:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect(prefix + name)
            s.sendall(payload)
            return "answered" if s.recv(4096) else "closed"
        except PermissionError:
            return "denied"  # the private socket directory
        except (ConnectionResetError, BrokenPipeError):
            return "closed"
        except TimeoutError:
            return "open"
        finally:
            s.close()

    out = {"mesh": stream(".0", flush_frame), "agent": stream(".cluster", flush_frame)}
    mine, theirs = socket.socketpair()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as d:
        try:
            d.sendmsg([json.dumps({"authed": True}).encode()],
                      [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [theirs.fileno()]))],
                      0, prefix + ".1.fd")
        except PermissionError:
            out["handoff"] = "denied"
    theirs.close()
    if "handoff" in out:
        return out
    mine.settimeout(3)
    try:
        mine.sendall(b"PING\r\n")
        out["handoff"] = "answered" if mine.recv(100) else "closed"
    except (BrokenPipeError, ConnectionResetError):
        out["handoff"] = "closed"  # the node closed the only other copy at once
    except TimeoutError:
        out["handoff"] = "ignored"
    return out


def as_user(uid: int, fn: Callable[[], dict[str, str]]) -> dict[str, str]:
    """Run ``fn`` in a forked child switched to ``uid``; its result comes back as JSON."""
    pid, read_fd = fork_as_user(uid, fn)
    with os.fdopen(read_fd, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    result: dict[str, str] = json.loads(data)
    return result


@needs_root_and_nobody
def test_another_uid_is_refused_on_mesh_handoff_and_agent(tmp_path: Path) -> None:
    with NodeProc(tmp_path, workers=2) as node:
        r = node.client(protocol=2)
        node_id = r.execute_command("CLUSTER", "MYID").decode()
        q = unique_queue()
        r.execute_command("ADDJOB", q, "keep me", 0)
        prefix = listed_prefix(node.port, node_id)
        flush = frames.encode(K_SCATTER, {"r": 1, "op": "flushall", "a": None})
        outcome = as_user(uid_of("nobody"), lambda: intrude(prefix, flush))
        assert outcome == {"mesh": "denied", "agent": "denied", "handoff": "denied"}, outcome
        assert r.execute_command("QLEN", q) == 1  # the flush never ran

        # our own uid: a handed-in socket is served
        mine, theirs = socket.socketpair()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as d:
            d.sendmsg([json.dumps({"authed": True}).encode()],
                      [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [theirs.fileno()]))],
                      0, prefix + ".1.fd")
        theirs.close()
        mine.settimeout(10)
        mine.sendall(b"PING\r\n")
        assert mine.recv(100) == b"+PONG\r\n"
        mine.close()
        assert "Traceback" not in node.log_text()
        r.close()
