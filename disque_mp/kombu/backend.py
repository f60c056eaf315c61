"""Celery result backend on disque-mp (``result_backend = "disque://host:port"``):
importing ``disque_mp.kombu`` registers the scheme.

    import disque_mp.kombu
    app = Celery("tasks", broker="disque://127.0.0.1:7711",
                 backend="disque://127.0.0.1:7711")

Several nodes: ``disque://h1:7711;disque://h2:7711`` (or ``,``-separated
``host:port`` after the first). A task's state lives on the node as the result of a
*result slot* job keyed by the task ID (``disque_mp.client.results``: DEDUP with
DEDUP-KEEP finds the slot, ACKJOB ... RESULT stores the final state, RESULT reads
it): SUCCESS, FAILURE and REVOKED are the slot's result, kept ``result-ttl`` on the
nodes (config, default an hour; the slot itself lives ``result_expires``, default a
day); STARTED, RETRY and a custom state such as ``update_state(state="PROGRESS",
meta=...)`` are the slot's progress (WORKING ... PROGRESS, at most
``progress-bytes-max``). ``AsyncResult.get()`` blocks on the node (RESULT ...
TIMEOUT) instead of polling, and chords work through Celery's ``chord_unlock``
(the backend has no native join). ``forget()`` is not supported (a result goes at
its TTL). Options (``result_backend_transport_options``): ``queue`` (the slots'
queue, default ``disque-mp.results``), ``socket_timeout``, ``password``.
"""

from __future__ import annotations

import time
from typing import Any

from celery import states
from celery.backends.base import BaseBackend
from celery.exceptions import TimeoutError as CeleryTimeoutError

from disque_mp.client import Disque, Progress
from disque_mp.client.results import KeyedResults, results_queue_default

# RESULT ... TIMEOUT per round trip while get() waits: short enough that a revoked
# or forgotten wait ends soon, long enough to cost one request per second at most.
wait_round_ms = 1000
DEFAULT_PORT = 7711


def backend_seeds(url: str | None) -> list[str]:
    """``disque://h1:p1;disque://h2:p2`` or ``disque://h1:p1,h2:p2`` -> host:port list."""
    out: list[str] = []
    for part in (url or "").replace(";", ",").split(","):
        part = part.strip()
        if "://" in part:
            part = part.split("://", 1)[1]
        part = part.split("/", 1)[0].rsplit("@", 1)[-1]
        if part:
            out.append(part if ":" in part else f"{part}:{DEFAULT_PORT}")
    return out or [f"127.0.0.1:{DEFAULT_PORT}"]


class DisqueBackend(BaseBackend):
    """A Celery result backend over the node's RESULT extensions."""

    supports_native_join = False  # chords: celery.chord_unlock polls the header's results
    supports_autoexpire = True  # slots and results expire on the node

    def __init__(self, app: Any, url: str | None = None, **kwargs: Any) -> None:
        super().__init__(app, url=url, **kwargs)
        opts = dict(app.conf.get("result_backend_transport_options") or {})
        self.url = url
        expires = self.prepare_expires(kwargs.get("expires"), type=int) or 24 * 3600
        self.client = Disque(backend_seeds(url), socket_timeout=opts.get("socket_timeout", 30),
                             password=opts.get("password"))
        self.results = KeyedResults(self.client, opts.get("queue", results_queue_default),
                                    int(expires))

    def _store_result(self, task_id: str, result: Any, state: str, traceback: Any = None,
                      request: Any = None, **kwargs: Any) -> Any:
        meta = self._get_result_meta(result=result, state=state, traceback=traceback,
                                     request=request)
        meta["task_id"] = task_id
        payload = self.encode(meta)
        raw = payload if isinstance(payload, bytes) else str(payload).encode()
        if state in states.READY_STATES:
            self.results.set(task_id, raw)
        else:
            self.results.progress(task_id, raw)
        return result

    def _decode(self, task_id: str, got: bytes | Progress | None) -> dict[str, Any]:
        if got is None:
            return {"status": states.PENDING, "result": None, "task_id": task_id}
        raw = got.value if isinstance(got, Progress) else got
        return dict(self.decode_result(raw))

    def _get_task_meta_for(self, task_id: str) -> dict[str, Any]:
        return self._decode(task_id, self.results.get(task_id))

    def wait_for(self, task_id: str, timeout: float | None = None, interval: float = 0.5,
                 no_ack: bool = True, on_interval: Any = None) -> dict[str, Any]:
        """Block on the node (RESULT ... TIMEOUT) until the task is ready."""
        self._ensure_not_eager()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left_ms = wait_round_ms if deadline is None else int(
                max(0.0, min(wait_round_ms / 1000, deadline - time.monotonic())) * 1000)
            meta = self._decode(task_id, self.results.get(task_id, timeout_ms=max(1, left_ms)))
            if meta["status"] in states.READY_STATES:
                return meta
            if on_interval:
                on_interval()
            if deadline is not None and time.monotonic() >= deadline:
                raise CeleryTimeoutError("The operation timed out.")

    def _forget(self, task_id: str) -> None:
        raise NotImplementedError("disque:// keeps a result until its TTL (no forget)")

    def __reduce__(self, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        return super().__reduce__(args, dict(kwargs or {}, url=self.url))
