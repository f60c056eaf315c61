"""Draining a host: the rule ``disque-mp admin drain`` and ``POST /api/drain`` share.

A drain sets ``CLUSTER LEAVING yes`` and waits until the node holds no queued job
and no job waiting for its copies (INFO's ``queued_jobs`` and ``wait_repl_jobs``):
a leaving node answers ``-LEAVING`` to GETJOB, so consumers go to the other nodes,
whose NEEDJOBS take its queued jobs (federation, as the reference's leaving nodes
do). Then it shuts the node down (SHUTDOWN), unless told to only drain. Past its
timeout it says what is left and leaves the node LEAVING, running.

It refuses at the start, changing nothing, when going would leave a job with no
other node to hold it: jobs here and no other node reachable and not leaving, or
jobs of ``REPLICATE r`` and fewer than ``r - 1`` such nodes (the nodes their other
copies live on). The facts come from INFO, HELLO and JSCAN; this module only
reads them (no I/O: the two callers ask the node, each its own way).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bus.membership import priority_ok

drain_timeout_s_default = 600.0  # how long a drain waits for the jobs to move
drain_timeout_s_max = 7 * 86400.0  # the longest a drain started over HTTP may wait
progress_interval_s = 1.0  # how often a drain reads (and prints) what is left
repl_check_jobs_max = 1_000_000  # jobs the start's REPLICATE check reads (JSCAN)
jscan_count = 1000  # jobs one JSCAN call of that check asks for
# the JSCAN arguments of the check: the jobs a drain moves or waits for
REPL_CHECK_STATES = ("queued", "wait-repl")


@dataclass(frozen=True, slots=True)
class Progress:
    """What a drain waits for, read once."""

    leaving: bool
    queued: int  # jobs queued here (INFO queued_jobs)
    wait_repl: int  # jobs whose ADDJOB waits for its copies (INFO wait_repl_jobs)
    registered: int  # every job held, copies of other nodes' jobs included
    peers_ok: int  # other nodes reachable and not leaving (HELLO priority 1)

    @property
    def left(self) -> int:
        return self.queued + self.wait_repl

    @property
    def done(self) -> bool:
        return self.leaving and self.left == 0

    def as_dict(self) -> dict[str, Any]:
        return {"leaving": self.leaving, "left": self.left, "queued": self.queued,
                "wait_repl": self.wait_repl, "registered": self.registered,
                "peers_ok": self.peers_ok, "done": self.done}

    def line(self) -> str:
        return (f"jobs left: {self.left} (queued {self.queued}, waiting for copies "
                f"{self.wait_repl}); {self.registered} jobs held in all; "
                f"{self.peers_ok} other nodes reachable and not leaving")


def peers_ok(my_id: str, nodes: Iterable[tuple[str, int]]) -> int:
    """HELLO's (node ID, priority) pairs -> the other nodes reachable and not leaving."""
    return sum(1 for node_id, priority in nodes if node_id != my_id and priority == priority_ok)


def progress(info_jobs: dict[str, Any], my_id: str, nodes: Iterable[tuple[str, int]],
             leaving: bool) -> Progress:
    """INFO jobs (parsed), HELLO's nodes and CLUSTER LEAVING -> a ``Progress``."""
    def field(key: str) -> int:
        return int(info_jobs.get(key, 0))

    return Progress(leaving, field("queued_jobs"), field("wait_repl_jobs"),
                    field("registered_jobs"), peers_ok(my_id, nodes))


def repl_needed(repl: int) -> int:
    """Other nodes a job of REPLICATE ``repl`` held here needs once this node is gone:
    one to move to, and as many as its other copies."""
    return max(1, repl - 1)


def refusal(p: Progress, repl_max: int) -> str | None:
    """Why this drain must not start (None: it may). ``repl_max`` is the highest
    REPLICATE among the jobs it would move or wait for (0: none seen)."""
    if p.left == 0:
        return None
    held = f"the node holds {p.left} jobs (queued {p.queued}, waiting for copies {p.wait_repl})"
    if p.peers_ok == 0:
        return (f"refusing to drain: {held} and no other node is reachable and not leaving "
                "to take them (CLUSTER MEET a peer first); nothing changed")
    need = repl_needed(repl_max)
    if p.peers_ok < need:
        return (f"refusing to drain: {held}, some with REPLICATE {repl_max}, whose copies "
                f"need {need} other nodes reachable and not leaving; {p.peers_ok} are; "
                "nothing changed")
    return None


def repl_of(jobs: Iterable[dict[str, Any]]) -> int:
    """The highest ``repl`` among JSCAN ... REPLY all items (0 for none)."""
    return max((int(j.get("repl", 0)) for j in jobs), default=0)


def timeout_text(p: Progress, timeout_s: float) -> str:
    return (f"drain timed out after {timeout_s:g} s: {p.line()}; the node stays LEAVING "
            "(CLUSTER LEAVING no to take it back)")
