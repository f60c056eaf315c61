"""A Taskiq broker on Disque (asyncio, through ``disque_mp.aclient.AsyncDisque``).

    from disque_mp.taskiq import DisqueBroker
    broker = DisqueBroker("disque://127.0.0.1:7711", queue="tasks")

Results: ``disque_mp.taskiq.results.DisqueResultBackend`` (``with_result_backend``).
"""

from __future__ import annotations

from disque_mp.taskiq.broker import DisqueBroker, UnsupportedLabelError
from disque_mp.taskiq.results import DisqueResultBackend

__all__ = ["DisqueBroker", "DisqueResultBackend", "UnsupportedLabelError"]
