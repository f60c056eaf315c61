"""Persistence end to end: real nodes, real AOF files, real kills.

- appendfsync always + SIGKILL at a random moment: every job whose ADDJOB got an
  ID comes back and is delivered; no job is invented.
- the spec's controlled restart keeps queues and their order;
- restarts with another worker count keep every job;
- a damaged tail is cut (aof-load-truncated yes) or refused (no);
- write errors (injected, and a real full tmpfs): the node says so and does
  not acknowledge jobs it could not log.
"""

from __future__ import annotations

import os
import random
import shlex
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from disque_mp.node import aof_format
from tests.nodeproc import REPO, NodeProc, free_port
from tests.rawclient import exchange
from workers.ids import owner_of_queue

pytestmark = pytest.mark.integration

ALWAYS = {"appendonly": "yes", "appendfsync": "always"}


def info_persistence(r: redis.Redis) -> dict[str, Any]:
    raw = r.execute_command("INFO", "persistence")
    if isinstance(raw, dict):  # redis-py parses INFO into a dict (values typed)
        return {k: str(v) for k, v in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    out: dict[str, Any] = {}
    for line in text.splitlines():
        if ":" in line and not line.startswith("#"):
            k, v = line.split(":", 1)
            out[k] = v
    return out


def raw_command(port: int, line: bytes) -> bytes:
    """One inline command over a plain socket: the exact reply line."""
    return exchange(port, line + b"\r\n", timeout_s=10, until=b"\r\n")


def jscan_all(r: redis.Redis) -> set[str]:
    ids: set[str] = set()
    cursor = b"0"
    while True:
        reply = r.execute_command("JSCAN", cursor, "COUNT", 1000)
        cursor = reply[0]
        ids |= {x.decode() if isinstance(x, bytes) else str(x) for x in reply[1]}
        if cursor in (b"0", "0", 0):
            return ids


def show_body(r: redis.Redis, job_id: str) -> bytes | None:
    reply = r.execute_command("SHOW", job_id)
    if not reply:
        return None
    fields = dict(zip(reply[::2], reply[1::2], strict=True))
    key = b"body" if b"body" in fields else "body"
    return fields[key]


def drain_queue(r: redis.Redis, queues: list[str], expect: int, timeout_s: float = 30) -> dict[str, bytes]:
    """GETJOB (and ACK) until ``expect`` distinct jobs were delivered."""
    got: dict[str, bytes] = {}
    deadline = time.monotonic() + timeout_s
    while len(got) < expect and time.monotonic() < deadline:
        reply = r.execute_command("GETJOB", "TIMEOUT", 500, "COUNT", 100, "FROM", *queues)
        for _q, jid, body in reply or []:
            job_id = jid.decode()
            got[job_id] = body
            r.execute_command("ACKJOB", job_id)
    return got


class Producer(threading.Thread):
    """Adds jobs with unique bodies until stopped or the node dies; remembers the
    IDs it was given and the bodies it sent."""

    def __init__(self, port: int, queue: str, tag: int) -> None:
        super().__init__(daemon=True)
        self.port, self.queue, self.tag = port, queue, tag
        self.acked: dict[str, bytes] = {}
        self.sent: set[bytes] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        r = redis.Redis(host="127.0.0.1", port=self.port, protocol=2, socket_timeout=10)
        n = 0
        while not self.stop.is_set():
            body = f"p{self.tag}-{n}".encode()
            n += 1
            self.sent.add(body)
            try:
                job_id = r.execute_command("ADDJOB", self.queue, body, 0, "RETRY", 1)
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                return
            self.acked[job_id.decode()] = body


@pytest.mark.parametrize("fsync", ["always", "everysec"])
def test_sigkill_loses_no_acknowledged_job(tmp_path: Path, fsync: str) -> None:
    """SIGKILL keeps the page cache: with `always` and with `everysec` (records
    are written before their replies) no acknowledged job may be lost."""
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    node = NodeProc(tmp_path, workers=2, conf={"appendonly": "yes", "appendfsync": fsync}).start()
    try:
        producers = [Producer(node.port, f"queue-{i}", i) for i in range(4)]
        for p in producers:
            p.start()
        node.wait_for(lambda: sum(len(p.acked) for p in producers) >= 50, what="some jobs added")
        time.sleep(rng.uniform(0.0, 0.5))
        node.kill_group()  # SIGKILL: supervisor and workers at once
        for p in producers:
            p.join(timeout=15)
        acked = {k: v for p in producers for k, v in p.acked.items()}
        sent = set().union(*(p.sent for p in producers))
        node.start()
        r = node.client(protocol=2)
        present = jscan_all(r)
        missing = set(acked) - present
        assert not missing, f"seed {seed}: {len(missing)} acknowledged jobs lost"
        delivered = drain_queue(r, [f"queue-{i}" for i in range(4)], len(present))
        assert set(acked) <= set(delivered), f"seed {seed}: not every job was delivered"
        for job_id, body in acked.items():
            assert delivered[job_id] == body
        invented = [b for b in delivered.values() if b not in sent]
        assert not invented, f"seed {seed}: jobs nobody added: {invented[:3]}"
        assert len(set(delivered.values())) == len(delivered), "one body, one job"
    finally:
        node.stop()


def _queues_state(r: redis.Redis, queues: list[str]) -> dict[str, list[str]]:
    return {q: [e[1].decode() for e in r.execute_command("QPEEK", q, 1000)] for q in queues}


def test_controlled_restart_keeps_queues_and_their_order(tmp_path: Path) -> None:
    node = NodeProc(tmp_path, workers=2).start()  # AOF off: the controlled restart needs none
    try:
        r = node.client(protocol=2)
        queues = [f"cq{i}" for i in range(4)]
        for n in range(30):
            # RETRY 300: a delivered job must not be queued again while the test runs
            r.execute_command("ADDJOB", queues[n % 4], f"b{n}", 0, "RETRY", 300)
        r.execute_command("GETJOB", "COUNT", 3, "FROM", "cq0")  # delivered: not queued now
        r.execute_command("GETJOB", "COUNT", 2, "FROM", "cq3")
        before = _queues_state(r, queues)
        assert before["cq0"] and before["cq3"]
        assert r.execute_command("CONFIG", "SET", "aof-enqueue-jobs-once", "yes") in (b"OK", "OK", True)
        r.execute_command("CONFIG", "REWRITE")
        try:
            r.execute_command("SHUTDOWN", "REWRITE-AOF")
        except (redis.ConnectionError, redis.TimeoutError):
            pass
        assert node.wait_exit() == 0, node.output()
        assert "aof-enqueue-jobs-once yes" in node.conf_path.read_text()
        node.conf["aof-enqueue-jobs-once"] = "yes"  # NodeProc rewrites the file on start
        node.start()
        r = node.client(protocol=2)
        assert _queues_state(r, queues) == before, node.output()
        assert r.execute_command("CONFIG", "GET", "aof-enqueue-jobs-once")[1] in (b"no", "no")
        node.wait_for(lambda: "aof-enqueue-jobs-once yes" not in node.conf_path.read_text(),
                      what="aof-enqueue-jobs-once turned off in the config file")
    finally:
        node.stop()


@pytest.mark.parametrize("before,after", [(2, 1), (1, 2)])
def test_restart_with_another_worker_count_keeps_every_job(tmp_path: Path, before: int,
                                                           after: int) -> None:
    node = NodeProc(tmp_path, workers=before, conf={"appendonly": "yes"}).start()
    try:
        r = node.client(protocol=2)
        ids = {r.execute_command("ADDJOB", f"wq{n % 7}", f"b{n}", 0).decode()
               for n in range(60)}
        node.stop()
        node.workers = after
        node.start()
        r = node.client(protocol=2)
        assert jscan_all(r) == ids
        assert all(show_body(r, j) is not None for j in ids)
    finally:
        node.stop()


def make_run_options(port: int, run_dir: Path) -> list[str]:
    """The options `make run` gives the node, read from the Makefile itself (a dry run:
    nothing is built or started)."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make here")
    out = subprocess.run([make, "-s", "-n", "-o", ".venv/.compiled", "-o", ".venv/.base", "run",
                          f"PORT={port}", f"RUN_DIR={run_dir}", "HTTP_PORT=0"], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    (line,) = [ln for ln in out.splitlines() if ln.startswith(".venv/bin/disque-mp ")]
    return shlex.split(line)[1:]


def test_make_run_keeps_its_jobs_across_ctrl_c(tmp_path: Path) -> None:
    """The node a newcomer starts first keeps its queued jobs through Ctrl-C and a second
    `make run`, and says so at start; a node started without options says they are lost."""
    port = free_port()
    options = make_run_options(port, tmp_path)
    assert ["--appendonly", "yes"] == options[options.index("--appendonly"):][:2]
    node = NodeProc(tmp_path, port=port, workers=2, args=options).start()
    try:
        r = node.client(protocol=2)
        # RETRY 1: a reloaded job is queued again after its retry (Disque's rule), so soon
        ids = {r.execute_command("ADDJOB", f"mq{n % 5}", f"b{n}", 0, "RETRY", 1).decode()
               for n in range(35)}
        assert f"persistence: AOF {tmp_path}/appendonly-w*-g*.aof" in node.log_text()
        assert "fsync everysec: a restart keeps every job" in node.log_text()
        os.killpg(node.pgid or 0, signal.SIGINT)  # what the terminal sends on Ctrl-C
        assert node.wait_exit() == 0, node.output()
        node.start()
        r = node.client(protocol=2)
        assert jscan_all(r) == ids
        node.wait_for(lambda: sum(r.execute_command("QLEN", f"mq{n}") for n in range(5)) == 35,
                      what="the 35 jobs queued again")
        assert sorted(drain_queue(r, [f"mq{n}" for n in range(5)], 35).values()) == sorted(
            f"b{n}".encode() for n in range(35))
    finally:
        node.stop()


def _fill_and_damage(tmp_path: Path, conf: dict[str, str]) -> tuple[NodeProc, set[str], Path, int]:
    node = NodeProc(tmp_path, workers=1, conf={"appendonly": "yes", **conf}).start()
    r = node.client(protocol=2)
    ids = {r.execute_command("ADDJOB", "dq", f"b{n}", 0).decode() for n in range(10)}
    node.stop()
    (path,) = tmp_path.glob("appendonly-w0-g*.aof")
    good = path.stat().st_size
    with open(path, "ab") as f:
        f.write(aof_format.frame(b"\x01" + b"x" * 99)[:37])  # a record torn by a crash
    return node, ids, path, good


def test_damaged_tail_is_cut_with_a_log_line(tmp_path: Path) -> None:
    node, ids, path, good = _fill_and_damage(tmp_path, {"aof-load-truncated": "yes"})
    try:
        node.start()
        assert jscan_all(node.client(protocol=2)) == ids
        assert path.stat().st_size == good
        assert f"AOF truncated at offset {good}" in node.log_text()
    finally:
        node.stop()


def test_damaged_tail_refused_with_aof_load_truncated_no(tmp_path: Path) -> None:
    node, _, path, good = _fill_and_damage(tmp_path, {"aof-load-truncated": "no"})
    try:
        with pytest.raises((RuntimeError, TimeoutError)):
            node.start()
        text = node.output()
        assert f"Truncated append only file {path}" in text and f"offset {good}" in text
        assert path.stat().st_size > good, "nothing was cut"
    finally:
        node.stop()


def test_injected_write_error_refuses_jobs_it_could_not_log(tmp_path: Path) -> None:
    fault = tmp_path / "aof-fault"
    node = NodeProc(tmp_path / "n", workers=2, conf=ALWAYS,
                    env={aof_format.FAULT_ENV: str(fault)}).start()
    try:
        r = node.client(protocol=2)
        good = r.execute_command("ADDJOB", "fq", "before", 0).decode()
        q0, q1 = (next(f"aq{n}" for n in range(100) if owner_of_queue(f"aq{n}".encode(), 2) == w)
                  for w in (0, 1))
        spread = [r.execute_command("ADDJOB", q, "to-ack", 0).decode() for q in (q0, q1)]
        fault.write_text("ENOSPC")
        with pytest.raises(redis.ResponseError) as e:
            r.execute_command("ADDJOB", "fq", "during", 0)
        assert str(e.value).startswith("Error writing to the AOF: No space left on device")
        with pytest.raises(redis.ResponseError) as e:  # IDs of both workers: split and merged
            r.execute_command("ACKJOB", *spread)
        assert str(e.value).startswith("Error writing to the AOF")
        assert info_persistence(r)["aof_last_write_status"] == "err"
        assert "Error writing to the AOF file" in node.log_text()
        fault.unlink()
        node.wait_for(lambda: info_persistence(r)["aof_last_write_status"] == "ok",
                      what="the write error clears")
        after = r.execute_command("ADDJOB", "fq", "after", 0).decode()
        node.kill_group()
        node.start()
        present = jscan_all(node.client(protocol=2))
        assert {good, after} <= present
    finally:
        node.stop()


def _mount_tmpfs(target: Path, size: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    target.mkdir(parents=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(target)],
                          capture_output=True).returncode == 0


def test_full_disk_on_a_small_tmpfs(tmp_path: Path) -> None:
    """A real full file system: the node keeps serving, answers the AOF error for
    jobs it could not log, and every job it acknowledged survives a SIGKILL."""
    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt, "256k"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    node = NodeProc(mnt, workers=1, conf={**ALWAYS, "logfile": str(tmp_path / "log")})
    try:
        node.start()
        r = node.client(protocol=2)
        acked: set[str] = set()
        refused = 0
        for n in range(100):
            try:
                acked.add(r.execute_command("ADDJOB", "tq", b"%d" % n + b"x" * 8000, 0).decode())
            except redis.ResponseError as e:
                assert str(e).startswith("Error writing to the AOF")
                refused += 1
        assert refused and acked
        assert r.ping()
        node.kill_group()
        node.start()
        assert acked <= jscan_all(node.client(protocol=2))
    finally:
        node.stop()
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_bgrewriteaof_and_appendonly_at_runtime(tmp_path: Path) -> None:
    node = NodeProc(tmp_path, workers=2).start()
    try:
        r = node.client(protocol=2)
        ids = {r.execute_command("ADDJOB", f"rq{n % 5}", f"b{n}", 0).decode() for n in range(40)}
        assert info_persistence(r)["aof_state"] == "off"
        r.execute_command("CONFIG", "SET", "appendonly", "yes")
        node.wait_for(lambda: info_persistence(r)["aof_state"] == "on", what="aof_state on")
        assert len(list(tmp_path.glob("appendonly-w*-g*.aof"))) == 2
        assert raw_command(node.port, b"BGREWRITEAOF") == (
            b"+Background append only file rewriting started\r\n")
        node.wait_for(lambda: info_persistence(r)["aof_rewrite_in_progress"] == "0",
                      what="rewrite done")
        assert info_persistence(r)["aof_last_bgrewrite_status"] == "ok"
        node.kill_group()
        node.conf["appendonly"] = "yes"
        node.start()
        assert jscan_all(node.client(protocol=2)) == ids
    finally:
        node.stop()


def test_debug_flushall_is_not_undone_by_a_restart(tmp_path: Path) -> None:
    """DEBUG FLUSHALL writes no record per job; the AOF must still forget them."""
    node = NodeProc(tmp_path, workers=2, conf={"appendonly": "yes"}).start()
    try:
        r = node.client(protocol=2)
        for n in range(20):
            r.execute_command("ADDJOB", f"fq{n % 5}", f"b{n}", 0)
        assert r.execute_command("DEBUG", "FLUSHALL") in (b"OK", "OK", True)
        kept = r.execute_command("ADDJOB", "fq0", "after", 0).decode()
        node.stop()
        node.start()
        r = node.client(protocol=2)
        assert jscan_all(r) == {kept}
    finally:
        node.stop()
