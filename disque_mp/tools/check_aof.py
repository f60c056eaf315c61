"""``disque-mp check-aof FILE [--fix]``: report an AOF's records and its first bad
byte; with ``--fix`` cut the file there (no question asked, it says what it did).

Exit status: 0 = the file is valid (or was fixed), 1 = damaged and not fixed,
2 = usage error or unreadable file.
"""

from __future__ import annotations

import struct
import sys

from disque_mp.node.aof_format import FileHeader, RecordReader, truncate_file
from workers.dedup import parse_kept_record
from workers.ids import is_valid_job_id
from workers.job import (
    DEL_RECORD_TAG,
    KEPT_KEY_RECORD_TAG,
    RESULT_RECORD_TAG,
    Job,
    job_id_of_record,
)
from workers.limit import LIMIT_RECORD_TAG, parse_limit_record
from workers.persistence import lie_of
from workers.results import parse_result_record

USAGE = "Usage: disque-mp check-aof [--fix] <file.aof>"


def _parse(argv: list[str]) -> tuple[str, bool] | None:
    fix = "--fix" in argv
    rest = [a for a in argv if a != "--fix"]
    if len(rest) != 1 or rest[0].startswith("-"):
        return None
    return rest[0], fix


class Report:
    """What a scan found: the reader (records, sizes), the header, and the first
    problem with its offset (``bad_offset`` = -1 when the file is valid)."""

    __slots__ = ("reader", "header", "problem", "bad_offset")

    def __init__(self, reader: RecordReader) -> None:
        self.reader = reader
        self.header: FileHeader | None = None
        self.problem = ""
        self.bad_offset = -1

    def bad(self, offset: int, problem: str) -> None:
        self.bad_offset, self.problem = offset, problem


def check(path: str) -> Report:
    """Scan ``path`` frame by frame; decode the header and every job record."""
    rep = Report(RecordReader(path))
    offset = 0
    for payload in rep.reader:
        if rep.header is None:
            try:
                rep.header = FileHeader.decode(payload)
            except ValueError as e:
                rep.bad(0, f"bad header: {e}")
                return rep
        elif (why := _record_problem(payload)) is not None:
            rep.bad(offset, f"record does not decode: {why}")
            return rep
        offset = rep.reader.good_bytes
    d = rep.reader.damage
    if d is not None:
        rep.bad(d.offset, f"{d.reason} ({'torn tail' if d.tail else 'damage followed by more data'})")
    elif rep.header is None:
        rep.bad(0, "empty file: no header")
    return rep


def _record_problem(payload: bytes) -> str | None:
    try:
        if payload[0] == DEL_RECORD_TAG:
            if not is_valid_job_id(job_id_of_record(payload)):
                return "bad job ID in a deletion record"
        elif payload[0] == LIMIT_RECORD_TAG:
            parse_limit_record(payload)  # a queue's QLIMIT limits
        elif payload[0] == RESULT_RECORD_TAG or payload[0] == KEPT_KEY_RECORD_TAG:
            (parse_result_record if payload[0] == RESULT_RECORD_TAG else parse_kept_record)(
                payload)
            if not is_valid_job_id(job_id_of_record(payload)):
                return "bad job ID in a result or kept key record"
        else:
            return lie_of(Job.from_record(payload))  # what the node would refuse too
    except (ValueError, struct.error) as e:
        return str(e)
    return None


def main(argv: list[str]) -> int:
    parsed = _parse(argv)
    if parsed is None:
        print(USAGE, file=sys.stderr)
        return 2
    path, fix = parsed
    try:
        rep = check(path)
    except OSError as e:
        print(f"Cannot open {path}: {e.strerror or e}", file=sys.stderr)
        return 2
    reader, header = rep.reader, rep.header
    if header is not None:
        print(f"AOF {path}: gen={header.gen} workers={header.workers} index={header.index}")
    if rep.bad_offset < 0:
        print(f"{reader.frames - 1} records, {reader.size} bytes")
        print("AOF is valid")
        return 0
    bad = rep.bad_offset
    good_records = _records_before(path, bad)
    print(f"First bad byte at offset {bad}: {rep.problem}")
    print(f"AOF analyzed: size={reader.size}, ok_up_to={bad}, diff={reader.size - bad}, "
          f"good records={good_records}")
    _after_damage(path, rep)
    if not fix:
        print(f"AOF is not valid. Use the --fix option to cut it to {bad} bytes.")
        return 1
    truncate_file(path, bad)
    print(f"Truncated {path} from {reader.size} to {bad} bytes "
          f"({reader.size - bad} bytes removed, {good_records} records kept)")
    print("Successfully truncated AOF")
    return 0


def _after_damage(path: str, rep: Report) -> None:
    """Damage with sound records after it: how many, and what each way out keeps."""
    d = rep.reader.damage
    if d is None or d.tail:
        return
    skipper = RecordReader(path, skip_damage=True)
    sound = sum(1 for _ in skipper) - 1  # the header
    after = sound - _records_before(path, d.offset)
    if after <= 0:
        return
    regions = len(skipper.skipped) + (skipper.damage is not None)
    print(f"After it: {after} sound records in {regions} damaged region(s) or more; "
          f"--fix cuts them all, a node started with aof-load-corrupt skip loads them")


def _records_before(path: str, offset: int) -> int:
    """Job records (header excluded) that end at or before ``offset``."""
    reader = RecordReader(path)
    n = 0
    for _ in reader:
        if reader.good_bytes > offset:
            break
        n += 1
    return max(n - 1, 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
