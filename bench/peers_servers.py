"""The servers of ``make bench-peers``: every peer a real server on free loopback ports.

Each context manager starts its servers in a temporary directory, yields their client
ports and stops them (and anything they spawned) on the way out:

- ``disque_mp_nodes``: disque-mp nodes (``tests/nodeproc.py``), joined with CLUSTER
  MEET when more than one; ``node_tree`` picks the source tree they run from.
- ``reference_nodes``: the C reference Disque built from its source tarball
  (``bench.scaling.reference_binary``), joined the same way.
- ``redis_server``: redis-server, no persistence (lists and Streams).
- ``beanstalkd``: ``beanstalkd -l 127.0.0.1 -p PORT``.
- ``rabbitmq``: RabbitMQ nodes, each with its own node name, ports, data and log
  directories, a private Erlang cookie and a private epmd port (killed after); the
  second and third join the first with ``rabbitmqctl join_cluster``.
- ``nats``: nats-server with JetStream, a cluster of routes on loopback when more than one.

Data directories go under ``/dev/shm`` when it exists: every peer keeps its data in
memory, as Disque does (RabbitMQ's and NATS's fsyncs then cost no disk).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import redis

from tests.nodeproc import NodeProc, free_port, port_free

start_timeout_s = 120.0  # a RabbitMQ node boots in 5-20 s on 2 loaded cores
stop_timeout_s = 30.0
cluster_timeout_s = 60.0  # nodes seeing each other after MEET / join_cluster
# Where Debian's rabbitmq-server package (installed by `make sysdeps`) puts the broker's
# own start and control scripts: these run as the calling user, where the wrappers on
# PATH switch to the package's rabbitmq account. A system path, not a file of this repo.
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
# Erlang schedulers spin while idle by default: on a shared 2-core machine an idle
# broker would take CPU from whichever peer is being measured.
ERL_ARGS = "+sbwt none +sbwtdcpu none +sbwtdio none"


def scratch_root() -> Path:
    """Where the peers keep their data while measured: Linux's RAM-backed shared-memory
    mount (a tmpfs every Debian system has, not a path of this repo) where writable,
    so no peer waits on the disk; else the temp dir."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def wait_tcp(port: int, proc: subprocess.Popen[bytes] | None, what: str,
             timeout_s: float = start_timeout_s) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not listening on {port} in {timeout_s} s") from None
            time.sleep(0.1)


def stop_proc(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=stop_timeout_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                env=env, stdin=subprocess.DEVNULL, start_new_session=True)


def hello_nodes(port: int) -> int:
    """How many nodes HELLO lists on the Disque node at ``port`` (-1: no answer)."""
    try:
        r = redis.Redis(host="127.0.0.1", port=port, protocol=2, socket_timeout=5)
        try:
            return len(r.execute_command("HELLO")) - 2
        finally:
            r.close()
    except (redis.RedisError, OSError):
        return -1


def meet_all(ports: list[int]) -> None:
    """CLUSTER MEET every node from the first; wait until each one's HELLO lists all."""
    r = redis.Redis(host="127.0.0.1", port=ports[0], protocol=2, socket_timeout=20)
    try:
        for p in ports[1:]:
            r.execute_command("CLUSTER", "MEET", "127.0.0.1", p)
    finally:
        r.close()
    deadline = time.monotonic() + cluster_timeout_s
    while not all(hello_nodes(p) == len(ports) for p in ports):
        if time.monotonic() > deadline:
            raise RuntimeError(f"Disque nodes {ports} did not see each other: "
                               f"{[hello_nodes(p) for p in ports]}")
        time.sleep(0.2)


class TreeNode(NodeProc):
    """A NodeProc whose node runs the sources of ``tree`` (default: this repository)."""

    def __init__(self, workdir: Path, tree: Path | None, **kw: object) -> None:
        super().__init__(workdir, **kw)  # type: ignore[arg-type]
        self.tree = tree

    def start(self, wait: bool = True) -> TreeNode:
        if self.tree is None:
            super().start(wait)
            return self
        self.write_conf()
        env = dict(os.environ, PYTHONPATH=str(self.tree))
        with open(self.out_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "disque_mp", str(self.conf_path)], cwd=str(self.dir),
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        self.pgid = self.proc.pid
        if wait:
            self.wait_ready()
        return self


@contextmanager
def disque_mp_nodes(workdir: Path, count: int, workers: int,
                    tree: Path | None = None) -> Iterator[list[int]]:
    nodes: list[TreeNode] = []
    try:
        for i in range(count):
            node = TreeNode(workdir / f"disque-mp-{i}", tree, workers=workers,
                            conf={"loglevel": "warning", "maxmemory": "4gb"}).start()
            nodes.append(node)
            node.wait_for(lambda n=node: len(n.worker_pids()) >= workers, start_timeout_s,
                          "every worker started")
        ports = [n.port for n in nodes]
        if count > 1:
            meet_all(ports)
        yield ports
    finally:
        for n in nodes:
            n.stop()


@contextmanager
def reference_nodes(binary: Path, workdir: Path, count: int) -> Iterator[list[int]]:
    from bench.scaling import reference_server

    with ExitStack() as stack:
        ports = [stack.enter_context(reference_server(binary, workdir / f"ref-{i}"))[0]
                 for i in range(count)]
        if count > 1:
            meet_all(ports)
        yield ports


@contextmanager
def redis_server(workdir: Path) -> Iterator[list[int]]:
    from bench.redisq import RedisServer

    with RedisServer(workdir / "redis", free_port()) as server:
        yield [server.port]


@contextmanager
def beanstalkd(workdir: Path) -> Iterator[list[int]]:
    if shutil.which("beanstalkd") is None:
        raise RuntimeError("beanstalkd is not installed (make bench-peers installs it)")
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    proc = spawn(["beanstalkd", "-l", "127.0.0.1", "-p", str(port)], workdir / "beanstalkd.log")
    try:
        wait_tcp(port, proc, "beanstalkd")
        yield [port]
    finally:
        stop_proc(proc)


def listening_inodes(ports: set[int]) -> set[str]:
    """Socket inodes of the loopback listeners on ``ports`` (/proc/net/tcp, state 0A)."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) in ports:
                out.add(f"socket:[{f[9]}]")
    return out


def server_pids(ports: list[int]) -> list[int]:
    """The processes of the servers listening on ``ports``: each listener's holder and,
    where it runs in a process group of its own, that whole group (a node's supervisor
    and workers, a broker's helper processes), so a run can read their CPU from /proc."""
    from tests.nodeproc import proc_stats

    inodes = listening_inodes(set(ports))
    holders = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            links = {os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")}
        except OSError:
            continue  # gone, or not ours to read
        if links & inodes:
            holders.add(int(entry))
    groups = {os.getpgid(p) for p in holders} - {os.getpgrp()}
    return sorted(holders | {pid for pid, f in proc_stats() if int(f[2]) in groups})


def free_port_plain() -> int:
    """A free port (not paired with a bus port like free_port's)."""
    for _ in range(1000):
        p = free_port()
        if port_free(p):
            return p
    raise RuntimeError("no free port")


class Rabbit:
    """One RabbitMQ node of a private group (shared cookie, HOME and epmd port)."""

    def __init__(self, root: Path, index: int, epmd_port: int) -> None:
        self.name = f"peers{os.getpid()}r{index}@localhost"
        self.port, self.dist_port = free_port_plain(), free_port_plain()
        self.dir = root / f"rabbit-{index}"
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "plugins").write_text("[].\n")
        self.env = dict(os.environ, HOME=str(root / "home"), ERL_EPMD_PORT=str(epmd_port),
                        RABBITMQ_NODENAME=self.name, RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
                        RABBITMQ_NODE_PORT=str(self.port), RABBITMQ_DIST_PORT=str(self.dist_port),
                        RABBITMQ_MNESIA_BASE=str(self.dir / "mnesia"),
                        RABBITMQ_LOG_BASE=str(self.dir / "log"),
                        RABBITMQ_ENABLED_PLUGINS_FILE=str(self.dir / "plugins"),
                        RABBITMQ_CONFIG_FILE=str(self.dir / "rabbitmq"),
                        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=ERL_ARGS)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Spawn the node; ``wait_tcp(self.port, ...)`` tells when it listens."""
        self.proc = spawn([str(RABBITMQ_BIN / "rabbitmq-server")], self.dir / "server.out",
                          env=self.env, cwd=self.dir)

    def ctl(self, *args: str) -> str:
        out = subprocess.run([str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.name, *args],
                             env=self.env, capture_output=True, text=True,
                             timeout=start_timeout_s)
        if out.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {out.stderr[-500:]}")
        return out.stdout

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            self.ctl("stop")
        except (RuntimeError, subprocess.SubprocessError):
            pass  # the kill below still ends it
        stop_proc(self.proc)


@contextmanager
def rabbitmq(workdir: Path, count: int) -> Iterator[list[int]]:
    if not (RABBITMQ_BIN / "rabbitmq-server").exists():
        raise RuntimeError("rabbitmq-server is not installed (make bench-peers installs it)")
    root = workdir / "rabbitmq"
    (root / "home").mkdir(parents=True, exist_ok=True)
    cookie = root / "home" / ".erlang.cookie"
    cookie.write_text(f"PEERS{os.getpid()}{time.monotonic_ns()}")
    cookie.chmod(0o400)
    epmd_port = free_port_plain()
    nodes = [Rabbit(root, i, epmd_port) for i in range(count)]
    try:
        for n in nodes:  # booted side by side: each takes 5-40 s
            n.start()
        for n in nodes:
            wait_tcp(n.port, n.proc, f"rabbitmq {n.name}")
        for n in nodes[1:]:
            n.ctl("stop_app")
            n.ctl("join_cluster", nodes[0].name)
            n.ctl("start_app")
            wait_tcp(n.port, n.proc, f"rabbitmq {n.name} after join")
        yield [n.port for n in nodes]
    finally:
        for n in reversed(nodes):
            n.stop()
        subprocess.run(["epmd", "-port", str(epmd_port), "-kill"], capture_output=True,
                       timeout=stop_timeout_s, env=dict(os.environ, ERL_EPMD_PORT=str(epmd_port)))


@contextmanager
def nats(workdir: Path, count: int) -> Iterator[list[int]]:
    if shutil.which("nats-server") is None:
        raise RuntimeError("nats-server is not installed (make bench-peers installs it)")
    ports = [free_port_plain() for _ in range(count)]
    routes = [free_port_plain() for _ in range(count)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(count):
            d = workdir / f"nats-{i}"
            d.mkdir(parents=True, exist_ok=True)
            cmd = ["nats-server", "-a", "127.0.0.1", "-p", str(ports[i]), "-js", "-sd", str(d),
                   "-n", f"peers-n{i}"]
            if count > 1:
                cmd += ["--cluster_name", "peers", "--cluster", f"nats://127.0.0.1:{routes[i]}",
                        "--routes", ",".join(f"nats://127.0.0.1:{r}" for r in routes)]
            procs.append(spawn(cmd, d / "nats.log"))
        for p, proc in zip(ports, procs, strict=True):
            wait_tcp(p, proc, "nats-server")
        yield ports
    finally:
        for proc in procs:
            stop_proc(proc)
