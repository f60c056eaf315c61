"""The AOF's view of the shard, and loading at start.

``ShardPort`` is all the AOF manager asks of the worker's shard (``ShardAdapter``
over ``workers.shard.Shard``). ``load_slots`` reads the records of one worker's
slots from every AOF in ``dir`` into it, before the worker accepts clients: for
each slot only the authoritative file counts (``aof_format.authority``); a
damaged tail is cut when ``aof-load-truncated`` allows it; damage before the end
(and a record that does not load) refuses the start (``AofLoadError``) unless
``aof-load-corrupt skip`` steps over it, logging what was dropped.
"""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol

from disque_mp.node import config
from disque_mp.node.aof_format import (
    AofFile,
    FileHeader,
    RecordReader,
    authority,
    file_name,
    list_files,
    truncate_file,
    write_new_file,
)
from disque_mp.node.config import Config
from workers.ids import slot_of_job_id
from workers.job import job_id_of_record
from workers.limit import LIMIT_RECORD_TAG, slot_of_limit_record

if TYPE_CHECKING:
    from workers.shard import Shard

log = logging.getLogger("disque_mp.node.aof")
_LIMIT_TAG: Final = bytes((LIMIT_RECORD_TAG,))


class ShardPort(Protocol):
    """What the manager needs from the worker's shard (``ShardAdapter`` below)."""

    def slot_of_record(self, record: bytes) -> int: ...

    def load_record(self, record: bytes, enqueue: bool, now_ms: int) -> None: ...

    def job_ids(self) -> list[str]: ...

    def settings_records(self) -> list[bytes]: ...

    def record_of(self, job_id: str) -> bytes | None: ...

    def set_logging(self, on: bool) -> None: ...


class ShardAdapter:
    """``ShardPort`` over the worker's ``workers.shard.Shard``."""

    __slots__ = ("shard",)

    def __init__(self, shard: Shard) -> None:
        self.shard = shard

    def slot_of_record(self, record: bytes) -> int:
        if record[:1] == _LIMIT_TAG:  # a queue's QLIMIT limits, not a job's record
            return slot_of_limit_record(record)
        return slot_of_job_id(job_id_of_record(record))

    def load_record(self, record: bytes, enqueue: bool, now_ms: int) -> None:
        self.shard.load_record(record, enqueue, now_ms)

    def job_ids(self) -> list[str]:
        """The jobs, then the stored results and kept DEDUP keys (``r:<id>``,
        ``k:<id>``: ``record_of`` tells them apart)."""
        return [j.id for j in self.shard.jobs()] + self.shard.result_keys()

    def settings_records(self) -> list[bytes]:
        """The records that are not jobs' (QLIMIT's limits): a new file starts with them."""
        return self.shard.limit_records()

    def record_of(self, job_id: str) -> bytes | None:
        if job_id[:2] in ("r:", "k:"):
            return self.shard.result_record_of(job_id)
        job = self.shard.lookup(job_id)
        return None if job is None else job.to_record()

    def set_logging(self, on: bool) -> None:
        self.shard.aof = on  # the shard emits AofAppend effects only when asked


class AofLoadError(Exception):
    """An AOF that must not be loaded as it is: the worker refuses to start."""


# The exit status of a worker that refused its AOF (sysexits' EX_CONFIG): the same
# files would be refused again, so the supervisor stops the node instead of
# restarting the worker (never a crash loop).
refused_exit_code: Final = 78


@dataclass(slots=True)
class Loaded:
    """What ``load_slots`` did: records loaded, the files found, the plan
    (authoritative file -> its slots for us), and the files loaded without their
    damaged parts (``aof-load-corrupt skip``), which must not be appended to."""

    records: int
    files: list[AofFile]
    plan: dict[str, bytearray]
    damaged: list[str] = field(default_factory=list)


# Lines naming a skipped record or region, per file (the total is always logged).
skip_log_lines_max = 10


def load_slots(cfg: Config, workers: int, index: int, port: ShardPort, now_ms: int) -> Loaded:
    """Load the records of worker ``index`` (of ``workers``)'s slots from every AOF in
    ``dir`` into ``port``. Raises AofLoadError."""
    enqueue = cfg.aof_enqueue_jobs_once
    files, unreadable = list_files(cfg.dir, cfg.appendfilename)
    for why in unreadable:
        _unreadable(cfg, why)
    plan = authority(files, workers, index)
    out = Loaded(0, files, plan)
    for path, bitmap in plan.items():
        loaded, damaged = _load_file(cfg, port, path, bitmap, enqueue, now_ms)
        out.records += loaded
        if damaged:
            out.damaged.append(path)
    log.info("DB loaded from append only file%s: %d records from %d file(s)",
             " (queues included: aof-enqueue-jobs-once)" if enqueue else "",
             out.records, len(plan))
    if enqueue:
        _consume_enqueue_once(cfg, index)
    return out


def _fix(path: str) -> str:
    return f"Make a backup, then run 'disque-mp check-aof --fix {path}'"


def _unreadable(cfg: Config, why: str) -> None:
    """A file named as ours whose header does not read: all of it would be lost."""
    path = why.partition(": ")[0]
    empty = os.path.exists(path) and os.path.getsize(path) == 0
    if empty or cfg.aof_load_corrupt == "skip":
        log.warning("Ignoring a file that is not a readable AOF (all its records dropped): %s",
                    why)
        return
    raise AofLoadError(
        f"Bad file format reading the append only file {why} at offset 0. {_fix(path)} "
        f"(it then holds nothing), or set aof-load-corrupt skip to start without it")


def _load_file(cfg: Config, port: ShardPort, path: str, bitmap: bytearray, enqueue: bool,
               now_ms: int) -> tuple[int, bool]:
    """Load one file's records of our slots: (records loaded, whether damaged parts
    were skipped)."""
    skip = cfg.aof_load_corrupt == "skip"
    reader = RecordReader(path, skip_damage=skip)
    loaded = refused = 0
    try:
        frames = iter(reader)
        next(frames, None)  # the header, already read by list_files
        for payload in frames:
            try:
                if bitmap[port.slot_of_record(payload)]:
                    port.load_record(payload, enqueue, now_ms)
                    loaded += 1
            except Exception as e:  # whatever a record holds: a refusal, never a crash loop
                if not skip:
                    raise AofLoadError(
                        f"Bad record in the append only file {path} at offset {reader.at}: "
                        f"{e}. {_fix(path)}, or set aof-load-corrupt skip to start without "
                        f"the records that do not load") from e
                refused += 1
                if refused <= skip_log_lines_max:
                    log.warning("AOF %s: record at offset %d dropped: %s", path, reader.at, e)
    except FileNotFoundError:
        # Only deleted once superseded for every slot it claims (aof_format's doc).
        log.warning("AOF %s vanished while loading (superseded): skipped", path)
        return loaded, False
    if reader.skipped or refused:
        _skipped(reader, loaded, refused)
    if reader.damage is not None:
        _damaged(cfg, reader, loaded)
    return loaded, bool(reader.skipped or refused)


def _skipped(reader: RecordReader, loaded: int, refused: int) -> None:
    """``aof-load-corrupt skip`` stepped over damage: say where and how much."""
    for d in reader.skipped[:skip_log_lines_max]:
        log.warning("AOF %s: %s at offset %d, %d bytes skipped to the next sound record "
                    "at offset %d", reader.path, d.reason, d.offset, d.end - d.offset, d.end)
    regions = len(reader.skipped)
    dropped = sum(max(d.records, 1) for d in reader.skipped) + refused
    skipped_bytes = sum(d.end - d.offset for d in reader.skipped)
    log.warning("!!! Warning: the append only file %s is damaged: %d damaged region(s) "
                "(%d bytes) and %d record(s) that do not load were skipped: at least %d "
                "records dropped, %d loaded (aof-load-corrupt skip). The file is kept "
                "as %s.damaged-<time>; a new one is written from memory",
                reader.path, regions, skipped_bytes, refused, dropped, loaded, reader.path)


def _damaged(cfg: Config, reader: RecordReader, loaded: int) -> None:
    d = reader.damage
    assert d is not None
    fix = _fix(reader.path)
    if not d.tail:
        raise AofLoadError(
            f"Bad file format reading the append only file {reader.path}: {d.reason} "
            f"at offset {d.offset} with more data after it. {fix} (it cuts the file "
            f"there: the {reader.size - d.offset} bytes after it are lost), or set "
            f"aof-load-corrupt skip to load the sound records after it")
    if not cfg.aof_load_truncated:
        raise AofLoadError(
            f"Truncated append only file {reader.path}: {d.reason} at offset "
            f"{d.offset} of {reader.size} bytes, and aof-load-truncated is no. "
            f"{fix}, or set aof-load-truncated yes")
    truncate_file(reader.path, d.offset)
    log.warning("!!! Warning: short read while loading the AOF file %s (%s at offset %d)! "
                "AOF truncated at offset %d: %d bytes cut, %d records loaded from it",
                reader.path, d.reason, d.offset, d.offset, reader.size - d.offset, loaded)


def _consume_enqueue_once(cfg: Config, index: int) -> None:
    """The spec's controlled restart: queues were loaded once, the option turns
    itself off (in memory in every worker, in the config file by worker 0)."""
    cfg.aof_enqueue_jobs_once = False
    if index != 0 or not cfg.config_file:
        return
    try:
        config.rewrite(cfg, cfg.config_file)
        log.info("aof-enqueue-jobs-once turned off in %s", cfg.config_file)
    except OSError as e:
        log.warning("Could not turn aof-enqueue-jobs-once off in %s: %s",
                    cfg.config_file, e)


def write_from_memory(cfg: Config, workers: int, index: int, gen: int, port: ShardPort) -> str:
    """A new file ``gen`` of worker ``index`` holding every job of the shard now
    (at start, when the files on disk were written by another worker count)."""
    header = FileHeader(gen, workers, index)
    name = file_name(cfg.appendfilename, index, gen)
    jobs = (r for r in (port.record_of(j) for j in port.job_ids()) if r is not None)
    records = itertools.chain(port.settings_records(), jobs)
    return write_new_file(cfg.dir, name, header, records)
