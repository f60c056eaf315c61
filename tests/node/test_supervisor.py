"""The supervisor with real processes: start, identity, signals, restarts, sd_notify.

Every test starts a real ``python -m disque_mp`` (tests/nodeproc.py) and talks
to it with redis-py over loopback. Waits are polls with generous bounds, never
timing assertions.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis

import disque_mp
from bus import nodes_conf
from disque_mp import cli
from disque_mp.node import sdnotify
from tests.nodeproc import REPO, NodeProc, free_port, port_free

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "disque_mp", *args], cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=60)


def node_id_in(path: Path) -> str:
    conf = nodes_conf.load(str(path / "nodes.conf"))
    assert conf is not None
    return conf.node_id


# --- command line and configuration errors (no workers needed) ---


def test_version_and_help() -> None:
    out = run_cli("--version")
    assert out.returncode == 0
    ours, protocol = out.stdout.splitlines()  # both versions, each named
    assert ours == f"disque-mp {disque_mp.__version__}"
    assert protocol.startswith("Disque protocol version 1.0-rc1 ")
    out = run_cli("--help")
    assert out.returncode == 0 and "Usage: disque-mp [CONFIG_FILE]" in out.stdout


def test_bad_option_is_a_usage_error() -> None:
    out = run_cli("--port")
    assert out.returncode == 2 and "option --port needs a value" in out.stderr


def test_bad_config_line_stops_startup_with_its_line(tmp_path: Path) -> None:
    conf = tmp_path / "disque.conf"
    conf.write_text("# test\nport 7711\nappendfsync sometimes\n")
    out = run_cli(str(conf), cwd=tmp_path)
    assert out.returncode == 1
    assert "*** FATAL CONFIG FILE ERROR ***" in out.stderr
    assert "Reading the configuration file, at line 3" in out.stderr
    assert ">>> 'appendfsync sometimes'" in out.stderr
    assert "argument must be 'no', 'always' or 'everysec'" in out.stderr


def test_bad_command_line_value_stops_startup(tmp_path: Path) -> None:
    out = run_cli("--workers", "none", cwd=tmp_path)
    assert out.returncode == 1
    assert ">>> '--workers none'" in out.stderr


def test_daemonize_yes_is_refused(tmp_path: Path) -> None:
    conf = tmp_path / "disque.conf"
    conf.write_text("daemonize yes\n")
    out = run_cli(str(conf), cwd=tmp_path)
    assert out.returncode == 1 and "systemd" in out.stderr


def test_test_config(tmp_path: Path) -> None:
    conf = tmp_path / "disque.conf"
    conf.write_text("port 7000\n")
    assert run_cli("--test-config", str(conf)).returncode == 0
    conf.write_text("port x\n")
    assert run_cli("--test-config", str(conf)).returncode == 1


def test_subcommands_dispatch(tmp_path: Path) -> None:
    out = run_cli("bench", "--help", cwd=tmp_path)  # bench/ comes from the source tree
    assert out.returncode == 0 and "disque-mp bench" in out.stdout
    out = run_cli("check-aof", cwd=tmp_path)
    assert out.returncode != 0 and "check-aof" in out.stdout + out.stderr


def test_missing_subcommand_module_is_a_clear_error(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(cli.SUBCOMMANDS, "check-aof", ("disque_mp.no_such_module", "main"))
    assert cli.main(["check-aof", "x.aof"]) == 2
    err = capsys.readouterr().err
    assert "'check-aof' subcommand is not in this installation" in err
    assert "disque_mp.no_such_module is missing" in err


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed: cannot verify the unit file")
    script = shutil.which("disque-mp", path=os.path.dirname(sys.executable))
    assert script is not None, "the disque-mp console script is not installed"
    unit = (REPO / "systemd" / "disque-mp.service").read_text()
    assert "Type=notify" in unit and "KillMode=mixed" in unit
    # verify checks that ExecStart exists: point it at this venv's script
    (tmp_path / "disque-mp.service").write_text(unit.replace("/opt/disque-mp/bin/disque-mp", script))
    out = subprocess.run([analyze, "verify", str(tmp_path / "disque-mp.service")],
                         capture_output=True, text=True, timeout=60)
    problems = [line for line in (out.stdout + out.stderr).splitlines()
                if "disque-mp.service" in line]
    assert out.returncode == 0 and not problems, out.stdout + out.stderr


def test_corrupt_nodes_conf_stops_startup(tmp_path: Path) -> None:
    (tmp_path / "nodes.conf").write_text("not a node line\n")
    node = NodeProc(tmp_path, workers=1)
    node.start(wait=False)
    assert node.wait_exit() == 1
    assert "corrupted cluster config file" in node.output()
    assert (tmp_path / "nodes.conf").read_text() == "not a node line\n"


# --- a running node ---


@pytest.mark.parametrize("workers", [1, 2])
def test_start_and_ping(tmp_path: Path, workers: int) -> None:
    with NodeProc(tmp_path, workers=workers, conf={"pidfile": "disque.pid"}) as node:
        assert node.client().ping() is True  # redis-py 8 handshake (HELLO 3)
        assert redis.Redis(port=node.port, protocol=2).ping() is True
        node.wait_for(lambda: len(node.worker_pids()) == workers, what="workers")
        assert (tmp_path / "disque.pid").read_text().strip() == str(node.proc.pid)  # type: ignore[union-attr]
        log = node.log_text()
        assert ":X " in log and "Ready to accept connections" in log
        # the binary's default is the reference's (no AOF), and the node says what it means
        assert "persistence: off: jobs are lost when the node stops" in log
        for i in range(workers):  # workers log through the same file, with their role
            assert f":W{i} " in log
        # Redis' line shape: pid:role dd Mon HH:MM:SS.mmm <mark> message
        line_re = re.compile(r"^\d+:(X|W\d+) \d\d [A-Z][a-z]{2} \d\d:\d\d:\d\d\.\d{3} [.\-*#] \S")
        lines = [line for line in log.splitlines() if line and not line.startswith((" ", "Traceback"))]
        assert lines and all(line_re.match(line) for line in lines), log
        assert node.stop() == 0
    assert not (tmp_path / "disque.pid").exists()


def test_command_line_overrides_the_file(tmp_path: Path) -> None:
    port = free_port()
    node = NodeProc(tmp_path, workers=2, args=["--port", str(port), "--workers", "1"])
    node.start(wait=False)  # the conf file names node.port and 2 workers; the options win
    file_port, node.port = node.port, port
    try:
        node.wait_ready()
        assert node.client().ping() is True
        node.wait_for(lambda: len(node.worker_pids()) == 1, what="one worker")
        assert port_free(file_port)
    finally:
        assert node.stop() == 0


def test_node_id_is_kept_across_restarts(tmp_path: Path) -> None:
    node = NodeProc(tmp_path, workers=2)
    with node:
        first = node_id_in(tmp_path)
        assert node.client().execute_command("CLUSTER", "MYID") in (first, first.encode())
    with node:  # same dir, same config
        assert node_id_in(tmp_path) == first
        assert node.client().execute_command("CLUSTER", "MYID") in (first, first.encode())


def exits_zero_leaving_no_process(node: NodeProc) -> None:
    """The supervisor exits 0 and no process of the node's group is left behind."""
    assert node.wait_exit() == 0
    node.wait_for(lambda: not node.group_pids(), what="all processes gone")


def test_sigterm_exits_zero(tmp_path: Path) -> None:
    with NodeProc(tmp_path, workers=2) as node:
        node.signal(signal.SIGTERM)
        exits_zero_leaving_no_process(node)
        assert "bye bye" in node.log_text()


def test_ctrl_c_to_the_group_exits_zero(tmp_path: Path) -> None:
    with NodeProc(tmp_path, workers=2) as node:
        os.killpg(node.pgid or 0, signal.SIGINT)  # what a terminal does on Ctrl-C
        exits_zero_leaving_no_process(node)


def test_shutdown_command_exits_zero(tmp_path: Path) -> None:
    with NodeProc(tmp_path, workers=2) as node:
        r = node.client()
        try:
            r.execute_command("SHUTDOWN")
        except redis.ConnectionError:
            pass  # the server may close the connection instead of replying
        exits_zero_leaving_no_process(node)


def test_sigkill_of_the_supervisor_frees_the_port(tmp_path: Path) -> None:
    node = NodeProc(tmp_path, workers=2).start()
    try:
        first = node_id_in(tmp_path)
        workers = node.worker_pids()
        assert len(workers) == 2
        os.kill(node.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
        node.wait_exit()
        # the workers notice their parent's death and exit (contract: within 1 s)
        node.wait_for(lambda: not node.group_pids(), timeout_s=10, what="workers gone")
        assert port_free(node.port)
        again = NodeProc(tmp_path, workers=2, port=node.port).start()
        try:
            assert again.client().ping() is True
            assert node_id_in(tmp_path) == first
        finally:
            assert again.stop() == 0
    finally:
        node.stop()


def test_a_killed_worker_is_restarted_into_its_slot(tmp_path: Path) -> None:
    with NodeProc(tmp_path, workers=2) as node:
        node.wait_for(lambda: len(node.worker_pids()) == 2, what="two workers")
        before = set(node.worker_pids())
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        node.wait_for(lambda: len(set(node.worker_pids()) - before) == 1
                      and victim not in node.worker_pids(), what="a new worker")
        node.wait_for(lambda: "serving again" in node.log_text(), what="ready again")
        log = node.log_text()
        assert f"(pid {victim}) was killed by signal SIGKILL" in log
        for _ in range(20):  # both workers answer (the kernel spreads connections)
            assert redis.Redis(port=node.port, protocol=2).ping() is True
        assert node.client().ping() is True
        assert node.stop() == 0


def raw_reply(port: int, command: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(command)
        return s.recv(4096)


def test_restarted_workers_keep_config_set_values(tmp_path: Path) -> None:
    with NodeProc(tmp_path, workers=2) as node:
        assert node.client().config_set("requirepass", "s3cret") is True
        assert node.client(password="s3cret").config_set("maxmemory", "100mb") is True
        node.wait_for(lambda: node.log_text().count("kept for restarted workers") >= 4,
                      what="both workers' reports")
        old = node.worker_pids()
        for n, pid in enumerate(old, 1):  # replace every worker, one at a time
            os.kill(pid, signal.SIGKILL)
            node.wait_for(lambda n=n: node.log_text().count("serving again") >= n,
                          what="a ready replacement")
        assert not set(old) & set(node.worker_pids())
        for _ in range(20):  # every connection lands on a restarted worker
            assert raw_reply(node.port, b"PING\r\n").startswith(b"-NOAUTH")
        r = node.client(password="s3cret", protocol=2)
        assert r.config_get("maxmemory") == {"maxmemory": str(100 << 20)}
        assert r.ping() is True


def test_restart_backoff_grows_while_a_worker_keeps_dying(tmp_path: Path) -> None:
    with NodeProc(tmp_path, workers=1) as node:
        for deaths in range(3):
            node.wait_for(lambda d=deaths: node.log_text().count("serving again") >= d
                          and len(node.worker_pids()) == 1, what="a live, ready worker")
            pid = node.worker_pids()[0]
            os.kill(pid, signal.SIGKILL)
            node.wait_for(lambda pid=pid: f"(pid {pid}) was killed" in node.log_text(),
                          what="the death logged")
        node.wait_for(lambda: node.log_text().count("serving again") >= 3, what="back")
        delays = [line.rsplit(" in ", 1)[1] for line in node.log_text().splitlines()
                  if "restarting it in" in line]
        # each death came within stable_run_s of the start: the delay doubles
        assert delays == ["0.1 s", "0.2 s", "0.4 s"]
        assert node.client().ping() is True


def test_sighup_reopens_the_log_file(tmp_path: Path) -> None:
    """logrotate's move + SIGHUP to the pid file's process: the supervisor and every
    worker (it forwards the signal) write to the new file; no worker dies of it."""
    with NodeProc(tmp_path, workers=2) as node:
        workers = node.worker_pids()
        (tmp_path / "disque.log").rename(tmp_path / "disque.log.1")
        node.signal(signal.SIGHUP)
        reopened = [f"{role} " for role in ("X", "W0", "W1")]

        def all_reopened() -> bool:
            lines = [ln for ln in node.log_text().splitlines() if "Received SIGHUP" in ln]
            return all(any(role in ln for ln in lines) for role in reopened)

        node.wait_for(all_reopened, what="every process reopening the log")
        with socket.create_connection(("127.0.0.1", node.port)) as bad:  # a worker logs this
            bad.sendall(b"*1\r\n$x\r\n")
            bad.recv(1024)
        node.wait_for(lambda: "closing" in node.log_text(), what="a worker line in the new file")
        assert "Received SIGHUP" not in (tmp_path / "disque.log.1").read_text()
        assert node.worker_pids() == workers
        assert node.client().ping() is True
        assert node.stop() == 0
        assert "bye bye" in node.log_text()


def exits_one_saying(node: NodeProc, message: str) -> None:
    """Started without waiting for it to serve, the node exits 1 and says ``message``."""
    node.start(wait=False)
    try:
        assert node.wait_exit(timeout_s=60) == 1
        assert message in node.output()
    finally:
        node.stop()


def test_workers_that_cannot_start_make_the_node_exit(tmp_path: Path) -> None:
    # a TLS certificate that is not there: every worker start fails (a port in use
    # is caught by the supervisor before any worker starts: tests/node/test_first_hour.py)
    conf = {"tls-port": free_port(), "tls-cert-file": "missing.pem", "tls-key-file": "missing.pem"}
    exits_one_saying(NodeProc(tmp_path, workers=1, conf=conf), "failed to start 3 times in a row")


def test_second_node_in_the_same_dir_is_refused(tmp_path: Path) -> None:
    with NodeProc(tmp_path, workers=1):
        other = NodeProc(tmp_path / "other", workers=1)
        other.dir = tmp_path  # same dir, another config file and port
        other.conf_path = tmp_path / "other.conf"
        other.out_path = tmp_path / "other.out"
        exits_one_saying(other, "is already used by a different disque-mp node")


# --- sd_notify ---


def test_sdnotify_sends_to_path_and_abstract_sockets(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(tmp_path / "n.sock"))
        assert sdnotify.notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "n.sock")})
        assert s.recv(100) == b"READY=1"
    name = f"disque-mp-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        assert sdnotify.notify("STOPPING=1", {"NOTIFY_SOCKET": "@" + name})
        assert s.recv(100) == b"STOPPING=1"
    assert not sdnotify.notify("READY=1", {})
    assert not sdnotify.notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "nobody")})


def _recv_until(s: socket.socket, wanted: str) -> list[str]:
    """Datagrams received up to and including the first one with line ``wanted``."""
    got = []
    while True:
        msg = s.recv(4096).decode()
        got.append(msg)
        if wanted in msg.split("\n"):
            return got


def test_sd_notify_ready_watchdog_and_stopping(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        sock_path = str(tmp_path / "notify.sock")
        s.bind(sock_path)
        s.settimeout(60)
        env = {"NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "200000"}  # WatchdogSec=0.2
        node = NodeProc(tmp_path / "node", workers=2, env=env)
        node.start(wait=False)
        try:
            ready = _recv_until(s, "READY=1")[-1].split("\n")
            assert f"MAINPID={node.proc.pid}" in ready  # type: ignore[union-attr]
            assert any(line.startswith("STATUS=Ready") for line in ready)
            node.wait_ready()  # READY=1 means every worker accepts
            assert node.client().ping() is True
            _recv_until(s, "WATCHDOG=1")  # the loop keeps petting after READY
            _recv_until(s, "WATCHDOG=1")
            node.signal(signal.SIGTERM)
            _recv_until(s, "STOPPING=1")
            assert node.wait_exit() == 0
        finally:
            node.stop()


def test_watchdog_interval() -> None:
    assert sdnotify.watchdog_interval_s({}) is None
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "x"}) is None
