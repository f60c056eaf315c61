"""Effects a shard returns to its host process (the shard itself does no I/O).

The host drains them with ``Shard.take_effects()`` after every call into the shard
(command, cluster message, tick) and carries them out in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

# QUEUED's "f" (workers/federation.py): the counter the sender's requeue
# incremented, which every holder increments too (Disque's
# CLUSTERMSG_FLAG0_INCR_NACKS / _INCR_DELIV).
QUEUED_INCR_NACKS: Final = 2
QUEUED_INCR_DELIVERIES: Final = 4


@dataclass(slots=True)
class Wake:
    """Complete a command that was left pending (a blocked GETJOB, a synchronously
    replicated ADDJOB): send ``reply`` to whoever holds ``token``."""

    token: int
    reply: Any


@dataclass(slots=True)
class Send:
    """Send a cluster message to node ``node_id`` (``"*"`` = every reachable node).

    ``kind`` is the message type (REPLJOB, GOTJOB, SETACK, ...); ``meta`` is a small
    JSON-able dict; ``bodies`` carries job bodies as raw bytes (never base64).
    The receiving host delivers it to the worker owning ``slot``.
    """

    node_id: str
    kind: str
    slot: int
    meta: dict[str, Any]
    bodies: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class AofAppend:
    """Append one persistence record."""

    record: bytes


Effect = Wake | Send | AofAppend
