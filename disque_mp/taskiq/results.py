"""Taskiq's result backend on disque-mp (``taskiq.AsyncResultBackend``):

    from disque_mp.taskiq import DisqueBroker, DisqueResultBackend
    broker = DisqueBroker("disque://127.0.0.1:7711", queue="tasks").with_result_backend(
        DisqueResultBackend("disque://127.0.0.1:7711"))

A task's result is the result of a *result slot* job keyed by its task ID
(``disque_mp.client.results``: DEDUP with DEDUP-KEEP finds the slot, ACKJOB ...
RESULT stores it, RESULT reads it); ``ProgressTracker.set_progress`` is WORKING ...
PROGRESS on the slot (at most the node's ``progress-bytes-max``), read back by
``get_progress`` while the task runs. Results and progress are JSON (pydantic's
``TaskiqResult`` / ``TaskProgress`` forms); the node keeps a result ``result-ttl``
seconds (its config, default an hour).
"""

from __future__ import annotations

from typing import Any, TypeVar

from taskiq import AsyncResultBackend, TaskiqResult
from taskiq.depends.progress_tracker import TaskProgress
from taskiq.exceptions import ResultGetError

from disque_mp.aclient import AsyncDisque
from disque_mp.client import Progress
from disque_mp.client.results import AsyncKeyedResults, results_queue_default, slot_ttl_default_s

_ReturnType = TypeVar("_ReturnType")


class DisqueResultBackend(AsyncResultBackend[_ReturnType]):
    """Results over the node's RESULT extensions (``url``: ``disque://host:port``,
    several ``;``- or ``,``-separated; or a ready ``client``)."""

    def __init__(self, url: str = "disque://127.0.0.1:7711", *, client: AsyncDisque | None = None,
                 queue: str = results_queue_default, ttl_s: int = slot_ttl_default_s) -> None:
        self.url = url
        self.client = client
        self.own_client = client is None
        self.queue = queue
        self.ttl_s = ttl_s
        self._results: AsyncKeyedResults | None = None

    def _keyed(self) -> AsyncKeyedResults:
        if self._results is None:
            if self.client is None:
                seeds = [p.split("://", 1)[-1] for p in self.url.replace(";", ",").split(",")
                         if p.strip()]
                self.client = AsyncDisque(seeds, socket_timeout=60)
            self._results = AsyncKeyedResults(self.client, self.queue, self.ttl_s)
        return self._results

    async def startup(self) -> None:
        self._keyed()

    async def shutdown(self) -> None:
        if self.own_client and self.client is not None:
            await self.client.aclose()
            self.client = None
            self._results = None

    async def set_result(self, task_id: str, result: TaskiqResult[_ReturnType]) -> None:
        await self._keyed().set(task_id, result.model_dump_json().encode())

    async def is_result_ready(self, task_id: str) -> bool:
        got = await self._keyed().get(task_id)
        return got is not None and not isinstance(got, Progress)

    async def get_result(self, task_id: str,
                         with_logs: bool = False) -> TaskiqResult[_ReturnType]:
        got = await self._keyed().get(task_id)
        if got is None or isinstance(got, Progress):
            raise ResultGetError  # none yet (or no longer)
        result: TaskiqResult[Any] = TaskiqResult.model_validate_json(got)
        if not with_logs:
            result.log = None
        return result

    async def set_progress(self, task_id: str, progress: TaskProgress[Any]) -> None:
        await self._keyed().progress(task_id, progress.model_dump_json().encode())

    async def get_progress(self, task_id: str) -> TaskProgress[Any] | None:
        got = await self._keyed().get(task_id)
        if isinstance(got, Progress):
            return TaskProgress.model_validate_json(got.value)
        return None
