"""Always-on invariant checks (``assert`` vanishes under ``python -O``).

A broken invariant is a bug in the shard: raise, let the worker crash, and let
the supervisor restart it: a restarted worker reloads its slots from the AOF,
while one that went on with broken state could hand out wrong jobs.
"""

from __future__ import annotations


class InvariantError(RuntimeError):
    """The shard's state contradicts itself."""


def invariant(cond: object, msg: str) -> None:
    if not cond:
        raise InvariantError(msg)
