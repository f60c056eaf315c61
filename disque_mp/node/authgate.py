"""The node-wide budget of wrong passwords: one gate per worker process, drawn on by
RESP (AUTH, HELLO ... AUTH: ``connection.py``) and by the HTTP endpoint's basic auth
(``http/server.py``) alike, so guessing on both ports together goes no faster than
``auth-failures-per-second-max`` (docs/security.md, "Wrong passwords, node-wide")."""

from __future__ import annotations

import asyncio
from typing import Final

from disque_mp.node.config import Config


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


class AuthGate:
    """Wrong passwords on this worker (RESP and HTTP), as the time the next unauthenticated read may
    run: each wrong password moves it on by one share of config
    auth-failures-per-second-max (the node's rate split over its workers), so many
    connections guess no faster than one could. A connection that gave a wrong
    password reads again at the later of its own ``auth-failure-delay-ms`` and its
    turn; while the gate is ahead, a new unauthenticated read takes a turn too (a
    fresh connection per guess gains nothing). A client with the right password
    waits only while others guess wrong, behind the turns already given."""

    __slots__ = ("next_s",)

    def __init__(self) -> None:
        self.next_s = 0.0

    def ahead(self) -> bool:
        return self.next_s > _loop_time()

    def turn(self, cfg: Config) -> float:
        """A new read while the gate is ahead: when it runs (the next turn)."""
        at_s = self.next_s
        self.next_s = at_s + _share_s(cfg)
        return at_s

    def failed(self, cfg: Config) -> float:
        """A wrong password now: when the connection that gave it reads again."""
        now_s = _loop_time()
        self.next_s = max(self.next_s, now_s) + _share_s(cfg)
        return max(self.next_s, now_s + cfg.auth_failure_delay_ms / 1000)


def _share_s(cfg: Config) -> float:
    return max(cfg.workers, 1) / max(cfg.auth_failures_per_second_max, 1)


auth_gate: Final = AuthGate()  # one per worker process
