"""A real disque-mp node inside a network namespace of a ``Net``.

    node = FaultNode(net, 0, workdir, conf={"cluster-node-timeout": 2500})
    node.start()                        # `ip netns exec <ns> python -m disque_mp disque.conf`
    node.client()                       # redis-py, from the root namespace over the bridge
    node.kill9(); node.start()          # crash and restart (same dir: nodes.conf, AOF)
    node.pause(); node.resume()         # SIGSTOP / SIGCONT of the supervisor and workers
    node.kill_worker(rng)               # SIGKILL one worker; the supervisor restarts it

The node runs in its own process group (``ip netns exec`` execs the command,
so the group leader is the supervisor itself). Every node listens on the same
port, each on its own address: namespaces have their own ports and their own
abstract Unix sockets, so nothing is shared between nodes.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.faults.netns import Net
from tests.nodeproc import proc_stats, terminate

REPO = Path(__file__).resolve().parent.parent.parent
node_port = 7711
start_timeout_s = 60.0  # cold start of a node on a loaded 2-core host
stop_timeout_s = 15.0
ready_line = b"Ready to accept connections"


class FaultNode:
    def __init__(self, net: Net, index: int, workdir: Path, *, workers: int = 2,
                 conf: dict[str, Any] | None = None) -> None:
        self.net = net
        self.index = index
        self.ip = net.ip(index)
        self.port = node_port
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.workers = workers
        self.conf = dict(conf or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / "disque.log"
        self.out_path = self.dir / "node.out"
        self.log_offset = 0
        self.starts = 0

    @property
    def name(self) -> str:
        return f"n{self.index}"

    def write_conf(self) -> Path:
        lines = [f"port {self.port}", f"bind {self.ip}", f"dir {self.dir}",
                 f"workers {self.workers}", "logfile disque.log", "loglevel verbose",
                 # the clients come through the bridge, not loopback, and the test
                 # network is ours: no password, so protected mode would refuse them
                 "protected-mode no"]
        lines += [f"{k} {v}" for k, v in self.conf.items()]
        path = self.dir / "disque.conf"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self, wait: bool = True) -> None:
        conf = self.write_conf()
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        with open(self.out_path, "ab") as out:
            self.proc = subprocess.Popen(
                [*self.net.exec_prefix(self.index), sys.executable, "-m", "disque_mp", str(conf)],
                cwd=str(self.dir), env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1
        if wait:
            self.wait_ready()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout_s: float = start_timeout_s) -> None:
        """PING answers over the bridge and the supervisor logged that every worker accepts."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n"
                                   f"{self.output()}")
            if self._log_since_start().find(ready_line) >= 0:
                try:
                    r = self.client(socket_timeout=2, socket_connect_timeout=2)
                    try:
                        if r.ping():
                            return
                    finally:
                        r.close()
                except (redis.RedisError, OSError):
                    pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready in {timeout_s} s:\n{self.output()}")

    def _log_since_start(self) -> bytes:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                return f.read()
        except FileNotFoundError:
            return b""

    def client(self, **kw: Any) -> redis.Redis:
        """redis-py without its own retries (redis-py 8 re-sends a command up to 10
        times after a timeout or a lost connection): a history must hold each
        invocation once, an ADDJOB sent twice is two jobs with one value."""
        kw.setdefault("retry", Retry(NoBackoff(), 0))
        kw.setdefault("socket_timeout", 10)
        kw.setdefault("socket_connect_timeout", 5)
        kw.setdefault("protocol", 2)
        return redis.Redis(host=self.ip, port=self.port, **kw)

    # -- faults ---------------------------------------------------------------

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill9(self) -> None:
        """SIGKILL the supervisor and every worker at once, as a power cut of the process."""
        self._signal_group(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=stop_timeout_s)

    def pause(self) -> None:
        self._signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_group(signal.SIGCONT)

    def worker_pids(self) -> list[int]:
        """The supervisor's live children (its workers)."""
        if self.proc is None:
            return []
        sup = self.proc.pid
        # fields[0] = state, fields[1] = ppid
        return sorted(pid for pid, fields in proc_stats() if int(fields[1]) == sup and fields[0] != "Z")

    def kill_worker(self, rng: random.Random) -> int | None:
        """SIGKILL one worker chosen by ``rng``; its pid, None if none was found."""
        pids = self.worker_pids()
        if not pids:
            return None
        pid = rng.choice(pids)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return pid

    def stop(self) -> None:
        """SIGTERM (SIGCONT first in case it is paused), SIGKILL past the bound."""
        if self.proc is None:
            return
        self.resume()
        terminate(self.proc, stop_timeout_s)
        self._signal_group(signal.SIGKILL)
        try:
            self.proc.wait(timeout=stop_timeout_s)
        except subprocess.TimeoutExpired:
            pass

    # -- what it left ---------------------------------------------------------

    def log_text(self) -> str:
        parts = []
        for path in (self.log_path, self.out_path):
            if path.exists():
                parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)

    def output(self, tail_chars: int = 6000) -> str:
        return self.log_text()[-tail_chars:]
