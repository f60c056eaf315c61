"""The asyncio twin of ``disque_mp.client.Disque`` (redis.asyncio), same methods.

    d = AsyncDisque(["127.0.0.1:7711"])
    job_id = await d.add_job("q", b"body", retry=30)
    for job in await d.get_jobs("q", timeout_ms=1000):
        await d.ack(job)
    await d.aclose()

Node selection, argument building, reply parsing and error mapping come from the
core (``disque_mp.client.core``), shared with the sync client; only the I/O differs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, Literal, Unpack, overload

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from disque_mp.client import core
from disque_mp.client.core import DisqueError, Hello, Job

log = logging.getLogger("disque_mp.client.aio")

_IdArgs = str | Job | Iterable[str | Job]


class AsyncDisque(core.ClientSettings[aredis.Redis]):
    """See ``Disque``: the same constructor and methods, as coroutines."""

    def _init_io(self) -> None:
        self._lock = asyncio.Lock()

    def _make_redis(self, host: str, port: int) -> aredis.Redis:
        r = aredis.Redis(**self._redis_options(host, port), retry=Retry(NoBackoff(), 0))
        r.response_callbacks.pop("INFO", None)  # keep INFO's text
        return r

    async def connect(self, avoid: tuple[str, int] | None = None) -> Hello:
        async with self._lock:
            return await self._connect(avoid)

    async def _connect(self, avoid: tuple[str, int] | None) -> Hello:
        hello = await self._connect_first(self.topology.candidates(avoid))
        better = self.topology.better_nodes() if self._follow_priority else []
        if better:  # on a leaving node: move to a better one if one answers
            try:
                hello = await self._connect_first(better)
            except core.DisqueConnectionError:
                pass
        return hello

    async def _connect_first(self, candidates: list[tuple[str, int]]) -> Hello:
        tried = []
        for host, port in candidates:
            r = self._make_redis(host, port)
            try:
                hello = core.parse_hello(await r.execute_command("HELLO"), host, port)
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                tried.append(f"{host}:{port} ({exc})")
                await r.aclose()
                continue
            except redis.ResponseError as exc:
                tried.append(f"{host}:{port} ({core.map_redis_error(exc)})")
                await r.aclose()
                continue
            old, self._redis = self._redis, r
            if old is not None:
                await old.aclose()
            self.topology.learn(hello, (host, port))
            await self._learn_workers(r, host)
            return hello
        raise core.DisqueConnectionError("no Disque node reachable; tried: " + "; ".join(tried))

    async def _learn_workers(self, r: aredis.Redis, host: str) -> None:
        """With route_to_owner: the worker ports the node announces (see Disque)."""
        await self._close_workers()
        self.routes = None
        if not self._route_to_owner:
            return
        try:
            info = await r.execute_command("INFO", "workers")
        except (redis.RedisError, OSError) as exc:
            log.debug("INFO workers failed (%s): no routing to worker ports", exc)
            return
        self.routes = core.WorkerRoutes.from_info(host, info)

    async def _close_workers(self) -> None:
        workers, self._workers = self._workers, {}
        for r in workers.values():
            await r.aclose()

    async def _worker_failed(self, routes: core.WorkerRoutes, k: int, exc: Exception) -> None:
        log.info("worker port %s:%d failed (%s): using the main port for %.0f s",
                 routes.host, routes.port_of(k), exc, core.worker_port_retry_s)
        routes.mark_down(k, time.monotonic())
        if self.routes is routes:
            r = self._workers.pop(k, None)
            if r is not None:
                await r.aclose()

    async def _execute_routed(self, routes: core.WorkerRoutes,
                              args: Sequence[Any]) -> tuple[bool, Any]:
        """(True, reply) from the owner's worker port, or (False, None): main connection."""
        k = routes.route(args, time.monotonic())
        if k is None:
            return False, None
        try:
            return True, await self._worker_conn(routes, k).execute_command(*args)
        except redis.ResponseError as exc:
            err = core.map_redis_error(exc)
            if core.is_leaving(err):
                return False, None
            raise err from None
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            await self._worker_failed(routes, k, exc)
            return False, None

    async def _client(self) -> aredis.Redis:
        if self._redis is None:
            async with self._lock:
                if self._redis is None:
                    await self._connect(None)
        assert self._redis is not None
        return self._redis

    async def _failover(self, broken: aredis.Redis) -> None:
        async with self._lock:
            if self._redis is broken:
                await self._connect(self.topology.current)

    async def _current_routes(self) -> core.WorkerRoutes | None:
        """The worker routes, once known (route_to_owner: the first command connects first)."""
        if self._route_to_owner and self._redis is None:
            await self._client()
        return self.routes

    async def execute(self, *args: Any) -> Any:
        """One command; another node on -LEAVING or a dropped connection (see Disque.execute)."""
        routes = await self._current_routes()
        if routes is not None:
            done, reply = await self._execute_routed(routes, args)
            if done:
                return reply
        attempt = 0
        while True:
            r = await self._client()
            try:
                return await r.execute_command(*args)
            except redis.ResponseError as exc:
                self._raise_unless_retrying(core.map_redis_error(exc), attempt, str(args[0]))
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._raise_unless_retrying(exc, attempt, str(args[0]))
            attempt += 1
            await self._failover(r)

    async def aclose(self) -> None:
        await self._close_workers()
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    async def __aenter__(self) -> AsyncDisque:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- commands

    async def hello(self) -> Hello:
        r = await self._client()
        host, port = self.topology.current or ("", 0)
        hello = core.parse_hello(await self.execute("HELLO"), host, port)
        if r is self._redis:
            self.topology.hello = hello
        return hello

    async def info(self, section: str | None = None) -> dict[str, str]:
        return core.parse_info(await self.execute("INFO", *([section] if section else [])))

    async def ping(self) -> bool:
        return await self.execute("PING") in (b"PONG", "PONG", True)

    async def add_job(self, queue: str | bytes, body: bytes | str, timeout_ms: int = 0,
                      **options: Unpack[core.AddJobOptions]) -> str:
        return core.as_str(await self.execute(*core.addjob_args(queue, body, timeout_ms, **options)))

    async def add_jobs(self, items: Iterable[tuple[str | bytes, bytes | str]],
                       timeout_ms: int = 0, **options: Unpack[core.AddJobOptions]) -> list[str]:
        ids: list[str] = []
        batch: list[list[Any]] = []
        for queue, body in items:
            batch.append(core.addjob_args(queue, body, timeout_ms, **options))
            if len(batch) >= core.pipeline_commands_max:
                ids += await self._pipeline(batch)
                batch = []
        if batch:
            ids += await self._pipeline(batch)
        return ids

    async def _pipeline(self, commands: list[list[Any]]) -> list[str]:
        out: list[str] = []
        for chunk in core.chunks_by_size(commands, core.pipeline_bytes_max):
            routes = await self._current_routes()
            out += (await self._round_trip(chunk) if routes is None
                    else await self._routed_trip(routes, chunk))
        return out

    async def _routed_trip(self, routes: core.WorkerRoutes,
                           commands: Sequence[Sequence[Any]]) -> list[str]:
        """Each worker port's commands in one round trip, all at once; the rest (and a
        failed port's) on the main connection."""
        groups = list(routes.split(commands, time.monotonic()).items())

        async def one(k: int | None, indices: list[int]) -> list[Any]:
            part = [commands[i] for i in indices]
            replies = None if k is None else await self._worker_trip(routes, k, part)
            return replies if replies is not None else await self._round_trip(part)

        results = await asyncio.gather(*(one(k, idx) for k, idx in groups),
                                       return_exceptions=True)
        out: list[Any] = [None] * len(commands)
        first_error: tuple[int, BaseException] | None = None
        for (_, indices), replies in zip(groups, results, strict=True):
            if isinstance(replies, BaseException):
                if first_error is None or indices[0] < first_error[0]:
                    first_error = (indices[0], replies)
                continue
            for i, reply in zip(indices, replies, strict=True):
                out[i] = reply
        if first_error is not None:
            raise first_error[1]
        return out

    async def _worker_trip(self, routes: core.WorkerRoutes, k: int,
                           commands: Sequence[Sequence[Any]]) -> list[str] | None:
        try:
            pipe = self._worker_conn(routes, k).pipeline(transaction=False)
            for args in commands:
                pipe.execute_command(*args)
            replies = await pipe.execute(raise_on_error=False)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            await self._worker_failed(routes, k, exc)
            return None
        for reply in replies:
            if isinstance(reply, redis.ResponseError):
                raise core.map_redis_error(reply)
        return [core.as_str(x) for x in replies]

    async def _round_trip(self, commands: Sequence[Sequence[Any]]) -> list[str]:
        attempt = 0
        while True:
            r = await self._client()
            try:
                pipe = r.pipeline(transaction=False)
                for args in commands:
                    pipe.execute_command(*args)
                replies = await pipe.execute(raise_on_error=False)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._raise_unless_retrying(exc, attempt, "pipeline")
                attempt += 1
                await self._failover(r)
                continue
            for reply in replies:
                if isinstance(reply, redis.ResponseError):
                    raise core.map_redis_error(reply)
            return [core.as_str(x) for x in replies]

    async def get_jobs(self, queues: str | bytes | Iterable[str | bytes],
                       **options: Unpack[core.GetJobOptions]) -> list[Job]:
        jobs = core.parse_jobs(await self.execute(*core.getjob_args(queues, **options)))
        await self._maybe_follow_producer(jobs)
        return jobs

    async def get_job(self, queues: str | bytes | Iterable[str | bytes],
                      **kw: Any) -> Job | None:
        jobs = await self.get_jobs(queues, count=1, **kw)
        return jobs[0] if jobs else None

    async def _maybe_follow_producer(self, jobs: Sequence[Job]) -> None:
        target = self.topology.producer_to_follow(jobs)
        if target is None:
            return
        async with self._lock:
            with self.topology.trying_only(target):
                await self._connect(None)

    async def ack(self, *ids: _IdArgs, result: bytes | str | None = None) -> int:
        """ACKJOB; ``result`` (disque-mp extension, one job): kept as the job's result."""
        return int(await self.execute(*core.ack_args(core.job_ids_of(ids), result)))

    async def fast_ack(self, *ids: _IdArgs) -> int:
        return int(await self.execute("FASTACK", *core.job_ids_of(ids)))

    async def nack(self, *ids: _IdArgs, delay: int | None = None) -> int:
        """NACK; ``delay`` (seconds, disque-mp extension): deliverable only after it."""
        return int(await self.execute(*core.nack_args(core.job_ids_of(ids), delay)))

    async def enqueue(self, *ids: _IdArgs) -> int:
        return int(await self.execute("ENQUEUE", *core.job_ids_of(ids)))

    async def dequeue(self, *ids: _IdArgs) -> int:
        return int(await self.execute("DEQUEUE", *core.job_ids_of(ids)))

    async def del_job(self, *ids: _IdArgs) -> int:
        return int(await self.execute("DELJOB", *core.job_ids_of(ids)))

    async def working(self, job: str | Job, progress: bytes | str | None = None) -> int:
        """WORKING; ``progress`` (disque-mp extension): recorded with it."""
        return int(await self.execute(*core.working_args(core.job_ids_of((job,))[0], progress)))

    async def result(self, job: str | Job,
                     timeout_ms: int | None = None) -> bytes | core.Progress | None:
        """RESULT (disque-mp extension): as ``Disque.result``."""
        return core.parse_result(await self.execute(
            *core.result_args(core.job_ids_of((job,))[0], timeout_ms)))

    async def show(self, job: str | Job) -> dict[str, Any] | None:
        return core.parse_pairs(await self.execute("SHOW", core.job_ids_of((job,))[0]))

    async def wait_jobs(self, *ids: _IdArgs, timeout_ms: int | None = None) -> int:
        """WAITJOB (disque-mp extension): block until every job is acknowledged,
        deleted or expired (or ``timeout_ms``: None/0 waits forever); how many are.
        The connection's socket timeout must exceed the wait."""
        return int(await self.execute(*core.waitjob_args(core.job_ids_of(ids), timeout_ms)))

    async def global_qlen(self, queue: str | bytes) -> int:
        """GLOBALQLEN (disque-mp extension): QLEN summed over every reachable node."""
        return int(await self.execute("GLOBALQLEN", queue))

    async def del_queue(self, queue: str | bytes, *, local: bool = False) -> int:
        """DELQUEUE (disque-mp extension): remove every job of the queue (on every
        reachable node, or this one with ``local``); how many were removed."""
        return int(await self.execute(*core.delqueue_args(queue, local)))

    async def dead_letter(self, *ids: _IdArgs, reason: str | bytes | None = None) -> int:
        """DEADLETTER (disque-mp extension): move the jobs to ``dead:<queue>`` now,
        same ID, with ``reason`` (SHOW's ``dead-reason``); how many moved."""
        return int(await self.execute(*core.deadletter_args(core.job_ids_of(ids), reason)))

    async def redrive(self, dead_queue: str | bytes, count: int | None = None) -> int:
        """REDRIVE (disque-mp extension): up to ``count`` jobs of ``dead:<queue>``
        queued on this node back to their queue; how many moved."""
        return int(await self.execute(*core.redrive_args(dead_queue, count)))

    async def schedule(self, name: str | bytes, queue: str | bytes, body: bytes | str, *,
                  cron: str | None = None, every: int | None = None, tz: str | None = None,
                  timeout_ms: int = 0, **options: Any) -> None:
        """SCHEDULE SET (disque-mp extension): add ``ADDJOB queue body`` with
        ``options`` (``add_job``'s) at each time of ``cron`` (in ``tz``) or ``every``
        seconds; known to every node, one job a fire time while they see each other.
        Setting a name again replaces its schedule."""
        await self.execute(*core.schedule_args(name, queue, body, cron=cron, every=every, tz=tz,
                                               timeout_ms=timeout_ms, **options))

    async def unschedule(self, name: str | bytes) -> bool:
        """SCHEDULE DEL (disque-mp extension): True when the schedule existed."""
        return bool(await self.execute("SCHEDULE", "DEL", name))

    async def schedules(self) -> list[dict[str, Any]]:
        """SCHEDULE LIST then SHOW (disque-mp extension): every schedule, by name,
        with its rule, ADDJOB words, next and last fire (epoch ms), last job ID,
        fired and skipped counts."""
        out = []
        for name in await self.execute("SCHEDULE", "LIST"):
            try:
                out.append(core.parse_schedule(await self.execute("SCHEDULE", "SHOW", name)))
            except core.CommandError:
                continue  # deleted between LIST and SHOW
        return out

    async def qlen(self, queue: str | bytes) -> int:
        return int(await self.execute("QLEN", queue))

    async def qpeek(self, queue: str | bytes, count: int) -> list[Job]:
        return core.parse_jobs(await self.execute("QPEEK", queue, int(count)))

    async def qstat(self, queue: str | bytes) -> dict[str, Any] | None:
        return core.parse_pairs(await self.execute("QSTAT", queue))

    async def qgroups(self, queue: str | bytes, count: int | None = None) -> list[tuple[str, int]]:
        """QGROUPS (disque-mp extension): (group, queued jobs), largest first."""
        return core.parse_groups(await self.execute(*core.qgroups_args(queue, count)))

    async def pause(self, queue: str | bytes, *options: str) -> str:
        return core.as_str(await self.execute("PAUSE", queue, *options))

    async def set_limit(self, queue: str | bytes, *, active: int | None = None,
                        rate: int | None = None, group_active: int | None = None,
                        bcast: bool = False) -> dict[str, int]:
        """QLIMIT (disque-mp extension), as ``Disque.set_limit``."""
        return core.parse_limits(await self.execute(*core.qlimit_args(
            queue, active, rate, group_active, bcast)))

    async def reset_limits(self, queue: str | bytes, *, bcast: bool = False) -> dict[str, int]:
        """QLIMIT queue RESET (disque-mp extension)."""
        return core.parse_limits(await self.execute(*core.qlimit_args(
            queue, bcast=bcast, reset=True)))

    async def limits(self, queue: str | bytes) -> dict[str, int]:
        """QLIMIT queue (disque-mp extension), as ``Disque.limits``."""
        return core.parse_limits(await self.execute(*core.qlimit_args(queue)))

    async def iter_queues(self, *, count: int | None = None, minlen: int | None = None,
                          maxlen: int | None = None,
                          importrate: int | None = None) -> AsyncIterator[str]:
        cursor = 0
        while True:
            cursor, names = core.parse_scan(await self.execute(*core.qscan_args(
                cursor, count, minlen, maxlen, importrate)))
            for name in names:
                yield core.as_str(name)
            if cursor == 0:
                return

    @overload
    def iter_jobs(self, *, queue: str | bytes | None = ..., states: Iterable[str] = ...,
                  count: int | None = ...,
                  reply_all: Literal[False] = ...) -> AsyncIterator[str]: ...
    @overload
    def iter_jobs(self, *, queue: str | bytes | None = ..., states: Iterable[str] = ...,
                  count: int | None = ...,
                  reply_all: Literal[True]) -> AsyncIterator[dict[str, Any]]: ...

    async def iter_jobs(self, *, queue: str | bytes | None = None, states: Iterable[str] = (),
                        count: int | None = None, reply_all: bool = False) -> AsyncIterator[Any]:
        states = list(states)
        cursor = 0
        while True:
            cursor, items = core.parse_scan(await self.execute(*core.jscan_args(
                cursor, count, queue, states, reply_all)))
            for item in items:
                yield core.parse_pairs(item) if reply_all else core.as_str(item)
            if cursor == 0:
                return

    # ---- consumer helper

    async def consume(self, queues: str | bytes | Iterable[str | bytes],
                      handler: Callable[[Job], Awaitable[Any]], *, count: int = 1,
                      max_jobs: int | None = None, stop: asyncio.Event | None = None,
                      fast_ack: bool = False, poll_ms: int = core.consume_poll_ms) -> int:
        """Like ``Disque.consume`` with a handler (a coroutine function): ACK on return,
        NACK on exception, WORKING while it runs. Returns the number of jobs handled."""
        names = core.queue_list(queues)
        handled = 0
        while not core.consume_done(max_jobs, handled, stop):
            want = core.consume_batch(count, max_jobs, handled)
            jobs = await self.get_jobs(names, timeout_ms=poll_ms, count=want, withcounters=True)
            beats = [asyncio.create_task(self._heartbeat(j.id)) for j in jobs]
            try:
                for i, job in enumerate(jobs):
                    try:
                        await self._handle(handler, job, fast_ack, beats[i])
                    except BaseException:  # cancelled: the jobs not handled go back at once
                        if jobs[i + 1:]:
                            await self.nack(jobs[i + 1:])
                        raise
                    finally:
                        beats[i].cancel()
                    handled += 1
            finally:
                for beat in beats:
                    beat.cancel()
        return handled

    async def iterate(self, queues: str | bytes | Iterable[str | bytes], *,
                      count: int = 1, poll_ms: int = core.consume_poll_ms) -> AsyncIterator[Job]:
        """Async-iterator form; ACK when the loop asks for the next job, WORKING while
        jobs are held, leaving the loop NACKs the jobs in hand. Async generators
        are finalized late, so close it explicitly::

            async with contextlib.aclosing(d.iterate("q")) as jobs:
                async for job in jobs:
                    ...
        """
        names = core.queue_list(queues)
        in_hand: list[Job] = []
        beats: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                in_hand = await self.get_jobs(names, timeout_ms=poll_ms, count=count,
                                              withcounters=True)
                beats = {j.id: asyncio.create_task(self._heartbeat(j.id)) for j in in_hand}
                while in_hand:
                    yield in_hand[0]
                    beats.pop(in_hand[0].id).cancel()
                    await self.ack(in_hand.pop(0))
        finally:
            for beat in beats.values():
                beat.cancel()
            if in_hand:
                await self.nack(in_hand)

    async def _handle(self, handler: Callable[[Job], Awaitable[Any]], job: Job,
                      fast_ack: bool, beat: asyncio.Task[None]) -> None:
        try:
            await handler(job)
        except Exception:
            beat.cancel()
            log.exception("handler failed on job %s: NACK", job.id)
            await self.nack(job.id)
            return
        beat.cancel()
        await (self.fast_ack(job.id) if fast_ack else self.ack(job.id))

    async def _heartbeat(self, job_id: str) -> None:
        """WORKING after heartbeat_first_s, then every half retry (heartbeat_retry_fraction)."""
        delay_s = core.heartbeat_first_s
        while True:
            await asyncio.sleep(delay_s)
            started = time.monotonic()
            try:
                retry_s = await self.working(job_id)
            except DisqueError as exc:
                log.warning("WORKING %s: %s", job_id, exc)
                return
            if retry_s <= 0:
                return
            delay_s = max(0.0, retry_s * core.heartbeat_retry_fraction
                          - (time.monotonic() - started))
