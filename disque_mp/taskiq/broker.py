"""A Taskiq broker on Disque, through the asyncio client (``AsyncDisque``).

- kick: ``ADDJOB <queue> <message> 0 RETRY <visibility_timeout_s> TTL <message_ttl_s>``,
  plus ``DELAY <s>`` from the ``delay`` label (seconds, rounded up: Disque counts whole
  seconds, so a task never runs early) and ``MAXDELIVER <n>`` from the ``maxdeliver``
  label (or the broker's ``maxdeliver``): a job delivered that many times without an
  ack goes to ``dead:<queue>``, the node's dead-letter queue.
- listen: ``GETJOB TIMEOUT <ms> COUNT 1 WITHCOUNTERS FROM <queue>``; each job is
  yielded as an ``AckableMessage`` whose ``ack`` is ``ACKJOB``. Taskiq calls it after the
  task ran (``when_saved``, its default, or ``when_executed``): a worker killed mid-task
  never acked, and Disque delivers the job again after ``visibility_timeout_s``. While
  the task runs, a heartbeat sends ``WORKING`` (first after half a second, then every
  half visibility timeout), so a long task that is alive is not delivered twice. The
  task sees its job ID in the ``disque_job_id`` label (``Context.message.labels``).
- retries: Taskiq's retry middlewares (``SimpleRetryMiddleware``,
  ``SmartRetryMiddleware``) retry by kicking the same task ID again. A kick of a task
  this broker is running becomes ``NACK <job> DELAY <delay label>`` on the same job:
  same job ID, the node's ``nacks`` counter counts the retries, and the ack after the
  task is skipped. When the job is delivered again, its ``_retries`` label is the one
  it was added with plus ``nacks``, so the middleware counts on.
- ``dedup`` label (idempotent adds): ``DEDUP <key>``; ``True`` takes the task ID as
  the key, any other value is the key itself (``<key>:<n>`` for retry n, so a retry
  kicked as a new job is not taken for a re-send), ``False`` none; the broker's
  ``dedup=True`` gives every task its ID as key unless its label says otherwise. A
  kick re-sent by a producer that did not see the first one's reply then adds
  nothing while a node holding the job has it unacknowledged.
- ``group`` label (fair tenants): ``ADDJOB ... GROUP <label>``: the node serves the
  queue's groups in rotation, so one tenant's backlog does not hold back another's
  tasks (1..256 bytes, else ``ValueError`` at kick).
- ``priority`` label: ``ADDJOB ... PRIORITY <label>`` (0..9, higher delivered first;
  else ``ValueError`` at kick); a retry kept in place keeps it.
- ``qlimit_active``, ``qlimit_rate``, ``qlimit_group_active`` labels (limits): the
  broker's queue gets ``QLIMIT <queue> ACTIVE n RATE n GROUP-ACTIVE n BCAST`` at the
  first kick that carries them (again when they change): the queue's limits, for
  every task of it, on every reachable node (each node applies them to its own
  deliveries). The broker's ``queue_limits`` (``{"active": 5}``) sets them at startup.
- Failover across nodes and ``-LEAVING`` come from the client.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncGenerator
from typing import Any

from taskiq import AckableMessage, AsyncBroker, BrokerMessage, TaskiqMessage
from taskiq.labels import prepare_label

from disque_mp.aclient import AsyncDisque
from disque_mp.client.core import (
    AddJobOptions,
    DisqueError,
    Job,
    heartbeat_first_s,
    heartbeat_retry_fraction,
    task_dedup_key,
)
from disque_mp.client.limits import LIMIT_NAMES, MAXDELIVER_MAX, group_name, priority_level
from disque_mp.client.limits import queue_limits as limits_of

log = logging.getLogger("disque_mp.taskiq")

url_scheme = "disque://"
# Disque's RETRY: a job neither acked nor kept alive by the heartbeat is delivered
# again after this long.
visibility_timeout_default_s = 300
# A job nobody consumed is dropped after this long (Disque's default TTL).
message_ttl_default_s = 24 * 3600
# One GETJOB blocks at most this long, so that shutdown is noticed.
block_ms_max = 1000
# A failed GETJOB (node unreachable after the client's failover) is retried after this.
listen_error_pause_s = 1.0
# Labels the node has no option for yet; refused rather than silently ignored.
unsupported_labels: tuple[str, ...] = ()
# Set on every delivered message: the Disque job that carries it (same across retries).
job_id_label = "disque_job_id"


class UnsupportedLabelError(ValueError):
    """A label this broker cannot honour on this node (none today: kept for labels
    a later release adds)."""


def nodes_from_url(url: str) -> list[str]:
    """``disque://h1:7711,h2:7712`` (or ``h1:7711,h2:7712``) -> ``["h1:7711", "h2:7712"]``."""
    rest = url[len(url_scheme):] if url.startswith(url_scheme) else url
    rest = rest.split("/", 1)[0]
    return [n.strip() for n in rest.split(",") if n.strip()]


def _maxdeliver_of(value: Any) -> int | None:
    if value is None:
        return None
    n = int(value)
    if not 1 <= n <= MAXDELIVER_MAX:
        raise ValueError(f"maxdeliver must be 1..{MAXDELIVER_MAX} (ADDJOB MAXDELIVER)")
    return n


def _group_of(value: Any) -> str | None:
    """The ``group`` label as ADDJOB GROUP's name (None: no label)."""
    return group_name(value, "group label")


def _priority_of(value: Any) -> int:
    """The ``priority`` label (text on the wire) as ADDJOB PRIORITY's value."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    return priority_level(value, "priority label")


def _delay_s_of(labels: dict[str, Any]) -> int | None:
    value = labels.get("delay")
    if value is None:
        return None
    delay = float(value)
    if delay < 0:
        raise ValueError("delay label must be a non negative number of seconds")
    return math.ceil(delay) or None


_TRUE: frozenset[str] = frozenset(("true", "1", "yes"))
_FALSE: frozenset[str] = frozenset(("false", "0", "no", ""))


def _dedup_key_of(labels: dict[str, Any], task_id: str, default: bool) -> str | None:
    """The ``dedup`` label (a string on the wire: Taskiq sends labels as text): true
    takes the task ID, false none, anything else is the key; absent: the broker's
    ``dedup`` default."""
    value = labels.get("dedup")
    text = "" if value is None else str(value)
    retries = int(labels.get("_retries") or 0)
    if value is None:
        return task_dedup_key(task_id, retries) if default else None
    if text.lower() in _TRUE:
        return task_dedup_key(task_id, retries)
    if text.lower() in _FALSE:
        return None
    return task_dedup_key(text, retries)


def _limits_of_labels(labels: dict[str, Any]) -> dict[str, int]:
    """The ``qlimit_*`` labels as QLIMIT's limits (none: {}); Taskiq may send a
    label as text, so a number in a string counts. ValueError for one that is not."""
    found: dict[str, Any] = {}
    for name in LIMIT_NAMES:
        value = labels.get("qlimit_" + name)
        if value is not None:
            try:
                found[name] = int(str(value))
            except ValueError:
                raise ValueError(f"qlimit_{name} label must be an integer, got {value!r}") \
                    from None
    return limits_of(found, "qlimit labels") if found else {}


def _set_label(message: TaskiqMessage, name: str, value: Any) -> None:
    message.labels[name], label_type = prepare_label(value)
    if message.labels_types is not None:
        message.labels_types[name] = label_type


class _Held:
    """A job this broker delivered and has not acked or requeued yet."""

    __slots__ = ("job_id", "requeued", "beat")

    def __init__(self, job_id: str, beat: asyncio.Task[None]) -> None:
        self.job_id = job_id
        self.requeued = False  # a retry NACKed it (DELAY): no ack after the task
        self.beat = beat


class DisqueBroker(AsyncBroker):
    """``DisqueBroker("disque://h1:7711,h2:7712", queue="tasks")``.

    ``visibility_timeout_s``: Disque RETRY (a running task is kept alive by WORKING);
    ``message_ttl_s``: TTL of a job nobody runs; ``maxdeliver``: default MAXDELIVER
    (None: no cap; the ``maxdeliver`` label overrides it); ``dedup``: the task ID as
    DEDUP key of every task (the ``dedup`` label overrides it); ``client``: an existing
    ``AsyncDisque`` to use instead of connecting to ``url``."""

    def __init__(self, url: str = "disque://127.0.0.1:7711", queue: str = "taskiq", *,
                 visibility_timeout_s: int = visibility_timeout_default_s,
                 message_ttl_s: int = message_ttl_default_s,
                 maxdeliver: int | None = None,
                 password: str | None = None,
                 client: AsyncDisque | None = None,
                 dedup: bool = False,
                 queue_limits: dict[str, int] | None = None) -> None:
        super().__init__()
        if visibility_timeout_s < 1:
            raise ValueError("visibility_timeout_s must be at least 1 (Disque RETRY)")
        self.queue = queue
        self.visibility_timeout_s = int(visibility_timeout_s)
        self.message_ttl_s = int(message_ttl_s)
        self.maxdeliver = _maxdeliver_of(maxdeliver)
        self.dedup = dedup
        self.client = client or AsyncDisque(nodes_from_url(url), password=password)
        self._held: dict[str, _Held] = {}  # job ID -> its state, while its task runs here
        self._job_of_task: dict[str, str] = {}  # task ID -> the job ID it last came in
        self.queue_limits = limits_of(queue_limits or {}, "queue_limits")
        self._limits_sent: dict[str, int] = {}  # the QLIMIT the labels asked for last

    async def startup(self) -> None:
        await super().startup()
        if self.queue_limits:
            await self.client.set_limit(self.queue, bcast=True, **self.queue_limits)

    async def shutdown(self) -> None:
        for held in list(self._held.values()):
            held.beat.cancel()
        await super().shutdown()
        await self.client.aclose()

    async def kick(self, message: BrokerMessage) -> None:
        queue, body, options = self.job_for(message)
        held = self._held.get(self._job_of_task.get(message.task_id, ""))
        if held is not None and not held.requeued:
            try:
                await self._requeue_in_place(held, options.get("delay"))
                return
            except DisqueError as exc:  # e.g. its node is gone: the retry is a new job
                log.warning("NACK DELAY of %s refused (%s): the retry is a new job",
                            held.job_id, exc)
        limits = _limits_of_labels(message.labels)
        if limits and limits != self._limits_sent:
            await self.client.set_limit(self.queue, bcast=True, **limits)
            self._limits_sent = limits
        await self.client.add_job(queue, body, 0, **options)

    def job_for(self, message: BrokerMessage) -> tuple[str, bytes, AddJobOptions]:
        """The ADDJOB that kicks ``message``: queue, body and options (the schedule
        source, ``schedule.py``, makes SCHEDULEs of the same)."""
        labels = message.labels
        for name in unsupported_labels:
            if labels.get(name) is not None:
                raise UnsupportedLabelError(
                    f"label {name!r} needs ADDJOB {name.upper()}, which this Disque node "
                    f"does not have yet: remove the label")
        delay_s = _delay_s_of(labels)
        options = AddJobOptions(
            retry=self.visibility_timeout_s, ttl=self.message_ttl_s + (delay_s or 0),
            delay=delay_s, maxdeliver=_maxdeliver_of(labels.get("maxdeliver", self.maxdeliver)),
            dedup=_dedup_key_of(labels, message.task_id, self.dedup),
            group=_group_of(labels.get("group")), priority=_priority_of(labels.get("priority")))
        return self.queue, message.message, options

    async def _requeue_in_place(self, held: _Held, delay_s: int | None) -> None:
        """A retry of a task this broker runs: NACK [DELAY] its job, same job ID."""
        await self.client.nack(held.job_id, delay=delay_s)
        held.beat.cancel()
        held.requeued = True

    async def listen(self) -> AsyncGenerator[bytes | AckableMessage, None]:
        while True:
            try:
                job = await self.client.get_job(self.queue, timeout_ms=block_ms_max,
                                                withcounters=True)
            except DisqueError as exc:
                log.warning("GETJOB from %s failed: %s", self.queue, exc)
                await asyncio.sleep(listen_error_pause_s)
                continue
            if job is None:
                continue
            yield self._deliver(job)

    def _deliver(self, job: Job) -> bytes | AckableMessage:
        try:
            message = self.formatter.loads(job.body)
        except Exception:  # not a Taskiq message: Taskiq logs and acks it
            return AckableMessage(data=job.body, ack=lambda: self._ack_job(job.id))
        _set_label(message, job_id_label, job.id)
        if job.nacks:  # NACK DELAYs were its retries: the middleware counts on
            _set_label(message, "_retries", int(message.labels.get("_retries") or 0) + job.nacks)
        beat = asyncio.create_task(self._heartbeat(job.id))
        self._held[job.id] = _Held(job.id, beat)
        self._job_of_task[message.task_id] = job.id
        data = self.formatter.dumps(message).message
        return AckableMessage(data=data, ack=lambda: self._ack(message.task_id, job.id))

    async def _ack(self, task_id: str, job_id: str) -> None:
        if self._job_of_task.get(task_id) == job_id:
            del self._job_of_task[task_id]
        held = self._held.pop(job_id, None)
        if held is not None:
            held.beat.cancel()
            if held.requeued:  # its retry requeued the job in place
                return
        await self._ack_job(job_id)

    async def _ack_job(self, job_id: str) -> None:
        await self.client.ack(job_id)

    async def _heartbeat(self, job_id: str) -> None:
        """WORKING soon after delivery (``heartbeat_first_s``), then every half of the
        retry time WORKING answers, as the client's own consumer does."""
        pause_s = heartbeat_first_s
        while True:
            await asyncio.sleep(pause_s)
            try:
                retry_s = await self.client.working(job_id)
            except DisqueError as exc:
                log.warning("WORKING %s: %s", job_id, exc)
                return
            if retry_s <= 0:
                return
            pause_s = retry_s * heartbeat_retry_fraction
