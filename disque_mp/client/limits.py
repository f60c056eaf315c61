"""Names and bounds of the node that a client or a broker must agree with, read
from the node's own definitions so that each is written once: the dead-letter
prefix MAXDELIVER moves a job under, MAXDELIVER's bound, DEDUP's key bound, GROUP's
name bound, PRIORITY's range, DEADLETTER's reason and QLIMIT's options as the brokers
take them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from workers.ids import DEAD_PREFIX as DEAD_PREFIX_BYTES
from workers.job import (
    dead_reason_bytes_max,
    dedup_bytes_max,
    group_bytes_max,
    maxdeliver_max,
    priority_max,
)
from workers.limit import limit_value_limit

__all__ = ["DEAD_PREFIX", "DEAD_PREFIX_BYTES", "DEAD_REASON_BYTES_MAX", "DEDUP_BYTES_MAX",
           "GROUP_BYTES_MAX", "LIMIT_NAMES", "MAXDELIVER_MAX", "PRIORITY_MAX", "dead_reason",
           "group_name", "priority_level", "queue_limits"]

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


# QLIMIT's limits as the client's ``set_limit`` and the brokers' options name them.
LIMIT_NAMES: Final = ("active", "rate", "group_active")


def queue_limits(value: object, what: str) -> dict[str, int]:
    """A broker's QLIMIT option for one queue (``{"active": 5, "rate": 50,
    "group_active": 2}``, each optional, 0 takes one away) as ``set_limit``'s keyword
    arguments. ValueError for another key or a value that is not an integer in
    0..the node's hard bound (the node's qlimit-value-max may be lower: it answers
    -ERR then); ``what`` names where it came from."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a mapping of {', '.join(LIMIT_NAMES)}")
    out: dict[str, int] = {}
    for key, n in value.items():
        if key not in LIMIT_NAMES:
            raise ValueError(f"{what}: unknown limit {key!r} (one of {', '.join(LIMIT_NAMES)})")
        if type(n) is not int or not 0 <= n <= limit_value_limit:
            raise ValueError(f"{what}: {key} must be an integer 0..{limit_value_limit}")
        out[key] = n
    return out
