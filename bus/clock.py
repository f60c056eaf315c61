"""The node's two clocks, in milliseconds. The shard and membership never read a
clock: these are read at the edges and passed in.

- ``wall_ms``: epoch time, the command path's clock (job creation times, TTLs and
  every time a client sees are wall-clock, as in the reference).
- ``mono_ms``: monotonic, for failure detection on the bus: a wall-clock step (NTP)
  must not make every peer look silent at once.
"""

from __future__ import annotations

import time
from typing import Final

# The clock functions themselves, bound once: compiled, ``time.time_ns`` is an
# attribute lookup on the module at every call (a client read reads the clock once).
_time_ns: Final = time.time_ns
_monotonic_ns: Final = time.monotonic_ns


def wall_ms() -> int:
    return _time_ns() // 1_000_000


def mono_ms() -> int:
    return _monotonic_ns() // 1_000_000


def wall_offset_ms() -> int:
    """Add to a ``mono_ms()`` time to get epoch ms (CLUSTER NODES shows epoch ms)."""
    return wall_ms() - mono_ms()
