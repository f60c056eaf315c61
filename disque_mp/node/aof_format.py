"""The AOF's file format and file layer: framed records, the header, a reader
that finds the first bad byte, a buffered writer, file names and the rules that
decide which file is authoritative for which slot. ``disque-mp check-aof`` needs
only this module; the per-worker manager is ``aof.py``.

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

import errno
import logging
import mmap
import os
import re
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import orjson

from bus.durable import fsync_dir
from workers.ids import SLOTS, owner_of_slot

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


def check_fault() -> None:
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


# Test-only power-loss simulation (documented in docs/persistence.md): when this
# environment variable names a directory, every AOF opened for appending and every
# fdatasync of one writes there, in ``<file name>.synced``, how many of its bytes are
# on disk for sure; after a kill -9 a test cuts each file to that size, the worst a
# power loss leaves (tests/faults/power_loss.py).
SYNCED_ENV = "DISQUE_MP_AOF_SYNCED_DIR"
_synced_dir = os.environ.get(SYNCED_ENV, "")


def note_synced(path: str, size: int) -> None:
    """The first ``size`` bytes of ``path`` are durable (no-op unless SYNCED_ENV)."""
    if not _synced_dir:
        return
    note = os.path.join(_synced_dir, os.path.basename(path) + ".synced")
    fd = os.open(note, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.pwrite(fd, b"%20d\n" % size, 0)  # fixed width: one write, never a shorter tail
    finally:
        os.close(fd)


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
    """Where and why reading stopped before the end of a file (or, with
    ``skip_damage``, a damaged region the reader stepped over: ``end`` is where the
    next sound frame starts)."""

    offset: int  # start of the first bad frame = length of the good prefix
    reason: str
    tail: bool  # True when the damage reaches end of file (a torn write)
    end: int = -1  # a skipped region's end; -1 = not skipped (reading stopped there)
    records: int = 0  # a skipped region's frames known lost (1 when only a body was hit)


# How far past damage the reader looks for the next sound frame (skip_damage):
# beyond it the rest of the file counts as one damaged tail.
resync_scan_bytes_max = 64 << 20
_NONE_TO_THE_END = -1  # no sound frame after the damage: a tail
_NONE_IN_REACH = -2  # none within resync_scan_bytes_max: not known to be a tail


def _frame_end(m: mmap.mmap, p: int, size: int) -> int:
    """Where a frame starting at ``p`` would end, -1 when its length cannot be one
    (0, or past the end of the file)."""
    if p + FRAME.size > size:
        return -1
    length = int.from_bytes(m[p:p + 4], "big")
    end = p + FRAME.size + length
    return end if length and end <= size else -1


_starts_cache: dict[int, re.Pattern[bytes]] = {}


def _frame_starts(left: int) -> re.Pattern[bytes]:
    """Where a frame may start within ``left`` bytes: its length's first byte is at
    most ``left >> 24`` and its four length bytes are not all zero (so a scan skips
    zero runs and most garbage at C speed, not byte by byte)."""
    top = min(255, max(left - FRAME.size, 0) >> 24)
    pattern = _starts_cache.get(top)
    if pattern is None:
        high = rb"[\x01-" + re.escape(bytes((top,))) + rb"]|" if top else b""
        pattern = _starts_cache[top] = re.compile(b"(?:" + high + rb"\x00(?!\x00\x00\x00))",
                                                  re.DOTALL)
    return pattern


class RecordReader:
    """Yields the payloads of a file's good frames; afterwards ``damage`` says
    whether (and where) a bad frame stopped the scan.

    With ``skip_damage`` a bad frame followed by sound ones is stepped over
    instead (``skipped`` lists the regions): a frame whose checksum fails but whose
    length leads to a sound frame is dropped alone; otherwise the reader looks for
    the first offset where a sound frame starts that a sound frame (or the end of
    the file) follows. Damage that reaches the end of the file stops the scan as
    without the option. ``at`` is the offset of the frame last yielded."""

    __slots__ = ("path", "size", "good_bytes", "frames", "damage", "skip_damage",
                 "skipped", "at")

    def __init__(self, path: str, skip_damage: bool = False) -> None:
        self.path = path
        self.size = 0
        self.good_bytes = 0
        self.frames = 0
        self.damage: Damage | None = None
        self.skip_damage = skip_damage
        self.skipped: list[Damage] = []
        self.at = 0

    def __iter__(self) -> Iterator[bytes]:
        with open(self.path, "rb", buffering=read_chunk_bytes) as f:
            self.size = os.fstat(f.fileno()).st_size
            while self.good_bytes < self.size:
                payload = self._next(f)
                if payload is None:
                    if not self._skip(f):
                        return
                    continue
                self.at = self.good_bytes
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
            return self._stop(off, f"bad frame length {length}", self._no_frame_after(off))
        if FRAME.size + length > left:
            # a torn write, unless a damaged length hides sound frames after it
            return self._stop(off, "truncated record", self._no_frame_after(off))
        payload = read(length)
        if zlib.crc32(payload) != crc:
            tail = FRAME.size + length == left or self._no_frame_after(off)
            return self._stop(off, "checksum mismatch", tail)
        return bytes(payload)

    def _no_frame_after(self, off: int) -> bool:
        """No sound frame starts after ``off`` (looked for up to the end of the file):
        the damage is a tail, the leftover of a crash, that may be cut."""
        with open(self.path, "rb") as raw, mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return self._resume_at(m, off)[0] == _NONE_TO_THE_END

    def _skip(self, f: BinaryIO) -> bool:
        """With ``skip_damage``, step over the damage just found (``self.damage``)
        to the next sound frame; False when reading stops there."""
        d = self.damage
        if not self.skip_damage or d is None or d.tail:
            return False
        with open(self.path, "rb") as raw, mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ) as m:
            end, records = self._resume_at(m, d.offset)
        if end < 0:
            # none to the end: a tail after all; none in reach: refused as it is
            d.tail = end == _NONE_TO_THE_END
            return False
        d.end, d.records = end, records
        self.skipped.append(d)
        self.damage = None
        self.good_bytes = end
        f.seek(end)
        return True

    def _resume_at(self, m: mmap.mmap, off: int) -> tuple[int, int]:
        """Where the first sound frame after the damage at ``off`` starts, and how many
        frames are known lost before it; ``_NONE_TO_THE_END`` when none starts before
        the end of the file, ``_NONE_IN_REACH`` when none within
        ``resync_scan_bytes_max``."""
        size = self.size
        length = int.from_bytes(m[off:off + 4], "big") if off + 4 <= size else 0
        nxt = off + FRAME.size + length
        if length and nxt < size and self._sound_at(m, nxt):
            return nxt, 1  # only this frame's payload (or checksum) was hit
        last = size - FRAME.size
        stop = min(last, off + resync_scan_bytes_max)
        starts = _frame_starts(size - off)
        p = off + 1
        while p <= stop:
            found = starts.search(m, p, stop + 4)
            if found is None:
                break
            p = found.start()
            if p <= stop and self._sound_at(m, p):
                return p, 0
            p += 1
        return (_NONE_TO_THE_END if stop == last else _NONE_IN_REACH), 0

    def _sound_at(self, m: mmap.mmap, p: int, chain: bool = True) -> bool:
        """A sound frame starts at ``p`` (and, with ``chain``, a sound frame or the
        end of the file follows it: one checksum alone could match by chance). The
        lengths are checked before any checksum is computed."""
        size = self.size
        end = _frame_end(m, p, size)
        if end < 0 or (chain and end != size and _frame_end(m, end, size) < 0):
            return False
        if zlib.crc32(m[p + FRAME.size:end]) != FRAME.unpack_from(m, p)[1]:
            return False
        return not chain or end == size or self._sound_at(m, end, False)

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


def remove_temp_files(directory: str, appendfilename: str, index: int) -> None:
    """Remove the temporary files of worker ``index``'s unfinished rewrites."""
    probe = file_name(appendfilename, index, 1)
    head, _, tail = probe.partition("-g1")
    pattern = re.compile(r"temp-\d+-" + re.escape(head) + r"-g\d+" + re.escape(tail) + r"\Z")
    for name in os.listdir(directory):
        if pattern.match(name):
            unlink_quiet(os.path.join(directory, name))


def remove_superseded(directory: str, appendfilename: str, keep: str) -> None:
    """Remove the files superseded for every slot they claim, except ``keep``."""
    files, _ = list_files(directory, appendfilename)
    for f in superseded(files):
        if f.path != keep:
            unlink_quiet(f.path)
            log.log(15, "Removed superseded AOF %s", f.path)


def keep_damaged(path: str) -> str:
    """Keep a damaged AOF that was loaded without its damaged parts under a name no
    loader reads (``<path>.damaged-<unix time>``, a hard link: no copy), before a
    file written from memory supersedes it. Returns that name ("" if it failed)."""
    kept = f"{path}.damaged-{int(time.time())}"
    try:
        os.link(path, kept)
    except FileExistsError:
        pass  # another worker loading the same file kept it this second
    except OSError as e:
        log.warning("Could not keep the damaged AOF %s as %s: %s", path, kept, e)
        return ""
    log.warning("The damaged AOF %s is kept as %s", path, kept)
    return kept


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
        note_synced(path, self.size)

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
                check_fault()
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
        check_fault()
        os.fdatasync(self.fd)
        self.unsynced = False
        note_synced(self.path, self.size)

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
                write_all(fd, out)
        write_all(fd, out)
        check_fault()
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        unlink_quiet(tmp)
        raise
    os.close(fd)
    final = os.path.join(directory, final_name)
    os.rename(tmp, final)
    fsync_dir(directory)
    return final


def write_all(fd: int, buf: bytearray) -> None:
    view = memoryview(buf)
    done = 0
    try:
        while done < len(view):
            check_fault()
            done += os.write(fd, view[done:])
    finally:
        view.release()
    buf.clear()


def unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
