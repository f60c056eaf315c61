"""The supervisor: one process that forks and minds the workers (uvicorn-style).

It holds no job state and no listening socket (so a SIGKILLed supervisor
leaves nothing bound: its workers exit within a second and a new node can bind
the port). In order:

1. create and enter ``dir``; open ``logfile`` there; lock ``dir`` (two nodes in
   one dir would mix their AOF files and node IDs); check the cluster secret
   file and that every port the workers will bind is free (a port in use is one
   line naming it and its holder, before any worker starts);
2. load or create the node ID (``bus/nodes_conf.py``), write ``pidfile``;
3. fork ``workers`` processes with ``multiprocess`` (start method ``fork``,
   before any thread or event loop exists), each running
   ``disque_mp.node.worker.run_worker(cfg, index, node_id, ready)``;
4. loop: signal handlers only record the signal; the loop stops the node on
   SIGTERM/SIGINT, restarts a dead worker into its slot after a bounded
   backoff, and tells systemd READY=1 once every worker's ``ready`` is set.

The directory lock is an flock on ``dir/disque-mp.lock`` that the workers
inherit across fork, so it is released only when the last process of this node
is gone: a restart after SIGKILL waits for the old workers instead of racing
them. The lock is a file of the node's own (mode 0600) in a directory only the
node's user may write (``dir_strict_modes``, sshd's StrictModes): no other local
user can open it, so none can hold the lock and keep the node from starting.
Everything the node creates is private to its user (``node_umask``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import gc
import json
import logging
import os
import resource
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import multiprocess

from bus import nodes_conf, peercred
from bus.durable import write_atomic
from disque_mp import __version__, compiled
from disque_mp.node import aof_format, config, hints, sdnotify
from disque_mp.node.aof_load import refused_exit_code
from disque_mp.node.config import Config
from disque_mp.node.listen import port_busy
from disque_mp.node.log import VERBOSE, setup_logging

log = logging.getLogger("disque_mp.node.supervisor")

shutdown_grace_s = 10.0  # SIGTERM -> SIGKILL: time to write in-flight replies and flush the AOF
restart_backoff_s_min = 0.1  # first restart of a worker that had been running fine
restart_backoff_s_max = 5.0  # a crash loop retries at most this often, so it cannot spin
stable_run_s = 10.0  # a worker alive this long has its backoff reset
startup_attempts_max = 3  # a worker that never got ready this many times in a row: give up
lock_wait_s = 5.0  # a previous node's workers exit within 1 s of their parent's death
# With nothing pending the loop sleeps until a worker exits (its sentinel), a signal
# (the wake-up pipe), a CONFIG SET report or the systemd watchdog's next ping is due.
busy_wake_s = 0.05  # poll interval while waiting for readiness or a restart
config_report_bytes_max = 1 << 20  # one CONFIG SET report line; ours are < 1 KB
fd_headroom = 128  # files beyond maxclients: mesh sockets, AOF files, logs
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
PR_SET_NAME = 15  # <linux/prctl.h>
node_umask = 0o077  # AOF, log, nodes.conf, pidfile: 0600; directories: 0700
lock_file_name = "disque-mp.lock"  # in dir; flocked while any process of the node lives


class StartupError(Exception):
    """The node cannot start; the message says why."""


class WorkerSlot:
    """One worker position: its index survives the processes that fill it."""

    __slots__ = ("index", "proc", "ready", "started_at", "backoff_s", "due_at",
                 "failed_starts", "was_ready", "sets_fd", "sets_buf")

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: Any = None  # multiprocess.Process while one runs
        self.ready: Any = None  # its multiprocess.Event
        self.started_at = 0.0
        self.backoff_s = 0.0
        self.due_at: float | None = 0.0  # monotonic time of the next start, None = none
        self.failed_starts = 0  # consecutive deaths before ever being ready
        self.was_ready = False
        self.sets_fd = -1  # read end of the worker's CONFIG SET reports
        self.sets_buf = b""  # a partial report line


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exited with an unknown status"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# what each appendfsync policy keeps when the node or its host stops
_FSYNC_LOSES = {
    "always": "a power loss none",
    "everysec": "a power loss may lose the last second",
    "no": "a power loss may lose what the OS had not written yet",
}


def persistence_line(cfg: Config) -> str:
    """One start-up line: where the jobs live and what a restart keeps."""
    if not cfg.appendonly:
        return "persistence: off: jobs are lost when the node stops (appendonly yes keeps them)"
    files = aof_format.file_name(cfg.appendfilename, 0, 0).replace("-w0-g0", "-w*-g*")
    return (f"persistence: AOF {os.path.join(cfg.dir, files)} (one file per worker), "
            f"fsync {cfg.appendfsync}: a restart keeps every job, each queued again after "
            f"its RETRY as in Disque; {_FSYNC_LOSES.get(cfg.appendfsync, '')}")


class Supervisor:
    def __init__(self, cfg: Config, worker_target: Callable[..., None]) -> None:
        self.cfg = cfg
        self.worker_target = worker_target
        self.ctx = multiprocess.get_context("fork")
        self.slots = [WorkerSlot(i) for i in range(cfg.workers)]
        self.node_id = ""
        self.signals: list[int] = []
        self.stopping = False
        self.notified_ready = False
        self.all_ready = False
        self.lock_fd = -1
        self.wake_r, self.wake_w = -1, -1
        self.pidfile_written = ""
        self.socket_dir = ""
        self.watchdog_s = sdnotify.watchdog_interval_s()
        self.watchdog_due = 0.0

    # --- start-up ---

    def prepare(self) -> None:
        """Everything before the fork; raises StartupError with a clear message."""
        cfg = self.cfg
        _set_process_name("disque-mp X")
        os.umask(node_umask)  # before the first file or directory the node creates
        try:
            os.makedirs(cfg.dir, exist_ok=True)
            os.chdir(cfg.dir)
        except OSError as e:
            raise StartupError(f"Can't chdir to '{cfg.dir}': {e.strerror}") from None
        cfg.dir = os.getcwd()  # workers and CONFIG GET dir see the absolute path
        problem = config.dir_mode_problem(cfg.dir) if cfg.dir_strict_modes else None
        if problem:  # before the log file or nodes.conf is opened there
            raise StartupError(problem)
        try:
            setup_logging(cfg, "X")
        except OSError as e:
            raise StartupError(f"Can't open the log file: {e.strerror}") from None
        log.info("disque-mp %s starting: pid %d, port %d, %d workers, dir %s, config %s",
                 __version__, os.getpid(), cfg.port, cfg.workers, cfg.dir,
                 cfg.config_file or "(none: defaults and command line)")
        log.info("%s", persistence_line(cfg))
        build = compiled.status()
        if build["stale"]:
            log.warning("The compiled modules %s are older than their source and run old code: "
                        "rebuild them (make compile) or remove them (make pure)",
                        ", ".join(build["stale"]))
        log.info("Shard modules: %s", compiled.summary())
        self._lock_dir()
        secret = config.check_secret_file(cfg)
        if secret:
            raise StartupError(secret)
        self._check_ports()
        self._make_socket_dir()
        self._load_identity()
        self._raise_fd_limit()
        self._write_pidfile()
        hints.create()  # the per-slot cells every worker maps, restarted ones too

    def _lock_dir(self) -> None:
        fd = open_lock_file(lock_file_name)
        deadline = time.monotonic() + lock_wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.lock_fd = fd
                return
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise StartupError(f"Can't lock '{self.cfg.dir}': {e.strerror}") from None
            if time.monotonic() >= deadline:
                os.close(fd)
                raise StartupError(
                    f"Sorry, the directory {self.cfg.dir} (and its {self.cfg.cluster_config_file}) "
                    "is already used by a different disque-mp node. Please make sure that "
                    "different nodes use different dirs.")
            time.sleep(0.05)

    def _check_ports(self) -> None:
        """Every port the workers will bind is free, said in one line before any worker
        starts: the workers bind the client and HTTP ports with SO_REUSEPORT, which
        would let this node share another node's ports (and split its requests)."""
        cfg = self.cfg
        ports = [("client port", cfg.bind, cfg.port),
                 ("cluster bus port", cfg.bind, cfg.port + 10000)]
        if cfg.tls_port:
            ports.append(("TLS port", cfg.bind, cfg.tls_port))
        if cfg.http_port:
            ports.append(("HTTP port", cfg.http_bind, cfg.http_port))
        ports += [(f"worker port of W{i}", cfg.bind, p)
                  for i, p in enumerate(config.worker_ports(cfg))]
        for label, bind, port in ports:
            why = port_busy(bind, port)
            if why:
                raise StartupError(f"Can't listen on the {label} {port}: {why}")
        if cfg.http_port:
            log.info("HTTP (dashboard, /metrics, /api, /healthz) on %s port %d",
                     cfg.http_bind or "0.0.0.0", cfg.http_port)

    def _make_socket_dir(self) -> None:
        """The workers' local sockets live in a fresh directory only our uid can
        enter (bus/peercred.py): no other local user can bind their names."""
        try:
            self.socket_dir = peercred.make_socket_dir()
        except OSError as e:
            raise StartupError(f"Can't create the local socket directory: {e.strerror}") from None
        log.log(VERBOSE, "Local sockets in %s", self.socket_dir)

    def _load_identity(self) -> None:
        ip = self.cfg.bind.split()[0] if self.cfg.bind else "127.0.0.1"
        try:
            nc, created = nodes_conf.load_or_create(self.cfg.cluster_config_file, ip, self.cfg.port)
        except (nodes_conf.NodesConfError, OSError) as e:
            raise StartupError(
                f"Unrecoverable error: {self.cfg.cluster_config_file}: {e}") from None
        self.node_id = nc.node_id
        how = "No cluster configuration found, I'm" if created else "Node configuration loaded, I'm"
        log.info("%s %s", how, self.node_id)

    def _raise_fd_limit(self) -> None:
        """Like Disque, make room for maxclients (workers inherit the limit)."""
        want = self.cfg.maxclients + fd_headroom
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < want:
            new = want if hard == resource.RLIM_INFINITY else min(want, hard)
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            if new < want:
                log.warning("You requested maxclients of %d requiring at least %d max file "
                            "descriptors; the hard limit is %d (raise LimitNOFILE).",
                            self.cfg.maxclients, want, hard)

    def _write_pidfile(self) -> None:
        path = self.cfg.pidfile
        if not path:
            return
        try:
            write_atomic(path, f"{os.getpid()}\n".encode())
        except OSError as e:
            raise StartupError(f"Can't write the pidfile {path}: {e.strerror}") from None
        self.pidfile_written = os.path.abspath(path)

    def _remove_pidfile(self) -> None:
        path = self.pidfile_written
        if not path:
            return
        try:
            with open(path) as f:
                mine = f.read().strip() == str(os.getpid())
            if mine:  # a newer node may already have replaced it
                os.unlink(path)
        except OSError:
            pass

    # --- signals: handlers only record ---

    def _install_signals(self) -> None:
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        signal.set_wakeup_fd(self.wake_w)
        for sig in (*_STOP_SIGNALS, signal.SIGHUP):
            signal.signal(sig, self._record_signal)

    def _record_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)

    def _drain_wakeup(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while os.read(self.wake_r, 512):
                pass

    def _handle_signals(self) -> None:
        while self.signals:
            sig = self.signals.pop(0)
            if sig == signal.SIGHUP:
                try:
                    setup_logging(self.cfg, "X")  # first, so the line lands in the new file
                    log.info("Received SIGHUP: log file reopened")
                except OSError as e:
                    log.warning("Received SIGHUP: can't reopen the log file: %s", e)
                self._kill_all(signal.SIGHUP)  # every worker writes the same log file
                continue
            name = signal.Signals(sig).name
            if self.stopping:
                if sig == signal.SIGINT:  # a second Ctrl-C: do not wait any longer
                    log.warning("Received %s again: killing the workers now", name)
                    self._kill_all(signal.SIGKILL)
                continue
            log.warning("Received %s scheduling shutdown...", name)
            self.stopping = True

    # --- workers ---

    def _start(self, slot: WorkerSlot) -> None:
        slot.ready = self.ctx.Event()
        self._drain_sets(slot)  # the last reports of the worker this one replaces
        sets_r, sets_w = os.pipe()
        os.set_blocking(sets_r, False)
        parent_fds = (self.wake_r, self.wake_w, sets_r,
                      *(s.sets_fd for s in self.slots if s.sets_fd >= 0))
        proc = self.ctx.Process(
            target=_worker_entry, name=f"disque-mp W{slot.index}",
            args=(self.worker_target, self.cfg, slot.index, self.node_id, slot.ready,
                  parent_fds, sets_w))
        try:
            proc.start()
        finally:
            os.close(sets_w)  # the worker holds the only write end: EOF when it dies
        slot.sets_fd, slot.sets_buf = sets_r, b""
        slot.proc, slot.started_at, slot.due_at, slot.was_ready = proc, time.monotonic(), None, False
        log.log(VERBOSE, "Worker W%d started, pid %d", slot.index, proc.pid)

    def _reap(self) -> None:
        for slot in self.slots:
            if slot.proc is None or slot.proc.is_alive():
                continue
            slot.proc.join(0)
            code = slot.proc.exitcode
            pid = slot.proc.pid
            slot.proc = None
            if self.stopping:
                continue
            self._schedule_restart(slot, pid, code)

    def _schedule_restart(self, slot: WorkerSlot, pid: int, code: int | None) -> None:
        now = time.monotonic()
        ran_s = now - slot.started_at
        if slot.was_ready:
            slot.failed_starts = 0
        else:
            slot.failed_starts += 1
        if ran_s >= stable_run_s:
            slot.backoff_s = restart_backoff_s_min
        else:
            slot.backoff_s = min(max(slot.backoff_s * 2, restart_backoff_s_min),
                                 restart_backoff_s_max)
        slot.due_at = now + slot.backoff_s
        self.all_ready = False
        if code == refused_exit_code:
            raise StartupError(
                f"Worker W{slot.index} refused its AOF (see the log above); stopping the "
                "node: a restart would refuse the same files again")
        if not self.notified_ready and slot.failed_starts >= startup_attempts_max:
            raise StartupError(
                f"Worker W{slot.index} failed to start {slot.failed_starts} times in a row "
                f"(the last one {_describe_exit(code)}); giving up, see the log above")
        log.warning("Worker W%d (pid %d) %s after %.1f s; restarting it in %.1f s",
                    slot.index, pid, _describe_exit(code), ran_s, slot.backoff_s)
        sdnotify.notify(f"STATUS=Worker W{slot.index} {_describe_exit(code)}; restarting it")

    def _restart_due(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.proc is None and slot.due_at is not None and slot.due_at <= now:
                self._start(slot)

    def _check_ready(self) -> None:
        if self.all_ready:
            return
        for slot in self.slots:
            if slot.proc is None:
                return
            if not slot.was_ready:
                if not slot.ready.is_set():
                    return
                slot.was_ready = True
                slot.failed_starts = 0
        self.all_ready = True
        status = (f"STATUS=Ready: node {self.node_id[:8]}, {len(self.slots)} workers, "
                  f"port {self.cfg.port}")
        if not self.notified_ready:
            self.notified_ready = True
            # A one-shot of the start-up load (the workers turn it off too): a
            # worker restarted later must load its AOF the normal way.
            self.cfg.aof_enqueue_jobs_once = False
            log.info("Ready to accept connections (%d workers)", len(self.slots))
            sdnotify.notify(f"READY=1\n{status}\nMAINPID={os.getpid()}")
        else:
            log.info("All %d workers are serving again", len(self.slots))
            sdnotify.notify(status)

    def _kill_all(self, sig: int) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.proc.pid, sig)

    def _wait(self, timeout_s: float | None) -> None:
        fds = [self.wake_r] + [s.proc.sentinel for s in self.slots if s.proc is not None]
        fds += [s.sets_fd for s in self.slots if s.sets_fd >= 0]
        poller = select.poll()  # not select(): 1024 workers would pass FD_SETSIZE
        for fd in fds:
            poller.register(fd, select.POLLIN)
        timeout_ms = None if timeout_s is None else int(timeout_s * 1000)
        with contextlib.suppress(InterruptedError):
            readable = {fd for fd, _ in poller.poll(timeout_ms)}
            for slot in self.slots:
                if slot.sets_fd >= 0 and slot.sets_fd in readable:
                    self._read_sets(slot)
        self._drain_wakeup()

    # --- CONFIG SET in the workers, mirrored here for the workers we restart ---

    def _read_sets(self, slot: WorkerSlot) -> None:
        try:
            data = os.read(slot.sets_fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close_sets(slot)
            return
        buf = slot.sets_buf + data
        *lines, slot.sets_buf = buf.split(b"\n")
        if len(slot.sets_buf) > config_report_bytes_max:
            slot.sets_buf = b""  # not a report we wrote: drop it rather than grow
        for line in lines:
            self._apply_set(slot.index, line)

    def _apply_set(self, index: int, line: bytes) -> None:
        try:
            name, value = json.loads(line)
        except ValueError:
            log.warning("Worker W%d sent a malformed CONFIG SET report", index)
            return
        err = config.config_set(self.cfg, str(name), str(value))
        if err is None:
            log.log(VERBOSE, "CONFIG SET %s (from W%d) kept for restarted workers", name, index)
        else:
            log.warning("CONFIG SET %s from W%d not kept: %s", name, index, err)

    def _drain_sets(self, slot: WorkerSlot) -> None:
        """Read what a dead worker reported, then close its pipe."""
        for _ in range(64):  # bound: 64 reads of 64 KB, far more than it can have sent
            if slot.sets_fd < 0:
                return
            self._read_sets(slot)
        self._close_sets(slot)

    def _close_sets(self, slot: WorkerSlot) -> None:
        if slot.sets_fd >= 0:
            os.close(slot.sets_fd)
            slot.sets_fd, slot.sets_buf = -1, b""

    def _timeout(self) -> float | None:
        """How long the loop may sleep: ``busy_wake_s`` while a worker is due to start
        or not ready yet, else until the watchdog is due, else (None) until an event."""
        pending = any(s.proc is None for s in self.slots)
        wait_s = busy_wake_s if pending or not self.all_ready else None
        if self.watchdog_s is not None:
            due_s = max(self.watchdog_due - time.monotonic(), 0.0)
            wait_s = due_s if wait_s is None else min(wait_s, due_s)
        return wait_s

    def _pet_watchdog(self) -> None:
        """systemd's WatchdogSec: proof that this loop still turns."""
        now = time.monotonic()
        if self.watchdog_s is not None and now >= self.watchdog_due:
            sdnotify.notify("WATCHDOG=1")
            self.watchdog_due = now + self.watchdog_s

    # --- the loop ---

    def serve(self) -> None:
        # Objects that exist now are shared by every fork; keep the collector
        # from touching (and so copying) their pages in the workers.
        gc.freeze()
        for slot in self.slots:
            self._start(slot)
        while not self.stopping:
            self._wait(self._timeout())
            self._pet_watchdog()
            self._handle_signals()
            self._reap()
            if self.stopping:
                break
            self._restart_due()
            self._check_ready()

    def shutdown(self) -> None:
        self.stopping = True
        sdnotify.notify("STOPPING=1\nSTATUS=Stopping")
        live = [s for s in self.slots if s.proc is not None]
        log.info("Stopping %d workers (SIGTERM, up to %.0f s)", len(live), shutdown_grace_s)
        self._kill_all(signal.SIGTERM)
        deadline = time.monotonic() + shutdown_grace_s
        while any(s.proc is not None for s in self.slots):
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("Workers still running after %.0f s: SIGKILL", shutdown_grace_s)
                self._kill_all(signal.SIGKILL)
                deadline = time.monotonic() + shutdown_grace_s
            self._wait(min(max(left, 0.01), busy_wake_s * 4))
            self._pet_watchdog()
            self._handle_signals()
            self._reap_quietly()

    def _reap_quietly(self) -> None:
        for slot in self.slots:
            if slot.proc is not None and not slot.proc.is_alive():
                slot.proc.join(0)
                code = slot.proc.exitcode
                if code not in (0, None):
                    log.warning("Worker W%d %s during shutdown", slot.index,
                                _describe_exit(code))
                slot.proc = None

    def run(self) -> int:
        """The whole life of the node after prepare(); returns the exit code."""
        self._install_signals()
        code = 0
        try:
            self.serve()
        except StartupError as e:
            log.warning("%s", e)
            code = 1
        finally:  # also on a bug in the loop: never leave workers behind
            self.shutdown()
            self._remove_pidfile()
            if self.socket_dir:
                peercred.remove_socket_dir(self.socket_dir)
        log.info("disque-mp is now ready to exit, bye bye...")
        return code


def open_lock_file(name: str) -> int:
    """The node's lock file in the current dir, created 0600; never one that is a link
    or another user's (only the node's user can create files in a strict dir)."""
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise StartupError(f"Can't open the lock file {name}: {e.strerror}") from None
    if os.fstat(fd).st_uid != os.geteuid():
        os.close(fd)
        raise StartupError(f"Refusing the lock file {name}: it belongs to another user")
    return fd


def _set_process_name(name: str) -> None:
    """The name top and ps -o comm show (Linux keeps 15 bytes)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _report_sets_to(fd: int) -> Callable[[str, str], None]:
    """A config set-listener that tells the supervisor (one line per CONFIG SET)."""
    os.set_blocking(fd, False)

    def report(name: str, value: str) -> None:
        line = json.dumps([name, value]).encode() + b"\n"
        try:
            os.write(fd, line)  # a few hundred bytes at most: one atomic pipe write
        except OSError as e:  # the supervisor is gone or not reading: never block here
            logging.getLogger("disque_mp.node.worker").warning(
                "CONFIG SET %s not reported to the supervisor: %s", name, e)

    return report


def _worker_entry(target: Callable[..., None], cfg: Config, index: int, node_id: str,
                  ready: Any, parent_fds: tuple[int, ...], sets_fd: int) -> None:
    """First code in a forked worker: undo the supervisor's process state."""
    _set_process_name(f"disque-mp W{index}")
    signal.set_wakeup_fd(-1)
    for fd in parent_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    config.add_set_listener(_report_sets_to(sets_fd))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # SIGHUP reopens the log once the worker's loop runs; until then it must not kill it
    # (its default action), e.g. when a logrotate lands during a restart.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # Ctrl-C reaches the whole process group; the supervisor turns it into an
    # orderly SIGTERM per worker, so the worker itself ignores it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    setup_logging(cfg, f"W{index}")
    wlog = logging.getLogger("disque_mp.node.worker")
    wlog.log(VERBOSE, "Worker W%d running (pid %d, node %s)", index, os.getpid(), node_id[:8])
    try:
        target(cfg, index, node_id, ready)
    except SystemExit:
        raise
    except BaseException:
        wlog.exception("Worker W%d crashed", index)
        raise


def _load_worker_target() -> Callable[..., None]:
    try:
        from disque_mp.node.worker import run_worker
    except ImportError as e:
        raise StartupError(f"the worker code is missing (disque_mp.node.worker): {e}") from None
    return run_worker


def run(cfg: Config) -> int:
    """Entry point from the CLI: prepare, fork the workers, serve until stopped."""
    sup: Supervisor | None = None
    try:
        target = _load_worker_target()  # import once, before forking: children share it
        sup = Supervisor(cfg, target)
        sup.prepare()
    except StartupError as e:
        if sup is not None and sup.socket_dir:
            peercred.remove_socket_dir(sup.socket_dir)
        if logging.getLogger().handlers:
            log.warning("%s", e)
        if cfg.logfile or not logging.getLogger().handlers:  # else the line is on stdout
            print(f"disque-mp: {e}", file=sys.stderr)
        return 1
    return sup.run()
