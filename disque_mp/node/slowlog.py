"""SLOWLOG: commands that ran longer than ``slowlog-log-slower-than`` microseconds.

As Redis 3 (on which Disque 1.0 is built): an entry is ``[id, unix time, duration
in microseconds, arguments]``, at most ``slowlog_args_max`` arguments (the last
slot then says how many more there were) of at most ``slowlog_arg_bytes_max``
bytes each (longer ones say how many bytes more); the log keeps the newest
``slowlog-max-len`` entries; a negative threshold turns it off, 0 logs every
command. The duration is the command's run time in the worker holding the
connection (a command forwarded to another worker counts the forwarding only).

Each worker keeps its own log; SLOWLOG GET merges them newest first, LEN sums,
RESET clears them all. Entry IDs are unique over the node (counter * workers +
worker index), as client IDs are.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

slowlog_args_max = 32  # Redis' SLOWLOG_ENTRY_MAX_ARGC
slowlog_arg_bytes_max = 128  # Redis' SLOWLOG_ENTRY_MAX_STRING
slowlog_get_default = 10  # SLOWLOG GET without a count


class SlowLog:
    __slots__ = ("index", "workers", "entries", "next_id", "min_ns", "max_len")

    def __init__(self, index: int, workers: int) -> None:
        self.index = index
        self.workers = workers
        self.entries: deque[list[Any]] = deque()  # newest first: [id, unix_us, usec, args]
        self.next_id = 0
        self.min_ns = -1  # < 0: off
        self.max_len = 0

    def configure(self, slower_than_us: int, max_len: int) -> None:
        """Apply the two settings (the worker calls this from its tick: CONFIG SET works)."""
        self.min_ns = slower_than_us * 1000 if slower_than_us >= 0 else -1
        self.max_len = max(0, max_len)
        while len(self.entries) > self.max_len:
            self.entries.pop()

    def add(self, args: list[bytes], duration_ns: int) -> None:
        """Record a command that ran ``duration_ns`` (the caller checked ``min_ns``)."""
        if self.max_len <= 0:
            return
        kept = args
        if len(args) > slowlog_args_max:
            more = len(args) - slowlog_args_max + 1
            kept = args[:slowlog_args_max - 1] + [b"... (%d more arguments)" % more]
        shown = [a if len(a) <= slowlog_arg_bytes_max else
                 a[:slowlog_arg_bytes_max] + b"... (%d more bytes)" % (len(a) - slowlog_arg_bytes_max)
                 for a in kept]
        entry_id = self.next_id * self.workers + self.index
        self.next_id += 1
        self.entries.appendleft([entry_id, time.time_ns() // 1000, duration_ns // 1000, shown])
        while len(self.entries) > self.max_len:
            self.entries.pop()

    def newest(self, count: int) -> list[list[Any]]:
        """Up to ``count`` entries, newest first (negative: all)."""
        if count < 0 or count >= len(self.entries):
            return list(self.entries)
        return [self.entries[i] for i in range(count)]

    def reset(self) -> None:
        self.entries.clear()


def merge(parts: list[list[list[Any]]], count: int) -> list[list[Any]]:
    """The workers' newest entries as one log, newest first, in the reply's shape
    (unix time in seconds)."""
    entries = sorted((e for part in parts for e in part), key=lambda e: (e[1], e[0]),
                     reverse=True)
    if count >= 0:
        entries = entries[:count]
    return [[e[0], e[1] // 1_000_000, e[2], list(e[3])] for e in entries]
