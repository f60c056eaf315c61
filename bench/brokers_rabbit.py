"""A throwaway RabbitMQ node (Debian's ``rabbitmq-server``) on free loopback ports.

    with RabbitServer(workdir) as rabbit:
        url = rabbit.url            # amqp://guest:guest@127.0.0.1:<port>//

Everything the node writes stays in ``workdir``: its own HOME (Erlang cookie),
mnesia and log directories, an empty plugin list and no config file from /etc.
It runs its own ``epmd`` on a free port (ERL_EPMD_PORT), so stopping it never
touches another Erlang node's epmd: ``stop()`` SIGTERMs the node's process group,
SIGKILLs what is left, then asks that epmd to exit.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from bench.peers_servers import RABBITMQ_BIN
from tests.nodeproc import free_port

# rabbitmq-server's own start script, in the scripts folder of Debian's package
# (bench.peers_servers.RABBITMQ_BIN; the /usr/sbin one switches to the rabbitmq user)
server_script = str(RABBITMQ_BIN / "rabbitmq-server")
start_timeout_s = 90.0  # an Erlang VM boot on a loaded 2-core machine
stop_timeout_s = 30.0


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class RabbitServer:
    """One RabbitMQ node: AMQP on ``port``, distribution on ``dist_port``, epmd on
    ``epmd_port``, all free loopback ports."""

    def __init__(self, workdir: Path) -> None:
        self.dir = Path(workdir)
        self.port, self.dist_port, self.epmd_port = free_port(), free_port(), free_port()
        self.nodename = f"proof{self.port}@localhost"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def env(self) -> dict[str, str]:
        d = self.dir
        env = dict(os.environ)
        env.update(HOME=str(d), RABBITMQ_NODE_PORT=str(self.port),
                   RABBITMQ_DIST_PORT=str(self.dist_port), ERL_EPMD_PORT=str(self.epmd_port),
                   RABBITMQ_NODENAME=self.nodename, RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
                   RABBITMQ_MNESIA_BASE=str(d / "mnesia"), RABBITMQ_LOG_BASE=str(d / "log"),
                   RABBITMQ_ENABLED_PLUGINS_FILE=str(d / "enabled_plugins"),
                   RABBITMQ_CONF_ENV_FILE=str(d / "rabbitmq-env.conf"),
                   RABBITMQ_CONFIG_FILE=str(d / "rabbitmq"),
                   RABBITMQ_ADVANCED_CONFIG_FILE=str(d / "advanced.config"))
        return env

    def start(self) -> RabbitServer:
        if not os.path.exists(server_script) or shutil.which("epmd") is None:
            raise RuntimeError("rabbitmq-server is not installed (make sysdeps)")
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq-env.conf").write_text("")
        cookie = self.dir / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16))
        cookie.chmod(0o400)
        with open(self.dir / "server.out", "ab") as out:
            self.proc = subprocess.Popen([server_script], cwd=str(self.dir), env=self.env(),
                                         stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + start_timeout_s
        while not _listening(self.port):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                tail = (self.dir / "server.out").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"rabbitmq-server did not start on {self.port}:\n{tail}")
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=stop_timeout_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
            try:  # the VM's helpers (erl_child_setup, inet_gethost) are in the group too
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc = None
        # the node started this epmd (on its own port): nothing else uses it
        subprocess.run(["epmd", "-port", str(self.epmd_port), "-kill"], env=self.env(),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10,
                       check=False)

    def __enter__(self) -> RabbitServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
