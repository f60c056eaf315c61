"""Names and bounds of the node that a client or a broker must agree with, read
from the node's own definitions so that each is written once: the dead-letter
prefix MAXDELIVER moves a job under, MAXDELIVER's bound, DEDUP's key bound, GROUP's
name bound, PRIORITY's range and DEADLETTER's reason."""

from __future__ import annotations

from typing import Final

from workers.ids import DEAD_PREFIX as DEAD_PREFIX_BYTES
from workers.job import (
    dead_reason_bytes_max,
    dedup_bytes_max,
    group_bytes_max,
    maxdeliver_max,
    priority_max,
)

__all__ = ["DEAD_PREFIX", "DEAD_PREFIX_BYTES", "DEAD_REASON_BYTES_MAX", "DEDUP_BYTES_MAX",
           "GROUP_BYTES_MAX", "MAXDELIVER_MAX", "PRIORITY_MAX", "dead_reason", "group_name",
           "priority_level"]

# The dead-letter queue of queue q is dead:q (text, as clients name queues).
DEAD_PREFIX: Final = DEAD_PREFIX_BYTES.decode("ascii")
# ADDJOB ... MAXDELIVER n: the largest n the node accepts.
MAXDELIVER_MAX: Final = maxdeliver_max
# ADDJOB ... DEDUP key: its longest (bytes).
DEDUP_BYTES_MAX: Final = dedup_bytes_max
# ADDJOB ... GROUP name: its longest (bytes).
GROUP_BYTES_MAX: Final = group_bytes_max
# ADDJOB ... PRIORITY p: the highest p (0 is the default; higher is delivered first).
PRIORITY_MAX: Final = priority_max
# DEADLETTER ... REASON text: the longest reason the node keeps with a job.
DEAD_REASON_BYTES_MAX: Final = dead_reason_bytes_max


def dead_reason(what: BaseException | str) -> bytes:
    """DEADLETTER's REASON for an exception (``Type: text``) or a text: UTF-8, cut
    to the node's bound at a character boundary."""
    text = what if isinstance(what, str) else f"{type(what).__name__}: {what}"
    raw = text.encode("utf-8", "replace")
    if len(raw) <= DEAD_REASON_BYTES_MAX:
        return raw
    return raw[:DEAD_REASON_BYTES_MAX].decode("utf-8", "ignore").encode("utf-8")


def group_name(value: object, what: str) -> str | None:
    """A broker's fairness group as ADDJOB GROUP's name (None: none). ValueError when
    it is empty or longer than the node takes: a message that asked for fairness does
    not go without (``what`` names where it came from, for the error)."""
    if value is None:
        return None
    group = str(value)
    if not 1 <= len(group.encode()) <= GROUP_BYTES_MAX:
        raise ValueError(f"{what} must be 1..{GROUP_BYTES_MAX} bytes (ADDJOB GROUP), "
                         f"got {len(group.encode())}")
    return group


def priority_level(value: object, what: str) -> int:
    """A broker's message priority as ADDJOB PRIORITY's value (None: 0). ValueError
    when it is no integer in 0..PRIORITY_MAX: a message that asked for an order does
    not go without (``what`` names where it came from, for the error)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or \
            not 0 <= value <= PRIORITY_MAX:
        raise ValueError(f"{what} must be an integer 0..{PRIORITY_MAX} (ADDJOB PRIORITY), "
                         f"got {value!r}")
    return value
