"""The wheel `pip install .` builds, installed in a fresh virtualenv, runs a node outside
the checkout.

`make compile` builds the wheel once (the same mypyc build gives the in-place modules)
into .venv/wheel/; this test installs it with --no-deps into a new venv that borrows the
test venv's third-party packages (a path line, so the checkout's editable install is not
seen), then starts `disque-mp` from that venv's bin/ in a temporary directory and checks
that every module came from the wheel, compiled, and that the node serves jobs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import redis

from tests.nodeproc import REPO, free_port, wait_until

pytestmark = pytest.mark.integration

WHEEL_DIR = REPO / ".venv" / "wheel"
install_timeout_s = 300.0  # venv + pip install --no-deps on 2 loaded cores
start_timeout_s = 60.0  # a cold node: generous, never a timed assertion


def _wheel() -> Path:
    wheels = sorted(WHEEL_DIR.glob("disque_mp-*.whl"))
    if not wheels:
        pytest.skip(f"no wheel in {WHEEL_DIR}: `make compile` builds it")
    return wheels[-1]


def _fresh_venv(root: Path, wheel: Path) -> Path:
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=install_timeout_s)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # third-party packages from the test venv, after the new venv's own site-packages
    Path(site, "borrowed.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, timeout=install_timeout_s)
    return venv


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "DISQUE_MP"))}
    return env


def test_the_wheel_installs_and_serves_outside_the_checkout(tmp_path: Path) -> None:
    venv = _fresh_venv(tmp_path, _wheel())
    env, run_dir = _clean_env(), tmp_path / "elsewhere"
    run_dir.mkdir()
    origins = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import disque_mp, workers, bus, disque_mp.compiled as c; "
         "print(disque_mp.__file__, workers.__file__, bus.__file__, c.summary())"],
        cwd=run_dir, env=env, check=True, capture_output=True, text=True).stdout.split()
    assert all(path.startswith(str(venv)) for path in origins[:3]), origins
    assert origins[3] == "mypyc"
    # bench/ is not in the wheel: the subcommand says what to run instead
    bench = subprocess.run([str(venv / "bin" / "disque-mp"), "bench", "cycle"], cwd=run_dir,
                           env=env, capture_output=True, text=True, timeout=60)
    assert bench.returncode == 2 and "ships with the source tree" in bench.stderr, bench.stderr
    assert "python -m bench.loadgen" in bench.stderr and "Traceback" not in bench.stderr
    port = free_port()
    proc = subprocess.Popen([str(venv / "bin" / "disque-mp"), "--port", str(port), "--bind",
                             "127.0.0.1", "--dir", str(run_dir), "--workers", "2"],
                            cwd=run_dir, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    r = redis.Redis(port=port, socket_timeout=10)
    try:
        def up() -> bool:
            assert proc.poll() is None, f"node exited with {proc.returncode}"
            try:
                return bool(r.ping())
            except redis.ConnectionError:
                return False
        wait_until(up, start_timeout_s, "the wheel's node answering PING")
        info = r.info("workers")
        assert info["shard_build"] == "mypyc" and info["workers"] == 2, info
        job_id = r.execute_command("ADDJOB", "q", "from the wheel", 0)
        [(queue, got_id, body)] = r.execute_command("GETJOB", "TIMEOUT", 5000, "FROM", "q")
        assert (got_id, body) == (job_id, b"from the wheel")
        assert r.execute_command("ACKJOB", job_id) == 1
    finally:
        r.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_make_extras_compiles_nothing_and_keeps_the_editable_install() -> None:
    """`make extras` (docs/install.md), read from the Makefile by a dry run: pip with
    DISQUE_MP_PURE=1 (setup.py then builds no extension: the compiled modules in the tree
    stay) and -e (the editable install of the checkout stays)."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make here")
    out = subprocess.run([make, "-s", "-n", "-o", ".venv/.base", "extras", "EXTRAS=celery,taskiq"],
                         cwd=REPO, capture_output=True, text=True, timeout=60, check=True).stdout
    (line,) = [ln for ln in out.splitlines() if " pip install " in ln]
    assert line.startswith("DISQUE_MP_PURE=1 .venv/bin/python -m pip install "), line
    assert line.endswith(" -e '.[celery,taskiq]'"), line

