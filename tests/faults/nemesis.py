"""The nemesis: a seeded schedule of faulty windows, and the thread that plays it.

    plan = schedule(random.Random(seed), nodes=5, kinds=all_kinds, duration_s=600)
    nem = Nemesis(plan, net, nodes, history, rng); nem.start(); ...; nem.finish()

The schedule alternates healthy and faulty windows; each faulty window holds
one fault, the kinds taken in a shuffled round so every kind comes up:

- ``halves``: the nodes split in two random halves (cuts between them).
- ``isolate``: one node cut from every other.
- ``ring`` (5 nodes or more): a majorities ring, every node reaches its two
  neighbours in a random ring order and nobody else, so each node sees a
  majority but no two nodes see the same one.
- ``kill9``: one node SIGKILLed (supervisor and workers), restarted at the end
  of the window with the same config, dir, nodes.conf and AOF.
- ``pause``: one node SIGSTOPped, SIGCONTed at the end of the window.
- ``kill-worker``: one worker of one node SIGKILLed; its supervisor restarts it.

At most one crash (kill9 or kill-worker) per window, on one node: never more
holders of a job crashed at once than REPLICATE - 1 (REPLICATE >= 2).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tests.faults.history import History
from tests.faults.netns import Net
from tests.faults.nodes import FaultNode

all_kinds = ("halves", "isolate", "ring", "kill9", "pause", "kill-worker")
partition_kinds = ("halves", "isolate", "ring")


@dataclass
class Fault:
    start_s: float
    end_s: float
    kind: str
    node: int = -1  # kill9, pause, kill-worker
    groups: list[list[int]] = field(default_factory=list)  # halves, isolate
    ring: list[int] = field(default_factory=list)  # ring order

    def targets(self) -> Any:
        if self.groups:
            return self.groups
        if self.ring:
            return {"ring": self.ring}
        return self.node


def _fault(rng: random.Random, kind: str, nodes: int, start_s: float, end_s: float) -> Fault:
    order = list(range(nodes))
    rng.shuffle(order)
    f = Fault(start_s, end_s, kind)
    if kind == "halves":
        half = nodes // 2
        f.groups = [sorted(order[:half]), sorted(order[half:])]
    elif kind == "isolate":
        f.groups = [[order[0]], sorted(order[1:])]
    elif kind == "ring":
        f.ring = order
    else:
        f.node = order[0]
    return f


def schedule(rng: random.Random, nodes: int, kinds: tuple[str, ...], duration_s: float,
             healthy_s: tuple[float, float] = (8.0, 15.0),
             faulty_s: tuple[float, float] = (10.0, 20.0)) -> list[Fault]:
    """Faulty windows within ``duration_s``, separated by healthy ones, from ``rng`` only."""
    kinds = tuple(k for k in kinds if k != "ring" or nodes >= 5)
    plan: list[Fault] = []
    t = rng.uniform(*healthy_s)
    bag: list[str] = []
    while True:
        length = rng.uniform(*faulty_s)
        if t + length > duration_s:
            return plan
        if not bag:
            bag = list(kinds)
            rng.shuffle(bag)
        plan.append(_fault(rng, bag.pop(), nodes, round(t, 2), round(t + length, 2)))
        t += length + rng.uniform(*healthy_s)


class Nemesis(threading.Thread):
    """Plays a schedule against real nodes; every window is recorded in the history."""

    def __init__(self, plan: list[Fault], net: Net, nodes: list[FaultNode], history: History,
                 rng: random.Random) -> None:
        super().__init__(name="nemesis", daemon=True)
        self.plan = plan
        self.net = net
        self.nodes = nodes
        self.history = history
        self.rng = rng
        self.stop_event = threading.Event()
        self.errors: list[str] = []
        self.t_origin = time.monotonic()
        self.active: Fault | None = None

    def _sleep_until(self, at_s: float) -> bool:
        """False when asked to stop first."""
        delay = at_s - (time.monotonic() - self.t_origin)
        return not self.stop_event.wait(max(0.0, delay))

    def run(self) -> None:
        for f in self.plan:
            if not self._sleep_until(f.start_s):
                return
            t0 = self.history.now()
            try:
                detail = self._begin(f)
            except Exception as e:  # noqa: BLE001 - a fault that could not start is reported
                self.errors.append(f"{f.kind} at {f.start_s}: {e!r}")
                detail = {"error": repr(e)}
            self.active = f
            self._sleep_until(f.end_s)
            try:
                self._end(f)
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"ending {f.kind} at {f.end_s}: {e!r}")
            self.active = None
            self.history.fault(f.kind, f.targets(), t0, self.history.now(), **detail)
            if self.stop_event.is_set():
                return

    def _begin(self, f: Fault) -> dict[str, Any]:
        if f.kind in ("halves", "isolate"):
            self.net.partition(f.groups)
        elif f.kind == "ring":
            n = len(f.ring)
            for i in range(n):
                for j in range(i + 2, n):
                    if (j - i) % n not in (1, n - 1):
                        self.net.cut(f.ring[i], f.ring[j])
        elif f.kind == "kill9":
            self.nodes[f.node].kill9()
        elif f.kind == "pause":
            self.nodes[f.node].pause()
        elif f.kind == "kill-worker":
            pid = self.nodes[f.node].kill_worker(self.rng)
            return {"pid": pid}
        return {}

    def _end(self, f: Fault) -> None:
        if f.kind in partition_kinds:
            self.net.heal()
        elif f.kind == "kill9":
            self.nodes[f.node].start()
        elif f.kind == "pause":
            self.nodes[f.node].resume()

    def finish(self, timeout_s: float) -> None:
        """Stop the schedule; the window in progress ends (healed, resumed, restarted)."""
        self.stop_event.set()
        self.join(timeout_s)
        if self.is_alive():
            self.errors.append(f"nemesis did not stop within {timeout_s} s")
