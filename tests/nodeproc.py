"""Start real disque-mp node processes for tests: free ports, clean teardown.

    with NodeProc(tmp_path, workers=2) as node:
        r = node.client()           # redis-py 8, default handshake (HELLO 3)
        r.execute_command("ADDJOB", "q", "x", 0)

The node runs in its own process group (so teardown can SIGKILL every worker
even when the supervisor is gone); its stdout/stderr go to ``node.out`` in the
node's dir (a pipe nobody reads would block a chatty node), and ``output()``
shows that file plus the tail of the node's log file.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

REPO = Path(__file__).resolve().parent.parent
start_timeout_s = 20.0  # a cold start imports uvloop/hiredis in every worker
READY_LINE = b"Ready to accept connections"  # the supervisor's line once every worker accepts


def port_free(port: int) -> bool:
    """True when a plain listener (no SO_REUSEPORT) can take the port: nobody holds it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def proc_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/<pid>/stat after the command name) of every process:
    state, ppid, pgrp, ... (the name may hold spaces and parentheses)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        yield int(entry), fields


def unique_queue(prefix: str = "q") -> str:
    """A queue name no other test (or earlier run on the same node) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def queue_job_ids(r: redis.Redis, queue: str, walk_max: int = 10_000) -> set[str]:
    """Every job ID of ``queue`` the node of ``r`` holds (JSCAN QUEUE, bounded walk)."""
    ids: set[str] = set()
    cursor: Any = b"0"
    for _ in range(walk_max):
        cursor, items = r.execute_command("JSCAN", cursor, "COUNT", 1000, "QUEUE", queue)
        ids.update(i.decode() for i in items)
        if cursor == b"0":
            break
    return ids


def _any_task_alive(pid: str) -> bool:
    """A killed multi-threaded process shows its leader as a zombie while its other
    threads are still exiting and still hold its sockets: look at every thread."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return True
        except OSError:
            continue
    return False


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A client port whose bus port (port + 10000) is free too."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    # Both ports below the kernel's ephemeral range: an outgoing connection of
    # another test can take any port in that range between our check and bind.
    top = _ephemeral_low() - 10000
    for _ in range(1000):
        port = rng.randrange(10000, top)
        if port_free(port) and port_free(port + 10000):
            return port
    raise RuntimeError("no free port pair found")


def wait_until(cond: Callable[[], Any], timeout_s: float, what: str, *, poll_s: float = 0.05,
               detail: Callable[[], str] = lambda: "") -> None:
    """Poll ``cond()`` until true (never a timed assertion: the bound is generous);
    TimeoutError past ``timeout_s``, with ``detail()`` to say what was seen."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached in {timeout_s} s:\n{detail()}")
        time.sleep(poll_s)


def cluster_info(port: int) -> dict[str, str]:
    """CLUSTER INFO of the node on ``port`` as a dict."""
    r = redis.Redis(host="127.0.0.1", port=port, protocol=2, socket_timeout=20)
    try:
        text = r.execute_command("CLUSTER", "INFO").decode()
    finally:
        r.close()
    return dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)


def reachable_nodes(port: int) -> int:
    """How many other nodes the node on ``port`` sees healthy, -1 if it does not answer."""
    try:
        return int(cluster_info(port)["cluster_reachable_nodes"])
    except (redis.RedisError, OSError):
        return -1


def form_cluster(nodes: list[NodeProc], timeout_s: float) -> None:
    """CLUSTER MEET every node from the first, then poll until every node sees all
    the others reachable (no timed assertion: ``timeout_s`` is a generous bound)."""
    first = redis.Redis(host="127.0.0.1", port=nodes[0].port, protocol=2, socket_timeout=20)
    try:
        for n in nodes[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", n.port)
    finally:
        first.close()
    want = len(nodes) - 1
    wait_until(lambda: all(reachable_nodes(n.port) == want for n in nodes), timeout_s,
               f"every node seeing the {want} others reachable",
               detail=lambda: f"reachable: {[reachable_nodes(n.port) for n in nodes]}")


@contextlib.contextmanager
def running_cluster(nodes: list[NodeProc], form_timeout_s: float) -> Iterator[list[NodeProc]]:
    """Start ``nodes``, make them one cluster (``form_cluster``), stop every one of
    them on the way out (started or not)."""
    try:
        for n in nodes:
            n.start()
        form_cluster(nodes, form_timeout_s)
        yield nodes
    finally:
        for n in nodes:
            n.stop()


# How long a test cluster of cold nodes may take to form on 2 cores shared with other
# test runs (a generous bound, never a timed assertion).
cluster_form_timeout_s = 60.0


def terminate(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """SIGTERM ``proc`` if it still runs, wait up to ``timeout_s``; whether it has exited."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
    return True


@contextlib.contextmanager
def node_cluster(base: Path, count: int, *, workers: int, node_timeout_ms: int = 3000,
                 form_timeout_s: float = cluster_form_timeout_s) -> Iterator[list[NodeProc]]:
    """``count`` nodes in ``base/n0`` ... with ``cluster-node-timeout`` ``node_timeout_ms``,
    made one cluster and stopped on the way out (``running_cluster``)."""
    nodes = [NodeProc(base / f"n{i}", workers=workers,
                      conf={"cluster-node-timeout": node_timeout_ms}) for i in range(count)]
    with running_cluster(nodes, form_timeout_s):
        yield nodes


class NodeProc:
    def __init__(
        self,
        workdir: Path,
        *,
        workers: int = 2,
        port: int | None = None,
        conf: dict[str, Any] | None = None,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.workers = workers
        self.conf = dict(conf or {})
        self.extra_args = list(args or [])
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.conf_path = self.dir / "disque.conf"
        self.out_path = self.dir / "node.out"
        self.pgid: int | None = None  # survives the supervisor, for teardown
        self.log_offset = 0  # size of the log before this run started

    def write_conf(self) -> None:
        lines = [f"port {self.port}", "bind 127.0.0.1", f"dir {self.dir}", f"workers {self.workers}",
                 "logfile disque.log", "loglevel verbose"]
        lines += [f"{k} {v}" for k, v in self.conf.items()]
        self.conf_path.write_text("\n".join(lines) + "\n")

    def start(self, wait: bool = True) -> NodeProc:
        self.write_conf()
        path = self._log_path()  # only lines this run appends count for readiness
        self.log_offset = path.stat().st_size if path is not None and path.exists() else 0
        env = dict(os.environ)
        env.update(self.env or {})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        with open(self.out_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "disque_mp", str(self.conf_path), *self.extra_args],
                cwd=str(self.dir), env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        self.pgid = self.proc.pid
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout_s: float = start_timeout_s) -> None:
        """Until PING answers and the supervisor has logged that EVERY worker
        accepts (one worker answering PING is not a ready node)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"node exited with {self.proc.returncode}:\n{self.output()}")
            try:
                r = redis.Redis(port=self.port, protocol=2, socket_timeout=1)
                if r.ping() and self._supervisor_ready():
                    r.close()
                    return
                r.close()
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"node on port {self.port} not ready:\n{self.output()}")

    def _log_path(self) -> Path | None:
        """Where this run's supervisor logs its notices, None if we cannot tell."""
        if any(a in ("--logfile", "--loglevel") for a in self.extra_args):
            return None
        if str(self.conf.get("loglevel", "verbose")).lower() == "warning":
            return None  # the ready line is a notice
        name = str(self.conf.get("logfile", "disque.log"))
        return self.out_path if name in ("", '""', "''") else self.dir / name

    def _supervisor_ready(self) -> bool:
        path = self._log_path()
        if path is None:
            return True
        try:
            with open(path, "rb") as f:
                f.seek(self.log_offset)
                return READY_LINE in f.read()
        except FileNotFoundError:
            return False

    def output(self) -> str:
        """What the node printed (stdout/stderr) and the tail of its log file."""
        parts = []
        for path in (self.out_path, self.dir / "disque.log"):
            if path.exists():
                parts.append(path.read_text(errors="replace")[-6000:])
        return "\n".join(parts)

    def log_text(self) -> str:
        log = self.dir / "disque.log"
        return log.read_text(errors="replace") if log.exists() else ""

    def wait_exit(self, timeout_s: float = 15.0) -> int:
        """The supervisor's exit code (raises subprocess.TimeoutExpired)."""
        assert self.proc is not None
        return self.proc.wait(timeout=timeout_s)

    def group_pids(self) -> list[int]:
        """Live processes of this node's process group (supervisor and workers)."""
        if self.pgid is None:
            return []
        # fields[2] = pgrp; zombies hold no ports
        return [pid for pid, fields in proc_stats()
                if int(fields[2]) == self.pgid and _any_task_alive(str(pid))]

    def worker_pids(self) -> list[int]:
        """Live workers: the group minus the supervisor."""
        sup = self.proc.pid if self.proc is not None else -1
        return [p for p in self.group_pids() if p != sup]

    def wait_for(self, cond: Any, timeout_s: float = 15.0, what: str = "condition") -> None:
        """``wait_until`` with this node's output in the error."""
        wait_until(cond, timeout_s, what, detail=self.output)

    def client(self, **kw: Any) -> redis.Redis:
        kw.setdefault("socket_timeout", 10)
        return redis.Redis(host="127.0.0.1", port=self.port, **kw)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill_group(self) -> None:
        """SIGKILL the supervisor and every worker (test teardown)."""
        if self.proc is None or self.pgid is None:
            return
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 15.0) -> int:
        if self.proc is None:
            return 0
        if not terminate(self.proc, timeout_s):
            self.kill_group()
        rc = self.proc.returncode
        try:  # workers must be gone too
            os.killpg(self.pgid or self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return rc

    def restart(self, wait: bool = True) -> NodeProc:
        """Stop (SIGTERM) and start again on the same port and dir."""
        self.stop()
        return self.start(wait=wait)

    def __enter__(self) -> NodeProc:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
