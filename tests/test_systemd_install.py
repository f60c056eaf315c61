"""The systemd install steps of docs/operations.md, run as written as far as a machine
without systemd (and without a ``disque`` user) allows.

The ```sh block under "## systemd" runs in a scratch root: ``useradd`` and
``systemctl`` lines are left out, ``sudo`` is dropped, the ``disque`` user is the
user running the test, paths under /etc, /var/lib and /run move into the scratch
root and ``/usr/local/bin/disque-mp`` is this checkout's. Then the files have the
owner and mode the unit needs, ``--test-config`` (which the block runs) passed, a
node starts from the installed config with its cluster secret, and CONFIG REWRITE
writes that config. ``systemd-analyze verify`` checks the unit where it exists.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.nodeproc import REPO, free_port, wait_until

pytestmark = pytest.mark.timeout(120)
DOC = REPO / "docs" / "operations.md"
MOVED = ("/etc/disque-mp", "/etc/systemd/system", "/var/lib/disque-mp", "/run/disque-mp")


def install_block() -> str:
    text = DOC.read_text()
    section = text[text.index("\n## systemd\n"):]
    m = re.search(r"```sh\n(.*?)```", section, re.S)
    assert m is not None, "no ```sh block under ## systemd in docs/operations.md"
    return m.group(1)


def sandboxed(block: str, root: Path, conf: Path) -> str:
    user = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    cli = f"env PYTHONPATH={REPO} {sys.executable} -m disque_mp"
    lines = ["set -eu"]
    for line in block.splitlines():
        if "useradd" in line or "systemctl" in line:
            continue
        line = line.replace("sudo -u disque ", "").replace("sudo ", "")
        line = line.replace("-o disque -g disque", f"-o {user} -g {group}")
        line = line.replace("systemd/disque-mp.conf", str(conf))
        line = line.replace("/usr/local/bin/disque-mp", cli)
        for path in MOVED:
            line = line.replace(path, f"{root}{path}")
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_the_documented_install_steps_work(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for path in ("/etc/systemd/system", "/var/lib/disque-mp", "/run/disque-mp"):
        (root / path.lstrip("/")).mkdir(parents=True)  # StateDirectory, RuntimeDirectory
    conf = tmp_path / "disque-mp.conf"  # the example config, its paths in the scratch root
    text = (REPO / "systemd" / "disque-mp.conf").read_text()
    for path in MOVED:
        text = text.replace(path, f"{root}{path}")
    conf.write_text(text)
    script = sandboxed(install_block(), root, conf)
    out = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, script + out.stdout + out.stderr
    assert "is valid" in out.stdout  # the block's --test-config

    etc = root / "etc" / "disque-mp"
    for path, mode in ((etc, 0o750), (etc / "disque-mp.conf", 0o640),
                       (etc / "cluster.secret", 0o600)):
        st = path.stat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (mode, os.getuid()), path
    assert (root / "etc" / "systemd" / "system" / "disque-mp.service").exists()
    start_and_rewrite(etc / "disque-mp.conf", tmp_path)


def start_and_rewrite(conf: Path, tmp_path: Path) -> None:
    """The installed config starts a node (its workers read the secret) and CONFIG
    REWRITE can replace it."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(tmp_path / "node.out", "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "disque_mp", str(conf), "--port", str(port),
                                 "--workers", "1"], cwd=tmp_path, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    r = redis.Redis(port=port, protocol=2, socket_timeout=5)
    try:
        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "node.out").read_text()
            return "Ready to accept connections" in (tmp_path / "node.out").read_text()

        wait_until(ready, 60, "the node started from the installed config")
        assert r.execute_command("CONFIG", "SET", "loglevel", "verbose") in (b"OK", True)
        assert r.execute_command("CONFIG", "REWRITE") in (b"OK", True)
        assert "loglevel verbose" in conf.read_text()
    finally:
        r.close()
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    unit = tmp_path / "disque-mp.service"
    installed = Path(sys.executable).parent / "disque-mp"
    exe = str(installed) if installed.exists() else "/bin/true"  # verify wants it to exist
    unit.write_text((REPO / "systemd" / "disque-mp.service").read_text()
                    .replace("/usr/local/bin/disque-mp", exe))
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "disque-mp.service" not in out.stderr, out.stderr  # no warning about the unit
