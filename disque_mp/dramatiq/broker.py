"""A Dramatiq broker on Disque, through ``disque_mp.client.Disque``.

- enqueue: ``ADDJOB queue <message> 0 RETRY <visibility_timeout> TTL <message_ttl>``,
  with ``dedup=True`` plus ``DEDUP <message id>`` (``<message id>:<n>`` for retry n):
  a re-sent message the node holds unacknowledged is not added twice
  (docs/extensions.md, "Idempotent adds");
  a ``delay`` (ms) becomes ``DELAY ceil(delay / 1000)`` seconds: Disque counts
  whole seconds, so a delay is rounded **up** (250 ms waits 1 s) and a message
  never runs early. No delay queue and no ``eta`` option: the node holds the
  job until it is due, the worker runs what it receives.
- consume: ``GETJOB TIMEOUT <ms> COUNT <free prefetch slots> FROM queue``;
  while a message is held (prefetched or running) a heartbeat thread sends
  ``WORKING`` for it, so a long task is not delivered twice while its worker
  lives, and a worker killed mid-task sees its messages again after
  ``visibility_timeout``.
- ack: ``ACKJOB``; nack (the message failed for good, e.g. Retries gave up):
  ``DEADLETTER <id> REASON <the exception's text>``, the same job to
  ``dead:<queue>`` (REDRIVE, the dashboard or ``disque-mp admin requeue`` bring it
  back); with ``dead_letters="xq"``, Dramatiq's own way instead: ``ADDJOB
  <queue>.XQ`` (TTL ``dead_message_ttl``) then ``ACKJOB``; requeue (a consumer that
  stops with messages it did not run): ``NACK``, which queues them again at once.
- Retries middleware works unchanged: its retry of a message still held by a
  consumer of this broker (it always is, in a worker) becomes ``NACK <id> DELAY
  <backoff>`` on the same job (ID kept, ``nacks`` counts the retries, added to
  ``options["retries"]`` when it is delivered again); the worker's ack after it
  is skipped. ``max_deliveries`` (ADDJOB ``MAXDELIVER``) moves a message
  delivered that many times without an ack (a message that kills its worker)
  to ``dead:<queue>``, the node's dead-letter queue, as a nack does.
- fair tenants: the ``group`` message option (``actor.send_with_options(...,
  group="tenant-a")``) becomes ``ADDJOB ... GROUP``: the node serves a queue's
  groups in rotation, so one tenant's backlog does not hold back another's
  messages. A retry keeps it (NACK on the same job, or the option on a copy).
- priority: the ``priority`` message option (``send_with_options(...,
  priority=9)``; ``broker_priority``, the RabbitMQ broker's name, is read too)
  becomes ``ADDJOB ... PRIORITY`` (0..9, higher delivered first).
- Failover across nodes and ``-LEAVING`` come from the client.
- No round trip per message where RabbitMQ has none: with ``confirm_delivery``
  off (the default, as on Dramatiq's RabbitMQ broker) ``enqueue`` pipelines its
  ADDJOB (``disque_mp.client.AddWindow``: at most ``publish_window`` unanswered;
  an error reply raises from the next ``enqueue`` or from ``confirm_enqueued()``,
  which ``close``, ``join``, ``pending`` and ``flush`` call first); with
  ``async_acks`` (default) acks leave in batches from a thread
  (``disque_mp.client.AckBatcher``), as a RabbitMQ consumer's basic.ack leaves
  without a reply. The consumer waits for a free prefetch slot on a condition
  the ack signals, not by polling.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dramatiq.broker import Broker, Consumer, MessageProxy
from dramatiq.common import xq_name
from dramatiq.errors import BrokerConnectionError, DecodeError
from dramatiq.message import Message
from dramatiq.middleware import Middleware

from disque_mp.client import (
    AckBatcher,
    AddWindow,
    Disque,
    DisqueConnectionError,
    DisqueError,
    Heartbeat,
    add_window_default,
)
from disque_mp.client.core import task_dedup_key
from disque_mp.client.limits import DEAD_PREFIX, dead_reason, group_name, priority_level
from disque_mp.client.limits import MAXDELIVER_MAX as max_deliveries_max
from disque_mp.client.limits import queue_limits as limits_of

log = logging.getLogger("disque_mp.dramatiq")

# Disque's default RETRY: a message neither acked nor kept alive by the
# heartbeat is delivered again after this long.
visibility_timeout_default_s = 300
# A message nobody consumed is dropped after this long (Disque's default TTL).
message_ttl_default_s = 24 * 3600
# Where a nacked message goes: "node" (DEADLETTER: the job itself to dead:<queue>,
# with its reason) or "xq" (a copy in Dramatiq's <queue>.XQ, then ACKJOB).
dead_letters_kinds = ("node", "xq")
# DEADLETTER's reason when the message holds no exception.
nack_reason_default = "failed"
# Dead-lettered messages are kept this long (Dramatiq's Redis broker: 7 days).
dead_message_ttl_default_s = 7 * 24 * 3600
# One GETJOB blocks at most this long (the consumer's own timeout is usually 1 s).
block_ms_max = 1000
# Longest wait for a free prefetch slot before re-checking the consumer's deadline
# (an ack wakes the wait at once; this only bounds a wait nothing ends).
prefetch_full_wait_s = 0.1
# purge: IDs peeked and acked per round, rounds at most (a producer faster than
# the purge would keep it going forever)
purge_batch_jobs = 1000
purge_rounds_max = 10_000
# join(): how often it looks at the queue
join_poll_s = 0.1
url_scheme = "disque://"


group_option = "group"  # the message option naming its GROUP
priority_options = ("priority", "broker_priority")  # the options naming its PRIORITY


def message_group(message: Message) -> str | None:
    """The ``group`` option as ADDJOB GROUP's name (None: none); ValueError when it
    is empty or over 256 bytes (a message that asked for fairness does not go without)."""
    return group_name(message.options.get(group_option), "group option")


def message_priority(message: Message) -> int:
    """The ``priority`` (or ``broker_priority``) option as ADDJOB PRIORITY's value
    (0: none); ValueError when it is no integer 0..9."""
    for name in priority_options:
        value = message.options.get(name)
        if value is not None:
            return priority_level(value, f"{name} option")
    return 0


def delay_seconds(delay_ms: int | float | None) -> int | None:
    """Dramatiq's delay (ms) as Disque's DELAY (whole seconds, rounded up); None for none."""
    if delay_ms is None or delay_ms <= 0:
        return None
    return math.ceil(delay_ms / 1000)


def nodes_from_url(url: str) -> list[str]:
    """``disque://h1:7711,h2:7712`` (or ``h1:7711,h2:7712``) -> ``["h1:7711", "h2:7712"]``
    (the client checks each address)."""
    rest = url[len(url_scheme):] if url.startswith(url_scheme) else url
    rest = rest.split("/", 1)[0]
    return [n.strip() for n in rest.split(",") if n.strip()]


class DisqueMessage(MessageProxy):
    """A delivered message and the Disque job that carries it."""

    def __init__(self, message: Message, job_id: str,
                 consumer: DisqueConsumer | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.consumer = consumer
        # set when a retry requeued this job in place (NACK DELAY): no ack after it
        self.requeued_in_place = False


class DisqueBroker(Broker):
    """``DisqueBroker(nodes=[...])`` or ``DisqueBroker(url="disque://h1:7711,h2:7712")``.

    ``visibility_timeout`` (s): Disque RETRY of every message. ``message_ttl``
    (s): how long a message waits for a consumer at most (a delay is added to
    it). ``dead_message_ttl`` (s): life of dead-lettered messages.
    ``replicate``: copies per job in a cluster (node default when None).
    ``heartbeat``: WORKING for held messages (default on). ``max_deliveries``:
    ADDJOB ``MAXDELIVER`` (None: no cap). ``client``: an existing ``Disque`` to
    use instead of creating one. ``confirm_delivery``: each ``enqueue`` waits for
    the node's reply (off: pipelined, at most ``publish_window`` unanswered, errors
    from the next ``enqueue`` or ``confirm_enqueued()``). ``async_acks``: acks sent
    in batches by a thread (off: each ack waits for its ACKJOB's reply).
    ``dedup``: ADDJOB ``DEDUP <message id>``, so an ``enqueue`` repeated by a
    producer that did not see the first one's reply adds nothing while a node
    holding the message has it unacknowledged.
    ``dead_letters``: ``"node"`` (default) dead-letters a failed message with
    DEADLETTER (same job, ``dead:<queue>``, the exception's text as its reason);
    ``"xq"`` copies it to Dramatiq's ``<queue>.XQ`` (``dead_message_ttl``).
    ``queue_limits``: QLIMIT per queue, ``{"emails": {"active": 5, "rate": 50,
    "group_active": 2}}`` (each optional): set with BCAST on every reachable node
    when a worker starts consuming the queue; each node applies them to its own
    deliveries (a cluster-wide cap is the value times the nodes serving the queue).
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        nodes: str | Sequence[str | tuple[str, int]] | None = None,
        middleware: list[Middleware] | None = None,
        visibility_timeout: int = visibility_timeout_default_s,
        message_ttl: int = message_ttl_default_s,
        dead_message_ttl: int = dead_message_ttl_default_s,
        replicate: int | None = None,
        heartbeat: bool = True,
        max_deliveries: int | None = None,
        password: str | None = None,
        client: Disque | None = None,
        confirm_delivery: bool = False,
        publish_window: int = add_window_default,
        async_acks: bool = True,
        dedup: bool = False,
        dead_letters: str = "node",
        queue_limits: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        super().__init__(middleware=middleware)
        if dead_letters not in dead_letters_kinds:
            raise ValueError(f"dead_letters must be one of {dead_letters_kinds}")
        if visibility_timeout < 1:
            raise ValueError("visibility_timeout must be >= 1 s (RETRY 0 is at-most-once)")
        if message_ttl < 1 or dead_message_ttl < 1:
            raise ValueError("message_ttl and dead_message_ttl must be >= 1 s")
        if max_deliveries is not None and not 1 <= max_deliveries <= max_deliveries_max:
            raise ValueError(f"max_deliveries must be 1..{max_deliveries_max} (MAXDELIVER)")
        if url is not None and nodes is not None:
            raise ValueError("give url or nodes, not both")
        seeds = nodes_from_url(url) if url is not None else nodes
        self.client = client or Disque(seeds, password=password)  # ValueError on a bad address
        self.visibility_timeout_s = int(visibility_timeout)
        self.message_ttl_s = int(message_ttl)
        self.dead_message_ttl_s = int(dead_message_ttl)
        self.replicate = replicate
        self.heartbeat = heartbeat
        self.max_deliveries = max_deliveries
        self.async_acks = async_acks
        self.dedup = dedup
        self.dead_letters = dead_letters
        # None: every enqueue waits for its reply (confirm_delivery)
        self.adds = None if confirm_delivery else AddWindow(self.client, publish_window)
        self.queues: set[str] = set()
        self.queue_limits = {str(q): limits_of(v, f"queue_limits[{q!r}]")
                                 for q, v in (queue_limits or {}).items()}

    # ---- queues

    def declare_queue(self, queue_name: str) -> None:
        if queue_name in self.queues:
            return
        self.emit_before("declare_queue", queue_name)
        self.queues.add(queue_name)  # Disque creates queues on the first job
        self.emit_after("declare_queue", queue_name)

    def get_declared_queues(self) -> set[str]:
        return self.queues.copy()

    def get_declared_delay_queues(self) -> set[str]:
        return set()  # delays are Disque's DELAY: no delay queues to consume

    # ---- produce

    def enqueue(self, message: Message, *, delay: int | None = None) -> Message:
        delay_s = delay_seconds(delay)
        self.logger.debug("Enqueueing message %r on queue %r.", message.message_id,
                          message.queue_name)
        self.emit_before("enqueue", message, delay)
        try:
            if not self._requeue_in_place(message, delay_s):
                add = self.client.add_job if self.adds is None else self.adds.add
                add(message.queue_name, message.encode(), replicate=self.replicate,
                    delay=delay_s, retry=self.visibility_timeout_s,
                    ttl=self.message_ttl_s + (delay_s or 0), maxdeliver=self.max_deliveries,
                    dedup=task_dedup_key(message.message_id,
                                         int(message.options.get("retries") or 0))
                    if self.dedup else None,
                    group=message_group(message), priority=message_priority(message))
        except DisqueConnectionError as exc:
            raise BrokerConnectionError(str(exc)) from exc
        self.emit_after("enqueue", message, delay)
        return message

    def confirm_enqueued(self) -> None:
        """Wait until the node answered every pipelined enqueue; raise the first error
        reply not raised yet (a no-op with ``confirm_delivery``)."""
        if self.adds is None:
            return
        try:
            self.adds.flush()
        except DisqueConnectionError as exc:
            raise BrokerConnectionError(str(exc)) from exc

    def _requeue_in_place(self, message: Message, delay_s: int | None) -> bool:
        """A retry of a message a consumer of ours still holds: NACK [DELAY] its job.

        False (publish a new job instead) for any other message, or when the
        node refuses the NACK."""
        if not (isinstance(message, DisqueMessage) and message.consumer is not None
                and message.consumer.holds(message.job_id)):
            return False
        try:
            self.client.nack(message.job_id, delay=delay_s)
        except DisqueConnectionError:
            raise
        except DisqueError as exc:
            log.warning("NACK DELAY of %s refused (%s): the retry is a new job",
                        message.job_id, exc)
            return False
        message.requeued_in_place = True
        return True

    def dead_letter(self, queue_name: str, body: bytes, job_id: str,
                    reason: BaseException | str | None = None) -> bool:
        """A message that failed for good: DEADLETTER its job (True: the caller must
        not ack it), or with ``dead_letters="xq"`` a copy in ``<queue>.XQ`` (False:
        the caller acks the job)."""
        if self.dead_letters == "node":
            why = dead_reason(reason if reason is not None else nack_reason_default)
            if not self.client.dead_letter(job_id, reason=why):
                # not held by this node (any more): never dropped, it comes back
                # after its visibility timeout
                log.warning("DEADLETTER of %s moved nothing: the job comes back after "
                            "its visibility timeout", job_id)
            return True
        self.client.add_job(xq_name(queue_name), body, replicate=self.replicate,
                            retry=self.visibility_timeout_s, ttl=self.dead_message_ttl_s)
        return False

    # ---- consume

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 30000) -> Consumer:
        limits = self.queue_limits.get(queue_name)
        if limits:  # QLIMIT ... BCAST: the queue's limits on every reachable node
            try:
                self.client.set_limit(queue_name, bcast=True, **limits)
            except DisqueConnectionError as exc:  # the worker's consumer retries it
                raise BrokerConnectionError(str(exc)) from exc
        return DisqueConsumer(self, queue_name, prefetch, timeout)

    # ---- maintenance

    def flush(self, queue_name: str) -> None:
        """Ack every job queued on the connected node in the queue and its dead letters
        (``<queue>.XQ`` and ``dead:<queue>``)."""
        self.confirm_enqueued()
        for name in (queue_name, xq_name(queue_name), DEAD_PREFIX + queue_name):
            for _ in range(purge_rounds_max):
                jobs = self.client.qpeek(name, purge_batch_jobs)
                if not jobs:
                    break
                self.client.ack(jobs)

    def flush_all(self) -> None:
        for queue_name in self.queues:
            self.flush(queue_name)

    def pending(self, queue_name: str) -> int:
        """Jobs of the queue queued or being worked on (active) on the connected node."""
        self.confirm_enqueued()
        return sum(1 for _ in self.client.iter_jobs(queue=queue_name, states=["queued"])) + \
            sum(1 for _ in self.client.iter_jobs(queue=queue_name, states=["active"]))

    def join(self, queue_name: str, *, timeout: int | None = None) -> None:
        """Wait until the queue has nothing queued, delayed or in flight on the
        connected node (a test helper, as on Dramatiq's other brokers)."""
        from dramatiq.errors import QueueJoinTimeout

        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        while self.pending(queue_name):
            if deadline is not None and time.monotonic() > deadline:
                raise QueueJoinTimeout(queue_name)
            time.sleep(join_poll_s)

    def close(self) -> None:
        try:
            if self.adds is not None:
                self.adds.close()
        finally:
            self.client.close()


class DisqueConsumer(Consumer):
    """Messages of one queue, at most ``prefetch`` held (taken and not yet acked)."""

    def __init__(self, broker: DisqueBroker, queue_name: str, prefetch: int,
                 timeout_ms: int) -> None:
        self.broker = broker
        self.client = broker.client
        self.queue_name = queue_name
        self.prefetch = max(1, int(prefetch))
        self.timeout_ms = max(1, int(timeout_ms))
        self._buffer: deque[DisqueMessage] = deque()
        self._held: set[str] = set()  # job IDs taken, not yet acked/nacked/requeued
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)  # a held message was released
        self._beat = Heartbeat(self.client.working) if broker.heartbeat else None
        self._acks = AckBatcher(self.client) if broker.async_acks else None

    def __next__(self) -> DisqueMessage | None:
        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            if self._buffer:
                return self._buffer.popleft()
            free = self._wait_free(deadline)
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if free > 0:
                self._fetch(free, max(1, min(block_ms_max, remaining_ms)))
                if self._buffer:
                    continue
            if time.monotonic() >= deadline:
                return None

    def _wait_free(self, deadline: float) -> int:
        """Free prefetch slots, waiting (until ``deadline``) for an ack to free one."""
        with self._freed:
            while len(self._held) >= self.prefetch:
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    break
                self._freed.wait(min(left_s, prefetch_full_wait_s))
            return self.prefetch - len(self._held)

    def _fetch(self, count: int, block_ms: int) -> None:
        try:
            jobs = self.client.get_jobs(self.queue_name, timeout_ms=block_ms, count=count,
                                        withcounters=True)
        except DisqueConnectionError as exc:
            raise BrokerConnectionError(str(exc)) from exc
        for job in jobs:
            try:
                message = Message.decode(job.body)
            except DecodeError as exc:
                log.error("job %s in queue %r is not a Dramatiq message (%s): dead-lettered",
                          job.id, job.queue, exc)
                if not self.broker.dead_letter(self.queue_name, job.body, job.id,
                                               f"not a Dramatiq message: {exc}"):
                    self.client.ack(job.id)
                continue
            if job.nacks:
                # requeued in place by retries (NACK DELAY): the body is the one
                # first published, its nacks are the retries since
                options = dict(message.options)
                options["retries"] = int(options.get("retries") or 0) + job.nacks
                message = message.copy(options=options)
            with self._lock:
                self._held.add(job.id)
            if self._beat is not None:
                self._beat.add(job.id)
            self._buffer.append(DisqueMessage(message, job.id, self))

    def _release(self, messages: Iterable[DisqueMessage]) -> list[str]:
        """Forget messages (idempotent: a retried ack must not free a slot twice)."""
        ids = []
        for m in messages:
            if self._beat is not None:
                self._beat.remove(m.job_id)
            ids.append(m.job_id)
        with self._freed:
            self._held.difference_update(ids)
            self._freed.notify_all()
        return ids

    def holds(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._held

    def ack(self, message: MessageProxy) -> None:
        assert isinstance(message, DisqueMessage)
        ids = self._release([message])
        if message.requeued_in_place:  # the retry's NACK DELAY requeued it
            return
        if self._acks is not None:
            self._acks.ack(message.job_id)
        else:
            self._call(self.client.ack, ids)

    def nack(self, message: MessageProxy) -> None:
        assert isinstance(message, DisqueMessage)
        ids = self._release([message])
        try:
            moved = self.broker.dead_letter(self.queue_name, message._message.encode(),
                                            message.job_id, message._exception)
        except DisqueConnectionError as exc:
            raise BrokerConnectionError(str(exc)) from exc
        if not moved:
            self._call(self.client.ack, ids)

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        held = [m for m in messages if isinstance(m, DisqueMessage)]
        ids = self._release(held)
        if ids:
            self._call(self.client.nack, ids)

    def _call(self, command: Any, ids: list[str]) -> None:
        try:
            command(ids)
        except DisqueConnectionError as exc:
            raise BrokerConnectionError(str(exc)) from exc
        except DisqueError as exc:
            # not lost: Disque delivers the job again after its retry time
            log.warning("%s of %s failed: %s", command.__name__, ids, exc)

    def close(self) -> None:
        """Give back prefetched messages the worker never saw (NACK: queued again now)."""
        try:
            if self._buffer:
                self.requeue(list(self._buffer))
                self._buffer.clear()
        finally:
            if self._beat is not None:
                self._beat.close()
                self._beat = None
            if self._acks is not None:
                self._acks.close()
