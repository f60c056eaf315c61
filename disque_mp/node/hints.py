"""Empty-queue hints: a GETJOB skips the owners whose queues it knows are empty.

Celery-, kombu- and Dramatiq-shaped consumers poll mostly empty queues with
``GETJOB NOHANG``; a poll naming another worker's queue crosses the mesh to take
nothing. So each worker publishes, per slot, in memory every worker of the host
maps (``Cells`` in workers/queue.py, over the mapping ``create`` makes in the
supervisor before it forks the workers, so a restarted worker maps the same
memory): ``nonempty[slot]``, how many of the slot's queues hold a queued job, and
``gen[slot]``, bumped when a queue of the slot vanishes (idle eviction, memory
pressure, DEBUG FLUSHALL, CLUSTER RESET) and for all its slots when the owner
(re)starts (before it loads its AOF).

A coordinator remembers, per queue of another worker it sent a take for, the
slot's generation it read before sending (``Hints.saw``; from the second take on,
and only for a client with no reply outstanding, the one that could skip): once
that take has run, the queue exists at that generation. The queue is **known empty** when its slot
has no queue with jobs and its generation has not moved (``Hints.known_empty``):
a take there would take nothing and create nothing (the queue exists, and an
empty take on an existing queue arms nothing: ``Core.maybe_idle``; a non-blocking
take sends no NEEDJOBS), so the owner can be skipped (the router's
single-owner NOHANG GETJOB, ``GetJob._step``) and the reply is the one the owner
would give. A cell that says "non-empty" wrongly only costs the crossing paid
without hints; "empty" must never be wrong:

- Memory order. An owner changes a cell (plain aligned 4-byte stores: one writer
  per slot) while it runs the command that queued or took the job, before it
  writes the reply that tells any client about it (a socket write: a system
  call). A client that got that reply and then sends the GETJOB to another worker
  makes that worker read the socket (a system call) before it reads the cell. On
  x86 (stores seen in program order by every core) with system calls between,
  the coordinator sees the cell as of the reply or later. A job nobody was told
  of yet (a retry timer, a peer node's QUEUED) may be seen a poll late, as a
  crossing racing it could also miss it.
- One connection's order. A client's pipelined ADDJOB then GETJOB run in that
  order at the owner even before the first's reply: the skip applies only to a
  connection with no reply outstanding (``ClientConn.unfilled == 0``), so every
  earlier command of it has run where it went.
- A queue the coordinator recorded but whose take has not run yet (in flight) is
  created by that take; one whose owner died meanwhile is gone with a restart's
  generation.
"""

from __future__ import annotations

import mmap
from typing import Final

from workers.ids import SLOTS, slot_of
from workers.queue import Cells, cells_bytes

# Queues of other workers a coordinator remembers as existing (name -> generation and
# slot); cleared when full: queue names are unbounded, a forgotten one costs one take.
known_queues_max: Final = 65536
_SLOT_BITS: Final = 14
_SLOT_MASK: Final = SLOTS - 1
_SEEN_ONCE: Final = -1  # ``known``: one take sent, its slot not computed yet

# The host's mapping, made by the supervisor before it forks (``create``); a worker
# started without one (tests) publishes to private cells.
_shared: mmap.mmap | None = None


def create() -> None:
    """The supervisor, before it forks the workers: the anonymous shared mapping
    (MAP_SHARED) every worker inherits, restarted ones too."""
    global _shared
    if _shared is None:
        _shared = mmap.mmap(-1, cells_bytes)


def cells() -> Cells:
    """This process's view of the host's cells (private ones without a supervisor)."""
    return Cells.private() if _shared is None else Cells(_shared)


class Hints:
    """One worker's reading side: the cells, the queues of other workers it saw
    exist, and how many owners its GETJOBs skipped (INFO workers)."""

    __slots__ = ("cells", "gen", "known", "skipped")

    def __init__(self, shared: Cells) -> None:
        self.cells = shared
        self.gen = shared.gen
        self.known: dict[bytes, int] = {}  # queue -> generation << _SLOT_BITS | slot
        self.skipped = 0  # owners not asked: their queues were known empty

    def saw(self, queues: list[bytes]) -> None:
        """A take for ``queues`` leaves for their owner: once it has run they exist at
        the generation read now (one that moves meanwhile only makes them unknown);
        recorded from the second take on (``_SEEN_ONCE``)."""
        known = self.known
        gen = self.gen
        for q in queues:
            v = known.get(q)
            if v is None:  # a first take: its slot (a hash, ~5k instructions) waits for
                if len(known) >= known_queues_max:  # a second, as one-off names never
                    known.clear()  # come back (random queues), polled ones always do
                known[q] = _SEEN_ONCE
            elif v == _SEEN_ONCE:
                slot = slot_of(q)
                known[q] = gen[slot] << _SLOT_BITS | slot
            else:  # the poll of a queue we know: a store only when its generation moved
                slot = v & _SLOT_MASK
                g = gen[slot]
                if g != v >> _SLOT_BITS:
                    known[q] = g << _SLOT_BITS | slot

    def known_empty(self, queues: list[bytes]) -> bool:
        """Every queue exists at its owner and holds no job (module docstring)."""
        known = self.known
        for q in queues:
            v = known.get(q)
            if v is None or v == _SEEN_ONCE:
                return False
            if not self.cells.known_empty(v & _SLOT_MASK, v >> _SLOT_BITS):
                return False
        return True
