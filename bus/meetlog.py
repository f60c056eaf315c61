"""What the log says about a CLUSTER MEET that does not become a handshake.

CLUSTER MEET answers OK at once, as the reference does, and the node then dials the
peer's cluster bus (its client port + 10000). A MEET to a wrong port, or to the bus
port itself, used to leave only a ``handshake`` entry in CLUSTER NODES that vanished
after the node timeout. ``MeetLog`` watches each entry a CLUSTER MEET created and
logs, once each: the first failed dial (with the address dialled and the likely
cause), and the handshake given up. ``bus/hostbus.py`` tells it what happens; the
entries are the membership table's own ``Node`` objects, compared by identity.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bus.membership import Membership, Node, handshake_timeout_ms_min

log = logging.getLogger("disque_mp.bus")

bus_port_offset = 10000  # the cluster bus listens on the client port + this (Redis, Disque)
meets_watched_max = 64  # CLUSTER MEETs followed at once; past it a new one goes unwatched


@dataclass(slots=True)
class _Watch:
    ip: str
    port: int
    since_ms: int
    failure: str = ""  # the last dial error, "" while none


def likely_cause(port: int, unreachable: bool) -> str:
    """Why a MEET to ``port`` may not reach a node, in one sentence (``unreachable``:
    nothing listens at its bus port, as when the bus port itself was given)."""
    text = (f"CLUSTER MEET takes the peer's client port; its cluster bus is that port + "
            f"{bus_port_offset} ({port + bus_port_offset} here)")
    if unreachable and port > bus_port_offset:
        text += (f"; if {port} is the peer's bus port, its client port is "
                 f"{port - bus_port_offset}")
    return text


class MeetLog:
    def __init__(self) -> None:
        self.watched: dict[int, tuple[Node, _Watch]] = {}  # id(node) -> the entry, its watch

    def watch(self, node: Node, now_ms: int) -> None:
        if len(self.watched) < meets_watched_max:
            self.watched[id(node)] = (node, _Watch(node.ip, node.port, now_ms))

    def dial_failed(self, node: Node, error: BaseException) -> None:
        entry = self.watched.get(id(node))
        if entry is None or entry[0] is not node:
            return
        watch = entry[1]
        reason = str(error) or ("timed out" if isinstance(error, TimeoutError)
                                else type(error).__name__)
        if not watch.failure:
            log.warning("cluster bus: CLUSTER MEET %s %d: cannot reach its cluster bus at "
                        "%s:%d (%s). %s", watch.ip, watch.port, watch.ip,
                        watch.port + bus_port_offset, reason, likely_cause(watch.port, True))
        watch.failure = reason

    def sweep(self, m: Membership, now_ms: int) -> None:
        """After the membership tick: entries that became a node are done, entries the
        tick dropped (no PONG in time) are logged as given up."""
        for key, (node, watch) in list(self.watched.items()):
            if m.nodes.get(node.node_id) is node and node.handshake:
                continue
            del self.watched[key]
            expired = now_ms - watch.since_ms > max(handshake_timeout_ms_min, m.node_timeout_ms)
            if node.handshake and expired:  # not a PONG from ourselves or a known node
                what = (f"the last dial failed: {watch.failure}" if watch.failure else
                        f"its bus port {watch.port + bus_port_offset} accepted the connection "
                        "but no disque node answered there")
                log.warning("cluster bus: CLUSTER MEET %s %d given up after %.0f s with no "
                            "handshake (%s). %s", watch.ip, watch.port,
                            (now_ms - watch.since_ms) / 1000, what,
                            likely_cause(watch.port, bool(watch.failure)))
