"""Dramatiq's Results middleware on disque-mp (``dramatiq.results.ResultBackend``):

    from dramatiq.results import Results
    from disque_mp.dramatiq import DisqueBroker, DisqueResultBackend
    broker = DisqueBroker(nodes=["127.0.0.1:7711"])
    broker.add_middleware(Results(backend=DisqueResultBackend(nodes=["127.0.0.1:7711"])))

    @dramatiq.actor(store_results=True)
    def add(x, y): return x + y
    add.send(1, 2).get_result(block=True, timeout=10_000)

A message's result is the result of a *result slot* job keyed by the message's
result key (``disque_mp.client.results``: DEDUP with DEDUP-KEEP finds the slot,
ACKJOB ... RESULT stores the value, RESULT reads it); ``get_result(block=True)``
blocks on the node (RESULT ... TIMEOUT) instead of polling. The node keeps a value
``result-ttl`` seconds (its config, default an hour; Dramatiq's ``result_ttl``
bounds the slot, at least a minute). A value past ``result-bytes-max`` is refused
by the node (the worker logs the error; the message stays acknowledged).
"""

from __future__ import annotations

import time
from typing import Any

from dramatiq.results import ResultMissing, ResultTimeout
from dramatiq.results.backend import DEFAULT_TIMEOUT, Missing, ResultBackend

from disque_mp.client import Disque, Progress
from disque_mp.client.results import KeyedResults, results_queue_default, slot_ttl_default_s

slot_ttl_min_s = 60


class DisqueResultBackend(ResultBackend):
    """Results over the node's RESULT extensions; ``client`` or ``nodes`` / ``url``."""

    def __init__(self, *, client: Disque | None = None, nodes: Any = None, url: str | None = None,
                 queue: str = results_queue_default, ttl_s: int = slot_ttl_default_s,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if client is None:
            seeds = nodes if nodes is not None else (url or "127.0.0.1:7711").replace(
                "disque://", "")
            client = Disque(seeds, socket_timeout=60)
        self.client = client
        self.results = KeyedResults(client, queue, ttl_s)

    def _store(self, message_key: str, result: Any, ttl: int) -> None:
        self.results.ttl_s = max(slot_ttl_min_s, self.results.ttl_s, int(ttl) // 1000)
        self.results.set(message_key, self.encoder.encode(result))

    def _get(self, message_key: str) -> Any:
        got = self.results.get(message_key)
        if got is None or isinstance(got, Progress):
            return Missing
        return self.encoder.decode(got)

    def get_result(self, message: Any, *, block: bool = False,
                   timeout: int | None = None) -> Any:
        """As Dramatiq's, waiting on the node (RESULT ... TIMEOUT) when ``block``."""
        if not block:
            return super().get_result(message, block=False)
        timeout_ms = DEFAULT_TIMEOUT if timeout is None else int(timeout)
        key = self.build_message_key(message)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                raise ResultTimeout(message)
            got = self.results.get(key, timeout_ms=left_ms)
            if got is not None and not isinstance(got, Progress):
                return self.unwrap_result(self.encoder.decode(got))


__all__ = ["DisqueResultBackend", "ResultMissing", "ResultTimeout"]
