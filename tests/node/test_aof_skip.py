"""Reading past damage (``aof-load-corrupt skip``): the reader steps over a frame
whose checksum fails, a zeroed block, a damaged length, and stops at damage that
reaches the end of the file; what it yields is always sound frames of the file,
in order. ``check-aof`` says what each way out keeps."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disque_mp.node import aof_format
from disque_mp.node.aof_format import FRAME, RecordReader
from disque_mp.tools import check_aof as aof_check
from tests.node.test_aof_file import job_records, write_aof


def offsets(recs: list[bytes]) -> list[int]:
    """Where each record's frame starts in a file written by ``write_aof``."""
    at = len(aof_format.frame(aof_format.FileHeader(1, 1, 0).encode()))
    out = []
    for rec in recs:
        out.append(at)
        at += FRAME.size + len(rec)
    return out


def damaged(path: Path, start: int, new: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[start : start + len(new)] = new
    path.write_bytes(bytes(data))


def read_skipping(path: Path) -> tuple[list[bytes], RecordReader]:
    reader = RecordReader(str(path), skip_damage=True)
    payloads = list(reader)
    return payloads[1:], reader


def test_a_flipped_byte_drops_that_record_alone(tmp_path: Path) -> None:
    recs = job_records(20)
    path = write_aof(tmp_path, recs)
    at = offsets(recs)
    damaged(path, at[7] + 30, bytes([path.read_bytes()[at[7] + 30] ^ 1]))
    strict = RecordReader(str(path))
    assert len(list(strict)) - 1 == 7 and strict.damage is not None
    assert (strict.damage.offset, strict.damage.tail) == (at[7], False)
    got, reader = read_skipping(path)
    assert got == recs[:7] + recs[8:]
    assert reader.damage is None and len(reader.skipped) == 1
    d = reader.skipped[0]
    assert (d.offset, d.end, d.records, d.reason) == (at[7], at[8], 1, "checksum mismatch")


@pytest.mark.parametrize("what", ["zeroed-block", "damaged-length"])
def test_the_reader_finds_the_next_sound_frame(tmp_path: Path, what: str) -> None:
    recs = job_records(30)
    path = write_aof(tmp_path, recs)
    at = offsets(recs)
    if what == "zeroed-block":
        damaged(path, at[5] + 10, bytes(at[9] - at[5]))  # records 5..9 hit
        lost = range(5, 10)
    else:
        damaged(path, at[12], b"\x00\x7f")  # the length of record 12 points nowhere sound
        lost = range(12, 13)
    strict = RecordReader(str(path))
    list(strict)
    assert strict.damage is not None and not strict.damage.tail, "never cut as a torn tail"
    got, reader = read_skipping(path)
    assert got == [r for i, r in enumerate(recs) if i not in lost]
    assert reader.damage is None and [d.offset for d in reader.skipped] == [at[lost[0]]]
    assert reader.skipped[0].end == at[lost[-1] + 1]


def test_damage_that_reaches_the_end_is_a_tail(tmp_path: Path) -> None:
    recs = job_records(10)
    path = write_aof(tmp_path, recs)
    at = offsets(recs)
    size = path.stat().st_size
    damaged(path, at[8] + 9, b"\xff" * (size - at[8] - 9))  # the last two records
    got, reader = read_skipping(path)
    assert got == recs[:8] and reader.damage is not None
    assert (reader.damage.offset, reader.damage.tail) == (at[8], True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 1 << 30), spots=st.integers(1, 4))
def test_skipping_yields_sound_frames_of_the_file_in_order(tmp_path: Path, seed: int,
                                                          spots: int) -> None:
    rng = random.Random(seed)
    recs = job_records(25)
    path = write_aof(tmp_path, recs)
    data = bytearray(path.read_bytes())
    for _ in range(spots):
        at = rng.randrange(40, len(data))
        for i in range(at, min(len(data), at + rng.choice([1, 7, 300]))):
            data[i] = rng.choice([0, rng.randrange(256)])
    path.write_bytes(bytes(data))
    got, reader = read_skipping(path)
    it = iter(recs)
    assert all(any(g == r for r in it) for g in got), "only the file's records, in order"
    assert reader.good_bytes <= reader.size


def test_check_aof_says_what_each_way_out_keeps(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    recs = job_records(12)
    path = write_aof(tmp_path, recs)
    at = offsets(recs)
    damaged(path, at[3] + 20, b"\x00\x00\x00")
    assert aof_check.main([str(path)]) == 1
    out = capsys.readouterr().out
    assert f"First bad byte at offset {at[3]}" in out
    assert "After it: 8 sound records" in out and "aof-load-corrupt skip" in out


@pytest.mark.parametrize("fill", ["zeros", "garbage"])
def test_a_megabytes_long_region_is_a_tail_at_the_end_and_skipped_before_records(
        tmp_path: Path, fill: str) -> None:
    """Preallocated zeros or garbage after the last record is a torn tail; the same
    region before sound records is stepped over (the scan skips it in C, not byte
    by byte in Python)."""
    recs = job_records(6)
    rng = random.Random(7)
    region = bytes(2 << 20) if fill == "zeros" else rng.randbytes(2 << 20)
    path = write_aof(tmp_path, recs)
    with open(path, "ab") as f:
        f.write(region)
    strict = RecordReader(str(path))
    assert len(list(strict)) - 1 == 6 and strict.damage is not None and strict.damage.tail
    with open(path, "ab") as f:
        f.write(b"".join(aof_format.frame(r) for r in recs[:2]))
    got, reader = read_skipping(path)
    assert got == recs + recs[:2] and reader.damage is None
    assert [d.end - d.offset for d in reader.skipped] == [len(region)]
