"""The AOF's view of the shard, and loading at start.

``ShardPort`` is all the AOF manager asks of the worker's shard (``ShardAdapter``
over ``workers.shard.Shard``). ``load_slots`` reads the records of one worker's
slots from every AOF in ``dir`` into it, before the worker accepts clients: for
each slot only the authoritative file counts (``aof_format.authority``); a
damaged tail is cut when ``aof-load-truncated`` allows it, any other damage
refuses the start (``AofLoadError``).
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING, Protocol

from disque_mp.node import config
from disque_mp.node.aof_format import (
    FRAME,
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

if TYPE_CHECKING:
    from workers.shard import Shard

log = logging.getLogger("disque_mp.node.aof")


class ShardPort(Protocol):
    """What the manager needs from the worker's shard (``ShardAdapter`` below)."""

    def slot_of_record(self, record: bytes) -> int: ...

    def load_record(self, record: bytes, enqueue: bool, now_ms: int) -> None: ...

    def job_ids(self) -> list[str]: ...

    def record_of(self, job_id: str) -> bytes | None: ...

    def set_logging(self, on: bool) -> None: ...


class ShardAdapter:
    """``ShardPort`` over the worker's ``workers.shard.Shard``."""

    __slots__ = ("shard",)

    def __init__(self, shard: Shard) -> None:
        self.shard = shard

    def slot_of_record(self, record: bytes) -> int:
        return slot_of_job_id(job_id_of_record(record))

    def load_record(self, record: bytes, enqueue: bool, now_ms: int) -> None:
        self.shard.load_record(record, enqueue, now_ms)

    def job_ids(self) -> list[str]:
        return [j.id for j in self.shard.jobs()]

    def record_of(self, job_id: str) -> bytes | None:
        job = self.shard.lookup(job_id)
        return None if job is None else job.to_record()

    def set_logging(self, on: bool) -> None:
        self.shard.aof = on  # the shard emits AofAppend effects only when asked


class AofLoadError(Exception):
    """An AOF that must not be loaded as it is: the worker refuses to start."""


def load_slots(cfg: Config, workers: int, index: int, port: ShardPort,
               now_ms: int) -> tuple[int, list[AofFile], dict[str, bytearray]]:
    """Load the records of worker ``index`` (of ``workers``)'s slots from every AOF in ``dir``
    into ``port``. Raises AofLoadError. Returns the count of records loaded, the files
    found and the plan (authoritative file -> its slots for us)."""
    enqueue = cfg.aof_enqueue_jobs_once
    files, unreadable = list_files(cfg.dir, cfg.appendfilename)
    for why in unreadable:
        log.warning("Ignoring a file that is not a readable AOF: %s", why)
    plan = authority(files, workers, index)
    loaded = 0
    for path, bitmap in plan.items():
        loaded += _load_file(cfg, port, path, bitmap, enqueue, now_ms)
    log.info("DB loaded from append only file%s: %d records from %d file(s)",
             " (queues included: aof-enqueue-jobs-once)" if enqueue else "",
             loaded, len(plan))
    if enqueue:
        _consume_enqueue_once(cfg, index)
    return loaded, files, plan


def _load_file(cfg: Config, port: ShardPort, path: str, bitmap: bytearray, enqueue: bool,
               now_ms: int) -> int:
    reader = RecordReader(path)
    loaded = 0
    try:
        frames = iter(reader)
        next(frames, None)  # the header, already read by list_files
        for payload in frames:
            if bitmap[port.slot_of_record(payload)]:
                port.load_record(payload, enqueue, now_ms)
                loaded += 1
    except FileNotFoundError:
        # Only deleted once superseded for every slot it claims (aof_format's doc).
        log.warning("AOF %s vanished while loading (superseded): skipped", path)
        return loaded
    except (ValueError, struct.error) as e:  # a sound frame whose record is not
        offset = reader.good_bytes - FRAME.size - len(payload)
        raise AofLoadError(
            f"Bad record in the append only file {path} at offset {offset}: {e}. "
            f"Make a backup, then run 'disque-mp check-aof --fix {path}'") from e
    if reader.damage is not None:
        _damaged(cfg, reader, loaded)
    return loaded


def _damaged(cfg: Config, reader: RecordReader, loaded: int) -> None:
    d = reader.damage
    assert d is not None
    fix = f"Make a backup, then run 'disque-mp check-aof --fix {reader.path}'"
    if not d.tail:
        raise AofLoadError(
            f"Bad file format reading the append only file {reader.path}: {d.reason} "
            f"at offset {d.offset} with more data after it. {fix}")
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
    records = (r for r in (port.record_of(j) for j in port.job_ids()) if r is not None)
    return write_new_file(cfg.dir, name, header, records)
