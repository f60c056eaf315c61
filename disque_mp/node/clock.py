"""The node's one clock read on the command path: wall-clock milliseconds, passed
to the shard (which never reads a clock itself)."""

from __future__ import annotations

import time


def now_ms() -> int:
    return time.time_ns() // 1_000_000
