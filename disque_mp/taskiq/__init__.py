"""A Taskiq broker on Disque (asyncio, through ``disque_mp.aclient.AsyncDisque``).

    from disque_mp.taskiq import DisqueBroker
    broker = DisqueBroker("disque://127.0.0.1:7711", queue="tasks")
"""

from __future__ import annotations

from disque_mp.taskiq.broker import DisqueBroker, UnsupportedLabelError

__all__ = ["DisqueBroker", "UnsupportedLabelError"]
