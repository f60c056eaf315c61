"""What every part of a worker shares: the bottom of the worker's modules.

``WorkerCore`` is the native base class of ``worker.Worker``. It holds the state
the per-command parts (``connection.py``, ``getjob.py``, ``handoff.py``,
``router.py``, ``forward.py``, ``peers.py``, ``owner.py``) read and write: the config, where
the worker sits, the loop turn's clock (``now_ms``), the shard and its effects,
the mesh, the handlers waiting for a shard ``Wake`` (``tokens``) and the timer
tick. The parts are typed against this class (or ``connection.ClientHost``,
which adds the client connections), never against ``Worker``: they sit below the
worker, and a call on a native class stays a native call once compiled (a
``Protocol``-typed one would be a generic Python call). It imports nothing of
the worker's other modules.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from bus.clock import wall_ms
from bus.mesh import Mesh
from disque_mp.node.config import Config
from disque_mp.node.slowlog import SlowLog
from workers.effects import AofAppend, Send, Wake
from workers.shard import Shard

if TYPE_CHECKING:  # made by the worker only where configured (appendonly, cluster)
    from bus.agent import ClusterAgent
    from disque_mp.node.aof import AofManager

log = logging.getLogger("disque_mp.node.worker")

NO_TICK_MS: Final = 1 << 60  # a tick time that never comes (ms; a short int once compiled)


class WorkerCore:
    """The state and calls the parts of one worker share (``Worker`` extends it)."""

    shard: Shard  # made in ``Worker.main``, once the loop runs
    mesh: Mesh  # the other workers of the host
    loop: asyncio.AbstractEventLoop

    def __init__(self, cfg: Config, index: int, node_id: str) -> None:
        self.cfg = cfg
        self.index = index
        self.workers = cfg.workers
        self.node_id = node_id
        self.now_ms = wall_ms()
        self.tokens: dict[int, Callable[[Any], None]] = {}  # shard token -> Wake handler
        self.next_token = 0
        self.aof: AofManager | None = None  # the AOF manager (aof.py), or None
        self.agent: ClusterAgent | None = None  # the cluster agent (bus/agent.py), or None
        self.oom = False  # past maxmemory: denyoom commands answer ERR_OOM (memory.py)
        self.stopping = False
        self.send_hook: Callable[[Send], None] = self._drop_send
        self.slowlog = SlowLog(index, self.workers)
        self.slowlog.configure(cfg.slowlog_log_slower_than, cfg.slowlog_max_len)
        self.tick_handle: asyncio.TimerHandle | None = None
        self.tick_at = NO_TICK_MS  # when the planned tick fires (NO_TICK_MS: none planned)
        self.ticks = 0  # ticks run, and when the last one did (wall ms): how often it wakes
        self.last_tick_ms = 0
        # when the worker's periodic work (``on_tick``) is next due; NO_TICK_MS while
        # it has none (idle): a tick pulled earlier for a timer comes back to it
        self.period_at = NO_TICK_MS

    def log(self, text: str) -> None:
        log.warning("%s", text)

    def leaving(self) -> bool:
        """CLUSTER LEAVING yes on this node (the membership view says so)."""
        return self.agent is not None and bool(self.agent.view.get("leaving"))

    # ------------------------------------------------------------------ batches and effects

    def begin_batch(self) -> None:
        """A client's read of commands starts: the clock of this loop turn."""
        self.now_ms = wall_ms()

    def end_batch(self) -> None:
        """After the commands of a read: effects, then the AOF before the replies
        (``drain_effects`` has the tick follow the shard's timers)."""
        self.drain_effects()
        self.aof_before_replies()

    def aof_before_replies(self) -> None:
        """This batch's AOF records go to the kernel before its replies leave. Without
        an open AOF file (appendonly no) nothing is called: one attribute read instead
        of an interpreted call per batch (aof.py is not compiled)."""
        aof = self.aof
        if aof is not None and aof.writer is not None:
            aof.write_before_replies()

    def new_token(self) -> int:
        """A token for a shard call whose reply may come later (``Wake``)."""
        self.next_token += 1
        return self.next_token

    def drain_effects(self) -> None:
        """Carry out the shard's effects, then have the tick follow its timers: any
        shard call that drains may have added or removed one (``reschedule_tick``)."""
        self._drain()
        self.reschedule_tick()

    def carry_out_effects(self) -> None:
        """The shard's effects now, the tick left to the caller's ``drain_effects`` (a
        mesh read runs it once at its end): a waiter served by one frame must wake
        before a later frame of the same read (its UNBLOCK) drops its handler."""
        self._drain()

    def _drain(self) -> None:
        effects = self.shard.take_effects()
        while effects:
            for eff in effects:
                if type(eff) is Wake:
                    handler = self.tokens.get(eff.token)  # get and del: native calls, where
                    if handler is not None:  # pop with a default is a method call
                        del self.tokens[eff.token]
                        handler(eff.reply)
                    else:
                        self._orphaned(eff.reply)
                elif type(eff) is Send:
                    self.send_hook(eff)
                elif type(eff) is AofAppend:
                    if self.aof is not None:
                        self.aof.append_effect(eff.record)  # committed once per loop turn
            effects = self.shard.take_effects()  # handlers may have called the shard

    def _orphaned(self, reply: Any) -> None:
        """A waiter's answer came after whoever waited stopped waiting: jobs it took
        (a GETJOB's entries) go back to their queues uncounted, as a GETJOB's surplus
        does, instead of waiting ACTIVE for their RETRY."""
        if type(reply) is not list or not reply:
            return
        ids = [e[1] for e in reply if type(e) is list and len(e) >= 3 and type(e[1]) is str]
        if ids:
            log.debug("%d job(s) taken for a GETJOB that no longer waits: given back", len(ids))
            self.shard.op_return(ids, self.now_ms)

    def _drop_send(self, eff: Send) -> None:
        pass  # no cluster bus in this build: single node

    # ------------------------------------------------------------------ the timer tick

    def tick(self) -> None:
        """The shard's due timers and, when due, the worker's periodic work; then the
        next tick: at the shard's next deadline or the periodic work's, whichever
        comes first. With neither (an idle worker: no timer, nothing periodic) no
        tick is planned at all: the next batch, mesh read or cluster message plans
        one (``reschedule_tick``)."""
        if self.tick_handle is not None:  # called directly (the first tick): one planned at most
            self.tick_handle.cancel()
            self.tick_handle = None
        self.tick_at = NO_TICK_MS
        now = self.now_ms = wall_ms()
        self.ticks += 1
        self.last_tick_ms = now
        if self.period_at == NO_TICK_MS:  # a timer woke an idle worker
            self.period_at = self.on_wake()
        elif now >= self.period_at:
            self.period_at = self.on_tick()
        due = self.shard.tick(now)
        self._drain()
        self._plan(NO_TICK_MS if due is None else due)

    def on_tick(self) -> int:
        """The worker's periodic work, due now (``Worker`` has it); returns when it is
        due next, ``NO_TICK_MS`` when the worker has none until something wakes it."""
        return NO_TICK_MS

    def on_wake(self) -> int:
        """Something ran on a worker that had no periodic work planned (a batch, a
        mesh read, a cluster message, a timer): it resumes (``Worker`` has it);
        returns when it is due."""
        return NO_TICK_MS

    def _plan(self, due: int) -> None:
        """The tick at the earlier of ``due`` (a shard timer) and the periodic work."""
        at = due if due < self.period_at else self.period_at
        if at == self.tick_at:
            return
        if self.tick_handle is not None:
            self.tick_handle.cancel()
            self.tick_handle = None
        self.tick_at = at
        if at < NO_TICK_MS:
            delay_s = max(0, at - wall_ms()) / 1000
            self.tick_handle = self.loop.call_later(delay_s, self.tick)

    def reschedule_tick(self) -> None:
        """After anything that may have called the shard: an op may have added a timer
        due before the planned tick (DELAY 0.x, TTL), or taken away the one the tick
        was planned for (a replicated job's copies answered before its 50 ms step):
        the tick follows the earliest timer, never later than the periodic work. A
        tick left at the old deadline would fire for nothing (about 14.5 k
        instructions). An idle worker's periodic work resumes here."""
        if self.period_at == NO_TICK_MS:
            self.period_at = self.on_wake()
        due = self.shard.next_due()
        self._plan(NO_TICK_MS if due is None else due)
