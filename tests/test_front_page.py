"""What the front page promises: its cluster block works pasted as one script, the
asyncio example runs, every page it and the docs index link to exists, and the user
docs carry no internal notes."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.nodeproc import REPO, free_port, proc_stats, wait_until

README = REPO / "README.md"
DOCS = REPO / "docs"
readme_lines_max = 300  # a front page read in five minutes
script_timeout_s = 180  # three cold nodes forming a cluster on 2 loaded cores: generous


def _cluster_block() -> str:
    text = README.read_text()
    marker = text.index("<!-- cluster-script:")
    start = text.index("```sh\n", marker) + len("```sh\n")
    return text[start:text.index("```", start)]


def _logs(root: Path) -> str:
    return "\n".join(f"--- {log}\n{log.read_text(errors='replace')[-3000:]}"
                     for log in sorted(root.glob("n*/disque.log")))


def _group_alive(pgid: int) -> bool:
    return any(int(fields[2]) == pgid and fields[0] != "Z" for _, fields in proc_stats())


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="needs redis-cli (make sysdeps)")
def test_the_cluster_block_runs_as_one_script_then_the_async_example(tmp_path: Path) -> None:
    """README's block, pasted as is into bash, on free ports instead of 7711-7713 and in
    a temporary directory instead of /tmp (the only edits); then examples/async_client.py
    against the first node."""
    ports = []
    while len(ports) < 3:
        p = free_port()
        if p not in ports:
            ports.append(p)
    script = _cluster_block()
    for default, port in zip(("7711", "7712", "7713"), ports, strict=True):
        script = script.replace(default, str(port))
    script = script.replace("/tmp/n$p", f"{tmp_path}/n$p")
    script = script.replace(".venv/bin/disque-mp", f"{sys.executable} -m disque_mp")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out_path = tmp_path / "script.out"  # a file: the nodes keep their stdout open after bash exits
    with open(out_path, "w") as out_file:
        proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=REPO, env=env, text=True,
                                stdout=out_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        try:
            proc.wait(timeout=script_timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the script did not finish:\n{out_path.read_text()}\n{_logs(tmp_path)}")
        out = out_path.read_text()
        assert proc.returncode == 0, out + _logs(tmp_path)
        lines = out.split()
        assert lines[-3:-1] == ["q", lines[-4]] and lines[-1] == "hello", out  # ADDJOB's ID, GETJOB
        example = subprocess.run([sys.executable, str(REPO / "examples" / "async_client.py"),
                                  "--nodes", f"127.0.0.1:{ports[0]}"], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=120)
        assert example.returncode == 0, example.stdout + example.stderr
        assert "handled 5; QLEN thumbnails = 0" in example.stdout
        assert "added, got and acknowledged" in example.stdout
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the script's process group (the three nodes are in it), SIGKILL what is
    left after a generous wait."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            wait_until(lambda: not _group_alive(proc.pid), 30, "the README's nodes exiting")
            break
        except TimeoutError:
            continue
    proc.wait(timeout=10)


def _links(path: Path) -> list[str]:
    return [m for m in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", path.read_text())
            if not m.startswith(("http://", "https://"))]


def test_the_front_page_is_short_and_its_links_resolve() -> None:
    assert README.read_text().count("\n") <= readme_lines_max
    for page in (README, DOCS / "README.md"):
        for link in _links(page):
            assert (page.parent / link).exists(), f"{page.name} links to missing {link}"


def test_every_doc_page_is_in_the_index_and_user_docs_hold_no_internal_notes() -> None:
    index = set(_links(DOCS / "README.md"))
    pages = sorted(p.name for p in DOCS.glob("*.md") if p.name != "README.md")
    assert [p for p in pages if p not in index] == []
    internal = re.compile(r"proposed to the lead|for the lead|who owns README|/work/shared|"
                          r"\.\./shared|session log|diary", re.IGNORECASE)
    for page in [README, *DOCS.glob("*.md")]:
        found = internal.search(page.read_text())
        assert found is None, f"{page.name}: {found.group(0)!r}"
