"""Many nodes' shards in one process, joined by a simulated network.

One ``Shard`` per node with ``workers=1``: on a real host each slot owner talks
only to the owner of the same slot on other hosts, so every worker index forms
its own independent Disque cluster; one shard per node is exactly that
cluster for all slots, and it keeps the simulation small and fast.

The network delivers ``Send`` effects after a random delay (a message can
overtake another, as across reconnections), may drop or duplicate them, and
never delivers across a partition or to a crashed node. A link can also be
down one way only (``cut_one_way``): a real node sends on its own outbound bus
link and redials it on its own schedule, so right after a peer restarts or a
partition heals, the peer's messages may reach us while ours are still
dropped. Time is a fake clock that jumps from event to event (next message,
next shard timer); randomness comes from one seeded ``random.Random``, so a
run is a function of its seed.
"""

from __future__ import annotations

import heapq
import os
import random
from collections.abc import Callable
from typing import Any

from workers.effects import Effect, Send, Wake
from workers.replies import PENDING, Status
from workers.shard import Shard

# A bus link is a TCP stream (the authenticated bus also refuses a replayed frame): it
# never delivers one message twice. The duplicates the network makes stand for the
# messages the nodes' state machines send again (REPLJOB, SETACK, WILLQUEUE, QUEUED,
# NEEDJOBS, ...). YOURJOBS is never sent again: its jobs left the sender's queue, and
# one that cannot be written is queued again at home instead. Duplicating it would
# hand an at-most-once job to the receiver a second time after the receiver had moved
# it on, which no real link can do.
SENT_ONCE = frozenset({"YOURJOBS"})

T0 = 1_795_301_808_328


class Node:
    __slots__ = ("id", "shard", "alive", "incarnation")

    def __init__(self, node_id: str, shard: Shard) -> None:
        self.id = node_id
        self.shard = shard
        self.alive = True
        self.incarnation = 0


class Net:
    def __init__(self, n: int, seed: int, *, delay_ms: tuple[int, int] = (1, 1),
                 drop: float = 0.0, dup: float = 0.0, now: int = T0) -> None:
        self.rng = random.Random(seed)
        self.now = now
        self.delay_ms = delay_ms
        self.drop = drop
        self.dup = dup
        self.seq = 0
        self.inflight: list[tuple[int, int, str, str, str, dict[str, Any], list[bytes]]] = []
        self.cut: set[frozenset[str]] = set()
        self.cut_out: set[tuple[str, str]] = set()  # (src, dst): src's link to dst is down
        self.nodes: dict[str, Node] = {}
        self.wakes: dict[tuple[str, int], Any] = {}  # (node, token) -> reply
        # Sees each node's effects before they are carried out (a simulation's checks).
        self.watch: Callable[[str, list[Effect]], None] | None = None
        self.sent: dict[str, int] = {}  # message kind -> count (tests look at traffic)
        self.next_token = 0
        for i in range(n):
            node_id = f"{i + 1:02x}" + f"{self.rng.getrandbits(152):038x}"
            self.nodes[node_id] = Node(node_id, self._new_shard(node_id))
        self.ids = sorted(self.nodes)
        self.refresh_views()

    def _new_shard(self, node_id: str) -> Shard:
        seed = self.rng.getrandbits(64).to_bytes(8, "big")
        return Shard(node_id, 0, 1, seed, random.Random(self.rng.getrandbits(64)), self.now)

    # ------------------------------------------------------------------ topology

    def linked(self, a: str, b: str) -> bool:
        """Messages from ``a`` reach ``b`` (and ``a`` sees ``b`` reachable: a node's
        failure detection runs on its own outbound link)."""
        return (self.nodes[a].alive and self.nodes[b].alive
                and frozenset((a, b)) not in self.cut and (a, b) not in self.cut_out)

    def refresh_views(self, leaving: set[str] | None = None) -> None:
        """What failure detection would eventually tell every node."""
        leaving = leaving or set()
        for n in self.nodes.values():
            if not n.alive:
                continue
            peers = [(o, self.linked(n.id, o), o in leaving) for o in self.ids if o != n.id]
            n.shard.set_view(n.id, peers, n.id in leaving)
            self.drain(n.id)

    def partition(self, group: set[str]) -> None:
        for a in group:
            for b in self.ids:
                if b not in group:
                    self.cut.add(frozenset((a, b)))

    def cut_one_way(self, src: str, dst: str) -> None:
        """``src``'s link to ``dst`` is down; ``dst``'s link to ``src`` still works."""
        self.cut_out.add((src, dst))

    def heal(self) -> None:
        self.cut.clear()
        self.cut_out.clear()

    def crash(self, node_id: str) -> None:
        self.nodes[node_id].alive = False
        self.inflight = [m for m in self.inflight if m[3] != node_id]
        heapq.heapify(self.inflight)

    def restart(self, node_id: str) -> None:
        """Back with the same ID and no jobs (no AOF)."""
        n = self.nodes[node_id]
        n.shard = self._new_shard(node_id)
        n.alive = True
        n.incarnation += 1

    # ------------------------------------------------------------------ effects

    def drain(self, node_id: str) -> None:
        effects = self.nodes[node_id].shard.take_effects()
        if self.watch is not None:
            self.watch(node_id, effects)
        for eff in effects:
            if type(eff) is Send:
                self._route(node_id, eff)
            elif type(eff) is Wake:
                self.wakes[(node_id, eff.token)] = eff.reply

    def _route(self, src: str, eff: Send) -> None:
        self.sent[eff.kind] = self.sent.get(eff.kind, 0) + 1
        targets = [o for o in self.ids if o != src] if eff.node_id == "*" else [eff.node_id]
        for dst in targets:
            if dst not in self.nodes or not self.linked(src, dst):
                continue
            if self.drop and self.rng.random() < self.drop:
                continue
            twice = bool(self.dup) and self.rng.random() < self.dup
            copies = 2 if twice and eff.kind not in SENT_ONCE else 1
            for _ in range(copies):
                at = self.now + self.rng.randint(*self.delay_ms)
                self.seq += 1
                heapq.heappush(self.inflight, (at, self.seq, src, dst, eff.kind, eff.meta,
                                               list(eff.bodies)))

    # ------------------------------------------------------------------ time

    def _due(self, n: Node) -> int | None:
        return n.shard.next_due()

    def run(self, ms: int) -> None:
        """Advance the clock by ``ms``, delivering messages and firing timers in order."""
        end = self.now + ms
        while True:
            t_msg = self.inflight[0][0] if self.inflight else None
            t_tick: int | None = None
            for n in self.nodes.values():
                if n.alive:
                    d = self._due(n)
                    if d is not None and (t_tick is None or d < t_tick):
                        t_tick = d
            cands = [t for t in (t_msg, t_tick) if t is not None]
            if not cands or min(cands) > end:
                break
            self.now = max(self.now, min(cands))
            if t_msg is not None and t_msg <= self.now:
                _at, _seq, src, dst, kind, meta, bodies = heapq.heappop(self.inflight)
                node = self.nodes[dst]
                if node.alive and self.linked(src, dst):
                    node.shard.on_message(src, kind, meta, bodies, self.now)
                    self.drain(dst)
                continue
            for n in self.nodes.values():
                d = self._due(n) if n.alive else None
                if d is not None and d <= self.now:
                    n.shard.tick(self.now)
                    self.drain(n.id)
        self.now = end

    # ------------------------------------------------------------------ clients

    def token(self) -> int:
        self.next_token += 1
        return self.next_token

    def addjob(self, node_id: str, queue: bytes = b"q", body: bytes = b"x", **kw: Any) -> Any:
        """ADDJOB; a PENDING reply is ``("pending", token)`` (see ``reply``)."""
        args: dict[str, Any] = dict(timeout_ms=0, replicate=None, delay_s=0, retry_s=None,
                                    ttl_s=3600, maxlen=0, async_=False)
        args.update(kw)
        tok = self.token()
        r = self.nodes[node_id].shard.op_addjob(queue, body, token=tok, now_ms=self.now, **args)
        self.drain(node_id)
        return ("pending", tok) if r is PENDING else r

    def reply(self, node_id: str, r: Any) -> Any:
        """The final reply of a command that may have been pending (None: still waiting)."""
        if isinstance(r, tuple) and r and r[0] == "pending":
            return self.wakes.get((node_id, r[1]))
        return r

    def added(self, node_id: str, wait_ms: int, **kw: Any) -> str:
        """ADDJOB (``addjob``'s options), ``wait_ms`` of network time, and the new job's
        ID: the reply must be one by then."""
        r = self.addjob(node_id, **kw)
        self.run(wait_ms)
        rep = self.reply(node_id, r)
        assert isinstance(rep, Status), rep
        return str(rep)

    def take(self, node_id: str, queue: bytes = b"q", count: int = 1) -> list[list[Any]]:
        out = self.nodes[node_id].shard.op_take([queue], count, False, self.now)
        self.drain(node_id)
        return out

    def block(self, node_id: str, queue: bytes = b"q", count: int = 1) -> int:
        tok = self.token()
        self.nodes[node_id].shard.op_block(tok, [queue], count, False, self.now)
        self.drain(node_id)
        return tok

    def ack(self, node_id: str, ids: list[str]) -> int:
        r = self.nodes[node_id].shard.op_ackjob(ids, self.now)
        self.drain(node_id)
        return r

    def fastack(self, node_id: str, ids: list[str]) -> int:
        r = self.nodes[node_id].shard.op_fastack(ids, self.now)
        self.drain(node_id)
        return r

    def holders(self, job_id: str) -> dict[str, int]:
        """Node -> job state, for every live node that has the job."""
        out = {}
        for n in self.nodes.values():
            if n.alive:
                j = n.shard.lookup(job_id)
                if j is not None:
                    out[n.id] = j.state
        return out

    def check(self) -> None:
        for n in self.nodes.values():
            if n.alive:
                n.shard.check()


def woken_jobs(node_id: str, effects: list[Effect], blocked: dict[tuple[str, int], int]) -> list[str]:
    """IDs of the jobs the effects deliver to blocked GETJOBs of ``blocked``
    (each such waiter is removed from it)."""
    out: list[str] = []
    for eff in effects:
        if type(eff) is Wake and blocked.pop((node_id, eff.token), None):
            if isinstance(eff.reply, list):
                out += [e[1] for e in eff.reply]
    return out


def seeds(count_env: str, count_default: int) -> list[int]:
    """The seeds a simulation runs: SIM_SEED alone when set (to replay one), else 1 to
    the count in ``count_env`` (``count_default`` when unset)."""
    one = os.environ.get("SIM_SEED")
    if one:
        return [int(one)]
    return list(range(1, int(os.environ.get(count_env, str(count_default))) + 1))
