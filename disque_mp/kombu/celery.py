"""Celery retries on the job itself: ``NACK <id> DELAY <s>`` instead of a new message.

    from disque_mp.kombu.celery import DisqueTask
    app = Celery("tasks", broker="disque://127.0.0.1:7711", task_cls=DisqueTask)

With ``acks_late`` (the job still exists while the task runs), ``self.retry(countdown=...)``
and ``autoretry_for``/``retry_backoff`` queue the same job again after the countdown:
the job ID stays, the node holds it until it is due (``DELAY``), its ``nacks`` counter
counts the retries, and ``max_deliveries`` (MAXDELIVER) sees every attempt. When a
job is delivered again, the transport adds its ``nacks`` to the message's
``retries`` header, so ``self.request.retries`` and ``max_retries`` work as usual.

When the job cannot be requeued in place (a retry with other arguments, a task
without ``acks_late``, another transport, a NACK refused by the node), the retry
is published as Celery does everywhere (a new message); the original job is then
acknowledged by the pool process that published the retry. Either way the
worker's main process only forgets the message (``DisqueRequest.on_retry``): the
job was requeued or acknowledged already.

A task that fails for good (out of retries, any exception, with
``task_acks_on_failure_or_timeout`` off) or raises ``Reject(requeue=False)`` is
rejected without requeue: ``DisqueRequest.on_failure`` hands the exception's text
to the transport first, which the job keeps as its dead-letter reason (``DEADLETTER
<id> REASON <text>``: SHOW's ``dead-reason``).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from celery import Task
from celery.exceptions import Reject
from celery.worker.request import Request

from disque_mp.client import DisqueError
from disque_mp.client.limits import dead_reason
from disque_mp.kombu.transport import Channel, Transport

log = logging.getLogger("disque_mp.kombu")

# Disque job IDs: D-<8 hex>-<24 base64>-<4 hex>
job_id_len = 40


def is_job_id(tag: Any) -> bool:
    """A delivery tag that is a Disque job ID (the disque:// transport's tags)."""
    return isinstance(tag, str) and len(tag) == job_id_len and tag.startswith("D-")


def held_job_id(request: Any) -> str | None:
    """The Disque job ID a running task was delivered in (its delivery tag), or None."""
    properties = getattr(request, "properties", None) or {}
    tag = properties.get("delivery_tag") if isinstance(properties, dict) else None
    return tag if is_job_id(tag) else None


def retry_delay_s(options: dict[str, Any], now_s: float) -> int:
    """A retry's countdown/eta in whole seconds, rounded up (never early)."""
    countdown = options.get("countdown")
    eta = options.get("eta")
    if countdown is not None:
        return max(0, math.ceil(float(countdown)))
    if eta is not None:
        when = eta.timestamp() if hasattr(eta, "timestamp") else float(eta)
        return max(0, math.ceil(when - now_s))
    return 0


class DisqueTask(Task):
    """A Celery task whose retries requeue its Disque job (NACK DELAY)."""

    Request = "disque_mp.kombu.celery:DisqueRequest"

    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: Any = None,
                    producer: Any = None, link: Any = None, link_error: Any = None,
                    shadow: Any = None, **options: Any) -> Any:
        job_id = self._own_retry(args, kwargs, task_id, options)
        if job_id is None:
            return super().apply_async(args, kwargs, task_id, producer, link, link_error,
                                       shadow, **options)
        with self.app.pool.acquire(block=True) as conn:
            if not isinstance(conn.transport, Transport):
                return super().apply_async(args, kwargs, task_id, producer, link,
                                           link_error, shadow, **options)
            client = conn.transport.disque
            if self._same_call(args, kwargs):
                try:
                    delay_s = retry_delay_s(options, time.time())
                    client.nack(job_id, delay=delay_s or None)
                    return self.AsyncResult(task_id)
                except DisqueError as exc:
                    log.warning("NACK DELAY of %s refused (%s): the retry is published "
                                "as a new message", job_id, exc)
        result = super().apply_async(args, kwargs, task_id, producer, link, link_error,
                                     shadow, **options)
        with self.app.pool.acquire(block=True) as conn:
            if isinstance(conn.transport, Transport):
                conn.transport.confirm_published()  # the new message first, then the ack
            conn.transport.disque.ack(job_id)  # the main process forgets it without acking
        return result

    def _own_retry(self, args: Any, kwargs: Any, task_id: Any,
                   options: dict[str, Any]) -> str | None:
        """The job ID when this call is ``self.retry`` of the running task (acks_late)."""
        request = self.request
        if request.called_directly or request.is_eager or not self.acks_late:
            return None
        if task_id is None or task_id != request.id:
            return None
        if options.get("retries") != (request.retries or 0) + 1:
            return None
        return held_job_id(request)

    def _same_call(self, args: Any, kwargs: Any) -> bool:
        request = self.request
        return (list(args or ()) == list(request.args or ())
                and dict(kwargs or {}) == dict(request.kwargs or {}))


class DisqueRequest(Request):
    """The worker's side of DisqueTask: a retried message is forgotten, not acked;
    a failed one carries its exception's text to a reject without requeue."""

    def on_failure(self, exc_info: Any, send_failed_event: bool = True,
                   return_ok: bool = False) -> None:
        channel = getattr(self.message, "channel", None)
        if isinstance(channel, Channel) and is_job_id(self.message.delivery_tag):
            exc = getattr(exc_info.exception, "exc", exc_info.exception)  # ExceptionWithTraceback
            if isinstance(exc, Reject) and exc.reason is not None:
                exc = exc.reason  # Reject(reason, requeue=False): the reason given
            text = exc if isinstance(exc, BaseException) else str(exc)
            channel.qos.reject_reason(self.message.delivery_tag, dead_reason(text))
        super().on_failure(exc_info, send_failed_event, return_ok)

    def on_retry(self, exc_info: Any) -> None:
        channel = getattr(self.message, "channel", None)
        if not (self.task.acks_late and isinstance(channel, Channel)
                and is_job_id(self.message.delivery_tag)):
            super().on_retry(exc_info)
            return
        if not self.acknowledged:
            channel.qos.forget(self.message.delivery_tag)
            self.acknowledged: bool = True
        self.send_event("task-retried", exception=repr(exc_info.exception.exc),
                        traceback=str(exc_info.traceback))
