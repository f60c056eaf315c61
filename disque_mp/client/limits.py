"""Names and bounds of the node that a client or a broker must agree with, read
from the node's own definitions so that each is written once: the dead-letter
prefix MAXDELIVER moves a job under, MAXDELIVER's bound, DEDUP's key bound."""

from __future__ import annotations

from typing import Final

from workers.ids import DEAD_PREFIX as DEAD_PREFIX_BYTES
from workers.job import dedup_bytes_max, maxdeliver_max

__all__ = ["DEAD_PREFIX", "DEAD_PREFIX_BYTES", "DEDUP_BYTES_MAX", "MAXDELIVER_MAX"]

# The dead-letter queue of queue q is dead:q (text, as clients name queues).
DEAD_PREFIX: Final = DEAD_PREFIX_BYTES.decode("ascii")
# ADDJOB ... MAXDELIVER n: the largest n the node accepts.
MAXDELIVER_MAX: Final = maxdeliver_max
# ADDJOB ... DEDUP key: its longest (bytes).
DEDUP_BYTES_MAX: Final = dedup_bytes_max
