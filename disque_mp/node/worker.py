"""One worker process: the shard it owns, its client connections, its mesh links.

``run_worker(cfg, index, node_id, ready)`` is what the supervisor forks. The
``Worker`` starts and stops the parts and wires them together:

    the shard      ``workers/shard.py``: the queues whose slot ``s % N == index``
    the AOF        ``aof.py``: loaded at start, appended before replies leave
    the cluster    ``commands/cluster.py``'s agent: membership views, job messages
    clients        ``ClientConn`` (``connection.py``) on the client port,
                   ``tls-port`` and its own worker port (``worker-ports-base``); each command takes ``router.py``'s path
    the mesh       the other workers of the host (``bus/mesh.py``), served and
                   heard by ``peers.py``
    handoff        ``handoff.py``: a connection moves to the worker owning its traffic
    HTTP           ``http/``: metrics, the admin API, the dashboard
    memory         ``memory.py``: the maxmemory levels

What the parts share lives in the native base classes ``Worker`` extends, below
every part: ``core.WorkerCore`` (the loop turn's clock ``now_ms``, the shard and
its effects, the handlers waiting for a shard ``Wake`` in ``tokens``, the timer
tick) and ``connection.ClientHost`` (the client connections and what they call);
our blocked GETJOBs are ``getjob.GetJobs``. Effects of the shard are drained
after every batch of calls: ``Wake`` answers a pending client (ours or a
peer's), ``Send`` goes to the cluster bus, and ``AofAppend`` to the AOF manager.
Ticks run the shard's timers; ``Worker`` adds the per-second rates and the
idle-client timeout.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import random
import resource
import signal
import time
from typing import Any

from bus import auth as bus_auth
from bus import membership as mb
from bus.clock import wall_ms
from bus.mesh import Mesh
from disque_mp.node.commands import jobs as cmd_jobs
from disque_mp.node.commands.server import local_op as server_local_op
from disque_mp.node.config import Config, worker_ports
from disque_mp.node.connection import ClientConn, ClientHost, CommandStats, PendingReply
from disque_mp.node.core import NO_TICK_MS
from disque_mp.node.forward import Forward
from disque_mp.node.getjob import GetJobs
from disque_mp.node.handoff import Handoff
from disque_mp.node.listen import listen_sockets
from disque_mp.node.log import setup_logging
from disque_mp.node.memory import Monitor, rss_bytes
from disque_mp.node.owner import Owner
from disque_mp.node.peers import Peers
from disque_mp.node.router import Router
from disque_mp.node.schedule_host import ScheduleHost
from workers.effects import Send
from workers.invariant import InvariantError
from workers.shard import Shard

log = logging.getLogger("disque_mp.node.worker")

# PDEATHSIG covers most deaths; a pidfd of the parent (or, without pidfds, this poll)
# covers a parent that forked us from a thread
parent_poll_s = 0.5
shutdown_drain_s = 3.0  # SIGTERM: longest wait for in-flight replies to be written
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


class Worker(ClientHost):
    """One worker: its lifecycle, and the parts it wires (``ClientHost`` and
    ``core.WorkerCore`` hold what they share)."""

    def __init__(self, cfg: Config, index: int, node_id: str) -> None:
        super().__init__(cfg, index, node_id)
        self.parent_pid = os.getppid()
        self.start_s = time.time()
        self.idle_check_at = 0
        self.rate_base = (0, 0, 0)  # commands, bytes in, bytes out at the last sample
        self.rates: tuple[int, float, float] = (0, 0.0, 0.0)  # ops/s, KB/s in, KB/s out
        self.rewrite_aof_at_exit = False  # SHUTDOWN REWRITE-AOF
        self.servers: list[asyncio.AbstractServer] = []
        self.memory: Monitor | None = None
        self.schedules: Any = None  # worker 0: the node's schedules (schedule_host.py)
        cmd_jobs.apply_limits(cfg)
        self.view_seen = False  # a membership view reached the shard (on_view)
        self.in_cluster_batch = False  # delivering a JOBS frame's messages (on_cluster_batch)
        self.cluster_batch_ms = 0
        # our blocked GETJOBs, by token; the host's empty-queue hints (hints.py)
        self.getjobs = GetJobs(self)
        self.stats = CommandStats(self.slowlog)  # what ran: commandstats, slowlog, counters
        self.owner = Owner(self, self.stats)  # runs what our shard owns (router and peers)
        self.fwd = Forward(self, self.stats)  # carries what other workers own (router, peers)
        self.router = Router(self, self.stats, self.owner, self.fwd, self.getjobs)
        self.peers = Peers(self, self.owner, self.fwd, self.getjobs, self.local_op)
        self.handoff = Handoff(self)

    # ------------------------------------------------------------------ lifecycle

    async def main(self, ready: Any) -> None:
        self.loop = asyncio.get_running_loop()
        self.loop.set_exception_handler(_on_loop_exception)
        self.stopped: asyncio.Future[None] = self.loop.create_future()
        self.shard = self._make_shard()
        self._start_aof()
        gc.freeze()  # the loaded job table and start-up objects: never rescanned
        gc.set_threshold(*gc_thresholds)
        self.mesh = Mesh(self.cfg.port, self.node_id, self.index, self.workers, self.peers)
        self.handoff.start()
        # The membership view first: a shard serving before it knows its peers (a
        # command forwarded by a worker already up) answers ADDJOB with -NOREPL.
        # Other workers' requests wait in their mesh links meanwhile.
        await self._start_cluster()
        await self.mesh.start()
        for sock in listen_sockets(self.cfg.bind, self.cfg.port, self.cfg.tcp_backlog):
            self.servers.append(await self.loop.create_server(lambda: ClientConn(self), sock=sock))
        await self._start_worker_port()
        await self._start_tls()
        await self._start_http()
        self.loop.add_signal_handler(signal.SIGTERM, self.request_stop)
        self.loop.add_signal_handler(signal.SIGHUP, self.reopen_log)
        self._watch_parent()
        self._start_schedules()
        self.tick()
        self.memory = Monitor(self)
        self.memory.start()
        if ready is not None:
            ready.set()
        log.info("Worker %d ready to accept connections on port %d", self.index, self.cfg.port)
        await self.stopped
        await self._shutdown(self.rewrite_aof_at_exit)

    def _make_shard(self) -> Shard:
        rng = random.Random(os.urandom(16))
        # (re)started with no queue: our slots' cells say so before the AOF loads
        cells = self.getjobs.hints.cells
        cells.restart(self.index, self.workers)
        shard = Shard(self.node_id, self.index, self.workers, os.urandom(16), rng, wall_ms(),
                      dedup_keys_max=int(self.cfg.dedup_keys_max), cells=cells)
        shard.configure_results(self.cfg)
        return shard

    def _start_aof(self) -> None:
        try:
            from disque_mp.node.aof import AofLoadError, AofManager, ShardAdapter
            from disque_mp.node.aof_load import refused_exit_code
        except ImportError as e:  # a broken install: never serve without persistence
            log.warning("Fatal error: the AOF part cannot be loaded (%s); not starting", e)
            raise SystemExit(1) from None
        self.aof = AofManager(self.cfg, self.index, ShardAdapter(self.shard))
        try:
            self.aof.load(wall_ms())
        except (AofLoadError, OSError) as e:
            log.warning("Fatal error loading the AOF: %s", e)
            # never serve a partial state; a refusal would come again: no restart
            raise SystemExit(refused_exit_code if isinstance(e, AofLoadError) else 1) from None
        self.aof_task = asyncio.get_running_loop().create_task(self.aof.run())

    async def _start_cluster(self) -> None:
        try:
            from disque_mp.node.commands import cluster as cmd_cluster
        except ImportError as e:  # a broken install: never serve outside the cluster
            log.warning("Fatal error: the cluster part cannot be loaded (%s); not starting", e)
            raise SystemExit(1) from None
        self.agent = cmd_cluster.make_agent(self.cfg, self.index, self.node_id, self.workers,
                                            self.on_cluster_message, self.on_view,
                                            self.on_cluster_batch)
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

    async def _start_worker_port(self) -> None:
        """``worker-ports-base``: this worker alone also listens on base + index, so
        a client that knows the layout reaches a queue's owner without the mesh hop
        (README, "Worker ports"). Its connections are like any other client's."""
        ports = worker_ports(self.cfg)
        if not ports:
            return
        port = ports[self.index]
        try:
            socks = listen_sockets(self.cfg.bind, port, self.cfg.tcp_backlog, shared=False)
        except OSError as e:
            log.warning("Fatal: worker %d can't listen on its worker port %d: %s", self.index, port, e)
            raise SystemExit(1) from None
        for sock in socks:
            self.servers.append(await self.loop.create_server(lambda: ClientConn(self), sock=sock))

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

    def _start_schedules(self) -> None:
        """Worker 0 holds the node's schedules, beside the cluster bus they travel on
        (``disque_mp/node/schedule_host.py``); SCHEDULE reaches it through the agent."""
        agent = self.agent
        if agent is None or agent.bus is None:
            return
        host = ScheduleHost(self, agent.bus)
        host.start()
        agent.executors["schedule"] = host.execute
        self.schedules = host

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

    def _watch_parent(self) -> None:
        """Exit at once when the supervisor is gone. A pidfd of the parent turns
        readable when it exits (Linux 5.3+): no wake-up until then; elsewhere the
        parent is polled every ``parent_poll_s``."""
        try:
            fd = os.pidfd_open(self.parent_pid)
        except (AttributeError, OSError):
            self.loop.call_later(parent_poll_s, self._check_parent)
            return
        if os.getppid() != self.parent_pid:  # it died before the pidfd was opened
            os._exit(0)
        self.loop.add_reader(fd, self._parent_gone)

    def _parent_gone(self) -> None:
        os._exit(0)  # the supervisor is gone: free the ports at once

    def _check_parent(self) -> None:
        if os.getppid() != self.parent_pid:
            self._parent_gone()
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
        if self.schedules is not None:
            await self.schedules.close()
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

    # ------------------------------------------------------------------ cluster

    def _send_to_bus(self, eff: Send) -> None:
        agent = self.agent  # this hook is installed with the agent
        if agent is not None and not agent.send(eff.node_id, eff.kind, eff.slot, eff.meta,
                                                eff.bodies) and eff.kind == "YOURJOBS":
            # Its jobs left our queue when the shard wrote it: queue them again
            # (an at-most-once job would be queued nowhere).
            self.shard.yourjobs_unsent(eff.bodies, wall_ms())

    def on_cluster_message(self, sender: str, kind: str, slot: int, meta: dict[str, Any],
                           bodies: list[bytes]) -> None:
        # a native call (a getattr by name was a bound method object per message)
        if self.in_cluster_batch:
            self.shard.on_message(sender, kind, meta, bodies, self.cluster_batch_ms)
            return
        self.shard.on_message(sender, kind, meta, bodies, wall_ms())
        self.drain_effects()  # and the tick follows the timers

    def on_cluster_batch(self, begin: bool) -> None:
        """Around the messages of one JOBS frame: one clock read for all of them, and
        their effects carried out once, in order, after the last (bus/hostbus.py)."""
        if begin:
            self.in_cluster_batch = True
            self.cluster_batch_ms = wall_ms()
            return
        self.in_cluster_batch = False
        self.drain_effects()  # and the tick follows the timers

    def on_view(self, view: dict[str, Any]) -> None:
        # The shard needs every known node (default REPLICATE = cluster size), which are
        # reachable, which are leaving, which our bus link has a PONG on (jobs moved
        # to a node without one would be dropped), our own LEAVING flag and our ID.
        peers = [(p.node_id, p.reachable, p.leaving, p.linked) for p in mb.peers(view)]
        self.shard.set_view(view.get("myid", self.node_id), peers, bool(view.get("leaving")))
        self.view_seen = True
        self.drain_effects()  # LEAVING releases blocked clients with -LEAVING
        if self.schedules is not None:
            self.schedules.wake()  # a member came or went: greet it, recount the firers

    def on_tick(self) -> int:
        """Each second while the worker is active: the rates for INFO and Redis' idle
        client ``timeout``. A second with no command, no byte in or out and a quiet
        memory monitor (``Monitor.quiet``: nothing left to tell the other workers, no
        level to watch) ends it: the worker then sleeps until its next shard timer or
        until something arrives (``on_wake``), so an idle worker costs no wake-up.
        With ``timeout`` set it keeps its second, to close idle clients on time."""
        ran = self._each_second()
        memory = self.memory
        if ran or self.cfg.timeout > 0 or (memory is not None and not memory.quiet()):
            return self.idle_check_at
        if memory is not None:
            memory.sleep()
        return NO_TICK_MS

    def on_wake(self) -> int:
        """Something ran on an idle worker: the second's work resumes. Nothing ran
        since the worker went idle, so the rates' base still holds and is timed
        from now; the memory monitor samples at once and then on its period."""
        self.idle_check_at = wall_ms() + idle_check_ms  # now_ms may be an old batch's
        if self.memory is not None:
            self.memory.wake()
        return self.idle_check_at

    def _each_second(self) -> bool:
        """Rates for INFO (instantaneous_*) and Redis' idle client `timeout`; True when
        anything ran since the last second (a command, bytes in or out)."""
        elapsed_ms = self.now_ms - self.idle_check_at + idle_check_ms
        self.idle_check_at = self.now_ms + idle_check_ms
        now = (self.stats.commands_processed, self.net_in_bytes, self.net_out_bytes)
        if 0 < elapsed_ms < 10 * idle_check_ms:
            per_s = [max(0, a - b) * 1000 / elapsed_ms for a, b in zip(now, self.rate_base, strict=True)]
            self.rates = (int(per_s[0]), per_s[1] / 1024, per_s[2] / 1024)
        ran = now != self.rate_base
        self.rate_base = now
        if self.cfg.timeout > 0:
            self._close_idle_clients()
        return ran

    def _close_idle_clients(self) -> None:
        """Redis' `timeout`: close clients idle that long (blocked ones excepted)."""
        limit_s = time.time() - self.cfg.timeout
        for conn in [c for c in self.conns if c.last_s < limit_s and not c.waiters]:
            if conn.transport is not None and not conn.pending():
                log.log(15, "Closing idle client %s", conn.addr)
                conn.transport.close()

    # ------------------------------------------------------------------ node-wide operations

    def flush_all(self) -> None:
        """DEBUG FLUSHALL and CLUSTER RESET, this worker's part: blocked GETJOBs are
        answered as on timeout (the reference's flushServerData; every worker does
        the same for its own, so no waiter is kept), the shard emptied, the AOF
        started afresh (or flushed jobs come back at restart), and the memory level
        follows at once, not a sample later."""
        self.getjobs.release_all()
        self.shard.op_flushall(keep_waiters=False)
        if self.aof is not None:
            self.aof.flushed()
        self.drain_effects()
        if self.memory is not None:
            self.memory.flushed()

    def reset_stats(self) -> None:
        """CONFIG RESETSTAT, this worker's part."""
        self.stats.reset()
        self.getjobs.hints.skipped = 0
        self.connections_received = self.rejected_connections = 0
        self.net_in_bytes = self.net_out_bytes = 0

    def command_names(self) -> list[str]:
        return list(self.stats.cmdstats)  # one entry per command, in the table's order

    def local_op(self, op: str, arg: Any) -> Any:
        """This worker's part of a node-wide command (``scatter``; SCATTER requests).
        A CONFIG SET of the slow log's settings applies at once: no periodic tick
        would pick it up on an idle worker."""
        reply = server_local_op(self, op, arg)
        if op == "config_set":
            self._follow_config()
        return reply

    def _follow_config(self) -> None:
        self.slowlog.configure(self.cfg.slowlog_log_slower_than, self.cfg.slowlog_max_len)
        self.stats.slowlog_min_ns = self.slowlog.min_ns

    def local_stats(self) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        blocked = sum(1 for c in self.conns if c.waiters)
        return {
            "index": self.index, "pid": os.getpid(), "clients": len(self.conns),
            "blocked": blocked, "conns_received": self.connections_received,
            "commands": self.stats.commands_processed, "net_in": self.net_in_bytes,
            "net_out": self.net_out_bytes, "rejected": self.rejected_connections,
            "cpu_sys": usage.ru_stime, "cpu_user": usage.ru_utime, "rss": rss_bytes(),
            "peak": usage.ru_maxrss * 1024, "handed_off": self.handoff.handed_off,
            "forwarded": self.stats.forwarded, "getjob_skipped": self.getjobs.hints.skipped,
            "mesh": {"frames_refused": self.mesh.refused, "link_resets": self.mesh.resets},
            "ops_per_sec": self.rates[0], "in_kbps": self.rates[1], "out_kbps": self.rates[2],
            "cmdstats": self.stats.snapshot(),
            "shard": self.shard.info(),
            "dedup": self.shard.dedup_info(),
            "results": self.shard.results_info(),
            "aof": self.aof.info() if self.aof is not None else None,
            "mem": self.memory.stats() if self.memory is not None else None,
            "bus": dict(bus_auth.STATS),
        }
