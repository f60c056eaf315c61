"""AOF rewrites. ``Rewrite``: one in progress, a snapshot of the shard's job IDs
serialized chunk by chunk into a temporary file (the worker keeps serving between
chunks), the frames appended meanwhile kept as its tail, then one rename over
nothing (a new ``gen``: no file another worker may read is ever replaced).
``Rewriter``: when one is due, starting, stepping and finishing it for the
manager (``aof.AofManager``, seen through ``RewriteHost``), its INFO fields.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from typing import Protocol

from bus.durable import fsync_dir
from disque_mp.node.aof_format import (
    AofWriter,
    FileHeader,
    check_fault,
    file_name,
    frame,
    list_files,
    max_gen,
    unlink_quiet,
    write_all,
)
from disque_mp.node.aof_load import ShardPort
from disque_mp.node.config import Config

log = logging.getLogger("disque_mp.node.aof")

# Jobs serialized per rewrite step: about 4.5 us each (measured: to_record +
# frame + write), so a step stays near 2 ms and the clients of this worker keep
# being served between steps while a rewrite runs.
rewrite_chunk_jobs = 500
# Records appended while a rewrite runs are kept for its end; past this bound the
# rewrite is abandoned (and retried) rather than letting memory grow unbounded.
rewrite_tail_bytes_max = 256 << 20
rewrite_retry_s = 5.0  # after a failed rewrite (Redis retries from its cron too)
# With aof-rewrite-incremental-fsync: fsync the new file every this many bytes.
incremental_fsync_bytes = 32 << 20


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
        write_all(self.fd, bytearray(frame(header.encode())))

    def settings(self, records: list[bytes]) -> None:
        """The records that are not jobs' (QLIMIT's limits), first in the file:
        a later change of them is in the tail. Raises OSError."""
        out = bytearray()
        for rec in records:
            out += frame(rec)
        write_all(self.fd, out)

    @classmethod
    def start(cls, cfg: Config, workers: int, index: int, gen_min: int, port: ShardPort,
              now_s: float) -> Rewrite:
        """A rewrite of worker ``index``'s shard into the next free ``gen`` (above
        every file in ``dir`` and ``gen_min``). Raises OSError."""
        files, _ = list_files(cfg.dir, cfg.appendfilename)
        gen = max(max_gen(files), gen_min) + 1
        name = file_name(cfg.appendfilename, index, gen)
        rw = cls(cfg.dir, name, gen, port.job_ids(), FileHeader(gen, workers, index), now_s)
        try:
            rw.settings(port.settings_records())
        except OSError:
            rw.abandon()
            raise
        return rw

    def add(self, framed: bytes) -> bool:
        """Keep a frame appended meanwhile; False (nothing kept) past the bound."""
        if len(self.tail) + len(framed) > rewrite_tail_bytes_max:
            return False
        self.tail += framed
        return True

    def step(self, port: ShardPort, budget: int, incremental_fsync: bool = False) -> bool:
        """Serialize up to ``budget`` jobs; True when the snapshot is complete.
        Raises OSError."""
        out = bytearray()
        end = min(self.pos + budget, len(self.ids))
        for job_id in self.ids[self.pos:end]:
            rec = port.record_of(job_id)
            if rec is not None:  # gone since the snapshot: its DEL is in the tail
                out += frame(rec)
        self.pos = end
        self.unsynced_bytes += len(out)
        write_all(self.fd, out)
        done = self.pos >= len(self.ids)
        if not done and incremental_fsync and self.unsynced_bytes >= incremental_fsync_bytes:
            os.fsync(self.fd)  # spread the final fsync's cost (Redis does the same)
            self.unsynced_bytes = 0
        return done

    def finish(self, directory: str) -> str:
        """Write the tail, make the file durable and give it its final name (in
        ``directory``); returns that path. Raises OSError."""
        write_all(self.fd, self.tail)
        check_fault()
        os.fsync(self.fd)
        os.close(self.fd)
        self.fd = -1
        final = os.path.join(directory, self.final_name)
        os.rename(self.tmp_path, final)
        fsync_dir(directory)
        return final

    def abandon(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
        unlink_quiet(self.tmp_path)


class RewriteHost(Protocol):
    """What the rewriter reads and calls of its manager (``aof.AofManager``)."""

    cfg: Config
    workers: int
    index: int
    gen: int
    port: ShardPort
    clock: Callable[[], float]
    state: str
    write_error: str
    base_size: int
    writer: AofWriter | None

    def switch_to(self, path: str, gen: int) -> None: ...

    def sync_logging(self) -> None: ...

    def remove_superseded(self) -> None: ...


class Rewriter:
    """The rewrites of one manager's file: when one is due (auto growth,
    scheduled, ``appendonly`` just turned on), the one in progress
    (``current``), retries after a failure, and their INFO fields."""

    __slots__ = ("host", "current", "scheduled", "not_before_s", "last_time_s", "last_ok")

    def __init__(self, host: RewriteHost) -> None:
        self.host = host
        self.current: Rewrite | None = None
        self.scheduled = False
        self.not_before_s = 0.0
        self.last_time_s = -1
        self.last_ok = True

    def due(self, now: float) -> bool:
        h = self.host
        if now < self.not_before_s or h.write_error:
            return False
        if self.scheduled or h.state == "wait_rewrite":
            return True
        w, pct = h.writer, h.cfg.auto_aof_rewrite_percentage
        if w is None or h.state != "on" or pct <= 0:
            return False
        size = w.size
        if size < h.cfg.auto_aof_rewrite_min_size:
            return False
        base = max(h.base_size, 1)
        return (size - base) * 100 // base >= pct

    def start(self, now: float) -> None:
        h = self.host
        self.scheduled = False
        try:
            self.current = Rewrite.start(h.cfg, h.workers, h.index, h.gen, h.port, now)
        except OSError as e:
            self.failed(e.strerror or str(e))
            return
        h.sync_logging()
        log.info("Background append only file rewriting started (%d jobs, worker %d)",
                 len(self.current.ids), h.index)

    def step(self, budget: int) -> None:
        """Serialize up to ``budget`` jobs of the current rewrite; finish it when
        the snapshot is complete."""
        rw = self.current
        assert rw is not None
        try:
            if rw.step(self.host.port, budget, self.host.cfg.aof_rewrite_incremental_fsync):
                self._finish(rw)
        except OSError as e:
            self.failed(e.strerror or str(e))

    def _finish(self, rw: Rewrite) -> None:
        h = self.host
        final = rw.finish(h.cfg.dir)
        self.current = None
        if h.writer is not None:
            h.writer.pending.clear()  # every pending frame is in the tail too
        if h.state == "off":  # BGREWRITEAOF / SHUTDOWN REWRITE-AOF with appendonly no
            h.gen = rw.gen
            h.sync_logging()
        else:
            h.switch_to(final, rw.gen)
        self.last_time_s = int(h.clock() - rw.started_s)
        self.last_ok = True
        h.remove_superseded()
        log.info("Background AOF rewrite finished successfully: %s", final)

    def failed(self, reason: str) -> None:
        self.abandon()
        self.last_ok = False
        self.not_before_s = self.host.clock() + rewrite_retry_s
        if self.host.state == "wait_rewrite":
            self.scheduled = True
        self.host.sync_logging()
        log.warning("Background AOF rewrite failed: %s", reason)

    def abandon(self) -> None:
        """Drop the rewrite in progress, if any (its temporary file goes)."""
        if self.current is not None:
            self.current.abandon()
            self.current = None

    def run_to_end(self) -> None:
        """Finish (or do) a whole rewrite synchronously. Raises OSError."""
        if self.current is None:
            self.start(self.host.clock())
            if self.current is None:
                raise OSError(errno.EIO, "could not start the AOF rewrite")
        rw = self.current
        while not rw.step(self.host.port, rewrite_chunk_jobs):
            pass
        self._finish(rw)

    def bgrewriteaof(self) -> str:
        """BGREWRITEAOF: a status text, or an error text (``ERR ...``)."""
        if self.current is not None:
            return "ERR Background append only file rewriting already in progress"
        self.start(self.host.clock())
        if self.current is None:
            return ("ERR Can't execute an AOF background rewriting. Please check the server "
                    "logs for more information.")
        return "Background append only file rewriting started"

    def info(self, now: float) -> list[tuple[str, int | str]]:
        """The rewrite fields of ``# Persistence``, in the reference's order."""
        rw = self.current
        return [
            ("aof_rewrite_in_progress", int(rw is not None)),
            ("aof_rewrite_scheduled", int(self.scheduled and rw is None)),
            ("aof_last_rewrite_time_sec", self.last_time_s),
            ("aof_current_rewrite_time_sec", int(now - rw.started_s) if rw else -1),
            ("aof_last_bgrewrite_status", "ok" if self.last_ok else "err"),
        ]
