"""A disk that lies, in one node of a 3-node cluster (real nodes, real files).

The jobs are added on node A with REPLICATE 3, so B and C hold copies. A is
stopped, one kind of damage is written into its AOF, A is started again:

- a flipped byte and a zeroed block (damage with sound records after it): A
  refuses to start, naming the file, the offset and ``check-aof --fix``; with
  ``aof-load-corrupt skip`` it starts without the damaged records, logs how
  many were dropped and keeps the damaged file aside;
- a truncated tail: cut at the last sound record (``aof-load-truncated yes``,
  the default), with the offset in the log;

and in every case each acknowledged job is delivered by the cluster (A's
sound records, or B's and C's copies).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from disque_mp.node.aof_format import FRAME, RecordReader
from tests.nodeproc import NodeProc, cluster_form_timeout_s, running_cluster, unique_queue
from workers.job import DEL_RECORD_TAG, Job

pytestmark = pytest.mark.integration

jobs_per_case = 24
deliver_timeout_s = 60.0  # generous: the copies are queued again after RETRY 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProc]]:
    base = tmp_path_factory.mktemp("aofdamage")
    conf = {"appendonly": "yes", "appendfsync": "always", "cluster-node-timeout": 3000}
    nodes = [NodeProc(base / f"n{i}", workers=1, conf=dict(conf)) for i in range(3)]
    with running_cluster(nodes, cluster_form_timeout_s):
        yield nodes


def _add_jobs(a: NodeProc, queue: str) -> dict[str, bytes]:
    r = a.client(protocol=2)
    try:
        acked = {}
        for n in range(jobs_per_case):
            body = f"{queue}-{n}".encode()
            jid = r.execute_command("ADDJOB", queue, body, 0, "REPLICATE", 3, "RETRY", 1)
            acked[jid.decode()] = body
        return acked
    finally:
        r.close()


def _aof(a: NodeProc) -> Path:
    (path,) = a.dir.glob("appendonly-w0-g*.aof")
    return path


def _frames_of(path: Path, queue: str) -> list[tuple[int, int]]:
    """(offset, frame size) of each job record of ``queue`` in the file."""
    reader = RecordReader(str(path))
    out = []
    for i, payload in enumerate(reader):
        if i and payload[0] != DEL_RECORD_TAG and Job.from_record(payload).queue == queue.encode():
            out.append((reader.at, FRAME.size + len(payload)))
    return out


def _deliver_all(nodes: list[NodeProc], queue: str, want: set[str]) -> dict[str, bytes]:
    """GETJOB (and ACKJOB) on every node in turn until every job of ``want`` came."""
    clients = [n.client(protocol=2) for n in nodes]
    got: dict[str, bytes] = {}
    deadline = time.monotonic() + deliver_timeout_s
    try:
        while not want <= set(got) and time.monotonic() < deadline:
            for r in clients:
                reply = r.execute_command("GETJOB", "TIMEOUT", 100, "COUNT", 100, "FROM", queue)
                for _q, jid, body in reply or []:
                    got[jid.decode()] = body
                    r.execute_command("ACKJOB", jid)
    finally:
        for r in clients:
            r.close()
    return got


def _flip(path: Path, frames: list[tuple[int, int]]) -> int:
    off, size = frames[len(frames) // 2]
    data = bytearray(path.read_bytes())
    data[off + size // 2] ^= 0x10  # one bit in the record's payload
    path.write_bytes(bytes(data))
    return off


def _zero(path: Path, frames: list[tuple[int, int]]) -> int:
    off, _size = frames[len(frames) // 3]
    data = bytearray(path.read_bytes())
    data[off + 20 : off + 20 + 700] = bytes(700)  # a block over several records
    path.write_bytes(bytes(data))
    return off


def _case(cluster: list[NodeProc], damage: Callable[[Path, list[tuple[int, int]]], int]
          ) -> tuple[NodeProc, str, dict[str, bytes], Path, int]:
    a = cluster[0]
    queue = unique_queue("dmg")
    acked = _add_jobs(a, queue)
    a.stop()
    path = _aof(a)
    frames = _frames_of(path, queue)
    assert len(frames) >= jobs_per_case
    return a, queue, acked, path, damage(path, frames)


@pytest.mark.parametrize("damage", [_flip, _zero], ids=["flipped-byte", "zeroed-block"])
def test_damage_refuses_the_start_then_skip_loads_the_rest(
        cluster: list[NodeProc], damage: Callable[[Path, list[tuple[int, int]]], int]) -> None:
    a, queue, acked, path, off = _case(cluster, damage)
    try:
        with pytest.raises((RuntimeError, TimeoutError)):
            a.start()  # the supervisor gives up after the worker's refusals
        text = a.output()
        assert f"the append only file {path}" in text and f"at offset {off} " in text, text
        assert f"disque-mp check-aof --fix {path}" in text and "aof-load-corrupt skip" in text
        a.stop()
        a.conf["aof-load-corrupt"] = "skip"
        a.start()
        log = a.log_text()
        assert f"the append only file {path} is damaged" in log, log[-3000:]
        assert "records dropped" in log and f"at offset {off}," in log
        assert list(a.dir.glob(path.name + ".damaged-*")), "the damaged file is kept"
        got = _deliver_all(cluster, queue, set(acked))
        assert set(acked) <= set(got), f"{len(set(acked) - set(got))} acknowledged jobs lost"
        assert all(got[j] == body for j, body in acked.items())
    finally:
        a.conf.pop("aof-load-corrupt", None)
        a.stop()
        a.start()


def _truncate(path: Path, frames: list[tuple[int, int]]) -> int:
    off, size = frames[-1]
    with open(path, "r+b") as f:
        f.truncate(off + size // 2)  # a record torn by the crash
    return off


def test_truncated_tail_is_cut_and_the_cluster_delivers_every_job(
        cluster: list[NodeProc]) -> None:
    a, queue, acked, path, off = _case(cluster, _truncate)
    try:
        a.start()
        assert f"AOF truncated at offset {off}" in a.log_text()
        got = _deliver_all(cluster, queue, set(acked))
        assert set(acked) <= set(got), f"{len(set(acked) - set(got))} acknowledged jobs lost"
    finally:
        if a.proc is None or a.proc.poll() is not None:
            a.start()

