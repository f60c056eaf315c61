"""Another local user cannot take a dead worker's place: while worker 1 is down
(killed, restarting), a process of uid ``nobody`` tries to bind the names worker 1
listened on (as /proc/net/unix shows them to anyone) and waits for worker 0 to
connect or hand it a socket. It must get nothing, and the node must recover."""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.bus.other_user import fork_as_user, needs_root_and_nobody, uid_of
from tests.nodeproc import NodeProc, unique_queue
from workers.ids import owner_of_queue

pytestmark = pytest.mark.integration

squat_s = 6.0  # how long the squatter tries to bind and waits for worker 0


def listed_names(mark: str) -> list[str]:
    """The local socket names that end with ``mark`` (abstract ones with their NUL)."""
    out = []
    for line in Path("/proc/net/unix").read_text().splitlines():
        name = line.split()[-1]
        if name.endswith(mark):
            out.append("\0" + name[1:] if name.startswith("@") else name)
    return out


def squat(names: dict[str, int], deadline: float) -> dict[str, object]:
    """Bind every name we can (stream: listen and accept; datagram: receive) until
    ``deadline``; what came to us."""
    held: list[socket.socket] = []
    got = {"bound": [], "accepted": 0, "datagrams": 0, "errors": []}
    pending = dict(names)
    while time.monotonic() < deadline:
        for name, kind in list(pending.items()):
            s = socket.socket(socket.AF_UNIX, kind)
            try:
                s.bind(name)
            except OSError as e:
                s.close()
                if e.errno != errno.EADDRINUSE:  # denied: nothing more to try
                    got["errors"].append(errno.errorcode.get(e.errno or 0, "?"))
                    del pending[name]
                continue
            del pending[name]
            got["bound"].append(name.lstrip("\0"))
            if kind == socket.SOCK_STREAM:
                s.listen(16)
            s.setblocking(False)
            held.append(s)
        ready, _, _ = select.select(held, [], [], 0.01)
        for s in ready:
            if s.type == socket.SOCK_STREAM:
                conn, _ = s.accept()
                got["accepted"] += 1
                conn.close()
            else:
                s.recvmsg(65536, 256)
                got["datagrams"] += 1
    return got


def run_squatter(uid: int, names: dict[str, int]) -> tuple[int, int]:
    """Fork the squatter as ``uid``; returns (pid, read end of its result pipe)."""
    return fork_as_user(uid, lambda: squat(names, time.monotonic() + squat_s))


def worker_pid(node: NodeProc, index: int) -> int:
    for pid in node.worker_pids():
        if Path(f"/proc/{pid}/comm").read_text().strip() == f"disque-mp W{index}":
            return pid
    raise AssertionError(f"worker {index} not found")


def queue_of_worker(index: int, workers: int) -> str:
    for _ in range(10_000):
        q = unique_queue()
        if owner_of_queue(q.encode(), workers) == index:
            return q
    raise AssertionError("no queue name found for that worker")


@needs_root_and_nobody
def test_another_uid_cannot_take_a_dead_workers_place(tmp_path: Path) -> None:
    with NodeProc(tmp_path, workers=2) as node:
        r = node.client(protocol=2)
        node_id = r.execute_command("CLUSTER", "MYID").decode()
        mark = f"{node.port}.{node_id[:16]}.1"
        names = {n: socket.SOCK_STREAM for n in listed_names(mark)}
        names.update({n: socket.SOCK_DGRAM for n in listed_names(mark + ".fd")})
        assert len(names) == 2, names
        q = queue_of_worker(1, 2)
        pid, result_fd = run_squatter(uid_of("nobody"), names)
        os.kill(worker_pid(node, 1), signal.SIGKILL)
        deadline = time.monotonic() + squat_s - 1
        while time.monotonic() < deadline:  # worker 0 forwards these to "worker 1"
            try:
                c = node.client(protocol=2, socket_timeout=1)
                c.execute_command("ADDJOB", q, "secret body", 0)
                c.close()
            except Exception:  # worker 1 is down: a clear error is fine
                pass
            time.sleep(0.05)
        with os.fdopen(result_fd, "rb") as f:
            data = f.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        got = json.loads(data)
        assert got["accepted"] == 0 and got["datagrams"] == 0, got
        assert got["bound"] == [], got
        # the node recovers: worker 1 is back and owns its queue again
        node.wait_for(lambda: _addjob_ok(node, q), 20, "worker 1 back")
        r.close()


def _addjob_ok(node: NodeProc, q: str) -> bool:
    try:
        c = node.client(protocol=2, socket_timeout=2)
        ok = c.execute_command("ADDJOB", q, "after", 0).startswith(b"D-")
        c.close()
        return ok
    except Exception:
        return False


def test_the_socket_directory_is_private_and_removed(tmp_path: Path) -> None:
    node = NodeProc(tmp_path, workers=2)
    with node:
        r = node.client(protocol=2)
        node_id = r.execute_command("CLUSTER", "MYID").decode()
        r.close()
        names = listed_names(f"{node.port}.{node_id[:16]}.0")
        assert names and all(n.startswith("/") for n in names), names  # no abstract names
        where = Path(names[0]).parent
        st = where.stat()
        assert st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o700
        assert node.stop() == 0
    assert not where.exists()
