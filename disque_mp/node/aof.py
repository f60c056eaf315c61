"""Append-only file persistence: one file per worker (docs/architecture.md, "Invariants").

Two layers live here:

* the file layer: framed records, a reader that finds the first bad byte, a
  buffered writer with fsync policies, and the rules that decide which file is
  authoritative for which slot;
* ``AofManager``, one per worker: loads its slots at start, appends the shard's
  ``AofAppend`` records, commits them once per loop turn (fsync before replies
  with ``appendfsync always``), rewrites the file in chunks, reports INFO.

File format (all integers big endian)::

    frame  := u32 payload_len | u32 crc32(payload) | payload     (payload_len >= 1)
    file   := frame(header) frame(record)*
    header := b"DQMPAOF" | u8 format_version | orjson {"gen", "workers", "index"}

A record payload is opaque here: the shard's versioned job record
(``workers/job.py``); we only ask the shard for its slot. The checksum catches
torn and damaged tails; the length makes the next frame findable.

File names: ``<stem>-w<index>-g<gen><suffix>`` from ``appendfilename``
(``appendonly.aof`` -> ``appendonly-w0-g3.aof``). A file written by worker
``index`` of a node with ``workers`` processes *claims* the slots ``s`` with
``s % workers == index``. For each slot the claiming file with the highest
``gen`` is authoritative; records of that slot in other files are stale and
ignored. A worker that starts with a different ``workers`` count than its files
(or with no file) writes a new file with ``gen = max(gen on disk) + 1`` and never
renames over a file another worker may still be reading; files that are
superseded for every slot they claim are deleted afterwards. So a node restarted
with 1 worker after running 2 (or the reverse) loses nothing, and a record can
never be replayed after a newer state of the same job from another file.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

import orjson

from bus.durable import fsync_dir
from disque_mp.node import config
from disque_mp.node.config import Config
from workers.ids import SLOTS, owner_of_slot, slot_of_job_id
from workers.job import job_id_of_record
from workers.replies import Error

if TYPE_CHECKING:
    from workers.shard import Shard

log = logging.getLogger("disque_mp.node.aof")

MAGIC = b"DQMPAOF"
FORMAT_VERSION = 1
FRAME = struct.Struct(">II")  # payload length, crc32(payload)
# Larger than any job record can be (a body is at most proto-max-bulk-len, 512 MB
# by default, plus metadata); a length above it can only be damage.
record_bytes_max = (1 << 30) + (1 << 20)
# Unit of reads while loading; big enough to make syscalls rare, small enough
# that a worker never holds a whole multi-GB file in memory.
read_chunk_bytes = 1 << 20

# Test-only fault injection (documented in docs/persistence.md): when this
# environment variable names a file, and that file exists and holds an errno
# name such as ENOSPC or EIO, every AOF write/fsync fails with that error.
FAULT_ENV = "DISQUE_MP_AOF_FAULT_FILE"
_fault_path = os.environ.get(FAULT_ENV, "")


def _check_fault() -> None:
    if not _fault_path:
        return
    try:
        with open(_fault_path) as f:
            name = f.read().strip()
    except OSError:
        return
    code = getattr(errno, name, None)
    if isinstance(code, int):
        raise OSError(code, os.strerror(code) + " (injected)")


def frame(payload: bytes) -> bytes:
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


# --- file header ---


@dataclass(slots=True, frozen=True)
class FileHeader:
    gen: int
    workers: int
    index: int

    def encode(self) -> bytes:
        meta = {"gen": self.gen, "workers": self.workers, "index": self.index}
        return MAGIC + bytes([FORMAT_VERSION]) + orjson.dumps(meta)

    @staticmethod
    def decode(payload: bytes) -> FileHeader:
        """Raise ValueError when ``payload`` is not a header we can read."""
        if not payload.startswith(MAGIC) or len(payload) < len(MAGIC) + 1:
            raise ValueError("not a disque-mp AOF (bad magic)")
        version = payload[len(MAGIC)]
        if version != FORMAT_VERSION:
            raise ValueError(f"unsupported AOF format version {version}")
        try:
            meta = orjson.loads(payload[len(MAGIC) + 1:])
            h = FileHeader(int(meta["gen"]), int(meta["workers"]), int(meta["index"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"bad AOF header: {e!r}") from None
        if h.workers < 1 or not 0 <= h.index < h.workers or h.gen < 1:
            raise ValueError(f"bad AOF header {meta}")
        return h

    def claims(self, slot: int) -> bool:
        return owner_of_slot(slot, self.workers) == self.index


# --- reading ---


@dataclass(slots=True)
class Damage:
    """Where and why reading stopped before the end of a file."""

    offset: int  # start of the first bad frame = length of the good prefix
    reason: str
    tail: bool  # True when the damage reaches end of file (a torn write)


class RecordReader:
    """Yields the payloads of a file's good frames; afterwards ``damage`` says
    whether (and where) a bad frame stopped the scan."""

    __slots__ = ("path", "size", "good_bytes", "frames", "damage")

    def __init__(self, path: str) -> None:
        self.path = path
        self.size = 0
        self.good_bytes = 0
        self.frames = 0
        self.damage: Damage | None = None

    def __iter__(self) -> Iterator[bytes]:
        with open(self.path, "rb", buffering=read_chunk_bytes) as f:
            self.size = os.fstat(f.fileno()).st_size
            while self.good_bytes < self.size:
                payload = self._next(f)
                if payload is None:
                    return
                self.good_bytes += FRAME.size + len(payload)
                self.frames += 1
                yield payload

    def _next(self, f: BinaryIO) -> bytes | None:
        read = f.read
        off, left = self.good_bytes, self.size - self.good_bytes
        head = read(FRAME.size)
        if len(head) < FRAME.size:
            return self._stop(off, "truncated frame header", True)
        length, crc = FRAME.unpack(head)
        if length == 0 or length > record_bytes_max:
            # a run of zero bytes (space allocated but never written) or garbage
            return self._stop(off, f"bad frame length {length}", self._zero_tail(off))
        if FRAME.size + length > left:
            return self._stop(off, "truncated record", True)
        payload = read(length)
        if zlib.crc32(payload) != crc:
            last = FRAME.size + length == left
            return self._stop(off, "checksum mismatch", last)
        return bytes(payload)

    def _zero_tail(self, off: int) -> bool:
        """Only zero bytes from ``off`` to end of file (or a length that cannot be
        a frame start): treat as a torn tail, the typical crash leftover."""
        with open(self.path, "rb") as f:
            f.seek(off)
            while chunk := f.read(read_chunk_bytes):
                if chunk.count(0) != len(chunk):
                    return False
        return True

    def _stop(self, off: int, reason: str, tail: bool) -> bytes | None:
        """Record the damage; returns None so callers can ``return self._stop(..)``."""
        self.damage = Damage(off, reason, tail)
        return None


# A header is a few dozen bytes; anything longer is not one of ours.
header_bytes_max = 4096


def read_header(path: str) -> FileHeader:
    """The header of an AOF file (two small reads: listing the files in ``dir``
    must stay cheap); ValueError if it has none we can read."""
    with open(path, "rb", buffering=0) as f:
        head = f.read(FRAME.size)
        if len(head) < FRAME.size:
            raise ValueError("no header (empty or truncated file)")
        length, crc = FRAME.unpack(head)
        if not 0 < length <= header_bytes_max:
            raise ValueError(f"no header (bad frame length {length})")
        payload = f.read(length)
    if len(payload) < length or zlib.crc32(payload) != crc:
        raise ValueError("no header (truncated or checksum mismatch)")
    return FileHeader.decode(payload)


# --- the set of files in dir ---


@dataclass(slots=True, frozen=True)
class AofFile:
    path: str
    header: FileHeader


def file_name(appendfilename: str, index: int, gen: int) -> str:
    stem, dot, suffix = appendfilename.rpartition(".")
    if not dot or not stem:
        stem, suffix = appendfilename, ""
    else:
        suffix = "." + suffix
    return f"{stem}-w{index}-g{gen}{suffix}"


def _name_re(appendfilename: str) -> re.Pattern[str]:
    probe = file_name(appendfilename, 0, 1)
    head, _, tail = probe.partition("-w0-g1")
    return re.compile(re.escape(head) + r"-w(\d+)-g(\d+)" + re.escape(tail) + r"\Z")


def list_files(directory: str, appendfilename: str) -> tuple[list[AofFile], list[str]]:
    """AOF files in ``directory`` (sorted by name) and the names of files that look
    like ours but have no readable header (reported, never loaded)."""
    pattern = _name_re(appendfilename)
    found: list[AofFile] = []
    unreadable: list[str] = []
    for name in sorted(os.listdir(directory)):
        if not pattern.match(name):
            continue
        path = os.path.join(directory, name)
        try:
            found.append(AofFile(path, read_header(path)))
        except (OSError, ValueError) as e:
            unreadable.append(f"{path}: {e}")
    return found, unreadable


def authority(files: list[AofFile], workers: int, index: int) -> dict[str, bytearray]:
    """For each file that is authoritative for at least one slot of worker
    ``index``, a slot bitmap (1 = take this slot's records from this file)."""
    plan: dict[str, bytearray] = {}
    for slot in range(index, SLOTS, workers):
        best: AofFile | None = None
        for f in files:
            if f.header.claims(slot) and (best is None or f.header.gen > best.header.gen):
                best = f
        if best is not None:
            plan.setdefault(best.path, bytearray(SLOTS))[slot] = 1
    return plan


def superseded(files: list[AofFile]) -> list[AofFile]:
    """Files whose every claimed slot is claimed by a file with a higher gen."""
    out: list[AofFile] = []
    for f in files:
        h = f.header
        newer = [g.header for g in files if g.header.gen > h.gen]
        if all(any(n.claims(s) for n in newer) for s in range(h.index, SLOTS, h.workers)):
            out.append(f)
    return out


def max_gen(files: list[AofFile]) -> int:
    return max((f.header.gen for f in files), default=0)


def truncate_file(path: str, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)
        os.fsync(f.fileno())


# --- writing ---


class AofWriter:
    """An AOF opened for appending: frames are buffered and written once per loop
    turn (``write_pending``); a failed or short write is undone so the file never
    holds half a frame followed by more frames."""

    __slots__ = ("path", "fd", "pending", "size", "unsynced", "torn_at")

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self.size = os.fstat(self.fd).st_size
        self.pending = bytearray()
        self.unsynced = False
        self.torn_at = -1  # a partial write we could not cut yet; -1 = none

    def add(self, framed: bytes) -> None:
        self.pending += framed

    def write_pending(self) -> None:
        """Write the buffer; raise OSError and keep it (retried next turn) on failure."""
        if self.torn_at >= 0:
            os.ftruncate(self.fd, self.torn_at)
            self.torn_at = -1
        if not self.pending:
            return
        view = memoryview(self.pending)
        done = 0
        try:
            while done < len(view):
                _check_fault()
                n = os.write(self.fd, view[done:])
                if n <= 0:
                    raise OSError(errno.ENOSPC, "short write")
                done += n
        except OSError:
            view.release()
            if done:
                self._undo_partial()
            raise
        view.release()
        self.size += done
        self.pending.clear()
        self.unsynced = True

    def _undo_partial(self) -> None:
        try:
            os.ftruncate(self.fd, self.size)
        except OSError:
            self.torn_at = self.size

    def fsync(self) -> None:
        _check_fault()
        os.fdatasync(self.fd)
        self.unsynced = False

    def close(self) -> None:
        os.close(self.fd)


def write_new_file(directory: str, final_name: str, header: FileHeader,
                   records: Iterator[bytes]) -> str:
    """Write a complete AOF under a temporary name, fsync it, rename it into
    place, fsync the directory. Returns the final path."""
    tmp = os.path.join(directory, f"temp-{os.getpid()}-{final_name}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        out = bytearray(frame(header.encode()))
        for rec in records:
            out += frame(rec)
            if len(out) >= read_chunk_bytes:
                _write_all(fd, out)
        _write_all(fd, out)
        _check_fault()
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quiet(tmp)
        raise
    os.close(fd)
    final = os.path.join(directory, final_name)
    os.rename(tmp, final)
    fsync_dir(directory)
    return final


def _write_all(fd: int, buf: bytearray) -> None:
    view = memoryview(buf)
    done = 0
    try:
        while done < len(view):
            _check_fault()
            done += os.write(fd, view[done:])
    finally:
        view.release()
    buf.clear()


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# --- the per-worker manager ---


class ShardPort(Protocol):
    """What the manager needs from the worker's shard (``ShardAdapter`` below)."""

    def slot_of_record(self, record: bytes) -> int: ...

    def load_record(self, record: bytes, enqueue: bool, now_ms: int) -> None: ...

    def job_ids(self) -> list[str]: ...

    def record_of(self, job_id: str) -> bytes | None: ...

    def set_logging(self, on: bool) -> None: ...


class AofLoadError(Exception):
    """An AOF that must not be loaded as it is: the worker refuses to start."""


# Jobs serialized per rewrite step: about 4.5 us each (measured: to_record +
# frame + write), so a step stays near 2 ms and the clients of this worker keep
# being served between steps while a rewrite runs.
rewrite_chunk_jobs = 500
# Records appended while a rewrite runs are kept for its end; past this bound the
# rewrite is abandoned (and retried) rather than letting memory grow unbounded.
rewrite_tail_bytes_max = 256 << 20
# Records waiting for a write that keeps failing (full disk): past this bound new
# records are dropped, the command is refused, and a rewrite from memory is
# scheduled for when the disk works again, so the file catches up.
pending_bytes_max = 64 << 20
fsync_interval_s = 1.0  # appendfsync everysec
rewrite_retry_s = 5.0  # after a failed rewrite (Redis retries from its cron too)


class Rewrite:
    """A rewrite in progress: a snapshot of job IDs serialized chunk by chunk into
    a temporary file, plus the frames appended since it started (``tail``)."""

    __slots__ = ("tmp_path", "final_name", "fd", "gen", "ids", "pos", "tail", "started_s",
                 "unsynced_bytes")

    def __init__(self, directory: str, final_name: str, gen: int, ids: list[str],
                 header: FileHeader, now_s: float) -> None:
        self.final_name = final_name
        self.tmp_path = os.path.join(directory, f"temp-{os.getpid()}-{final_name}")
        self.fd = os.open(self.tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                          0o644)
        self.gen = gen
        self.ids = ids
        self.pos = 0
        self.tail = bytearray()
        self.started_s = now_s
        self.unsynced_bytes = 0
        _write_all(self.fd, bytearray(frame(header.encode())))

    def step(self, port: ShardPort, budget: int) -> bool:
        """Serialize up to ``budget`` jobs; True when the snapshot is complete."""
        out = bytearray()
        end = min(self.pos + budget, len(self.ids))
        for job_id in self.ids[self.pos:end]:
            rec = port.record_of(job_id)
            if rec is not None:  # gone since the snapshot: its DEL is in the tail
                out += frame(rec)
        self.pos = end
        self.unsynced_bytes += len(out)
        _write_all(self.fd, out)
        return self.pos >= len(self.ids)

    def abandon(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
        _unlink_quiet(self.tmp_path)


class AofManager:
    """Persistence of one worker's shard. Driven by the worker: ``load`` before it
    accepts clients, ``append_effect`` for every ``AofAppend`` effect (committed
    once per loop turn by ``turn_commit``), ``hold`` for a reply that must wait
    for its records (``appendfsync always``), ``run()`` as a background task,
    ``shutdown`` at exit. ``commit`` is the synchronous form (shutdown, tests)."""

    def __init__(self, cfg: Config, index: int, port: ShardPort,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.index = index
        self.workers = cfg.workers
        self.port = port
        self.clock = clock
        self.state = "off"  # off | on | wait_rewrite (the reference's aof_state)
        self.writer: AofWriter | None = None
        self.gen = 0
        self.base_size = 0  # size after the last rewrite/open: auto rewrite growth base
        self.appended = 0  # records appended so far (monotonic)
        self.durable = 0  # records as durable as the policy promises
        self.write_error = ""  # "" = last write ok
        self.records_dropped = False  # pending_bytes_max hit: rewrite when healthy
        self.rewrite: Rewrite | None = None
        self.rewrite_scheduled = False
        self.rewrite_not_before_s = 0.0
        self.last_rewrite_time_s = -1
        self.last_bgrewrite_ok = True
        self.loading = False
        self.closed = False
        self.last_fsync_s = clock()
        self.loop: asyncio.AbstractEventLoop | None = None  # set by run()
        self._commit_scheduled = False
        # Replies waiting for the turn's commit (appendfsync always); bounded by
        # what the connections of one loop turn can send (their input is bounded).
        self.held: list[tuple[int, Callable[[Any], None], Any]] = []
        self._fsync_thread: ThreadPoolExecutor | None = None
        self._fsync_future: Future[None] | None = None

    # --- start ---

    def load(self, now_ms: int) -> int:
        """Load the records of this worker's slots from every AOF in ``dir``; open
        (or create) this worker's own file. Raises AofLoadError. Returns the count
        of records loaded."""
        cfg = self.cfg
        enqueue = cfg.aof_enqueue_jobs_once
        if not cfg.appendonly and not enqueue:
            return 0
        self.loading = True
        try:
            files, unreadable = list_files(cfg.dir, cfg.appendfilename)
            for why in unreadable:
                log.warning("Ignoring a file that is not a readable AOF: %s", why)
            plan = authority(files, self.workers, self.index)
            loaded = 0
            for path, bitmap in plan.items():
                loaded += self._load_file(path, bitmap, enqueue, now_ms)
            log.info("DB loaded from append only file%s: %d records from %d file(s)",
                     " (queues included: aof-enqueue-jobs-once)" if enqueue else "",
                     loaded, len(plan))
            if enqueue:
                self._consume_enqueue_once()
            if cfg.appendonly:
                self._open_own(files, plan)
        finally:
            self.loading = False
            self._sync_logging()
        return loaded

    def _load_file(self, path: str, bitmap: bytearray, enqueue: bool, now_ms: int) -> int:
        reader = RecordReader(path)
        loaded = 0
        try:
            frames = iter(reader)
            next(frames, None)  # the header, already read by list_files
            for payload in frames:
                if bitmap[self.port.slot_of_record(payload)]:
                    self.port.load_record(payload, enqueue, now_ms)
                    loaded += 1
        except FileNotFoundError:
            # Only deleted once superseded for every slot it claims (see module doc).
            log.warning("AOF %s vanished while loading (superseded): skipped", path)
            return loaded
        except (ValueError, struct.error) as e:  # a sound frame whose record is not
            offset = reader.good_bytes - FRAME.size - len(payload)
            raise AofLoadError(
                f"Bad record in the append only file {path} at offset {offset}: {e}. "
                f"Make a backup, then run 'disque-mp check-aof --fix {path}'") from e
        if reader.damage is not None:
            self._damaged(reader, loaded)
        return loaded

    def _damaged(self, reader: RecordReader, loaded: int) -> None:
        d = reader.damage
        assert d is not None
        fix = f"Make a backup, then run 'disque-mp check-aof --fix {reader.path}'"
        if not d.tail:
            raise AofLoadError(
                f"Bad file format reading the append only file {reader.path}: {d.reason} "
                f"at offset {d.offset} with more data after it. {fix}")
        if not self.cfg.aof_load_truncated:
            raise AofLoadError(
                f"Truncated append only file {reader.path}: {d.reason} at offset "
                f"{d.offset} of {reader.size} bytes, and aof-load-truncated is no. "
                f"{fix}, or set aof-load-truncated yes")
        truncate_file(reader.path, d.offset)
        log.warning("!!! Warning: short read while loading the AOF file %s (%s at offset %d)! "
                    "AOF truncated at offset %d: %d bytes cut, %d records loaded from it",
                    reader.path, d.reason, d.offset, d.offset, reader.size - d.offset, loaded)

    def _consume_enqueue_once(self) -> None:
        """The spec's controlled restart: queues were loaded once, the option turns
        itself off (in memory in every worker, in the config file by worker 0)."""
        self.cfg.aof_enqueue_jobs_once = False
        if self.index != 0 or not self.cfg.config_file:
            return
        try:
            config.rewrite(self.cfg, self.cfg.config_file)
            log.info("aof-enqueue-jobs-once turned off in %s", self.cfg.config_file)
        except OSError as e:
            log.warning("Could not turn aof-enqueue-jobs-once off in %s: %s",
                        self.cfg.config_file, e)

    def _open_own(self, files: list[AofFile], plan: dict[str, bytearray]) -> None:
        mine = [f for f in files
                if (f.header.workers, f.header.index) == (self.workers, self.index)]
        best = max(mine, key=lambda f: f.header.gen, default=None)
        self._remove_my_temp_files()
        if best is not None and set(plan) <= {best.path}:
            self._switch_to(best.path, best.header.gen)
            log.info("Appending to %s", best.path)
        else:
            gen = max_gen(files) + 1
            path = self._write_full(gen)
            self._switch_to(path, gen)
            before = sorted({f.header.workers for f in files})
            log.info("Wrote %s from memory (files on disk were written by %s workers, %d now)",
                     path, "/".join(map(str, before)) or "no", self.workers)
        self._remove_superseded()

    def _write_full(self, gen: int) -> str:
        header = FileHeader(gen, self.workers, self.index)
        name = file_name(self.cfg.appendfilename, self.index, gen)
        port = self.port
        records = (r for r in (port.record_of(j) for j in port.job_ids()) if r is not None)
        return write_new_file(self.cfg.dir, name, header, records)

    def _switch_to(self, path: str, gen: int) -> None:
        old = self.writer
        if old is not None:
            self._wait_fsync()
            old.close()
        self.writer = AofWriter(path)
        self.gen = gen
        self.base_size = self.writer.size
        self.state = "on"
        self.durable = self.appended
        self._sync_logging()

    def _sync_logging(self) -> None:
        """The shard emits records only while someone keeps them: AOF on, or a
        rewrite collecting its tail."""
        self.port.set_logging(self.state != "off" or self.rewrite is not None)

    def _remove_my_temp_files(self) -> None:
        probe = file_name(self.cfg.appendfilename, self.index, 1)
        head, _, tail = probe.partition("-g1")
        pattern = re.compile(r"temp-\d+-" + re.escape(head) + r"-g\d+" + re.escape(tail) + r"\Z")
        for name in os.listdir(self.cfg.dir):
            if pattern.match(name):
                _unlink_quiet(os.path.join(self.cfg.dir, name))

    def _remove_superseded(self) -> None:
        files, _ = list_files(self.cfg.dir, self.cfg.appendfilename)
        current = self.writer.path if self.writer else ""
        for f in superseded(files):
            if f.path != current:
                _unlink_quiet(f.path)
                log.log(15, "Removed superseded AOF %s", f.path)

    # --- per command, per loop turn ---

    def append(self, record: bytes) -> None:
        """Log one record (an ``AofAppend`` effect). Cheap: it only buffers; the
        write (and the fsync with ``always``) happens once at the end of the loop
        turn, for every connection at once (group commit)."""
        if self.state == "off" and self.rewrite is None:
            return
        self.appended += 1
        if not self._commit_scheduled:
            self._schedule_commit()
        framed = frame(record)
        if self.rewrite is not None:
            self._add_to_tail(framed)
        writer = self.writer
        if self.state != "on" or writer is None:
            return
        if len(writer.pending) >= pending_bytes_max:
            self.records_dropped = True  # refused by commit(); a rewrite heals the file
            return
        writer.add(framed)

    def _add_to_tail(self, framed: bytes) -> None:
        rw = self.rewrite
        assert rw is not None
        if len(rw.tail) + len(framed) > rewrite_tail_bytes_max:
            self._rewrite_failed(f"more than {rewrite_tail_bytes_max} bytes appended meanwhile")
            return
        rw.tail += framed

    def commit(self) -> bool:
        """Write what was appended since the last commit, and fsync with
        ``appendfsync always``. Call it before writing the replies of a batch.
        False means: with ``always``, replies of commands that appended after
        ``durable`` must be replaced by ``error_reply()``."""
        writer = self.writer
        if self.state != "on" or writer is None:
            self.durable = self.appended
            return True
        always = self.cfg.appendfsync == "always"
        try:
            writer.write_pending()
            if always and writer.unsynced and not self._fsync_paused():
                self._wait_fsync()
                writer.fsync()
        except OSError as e:
            self._write_failed(e)
            return not always
        if self.records_dropped:
            self._write_failed(OSError(errno.ENOSPC, "records dropped while the disk failed"))
            self.records_dropped = False
            self.rewrite_scheduled = True  # the file missed records: rebuild from memory
            return not always
        self._write_recovered()
        self.durable = self.appended
        return True

    def append_effect(self, record: bytes) -> None:
        """An ``AofAppend`` effect of the shard (the name the worker's hook uses)."""
        self.append(record)

    def write_before_replies(self) -> None:
        """everysec/no: put this batch's records in the kernel (one write) before
        its replies are written, as Redis does, so a killed process never loses
        a change it acknowledged. ``always`` holds replies for the fsync instead."""
        w = self.writer
        if w is None or not w.pending or self.state != "on" or self.holds_replies():
            return
        try:
            w.write_pending()
        except OSError as e:
            self._write_failed(e)  # kept buffered; retried by tick()

    def holds_replies(self) -> bool:
        """With ``appendfsync always`` a reply whose record is not on disk yet must
        wait for the commit (``hold``) instead of being written now."""
        return self.state == "on" and self.cfg.appendfsync == "always"

    def hold(self, seq: int, deliver: Callable[[Any], None], value: Any) -> None:
        """Deliver ``value`` after the commit that makes record ``seq`` (a value of
        ``appended``) durable, or the AOF error in its place if that commit fails."""
        self.held.append((seq, deliver, value))
        if not self._commit_scheduled:
            self._schedule_commit()

    def when_durable(self, deliver: Callable[[Any], None]) -> Callable[[Any], None]:
        """Wrap the callback of a reply that completes later (a ``Wake``: ADDJOB
        waiting for its replicas): with ``always`` it delivers only once every
        record appended by the time it completes is on disk (or the AOF error).
        Effects are drained in order, so the command's own records are counted
        by then; no drain is needed when the callback is registered."""

        def done(value: Any) -> None:
            seq = self.appended
            if seq <= self.durable or not self.holds_replies():
                deliver(value)
            else:
                self.hold(seq, deliver, value)

        return done

    def _schedule_commit(self) -> None:
        loop = self.loop
        if loop is None:
            try:
                loop = self.loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop (tests driving the manager by hand): commit() is explicit
        self._commit_scheduled = True
        loop.call_soon(self.turn_commit)

    def turn_commit(self) -> None:
        """Once per loop turn with appends: commit, then release held replies.

        With ``always`` and a running loop the fdatasync runs in the fsync thread
        (``_sync_async``): the loop keeps reading and running commands of other
        connections meanwhile, and their records ride on the next fsync."""
        self._commit_scheduled = False
        if self.loop is not None and not self.closed and self.holds_replies():
            self._sync_async()
            return
        self.commit()
        self._release(self.durable, self.appended)

    def _release(self, good_seq: int, failed_seq: int) -> None:
        """Deliver held replies whose records are durable (``seq <= good_seq``) and
        the AOF error to those whose write or fsync failed (``seq <= failed_seq``;
        0 = none failed); the others wait for a later fsync."""
        keep: list[tuple[int, Callable[[Any], None], Any]] = []
        for item in self.held:
            seq, deliver, value = item
            if seq <= good_seq:
                deliver(value)
            elif seq <= failed_seq:
                deliver(Error(self.error_reply()))
            else:
                keep.append(item)
        self.held = keep

    def _sync_async(self) -> None:
        writer = self.writer
        assert writer is not None
        try:
            writer.write_pending()
        except OSError as e:
            self._write_failed(e)
            self._release(self.durable, self.appended)
            return
        if self.records_dropped:
            self.commit()  # reports the loss and schedules the healing rewrite
            self._release(self.durable, self.appended)
            return
        if self._fsync_future is not None:
            return  # one fsync at a time: _fsync_done starts the next one
        if not writer.unsynced or self._fsync_paused():
            self.durable = self.appended
            self._release(self.durable, 0)
            return
        self._start_fsync(writer)

    def _start_fsync(self, writer: AofWriter) -> None:
        if self._fsync_thread is None:
            self._fsync_thread = ThreadPoolExecutor(1, thread_name_prefix="aof-fsync")
        seq = self.appended  # write_pending wrote every record appended so far
        writer.unsynced = False
        loop = self.loop
        assert loop is not None
        fut = self._fsync_thread.submit(_fsync_fd, writer.fd)
        self._fsync_future = fut
        fut.add_done_callback(
            lambda f: loop.call_soon_threadsafe(self._fsync_done, f, seq, writer))

    def _fsync_done(self, fut: Future[None], seq: int, writer: AofWriter) -> None:
        if self._fsync_future is fut:
            self._fsync_future = None
        err = fut.exception()
        if isinstance(err, OSError):
            writer.unsynced = True
            self._write_failed(err)
            self._release(self.durable, seq)
        else:
            if writer is self.writer:
                self._write_recovered()
            self.durable = max(self.durable, seq)
            self._release(self.durable, 0)
        if self.held and not self._commit_scheduled:
            self._schedule_commit()  # records written meanwhile need their fsync

    def error_reply(self) -> str:
        """Error text (without the leading ``-``) for a command whose record could
        not be logged; a ``replies.Error`` in the worker."""
        return f"ERR Error writing to the AOF: {self.write_error or 'unknown error'}"

    def _write_failed(self, e: OSError) -> None:
        reason = e.strerror or str(e)
        if self.write_error != reason:
            log.warning("Error writing to the AOF file %s: %s",
                        self.writer.path if self.writer else "?", reason)
        self.write_error = reason

    def _write_recovered(self) -> None:
        if self.write_error:
            log.warning("AOF write error looks solved, the node can write again.")
            self.write_error = ""

    # --- background work: fsync everysec, retries, rewrites ---

    async def run(self) -> None:
        """The manager's background task (started by the worker once it serves)."""
        self.loop = asyncio.get_running_loop()
        while not self.closed:
            await asyncio.sleep(self.tick())

    def tick(self) -> float:
        """Due background work; returns the seconds until the next call is wanted
        (0 while a rewrite has chunks left, so the loop interleaves them)."""
        now = self.clock()
        if self.writer is not None and (self.writer.pending or self.write_error):
            self.commit()  # retry a failed write (full disk freed, ...)
        self._maybe_fsync(now)
        if self.rewrite is None and self._rewrite_due(now):
            self._start_rewrite(now)
        if self.rewrite is not None:
            self._rewrite_step(rewrite_chunk_jobs)
            if self.rewrite is not None:
                return 0.0
        return 1.0 / max(self.cfg.hz, 1)

    def _maybe_fsync(self, now: float) -> None:
        w = self.writer
        if w is None or not w.unsynced or self.cfg.appendfsync != "everysec":
            return
        if self._fsync_paused():
            return
        if now - self.last_fsync_s < fsync_interval_s:
            return
        if self._fsync_future is not None and not self._fsync_future.done():
            return  # the disk is slow: do not queue fsyncs behind each other
        self._collect_fsync()
        if self._fsync_thread is None:
            self._fsync_thread = ThreadPoolExecutor(1, thread_name_prefix="aof-fsync")
        w.unsynced = False
        self.last_fsync_s = now
        self._fsync_future = self._fsync_thread.submit(_fsync_fd, w.fd)

    def _fsync_paused(self) -> bool:
        """no-appendfsync-on-rewrite yes: no fsync of the current file while a
        rewrite writes its own (Redis' trade: less disk contention, the
        durability of appendfsync no meanwhile)."""
        return self.rewrite is not None and self.cfg.no_appendfsync_on_rewrite

    def _collect_fsync(self) -> None:
        fut, self._fsync_future = self._fsync_future, None
        if fut is None:
            return
        err = fut.exception()
        if isinstance(err, OSError):
            self._write_failed(err)
            if self.writer is not None:
                self.writer.unsynced = True

    def _wait_fsync(self) -> None:
        if self._fsync_future is not None:
            self._fsync_future.exception()  # blocks until done
            self._collect_fsync()

    def _rewrite_due(self, now: float) -> bool:
        if now < self.rewrite_not_before_s or self.write_error:
            return False
        if self.rewrite_scheduled or self.state == "wait_rewrite":
            return True
        w, pct = self.writer, self.cfg.auto_aof_rewrite_percentage
        if w is None or self.state != "on" or pct <= 0:
            return False
        size = w.size
        if size < self.cfg.auto_aof_rewrite_min_size:
            return False
        base = max(self.base_size, 1)
        return (size - base) * 100 // base >= pct

    # --- rewrite ---

    def _start_rewrite(self, now: float) -> None:
        self.rewrite_scheduled = False
        try:
            files, _ = list_files(self.cfg.dir, self.cfg.appendfilename)
            gen = max(max_gen(files), self.gen) + 1
            name = file_name(self.cfg.appendfilename, self.index, gen)
            header = FileHeader(gen, self.workers, self.index)
            self.rewrite = Rewrite(self.cfg.dir, name, gen, self.port.job_ids(), header, now)
        except OSError as e:
            self._rewrite_failed(e.strerror or str(e))
            return
        self._sync_logging()
        log.info("Background append only file rewriting started (%d jobs, worker %d)",
                 len(self.rewrite.ids), self.index)

    def _rewrite_step(self, budget: int) -> None:
        rw = self.rewrite
        assert rw is not None
        try:
            if not rw.step(self.port, budget):
                if self.cfg.aof_rewrite_incremental_fsync and rw.unsynced_bytes >= 32 << 20:
                    os.fsync(rw.fd)  # spread the final fsync's cost (Redis does the same)
                    rw.unsynced_bytes = 0
                return
            self._finish_rewrite(rw)
        except OSError as e:
            self._rewrite_failed(e.strerror or str(e))

    def _finish_rewrite(self, rw: Rewrite) -> None:
        _write_all(rw.fd, rw.tail)
        _check_fault()
        os.fsync(rw.fd)
        os.close(rw.fd)
        rw.fd = -1
        final = os.path.join(self.cfg.dir, rw.final_name)
        os.rename(rw.tmp_path, final)
        fsync_dir(self.cfg.dir)
        self.rewrite = None
        if self.writer is not None:
            self.writer.pending.clear()  # every pending frame is in the tail too
        if self.state == "off":  # BGREWRITEAOF / SHUTDOWN REWRITE-AOF with appendonly no
            self.gen = rw.gen
            self._sync_logging()
        else:
            self._switch_to(final, rw.gen)
        self.last_rewrite_time_s = int(self.clock() - rw.started_s)
        self.last_bgrewrite_ok = True
        self._remove_superseded()
        log.info("Background AOF rewrite finished successfully: %s", final)

    def _rewrite_failed(self, reason: str) -> None:
        if self.rewrite is not None:
            self.rewrite.abandon()
            self.rewrite = None
        self.last_bgrewrite_ok = False
        self.rewrite_not_before_s = self.clock() + rewrite_retry_s
        if self.state == "wait_rewrite":
            self.rewrite_scheduled = True
        self._sync_logging()
        log.warning("Background AOF rewrite failed: %s", reason)

    def rewrite_now(self) -> None:
        """Finish (or do) a whole rewrite synchronously (SHUTDOWN REWRITE-AOF).
        Raises OSError."""
        if self.rewrite is None:
            self._start_rewrite(self.clock())
            if self.rewrite is None:
                raise OSError(errno.EIO, "could not start the AOF rewrite")
        rw = self.rewrite
        while not rw.step(self.port, rewrite_chunk_jobs):
            pass
        self._finish_rewrite(rw)

    # --- commands ---

    def bgrewriteaof(self) -> str:
        """BGREWRITEAOF on this worker: a status text, or an error text (``ERR ...``)."""
        if self.rewrite is not None:
            return "ERR Background append only file rewriting already in progress"
        self._start_rewrite(self.clock())
        if self.rewrite is None:
            return "ERR Can't execute an AOF background rewriting. Please check the server logs for more information."
        return "Background append only file rewriting started"

    def flushed(self) -> None:
        """DEBUG FLUSHALL emptied the shard without a record per job: replace the
        file by a fresh one (empty, so written at once) so nothing comes back."""
        if self.state == "off" and self.rewrite is None:
            return
        if self.rewrite is not None:
            self.rewrite.abandon()
            self.rewrite = None
        try:
            self.rewrite_now()
        except OSError as e:
            self._rewrite_failed(e.strerror or str(e))
            self.rewrite_scheduled = True

    def apply_config(self) -> None:
        """Follow ``cfg.appendonly`` after CONFIG SET: yes starts a rewrite
        (aof_state wait_rewrite until it is done), no closes the file."""
        if self.cfg.appendonly and self.state == "off":
            self.state = "wait_rewrite"
            self.rewrite_scheduled = True
            self.rewrite_not_before_s = 0.0
            self._sync_logging()
        elif not self.cfg.appendonly and self.state != "off":
            self._stop()

    def _stop(self) -> None:
        if self.rewrite is not None:
            self.rewrite.abandon()
            self.rewrite = None
        self.rewrite_scheduled = False
        w, self.writer = self.writer, None
        if w is not None:
            try:
                w.write_pending()
                self._wait_fsync()
                w.fsync()
            except OSError as e:
                self._write_failed(e)
            w.close()
        self.state = "off"
        self.durable = self.appended
        self._sync_logging()
        self.turn_commit()

    def shutdown(self, rewrite: bool) -> str:
        """Flush and close before the worker exits; with ``rewrite`` (SHUTDOWN
        REWRITE-AOF) write a fresh AOF first. Returns "" or the error text."""
        self.closed = True
        self.turn_commit()  # replies held for durability go out (or fail) first
        try:
            if rewrite or self.state == "wait_rewrite":
                self.rewrite_now()
            elif self.rewrite is not None:
                self.rewrite.abandon()  # the current file is complete without it
                self.rewrite = None
            w = self.writer
            if w is not None:
                w.write_pending()
                self._wait_fsync()
                w.fsync()
        except OSError as e:
            self._write_failed(e)
            log.warning("Error flushing the AOF at shutdown: %s", self.write_error)
            return self.write_error
        finally:
            if self._fsync_thread is not None:
                self._fsync_thread.shutdown(wait=True)
                self._fsync_thread = None
        return ""

    # --- INFO ---

    def info(self) -> list[tuple[str, int | str]]:
        """This worker's ``# Persistence`` fields, in the reference's order."""
        now = self.clock()
        rw = self.rewrite
        fields: list[tuple[str, int | str]] = [
            ("loading", int(self.loading)),
            ("aof_enabled", int(self.state != "off")),
            ("aof_state", self.state),
            ("aof_rewrite_in_progress", int(rw is not None)),
            ("aof_rewrite_scheduled", int(self.rewrite_scheduled and rw is None)),
            ("aof_last_rewrite_time_sec", self.last_rewrite_time_s),
            ("aof_current_rewrite_time_sec", int(now - rw.started_s) if rw else -1),
            ("aof_last_bgrewrite_status", "ok" if self.last_bgrewrite_ok else "err"),
            ("aof_last_write_status", "err" if self.write_error else "ok"),
        ]
        if self.writer is not None:
            fields += [("aof_current_size", self.writer.size),
                       ("aof_base_size", self.base_size),
                       ("aof_buffer_length", len(self.writer.pending))]
        return fields


def merge_info(parts: list[list[tuple[str, int | str]]]) -> list[tuple[str, int | str]]:
    """One ``# Persistence`` section for the node from every worker's fields."""
    merged: dict[str, int | str] = {}
    for part in parts:
        for name, value in part:
            if name not in merged:
                merged[name] = value
            elif name == "aof_state":
                merged[name] = _merge_state(str(merged[name]), str(value))
            elif name.endswith("_status"):
                merged[name] = "err" if "err" in (merged[name], value) else "ok"
            elif name in ("aof_current_size", "aof_base_size", "aof_buffer_length"):
                merged[name] = int(merged[name]) + int(value)
            else:
                merged[name] = max(int(merged[name]), int(value))
    return list(merged.items())


def _merge_state(a: str, b: str) -> str:
    if a == b:
        return a
    return "wait_rewrite" if "wait_rewrite" in (a, b) or "on" in (a, b) else "off"


def _fsync_fd(fd: int) -> None:
    _check_fault()
    os.fdatasync(fd)


# --- the shard side ---


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
