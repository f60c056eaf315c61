"""Names and bounds of the node that a client or a broker must agree with, read
from the node's own definitions so that each is written once: the dead-letter
prefix MAXDELIVER moves a job under, and MAXDELIVER's bound."""

from __future__ import annotations

from typing import Final

from workers.ids import DEAD_PREFIX as DEAD_PREFIX_BYTES
from workers.job import maxdeliver_max

__all__ = ["DEAD_PREFIX", "DEAD_PREFIX_BYTES", "MAXDELIVER_MAX"]

# The dead-letter queue of queue q is dead:q (text, as clients name queues).
DEAD_PREFIX: Final = DEAD_PREFIX_BYTES.decode("ascii")
# ADDJOB ... MAXDELIVER n: the largest n the node accepts.
MAXDELIVER_MAX: Final = maxdeliver_max
