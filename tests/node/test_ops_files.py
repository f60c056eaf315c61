"""The node's files against other local users: what it creates is private (0600
files, 0700 dirs), it refuses a data dir another user owns or may write in, no
other user can hold its lock, its password can come from a file or the
environment, CONFIG SET dir is refused while the AOF is on, and CONFIG SET
cluster-secret-file takes only a private secret file sharing a key in use."""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import redis

from tests.bus.other_user import fork_as_user, needs_root_and_nobody, uid_of
from tests.nodeproc import REPO, NodeProc, free_port

pytestmark = pytest.mark.integration

PASSWORD = "ops-files-test-password"
run_timeout_s = 60.0  # a node that refuses to start exits at once; busy cores


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def start_exit(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A node that must refuse to start: its exit status and what it said."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "disque_mp", "--port", str(free_port()),
                           "--bind", "127.0.0.1", "--workers", "1", *args],
                          capture_output=True, text=True, timeout=run_timeout_s, env=full_env,
                          stdin=subprocess.DEVNULL)


def test_a_loose_or_foreign_data_dir_is_refused(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)  # /tmp-like: anyone may plant a nodes.conf here
    out = start_exit(["--dir", str(loose)])
    assert out.returncode == 1
    assert "lets other users write in it" in out.stderr and "mkdir -m 700" in out.stderr
    assert "chmod" not in out.stderr  # chmod go-w /tmp would break /tmp for every user
    assert not (loose / "nodes.conf").exists()
    # a dir the node creates itself is 0700 (here it stops at the log file it can't open)
    fresh = tmp_path / "fresh" / "data"
    out = start_exit(["--dir", str(fresh), "--logfile", str(tmp_path / "none" / "x.log")])
    assert out.returncode == 1 and "Can't open the log file" in out.stderr
    assert mode_of(fresh) == 0o700 and mode_of(fresh.parent) == 0o700
    if os.getuid() == 0 and uid_of("nobody") >= 0:
        foreign = tmp_path / "foreign"
        foreign.mkdir()
        os.chown(foreign, uid_of("nobody"), -1)
        out = start_exit(["--dir", str(foreign)])
        assert out.returncode == 1 and "not by the node's user" in out.stderr


def hold_dir_lock_as_nobody(path: Path) -> tuple[int, int, int]:
    """A child running as nobody that flocks ``path`` (a 0755 dir it can read) and
    tries the node's lock file, then waits; returns (pid, result fd, release fd)."""
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()

    def hold() -> dict[str, object]:
        os.close(hold_w)
        fd = os.open(str(path), os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            os.open(str(path / "disque-mp.lock"), os.O_RDWR | os.O_CREAT, 0o644)
            lock_file = "opened"
        except PermissionError:
            lock_file = "refused"
        os.write(ready_w, b"1")
        os.read(hold_r, 1)  # until the test closes its end
        return {"lock_file": lock_file}

    pid, result_fd = fork_as_user(uid_of("nobody"), hold)
    os.close(ready_w)
    os.close(hold_r)
    readable, _, _ = select.select([ready_r], [], [], run_timeout_s)
    assert readable and os.read(ready_r, 1) == b"1", "the other user's child did not start"
    os.close(ready_r)
    return pid, result_fd, hold_w


@needs_root_and_nobody
def test_another_user_cannot_lock_the_node_out() -> None:
    # pytest's own temporary dirs are 0700: the other user must reach this one
    top = Path(tempfile.mkdtemp(prefix="disque-mp-ops-", dir="/tmp"))
    top.chmod(0o755)
    base = top / "n"
    data = base / "data"
    data.mkdir(parents=True, mode=0o755)
    pid, result_fd, hold_w = hold_dir_lock_as_nobody(data)
    try:
        with NodeProc(base, workers=1, conf={"dir": str(data), "appendonly": "yes",
                                             "logfile": str(base / "disque.log")}) as node:
            r = node.client()
            assert r.ping()
            r.close()
    finally:
        os.close(hold_w)
        result = json.loads(os.read(result_fd, 4096) or b"{}")
        os.close(result_fd)
        os.waitpid(pid, 0)
        shutil.rmtree(top, ignore_errors=True)
    assert result == {"lock_file": "refused"}


def test_files_private_password_from_a_file_dir_and_secret_guards(tmp_path: Path) -> None:
    base = tmp_path / "n"
    base.mkdir()
    data = base / "fresh" / "data"  # created by the node
    pass_file = tmp_path / "password"
    pass_file.write_text(PASSWORD + "\n")
    pass_file.chmod(0o600)
    secret = tmp_path / "cluster.secret"
    secret.write_text("first secret of the ops test\n")
    secret.chmod(0o600)
    conf = {"dir": str(data), "appendonly": "yes", "logfile": str(base / "disque.log"),
            "cluster-secret-file": str(secret)}
    node = NodeProc(base, workers=2, conf=conf, env={"DISQUE_MP_REQUIREPASS": PASSWORD})
    start_with_password(node)
    try:
        r = node.client(password=PASSWORD)
        job_id = r.execute_command("ADDJOB", "q", "body", 0)
        assert mode_of(data) == 0o700 and mode_of(data.parent) == 0o700
        for name in ("nodes.conf", "disque-mp.lock"):
            assert mode_of(data / name) == 0o600, name
        aof = [p for p in data.iterdir() if "aof" in p.name]
        assert aof and all(mode_of(p) == 0o600 for p in aof if p.is_file())
        assert mode_of(base / "disque.log") == 0o600
        config_set_dir_refused_under_aof(r, tmp_path)
        secret_file_guards(r, tmp_path, secret)
        r.close()
        # the password from a file: not on the command line, where /proc shows it to all
        node.stop()
        node.extra_args = ["--requirepass-file", str(pass_file)]
        node.env = None
        start_with_password(node)
        cmdline = Path(f"/proc/{node.proc.pid}/cmdline").read_bytes()  # type: ignore[union-attr]
        assert PASSWORD.encode() not in cmdline
        with pytest.raises(redis.AuthenticationError):
            node.client().ping()
        r = node.client(password=PASSWORD)
        assert r.execute_command("SHOW", job_id)  # the AOF kept the job
        r.close()
    finally:
        node.stop()


def start_with_password(node: NodeProc) -> None:
    """NodeProc's readiness check pings without a password: ping with it instead."""
    node.start(wait=False)

    def ready() -> bool:
        try:
            with node.client(password=PASSWORD, socket_timeout=1) as r:
                return bool(r.ping()) and node._supervisor_ready()
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return False

    node.wait_for(ready, run_timeout_s, "the node ready (with its password)")


def config_set_dir_refused_under_aof(r: redis.Redis, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    with pytest.raises(redis.ResponseError, match="while appendonly is yes"):
        r.execute_command("CONFIG", "SET", "dir", str(other))
    assert r.execute_command("QLEN", "q") == 1


def secret_file_guards(r: redis.Redis, tmp_path: Path, secret: Path) -> None:
    for path, why in (("/proc/version", "mode"), (str(secret.parent), "not a regular file")):
        with pytest.raises(redis.ResponseError, match=why):
            r.execute_command("CONFIG", "SET", "cluster-secret-file", path)
    loose = tmp_path / "loose.secret"
    loose.write_text("first secret of the ops test\n")
    loose.chmod(0o644)
    with pytest.raises(redis.ResponseError, match="other users may read"):
        r.execute_command("CONFIG", "SET", "cluster-secret-file", str(loose))
    unrelated = tmp_path / "unrelated.secret"
    unrelated.write_text("a secret sharing nothing with the first\n")
    unrelated.chmod(0o600)
    with pytest.raises(redis.ResponseError, match="shares no key"):
        r.execute_command("CONFIG", "SET", "cluster-secret-file", str(unrelated))
    rotated = tmp_path / "rotated.secret"
    rotated.write_text("a new secret of the ops test\nfirst secret of the ops test\n")
    rotated.chmod(0o600)
    assert r.execute_command("CONFIG", "SET", "cluster-secret-file", str(rotated)) == b"OK"
    assert r.execute_command("CONFIG", "SET", "cluster-secret-replace", "yes") == b"OK"
    assert r.execute_command("CONFIG", "SET", "cluster-secret-file", str(unrelated)) == b"OK"
    got = r.execute_command("CONFIG", "GET", "cluster-secret-file")
    assert str(unrelated).encode() in (got if isinstance(got, list) else list(got.values()))
