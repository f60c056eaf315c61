"""Dramatiq broker on Disque.

    import dramatiq
    from disque_mp.dramatiq import DisqueBroker
    dramatiq.set_broker(DisqueBroker(nodes=["127.0.0.1:7711", "127.0.0.1:7712"]))

See ``disque_mp.dramatiq.broker`` for the mapping onto Disque commands, and
``disque_mp.dramatiq.results`` for the Results middleware's backend.
"""

from __future__ import annotations

from disque_mp.dramatiq.broker import DisqueBroker, DisqueConsumer, DisqueMessage
from disque_mp.dramatiq.results import DisqueResultBackend

__all__ = ["DisqueBroker", "DisqueConsumer", "DisqueMessage", "DisqueResultBackend"]
