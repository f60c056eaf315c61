"""The owner side: a ``queue``- or ``ids``-routed command run on this worker's shard.

A command reaches the shard that owns its queue or job IDs either from a client of
ours (``router.py``) or from another worker over the mesh (``peers.py``); both call
``Owner.run``, which runs it (the command table's handler) and applies the AOF
hold: under ``appendfsync always`` a reply whose records are not on disk yet waits
for the loop turn's commit (``aof.hold``), and a reply that comes later (a ``Wake``)
waits for its records too (``durable``). The hot shapes' fast paths stay in the
router, which runs them for both callers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from disque_mp.node.commands.table import TABLE, run_on_shard
from disque_mp.node.core import WorkerCore
from disque_mp.node.errors import ERR_INTERNAL
from workers.invariant import InvariantError
from workers.replies import PENDING

log = logging.getLogger("disque_mp.node.owner")

Deliver = Callable[[Any], None]


class Owner:
    """Runs the commands this worker owns (one per worker)."""

    def __init__(self, w: WorkerCore) -> None:
        self.w = w
        # ``run_on_shard``'s table, looked up here: that function runs interpreted, a
        # Python frame per command (~2k instructions of a forwarded QLEN's ~15k)
        self.handlers: dict[bytes, Callable[..., Any]] = {
            name: c.handler for name, c in TABLE.items()
            if c.route in ("queue", "ids") and c.handler is not None}

    def run(self, name: bytes, args: list[bytes], later: Callable[[], Deliver],
            peer: bool = False) -> Any:
        """Run ``name args`` (``name`` lowercase) on our shard: the reply, or
        ``PENDING`` once ``later()`` (how to deliver it) waits for the AOF or for the
        command's ``Wake``. ``peer``: another worker asked; a failure is logged and
        answered ``ERR_INTERNAL`` (the asker would wait forever)."""
        w = self.w
        token = w.new_token()
        aof = w.aof
        before = aof.appended if aof is not None else 0
        try:
            handler = self.handlers.get(name)
            if handler is None:  # its error
                reply = run_on_shard(w.shard, name, args, token, w.now_ms)
            else:
                reply = handler(w.shard, args, token, w.now_ms)
        except InvariantError:
            raise
        except Exception:
            if not peer:
                raise
            log.exception("command %r from a peer failed", name)
            reply = ERR_INTERNAL
        if aof is not None and w.cfg.appendfsync == "always" and self.must_hold(before, reply):
            aof.hold(aof.appended, later(), reply)
            return PENDING
        if reply is PENDING:
            w.tokens[token] = self.durable(later())
        return reply

    def must_hold(self, before: int, reply: Any) -> bool:
        """appendfsync always: a reply whose records are not durable yet waits for
        the loop turn's commit (``aof.hold``; it becomes the AOF error if that fails)."""
        aof = self.w.aof
        if aof is None or reply is PENDING or not aof.holds_replies():
            return False
        self.w.drain_effects()
        return bool(aof.appended != before)

    def durable(self, deliver: Deliver) -> Deliver:
        """A reply completed later (Wake) waits for its records under appendfsync always."""
        aof = self.w.aof
        if aof is None or self.w.cfg.appendfsync != "always":
            return deliver
        return aof.when_durable(deliver)
