"""QLIMIT: how many and how fast one node delivers a queue's jobs.

``QLIMIT queue [ACTIVE n] [RATE n] [GROUP-ACTIVE n] [BCAST]``, ``QLIMIT queue``
(shows them), ``QLIMIT queue RESET``. Every limit is per node, as the counters it
reads are (an AP queue has no global counter to ask): ACTIVE n, at most n jobs of
the queue delivered by this node and not yet done (ACKed, NACKed, queued again by
ENQUEUE or by their RETRY elapsing, gone); RATE n, at most n deliveries a second
(a token bucket of n tokens, full when set, refilled at n a second); GROUP-ACTIVE
n, at most n such jobs per GROUP (the jobs without one are a group too). 0 takes
a limit away; the options not given keep their value.

What this file owns:

- ``Limit``: one queue's limits and what they count (the tokens, the jobs it
  counted per group). ACTIVE reads the core's own count of the queue's delivered
  and not yet done jobs (``Tally.active``), so it counts every delivery, also the
  ones before the limit was set; GROUP-ACTIVE counts the deliveries made while the
  queue has limits (``counted``).
- ``Limits`` (``Shard.limits``): the command, its broadcast (a QLIMIT message:
  every reachable node sets the same limits, as PAUSE ... BCAST does), the AOF
  record (``limit_record``, written by the core's ``log_limit``; loaded by
  workers/persistence.py; written again by every rewrite) and the view.

Where the limits act is the core (workers/core.py): a queue with limits carries
``LIMITED`` in its ``paused`` bits, so a plain queue's take tests one field as
before; a limited one takes through ``Core.take_limited`` (what the limits allow
now, groups at their limit passed over), GETJOB's waiters on it are served within
them, and are served again when a delivery ends (the tally tells the core:
``Tally.ended``, served once the command is done, ``Core.take_effects``) or, for
RATE, when the next token is due (the queue's timer: ``Core.fire_queue``).
The limits belong to the queue's name, not to its ``Queue``: a queue evicted
(idle, memory pressure) and made again has them still, until RESET. The record
format and ``Limit`` itself are workers/limit.py's.
"""

from __future__ import annotations

from typing import Any

from workers import messages as msg
from workers.core import Core
from workers.ids import slot_of
from workers.limit import limit_record
from workers.replies import Error
from workers.views import limit_view


class Limits:
    """QLIMIT on one shard: the command, the broadcast, the records, the view."""

    def __init__(self, core: Core) -> None:
        self.core = core

    def op_qlimit(self, queue: bytes, values: tuple[int | None, int | None, int | None] | None,
                  bcast: bool, queues_max: int, now_ms: int) -> list[Any] | Error:
        """Set (``values``: ACTIVE, RATE, GROUP-ACTIVE, None keeps one; all 0 resets)
        or show (``values`` None) a queue's limits; the reply is what holds after it.
        ``queues_max``: the queues with limits one shard holds (qlimit-queues-max)."""
        c = self.core
        lim = c.limit_of(queue)
        if values is not None:
            old = (0, 0, 0) if lim is None else (lim.active, lim.rate, lim.group_active)
            new = tuple(o if v is None else v for v, o in zip(values, old, strict=True))
            if lim is None and any(new) and c.limit_count() >= queues_max:
                return Error(f"ERR too many queues with limits (at most {queues_max}, "
                             "qlimit-queues-max)")
            c.set_limit(queue, new[0], new[1], new[2], now_ms)
            if bcast:
                c.send("*", msg.QLIMIT, slot_of(queue), msg.qlimit_meta(*new), [bytes(queue)])
        return limit_view(c, queue, now_ms)

    def on_qlimit(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                  now_ms: int) -> None:
        """A peer's QLIMIT ... BCAST: the same limits here (checked at the edge)."""
        self.core.set_limit(bytes(bodies[0]), int(meta["a"]), int(meta["r"]), int(meta["g"]),
                            now_ms)

    def records(self) -> list[bytes]:
        """Every limit as an AOF record (a rewrite writes them first)."""
        return [limit_record(name, lim.active, lim.rate, lim.group_active)
                for name, lim in self.core.limit_table().items()]
