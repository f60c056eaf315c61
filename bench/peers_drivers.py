"""One job queue per peer, driven by its usual Python client, behind one small interface.

``Driver`` (per process; the harness forks a process per producer and consumer):

- ``setup(queues)``: what the queues need before use (Stream groups, RabbitMQ queues,
  NATS streams); ``teardown(queues)`` removes them after the run.
- ``produce(items)``: add a batch of (queue, body) jobs and wait until the server has
  accepted every one (a reply, a publisher confirm, a PubAck).
- ``consume(queues, count, timeout_s)``: take up to ``count`` jobs, waiting up to
  ``timeout_s`` for the first; returns (handle, body) pairs.
- ``ack(handles)``: acknowledge them (the job is done and leaves the queue).

The clients: disque-mp and the C Disque with the project's client
(``disque_mp.client.Disque``: ADDJOB pipelined, GETJOB COUNT, ACKJOB); Redis with
redis-py as a list (LPUSH, LMOVE to a processing list, LREM) and as Streams (XADD,
XREADGROUP, XACK); beanstalkd with greenstalk (put, reserve, delete: its protocol has
no pipelining); RabbitMQ with aio-pika (publisher confirms awaited together, consumer
prefetch, manual acks; pika's BlockingConnection waits for each confirm in turn,
which would measure one round trip per job); NATS JetStream with nats-py (publishes
awaited together for their PubAcks, a pull consumer, explicit acks).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import redis

T = TypeVar("T")
PREFETCH = 100  # RabbitMQ consumer prefetch: twice the harness's batch


@dataclass(frozen=True)
class Target:
    """Where a driver connects and what it promises: ``replicas`` copies of a job;
    ``pids``: the servers' processes, for their CPU."""

    system: str
    ports: list[int]
    replicas: int = 1
    pids: tuple[int, ...] = ()


class Driver(Protocol):
    def setup(self, queues: list[str]) -> None: ...
    def teardown(self, queues: list[str]) -> None: ...
    def produce(self, items: list[tuple[str, bytes]]) -> None: ...
    def consume(self, queues: list[str], count: int, timeout_s: float) -> list[tuple[Any, bytes]]: ...
    def ack(self, handles: list[Any]) -> None: ...
    def close(self) -> None: ...


class DisqueDriver:
    """disque-mp or the C reference: the same protocol, the same client."""

    def __init__(self, target: Target, port: int) -> None:
        from disque_mp.client import Disque

        self.replicas = target.replicas
        self.c = Disque([("127.0.0.1", port)], socket_timeout=60, failover_attempts=0,
                        follow_priority=False)

    def setup(self, queues: list[str]) -> None:
        pass

    def teardown(self, queues: list[str]) -> None:
        pass

    def produce(self, items: list[tuple[str, bytes]]) -> None:
        self.c.add_jobs(items, 0, replicate=self.replicas if self.replicas > 1 else None)

    def consume(self, queues: list[str], count: int, timeout_s: float) -> list[tuple[Any, bytes]]:
        jobs = self.c.get_jobs(queues, timeout_ms=max(1, int(timeout_s * 1000)), count=count)
        return [(j.id, j.body) for j in jobs]

    def ack(self, handles: list[Any]) -> None:
        self.c.ack(handles)

    def close(self) -> None:
        self.c.close()


class RedisListDriver:
    """The reliable-queue pattern: LPUSH, LMOVE into this consumer's processing list,
    LREM from it once done."""

    def __init__(self, target: Target, port: int) -> None:
        import os

        self.r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=60)
        self.processing = f"processing:{os.getpid()}"
        self.turn = 0

    def setup(self, queues: list[str]) -> None:
        pass

    def teardown(self, queues: list[str]) -> None:
        pass

    def produce(self, items: list[tuple[str, bytes]]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for q, body in items:
            pipe.lpush(q, body)
        pipe.execute()

    def consume(self, queues: list[str], count: int, timeout_s: float) -> list[tuple[Any, bytes]]:
        pipe = self.r.pipeline(transaction=False)
        for i in range(count):
            pipe.lmove(queues[(self.turn + i) % len(queues)], self.processing, "RIGHT", "LEFT")
        got = [b for b in pipe.execute() if b is not None]
        if not got:
            q = queues[self.turn % len(queues)]
            b = self.r.execute_command("BLMOVE", q, self.processing, "RIGHT", "LEFT",
                                       max(timeout_s, 0.01))
            got = [b] if b is not None else []
        self.turn += count
        return [(b, b) for b in got]

    def ack(self, handles: list[Any]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for body in handles:  # the oldest taken sits at the tail: LREM from there
            pipe.lrem(self.processing, -1, body)
        pipe.execute()

    def close(self) -> None:
        self.r.close()


class RedisStreamsDriver:
    """XADD; XREADGROUP (one group, a consumer name per process); XACK."""

    GROUP = "workers"

    def __init__(self, target: Target, port: int) -> None:
        import os

        self.r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=60)
        self.name = f"c{os.getpid()}"

    def setup(self, queues: list[str]) -> None:
        for q in queues:
            self.r.xgroup_create(q, self.GROUP, id="0", mkstream=True)

    def teardown(self, queues: list[str]) -> None:
        self.r.delete(*queues)

    def produce(self, items: list[tuple[str, bytes]]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for q, body in items:
            pipe.xadd(q, {"b": body})
        pipe.execute()

    def consume(self, queues: list[str], count: int, timeout_s: float) -> list[tuple[Any, bytes]]:
        reply: Any = self.r.xreadgroup(self.GROUP, self.name, dict.fromkeys(queues, ">"), count=count,
                                  block=max(1, int(timeout_s * 1000)))
        out: list[tuple[Any, bytes]] = []
        for stream, entries in reply or []:
            out += [((stream, eid), fields[b"b"]) for eid, fields in entries]
        return out

    def ack(self, handles: list[Any]) -> None:
        by_stream: dict[bytes, list[bytes]] = {}
        for stream, eid in handles:
            by_stream.setdefault(stream, []).append(eid)
        pipe = self.r.pipeline(transaction=False)
        for stream, ids in by_stream.items():
            pipe.xack(stream, self.GROUP, *ids)
        pipe.execute()

    def close(self) -> None:
        self.r.close()


class BeanstalkDriver:
    """put (one round trip each), reserve, delete; a tube per queue."""

    def __init__(self, target: Target, port: int) -> None:
        import greenstalk

        self.errors = (greenstalk.TimedOutError, greenstalk.DeadlineSoonError)
        self.c = greenstalk.Client(("127.0.0.1", port), encoding=None)
        self.using = "default"
        self.watching: list[str] = []

    def setup(self, queues: list[str]) -> None:
        pass

    def teardown(self, queues: list[str]) -> None:
        pass

    def produce(self, items: list[tuple[str, bytes]]) -> None:
        for q, body in items:
            if q != self.using:
                self.c.use(q)
                self.using = q
            self.c.put(body)

    def consume(self, queues: list[str], count: int, timeout_s: float) -> list[tuple[Any, bytes]]:
        if self.watching != queues:
            for q in queues:
                self.c.watch(q)
            if "default" not in queues:
                self.c.ignore("default")
            self.watching = list(queues)
        out: list[tuple[Any, bytes]] = []
        try:  # beanstalkd's timeouts are whole seconds: 0 answers at once
            job = self.c.reserve(timeout=max(1, round(timeout_s)))
            out.append((job, job.body))
            while len(out) < count:
                job = self.c.reserve(timeout=0)
                out.append((job, job.body))
        except self.errors:
            pass
        return out

    def ack(self, handles: list[Any]) -> None:
        for job in handles:
            self.c.delete(job)

    def close(self) -> None:
        self.c.close()


class _AsyncDriver:
    """A driver over an asyncio client, run on a private event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def run_all(self, coros: list[Coroutine[Any, Any, Any]]) -> list[Any]:
        """Await the coroutines together (futures made on this driver's loop)."""
        async def together() -> list[Any]:
            return list(await asyncio.gather(*coros))
        return self.run(together())

    def close(self) -> None:
        self.run(self.aclose())
        self.loop.close()

    async def aclose(self) -> None:
        raise NotImplementedError


class RabbitDriver(_AsyncDriver):
    """A classic queue (one node) or a quorum queue (replicas > 1: persistent messages);
    publisher confirms, prefetch, manual acks (one ``multiple`` ack per batch)."""

    def __init__(self, target: Target, port: int) -> None:
        super().__init__()
        import aio_pika

        self.aio_pika = aio_pika
        self.quorum = target.replicas > 1
        self.conn, self.pub = self.run(self._open(port))
        self.sub: Any = None
        self.inbox: asyncio.Queue[Any] = asyncio.Queue()

    async def _open(self, port: int) -> tuple[Any, Any]:
        conn = await self.aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
        return conn, await conn.channel(publisher_confirms=True)

    def setup(self, queues: list[str]) -> None:
        args = {"x-queue-type": "quorum"} if self.quorum else None
        for q in queues:
            self.run(self.pub.declare_queue(q, durable=self.quorum, arguments=args))

    def teardown(self, queues: list[str]) -> None:
        for q in queues:
            self.run(self.pub.queue_delete(q))

    def produce(self, items: list[tuple[str, bytes]]) -> None:
        mode = self.aio_pika.DeliveryMode.PERSISTENT if self.quorum else None
        ex = self.pub.default_exchange
        self.run_all([ex.publish(self.aio_pika.Message(b, delivery_mode=mode), routing_key=q)
                      for q, b in items])

    async def _subscribe(self, queues: list[str]) -> None:
        self.sub = await self.conn.channel()
        await self.sub.set_qos(prefetch_count=PREFETCH)
        for q in queues:
            queue = await self.sub.declare_queue(q, passive=True)
            await queue.consume(self.inbox.put)

    async def _take(self, count: int, timeout_s: float) -> list[Any]:
        try:
            out = [await asyncio.wait_for(self.inbox.get(), timeout_s)]
        except TimeoutError:
            return []
        while len(out) < count and not self.inbox.empty():
            out.append(self.inbox.get_nowait())
        return out

    def consume(self, queues: list[str], count: int, timeout_s: float) -> list[tuple[Any, bytes]]:
        if self.sub is None:
            self.run(self._subscribe(queues))
        return [(m, m.body) for m in self.run(self._take(count, timeout_s))]

    def ack(self, handles: list[Any]) -> None:
        if handles:
            self.run(handles[-1].ack(multiple=True))

    async def aclose(self) -> None:
        await self.conn.close()


class NatsDriver(_AsyncDriver):
    """A JetStream work-queue stream per queue (memory storage, ``replicas`` copies), one
    durable push consumer with a deliver group shared by the consuming processes,
    explicit acks."""

    DURABLE = "workers"

    def __init__(self, target: Target, port: int) -> None:
        super().__init__()
        import nats

        self.replicas = target.replicas
        self.nc = self.run(nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=10))
        self.js = self.nc.jetstream(timeout=30)
        self.subs: dict[str, Any] = {}
        self.turn = 0

    @staticmethod
    def stream(q: str) -> str:
        return q.replace(".", "_").replace(":", "_")

    def setup(self, queues: list[str]) -> None:
        for q in queues:
            self.run(self.js.add_stream(name=self.stream(q), subjects=[q], retention="workqueue",
                                        storage="memory", num_replicas=self.replicas))

    def teardown(self, queues: list[str]) -> None:
        for q in queues:
            self.run(self.js.delete_stream(self.stream(q)))

    def produce(self, items: list[tuple[str, bytes]]) -> None:
        self.run_all([self.js.publish(q, b) for q, b in items])

    async def _take(self, q: str, count: int, timeout_s: float) -> list[Any]:
        import nats.errors

        if q not in self.subs:  # a push consumer: pull fetches of a batch wait out their expiry
            self.subs[q] = await self.js.subscribe(q, queue=self.DURABLE, durable=self.DURABLE,
                                                    stream=self.stream(q), manual_ack=True)
        sub = self.subs[q]
        try:
            out = [await sub.next_msg(timeout=timeout_s)]
            while len(out) < count and sub.pending_msgs > 0:
                out.append(await sub.next_msg(timeout=timeout_s))
        except (TimeoutError, nats.errors.TimeoutError):
            return []
        return out

    def consume(self, queues: list[str], count: int, timeout_s: float) -> list[tuple[Any, bytes]]:
        q = queues[self.turn % len(queues)]
        self.turn += 1
        return [(m, m.data) for m in self.run(self._take(q, count, timeout_s))]

    def ack(self, handles: list[Any]) -> None:
        self.run_all([m.ack() for m in handles])

    async def aclose(self) -> None:
        await self.nc.close()


DRIVERS: dict[str, type] = {
    "disque-mp": DisqueDriver, "disque-mp-1w": DisqueDriver, "disque-c": DisqueDriver, "redis-list": RedisListDriver,
    "redis-streams": RedisStreamsDriver, "beanstalkd": BeanstalkDriver,
    "rabbitmq": RabbitDriver, "nats": NatsDriver,
}


def connect(target: Target) -> Driver:
    """A driver on the target's first port (every client of a cluster on one node)."""
    driver: Driver = DRIVERS[target.system](target, target.ports[0])
    return driver
