"""AofManager over a real shard: commit under write faults, chunked rewrite while
jobs change, CONFIG SET appendonly, INFO fields, loading across worker counts."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from disque_mp import aof
from disque_mp.aof import AofManager, FileHeader, FrameReader, ShardAdapter
from disque_mp.config import Config
from workers.effects import AofAppend
from workers.job import Job
from workers.shard import Shard

NODE = "0123abcd" * 5
NOW_MS = 1_700_000_000_000


def make_shard(index: int = 0, workers: int = 1) -> Shard:
    return Shard(NODE, index, workers, b"seed", random.Random(1), NOW_MS)


def make_cfg(tmp_path: Path, **kw: object) -> Config:
    cfg = Config(dir=str(tmp_path), appendonly=True, workers=1)
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


def add(shard: Shard, mgr: AofManager, queue: bytes = b"q", body: bytes = b"x") -> str:
    reply = shard.op_addjob(queue, body, timeout_ms=0, replicate=None, delay_s=0, retry_s=None,
                            ttl_s=3600, maxlen=0, async_=False, token=0, now_ms=NOW_MS)
    drain(shard, mgr)  # whatever the shard logs itself; tests also log_state() explicitly
    return str(reply)


def drain(shard: Shard, mgr: AofManager) -> int:
    """Route AofAppend effects as the worker does; returns how many."""
    n = 0
    for eff in shard.take_effects():
        if isinstance(eff, AofAppend):
            mgr.append(eff.record)
            n += 1
    return n


def log_state(shard: Shard, mgr: AofManager, job_id: str) -> None:
    """Append a job's current state (what the shard's AofAppend carries)."""
    job = shard.lookup(job_id)
    mgr.append(job.to_record() if job else bytes([aof.DEL_RECORD_TAG]) + job_id.encode())


def file_state(path: str) -> dict[str, bytes | None]:
    """Replay a file: job ID -> its last record (None = deleted)."""
    state: dict[str, bytes | None] = {}
    frames = iter(FrameReader(path))
    next(frames)
    for payload in frames:
        jid = aof.job_id_of_record(payload)
        state[jid] = None if payload[0] == aof.DEL_RECORD_TAG else payload
    return state


def open_manager(tmp_path: Path, shard: Shard, **kw: object) -> AofManager:
    mgr = AofManager(make_cfg(tmp_path, **kw), 0, ShardAdapter(shard))
    mgr.apply_config()  # appendonly yes at runtime: wait_rewrite, then a rewrite
    assert mgr.state == "wait_rewrite"
    mgr.rewrite_now()
    assert mgr.state == "on" and mgr.writer is not None
    return mgr


def test_commit_refuses_with_always_while_writes_fail(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fault = tmp_path / "fault"
    monkeypatch.setattr(aof, "_fault_path", str(fault))
    shard = make_shard()
    mgr = open_manager(tmp_path, shard, appendfsync="always")
    j1 = add(shard, mgr)
    log_state(shard, mgr, j1)
    assert mgr.commit() and mgr.durable == mgr.appended
    fault.write_text("EIO")
    j2 = add(shard, mgr)
    log_state(shard, mgr, j2)
    seq_j2 = mgr.appended
    assert not mgr.commit()
    assert seq_j2 > mgr.durable, "the reply of j2's command must become an error"
    assert mgr.error_reply().startswith("ERR Error writing to the AOF: Input/output error")
    assert dict(mgr.info())["aof_last_write_status"] == "err"
    fault.unlink()
    mgr.tick()  # the retry writes the kept records
    assert dict(mgr.info())["aof_last_write_status"] == "ok"
    assert mgr.durable == mgr.appended
    assert set(file_state(mgr.writer.path)) == {j1, j2}


def test_commit_with_everysec_does_not_refuse(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    fault = tmp_path / "fault"
    monkeypatch.setattr(aof, "_fault_path", str(fault))
    shard = make_shard()
    mgr = open_manager(tmp_path, shard, appendfsync="everysec")
    fault.write_text("ENOSPC")
    log_state(shard, mgr, add(shard, mgr))
    assert mgr.commit(), "everysec never refuses; the status says err"
    assert dict(mgr.info())["aof_last_write_status"] == "err"


def test_chunked_rewrite_while_jobs_change(tmp_path: Path) -> None:
    shard = make_shard()
    mgr = open_manager(tmp_path, shard)
    ids = [add(shard, mgr, body=b"%d" % i) for i in range(500)]
    for j in ids:
        log_state(shard, mgr, j)
    mgr.commit()
    old_path = mgr.writer.path
    assert mgr.bgrewriteaof() == "Background append only file rewriting started"
    assert mgr.bgrewriteaof().startswith("ERR Background append only file rewriting already")
    rng = random.Random(7)
    while mgr.rewrite is not None:
        mgr._rewrite_step(37)
        for _ in range(5):  # clients keep working between chunks
            op = rng.random()
            if op < 0.4:
                ids.append(add(shard, mgr))
                log_state(shard, mgr, ids[-1])
            elif op < 0.7 and ids:
                victim = ids.pop(rng.randrange(len(ids)))
                shard.op_deljob([victim], NOW_MS)
                log_state(shard, mgr, victim)
            elif ids:
                j = ids[rng.randrange(len(ids))]
                shard.op_ackjob([j], NOW_MS)
                log_state(shard, mgr, j)
        mgr.commit()
    assert mgr.writer.path != old_path and not Path(old_path).exists()
    state = {k: v for k, v in file_state(mgr.writer.path).items() if v is not None}
    live = {j.id: j.to_record() for j in shard.jobs()}
    assert state == live
    info = dict(mgr.info())
    assert info["aof_rewrite_in_progress"] == 0 and info["aof_last_bgrewrite_status"] == "ok"


def test_appendonly_no_closes_and_yes_rewrites(tmp_path: Path) -> None:
    shard = make_shard()
    mgr = open_manager(tmp_path, shard)
    j = add(shard, mgr)
    log_state(shard, mgr, j)
    mgr.cfg.appendonly = False
    mgr.apply_config()
    assert mgr.state == "off" and dict(mgr.info())["aof_enabled"] == 0
    k = add(shard, mgr)  # not logged while off
    log_state(shard, mgr, k)
    mgr.cfg.appendonly = True
    mgr.apply_config()
    info = dict(mgr.info())
    assert (info["aof_state"], info["aof_rewrite_scheduled"]) == ("wait_rewrite", 1)
    while mgr.tick() == 0.0 or mgr.state != "on":
        pass
    assert set(file_state(mgr.writer.path)) == {j, k}, "the rewrite took the jobs from memory"


def test_auto_rewrite_by_size(tmp_path: Path) -> None:
    shard = make_shard()
    mgr = open_manager(tmp_path, shard, auto_aof_rewrite_min_size=4096,
                       auto_aof_rewrite_percentage=100)
    j = add(shard, mgr, body=b"y" * 100)
    for _ in range(100):  # the same job logged again and again: the file grows, the state not
        log_state(shard, mgr, j)
    mgr.commit()
    big = mgr.writer.size
    assert big > 4096
    while mgr.tick() == 0.0 or mgr.rewrite is not None:
        pass
    assert mgr.writer.size < big / 10
    assert set(file_state(mgr.writer.path)) == {j}


def test_merge_info_and_bgrewrite() -> None:
    a = [("loading", 0), ("aof_enabled", 1), ("aof_state", "on"), ("aof_rewrite_in_progress", 0),
         ("aof_last_write_status", "ok"), ("aof_current_size", 10)]
    b = [("loading", 0), ("aof_enabled", 1), ("aof_state", "wait_rewrite"),
         ("aof_rewrite_in_progress", 1), ("aof_last_write_status", "err"), ("aof_current_size", 5)]
    merged = dict(aof.merge_info([a, b]))
    assert merged == {"loading": 0, "aof_enabled": 1, "aof_state": "wait_rewrite",
                      "aof_rewrite_in_progress": 1, "aof_last_write_status": "err",
                      "aof_current_size": 15}
    assert aof.merge_bgrewrite(["Background append only file rewriting started",
                                "ERR Background append only file rewriting already in progress"]
                               ).startswith("ERR")


def test_info_fields_match_the_reference_when_off(tmp_path: Path) -> None:
    mgr = AofManager(make_cfg(tmp_path, appendonly=False), 0, ShardAdapter(make_shard()))
    assert mgr.load(NOW_MS) == 0
    assert mgr.info() == [
        ("loading", 0), ("aof_enabled", 0), ("aof_state", "off"), ("aof_rewrite_in_progress", 0),
        ("aof_rewrite_scheduled", 0), ("aof_last_rewrite_time_sec", -1),
        ("aof_current_rewrite_time_sec", -1), ("aof_last_bgrewrite_status", "ok"),
        ("aof_last_write_status", "ok")]


def test_header_of_rewritten_file(tmp_path: Path) -> None:
    mgr = open_manager(tmp_path, make_shard())
    assert aof.read_header(mgr.writer.path) == FileHeader(1, 1, 0)
    assert [Job.from_record(r) for r in file_state(mgr.writer.path).values() if r] == []
