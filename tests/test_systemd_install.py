"""The systemd install steps of docs/install.md, run as written as far as a machine
without systemd (and without a ``disque`` user) allows.

The ```sh block under "### systemd" runs in a scratch root: ``apt-get``, ``useradd`` and
``systemctl`` lines are left out, ``sudo`` is dropped, the ``disque`` user is the user
running the test, and paths under /opt, /etc, /var/lib and /run move into the scratch
root. The venv under /opt is real (``python3 -m venv``); its ``pip install .`` installs
the wheel ``make compile`` built (no compiler run here), or without one the checkout's
plain Python, with the test venv's third-party packages borrowed (a path line: no index
is asked). Then the files have the owner and mode the unit needs, ``--test-config``
(which the block runs with the venv's ``disque-mp``) passed, a node starts from the
installed config and the venv's console script, outside the checkout, with its cluster
secret, and CONFIG REWRITE writes that config. ``systemd-analyze verify`` checks the
unit where it exists.
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
import sysconfig
from pathlib import Path

import pytest
import redis

from tests.nodeproc import REPO, free_port, wait_until

pytestmark = pytest.mark.timeout(300)
DOC = REPO / "docs" / "install.md"
VENV = "/opt/disque-mp"  # where the block installs the node and the unit runs it
MOVED = (VENV, "/etc/disque-mp", "/etc/systemd/system", "/var/lib/disque-mp", "/run/disque-mp")
LEFT_OUT = ("apt-get", "useradd", "systemctl")
install_timeout_s = 240  # a venv and a --no-deps install (or a plain Python build) on 2 busy cores


def install_block() -> str:
    text = DOC.read_text()
    section = text[text.index("\n### systemd\n"):]
    m = re.search(r"```sh\n(.*?)```", section, re.S)
    assert m is not None, "no ```sh block under ### systemd in docs/install.md"
    return m.group(1)


def package_install(venv: str, tmp_path: Path) -> str:
    """What ``VENV/bin/pip install .`` becomes here: the compiled wheel when there is
    one, else the checkout's source built as plain Python (in a copy: the checkout's
    build/ stays as it is), dependencies borrowed from the test venv."""
    python = f"{venv}/bin/python"
    pth = (f"{python} -c 'import sys, sysconfig; open(sysconfig.get_path(\"purelib\") + "
           f"\"/borrowed.pth\", \"w\").write(sys.argv[1] + \"\\n\")' "
           f"{sysconfig.get_path('purelib')}")
    pip = f"{sys.executable} -m pip --python {python} install -q --no-deps --no-index"
    wheels = sorted((REPO / ".venv" / "wheel").glob("disque_mp-*.whl"))
    if wheels:
        return f"{pth}\n{pip} {wheels[-1]}"
    src = tmp_path / "src"
    src.mkdir()
    for name in ("disque_mp", "workers", "bus"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    return f"{pth}\nDISQUE_MP_PURE=1 {pip} --no-build-isolation {src}"


def sandboxed(block: str, root: Path, conf: Path, tmp_path: Path) -> str:
    user = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    venv = f"{root}{VENV}"
    lines = ["set -eu"]
    for line in block.splitlines():
        if any(word in line for word in LEFT_OUT):
            continue
        line = line.replace("sudo -u disque ", "").replace("sudo ", "")
        line = line.replace("-o disque -g disque", f"-o {user} -g {group}")
        line = line.replace("systemd/disque-mp.conf", str(conf))
        for path in MOVED:
            line = line.replace(path, f"{root}{path}")
        line = line.replace("python3 -m venv ", f"{sys.executable} -m venv --without-pip ")
        if line.strip() == f"{venv}/bin/pip install .":
            line = package_install(venv, tmp_path)
        lines.append(line)
    return "\n".join(lines) + "\n"


def clean_env() -> dict[str, str]:
    """No PYTHONPATH to the checkout, no DISQUE_MP_PURE: the venv's install alone."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "DISQUE_MP"))}


def test_the_documented_install_steps_work(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for path in ("/etc/systemd/system", "/var/lib/disque-mp", "/run/disque-mp"):
        (root / path.lstrip("/")).mkdir(parents=True)  # StateDirectory, RuntimeDirectory
    conf = tmp_path / "disque-mp.conf"  # the example config, its paths in the scratch root
    text = (REPO / "systemd" / "disque-mp.conf").read_text()
    for path in MOVED:
        text = text.replace(path, f"{root}{path}")
    conf.write_text(text)
    script = sandboxed(install_block(), root, conf, tmp_path)
    out = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True,
                         timeout=install_timeout_s, env=clean_env())
    assert out.returncode == 0, script + out.stdout + out.stderr
    assert "is valid" in out.stdout  # the block's --test-config, by the venv's disque-mp

    etc = root / "etc" / "disque-mp"
    for path, mode in ((etc, 0o750), (etc / "disque-mp.conf", 0o640),
                       (etc / "cluster.secret", 0o600)):
        st = path.stat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (mode, os.getuid()), path
    unit = (root / "etc" / "systemd" / "system" / "disque-mp.service").read_text()
    assert f"ExecStart={VENV}/bin/disque-mp " in unit  # where the block installed it
    start_and_rewrite(root / VENV.lstrip("/") / "bin" / "disque-mp", etc / "disque-mp.conf",
                      tmp_path)


def start_and_rewrite(script: Path, conf: Path, tmp_path: Path) -> None:
    """The venv's console script starts a node from the installed config (its workers
    read the secret), outside the checkout, and CONFIG REWRITE can replace the config."""
    port = free_port()
    with open(tmp_path / "node.out", "wb") as out:
        proc = subprocess.Popen([str(script), str(conf), "--port", str(port), "--workers", "1"],
                                cwd=tmp_path, env=clean_env(), stdout=out,
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
                    .replace(f"{VENV}/bin/disque-mp", exe))
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "disque-mp.service" not in out.stderr, out.stderr  # no warning about the unit
