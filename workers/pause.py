"""PAUSE (spec "Pausing queues"): a queue paused in input takes no new jobs, one
paused in output serves none; ``bcast`` sends the resulting state to every
reachable node, which sets it on its own copy of the queue (a PAUSE message:
meta ``{"f": pause flags}``, bodies ``[queue name]``).

``Pause`` is an object the shard owns (``Shard.pause``); it changes queues
through the shard's ``Core`` (workers/core.py).

A paused queue costs memory like any other: past maxmemory a PAUSE that would
create a queue answers the OOM error (pausing or resuming an existing queue is
always allowed), and under memory pressure an empty paused queue nobody waits on
is evicted like an unpaused one (workers/evict.py) although the spec keeps paused
queues: otherwise PAUSEs of new names alone fill the budget for good, and every
ADDJOB answers OOM.
"""

from __future__ import annotations

from typing import Any, Final

from workers import messages as msg
from workers.core import Core
from workers.ids import slot_of
from workers.queue import LIMITED, PAUSE_MASK, PAUSE_NAMES, PAUSED_IN, PAUSED_OUT, Queue
from workers.replies import ERR_OOM, Error, Status

# disque_mp/node/memory.py's level 3 (past maxmemory), as Shard.set_memory_level gives it.
_LEVEL_OOM: Final = 3
_OPTION_FLAGS = {"none": 0, "in": PAUSED_IN, "out": PAUSED_OUT, "all": PAUSED_IN | PAUSED_OUT}


class Pause:
    """PAUSE and its broadcast on one shard."""

    def __init__(self, core: Core) -> None:
        self.core = core

    def op_pause(self, queue: bytes, opts: list[str], now_ms: int) -> Status | Error:
        """PAUSE with validated lowercase options; replies the resulting state.

        As in Disque the new state is built from the options alone (``in`` then
        ``out`` in two commands leaves ``out``); ``bcast`` sends the resulting state
        to every reachable node.
        """
        flags = 0
        update = False
        for opt in opts:
            bits = _OPTION_FLAGS.get(opt)
            if bits is not None:
                flags = 0 if opt == "none" else flags | bits
                update = True
        if update and flags and self.core.view().memory_level >= _LEVEL_OOM \
                and self.core.find_queue(queue) is None:
            return ERR_OOM  # a paused queue is memory too: none is created past maxmemory
        q = self.set_pause(queue, flags, now_ms) if update else self.core.find_queue(queue)
        state = q.paused & PAUSE_MASK if q is not None else 0
        if "bcast" in opts:
            # Every reachable node gets the resulting state (spec: PAUSE ... bcast).
            self.core.send("*", msg.PAUSE, slot_of(queue), msg.pause_meta(state), [bytes(queue)])
        return Status(PAUSE_NAMES[state])

    def set_pause(self, queue: bytes, flags: int, now_ms: int) -> Queue | None:
        s = self.core
        q = s.find_queue(queue)
        if q is None and not flags:
            return None
        q = s.queue(queue, now_ms)
        was_out = q.paused & PAUSED_OUT
        q.paused = flags | (q.paused & LIMITED)  # QLIMIT's bit is not PAUSE's
        if flags and not q.paused & LIMITED:  # a limited queue's timer may be RATE's
            s.unschedule(q)  # paused queues are never evicted
        elif not q.live:
            s.maybe_idle(q, now_ms)
        if was_out and not flags & PAUSED_OUT and q.waiters is not None:
            s.serve_waiters(q, now_ms)
        return q

    def on_pause(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                 now_ms: int) -> None:
        flags = int(meta["f"]) & (PAUSED_IN | PAUSED_OUT)
        queue = bytes(bodies[0])
        if flags and self.core.view().memory_level >= _LEVEL_OOM and self.core.find_queue(queue) is None:
            return  # past maxmemory a peer's PAUSE creates no queue either
        self.set_pause(queue, flags, now_ms)
