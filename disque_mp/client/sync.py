"""The synchronous client, ``Disque``: the core (``disque_mp.client.core``) over
redis-py, thread-safe, with a thread that keeps jobs alive while a handler runs.

Connections speak RESP2 (``protocol=2``): the reference Disque rejects
``HELLO 3`` (redis-py 8's default handshake), and disque-mp answers Disque
commands in RESP2 shapes anyway. ``driver_info=None`` skips ``CLIENT SETINFO``.
redis-py does not retry (``Retry(NoBackoff(), 0)``): moving to another node is ours.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import closing
from typing import Any, Literal, Unpack, overload

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from disque_mp.client import core
from disque_mp.client.core import DisqueError, Hello, Job, Progress

log = logging.getLogger("disque_mp.client")


class Disque(core.ClientSettings[redis.Redis]):
    """A Disque client: see the package doc. Thread-safe (redis-py's pool per node).

    ``nodes``: seeds, ``"host:port"`` strings, ``(host, port)`` tuples or one
    comma-separated string (default 127.0.0.1:7711). ``socket_timeout`` must
    exceed the longest blocking GETJOB you send (None: no timeout).
    ``failover_attempts``: nodes to try after -LEAVING or a drop (default: as
    many as are known; 0 sticks to one node). ``follow_priority=False`` stays
    on a node even when HELLO shows better ones. ``redis_kwargs`` go to
    ``redis.Redis`` (ssl, username ...).

    ``route_to_owner=True``: when the node announces worker ports (``INFO
    workers``, ``worker-ports-base``), job commands go straight to the worker
    owning their queue or job IDs over one more connection per worker (no hop
    between workers); a worker port that fails sends them the normal way.
    """

    def _init_io(self) -> None:
        self._lock = threading.RLock()

    # ---- connection management

    def _make_redis(self, host: str, port: int) -> redis.Redis:
        r = redis.Redis(**self._redis_options(host, port), retry=Retry(NoBackoff(), 0))
        r.response_callbacks.pop("INFO", None)  # keep INFO's text: Disque's own sections
        return r

    def connect(self, avoid: tuple[str, int] | None = None) -> Hello:
        """Connect to the best reachable node (random among the seeds at first), run HELLO.

        Landing on a node that advertises a worse priority than others (a leaving
        node says 100) moves on to a better one when one answers, unless
        ``follow_priority=False`` (a client meant for one given node).
        """
        with self._lock:
            hello = self._connect_first(self.topology.candidates(avoid))
            better = self.topology.better_nodes() if self._follow_priority else []
            if better:
                try:
                    hello = self._connect_first(better)
                except core.DisqueConnectionError:
                    pass  # stay: a leaving node still serves ACKs and NOHANG GETJOBs
            return hello

    def _connect_first(self, candidates: list[tuple[str, int]]) -> Hello:
        tried = []
        for host, port in candidates:
            r = self._make_redis(host, port)
            try:
                hello = core.parse_hello(r.execute_command("HELLO"), host, port)
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                tried.append(f"{host}:{port} ({exc})")
                r.close()
                continue
            except redis.ResponseError as exc:
                tried.append(f"{host}:{port} ({core.map_redis_error(exc)})")
                r.close()
                continue
            old, self._redis = self._redis, r
            if old is not None:
                old.close()
            self.topology.learn(hello, (host, port))
            self._learn_workers(r, host)
            log.debug("connected to %s:%d (node %s)", host, port, hello.node_id)
            return hello
        raise core.DisqueConnectionError("no Disque node reachable; tried: " + "; ".join(tried))

    def _learn_workers(self, r: redis.Redis, host: str) -> None:
        """With route_to_owner: the worker ports the node announces (none: no routing)."""
        self._close_workers()
        self.routes = None
        if not self._route_to_owner:
            return
        try:
            self.routes = core.WorkerRoutes.from_info(host, r.execute_command("INFO", "workers"))
        except (redis.RedisError, OSError) as exc:
            log.debug("INFO workers failed (%s): no routing to worker ports", exc)

    def _close_workers(self) -> None:
        workers, self._workers = self._workers, {}
        for r in workers.values():
            r.close()

    def _worker_client(self, routes: core.WorkerRoutes, k: int) -> redis.Redis:
        r = self._workers.get(k)
        if r is None:
            with self._lock:
                r = self._worker_conn(routes, k)
        return r

    def _worker_failed(self, routes: core.WorkerRoutes, k: int, exc: Exception) -> None:
        log.info("worker port %s:%d failed (%s): using the main port for %.0f s",
                 routes.host, routes.port_of(k), exc, core.worker_port_retry_s)
        with self._lock:
            routes.mark_down(k, time.monotonic())
            if self.routes is routes:
                r = self._workers.pop(k, None)
                if r is not None:
                    r.close()

    def _execute_routed(self, routes: core.WorkerRoutes, args: Sequence[Any]) -> tuple[bool, Any]:
        """(True, reply) when the owner's worker port answered; (False, None) when the
        command must take the main connection (not routable, the port failed, -LEAVING)."""
        k = routes.route(args, time.monotonic())
        if k is None:
            return False, None
        try:
            return True, self._worker_client(routes, k).execute_command(*args)
        except redis.ResponseError as exc:
            err = core.map_redis_error(exc)
            if core.is_leaving(err):
                return False, None  # the main path moves to another node
            raise err from None
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            self._worker_failed(routes, k, exc)
            return False, None

    def _client(self) -> redis.Redis:
        r = self._redis
        if r is None:
            with self._lock:
                if self._redis is None:
                    self.connect()
                r = self._redis
        assert r is not None
        return r

    def _failover(self, broken: redis.Redis) -> None:
        with self._lock:
            if self._redis is broken:  # another thread may have moved already
                self.connect(avoid=self.topology.current)

    def _current_routes(self) -> core.WorkerRoutes | None:
        """The worker routes, once known: with route_to_owner the first command
        connects first, so that it is routed too."""
        if self._route_to_owner and self._redis is None:
            self._client()
        return self.routes

    def execute(self, *args: Any) -> Any:
        """Run one command; move to another node on -LEAVING or a dropped connection.

        A command whose connection dropped is sent again on the new node, so an
        ADDJOB may then create a second copy of the job (at-least-once).
        """
        routes = self._current_routes()
        if routes is not None:
            done, reply = self._execute_routed(routes, args)
            if done:
                return reply
        attempt = 0
        while True:
            r = self._client()
            try:
                return r.execute_command(*args)
            except redis.ResponseError as exc:
                self._raise_unless_retrying(core.map_redis_error(exc), attempt, str(args[0]))
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._raise_unless_retrying(exc, attempt, str(args[0]))
            attempt += 1
            self._failover(r)

    def close(self) -> None:
        with self._lock:
            self._close_workers()
            if self._redis is not None:
                self._redis.close()
                self._redis = None

    def __enter__(self) -> Disque:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- commands

    def hello(self) -> Hello:
        r = self._client()
        host, port = self.topology.current or ("", 0)
        hello = core.parse_hello(self.execute("HELLO"), host, port)
        if r is self._redis:
            self.topology.hello = hello
        return hello

    def info(self, section: str | None = None) -> dict[str, str]:
        return core.parse_info(self.execute("INFO", *([section] if section else [])))

    def ping(self) -> bool:
        return self.execute("PING") in (b"PONG", "PONG", True)

    def add_job(self, queue: str | bytes, body: bytes | str, timeout_ms: int = 0,
                **options: Unpack[core.AddJobOptions]) -> str:
        """ADDJOB; returns the job ID. ``options``: ``core.AddJobOptions`` (replicate,
        delay, retry, ttl, maxlen, async_, maxdeliver, dedup, group, priority; times in seconds).
        ``maxdeliver`` (disque-mp extension): deliveries before the job goes to
        ``dead:<queue>``; ``dedup`` (disque-mp extension): a key that makes a repeated add
        answer the first job's ID while the node holds it unacknowledged
        (docs/extensions.md); ``group`` (disque-mp extension): the job's group, served in
        rotation."""
        return core.as_str(self.execute(*core.addjob_args(queue, body, timeout_ms, **options)))

    def add_jobs(self, items: Iterable[tuple[str | bytes, bytes | str]], timeout_ms: int = 0,
                 **options: Unpack[core.AddJobOptions]) -> list[str]:
        """ADDJOB for each (queue, body), pipelined; returns the IDs in order.

        Stops at the first error reply and raises it (jobs before it were added).
        ``options`` are add_job's keyword options.
        """
        ids: list[str] = []
        batch: list[list[Any]] = []
        for queue, body in items:
            batch.append(core.addjob_args(queue, body, timeout_ms, **options))
            if len(batch) >= core.pipeline_commands_max:
                ids += self._pipeline(batch)
                batch = []
        if batch:
            ids += self._pipeline(batch)
        return ids

    def _pipeline(self, commands: list[list[Any]]) -> list[str]:
        return [core.as_str(x) for x in self.execute_many(commands)]

    def execute_many(self, commands: Sequence[Sequence[Any]], *,
                     raise_on_error: bool = True) -> list[Any]:
        """Send commands pipelined, read every reply.

        An error reply raises (the first one) or, with ``raise_on_error=False``,
        stands in the list as a DisqueError. Round trips carry at most
        pipeline_bytes_max of commands. A dropped connection moves to another
        node and sends that round trip again.
        """
        out: list[Any] = []
        for chunk in core.chunks_by_size(commands, core.pipeline_bytes_max):
            routes = self._current_routes()
            out += self._round_trip(chunk) if routes is None else self._routed_trip(routes, chunk)
        if raise_on_error:
            for reply in out:
                if isinstance(reply, DisqueError):
                    raise reply
        return out

    def _routed_trip(self, routes: core.WorkerRoutes,
                     commands: Sequence[Sequence[Any]]) -> list[Any]:
        """One round trip per worker port (each owner's commands in order), the rest
        (and a failed port's) on the main connection."""
        groups = routes.split(commands, time.monotonic())
        out: list[Any] = [None] * len(commands)
        for k, indices in groups.items():
            part = [commands[i] for i in indices]
            replies = None if k is None else self._worker_trip(routes, k, part)
            if replies is None:
                replies = self._round_trip(part)
            for i, reply in zip(indices, replies, strict=True):
                out[i] = reply
        return out

    def _worker_trip(self, routes: core.WorkerRoutes, k: int,
                     commands: Sequence[Sequence[Any]]) -> list[Any] | None:
        try:
            pipe = self._worker_client(routes, k).pipeline(transaction=False)
            for args in commands:
                pipe.execute_command(*args)
            replies = pipe.execute(raise_on_error=False)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            self._worker_failed(routes, k, exc)
            return None
        return [core.map_redis_error(x) if isinstance(x, redis.ResponseError) else x for x in replies]

    def _round_trip(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        attempt = 0
        while True:
            r = self._client()
            try:
                pipe = r.pipeline(transaction=False)
                for args in commands:
                    pipe.execute_command(*args)
                replies = pipe.execute(raise_on_error=False)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._raise_unless_retrying(exc, attempt, "pipeline")
                attempt += 1
                self._failover(r)
                continue
            return [core.map_redis_error(x) if isinstance(x, redis.ResponseError) else x
                    for x in replies]

    def get_jobs(self, queues: str | bytes | Iterable[str | bytes],
                 **options: Unpack[core.GetJobOptions]) -> list[Job]:
        """GETJOB; [] when the timeout elapsed (or NOHANG found nothing). ``options``:
        ``core.GetJobOptions`` (timeout_ms, count, nohang, withcounters)."""
        jobs = core.parse_jobs(self.execute(*core.getjob_args(queues, **options)))
        self._maybe_follow_producer(jobs)
        return jobs

    def get_job(self, queues: str | bytes | Iterable[str | bytes], **kw: Any) -> Job | None:
        jobs = self.get_jobs(queues, count=1, **kw)
        return jobs[0] if jobs else None

    def _maybe_follow_producer(self, jobs: Sequence[Job]) -> None:
        target = self.topology.producer_to_follow(jobs)
        if target is None:
            return
        log.info("most jobs come from %s:%d: moving there", *target)
        with self._lock, self.topology.trying_only(target):
            self.connect()

    def ack(self, *ids: str | Job | Iterable[str | Job], result: bytes | str | None = None) -> int:
        """ACKJOB; ``result`` (disque-mp extension, one job): kept as the job's result
        for ``result()`` on any node (config result-ttl)."""
        return int(self.execute(*core.ack_args(core.job_ids_of(ids), result)))

    def fast_ack(self, *ids: str | Job | Iterable[str | Job]) -> int:
        return int(self.execute("FASTACK", *core.job_ids_of(ids)))

    def nack(self, *ids: str | Job | Iterable[str | Job], delay: int | None = None) -> int:
        """NACK; ``delay`` (seconds, disque-mp extension): deliverable only after it."""
        return int(self.execute(*core.nack_args(core.job_ids_of(ids), delay)))

    def enqueue(self, *ids: str | Job | Iterable[str | Job]) -> int:
        return int(self.execute("ENQUEUE", *core.job_ids_of(ids)))

    def dequeue(self, *ids: str | Job | Iterable[str | Job]) -> int:
        return int(self.execute("DEQUEUE", *core.job_ids_of(ids)))

    def del_job(self, *ids: str | Job | Iterable[str | Job]) -> int:
        return int(self.execute("DELJOB", *core.job_ids_of(ids)))

    def working(self, job: str | Job, progress: bytes | str | None = None) -> int:
        """WORKING; returns the seconds the next delivery was postponed by (the retry).
        ``progress`` (disque-mp extension): recorded, shown by SHOW and ``result()``."""
        return int(self.execute(*core.working_args(core.job_ids_of((job,))[0], progress)))

    def result(self, job: str | Job, timeout_ms: int | None = None) -> bytes | Progress | None:
        """RESULT (disque-mp extension): the job's result (bytes), ``Progress(value)``
        while it is pending with progress, None. ``timeout_ms``: wait for a pending
        job (0: until it is done); the socket timeout must exceed the wait."""
        return core.parse_result(self.execute(*core.result_args(core.job_ids_of((job,))[0],
                                                                timeout_ms)))

    def show(self, job: str | Job) -> dict[str, Any] | None:
        """SHOW as a dict (None for an unknown job); ``body`` stays bytes."""
        return core.parse_pairs(self.execute("SHOW", core.job_ids_of((job,))[0]))

    def wait_jobs(self, *ids: str | Job | Iterable[str | Job], timeout_ms: int | None = None) -> int:
        """WAITJOB (disque-mp extension): block until every job is acknowledged,
        deleted or expired (or ``timeout_ms``: None/0 waits forever); how many are.
        The connection's socket timeout must exceed the wait."""
        return int(self.execute(*core.waitjob_args(core.job_ids_of(ids), timeout_ms)))

    def global_qlen(self, queue: str | bytes) -> int:
        """GLOBALQLEN (disque-mp extension): QLEN summed over every reachable node."""
        return int(self.execute("GLOBALQLEN", queue))

    def del_queue(self, queue: str | bytes, *, local: bool = False) -> int:
        """DELQUEUE (disque-mp extension): remove every job of the queue (on every
        reachable node, or this one with ``local``); how many were removed."""
        return int(self.execute(*core.delqueue_args(queue, local)))

    def dead_letter(self, *ids: str | Job | Iterable[str | Job],
                    reason: str | bytes | None = None) -> int:
        """DEADLETTER (disque-mp extension): move the jobs to ``dead:<queue>`` now,
        same ID, with ``reason`` (SHOW's ``dead-reason``); how many moved."""
        return int(self.execute(*core.deadletter_args(core.job_ids_of(ids), reason)))

    def redrive(self, dead_queue: str | bytes, count: int | None = None) -> int:
        """REDRIVE (disque-mp extension): up to ``count`` jobs of ``dead:<queue>``
        queued on this node back to their queue (same ID, counters reset); how many
        moved. Without ``count`` the node moves up to its redrive-count-max a call."""
        return int(self.execute(*core.redrive_args(dead_queue, count)))

    def schedule(self, name: str | bytes, queue: str | bytes, body: bytes | str, *,
                 cron: str | None = None, every: int | None = None, tz: str | None = None,
                 timeout_ms: int = 0, **options: Any) -> None:
        """SCHEDULE SET (disque-mp extension): add ``ADDJOB queue body`` with
        ``options`` (``add_job``'s) at each time of ``cron`` (in ``tz``) or ``every``
        seconds; known to every node, one job a fire time while they see each other.
        Setting a name again replaces its schedule."""
        self.execute(*core.schedule_args(name, queue, body, cron=cron, every=every, tz=tz,
                                         timeout_ms=timeout_ms, **options))

    def unschedule(self, name: str | bytes) -> bool:
        """SCHEDULE DEL (disque-mp extension): True when the schedule existed."""
        return bool(self.execute("SCHEDULE", "DEL", name))

    def schedules(self) -> list[dict[str, Any]]:
        """SCHEDULE LIST then SHOW (disque-mp extension): every schedule, by name,
        with its rule, ADDJOB words, next and last fire (epoch ms), last job ID,
        fired and skipped counts."""
        out = []
        for name in self.execute("SCHEDULE", "LIST"):
            try:
                out.append(core.parse_schedule(self.execute("SCHEDULE", "SHOW", name)))
            except core.CommandError:
                continue  # deleted between LIST and SHOW
        return out

    def qlen(self, queue: str | bytes) -> int:
        return int(self.execute("QLEN", queue))

    def qpeek(self, queue: str | bytes, count: int) -> list[Job]:
        return core.parse_jobs(self.execute("QPEEK", queue, int(count)))

    def qstat(self, queue: str | bytes) -> dict[str, Any] | None:
        return core.parse_pairs(self.execute("QSTAT", queue))

    def qgroups(self, queue: str | bytes, count: int | None = None) -> list[tuple[str, int]]:
        """QGROUPS (disque-mp extension): (group, queued jobs) of the groups with
        queued jobs, largest first (COUNT default 100); the ungrouped jobs are ''."""
        return core.parse_groups(self.execute(*core.qgroups_args(queue, count)))

    def pause(self, queue: str | bytes, *options: str) -> str:
        """PAUSE queue in|out|all|none|state [bcast]; returns the pause state."""
        return core.as_str(self.execute("PAUSE", queue, *options))

    def set_limit(self, queue: str | bytes, *, active: int | None = None,
                  rate: int | None = None, group_active: int | None = None,
                  bcast: bool = False) -> dict[str, int]:
        """QLIMIT (disque-mp extension): at most ``active`` jobs of the queue delivered
        and not done, ``rate`` deliveries a second, ``group_active`` such jobs per
        GROUP, on the node spoken to (every reachable node with ``bcast``); 0 takes a
        limit away, one not given keeps its value. Returns the limits now."""
        return core.parse_limits(self.execute(*core.qlimit_args(
            queue, active, rate, group_active, bcast)))

    def reset_limits(self, queue: str | bytes, *, bcast: bool = False) -> dict[str, int]:
        """QLIMIT queue RESET (disque-mp extension): no limit any more."""
        return core.parse_limits(self.execute(*core.qlimit_args(queue, bcast=bcast, reset=True)))

    def limits(self, queue: str | bytes) -> dict[str, int]:
        """QLIMIT queue (disque-mp extension): the limits on the node spoken to and
        how many jobs are in use (``in-use``), the whole tokens left (``tokens``)."""
        return core.parse_limits(self.execute(*core.qlimit_args(queue)))

    def iter_queues(self, *, count: int | None = None, minlen: int | None = None,
                    maxlen: int | None = None, importrate: int | None = None) -> Iterator[str]:
        """Every queue name (QSCAN until the cursor returns to 0; names may repeat)."""
        cursor = 0
        while True:
            cursor, names = core.parse_scan(self.execute(*core.qscan_args(cursor, count, minlen, maxlen,
                                                                importrate)))
            yield from (core.as_str(n) for n in names)
            if cursor == 0:
                return

    @overload
    def iter_jobs(self, *, queue: str | bytes | None = ..., states: Iterable[str] = ...,
                  count: int | None = ..., reply_all: Literal[False] = ...) -> Iterator[str]: ...
    @overload
    def iter_jobs(self, *, queue: str | bytes | None = ..., states: Iterable[str] = ...,
                  count: int | None = ..., reply_all: Literal[True]) -> Iterator[dict[str, Any]]: ...

    def iter_jobs(self, *, queue: str | bytes | None = None, states: Iterable[str] = (),
                  count: int | None = None, reply_all: bool = False) -> Iterator[Any]:
        """JSCAN: job IDs, or SHOW-like dicts with ``reply_all=True``."""
        states = list(states)
        cursor = 0
        while True:
            cursor, items = core.parse_scan(self.execute(*core.jscan_args(cursor, count, queue, states,
                                                                reply_all)))
            for item in items:
                yield core.parse_pairs(item) if reply_all else core.as_str(item)
            if cursor == 0:
                return

    # ---- consumer helper

    @overload
    def consume(self, queues: str | bytes | Iterable[str | bytes], handler: None = None, *,
                count: int = ..., max_jobs: int | None = ..., stop: threading.Event | None = ...,
                fast_ack: bool = ..., poll_ms: int = ...) -> Iterator[Job]: ...
    @overload
    def consume(self, queues: str | bytes | Iterable[str | bytes],
                handler: Callable[[Job], Any], *, count: int = ..., max_jobs: int | None = ...,
                stop: threading.Event | None = ..., fast_ack: bool = ...,
                poll_ms: int = ...) -> int: ...

    def consume(self, queues: str | bytes | Iterable[str | bytes],
                handler: Callable[[Job], Any] | None = None, *, count: int = 1,
                max_jobs: int | None = None, stop: threading.Event | None = None,
                fast_ack: bool = False, poll_ms: int = core.consume_poll_ms) -> Iterator[Job] | int:
        """Take jobs one by one, keep each alive with WORKING while it is worked on.

        With a ``handler``: call it for each job, ACK when it returns, NACK when
        it raises (the exception is logged, the loop goes on); returns the number
        of jobs handled once ``max_jobs`` were handled or ``stop`` is set.

        Without: an iterator. A job is ACKed when the loop asks for the next one;
        leaving the loop (break, exception) NACKs the job in hand, so it is
        delivered again at once (ACK it yourself before ``break`` if it is done).
        """
        runner = _ConsumeLoop(self, core.queue_list(queues), count, max_jobs, stop, fast_ack, poll_ms)
        if handler is None:
            return runner.iterate()
        return runner.run(handler)


class Heartbeat:
    """A thread that sends WORKING for jobs in hand before their retry time elapses."""

    def __init__(self, working: Callable[[str], int]) -> None:
        self._working = working
        self._due: dict[str, float] = {}  # job ID -> monotonic time of the next WORKING
        self._cond = threading.Condition()
        self._stopped = False
        # when the thread wakes next (monotonic; inf: when told): an add due later
        # does not wake it, so a consumer taking many jobs does not wake it per job
        self._wake_at = float("inf")
        self._thread = threading.Thread(target=self._run, name="disque-heartbeat", daemon=True)
        self._thread.start()

    def add(self, job_id: str) -> None:
        with self._cond:
            due = self._due[job_id] = time.monotonic() + core.heartbeat_first_s
            if due < self._wake_at:
                self._cond.notify()

    def remove(self, job_id: str) -> None:
        with self._cond:
            self._due.pop(job_id, None)

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join()

    def _next_due(self) -> tuple[str, float] | None:
        if not self._due:
            return None
        job_id = min(self._due, key=self._due.__getitem__)
        return job_id, self._due[job_id]

    def _run(self) -> None:
        while True:
            with self._cond:
                nxt = self._next_due()
                while not self._stopped and (nxt is None or nxt[1] > time.monotonic()):
                    self._wake_at = float("inf") if nxt is None else nxt[1]
                    self._cond.wait(None if nxt is None else nxt[1] - time.monotonic())
                    nxt = self._next_due()
                self._wake_at = float("-inf")  # busy: it reads _due again before waiting
                if self._stopped or nxt is None:
                    return
                job_id = nxt[0]
            retry_s = self._beat(job_id)
            with self._cond:
                if job_id in self._due:
                    if retry_s > 0:
                        next_s = retry_s * core.heartbeat_retry_fraction
                        self._due[job_id] = time.monotonic() + next_s
                    else:
                        del self._due[job_id]

    def _beat(self, job_id: str) -> int:
        try:
            return self._working(job_id)
        except DisqueError as exc:  # NOJOB, acked, or past 50 % of its TTL: nothing to keep
            log.warning("WORKING %s: %s", job_id, exc)
            return 0


class _ConsumeLoop:
    __slots__ = ("client", "queues", "count", "max_jobs", "stop", "fast_ack", "poll_ms", "handled")

    def __init__(self, client: Disque, queues: list[str | bytes], count: int,
                 max_jobs: int | None, stop: threading.Event | None, fast_ack: bool,
                 poll_ms: int) -> None:
        self.client, self.queues, self.count = client, queues, count
        self.max_jobs, self.stop, self.fast_ack, self.poll_ms = max_jobs, stop, fast_ack, poll_ms
        self.handled = 0

    def _done(self) -> bool:
        return core.consume_done(self.max_jobs, self.handled, self.stop)

    def _take(self, beat: Heartbeat) -> list[Job]:
        """The next jobs, all kept alive from now on (later ones wait for earlier ones)."""
        want = core.consume_batch(self.count, self.max_jobs, self.handled)
        jobs = self.client.get_jobs(self.queues, timeout_ms=self.poll_ms, count=want,
                                    withcounters=True)
        for job in jobs:
            beat.add(job.id)
        return jobs

    def _ack(self, job: Job) -> None:
        (self.client.fast_ack if self.fast_ack else self.client.ack)(job.id)

    def _batches(self) -> Generator[tuple[list[Job], Heartbeat], None, None]:
        """Each batch taken, kept alive by the heartbeat; the caller empties the list as
        it handles the jobs. Closed early (break, exception), the jobs still in the
        list are NACKed: delivered again at once."""
        beat = Heartbeat(self.client.working)
        in_hand: list[Job] = []
        try:
            while not self._done():
                in_hand = self._take(beat)
                yield in_hand, beat
        finally:
            beat.close()
            if in_hand:
                self.client.nack(*(j.id for j in in_hand))

    def run(self, handler: Callable[[Job], Any]) -> int:
        with closing(self._batches()) as batches:
            for in_hand, beat in batches:
                while in_hand:
                    self._handle(handler, in_hand[0], beat)
                    in_hand.pop(0)
                    self.handled += 1
        return self.handled

    def _handle(self, handler: Callable[[Job], Any], job: Job, beat: Heartbeat) -> None:
        try:
            handler(job)
        except Exception:
            beat.remove(job.id)
            log.exception("handler failed on job %s: NACK", job.id)
            self.client.nack(job.id)
        else:
            beat.remove(job.id)
            self._ack(job)

    def iterate(self) -> Iterator[Job]:
        with closing(self._batches()) as batches:
            for in_hand, beat in batches:
                while in_hand:
                    job = in_hand[0]
                    yield job
                    beat.remove(job.id)
                    self._ack(in_hand.pop(0))
                    self.handled += 1
