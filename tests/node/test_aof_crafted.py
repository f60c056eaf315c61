"""Crafted AOFs: records with sound frames that lie. Each either loads into a
consistent shard (``Shard.check``: every cross-structure invariant) or is refused
with its offset and why, never a crash; with ``aof-load-corrupt skip`` the liar
is dropped and the rest loads. Then real nodes on such files: a refusal stops
the node (the supervisor gives up, no restart loop), ``skip`` starts it."""

from __future__ import annotations

import os
import random
import signal
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from disque_mp.node.aof_load import AofLoadError, ShardAdapter, load_slots
from disque_mp.node.config import Config
from disque_mp.tools import check_aof
from tests.node.test_aof_file import write_aof
from tests.nodeproc import NodeProc
from workers.federation import peer_job
from workers.ids import DEAD_PREFIX, JobIdGen, owner_of_slot, slot_of
from workers.job import ACTIVE, QUEUED, Job, JobExt, del_record, ttl_max_s
from workers.shard import Shard

NODE = "a1b2c3d4" * 5
NOW_MS = int(time.time() * 1000)
_ids = JobIdGen(NODE, b"crafted")


def job(queue: bytes = b"q", body: bytes = b"b", slot: int | None = None,
        **fields: object) -> Job:
    jid = _ids.make(slot_of(queue) if slot is None else slot, 3600, 60)
    j = Job(jid, queue, body, QUEUED, 1, 3600, NOW_MS * 1000, 0, 60, 0, (NODE,))
    for name, value in fields.items():
        setattr(j, name, value)
    return j


def patched(rec: bytes, fmt: str, at: int, value: int) -> bytes:
    """``rec`` with one fixed field of its head replaced (big endian)."""
    out = bytearray(rec)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def _queue_of(worker: int) -> bytes:
    """A queue name whose slot ``worker`` (of 2) owns."""
    for n in range(1000):
        q = f"w{worker}-{n}".encode()
        if owner_of_slot(slot_of(q), 2) == worker:
            return q
    raise AssertionError(f"no queue of worker {worker}")


# (name, the lying record) refused by the loader; the head is ">BBBHQQQQQQQHHHII":
# state at byte 1, ttl_s at 5, the body length at 71.
REFUSED: list[tuple[str, Callable[[], bytes]]] = [
    ("illegal-state", lambda: patched(job().to_record(), ">B", 1, 9)),
    ("absurd-ttl", lambda: patched(job().to_record(), ">Q", 5, ttl_max_s + 1)),
    ("body-past-the-record", lambda: patched(job().to_record(), ">I", 71, 1 << 20)),
    ("id-slot-not-its-queue", lambda: job(queue=_queue_of(1), slot=0).to_record()),
    ("bad-id-shape", lambda: Job("D-nope", b"q", b"b", QUEUED, 1, 3600, NOW_MS * 1000, 0, 60,
                                 0, (NODE,)).to_record()),
    ("no-node", lambda: job(delivered=()).to_record()),
    ("no-replication", lambda: job(repl=0).to_record()),
]


def _load(tmp_path: Path, records: list[bytes], corrupt: str = "refuse",
          workers: int = 1) -> tuple[Shard, int]:
    write_aof(tmp_path, records, workers=workers)
    cfg = Config(dir=str(tmp_path), appendonly=True, aof_load_corrupt=corrupt)
    shard = Shard(NODE, 0, workers, b"seed", random.Random(1), NOW_MS)
    got = load_slots(cfg, workers, 0, ShardAdapter(shard), NOW_MS)
    shard.check()
    return shard, got.records


@pytest.mark.parametrize(("name", "liar"), REFUSED, ids=[n for n, _ in REFUSED])
def test_a_lying_record_is_refused_or_skipped(tmp_path: Path, name: str,
                                              liar: Callable[[], bytes]) -> None:
    good = [job(body=f"g{i}".encode()) for i in range(5)]
    records = [good[0].to_record(), good[1].to_record(), liar(),
               *(j.to_record() for j in good[2:])]
    with pytest.raises(AofLoadError) as info:
        _load(tmp_path, records)
    text = str(info.value)
    assert "Bad record in the append only file" in text and "at offset " in text, text
    assert "disque-mp check-aof --fix" in text and "aof-load-corrupt skip" in text
    shard, loaded = _load(tmp_path, records, "skip")
    assert loaded == 5 and sorted(j.id for j in shard.jobs()) == sorted(j.id for j in good)


def test_lies_that_load_leave_a_consistent_shard(tmp_path: Path) -> None:
    """A job in two queues (its last record wins), two jobs with one DEDUP key, a
    deletion of a job never seen, an ACKed job with no other copy, an expired one,
    and a record of another worker's slot: all consistent after loading."""
    q = _queue_of(0)
    two = job(queue=q)
    dead = Job(two.id, DEAD_PREFIX + q, b"b", QUEUED, 1, 3600, two.ctime_us, 0, 60, 0,
               (NODE,))
    d1, d2 = job(queue=q, body=b"d1"), job(queue=q, body=b"d2")
    d1.ext, d2.ext = JobExt(dedup=b"k"), JobExt(dedup=b"k")
    theirs = job(queue=_queue_of(1))
    expired = job(queue=q, ctime_us=(NOW_MS - 7_200_000) * 1000)
    future = job(queue=q, ctime_us=(NOW_MS + 30 * 86_400_000) * 1000)  # a clock that lies
    records = [two.to_record(), dead.to_record(), d1.to_record(), d2.to_record(),
               del_record(job(queue=q).id), expired.to_record(), theirs.to_record(),
               future.to_record()]
    shard, loaded = _load(tmp_path, records, workers=2)
    assert loaded == 7  # the record of worker 1's slot is not ours
    moved = shard.lookup(two.id)
    assert moved is not None and moved.queue == DEAD_PREFIX + q
    assert shard.lookup(theirs.id) is None and shard.lookup(expired.id) is None
    assert {j.id for j in shard.jobs()} == {two.id, d1.id, d2.id, future.id}
    assert all(j.state == ACTIVE for j in shard.jobs())
    new_id = shard.op_addjob(q, b"n", timeout_ms=0, replicate=None, delay_s=0, retry_s=None,
                             ttl_s=60, maxlen=0, async_=False, token=0, now_ms=NOW_MS)
    made = shard.lookup(str(new_id))
    assert made is not None and made.ctime_us < future.ctime_us, "new jobs keep our clock"
    shard.check()


def _node_with(tmp_path: Path, records: list[bytes], conf: dict[str, str]) -> NodeProc:
    write_aof(tmp_path, records)
    return NodeProc(tmp_path, workers=1, conf={"appendonly": "yes", **conf})


@pytest.mark.integration
def test_a_node_refuses_a_lying_file_once_then_skip_starts_it(tmp_path: Path) -> None:
    good = [job(queue=b"cq", body=f"g{i}".encode(), retry_s=1) for i in range(3)]
    liar = patched(job(queue=b"cq").to_record(), ">I", 71, 1 << 20)
    records = [good[0].to_record(), liar, good[1].to_record(), good[2].to_record()]
    node = _node_with(tmp_path, records, {})
    try:
        with pytest.raises((RuntimeError, TimeoutError)):
            node.start()
        assert node.wait_exit(30) == 1, "the supervisor stopped the node: no restart loop"
        text = node.output()
        assert "Bad record in the append only file" in text and "job record truncated" in text
        assert "Worker W0 refused its AOF" in text
        assert node.log_text().count("Fatal error loading the AOF") == 1, "started once"
        node.conf["aof-load-corrupt"] = "skip"
        node.start()
        r = node.client(protocol=2)
        for j in good:
            assert r.execute_command("SHOW", j.id), j.id
        assert "records dropped" in node.log_text()
    finally:
        node.stop()


@pytest.mark.parametrize(("name", "liar"), REFUSED[4:], ids=[n for n, _ in REFUSED[4:]])
def test_a_peer_record_the_loader_would_refuse_is_dropped(name: str,
                                                          liar: Callable[[], bytes]) -> None:
    """What a node keeps from a peer (REPLJOB, YOURJOBS) it can load again."""
    assert peer_job(job().to_record()) is not None
    assert peer_job(liar()) is None


@pytest.mark.integration
def test_a_worker_restarted_into_a_refused_file_stops_the_node(tmp_path: Path) -> None:
    """After the node was ready: a worker dies, its file was damaged meanwhile, the
    restarted worker refuses it once and the supervisor stops the node (before, it
    restarted the worker every 5 s for ever)."""
    node = NodeProc(tmp_path, workers=1, conf={"appendonly": "yes"}).start()
    try:
        r = node.client(protocol=2)
        for i in range(10):
            r.execute_command("ADDJOB", "rq", f"b{i}", 0)
        r.close()
        (path,) = tmp_path.glob("appendonly-w0-g*.aof")
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x40  # a record in the middle: not a torn tail
        path.write_bytes(bytes(data))
        for pid in node.worker_pids():
            os.kill(pid, signal.SIGKILL)
        assert node.wait_exit(60) == 1, "the supervisor stopped the node"
        log = node.log_text()
        assert "Worker W0 refused its AOF" in log and "checksum mismatch" in log
        assert log.count("Fatal error loading the AOF") == 1, "restarted once, not in a loop"
    finally:
        node.stop()


def test_check_aof_finds_the_record_the_loader_refuses(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    good = job().to_record()
    path = write_aof(tmp_path, [good, job(repl=0).to_record(), good])
    assert check_aof.main([str(path)]) == 1
    out = capsys.readouterr().out
    assert "record does not decode: job " in out and "replication level 0" in out
