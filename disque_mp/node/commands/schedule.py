"""SCHEDULE SET / DEL / LIST / SHOW: the connection side.

The words are checked here (the same parser worker 0 runs: a bad rule, zone,
EVERY or ADDJOB is answered without a hop), then the command goes to worker 0,
which holds the node's schedules (``schedule_host.py``), through the cluster agent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from disque_mp.node import schedules as sch
from disque_mp.node.resp import encode
from workers.replies import PENDING, Error

if TYPE_CHECKING:
    from disque_mp.node.view import Client, NodeView

ERR_SCHEDULE = Error("ERR SCHEDULE subcommand must be SET, DEL name, LIST or SHOW name")
ERR_NO_AGENT = Error("ERR schedules need the cluster part, which this node has not loaded")
_ARITY = {b"del": 3, b"list": 2, b"show": 3}


def cmd_schedule(w: NodeView, conn: Client, cmd: list[bytes]) -> Any:
    sub = cmd[1].lower()
    if sub == b"set":
        spec = sch.parse_set(cmd[2:], int(w.cfg.schedule_body_bytes_max))
        if isinstance(spec, Error):
            return spec
    elif _ARITY.get(sub) != len(cmd):
        return ERR_SCHEDULE
    if w.agent is None:
        return ERR_NO_AGENT
    slot = conn.defer()
    w.agent.command(cmd[1:], lambda reply: conn.fill(slot, encode(reply, conn.resp3)),
                    area="schedule")
    return PENDING
