"""AofManager over a real shard: commit under write faults, chunked rewrite while
jobs change, CONFIG SET appendonly, INFO fields, loading across worker counts."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from disque_mp.node import aof, aof_format
from disque_mp.node.aof import AofManager, ShardAdapter
from disque_mp.node.aof_format import FileHeader, RecordReader
from disque_mp.node.commands.table import run_on_shard
from disque_mp.node.config import Config
from workers.effects import AofAppend
from workers.ids import owner_of_job_id, owner_of_queue
from workers.job import DEL_RECORD_TAG, Job, del_record, job_id_of_record
from workers.replies import Error
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
    mgr.append(job.to_record() if job else del_record(job_id))


def file_state(path: str) -> dict[str, bytes | None]:
    """Replay a file: job ID -> its last record (None = deleted)."""
    state: dict[str, bytes | None] = {}
    frames = iter(RecordReader(path))
    next(frames)
    for payload in frames:
        jid = job_id_of_record(payload)
        state[jid] = None if payload[0] == DEL_RECORD_TAG else payload
    return state


def open_manager(tmp_path: Path, shard: Shard, **kw: object) -> AofManager:
    mgr = AofManager(make_cfg(tmp_path, **kw), 0, ShardAdapter(shard))
    mgr.apply_config()  # appendonly yes at runtime: wait_rewrite, then a rewrite
    assert mgr.state == "wait_rewrite"
    mgr.rewrite_now()
    assert mgr.state == "on" and mgr.writer is not None
    return mgr


@pytest.fixture
def fault(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file that, while it exists, makes the AOF's writes fail with the errno it names."""
    path = tmp_path / "fault"
    monkeypatch.setattr(aof_format, "_fault_path", str(path))
    return path


def test_commit_refuses_with_always_while_writes_fail(tmp_path: Path, fault: Path) -> None:
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


def test_commit_with_everysec_does_not_refuse(tmp_path: Path, fault: Path) -> None:
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
    while mgr.rewriter.current is not None:
        mgr.rewriter.step(37)
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
    while mgr.tick() == 0.0 or mgr.rewriter.current is not None:
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
    assert aof_format.read_header(mgr.writer.path) == FileHeader(1, 1, 0)
    assert [Job.from_record(r) for r in file_state(mgr.writer.path).values() if r] == []


# --- loading ---


def queue_of(index: int, workers: int, n: int = 0) -> bytes:
    """The n-th queue name owned by worker ``index`` of ``workers``."""
    found = [q for q in (b"q%d" % i for i in range(1000)) if owner_of_queue(q, workers) == index]
    return found[n]


def start(tmp_path: Path, index: int, workers: int, now_ms: int = NOW_MS,
          **kw: object) -> tuple[Shard, AofManager]:
    shard = Shard(NODE, index, workers, b"seed%d" % workers, random.Random(index), now_ms)
    cfg = make_cfg(tmp_path, workers=workers, **kw)
    mgr = AofManager(cfg, index, ShardAdapter(shard))
    mgr.load(now_ms)
    return shard, mgr


def add_logged(shard: Shard, mgr: AofManager, queue: bytes, retry_s: int = 60) -> str:
    reply = shard.op_addjob(queue, b"body", timeout_ms=0, replicate=None, delay_s=0,
                            retry_s=retry_s, ttl_s=3600, maxlen=0, async_=False, token=0,
                            now_ms=NOW_MS)
    drain(shard, mgr)
    log_state(shard, mgr, str(reply))
    return str(reply)


@pytest.mark.parametrize("before,after", [(2, 1), (1, 2), (2, 3)])
def test_restart_with_another_worker_count_keeps_every_job(tmp_path: Path, before: int,
                                                           after: int) -> None:
    expected: set[str] = set()
    for i in range(before):
        shard, mgr = start(tmp_path, i, before)
        for n in range(3):
            for _ in range(4):
                expected.add(add_logged(shard, mgr, queue_of(i, before, n)))
        assert mgr.shutdown(rewrite=False) == ""
    got: set[str] = set()
    for i in range(after):  # workers start one after the other, as a worst case for files
        shard, mgr = start(tmp_path, i, after)
        ids = {j.id for j in shard.jobs()}
        assert all(owner_of_job_id(j, after) == i for j in ids)
        got |= ids
        mgr.shutdown(rewrite=False)
    assert got == expected
    names = sorted(p.name for p in tmp_path.glob("*.aof"))
    assert len(names) == after, f"superseded files removed: {names}"
    got = set()
    for i in range(after):  # and once more: the files written after the change load alone
        shard, mgr = start(tmp_path, i, after)
        got |= {j.id for j in shard.jobs()}
        mgr.shutdown(rewrite=False)
    assert got == expected


def test_deleted_and_acked_jobs_stay_gone(tmp_path: Path) -> None:
    shard, mgr = start(tmp_path, 0, 1)
    q = queue_of(0, 1)
    keep, deleted, acked = (add_logged(shard, mgr, q) for _ in range(3))
    shard.op_deljob([deleted], NOW_MS)
    log_state(shard, mgr, deleted)
    shard.op_ackjob([acked], NOW_MS)
    log_state(shard, mgr, acked)
    mgr.shutdown(rewrite=False)
    shard, mgr = start(tmp_path, 0, 1)
    assert {j.id for j in shard.jobs()} == {keep}


def test_normal_restart_loads_jobs_active_and_the_retry_timer_queues_them(tmp_path: Path) -> None:
    shard, mgr = start(tmp_path, 0, 1)
    q = queue_of(0, 1)
    ids = [add_logged(shard, mgr, q, retry_s=5) for _ in range(3)]
    once = add_logged(shard, mgr, q, retry_s=0)  # at-most-once: queued exactly once
    assert shard.op_qlen(q) == 4
    mgr.shutdown(rewrite=False)
    shard, mgr = start(tmp_path, 0, 1)
    assert shard.op_qlen(q) == 0
    assert {j.id for j in shard.jobs()} == set(ids) | {once}
    shard.tick(NOW_MS + 5000 + 1000)
    assert shard.op_qlen(q) == 3, "requeued by their retry timer; the RETRY 0 job is not"
    shard.check()


def test_controlled_restart_keeps_queues_and_their_order(tmp_path: Path) -> None:
    shard, mgr = start(tmp_path, 0, 1)
    q = queue_of(0, 1)
    ids = [add_logged(shard, mgr, q) for _ in range(20)]
    taken = shard.op_take([q], 5, False, NOW_MS)  # 5 delivered: active, not queued
    assert len(taken) == 5
    order = [str(e[1]) for e in shard.op_qpeek(q, 100)]
    assert order == ids[5:]
    mgr.cfg.aof_enqueue_jobs_once = True
    assert mgr.shutdown(rewrite=True) == ""  # SHUTDOWN REWRITE-AOF
    shard, mgr = start(tmp_path, 0, 1, aof_enqueue_jobs_once=True)
    assert [str(e[1]) for e in shard.op_qpeek(q, 100)] == order
    assert len(shard.jobs()) == 20
    assert mgr.cfg.aof_enqueue_jobs_once is False, "the option turns itself off"
    shard.check()


def test_enqueue_once_loads_even_with_appendonly_off(tmp_path: Path) -> None:
    shard, mgr = start(tmp_path, 0, 1, appendonly=False)
    q = queue_of(0, 1)
    ids = [str(shard.op_addjob(q, b"b", timeout_ms=0, replicate=None, delay_s=0, retry_s=None,
                               ttl_s=3600, maxlen=0, async_=False, token=0, now_ms=NOW_MS))
           for _ in range(3)]
    assert mgr.shutdown(rewrite=True) == ""  # writes a fresh AOF although appendonly is no
    shard, mgr = start(tmp_path, 0, 1, appendonly=False, aof_enqueue_jobs_once=True)
    assert [str(e[1]) for e in shard.op_qpeek(q, 10)] == ids
    assert mgr.state == "off"


def _torn(tmp_path: Path) -> tuple[Path, int, set[str]]:
    shard, mgr = start(tmp_path, 0, 1)
    q = queue_of(0, 1)
    ids = {add_logged(shard, mgr, q) for _ in range(5)}
    mgr.shutdown(rewrite=False)
    path = Path(mgr.writer.path)
    good = path.stat().st_size
    with open(path, "ab") as f:
        f.write(aof_format.frame(b"\x01" * 90)[:50])  # a record torn by a crash
    return path, good, ids


def test_truncated_tail_is_cut_with_a_log_line(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    path, good, ids = _torn(tmp_path)
    with caplog.at_level("WARNING", logger="disque_mp.node.aof"):
        shard, mgr = start(tmp_path, 0, 1)
    assert {j.id for j in shard.jobs()} == ids
    assert path.stat().st_size == good
    assert f"AOF truncated at offset {good}" in caplog.text


def test_truncated_tail_refused_with_aof_load_truncated_no(tmp_path: Path) -> None:
    path, good, _ = _torn(tmp_path)
    with pytest.raises(aof.AofLoadError) as e:
        start(tmp_path, 0, 1, aof_load_truncated=False)
    assert str(path) in str(e.value) and f"offset {good}" in str(e.value)
    assert "aof-load-truncated" in str(e.value)
    assert path.stat().st_size > good, "nothing cut"


def test_damage_in_the_middle_is_always_refused(tmp_path: Path) -> None:
    shard, mgr = start(tmp_path, 0, 1)
    for _ in range(5):
        add_logged(shard, mgr, queue_of(0, 1))
    mgr.shutdown(rewrite=False)
    path = Path(mgr.writer.path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(aof.AofLoadError) as e:
        start(tmp_path, 0, 1)
    assert "check-aof --fix" in str(e.value)


def test_the_shard_logs_its_own_changes_and_they_replay_to_the_same_jobs(
        tmp_path: Path) -> None:
    """No manual logging here: the real command layer, the shard's own AofAppend
    effects (switched on by the manager), a restart."""

    shard, mgr = start(tmp_path, 0, 1)
    assert shard.aof is True

    def run(*words: bytes) -> object:
        reply = run_on_shard(shard, words[0], list(words[1:]), 0, NOW_MS)
        drain(shard, mgr)
        return reply

    ids = [str(run(b"addjob", b"cq", b"body%d" % n, b"0")) for n in range(6)]
    run(b"ackjob", ids[0].encode())
    run(b"deljob", ids[3].encode(), b"not-an-id")  # -BADID: nothing deleted, nothing logged
    run(b"deljob", ids[1].encode())
    run(b"fastack", ids[2].encode())
    run(b"getjob", b"from", b"cq")
    run(b"nack", ids[3].encode())
    run(b"addjob", b"cq", b"x", b"0", b"DELAY", b"99999")  # an error: nothing logged
    mgr.commit()
    state = {k: v for k, v in file_state(mgr.writer.path).items() if v is not None}
    assert state == {j.id: j.to_record() for j in shard.jobs()}
    assert set(state) == set(ids[3:])
    mgr.shutdown(rewrite=False)
    shard2, _ = start(tmp_path, 0, 1)
    assert {j.id for j in shard2.jobs()} == set(ids[3:])
    shard2.check()


def test_logging_follows_the_aof_state(tmp_path: Path) -> None:
    shard, mgr = start(tmp_path, 0, 1, appendonly=False)
    assert shard.aof is False
    mgr.cfg.appendonly = True
    mgr.apply_config()
    assert shard.aof is True, "wait_rewrite: the rewrite's tail needs the records"
    mgr.rewrite_now()
    mgr.cfg.appendonly = False
    mgr.apply_config()
    assert shard.aof is False


def test_bgrewriteaof_with_appendonly_no_writes_a_file_but_stays_off(tmp_path: Path) -> None:
    shard, mgr = start(tmp_path, 0, 1, appendonly=False)
    q = queue_of(0, 1)
    ids = {add_logged(shard, mgr, q) for _ in range(3)}
    assert mgr.bgrewriteaof() == "Background append only file rewriting started"
    late = add_logged(shard, mgr, q)  # during the rewrite: kept in its tail
    while mgr.rewriter.current is not None:
        mgr.tick()
    assert mgr.state == "off" and mgr.writer is None
    (path,) = tmp_path.glob("appendonly-w0-g*.aof")
    assert set(file_state(str(path))) == ids | {late}


def test_records_dropped_past_the_pending_bound_are_healed_by_a_rewrite(
        tmp_path: Path, fault: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aof, "pending_bytes_max", 300)
    shard, mgr = start(tmp_path, 0, 1, appendfsync="always")
    fault.write_text("ENOSPC")
    for _ in range(10):  # far more than 300 bytes of records: most are dropped
        add_logged(shard, mgr, queue_of(0, 1))
        assert not mgr.commit()
    fault.unlink()
    assert not mgr.commit(), "dropped records: still an error, once"
    assert mgr.rewriter.scheduled
    while mgr.tick() == 0.0 or mgr.rewriter.current is not None or mgr.rewriter.scheduled:
        pass
    assert dict(mgr.info())["aof_last_write_status"] == "ok"
    state = {k: v for k, v in file_state(mgr.writer.path).items() if v is not None}
    assert state == {j.id: j.to_record() for j in shard.jobs()}
    assert len(state) == 10


def test_flushall_leaves_nothing_to_reload(tmp_path: Path) -> None:
    shard, mgr = start(tmp_path, 0, 1)
    for _ in range(5):
        add_logged(shard, mgr, queue_of(0, 1))
    mgr.commit()
    shard.op_flushall()
    mgr.flushed()
    mgr.shutdown(rewrite=False)
    shard2, _ = start(tmp_path, 0, 1)
    assert shard2.jobs() == []


def test_group_commit_in_a_loop_releases_held_replies_after_the_fsync(
        tmp_path: Path, fault: Path) -> None:
    """appendfsync always with a running loop: the fsync runs in the fsync thread;
    held replies come out after it (or as the AOF error when it fails)."""
    import asyncio

    shard, mgr = start(tmp_path, 0, 1, appendfsync="always")
    out: list[object] = []

    async def scenario() -> None:
        task = asyncio.get_running_loop().create_task(mgr.run())
        for n in range(3):  # three "connections" in one loop turn: one fsync for all
            before = mgr.appended
            add_logged(shard, mgr, queue_of(0, 1))
            assert mgr.appended > before
            mgr.hold(mgr.appended, out.append, f"ok{n}")
        assert out == [], "nothing leaves before the commit"
        while len(out) < 3:
            await asyncio.sleep(0.01)
        fault.write_text("EIO")
        add_logged(shard, mgr, queue_of(0, 1))
        mgr.hold(mgr.appended, out.append, "lost")
        while len(out) < 4:
            await asyncio.sleep(0.01)
        mgr.closed = True
        await task

    asyncio.run(scenario())
    assert out[:3] == ["ok0", "ok1", "ok2"]
    assert isinstance(out[3], Error) and out[3].startswith("ERR Error writing to the AOF")


def test_no_appendfsync_on_rewrite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(aof.os, "fdatasync", lambda fd: calls.append(fd))
    shard, mgr = start(tmp_path, 0, 1, appendfsync="always", no_appendfsync_on_rewrite=True)
    add_logged(shard, mgr, queue_of(0, 1))
    assert mgr.commit() and len(calls) == 1
    mgr.bgrewriteaof()
    add_logged(shard, mgr, queue_of(0, 1))
    assert mgr.commit() and len(calls) == 1, "no fsync while the rewrite runs"
    mgr.cfg.no_appendfsync_on_rewrite = False
    add_logged(shard, mgr, queue_of(0, 1))
    assert mgr.commit() and len(calls) == 2


def test_when_durable_waits_for_the_records_of_a_pending_reply(
        tmp_path: Path, fault: Path) -> None:
    shard, mgr = start(tmp_path, 0, 1, appendfsync="always")
    out: list[object] = []
    add_logged(shard, mgr, queue_of(0, 1))
    done = mgr.when_durable(out.append)  # the command answered PENDING
    done("early")  # the Wake came before any commit: held
    assert out == []
    mgr.turn_commit()
    assert out == ["early"]
    add_logged(shard, mgr, queue_of(0, 1))
    done = mgr.when_durable(out.append)
    fault.write_text("ENOSPC")
    mgr.turn_commit()  # fails: the later Wake must carry the error
    done("late")
    mgr.turn_commit()
    assert isinstance(out[1], Error)
