"""The AOF file layer: framing, torn and damaged tails, the writer, which file is
authoritative for which slot, and the check-aof tool."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disque_mp.node import aof_format
from disque_mp.node.aof_format import AofFile, AofWriter, FileHeader, RecordReader
from disque_mp.tools import check_aof as aof_check
from workers.ids import SLOTS, JobIdGen, slot_of
from workers.job import ACTIVE, Job, job_id_of_record

NODE = "a1b2c3d4" * 5


def job_records(n: int, body: bytes = b"body") -> list[bytes]:
    ids = JobIdGen(NODE, b"seed")
    out = []
    for i in range(n):
        q = f"q{i % 3}".encode()
        jid = ids.make(slot_of(q), 3600, 60)
        out.append(Job(jid, q, body + bytes([i % 256]), ACTIVE, 1, 3600, 10**15 + i, 0, 60,
                       0, (NODE,)).to_record())
    return out


def write_aof(directory: Path, records: list[bytes], gen: int = 1, workers: int = 1,
              index: int = 0) -> Path:
    name = aof_format.file_name("appendonly.aof", index, gen)
    path = aof_format.write_new_file(str(directory), name, FileHeader(gen, workers, index),
                              iter(records))
    return Path(path)


def read_all(path: Path) -> tuple[list[bytes], RecordReader]:
    reader = RecordReader(str(path))
    payloads = list(reader)
    return payloads[1:], reader


def test_roundtrip_and_header(tmp_path: Path) -> None:
    recs = job_records(50)
    path = write_aof(tmp_path, recs, gen=7, workers=3, index=2)
    assert path.name == "appendonly-w2-g7.aof"
    got, reader = read_all(path)
    assert got == recs
    assert reader.damage is None
    assert reader.good_bytes == reader.size == path.stat().st_size
    assert aof_format.read_header(str(path)) == FileHeader(7, 3, 2)
    assert not list(tmp_path.glob("temp-*")), "the temporary file was renamed into place"


def test_torn_tail_at_every_offset_of_the_last_record(tmp_path: Path) -> None:
    recs = job_records(5)
    path = write_aof(tmp_path, recs)
    data = path.read_bytes()
    last_start = len(data) - len(aof_format.frame(recs[-1]))
    torn = tmp_path / "torn.aof"
    for cut in range(last_start + 1, len(data)):
        torn.write_bytes(data[:cut])
        got, reader = read_all(torn)
        assert got == recs[:-1], cut
        assert reader.damage is not None and reader.damage.tail, cut
        assert reader.damage.offset == last_start, cut
    torn.write_bytes(data[:last_start])  # cut exactly between frames: a valid file
    got, reader = read_all(torn)
    assert got == recs[:-1] and reader.damage is None


def test_checksum_mismatch_in_the_middle_is_not_a_tail(tmp_path: Path) -> None:
    recs = job_records(6)
    path = write_aof(tmp_path, recs)
    data = bytearray(path.read_bytes())
    third = len(aof_format.frame(FileHeader(1, 1, 0).encode())) + sum(len(aof_format.frame(r)) for r in recs[:2])
    data[third + aof_format.FRAME.size + 5] ^= 0xFF  # flip a payload byte of record 3
    path.write_bytes(bytes(data))
    got, reader = read_all(path)
    assert got == recs[:2]
    assert reader.damage is not None
    assert (reader.damage.offset, reader.damage.reason, reader.damage.tail) == (
        third, "checksum mismatch", False)


def test_checksum_mismatch_of_the_last_record_is_a_tail(tmp_path: Path) -> None:
    recs = job_records(3)
    path = write_aof(tmp_path, recs)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    got, reader = read_all(path)
    assert got == recs[:2]
    assert reader.damage is not None and reader.damage.tail
    assert reader.damage.reason == "checksum mismatch"


def test_zero_filled_tail_is_a_tail(tmp_path: Path) -> None:
    recs = job_records(3)
    path = write_aof(tmp_path, recs)
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(bytes(4096))  # blocks allocated but never written before a crash
    got, reader = read_all(path)
    assert got == recs
    assert reader.damage is not None and reader.damage.tail and reader.damage.offset == size


def test_writer_appends_and_undoes_nothing_on_success(tmp_path: Path) -> None:
    recs = job_records(10)
    path = write_aof(tmp_path, recs[:4])
    w = AofWriter(str(path))
    for r in recs[4:]:
        w.add(aof_format.frame(r))
    assert path.stat().st_size == w.size  # buffered, not written yet
    w.write_pending()
    w.fsync()
    w.close()
    got, reader = read_all(path)
    assert got == recs and reader.damage is None


def test_writer_keeps_pending_frames_while_writes_fail(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    fault = tmp_path / "fault"
    monkeypatch.setattr(aof_format, "_fault_path", str(fault))
    recs = job_records(3)
    path = write_aof(tmp_path, recs[:1])
    size = path.stat().st_size
    w = AofWriter(str(path))
    w.add(aof_format.frame(recs[1]))
    fault.write_text("ENOSPC")
    with pytest.raises(OSError) as e:
        w.write_pending()
    assert e.value.errno == errno.ENOSPC
    assert path.stat().st_size == size and w.pending
    w.add(aof_format.frame(recs[2]))
    fault.unlink()
    w.write_pending()
    w.close()
    assert read_all(path)[0] == recs


def _mount_tmpfs(target: Path, size: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    target.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)],
                         capture_output=True)
    return res.returncode == 0


def test_short_write_on_a_full_disk_is_undone(tmp_path: Path) -> None:
    """A real full file system (a 64 KB tmpfs): the frame that did not fit is cut
    back out, so the file never ends with half a frame followed by more."""
    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt, "64k"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        path = write_aof(mnt, job_records(2))
        size = path.stat().st_size
        w = AofWriter(str(path))
        big = aof_format.frame(job_records(1, body=b"x" * 200_000)[0])
        w.add(big)
        with pytest.raises(OSError) as e:
            w.write_pending()
        assert e.value.errno == errno.ENOSPC
        assert path.stat().st_size == size, "partial frame removed"
        w.pending.clear()
        small = job_records(3)[2]
        w.add(aof_format.frame(small))
        w.write_pending()  # the disk still has room for a small record
        w.close()
        got, reader = read_all(path)
        assert got == job_records(2) + [small] and reader.damage is None
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _files(*specs: tuple[int, int, int]) -> list[AofFile]:
    return [AofFile(f"f-{w}-{i}-{g}", FileHeader(g, w, i)) for w, i, g in specs]


def test_authority_two_workers_to_one() -> None:
    files = _files((2, 0, 1), (2, 1, 1))
    plan = aof_format.authority(files, 1, 0)
    assert set(plan) == {"f-2-0-1", "f-2-1-1"}
    assert sum(plan["f-2-0-1"]) + sum(plan["f-2-1-1"]) == SLOTS
    assert plan["f-2-1-1"][1] == 1 and plan["f-2-0-1"][1] == 0
    assert aof_format.superseded(files) == []
    files += _files((1, 0, 2))  # worker 0 of the 1-worker node wrote its file
    assert set(aof_format.authority(files, 1, 0)) == {"f-1-0-2"}
    assert [f.path for f in aof_format.superseded(files)] == ["f-2-0-1", "f-2-1-1"]


def test_authority_one_worker_to_two_while_the_other_is_not_done() -> None:
    files = _files((1, 0, 1), (2, 0, 2))  # worker 1 of 2 has not written yet
    plan = aof_format.authority(files, 2, 1)
    assert set(plan) == {"f-1-0-1"} and sum(plan["f-1-0-1"]) == SLOTS // 2
    assert aof_format.superseded(files) == [], "odd slots still live only in the old file"
    files += _files((2, 1, 2))
    assert [f.path for f in aof_format.superseded(files)] == ["f-1-0-1"]


def test_list_files_ignores_other_names_and_reports_headerless(tmp_path: Path) -> None:
    write_aof(tmp_path, job_records(1), gen=3, workers=2, index=1)
    (tmp_path / "appendonly-w0-g2.aof").write_bytes(b"")  # crashed before its header
    (tmp_path / "nodes.conf").write_text("x")
    (tmp_path / "temp-12-appendonly-w0-g4.aof").write_bytes(b"partial")
    files, unreadable = aof_format.list_files(str(tmp_path), "appendonly.aof")
    assert [Path(f.path).name for f in files] == ["appendonly-w1-g3.aof"]
    assert len(unreadable) == 1 and "appendonly-w0-g2.aof" in unreadable[0]


def test_check_aof_reports_and_fixes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recs = job_records(4)
    path = write_aof(tmp_path, recs)
    assert aof_check.main([str(path)]) == 0
    assert "4 records" in capsys.readouterr().out
    good = path.stat().st_size
    with open(path, "ab") as f:
        f.write(aof_format.frame(recs[0])[:-3])  # torn last record
    assert aof_check.main([str(path)]) == 1
    out = capsys.readouterr().out
    assert f"First bad byte at offset {good}" in out and "torn tail" in out
    assert path.stat().st_size > good, "no change without --fix"
    assert aof_check.main(["--fix", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Successfully truncated AOF" in out and "4 records kept" in out
    assert path.stat().st_size == good
    assert read_all(path)[0] == recs


def test_check_aof_finds_a_record_that_does_not_decode(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    recs = job_records(3)
    path = write_aof(tmp_path, [recs[0], b"\x09not a job record", recs[1]])
    bad = len(aof_format.frame(FileHeader(1, 1, 0).encode())) + len(aof_format.frame(recs[0]))
    assert aof_check.main([str(path)]) == 1
    assert f"First bad byte at offset {bad}: record does not decode" in capsys.readouterr().out


def test_check_aof_usage_and_missing_file(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert aof_check.main([]) == 2
    assert aof_check.main(["a", "b"]) == 2
    assert aof_check.main([str(tmp_path / "nope.aof")]) == 2
    assert "Cannot open" in capsys.readouterr().err


def test_check_aof_through_the_cli(tmp_path: Path) -> None:
    import sys

    recs = job_records(2)
    path = write_aof(tmp_path, recs)
    with open(path, "ab") as f:
        f.write(b"\x00\x00\x01")
    cmd = [sys.executable, "-m", "disque_mp", "check-aof"]
    res = subprocess.run([*cmd, str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "AOF is not valid" in res.stdout
    res = subprocess.run([*cmd, "--fix", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "Successfully truncated AOF" in res.stdout
    assert read_all(path)[0] == recs


def test_check_aof_accepts_deletion_records(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from workers.job import del_record, job_id_of_record

    recs = job_records(2)
    path = write_aof(tmp_path, [*recs, del_record(job_id_of_record(recs[0]))])
    assert aof_check.main([str(path)]) == 0
    assert "3 records" in capsys.readouterr().out
    path = write_aof(tmp_path, [*recs, del_record("D-bad")], gen=2)
    assert aof_check.main([str(path)]) == 1
    assert "bad job ID in a deletion record" in capsys.readouterr().out


@pytest.mark.parametrize("meta", [b"", b"{", b"[]", b"{}", b'{"gen": 1, "workers": 0, "index": 0}',
                                  b'{"gen": "x", "workers": 1, "index": 0}'])
def test_bad_headers_are_reported_not_raised(tmp_path: Path, meta: bytes) -> None:
    path = tmp_path / "appendonly-w0-g1.aof"
    path.write_bytes(aof_format.frame(aof_format.MAGIC + bytes([aof_format.FORMAT_VERSION]) + meta))
    files, unreadable = aof_format.list_files(str(tmp_path), "appendonly.aof")
    assert files == [] and len(unreadable) == 1


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.binary(max_size=300), cut=st.integers(min_value=0, max_value=2000))
def test_fuzz_reader_and_check_never_raise(tmp_path: Path, garbage: bytes, cut: int) -> None:
    """Any file (a valid one cut anywhere, then garbage): the reader yields a
    prefix of the records and says where it stopped; check-aof never raises."""
    recs = job_records(3)
    path = write_aof(tmp_path, recs)
    data = path.read_bytes()
    path.write_bytes(data[: min(cut, len(data))] + garbage)
    payloads, reader = read_all(path)
    assert payloads == recs[: len(payloads)] or payloads[: len(recs)] == recs
    assert reader.good_bytes <= reader.size
    if reader.damage is not None:
        assert reader.damage.offset == reader.good_bytes
    rep = aof_check.check(str(path))
    assert rep.bad_offset <= rep.reader.size


def test_check_aof_reads_result_and_kept_key_records(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from workers.dedup import kept_record
    from workers.results import result_record

    recs = job_records(2)
    jid = job_id_of_record(recs[0])
    path = write_aof(tmp_path, [recs[0], result_record(jid, b"value", 10**13),
                                kept_record((b"q", b"k"), jid, 10**13), recs[1]])
    assert aof_check.main([str(path)]) == 0
    assert "4 records" in capsys.readouterr().out
    (tmp_path / "bad").mkdir()
    bad = write_aof(tmp_path / "bad", [recs[0], result_record(jid, b"v", 1)[:20]])
    assert aof_check.main([str(bad)]) == 1
    assert "record does not decode" in capsys.readouterr().out
