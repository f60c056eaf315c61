"""Append-only file persistence, one file per worker (docs/architecture.md,
"Invariants"): ``AofManager``, the per-worker manager. It loads its slots at
start (``aof_load.py``), appends the shard's ``AofAppend`` records, commits them
once per loop turn (fsync before replies with ``appendfsync always``), rewrites
the file in chunks (``aof_rewrite.py``) and reports INFO. The file format and
file layer, all that ``disque-mp check-aof`` needs, are ``aof_format.py``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from disque_mp.node.aof_format import (
    AofWriter,
    check_fault,
    frame,
    keep_damaged,
    max_gen,
    note_synced,
    remove_superseded,
    remove_temp_files,
)
from disque_mp.node.aof_load import (
    AofLoadError,
    Loaded,
    ShardAdapter,
    ShardPort,
    load_slots,
    write_from_memory,
)
from disque_mp.node.aof_rewrite import Rewriter, rewrite_chunk_jobs, rewrite_tail_bytes_max
from disque_mp.node.config import Config
from workers.replies import Error

__all__ = ["AofLoadError", "AofManager", "ShardAdapter", "merge_info"]

log = logging.getLogger("disque_mp.node.aof")

# Records waiting for a write that keeps failing (full disk): past this bound new
# records are dropped, the command is refused, and a rewrite from memory is
# scheduled for when the disk works again, so the file catches up.
pending_bytes_max = 64 << 20
fsync_interval_s = 1.0  # appendfsync everysec


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
        self.rewriter = Rewriter(self)
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
        if not cfg.appendonly and not cfg.aof_enqueue_jobs_once:
            return 0
        self.loading = True
        try:
            got = load_slots(cfg, self.workers, self.index, self.port, now_ms)
            if cfg.appendonly:
                self._open_own(got)
        finally:
            self.loading = False
            self.sync_logging()
        return got.records

    def _open_own(self, got: Loaded) -> None:
        mine = [f for f in got.files
                if (f.header.workers, f.header.index) == (self.workers, self.index)]
        best = max(mine, key=lambda f: f.header.gen, default=None)
        remove_temp_files(self.cfg.dir, self.cfg.appendfilename, self.index)
        if best is not None and set(got.plan) <= {best.path} and not got.damaged:
            self.switch_to(best.path, best.header.gen)
            log.info("Appending to %s", best.path)
        else:
            gen = max_gen(got.files) + 1
            path = write_from_memory(self.cfg, self.workers, self.index, gen, self.port)
            self.switch_to(path, gen)
            before = sorted({f.header.workers for f in got.files})
            log.info("Wrote %s from memory (files on disk were written by %s workers, %d now)",
                     path, "/".join(map(str, before)) or "no", self.workers)
        for damaged in got.damaged:
            keep_damaged(damaged)
        self.remove_superseded()

    def switch_to(self, path: str, gen: int) -> None:
        old = self.writer
        if old is not None:
            self._wait_fsync()
            old.close()
        self.writer = AofWriter(path)
        self.gen = gen
        self.base_size = self.writer.size
        self.state = "on"
        self.durable = self.appended
        self.sync_logging()

    def sync_logging(self) -> None:
        """The shard emits records only while someone keeps them: AOF on, or a
        rewrite collecting its tail."""
        self.port.set_logging(self.state != "off" or self.rewriter.current is not None)

    def remove_superseded(self) -> None:
        remove_superseded(self.cfg.dir, self.cfg.appendfilename,
                          self.writer.path if self.writer else "")

    # --- per command, per loop turn ---

    def append(self, record: bytes) -> None:
        """Log one record (an ``AofAppend`` effect). Cheap: it only buffers; the
        write (and the fsync with ``always``) happens once at the end of the loop
        turn, for every connection at once (group commit)."""
        if self.state == "off" and self.rewriter.current is None:
            return
        self.appended += 1
        if not self._commit_scheduled:
            self._schedule_commit()
        framed = frame(record)
        if self.rewriter.current is not None:
            self._add_to_tail(framed)
        writer = self.writer
        if self.state != "on" or writer is None:
            return
        if len(writer.pending) >= pending_bytes_max:
            self.records_dropped = True  # refused by commit(); a rewrite heals the file
            return
        writer.add(framed)

    def _add_to_tail(self, framed: bytes) -> None:
        rw = self.rewriter.current
        assert rw is not None
        if not rw.add(framed):
            self.rewriter.failed(f"more than {rewrite_tail_bytes_max} bytes appended meanwhile")

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
            self.rewriter.scheduled = True  # the file missed records: rebuild from memory
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
        fut = self._fsync_thread.submit(_fsync_fd, writer.fd, writer.path, writer.size)
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
        rewriter = self.rewriter
        if rewriter.current is None and rewriter.due(now):
            rewriter.start(now)
        if rewriter.current is not None:
            rewriter.step(rewrite_chunk_jobs)
            if rewriter.current is not None:
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
        self._fsync_future = self._fsync_thread.submit(_fsync_fd, w.fd, w.path, w.size)

    def _fsync_paused(self) -> bool:
        """no-appendfsync-on-rewrite yes: no fsync of the current file while a
        rewrite writes its own (Redis' trade: less disk contention, the
        durability of appendfsync no meanwhile)."""
        return self.rewriter.current is not None and self.cfg.no_appendfsync_on_rewrite

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

    # --- commands ---

    def bgrewriteaof(self) -> str:
        """BGREWRITEAOF on this worker: a status text, or an error text (``ERR ...``)."""
        return self.rewriter.bgrewriteaof()

    def rewrite_now(self) -> None:
        """Finish (or do) a whole rewrite synchronously (SHUTDOWN REWRITE-AOF).
        Raises OSError."""
        self.rewriter.run_to_end()

    def flushed(self) -> None:
        """DEBUG FLUSHALL emptied the shard without a record per job: replace the
        file by a fresh one (empty, so written at once) so nothing comes back."""
        if self.state == "off" and self.rewriter.current is None:
            return
        self.rewriter.abandon()
        try:
            self.rewrite_now()
        except OSError as e:
            self.rewriter.failed(e.strerror or str(e))
            self.rewriter.scheduled = True

    def apply_config(self) -> None:
        """Follow ``cfg.appendonly`` after CONFIG SET: yes starts a rewrite
        (aof_state wait_rewrite until it is done), no closes the file."""
        if self.cfg.appendonly and self.state == "off":
            self.state = "wait_rewrite"
            self.rewriter.scheduled = True
            self.rewriter.not_before_s = 0.0
            self.sync_logging()
        elif not self.cfg.appendonly and self.state != "off":
            self._stop()

    def _stop(self) -> None:
        self.rewriter.abandon()
        self.rewriter.scheduled = False
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
        self.sync_logging()
        self.turn_commit()

    def shutdown(self, rewrite: bool) -> str:
        """Flush and close before the worker exits; with ``rewrite`` (SHUTDOWN
        REWRITE-AOF) write a fresh AOF first. Returns "" or the error text."""
        self.closed = True
        self.turn_commit()  # replies held for durability go out (or fail) first
        try:
            if rewrite or self.state == "wait_rewrite":
                self.rewrite_now()
            else:
                self.rewriter.abandon()  # the current file is complete without it
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
        fields: list[tuple[str, int | str]] = [
            ("loading", int(self.loading)),
            ("aof_enabled", int(self.state != "off")),
            ("aof_state", self.state),
            *self.rewriter.info(self.clock()),
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


def _fsync_fd(fd: int, path: str, size: int) -> None:
    """fdatasync in the fsync thread: the ``size`` bytes written before it are durable."""
    check_fault()
    os.fdatasync(fd)
    note_synced(path, size)

