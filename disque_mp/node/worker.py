"""One worker process: the shard it owns, its client connections, its mesh links.

``run_worker(cfg, index, node_id, ready)`` is what the supervisor forks. The
worker binds the client port (SO_REUSEPORT), serves its connections and routes
each command by the command table (docs/architecture.md, "Invariants"):

    queue    owner of the queue's slot: inline when it is us, else a mesh CMD
    ids      every ID checked first (-BADID), split by owner, ints summed
    getjob   ``GetJob`` (getjob.py): owners asked left to right, blocked at all of them
    scatter  node-wide commands (``commands/admin.py``) gathered from every worker
    local    answered here (``commands/admin.py``)

Effects of the shard are drained after every batch of calls: ``Wake`` answers a
pending client (ours or a peer's), ``Send`` goes to the cluster bus, and
``AofAppend`` to the AOF manager.

A connection whose commands all go to one other worker is handed to it
(``Handoff``, SCM_RIGHTS) once nothing is buffered or pending on it: forwarding
costs about a third of the throughput (measured with a throwaway sketch before the node was built), moving the socket nothing.
"""

from __future__ import annotations

import array
import asyncio
import ctypes
import functools
import gc
import ipaddress
import logging
import os
import random
import resource
import signal
import socket
import time
from collections.abc import Callable
from typing import Any, Final

import hiredis

from bus import auth as bus_auth
from bus import mesh as meshmod
from bus.mesh import HANDOFF_PURPOSE, Link, Mesh, handoff_state_bytes_max, pack, unpack
from bus.sockpass import SocketPass
from disque_mp.node.clock import now_ms
from disque_mp.node.commands import admin as cmd_node
from disque_mp.node.commands import jobs as cmd_jobs
from disque_mp.node.commands.jobs import GetJobArgs
from disque_mp.node.commands.table import TABLE, Command, run_on_shard
from disque_mp.node.config import Config
from disque_mp.node.connection import ClientConn, PendingReply, listen_sockets
from disque_mp.node.getjob import GetJob
from disque_mp.node.log import setup_logging
from disque_mp.node.memory import ERR_OOM, Monitor, rss_bytes
from disque_mp.node.resp import NULL3, NULL_ARRAY2, encode, encode_jobs
from disque_mp.node.slowlog import SlowLog
from workers.effects import AofAppend, Send, Wake
from workers.ids import is_valid_job_id, owner_of_job_id, owner_of_queue
from workers.invariant import InvariantError
from workers.replies import (
    ERR_BADID,
    NULL_ARRAY,
    PENDING,
    Error,
    Status,
    err_arity,
    err_unknown,
)

log = logging.getLogger("disque_mp.node.worker")

parent_poll_s = 0.5  # PDEATHSIG covers most deaths; the poll covers a parent that forked us from a thread
shutdown_drain_s = 3.0  # SIGTERM: longest wait for in-flight replies to be written
owner_cache_max = 65536  # queue name -> owner memo; cleared when full (names are unbounded)
handoff_streak_min = 16  # consecutive commands for one other worker before moving the socket
handoff_per_conn_max = 4  # a connection whose traffic keeps changing owner stays put after this
# At start, wait this long for the first membership view before serving anyway (worker
# 0 publishes it from nodes.conf at once; the others get it from worker 0).
view_wait_s = 10.0
view_poll_s = 0.005
# The cyclic collector: job records are GC-tracked, and with the default
# thresholds every 25 % growth of the job table triggers a full pass over all of it
# (measured in-process: 400k ADDJOB on a growing table 5.2 s default, 3.5 s with these).
# gen0 10,000: a young pass stays a few ms; gen2 only after 100 gen1 passes (10M
# allocations) and then still under CPython's 25 % rule, so cycles are still freed.
gc_thresholds = (10_000, 10, 100)
idle_check_ms = 1000  # `timeout` is in seconds: checking each second is exact enough
PR_SET_PDEATHSIG = 1
NOAUTH_OK: Final = frozenset({"auth", "hello", "quit"})
ERR_NOAUTH: Final = Error("NOAUTH Authentication required.")
ERR_INTERNAL: Final = Error("ERR internal error, see the server log")


# Redis' text, word for word (redis-cli users search for it)
DENIED_PROTECTED: Final = (
    b"-DENIED Redis is running in protected mode because protected mode is enabled and no "
    b"password is set for the default user. In this mode connections are only accepted from "
    b"the loopback interface. If you want to connect from external computers to Redis you may "
    b"adopt one of the following solutions: 1) Just disable protected mode sending the command "
    b"'CONFIG SET protected-mode no' from the loopback interface by connecting to Redis from the "
    b"same host the server is running, however MAKE SURE Redis is not publicly accessible from "
    b"internet if you do so. Use CONFIG REWRITE to make this change permanent. 2) Alternatively "
    b"you can just disable the protected mode by editing the Redis configuration file, and "
    b"setting the protected mode option to 'no', and then restarting the server. 3) If you "
    b"started the server manually just for testing, restart it with the '--protected-mode no' "
    b"option. 4) Set up an authentication password for the default user. NOTE: You only need "
    b"to do one of the above things in order for the server to start accepting connections "
    b"from the outside.\r\n")


def is_loopback_addr(addr: str, with_port: bool = True) -> bool:
    """``addr`` is ``ip:port`` as ClientConn.addr holds it (or a bare IP with
    ``with_port=False``); "" (a Unix socket) and "localhost" count as loopback."""
    if not addr or addr == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(addr.rpartition(":")[0] if with_port else addr)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


_perf_ns = time.perf_counter_ns  # INFO commandstats; a local name saves a lookup per command


def run_worker(cfg: Config, index: int, node_id: str, ready: Any) -> None:
    """Serve as worker ``index`` until SIGTERM (exit 0) or the parent's death."""
    _die_with_parent()
    import uvloop

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    worker = Worker(cfg, index, node_id)
    try:
        loop.run_until_complete(worker.main(ready))
    finally:
        loop.close()


def _on_loop_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A broken shard invariant ends the worker (the supervisor restarts it with
    an empty shard rebuilt from the AOF); any other error in a callback only
    costs the connection it happened on, as asyncio's default handler does."""
    exc = context.get("exception")
    loop.default_exception_handler(context)
    if isinstance(exc, InvariantError):
        log.warning("Broken invariant, worker exits: %s", exc)
        logging.shutdown()
        os._exit(70)


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the getppid poll still catches it


class Worker:
    def __init__(self, cfg: Config, index: int, node_id: str) -> None:
        self.cfg = cfg
        self.index = index
        self.workers = cfg.workers
        self.node_id = node_id
        self.parent_pid = os.getppid()
        self.start_s = time.time()
        self.now_ms = now_ms()
        self.conns: set[ClientConn] = set()
        self.dirty: list[ClientConn] = []
        self.flush_scheduled = False
        self.tokens: dict[int, Callable[[Any], None]] = {}  # shard token -> Wake handler
        self.getjobs: dict[int, GetJob] = {}  # our blocked GETJOBs by token
        self.next_token = 0
        self.next_client = 0
        self.owner_cache: dict[bytes, int] = {}
        self.raw_rid = 0  # ids of RAW mesh requests (u32, wraps)
        self.raw_reader = hiredis.Reader()  # parses the RAW frames peers send us
        self.handoff_streak_min = handoff_streak_min if self.workers > 1 else 1 << 62
        # stats (INFO)
        self.net_in_bytes = 0
        self.net_out_bytes = 0
        self.connections_received = 0
        self.commands_processed = 0
        self.rejected_connections = 0
        self.handed_off = 0
        self.cmdstats: dict[str, list[int]] = {}
        self.slowlog = SlowLog(index, self.workers)
        self.slowlog.configure(cfg.slowlog_log_slower_than, cfg.slowlog_max_len)
        self.slowlog_min_ns = self.slowlog.min_ns  # read per command: a native attribute
        self.tick_handle: asyncio.TimerHandle | None = None
        self.tick_at = 0
        self.idle_check_at = 0
        self.rate_base = (0, 0, 0)  # commands, bytes in, bytes out at the last sample
        self.rates: tuple[int, float, float] = (0, 0.0, 0.0)  # ops/s, KB/s in, KB/s out
        self.stopping = False
        self.rewrite_aof_at_exit = False  # SHUTDOWN REWRITE-AOF
        self.servers: list[asyncio.AbstractServer] = []
        self.lookup = self._build_lookup()
        self.fast = self._build_fast()
        self.send_hook: Callable[[Send], None] = self._drop_send
        self.aof: Any = None
        self.agent: Any = None
        self.memory: Monitor | None = None
        cmd_jobs.apply_limits(cfg)
        self.view_seen = False  # a membership view reached the shard (on_view)
        self.oom = False  # past maxmemory: denyoom commands answer ERR_OOM (disque_mp/node/memory.py)
        # protected mode (Redis'): no password and bound beyond loopback -> loopback clients only
        self.protected_bind = any(not is_loopback_addr(a, False) for a in cfg.bind.split() or ["*"])

    # ------------------------------------------------------------------ lifecycle

    async def main(self, ready: Any) -> None:
        self.loop = asyncio.get_running_loop()
        self.loop.set_exception_handler(_on_loop_exception)
        self.stopped: asyncio.Future[None] = self.loop.create_future()
        self.shard = self._make_shard()
        self._start_aof()
        gc.freeze()  # the loaded job table and start-up objects: never rescanned
        gc.set_threshold(*gc_thresholds)
        self.mesh = Mesh(self.cfg.port, self.node_id, self.index, self.workers, self)
        self.handoff = SocketPass(self.cfg.port, self.node_id, self.index, HANDOFF_PURPOSE, self.adopt, handoff_state_bytes_max)
        # The membership view first: a shard serving before it knows its peers (a
        # command forwarded by a worker already up) answers ADDJOB with -NOREPL.
        # Other workers' requests wait in their mesh links meanwhile.
        await self._start_cluster()
        await self.mesh.start()
        for sock in listen_sockets(self.cfg.bind, self.cfg.port, self.cfg.tcp_backlog):
            self.servers.append(await self.loop.create_server(lambda: ClientConn(self), sock=sock))
        await self._start_tls()
        await self._start_http()
        self.loop.add_signal_handler(signal.SIGTERM, self.request_stop)
        self.loop.add_signal_handler(signal.SIGHUP, self.reopen_log)
        self.loop.call_later(parent_poll_s, self._check_parent)
        self._tick()
        self.memory = Monitor(self)
        self.memory.start()
        if ready is not None:
            ready.set()
        log.info("Worker %d ready to accept connections on port %d", self.index, self.cfg.port)
        await self.stopped
        await self._shutdown(self.rewrite_aof_at_exit)

    def _make_shard(self) -> Any:
        from workers.shard import Shard

        rng = random.Random(os.urandom(16))
        return Shard(self.node_id, self.index, self.workers, os.urandom(16), rng, now_ms())

    def _start_aof(self) -> None:
        try:
            from disque_mp.node.aof import AofManager, ShardAdapter
        except ImportError:
            return
        from disque_mp.node.aof import AofLoadError

        self.aof = AofManager(self.cfg, self.index, ShardAdapter(self.shard))
        try:
            self.aof.load(now_ms())
        except (AofLoadError, OSError) as e:
            log.warning("Fatal error loading the AOF: %s", e)
            raise SystemExit(1) from None  # never serve a partial state
        self.aof_task = asyncio.get_running_loop().create_task(self.aof.run())

    async def _start_cluster(self) -> None:
        try:
            from disque_mp.node.commands import cluster as cmd_cluster
        except ImportError:
            return
        self.agent = cmd_cluster.make_agent(self.cfg, self.index, self.node_id, self.workers,
                                            self.on_cluster_message, self.on_view)
        await self.agent.start()
        self.send_hook = self._send_to_bus
        deadline = self.loop.time() + view_wait_s
        while not self.view_seen and self.loop.time() < deadline:
            await asyncio.sleep(view_poll_s)
        if not self.view_seen:
            log.warning("Worker %d serving without a cluster view after %.0f s", self.index,
                        view_wait_s)

    async def _start_http(self) -> None:
        """/metrics, the admin API and the dashboard on http-port (disque_mp/node/http/)."""
        from disque_mp.node import http

        self.servers += await http.start(self)

    async def _start_tls(self) -> None:
        """``tls-port``: the same clients over TLS (disque_mp/node/tls.py)."""
        if not self.cfg.tls_port:
            return
        from disque_mp.node import tls

        try:
            ctx = tls.server_context(self.cfg)
        except tls.TlsConfigError as exc:
            log.warning("Fatal TLS configuration error: %s", exc)
            raise SystemExit(1) from None
        for sock in listen_sockets(self.cfg.bind, self.cfg.tls_port, self.cfg.tcp_backlog):
            self.servers.append(await self.loop.create_server(lambda: ClientConn(self), sock=sock,
                                                              ssl=ctx))

    def reopen_log(self) -> None:
        """SIGHUP (the supervisor forwards its own): reopen the log file, as after logrotate."""
        try:
            setup_logging(self.cfg, f"W{self.index}")
            log.info("Received SIGHUP: log file reopened")
        except OSError as e:
            log.warning("Received SIGHUP: can't reopen the log file: %s", e)

    def request_stop(self) -> None:
        if not self.stopped.done():
            self.stopped.set_result(None)

    def _check_parent(self) -> None:
        if os.getppid() != self.parent_pid:
            os._exit(0)  # the supervisor is gone: free the ports at once
        self.loop.call_later(parent_poll_s, self._check_parent)

    async def _shutdown(self, rewrite_aof: bool = False) -> None:
        self.stopping = True
        for server in self.servers:
            server.close()
        deadline = time.monotonic() + shutdown_drain_s
        while time.monotonic() < deadline and any(self._in_flight(c) for c in self.conns):
            await asyncio.sleep(0.01)
        if self.aof is not None:
            self.aof.shutdown(rewrite_aof)
        for conn in list(self.conns):
            if conn.transport is not None:
                conn.transport.close()
        self.mesh.close()
        self.handoff.close()
        if self.agent is not None:
            await self.agent.close()
        log.info("Worker %d exiting", self.index)

    def _in_flight(self, conn: ClientConn) -> bool:
        if conn.transport is None:
            return False
        blocked = bool(conn.waiters) and all(type(s) is PendingReply and s.data is None for s in (conn.slots or ()))
        return not blocked and (conn.pending() or conn.transport.get_write_buffer_size() > 0)

    def log(self, text: str) -> None:
        log.warning("%s", text)

    # ------------------------------------------------------------------ connections

    def new_client_id(self) -> int:
        self.next_client += 1
        return self.next_client * self.workers + self.index  # unique over the node

    def conn_opened(self, conn: ClientConn) -> None:
        if self.protected_bind and self.cfg.protected_mode and not self.cfg.requirepass \
                and not conn.handoffs and not is_loopback_addr(conn.addr):
            self.rejected_connections += 1
            assert conn.transport is not None
            conn.transport.write(DENIED_PROTECTED)
            conn.transport.close()
            conn.closing = True
            return
        if len(self.conns) * self.workers >= self.cfg.maxclients:
            self.rejected_connections += 1
            assert conn.transport is not None
            conn.transport.write(b"-ERR max number of clients reached\r\n")
            conn.transport.close()
            conn.closing = True
            return
        self.conns.add(conn)
        if not conn.handoffs:  # a connection moved here was counted where it arrived
            self.connections_received += 1

    def conn_closed(self, conn: ClientConn) -> None:
        self.conns.discard(conn)
        for waiter in list(conn.waiters):
            waiter.cancel()

    def mark_dirty(self, conn: ClientConn) -> None:
        if not conn.dirty:
            conn.dirty = True
            self.dirty.append(conn)
            if not self.flush_scheduled:
                self.flush_scheduled = True
                self.loop.call_soon(self.flush_dirty)

    def flush_dirty(self) -> None:
        """Replies completed outside a client's read: one write per connection per turn."""
        self.flush_scheduled = False
        dirty, self.dirty = self.dirty, []
        if self.aof is not None:
            self.aof.write_before_replies()
        for conn in dirty:
            conn.write_out()
            if conn.streak >= self.handoff_streak_min and not conn.closing:
                self.maybe_handoff(conn)

    # ------------------------------------------------------------------ commands

    def _build_lookup(self) -> dict[bytes, tuple[Command, Callable[..., Any], list[int]]]:
        routes = {"queue": self.cmd_queue, "ids": self.cmd_ids, "getjob": self.cmd_getjob}
        out = {}
        for name, cmd in TABLE.items():
            handler = routes.get(cmd.route)
            if handler is None:  # scatter and local: the table's handler, run here
                own = cmd.handler
                if own is None:
                    raise InvariantError(f"command {cmd.name} has no handler")
                handler = functools.partial(own, self)
            stat = self.cmdstats.setdefault(cmd.name, [0, 0])
            entry = (cmd, handler, stat)
            out[name] = entry
            out[name.upper()] = entry
        return out

    def begin_batch(self) -> None:
        self.now_ms = now_ms()

    def end_batch(self) -> None:
        self.drain_effects()
        if self.aof is not None:
            self.aof.write_before_replies()
        self._reschedule_tick()

    def execute(self, conn: ClientConn, cmd: list[bytes]) -> bytes | None:
        """Run one command; its encoded reply, or None when it will come later."""
        fast = self.fast.get(cmd[0])
        if fast is not None and conn.authed and not self.oom:
            reply = fast(conn, cmd)
            if reply is not None:
                return reply or None  # b"": forwarded, the reply comes later
        return self._execute(conn, cmd)

    def _execute(self, conn: ClientConn, cmd: list[bytes]) -> bytes | None:
        """The general path: table lookup, checks, route, generic encoding."""
        entry = self.lookup.get(cmd[0])
        if entry is None:
            entry = self.lookup.get(cmd[0].lower())
            if entry is None:
                return self._unknown(conn, cmd)
        command, handler, stat = entry
        n = len(cmd)
        arity = command.arity
        if (arity > 0 and n != arity) or n < -arity:
            return encode(err_arity(command.name))
        if not conn.authed and command.name not in NOAUTH_OK:
            return encode(ERR_NOAUTH)
        if self.oom and "denyoom" in command.flags:
            return encode(ERR_OOM)
        t0 = _perf_ns()
        reply = handler(conn, cmd)
        self._account(stat, command.name, conn, t0, cmd)
        if reply is PENDING:
            return None
        return encode(reply, conn.resp3)

    # --- fast paths: the common shapes of the hot commands ---
    #
    # Each returns the encoded reply, or None before doing anything when the
    # command is not of its shape (options, appendfsync always, a reply that waits
    # for replication): the general path then runs it. None after doing something
    # would run the command twice, so a reply that comes later is never a fast
    # path's, except GETJOB's, whose general path is the same ``getjob`` (b"": the
    # reply comes later). The work done is exactly the general path's for that
    # shape (the same parser and shard call, the same counters); only the table
    # lookup, the route layers and the generic encoder are skipped.

    def _build_fast(self) -> dict[bytes, Callable[[ClientConn, list[bytes]], bytes | None]]:
        out: dict[bytes, Callable[[ClientConn, list[bytes]], bytes | None]] = {}
        for name, cmd in TABLE.items():  # the table says which commands have one
            if not cmd.fast:
                continue
            fn = getattr(self, f"_fast_{cmd.name}")
            out[name] = out[name.upper()] = fn
        return out

    def _fast_ackjob(self, conn: ClientConn, cmd: list[bytes]) -> bytes | None:
        return self._fast_ack(conn, cmd, False)

    def _fast_fastack(self, conn: ClientConn, cmd: list[bytes]) -> bytes | None:
        return self._fast_ack(conn, cmd, True)

    def _fast_ack(self, conn: ClientConn, cmd: list[bytes], fast: bool) -> bytes | None:
        # ACKJOB / FASTACK id..., every ID valid and owned here: each ID is checked
        # once (the general path validates in the router and again in cmd_jobs).
        n = len(cmd)
        if n < 2:
            return None
        workers = self.workers
        owner = self.index
        ids: list[str] = []
        for i in range(1, n):
            raw = cmd[i]
            if not is_valid_job_id(raw):
                return None  # the general path answers -BADID
            job_id = raw.decode()
            if workers > 1:
                at = owner_of_job_id(job_id, workers)
                if i == 1:
                    owner = at
                elif at != owner:
                    return None  # several owners: the general path splits them
            ids.append(job_id)
        if owner != self.index:
            return self.forward_raw(conn, owner, cmd, "fastack" if fast else "ackjob")
        reply = self._ack_here(ids, fast, cmd)
        if reply is not None:
            conn.streak = 0
            conn.last_cmd = "fastack" if fast else "ackjob"
        return reply

    def _ack_here(self, ids: list[str], fast: bool, cmd: list[bytes]) -> bytes | None:
        if self.cfg.appendfsync == "always":
            return None
        t0 = _perf_ns()
        if fast:
            acked = self.shard.op_fastack(ids, self.now_ms)
            self._count("fastack", t0, cmd)
        else:
            acked = self.shard.op_ackjob(ids, self.now_ms)
            self._count("ackjob", t0, cmd)
        return b":%d\r\n" % acked

    def _fast_addjob(self, conn: ClientConn, cmd: list[bytes]) -> bytes | None:
        if len(cmd) != 4:
            return None
        if self.workers > 1:
            owner = self.owner_of(cmd[1])
            if owner != self.index:
                return self.forward_raw(conn, owner, cmd, "addjob")
        reply = self._addjob_here(cmd)
        if reply is not None:
            conn.streak = 0
            conn.last_cmd = "addjob"
        return reply

    def _addjob_here(self, cmd: list[bytes]) -> bytes | None:
        """``ADDJOB q body timeout`` of a queue we own, or None for the general path."""
        if self.cfg.appendfsync == "always" or self.shard.has_peers():
            return None  # it waits for replication: the general path defers the reply
        t0 = _perf_ns()
        self.next_token = token = self.next_token + 1
        reply = cmd_jobs.addjob_plain(self.shard, cmd[1], cmd[2], cmd[3], token, self.now_ms)
        self._count("addjob", t0, cmd)
        if type(reply) is Status:
            return f"+{reply}\r\n".encode()
        return encode(reply)  # an error (same bytes in RESP2 and 3): with no peers nothing is PENDING

    def _fast_getjob(self, conn: ClientConn, cmd: list[bytes]) -> bytes | None:
        spec = cmd_jobs.parse_getjob(cmd, 1)
        if not isinstance(spec, GetJobArgs):
            return None  # the general path answers the error
        owner = self._single_owner(spec.queues)
        if owner != self.index and owner >= 0 and spec.nohang:
            # NOHANG never blocks, so the owner answers it alone; a GETJOB that may
            # block needs the coordinator here (``getjob``)
            return self.forward_raw(conn, owner, cmd, "getjob")
        t0 = _perf_ns()
        reply = self.getjob(conn, spec, owner)
        self._count("getjob", t0, cmd)
        conn.last_cmd = "getjob"
        if reply is PENDING:
            return b""
        return _encode_getjob(reply, spec.withcounters, conn.resp3)

    def _getjob_here(self, cmd: list[bytes], resp3: bool) -> bytes | None:
        """A NOHANG GETJOB another worker forwarded, its queues ours: the reply, or
        None for a command that does not parse (the general path answers it)."""
        spec = cmd_jobs.parse_getjob(cmd, 1)
        if not isinstance(spec, GetJobArgs):
            return None
        t0 = _perf_ns()
        reply = cmd_jobs.getjob_now(self.shard, spec, self.now_ms)
        if reply is None:
            return None  # not NOHANG: only the coordinator blocks (never forwarded)
        self._count("getjob", t0, cmd)
        return _encode_getjob(reply, spec.withcounters, resp3)

    def _count(self, name: str, t0: int, cmd: list[bytes]) -> None:
        """A fast path's command ran from ``t0``: commandstats, slowlog, counters."""
        took = _perf_ns() - t0
        stat = self.cmdstats[name]
        stat[0] += 1
        stat[1] += took
        if took >= self.slowlog_min_ns >= 0:
            self.slowlog.add(cmd, took)
        self.commands_processed += 1

    def _account(self, stat: list[int], name: str, conn: ClientConn, t0: int,
                 cmd: list[bytes]) -> None:
        """A command ran from ``t0``: commandstats, the slowlog, INFO's counters."""
        took = _perf_ns() - t0
        stat[0] += 1
        stat[1] += took
        if took >= self.slowlog_min_ns >= 0:
            self.slowlog.add(cmd, took)
        self.commands_processed += 1
        conn.last_cmd = name

    def _pending_local(self, conn: ClientConn, token: int) -> None:
        """A local op answered PENDING: its reply comes as Wake(token), in order."""
        slot = conn.defer()
        self.tokens[token] = self._durable(lambda value: conn.fill(slot, encode(value, conn.resp3)))

    def _unknown(self, conn: ClientConn, cmd: list[bytes]) -> bytes:
        if cmd[0].lower() == b"quit":
            conn.closing = True
            conn.close_after_write = True
            return b"+OK\r\n"
        return encode(err_unknown(cmd[0].decode("utf-8", "replace")))

    def run_local(self, name: bytes, args: list[bytes], token: int) -> Any:
        return run_on_shard(self.shard, name, args, token, self.now_ms)

    def _aof_must_hold(self, before: int, reply: Any) -> bool:
        """appendfsync always: a reply whose records are not durable yet waits for
        the loop turn's commit (``aof.hold``; it becomes the AOF error if that fails)."""
        aof = self.aof
        if aof is None or reply is PENDING or not aof.holds_replies():
            return False
        self.drain_effects()
        return bool(aof.appended != before)

    def _durable(self, deliver: Callable[[Any], None]) -> Callable[[Any], None]:
        """A reply completed later (Wake) waits for its records under appendfsync always."""
        if self.aof is None or self.cfg.appendfsync != "always":
            return deliver
        return self.aof.when_durable(deliver)

    def new_token(self) -> int:
        self.next_token += 1
        return self.next_token

    # --- route: queue ---

    def owner_of(self, queue: bytes) -> int:
        owner = self.owner_cache.get(queue)
        if owner is None:
            if len(self.owner_cache) >= owner_cache_max:
                self.owner_cache.clear()
            owner = self.owner_cache[queue] = owner_of_queue(queue, self.workers)
        return owner

    def cmd_queue(self, conn: ClientConn, cmd: list[bytes]) -> Any:
        owner = self.owner_of(cmd[1]) if self.workers > 1 else self.index
        return self._run_at(conn, owner, cmd)

    def _run_at(self, conn: ClientConn, owner: int, cmd: list[bytes]) -> Any:
        name = cmd[0].lower()
        if owner == self.index:
            conn.streak = 0
            self.next_token += 1
            token = self.next_token
            before = self.aof.appended if self.aof is not None else 0
            reply = self.run_local(name, cmd[1:], token)
            if self.cfg.appendfsync == "always" and self._aof_must_hold(before, reply):
                slot = conn.defer()
                self.aof.hold(self.aof.appended, lambda v: conn.fill(slot, encode(v, conn.resp3)), reply)
                return PENDING
            if reply is PENDING:
                self._pending_local(conn, token)
            return reply
        self._count_streak(conn, owner)
        slot = conn.defer()
        self.forward(owner, name, cmd[1:], lambda value: conn.fill(slot, encode(value, conn.resp3)))
        return PENDING

    def _count_streak(self, conn: ClientConn, owner: int) -> None:
        if conn.streak_owner == owner:
            conn.streak += 1
        else:
            conn.streak_owner = owner
            conn.streak = 1

    def forward(self, owner: int, name: bytes, args: list[bytes], done: Callable[[Any], None]) -> None:
        """Run a job command on another worker; ``done(reply value)``."""
        self.mesh.command(owner, name.decode(), args,
                          lambda meta, bodies: done(unpack(meta.get("v"), bodies)))

    # --- forwarding, hot path: RESP in, RESP out (mesh RAW / RAWREPLIES) ---

    def forward_raw(self, conn: ClientConn, owner: int, cmd: list[bytes], name: str) -> bytes:
        """Send a hot command to its owner as RESP; its reply bytes will fill a slot
        of ``conn``. Returns b"" (the reply comes later). The owner counts the
        command (commandstats, slowlog), as it runs it."""
        self._count_streak(conn, owner)
        conn.last_cmd = name
        conn.forwarded += 1
        slot = conn.defer()
        link: Any = self.mesh.links[owner]  # a Link: never ourselves
        if link.cmd_rids:
            link.close_batches()  # CMDS commands queued before this one run first
        rids = link.raw_rids
        if not rids:
            self.mesh.mark(link)
        self.raw_rid = rid = (self.raw_rid + 1) & 0xFFFFFFFF
        rids.append(rid)
        link.raw_flags.append(1 if conn.resp3 else 0)
        _append_resp(link.raw_parts, cmd)
        link.raw_pending[rid] = (conn, slot)
        return b""

    def on_raw_replies(self, link: Link, bodies: list[bytes]) -> None:
        """RAWREPLIES from an owner: splice each reply into its client's stream."""
        rids = array.array("I")
        rids.frombytes(bodies[0])
        lens = array.array("I")
        lens.frombytes(bodies[1])
        data = bodies[2]
        pending = link.raw_pending
        at = 0
        for i in range(len(rids)):
            end = at + lens[i]
            waiting = pending.pop(rids[i], None)
            if waiting is not None:
                conn, slot = waiting
                conn.forwarded -= 1
                conn.fill(slot, data[at:end])
            at = end

    def raw_failed(self, waiting: list[Any], text: str) -> None:
        """RAW requests whose owner went away: the client gets the error."""
        reply = encode(Error(text))
        for conn, slot in waiting:
            conn.forwarded -= 1
            conn.fill(slot, reply)

    def _serve_raw(self, link: Link, bodies: list[bytes]) -> None:
        """A RAW frame: a peer's hot commands of one loop turn, as RESP."""
        rids = array.array("I")
        rids.frombytes(bodies[0])
        flags = bodies[1]
        reader = self.raw_reader
        reader.feed(bodies[2])
        if link.transport is None:
            return  # the asker is gone
        for i in range(len(rids)):
            cmd: Any = None
            try:
                cmd = reader.gets()
                reply = self._serve_raw_one(cmd, flags[i] == 1)
            except InvariantError:
                raise
            except Exception:  # a bug: answer it, or the asking client waits forever
                log.exception("command %r from a peer failed", cmd)
                reply = encode(ERR_INTERNAL)
                if type(cmd) is not list:  # the frame itself is broken: start afresh
                    self.raw_reader = reader = hiredis.Reader()
            if reply is None:
                self._serve_raw_general(link, rids[i], cmd[0].lower(), cmd, flags[i] == 1)
                continue
            replies: Any = link.rawrep_rids  # fetched each time: a general command may close the batch
            if not replies:
                self.mesh.mark(link)
            replies.append(rids[i])
            link.rawrep_lens.append(len(reply))
            link.rawrep_parts.append(reply)

    def _serve_raw_one(self, cmd: list[bytes], resp3: bool) -> bytes | None:
        """A RAW command in a fast path's shape: its reply, else None."""
        name = cmd[0].lower()
        reply: bytes | None = None
        if name == b"addjob":
            reply = self._addjob_here(cmd)
        elif name == b"getjob":
            reply = self._getjob_here(cmd, resp3)
        elif name == b"ackjob" or name == b"fastack":
            reply = self._ack_here([a.decode() for a in cmd[1:]], name == b"fastack", cmd)
        return reply

    def _serve_raw_general(self, link: Link, rid: int, name: bytes, cmd: list[bytes],
                           resp3: bool) -> None:
        """What a RAW command's fast path does not take (options, peers, appendfsync
        always): the general route, as for a client of ours."""
        token = self.new_token()
        before = self.aof.appended if self.aof is not None else 0
        t0 = _perf_ns()
        try:
            reply = self.run_local(name, cmd[1:], token)
        except InvariantError:
            raise
        except Exception:  # a bug: answer it, or the asking client waits forever
            log.exception("command %r from a peer failed", name)
            reply = ERR_INTERNAL
        self._count(name.decode(), t0, cmd)

        def deliver(value: Any) -> None:
            link.raw_reply(rid, encode(value, resp3))

        if self.cfg.appendfsync == "always" and self._aof_must_hold(before, reply):
            self.aof.hold(self.aof.appended, deliver, reply)
        elif reply is PENDING:
            self.tokens[token] = self._durable(deliver)
        else:
            deliver(reply)

    # --- route: ids ---

    def cmd_ids(self, conn: ClientConn, cmd: list[bytes]) -> Any:
        ids = cmd[1:]
        if self.workers == 1 or not ids:
            return self._run_at(conn, self.index, cmd)
        for job_id in ids:
            if not is_valid_job_id(job_id):
                return ERR_BADID
        groups: dict[int, list[bytes]] = {}
        for job_id in ids:
            groups.setdefault(owner_of_job_id(job_id.decode(), self.workers), []).append(job_id)
        if len(groups) == 1:
            (owner,) = groups
            return self._run_at(conn, owner, cmd)
        return self._split_ids(conn, cmd[0].lower(), groups)

    def _split_ids(self, conn: ClientConn, name: bytes, groups: dict[int, list[bytes]]) -> Any:
        conn.streak = 0
        results: list[Any] = []
        slot = conn.defer()

        def one(value: Any) -> None:
            results.append(value)
            if len(results) == len(groups):
                conn.fill(slot, encode(_merge_counts(results), conn.resp3))

        for owner, ids in groups.items():
            if owner == self.index:
                before = self.aof.appended if self.aof is not None else 0
                value = self.run_local(name, ids, self.new_token())
                if self._aof_must_hold(before, value):
                    self.aof.hold(self.aof.appended, one, value)
                else:
                    one(value)
            else:
                self.forward(owner, name, ids, one)
        return PENDING

    # --- route: getjob ---

    def cmd_getjob(self, conn: ClientConn, cmd: list[bytes]) -> Any:
        spec = cmd_jobs.parse_getjob(cmd, 1)
        if isinstance(spec, Error):
            return spec
        return self.getjob(conn, spec, self._single_owner(spec.queues))

    def getjob(self, conn: ClientConn, spec: GetJobArgs, owner: int) -> Any:
        """GETJOB for a client of ours (``owner``: of every queue, -1 when they are
        spread): answered by our shard when the queues are ours, else coordinated by
        ``GetJob``; the jobs, ``NULL_ARRAY``, an error or PENDING."""
        if owner == self.index:
            conn.streak = 0
            reply = cmd_jobs.getjob_now(self.shard, spec, self.now_ms)
            if reply is not None:
                return reply
            return GetJob(self, conn, spec).wait_here()
        if owner >= 0:
            self._count_streak(conn, owner)  # a consumer of another worker's queue moves there
        return GetJob(self, conn, spec).start()

    def _single_owner(self, queues: list[bytes]) -> int:
        """The worker owning every queue named, or -1 when they are spread."""
        if self.workers == 1:
            return self.index
        owner = self.owner_of(queues[0])
        for i in range(1, len(queues)):
            if self.owner_of(queues[i]) != owner:
                return -1
        return owner

    # ------------------------------------------------------------------ effects and time

    def drain_effects(self) -> None:
        effects = self.shard.take_effects()
        while effects:
            for eff in effects:
                if type(eff) is Wake:
                    handler = self.tokens.pop(eff.token, None)
                    if handler is not None:
                        handler(eff.reply)
                elif type(eff) is Send:
                    self.send_hook(eff)
                elif type(eff) is AofAppend:
                    if self.aof is not None:
                        self.aof.append_effect(eff.record)  # committed once per loop turn
            effects = self.shard.take_effects()  # handlers may have called the shard

    def _drop_send(self, eff: Send) -> None:
        pass  # no cluster bus in this build: single node

    def _send_to_bus(self, eff: Send) -> None:
        self.agent.send(eff.node_id, eff.kind, eff.slot, eff.meta, eff.bodies)

    def on_cluster_message(self, sender: str, kind: str, slot: int, meta: dict[str, Any],
                           bodies: list[bytes]) -> None:
        on_message = getattr(self.shard, "on_message", None)
        if on_message is not None:
            on_message(sender, kind, meta, bodies, now_ms())
            self.drain_effects()
            self._reschedule_tick()

    def leaving(self) -> bool:
        """CLUSTER LEAVING yes on this node (the membership view says so)."""
        return self.agent is not None and bool(self.agent.view.get("leaving"))

    def on_view(self, view: dict[str, Any]) -> None:
        from bus import membership as mb

        # The shard needs every known node (default REPLICATE = cluster size), which are
        # reachable, which are leaving, our own LEAVING flag and our ID (RESET HARD).
        peers = [(p.node_id, p.reachable, p.leaving) for p in mb.peers(view)]
        self.shard.set_view(view.get("myid", self.node_id), peers, bool(view.get("leaving")))
        self.view_seen = True
        self.drain_effects()  # LEAVING releases blocked clients with -LEAVING

    def _tick(self) -> None:
        self.tick_handle = None
        self.now_ms = now_ms()
        if self.now_ms >= self.idle_check_at:
            self._each_second()
        self.slowlog.configure(self.cfg.slowlog_log_slower_than, self.cfg.slowlog_max_len)
        self.slowlog_min_ns = self.slowlog.min_ns
        due = self.shard.tick(self.now_ms)
        self.drain_effects()
        period_ms = max(1, 1000 // max(self.cfg.hz, 1))
        at = self.now_ms + period_ms if due is None else min(due, self.now_ms + period_ms)
        self._schedule_tick(at)

    def _each_second(self) -> None:
        """Rates for INFO (instantaneous_*) and Redis' idle client `timeout`."""
        elapsed_ms = self.now_ms - self.idle_check_at + idle_check_ms
        self.idle_check_at = self.now_ms + idle_check_ms
        now = (self.commands_processed, self.net_in_bytes, self.net_out_bytes)
        if 0 < elapsed_ms < 10 * idle_check_ms:
            per_s = [max(0, a - b) * 1000 / elapsed_ms for a, b in zip(now, self.rate_base, strict=True)]
            self.rates = (int(per_s[0]), per_s[1] / 1024, per_s[2] / 1024)
        self.rate_base = now
        if self.cfg.timeout > 0:
            self._close_idle_clients()

    def _close_idle_clients(self) -> None:
        """Redis' `timeout`: close clients idle that long (blocked ones excepted)."""
        limit_s = time.time() - self.cfg.timeout
        for conn in [c for c in self.conns if c.last_s < limit_s and not c.waiters]:
            if conn.transport is not None and not conn.pending():
                log.log(15, "Closing idle client %s", conn.addr)
                conn.transport.close()

    def _schedule_tick(self, at_ms: int) -> None:
        if self.tick_handle is not None:
            self.tick_handle.cancel()
        self.tick_at = at_ms
        delay_s = max(0, at_ms - now_ms()) / 1000
        self.tick_handle = self.loop.call_later(delay_s, self._tick)

    def _reschedule_tick(self) -> None:
        """An op may have added a timer due before the planned tick (DELAY 0.x, TTL)."""
        due = getattr(self.shard, "_heap", None)
        if due and due[0] < self.tick_at:
            self._schedule_tick(due[0])

    # ------------------------------------------------------------------ mesh: serving peers

    def on_request(self, link: Link, kind: int, meta: dict[str, Any], bodies: list[bytes]) -> None:
        self.now_ms = now_ms()
        if kind == meshmod.K_RAW:
            self._serve_raw(link, bodies)
        elif kind == meshmod.K_CMDS:
            self._serve_cmds(link, meta, bodies)
        elif kind == meshmod.K_CMD:
            self._serve_cmd(link, meta, bodies)
        elif kind == meshmod.K_TAKE:
            entries = self.shard.op_take(bodies, meta["c"], meta["w"], self.now_ms)
            self.reply_peer(link, meta["r"], entries)
        elif kind == meshmod.K_BLOCK:
            self._serve_block(link, meta, bodies)
        elif kind == meshmod.K_UNBLOCK:
            token = _blocked(link).pop(meta["t"], None)
            if token is not None:
                self.tokens.pop(token, None)
                self.shard.op_unblock(token, self.now_ms)
        elif kind == meshmod.K_RETURN:
            self.shard.op_return([b.decode() for b in bodies], self.now_ms)
        elif kind == meshmod.K_SCATTER:
            try:
                reply = cmd_node.local_op(self, meta["op"], meta.get("a"))
            except InvariantError:
                raise
            except Exception:  # a bug: answer it, or the asking client waits forever
                log.exception("node operation %r failed", meta.get("op"))
                reply = ERR_INTERNAL
            self.reply_peer(link, meta["r"], reply)
        self.drain_effects()
        if self.aof is not None:
            self.aof.write_before_replies()  # the reply frames leave later this turn
        self._reschedule_tick()

    def _serve_cmd(self, link: Link, meta: dict[str, Any], bodies: list[bytes]) -> None:
        self._serve_one(link, meta["r"], meta["n"].encode(), bodies)

    def _serve_cmds(self, link: Link, meta: dict[str, Any], bodies: list[bytes]) -> None:
        """A CMDS frame: the job commands a peer forwarded during one loop turn."""
        at = 0
        for rid, name, argc in zip(meta["r"], meta["n"], meta["c"], strict=True):
            self._serve_one(link, rid, name.encode(), bodies[at : at + argc])
            at += argc

    def _serve_one(self, link: Link, rid: int, name: bytes, args: list[bytes]) -> None:
        token = self.new_token()
        before = self.aof.appended if self.aof is not None else 0
        try:
            reply = self.run_local(name, args, token)
        except InvariantError:
            raise
        except Exception:  # a bug: answer it, or the asking client waits forever
            log.exception("command %r from a peer failed", name)
            reply = ERR_INTERNAL
        if self.cfg.appendfsync == "always" and self._aof_must_hold(before, reply):
            self.aof.hold(self.aof.appended, lambda v: link.reply(rid, v), reply)
            return
        if reply is PENDING:
            self.tokens[token] = self._durable(lambda value: link.reply(rid, value))
        else:
            link.reply(rid, reply)

    def _serve_block(self, link: Link, meta: dict[str, Any], bodies: list[bytes]) -> None:
        remote = meta["t"]
        token = self.new_token()
        blocked = _blocked(link)
        blocked[remote] = token

        def wake(entries: Any) -> None:
            blocked.pop(remote, None)
            out: list[bytes] = []
            value = pack(entries, out)
            if link.transport is None:
                if not isinstance(entries, Error):  # asker is gone: give the jobs back
                    self.shard.op_return([e[1] for e in entries], self.now_ms)
                return
            link.send(meshmod.K_WAKE, {"t": remote, "v": value}, out)

        self.tokens[token] = wake
        self.shard.op_block(token, bodies, meta["c"], meta["w"], self.now_ms)

    def reply_peer(self, link: Link, rid: int, value: Any) -> None:
        link.reply(rid, value)

    def on_incoming_lost(self, link: Link) -> None:
        for token in _blocked(link).values():
            self.tokens.pop(token, None)
            self.shard.op_unblock(token, now_ms())
        self.drain_effects()

    def on_wake(self, peer: int, meta: dict[str, Any], bodies: list[bytes]) -> None:
        entries = unpack(meta.get("v"), bodies)
        job = self.getjobs.get(meta["t"])
        if job is None:
            if not isinstance(entries, Error):
                self.return_jobs(peer, entries)
        else:
            job.woken(peer, entries)

    def on_peer_up(self, peer: int) -> None:
        for job in list(self.getjobs.values()):
            job.reblock(peer)

    def after_batch(self) -> None:
        """After a read of mesh frames: reply callbacks may have called the shard
        (a GETJOB blocking here after remote owners had nothing)."""
        self.drain_effects()
        self._reschedule_tick()

    def return_jobs(self, owner: int, entries: list[Any]) -> None:
        """Give back jobs taken for a GETJOB that no longer wants them."""
        if not entries:
            return
        ids = [str(e[1]) for e in entries]
        if owner == self.index:
            self.shard.op_return(ids, now_ms())
            self.drain_effects()
        else:
            self.mesh.send(owner, meshmod.K_RETURN, {}, [i.encode() for i in ids])

    # ------------------------------------------------------------------ handoff

    def maybe_handoff(self, conn: ClientConn) -> None:
        owner = conn.streak_owner
        transport = conn.transport
        if (owner < 0 or owner == self.index or transport is None or conn.pending()
                or conn.waiters or conn.parser.buffered() or conn.handoffs >= handoff_per_conn_max
                or transport.get_write_buffer_size() or self.stopping):
            return
        sock = transport.get_extra_info("socket")
        if sock is None or transport.get_extra_info("sslcontext") is not None:
            conn.handoffs = handoff_per_conn_max  # TLS state lives here: forward, never hand off
            return
        if not self.handoff.give(owner, sock.fileno(), conn.state()):
            conn.streak = 0
            return
        self.handed_off += 1
        conn.gone = True
        self.conns.discard(conn)
        transport.pause_reading()
        transport.close()  # closes our descriptor only: no FIN while the peer holds it

    def adopt(self, sock: socket.socket, state: dict[str, Any]) -> None:
        """A connection handed to us by another worker."""
        if self.stopping:
            sock.close()
            return
        sock.setblocking(False)

        async def connect() -> None:
            try:
                await self.loop.connect_accepted_socket(lambda: ClientConn(self, state), sock=sock)
            except OSError:
                sock.close()

        self.loop.create_task(connect())

    # ------------------------------------------------------------------ INFO helpers

    def local_stats(self) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        blocked = sum(1 for c in self.conns if c.waiters)
        return {
            "index": self.index, "pid": os.getpid(), "clients": len(self.conns),
            "blocked": blocked, "conns_received": self.connections_received,
            "commands": self.commands_processed, "net_in": self.net_in_bytes,
            "net_out": self.net_out_bytes, "rejected": self.rejected_connections,
            "cpu_sys": usage.ru_stime, "cpu_user": usage.ru_utime, "rss": rss_bytes(),
            "peak": usage.ru_maxrss * 1024, "handed_off": self.handed_off,
            "ops_per_sec": self.rates[0], "in_kbps": self.rates[1], "out_kbps": self.rates[2],
            "cmdstats": {k: v for k, v in self.cmdstats.items() if v[0]},
            "shard": self.shard.info(),
            "aof": self.aof.info() if self.aof is not None else None,
            "mem": self.memory.stats() if self.memory is not None else None,
            "bus": dict(bus_auth.STATS),
        }


def _blocked(link: Link) -> dict[int, int]:
    """Waiters a peer registered over ``link``: its token -> our shard token."""
    return link.blocked


def _merge_counts(results: list[Any]) -> Any:
    total = 0
    for value in results:
        if isinstance(value, Error):
            return value
        total += int(value)
    return total


def _encode_getjob(reply: Any, withcounters: bool, resp3: bool) -> bytes:
    """GETJOB's reply in the client's protocol (jobs by the dedicated encoder)."""
    if reply is NULL_ARRAY:
        return NULL3 if resp3 else NULL_ARRAY2
    if type(reply) is list and not withcounters:
        return encode_jobs(reply)
    return encode(reply, resp3)


def _append_resp(parts: list[bytes], cmd: list[bytes]) -> None:
    """``cmd`` as the RESP multibulk a client sends (the RAW mesh frame's payload)."""
    parts.append(b"*%d\r\n" % len(cmd))
    for arg in cmd:
        parts.append(b"$%d\r\n" % len(arg))
        parts.append(arg)
        parts.append(b"\r\n")
