"""A kombu virtual transport on Disque: Celery's ``disque://`` broker.

    import disque_mp.kombu                     # registers the disque:// scheme
    app = Celery("tasks", broker="disque://127.0.0.1:7711;disque://127.0.0.1:7712")

How kombu's operations map onto Disque (everything goes through
``disque_mp.client.Disque``, which also moves to another node on ``-LEAVING``
or a lost connection):

- publish: ``ADDJOB queue <message as JSON> 0 RETRY <visibility_timeout>``, plus
  ``DELAY`` for a Celery ``eta``/``countdown`` (seconds, rounded up) and ``TTL``
  from ``expires`` (else ``message_ttl``); with the ``dedup`` transport option,
  ``DEDUP <task id>`` (``<task id>:<n>`` for retry n): a producer that re-sends a
  task whose publish timed out gets the first message's job back while a node
  holding it has it unacknowledged (docs/extensions.md, "Idempotent adds");
  and ``GROUP`` (fair tenants: the node
  serves a queue's groups in rotation) from the ``disque_group`` header or, with the
  ``fair_key`` transport option, from the header or task keyword argument it names;
- consume: ``GETJOB TIMEOUT <ms> COUNT <free prefetch slots> FROM q1 q2 ...``
  (left to right: the first queue that has jobs wins);
- ack: ``ACKJOB``; reject with requeue: ``NACK``; reject without requeue (a
  ``Reject(requeue=False)``, a task that failed for good with
  ``task_acks_on_failure_or_timeout`` off): ``DEADLETTER <id> REASON <text>``, the
  same job to ``dead:<queue>`` with the exception's text when the task class is
  ``disque_mp.kombu.celery.DisqueTask`` (REDRIVE, the dashboard or ``disque-mp admin
  requeue`` bring it back); with ``dead_letter_queue`` set, a copy of the message
  there instead, then ``ACKJOB``;
- unacked messages of a channel that closes (worker shutdown) go back with
  ``NACK``, never by publishing them again (that would duplicate them);
- queue size: ``QLEN``; purge: ``QPEEK`` + ``ACKJOB`` until the queue is empty.

No round trip per message where py-amqp has none: publishing pipelines its ADDJOBs
(``disque_mp.client.AddWindow``, at most ``publish_window`` unanswered, an error
reply raised by the next publish or when the connection closes) unless the
``confirm_publish`` transport option asks for a reply per message, as py-amqp's
does; acks leave in batches from a thread (``disque_mp.client.AckBatcher``;
``async_acks=False`` for one ACKJOB round trip each); a consumer whose prefetch
slots are all taken waits for an ack to free one (a condition), not a poll.

The delivery tag of a message is its Disque job ID. While a message is held
unacked, a heartbeat thread sends ``WORKING`` for it (first after 0.5 s, then
every half of its retry), so a task longer than the visibility timeout is not
delivered twice while its worker lives; a worker that dies stops the heartbeat
and its jobs come back after the visibility timeout.

Fanout and topic exchanges (Celery's remote control: ``celery inspect``,
``celery status``, ``celery control``; Celery events: ``worker -E``, ``celery
events``, Flower) work across processes and hosts: their bindings, and those of
transient queues (pidbox replies), are kept in Disque itself
(``disque_mp.kombu.bindings``), and a publish adds a short-lived copy to every
bound queue. A connection whose channels consume several queues (a Celery
worker's tasks and its pidbox) asks for all of them in one GETJOB, the
transient ones first, so a control command waits for no task queue's block.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from queue import Empty
from typing import Any

from kombu.transport import virtual
from kombu.transport.base import to_rabbitmq_queue_arguments
from kombu.transport.virtual import exchange as kombu_exchange

import disque_mp
from disque_mp.client import (
    AckBatcher,
    AddWindow,
    Disque,
    DisqueConnectionError,
    DisqueError,
    Heartbeat,
    Job,
    add_window_default,
)
from disque_mp.client.core import AddJobOptions, task_dedup_key
from disque_mp.client.limits import MAXDELIVER_MAX as max_deliveries_max
from disque_mp.client.limits import dead_reason, group_name
from disque_mp.client.limits import queue_limits as limits_of
from disque_mp.kombu.bindings import (
    Binding,
    SharedBindings,
    binding_ttl_default_s,
    copy_ttl_s,
    fanout_message_ttl_default_s,
)

log = logging.getLogger("disque_mp.kombu")

DEFAULT_PORT = 7711
# Disque's own default RETRY: a message not acked (and not kept alive by the
# heartbeat) is delivered again after this long.
visibility_timeout_default_s = 300
# Disque's default TTL: a message nobody consumed is dropped after a day.
message_ttl_default_s = 24 * 3600
# A GETJOB blocks at most this long, so the worker loop regains control often
# enough to notice a shutdown and to send its pending operations.
block_ms_max = 1000
# Jobs asked for by one GETJOB when the channel has no prefetch limit.
fetch_count_default = 100
# Longest wait for a free prefetch slot while every one is taken (no GETJOB is sent
# then); an ack ends the wait at once, this bounds a wait nothing ends.
polling_interval_default_s = 0.01
# Purge: job IDs peeked and acked per round, and the rounds before giving up
# (a producer that outpaces the purge would otherwise keep it going forever).
purge_batch_jobs = 1000
purge_rounds_max = 10_000
# IDs per NACK when a closing channel returns its unacked messages.
nack_batch_ids = 1000
# Where a message that is not kombu's JSON goes (the queue name plus this),
# when no dead_letter_queue is set: moved aside, never dropped.
invalid_queue_suffix = ".invalid"
# DEADLETTER's reason for a rejected message whose exception the transport does
# not know (a task class other than DisqueTask, a consumer's own basic_reject).
reject_reason_default = "rejected without requeue"
# Priority queues: a message of priority p goes to the queue of the highest
# step <= p, named like kombu's Redis transport does (name + sep + step).
priority_separator = "\x06\x16"
# While a channel of a connection waits at its prefetch limit, the connection's other
# consumers (a worker's pidbox) are asked with NOHANG GETJOBs at most this often (the
# longest a control command waits then): a blocking GETJOB would hold back the task
# an ack lets in.
held_poll_interval_s = 0.1


def seconds_until(stamp: Any, now_s: float) -> int | None:
    """Whole seconds (rounded up, >= 0) from ``now_s`` to an ISO-8601 time or a
    UNIX timestamp; None when there is no stamp. Naive times are UTC."""
    if stamp is None or stamp == "":
        return None
    if isinstance(stamp, int | float):
        when = float(stamp)
    else:
        parsed = datetime.fromisoformat(str(stamp))
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        when = parsed.timestamp()
    return max(0, math.ceil(when - now_s))


# The header that names a message's fairness group (ADDJOB GROUP). Not Celery's own
# ``group`` header: that one carries the ID of a canvas group.
group_header = "disque_group"


def message_group(message: dict[str, Any], fair_key: str | None) -> str | None:
    """The GROUP of a kombu message: its ``disque_group`` header, else (``fair_key``
    set) the header of that name, else the task keyword argument of that name (JSON
    bodies: Celery's message protocol 1 or 2). None: no group. ValueError when it is
    empty or over 256 bytes: a publish that asked for fairness does not go without."""
    headers = message.get("headers") or {}
    value = headers.get(group_header)
    if value is None and fair_key:
        value = headers.get(fair_key)
        if value is None:
            value = _task_kwargs(message).get(fair_key)
    return group_name(value, "disque:// message group")


def _task_kwargs(message: dict[str, Any]) -> dict[str, Any]:
    """A Celery task message's keyword arguments; {} when the body is not JSON."""
    if message.get("content-type") != "application/json":
        return {}
    body = message.get("body")
    try:
        if (message.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)  # type: ignore[arg-type]
        decoded = json.loads(body)  # type: ignore[arg-type]
    except (ValueError, TypeError, binascii.Error):
        return {}
    if isinstance(decoded, list) and len(decoded) >= 2:  # protocol 2: [args, kwargs, embed]
        decoded = decoded[1]
    elif isinstance(decoded, dict):  # protocol 1: {"task", "args", "kwargs", ...}
        decoded = decoded.get("kwargs")
    return decoded if isinstance(decoded, dict) else {}


def job_times(headers: dict[str, Any], now_s: float,
              message_ttl_s: int) -> tuple[int, int]:
    """(DELAY, TTL) of the job for a message's ``eta`` and ``expires`` headers.

    Disque requires DELAY < TTL. A message that expires before its eta gets a
    TTL one second past the delay: the worker then receives it and revokes it as
    expired (Celery's behaviour), instead of ADDJOB failing.
    """
    delay_s = seconds_until(headers.get("eta"), now_s) or 0
    expires_s = seconds_until(headers.get("expires"), now_s)
    if expires_s is None:
        ttl_s = message_ttl_s + delay_s
    else:
        ttl_s = max(1, expires_s, delay_s + 1)
    return delay_s, ttl_s


class QoS(virtual.QoS):
    """Unacked messages by delivery tag (= job ID); ack, reject and restore speak Disque."""

    def __init__(self, channel: Channel, prefetch_count: int = 0) -> None:
        super().__init__(channel, prefetch_count)
        self._beat: Heartbeat | None = None
        if channel.heartbeat:
            self._beat = Heartbeat(channel.client.working)
        self._acks = AckBatcher(channel.client) if channel.async_acks else None
        self._freed = channel.connection.slot_freed
        # why a held message is about to be rejected (DisqueRequest.on_failure)
        self._reasons: dict[str, bytes] = {}

    def reject_reason(self, delivery_tag: str, reason: bytes) -> None:
        """The text DEADLETTER keeps if the message is rejected without requeue."""
        if delivery_tag in self._delivered:
            self._reasons[delivery_tag] = reason

    def append(self, message: Any, delivery_tag: str) -> None:
        super().append(message, delivery_tag)
        if self._beat is not None:
            self._beat.add(delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        if self._beat is not None:
            self._beat.remove(delivery_tag)
        if self._acks is not None:
            self._acks.ack(delivery_tag)
        else:
            self.channel.client.ack(delivery_tag)
        self._quick_ack(delivery_tag)
        self._freed.set()

    def flush_acks(self) -> None:
        """Wait until every ack handed to the batching thread was sent."""
        if self._acks is not None:
            self._acks.flush()

    def release(self, job_ids: list[str]) -> None:
        """Acknowledge jobs delivered to a no-ack consumer (never held here)."""
        if self._acks is not None:
            for job_id in job_ids:
                self._acks.ack(job_id)
        else:
            self.channel.client.ack(job_ids)

    def forget(self, delivery_tag: str) -> None:
        """Stop holding a message without acking it: its job was requeued (a
        ``DisqueTask`` retry, NACK DELAY) or acknowledged by the pool process."""
        if self._beat is not None:
            self._beat.remove(delivery_tag)
        self._quick_ack(delivery_tag)
        self._freed.set()

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if self._beat is not None:
            self._beat.remove(delivery_tag)
        reason = self._reasons.pop(delivery_tag, None)
        if requeue:
            self.channel.client.nack(delivery_tag)
        else:
            message = self._delivered.get(delivery_tag)
            self.channel.dead_letter(delivery_tag, message, reason)
        self._quick_ack(delivery_tag)
        self._freed.set()

    def restore_unacked(self) -> list[tuple[BaseException, Any]]:
        """NACK every message delivered and not acked: Disque queues them again now."""
        self._flush()
        tags = list(self._delivered)
        errors: list[tuple[BaseException, Any]] = []
        for start in range(0, len(tags), nack_batch_ids):
            chunk = tags[start:start + nack_batch_ids]
            try:
                self.channel.client.nack(chunk)
            except DisqueError as exc:
                # not lost: Disque delivers them again after the visibility timeout
                log.warning("NACK of %d unacked jobs failed (%s): they come back after "
                            "their retry time", len(chunk), exc)
                errors += [(exc, self._delivered[t]) for t in chunk]
        for tag in tags:
            if self._beat is not None:
                self._beat.remove(tag)
        self._delivered.clear()
        return errors

    def restore_unacked_once(self, stderr: Any = None) -> None:
        # The base class dumps unrestorable messages to a file for re-publishing;
        # here they are still safe in Disque (requeued after their retry time).
        self._on_collect.cancel()
        self._flush()
        state = self._delivered
        if not self.restore_at_shutdown or getattr(state, "restored", False):
            return
        try:
            if state:
                log.info("returning %d unacked messages to Disque with NACK", len(state))
                self.restore_unacked()
        finally:
            state.restored = True  # type: ignore[attr-defined]  # kombu's own marker

    def close(self) -> None:
        if self._beat is not None:
            self._beat.close()
            self._beat = None
        if self._acks is not None:
            self._acks.close()


class DirectExchange(kombu_exchange.DirectExchange):
    """This process's bindings first (Celery's task queues, declared by every
    producer: no registry read); a routing key none of them matches (a reply to
    another process's queue) is looked up in the shared bindings."""

    def deliver(self, message: Any, exchange: str, routing_key: str, **kwargs: Any) -> None:
        channel = self.channel
        local = self.lookup(channel.local_table(exchange), exchange, routing_key, None)
        shared = [] if local else [b for b in channel.shared_table(exchange, fresh=True)
                                   if b.routing_key == routing_key]
        channel.put_routed(local, shared, message, **kwargs)


class TopicExchange(kombu_exchange.TopicExchange):
    """Local and shared bindings whose pattern matches; the shared table may be up
    to ``bindings_cache_s`` old (Celery events publish often)."""

    def deliver(self, message: Any, exchange: str, routing_key: str, **kwargs: Any) -> None:
        channel = self.channel
        local = self.lookup(channel.local_table(exchange), exchange, routing_key, None)
        shared = [b for b in channel.shared_table(exchange, fresh=False)
                  if self._match(b.pattern, routing_key)]
        channel.put_routed(local, shared, message, **kwargs)


class FanoutExchange(kombu_exchange.FanoutExchange):
    """Every queue bound anywhere, read afresh (broadcasts are rare, and one must
    reach a worker that started a moment ago)."""

    def deliver(self, message: Any, exchange: str, routing_key: str, **kwargs: Any) -> None:
        channel = self.channel
        local = self.lookup(channel.local_table(exchange), exchange, routing_key, None)
        channel.put_routed(local, channel.shared_table(exchange, fresh=True), message, **kwargs)


class Channel(virtual.Channel):
    """One kombu channel; the Disque client is the connection's (thread-safe)."""

    QoS = QoS
    do_restore = True
    supports_fanout = True  # kombu then calls _queue_bind for every binding
    exchange_types: Any = {"direct": DirectExchange, "topic": TopicExchange,
                           "fanout": FanoutExchange}

    from_transport_options: Any = virtual.Channel.from_transport_options + (
        "visibility_timeout", "message_ttl", "replicate", "async_replication",
        "dead_letter_queue", "priority_steps", "heartbeat", "fetch_count", "max_deliveries",
        "async_acks", "dedup", "fair_key", "fanout_message_ttl", "queue_limits",
    )
    visibility_timeout: int = visibility_timeout_default_s
    message_ttl: int = message_ttl_default_s
    replicate: int | None = None
    async_replication: bool = False
    dead_letter_queue: str | None = None
    priority_steps: Sequence[int] = (0,)
    heartbeat: bool = True
    fetch_count: int = fetch_count_default
    max_deliveries: int | None = None
    async_acks: bool = True
    dedup: bool = False  # ADDJOB ... DEDUP <task id> (Celery's protocol 2 headers)
    fair_key: str | None = None  # header or task keyword argument naming the GROUP
    # TTL of a broadcast's copy for a transient queue without x-message-ttl
    fanout_message_ttl: int = fanout_message_ttl_default_s
    # QLIMIT per kombu queue: {"emails": {"active": 5, "rate": 50, "group_active": 2}},
    # set with BCAST when the queue is declared (``_new_queue``)
    queue_limits: Mapping[str, Mapping[str, int]] | None = None

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self._check_options()
        self._limits = {str(q): limits_of(v, f"disque:// queue_limits[{q!r}]")
                        for q, v in (self.queue_limits or {}).items()}

    def _check_options(self) -> None:
        if int(self.visibility_timeout) < 1:
            raise ValueError("disque:// visibility_timeout must be >= 1 second "
                             "(RETRY 0 would make delivery at-most-once)")
        if int(self.message_ttl) < 1:
            raise ValueError("disque:// message_ttl must be >= 1 second")
        if int(self.fanout_message_ttl) < 1:
            raise ValueError("disque:// fanout_message_ttl must be >= 1 second")
        steps = sorted(int(s) for s in self.priority_steps)
        if not steps or steps[0] != 0:
            raise ValueError("disque:// priority_steps must start with 0, e.g. [0, 3, 6, 9]")
        self.priority_steps = steps
        if self.max_deliveries is not None and not (
                1 <= int(self.max_deliveries) <= max_deliveries_max):
            raise ValueError(f"disque:// max_deliveries must be 1..{max_deliveries_max} "
                             "(ADDJOB MAXDELIVER)")

    @property
    def client(self) -> Disque:
        return self.connection.disque

    # ---- exchanges: bindings shared through Disque (disque_mp.kombu.bindings)

    def local_table(self, exchange: str) -> list[tuple[str, str, str]]:
        """The bindings of ``exchange`` made by this connection (kombu's table)."""
        return self.state.exchanges.get(exchange, {}).get("table", [])

    def shared_table(self, exchange: str, *, fresh: bool) -> list[Binding]:
        return self.connection.bindings.table(exchange, fresh=fresh)

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str | None,
                    queue: str) -> None:
        """Share a binding other processes route by: any of a fanout or topic
        exchange, and a transient queue's (a reply queue on a direct exchange). A
        durable queue on a direct exchange (Celery's task queues) stays local: every
        producer declares it, and its publishes read no registry."""
        kind = self.typeof(exchange).type
        transient, message_ttl_s = self.connection.queue_kinds.get(queue, (False, 0))
        if kind == "direct" and not transient:
            return
        self.connection.bindings.bind(exchange, Binding(
            queue, routing_key or "", pattern or "", transient,
            message_ttl_s or int(self.fanout_message_ttl)))

    def put_routed(self, local: Iterable[str], shared: list[Binding], message: dict[str, Any],
                   **kwargs: Any) -> None:
        """Deliver a publish to the queues its exchange routes it to: this process's
        own bindings and the shared ones, each queue once; a transient queue gets an
        at-most-once copy with a short TTL."""
        routed = {b.queue: b for b in shared}
        for queue in local:
            if queue not in routed:
                self._put(queue, message, **kwargs)
        for binding in routed.values():
            if binding.transient:
                self._put_copy(binding, message)
            else:
                self._put(binding.queue, message, **kwargs)

    def _put_copy(self, binding: Binding, message: dict[str, Any]) -> None:
        adds = self.connection.adds
        add = self.client.add_job if adds is None else adds.add
        add(binding.queue, json.dumps(message, separators=(",", ":")), retry=0, replicate=1,
            ttl=copy_ttl_s(binding, message.get("headers") or {}, time.time()))

    def basic_consume(self, queue: str, no_ack: bool, callback: Any, consumer_tag: str,
                      **kwargs: Any) -> Any:
        if no_ack:  # its jobs are acknowledged as they are delivered
            self.connection.no_ack_queues.add(queue)
        return super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        if queue is not None:
            self.connection.no_ack_queues.discard(queue)
        return super().basic_cancel(consumer_tag)

    # ---- queue names and priority

    def _queue_for(self, queue: str, priority: int) -> str:
        step = max(s for s in self.priority_steps if s <= priority) if priority > 0 else 0
        return queue if step == 0 else f"{queue}{priority_separator}{step}"

    def _all_queues(self, queue: str) -> list[str]:
        """A kombu queue's Disque queues, the one consumed first (priority 0) first."""
        return [self._queue_for(queue, s) for s in self.priority_steps]

    @staticmethod
    def _kombu_queue(disque_queue: str) -> str:
        return disque_queue.split(priority_separator, 1)[0]

    # ---- the virtual transport's primitives

    def prepare_queue_arguments(self, arguments: Any, **kwargs: Any) -> Any:
        """A queue's ``message_ttl`` as ``x-message-ttl``: the TTL of its broadcast copies."""
        return to_rabbitmq_queue_arguments(arguments, **kwargs)

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        """Disque creates queues on the first job; a transient queue (auto-delete,
        exclusive or not durable) and its message TTL are remembered for its bindings;
        a queue named in ``queue_limits`` gets its QLIMIT on every reachable node
        (BCAST), each of its priority steps' queues alike."""
        if kwargs.get("auto_delete") or kwargs.get("exclusive") or kwargs.get("durable") is False:
            ttl_ms = (kwargs.get("arguments") or {}).get("x-message-ttl")
            ttl_s = math.ceil(float(ttl_ms) / 1000) if ttl_ms else 0
            self.connection.queue_kinds[queue] = (True, max(0, ttl_s))
        else:
            self.connection.queue_kinds.pop(queue, None)
        limits = self._limits.get(queue)
        if limits:
            for name in self._all_queues(queue):
                self.client.set_limit(name, bcast=True, **limits)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return True

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        adds = self.connection.adds
        add = self.client.add_job if adds is None else adds.add
        target, body, options = self.job_for(queue, message)
        add(target, body, **options)

    def job_for(self, queue: str, message: dict[str, Any]) -> tuple[str, str, AddJobOptions]:
        """The ADDJOB that publishes ``message`` to ``queue``: Disque queue, body and
        options (the beat scheduler, ``beat.py``, makes SCHEDULEs of the same)."""
        delay_s, ttl_s = job_times(message.get("headers") or {}, time.time(),
                                   int(self.message_ttl))
        priority = self._get_message_priority(message, reverse=False)
        options = AddJobOptions(
            replicate=self.replicate, delay=delay_s or None,
            retry=int(self.visibility_timeout), ttl=ttl_s, async_=bool(self.async_replication),
            maxdeliver=None if self.max_deliveries is None else int(self.max_deliveries),
            dedup=self._dedup_key(message),
            group=message_group(message, self.fair_key),
            priority=priority if len(self.priority_steps) == 1 else None)  # else a queue per step
        return self._queue_for(queue, priority), json.dumps(message, separators=(",", ":")), options

    def _dedup_key(self, message: dict[str, Any]) -> str | None:
        """The task's ID as DEDUP key when the ``dedup`` option asks (None: no key,
        or a message without Celery's task ID header)."""
        if not self.dedup:
            return None
        headers = message.get("headers") or {}
        task_id = headers.get("id")
        if not task_id:
            return None
        return task_dedup_key(str(task_id), int(headers.get("retries") or 0))

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        """One message (basic_get): NOHANG, Empty when there is none."""
        jobs = self.client.get_jobs(self._all_queues(queue), nohang=True, count=1,
                                    withcounters=True)
        for job in jobs:
            payload = self._decode(job)
            if payload is not None:
                return payload
        raise Empty()

    def consumed_queues(self) -> list[str]:
        """The kombu queues this channel's consumers take from."""
        return list(self._active_queues)

    def _get_many(self, queues: Iterable[str], timeout: float | None = None) -> None:
        self.fetch(queues, timeout)  # kombu's hook, for a channel drained on its own

    def fetch(self, queues: Iterable[str], timeout: float | None = None,
              count: int | None = None, nohang: bool = False) -> None:
        """GETJOB over these kombu queues; deliver what came (Empty if nothing).
        ``count``: jobs at most (default: the free prefetch slots); ``nohang``: no wait."""
        names = [q for queue in queues for q in self._all_queues(queue)]
        if not names:
            raise Empty()
        if count is None:
            count = self.qos.can_consume_max_estimate() or int(self.fetch_count)
        if nohang:
            jobs = self.client.get_jobs(names, nohang=True, count=count, withcounters=True)
        else:
            block_ms = block_ms_max if timeout is None else int(timeout * 1000)
            block_ms = max(1, min(block_ms_max, block_ms))  # TIMEOUT 0 would block forever
            jobs = self.client.get_jobs(names, timeout_ms=block_ms, count=count,
                                        withcounters=True)
        if not self._deliver_jobs(jobs):
            raise Empty()

    def _deliver_jobs(self, jobs: list[Job]) -> int:
        """Hand each job's message to its queue's consumer; a no-ack consumer's job
        is acknowledged now. Returns how many were delivered."""
        no_ack = self.connection.no_ack_queues
        ready = []
        for job in jobs:
            payload = self._decode(job)
            if payload is not None:
                ready.append((job.id, payload, self._kombu_queue(job.queue)))
        done = [job_id for job_id, _, queue in ready if queue in no_ack]
        if done:  # before the callbacks: one may end the worker (a shutdown command)
            self.qos.release(done)
        for _, payload, queue in ready:
            self.connection._deliver(payload, queue)
        return len(ready)

    def _decode(self, job: Job) -> dict[str, Any] | None:
        """The kombu message of a job, its delivery tag set to the job ID; a job
        that is not one is moved aside (never lost, never retried forever)."""
        try:
            payload = json.loads(job.body)
            props = payload["properties"]
            props["delivery_tag"] = job.id
            props.setdefault("delivery_info", {})
            headers = payload.get("headers")
            if job.nacks and isinstance(headers, dict) and "retries" in headers:
                # a retry requeued in place (NACK DELAY) keeps the body it was
                # published with: the job's nacks are the retries since then
                headers["retries"] = int(headers["retries"] or 0) + job.nacks
            return payload
        except (ValueError, KeyError, TypeError) as exc:
            target = self.dead_letter_queue or job.queue + invalid_queue_suffix
            log.error("job %s in queue %r is not a kombu message (%s): moved to %r",
                      job.id, job.queue, exc, target)
            self.client.add_job(target, job.body, retry=int(self.visibility_timeout),
                                ttl=int(self.message_ttl))
            self.client.ack(job.id)
            return None

    def dead_letter(self, job_id: str, message: Any, reason: bytes | None = None) -> None:
        """Reject without requeue: DEADLETTER (the job to ``dead:<queue>``, with the
        reason); with ``dead_letter_queue`` set, a copy there, then ACKJOB."""
        if not self.dead_letter_queue:
            why = reason or dead_reason(reject_reason_default)
            if not self.client.dead_letter(job_id, reason=why):
                # not held by this node (any more): never dropped, it comes back
                # after its visibility timeout
                log.warning("DEADLETTER of %s moved nothing: the job comes back after "
                            "its visibility timeout", job_id)
            return
        if message is not None:
            raw = message.serializable() if hasattr(message, "serializable") else message
            self.client.add_job(self.dead_letter_queue,
                                json.dumps(raw, separators=(",", ":")),
                                retry=int(self.visibility_timeout), ttl=int(self.message_ttl))
        self.client.ack(job_id)

    def _restore(self, message: Any) -> None:
        """Redeliver (basic_recover, a message nobody consumes here): NACK, not re-publish."""
        self.client.nack(message.delivery_tag)

    def _size(self, queue: str) -> int:
        self.connection.confirm_published()
        return sum(self.client.qlen(q) for q in self._all_queues(queue))

    def _purge(self, queue: str) -> int:
        """Ack every job queued on the node we are connected to; returns how many.

        Jobs queued on other nodes of a cluster (or being worked on) stay: Disque
        has no cluster-wide "empty this queue"."""
        self.connection.confirm_published()
        purged = 0
        for name in self._all_queues(queue):
            for _ in range(purge_rounds_max):
                jobs = self.client.qpeek(name, purge_batch_jobs)
                if not jobs:
                    break
                purged += self.client.ack(jobs)
        return purged

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        self.connection.bindings.unbind_queue(queue)
        self.connection.queue_kinds.pop(queue, None)
        self._purge(queue)

    def close(self) -> None:
        qos = self._qos
        super().close()  # returns the unacked messages (NACK)
        if qos is not None:
            qos.close()


class Transport(virtual.Transport):
    """kombu transport ``disque``: ``Connection("disque://host:7711")``.

    Nodes: the URL's host (``disque://h1:7711;disque://h2:7712`` gives kombu's
    alternates, all used as seeds) plus ``transport_options["nodes"]``.
    Transport options: ``visibility_timeout`` (RETRY, s), ``message_ttl`` (TTL of
    messages without ``expires``, s), ``replicate``, ``async_replication``,
    ``dead_letter_queue``, ``priority_steps``, ``heartbeat`` (WORKING for unacked
    messages), ``fetch_count``, ``polling_interval``, ``socket_timeout``,
    ``connect_timeout``, ``password`` (or in the URL), ``confirm_publish`` (a reply
    per published message; off: pipelined), ``publish_window`` (unanswered
    publishes at most), ``async_acks`` (acks in batches from a thread),
    ``binding_ttl`` (s, how long a shared binding outlives its process),
    ``fanout_message_ttl`` (s, TTL of a broadcast's copy; see ``bindings``) and
    ``queue_limits`` (QLIMIT per queue, ``{"emails": {"active": 5}}``: set with
    BCAST when the queue is declared; per node, docs/frameworks.md; a job counts
    until its ack, so ``active`` bounds running tasks with ``task_acks_late``).
    """

    Channel = Channel
    default_port: Any = DEFAULT_PORT
    driver_type = "disque"
    driver_name = "disque"
    polling_interval = polling_interval_default_s

    implements = virtual.Transport.implements.extend(
        asynchronous=False,
        exchange_type=frozenset(["direct", "topic", "fanout"]),
        heartbeats=False,
    )
    # kombu (and Celery) reconnect on connection_errors; a node that answers with
    # an error reply is a channel error
    connection_errors: Any = (*virtual.Transport.connection_errors, DisqueConnectionError)
    channel_errors: Any = (*virtual.Transport.channel_errors, DisqueError)

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self._disque: Disque | None = None
        self._adds: AddWindow | None = None
        self._bindings: SharedBindings | None = None
        # set when an ack frees a prefetch slot: ends drain_events' wait for one
        self.slot_freed = threading.Event()
        # transient queues declared here: (True, message TTL s or 0)
        self.queue_kinds: dict[str, tuple[bool, int]] = {}
        # queues consumed without acks (pidbox, event receivers)
        self.no_ack_queues: set[str] = set()
        # when the other channels were last asked while one waited at its limit
        self._held_polled_s = 0.0

    def seeds(self) -> list[str]:
        """Every node named by the URL(s) and the ``nodes`` transport option, as
        ``host:port`` (the client checks them)."""
        out: list[str] = []
        conninfo: Any = self.client
        for url in conninfo.alt or []:
            host, port = _url_address(url)
            out.append(f"{host or conninfo.hostname or '127.0.0.1'}:{port or DEFAULT_PORT}")
        if not out:
            out.append(f"{conninfo.hostname or '127.0.0.1'}:{conninfo.port or DEFAULT_PORT}")
        for node in conninfo.transport_options.get("nodes") or []:
            if str(node) not in out:
                out.append(str(node))
        return out

    @property
    def disque(self) -> Disque:
        if self._disque is None:
            conninfo: Any = self.client
            opts = conninfo.transport_options
            self._disque = Disque(self.seeds(), socket_timeout=opts.get("socket_timeout"),
                                  connect_timeout=float(opts.get("connect_timeout", 2.0)),
                                  password=conninfo.password or opts.get("password"))
        return self._disque

    @property
    def bindings(self) -> SharedBindings:
        """This connection's side of the shared binding registry."""
        if self._bindings is None:
            conninfo: Any = self.client
            ttl_s = conninfo.transport_options.get("binding_ttl", binding_ttl_default_s)
            self._bindings = SharedBindings(lambda: self.disque, self._node_client, int(ttl_s))
        return self._bindings

    def _node_client(self, node: tuple[str, int]) -> Disque:
        """A client for one node only (the shared bindings' registrations there)."""
        conninfo: Any = self.client
        opts = conninfo.transport_options
        return Disque([f"{node[0]}:{node[1]}"], socket_timeout=opts.get("socket_timeout"),
                      connect_timeout=float(opts.get("connect_timeout", 2.0)),
                      password=conninfo.password or opts.get("password"),
                      failover_attempts=0, follow_priority=False)

    @property
    def adds(self) -> AddWindow | None:
        """The window of pipelined publishes; None with ``confirm_publish``."""
        conninfo: Any = self.client
        opts = conninfo.transport_options
        if opts.get("confirm_publish"):
            return None
        if self._adds is None:
            self._adds = AddWindow(self.disque, int(opts.get("publish_window",
                                                             add_window_default)))
        return self._adds

    def confirm_published(self) -> None:
        """Wait for the node's reply to every pipelined publish; raise the first error."""
        if self._adds is not None:
            self._adds.flush()

    def establish_connection(self) -> Transport:
        self.disque.ping()  # DisqueConnectionError (a connection error) if no node answers
        return super().establish_connection()

    def close_connection(self, connection: Any) -> None:
        try:
            if self._bindings is not None:
                self._bindings.close()
                self._bindings = None
            if self._adds is not None:
                self._adds.close()
                self._adds = None
        finally:
            self._close_client(connection)

    def _close_client(self, connection: Any) -> None:
        super().close_connection(connection)
        if self._disque is not None:
            self._disque.close()
            self._disque = None

    def drain_events(self, connection: Any, timeout: Any = None, **kwargs: Any) -> Any:
        # The base loop sleeps polling_interval after every empty round; our
        # GETJOB already blocked, so only wait when it could not block: a channel
        # at its prefetch limit, until an ack frees a slot (or, when others may
        # take more, until they are due to be asked again).
        start = time.monotonic()
        while True:
            self.slot_freed.clear()
            consuming = [c for c in self.channels if c._consumers]
            ready = [c for c in consuming if c.qos.can_consume()]
            held = len(ready) < len(consuming)
            try:
                self._fetch(ready, held=held, timeout=timeout)
                return
            except Empty:
                if timeout is not None and time.monotonic() - start >= timeout:
                    raise TimeoutError() from None
                if held and ready:
                    due_s = self._held_polled_s + held_poll_interval_s - time.monotonic()
                    self.slot_freed.wait(max(0.0, due_s))
                elif held:
                    self.slot_freed.wait(self.polling_interval or 0)

    def _fetch(self, ready: list[Any], held: bool, timeout: float | None) -> None:
        """One GETJOB for the channels that may take more, the transient queues
        (pidbox, replies, events) first, so a control message never waits behind
        tasks; Empty when nothing came. While another channel is ``held`` at its
        prefetch limit: NOHANG, at most every ``held_poll_interval_s`` (a blocking
        GETJOB would hold back the task an ack lets in)."""
        if held and ready:
            now = time.monotonic()
            if now - self._held_polled_s < held_poll_interval_s:
                ready = []  # asked a moment ago: wait for an ack or the next turn
            else:
                self._held_polled_s = now
        if not ready:
            raise Empty()
        queues = [q for c in ready for q in c.consumed_queues()]
        if len(ready) > 1:
            queues.sort(key=lambda q: q not in self.queue_kinds)  # stable: transient first
        count = min(c.qos.can_consume_max_estimate() or int(c.fetch_count) for c in ready)
        ready[0].fetch(queues, timeout=timeout, count=count, nohang=held)

    def driver_version(self) -> str:
        return disque_mp.__version__


def _url_address(url: str) -> tuple[str | None, int | None]:
    from kombu.utils.url import parse_url

    parts = parse_url(url)
    return parts.get("hostname"), parts.get("port")
