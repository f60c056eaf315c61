"""What a new user meets in the first hour: ports in use, the HTTP port in the log,
the health probes, ``--test-config`` on the cluster secret, CONFIG REWRITE on a
node started without a config file, the JSON log format.

One node (``running``, module-scoped) serves every test that needs one running;
the nodes that must fail to start never get a worker going.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.httpclient import get
from tests.nodeproc import REPO, NodeProc, free_port, port_free, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    http_port = free_port()
    with NodeProc(tmp_path_factory.mktemp("running"), workers=2,
                  conf={"http-port": http_port}) as node:
        node.http_port = http_port  # type: ignore[attr-defined]
        yield node


def http_port(node: NodeProc) -> int:
    return int(node.http_port)  # type: ignore[attr-defined]


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "disque_mp", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def fails_with_one_line(node: NodeProc, *words: str) -> None:
    """The node exits 1, and what it printed and logged names the port in one line
    (no traceback, no worker ever started)."""
    node.start(wait=False)
    try:
        assert node.wait_exit(timeout_s=60) == 1
        out = node.output()
        printed = node.out_path.read_text()  # the terminal's view; the log file has it too
        lines = [ln for ln in printed.splitlines() if "already in use" in ln]
        assert len(lines) == 1 and all(w in lines[0] for w in words), out
        assert lines[0].split(": ", 1)[1] in node.log_text(), out
        assert "Traceback" not in out and "ready to accept" not in out, out
    finally:
        node.stop()


def test_the_log_names_the_http_port(running: NodeProc) -> None:
    assert f"port {http_port(running)}" in "\n".join(
        ln for ln in running.log_text().splitlines() if "HTTP" in ln)


def test_a_second_node_on_the_http_port_fails_to_start(running: NodeProc,
                                                        tmp_path: Path) -> None:
    other = NodeProc(tmp_path, workers=1, conf={"http-port": http_port(running)})
    fails_with_one_line(other, f"HTTP port {http_port(running)}", "held by pid", "disque-mp")
    # every request still reaches the node that holds the port
    for _ in range(12):
        assert get(http_port(running), "/api/overview").json()["port"] == running.port


def test_a_second_node_on_the_client_port_fails_to_start(running: NodeProc,
                                                          tmp_path: Path) -> None:
    other = NodeProc(tmp_path, workers=1, port=running.port)
    fails_with_one_line(other, f"client port {running.port}", "held by pid")


def test_a_node_on_a_bus_port_in_use_fails_before_any_worker(tmp_path: Path) -> None:
    port = next(p for p in (free_port() for _ in range(50)) if p + 10000 <= 65535
                and port_free(p + 10000))
    with socket.socket() as holder:  # someone else's listener on its bus port
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port + 10000))
        holder.listen(1)
        other = NodeProc(tmp_path, workers=1, port=port)
        fails_with_one_line(other, f"cluster bus port {port + 10000}", f"held by pid {os.getpid()}")


def test_healthz_and_readyz(running: NodeProc) -> None:
    health = get(http_port(running), "/healthz")
    assert health.status == 200 and health.json()["status"] == "ok"
    ready = get(http_port(running), "/readyz")
    body = ready.json()
    assert ready.status == 200, body
    assert body["status"] == "ready" and body["workers_up"] == 2 and body["workers_down"] == []
    assert body["cluster"]["state"] == "ok" and body["cluster"]["nodes"] == 1


def readyz_status(port: int) -> int:
    """/readyz's status, 0 when this connection went to a stopped worker."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def test_readyz_is_503_while_a_worker_does_not_answer(running: NodeProc) -> None:
    stopped = running.worker_pids()[0]
    os.kill(stopped, signal.SIGSTOP)
    try:
        wait_until(lambda: readyz_status(http_port(running)) == 503, 60, "/readyz 503")
    finally:
        os.kill(stopped, signal.SIGCONT)
    wait_until(lambda: readyz_status(http_port(running)) == 200, 60, "/readyz 200 again")


def write_conf(path: Path, secret: str) -> Path:
    conf = path / "disque.conf"
    conf.write_text(f"port {free_port()}\ndir {path}\ncluster-secret-file {secret}\n")
    return conf


def test_test_config_checks_the_cluster_secret_file(tmp_path: Path) -> None:
    conf = write_conf(tmp_path, "cluster.secret")  # relative: inside dir
    out = run_cli("--test-config", str(conf), cwd=tmp_path)
    assert out.returncode == 1, out
    assert "cluster-secret-file" in out.stderr and "cluster.secret" in out.stderr, out.stderr
    (tmp_path / "cluster.secret").write_text("short\n")
    out = run_cli("--test-config", str(conf), cwd=tmp_path)
    assert out.returncode == 1 and "shorter than" in out.stderr, out.stderr
    (tmp_path / "cluster.secret").write_text("0123456789abcdef0123456789abcdef\n")
    out = run_cli("--test-config", str(conf), cwd=tmp_path)
    assert out.returncode == 0 and "is valid" in out.stdout, out


def start_without_config(tmp_path: Path, port: int, *extra: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(tmp_path / "out", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "disque_mp", "--port", str(port), "--dir", str(tmp_path),
             "--workers", "1", "--logformat", "json", *extra],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_answering(r: redis.Redis) -> None:
    def answers() -> bool:
        try:
            return bool(r.ping())
        except redis.ConnectionError:
            return False

    wait_until(answers, 60, "the node answering PING")


def test_no_config_file_rewrite_error_restart_and_json_log(tmp_path: Path) -> None:
    """Started from the command line alone: CONFIG REWRITE gives the reference's
    error and the log says what to do, which works (the next start with
    ``--aof-enqueue-jobs-once yes`` has the queued jobs queued at once);
    ``--logformat json`` logs JSON lines."""
    port = free_port()
    proc = start_without_config(tmp_path, port)
    r = redis.Redis(port=port, protocol=2, socket_timeout=5)
    try:
        wait_answering(r)
        with pytest.raises(redis.ResponseError, match="^The server is running without a config file$"):
            r.execute_command("CONFIG", "REWRITE")
        wait_until(lambda: "CONFIG REWRITE refused" in (tmp_path / "out").read_text(), 30,
                   "the log line")
        for n in range(3):  # RETRY 300: without the option they would wait 5 minutes
            r.execute_command("ADDJOB", "restarted", f"job{n}", 0, "RETRY", 300)
        assert r.execute_command("CONFIG", "SET", "aof-enqueue-jobs-once", "yes") in (b"OK", True)
        with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
            r.execute_command("SHUTDOWN", "REWRITE-AOF")  # the node closes, no reply
        assert proc.wait(timeout=30) == 0
        proc = start_without_config(tmp_path, port, "--aof-enqueue-jobs-once", "yes")
        r.close()
        r = redis.Redis(port=port, protocol=2, socket_timeout=5)
        wait_answering(r)
        assert r.execute_command("QLEN", "restarted") == 3
    finally:
        r.close()
        proc.terminate()
        proc.wait(timeout=30)
    lines = (tmp_path / "out").read_text().splitlines()
    entries = [json.loads(ln) for ln in lines]  # every line is one JSON object
    assert {"ts", "pid", "role", "level", "logger", "msg"} <= set(entries[0])
    hint = [e for e in entries if "CONFIG REWRITE refused" in e["msg"]]
    assert hint and hint[0]["level"] == "warning" and "--aof-enqueue-jobs-once yes" in hint[0]["msg"]
    assert any(e["role"] == "X" for e in entries) and any(e["role"] == "W0" for e in entries)
