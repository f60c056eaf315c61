"""Cluster membership, gossip and failure detection: pure logic, no I/O.

One process per host (worker 0) owns a ``Membership``; ``bus/hostbus.py`` feeds it
the frames it receives and the time, and carries out what it asks for (PINGs to
send, links to drop, FAIL to broadcast). Nothing here reads a clock, touches a
socket or uses the global random module: ``now_ms`` (wall clock ms) and a seeded
``random.Random`` come in, so tests drive many nodes with a fake clock.

Rules (Redis Cluster's, as Disque inherits them; see docs/cluster.md):

- A node learned by CLUSTER MEET, by a MEET from an unknown node, or by gossip
  starts in ``handshake`` under a random temporary ID; the first PONG on our
  link to it tells its real ID (or shows it is a duplicate / ourselves, and the
  handshake entry is dropped). Handshakes that get no PONG expire.
- PING/PONG carry the sender's header (ID, client port, leaving) and a gossip
  section: a few random known nodes plus every node the sender flags PFAIL.
  Unknown nodes in gossip start a handshake, which closes the full mesh.
- A node without a PONG for ``node_timeout_ms`` after a PING is PFAIL. Gossip
  that flags it PFAIL/FAIL counts as a failure report (valid 2 x timeout); with
  reports from a majority of the cluster (ourselves included) it becomes FAIL
  and we broadcast FAIL. Any PONG clears PFAIL and FAIL (Disque has no
  replicas to fail over, so a node that answers is simply back).
- FORGET removes a node and bans its ID for ``forget_ban_ms`` so gossip from
  nodes that still know it does not bring it back.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bus.nodes_conf import NodeEntry, NodesConf

NODE_ID_LEN = 40
forget_ban_ms = 60_000  # CLUSTER FORGET: as Redis, long enough for gossip to forget it too
fail_report_validity_mult = 2  # a PFAIL report counts for 2 x node timeout (Redis)
handshake_timeout_ms_min = 1000  # a handshake that gets no PONG expires after max(this, timeout)
gossip_entries_min = 3  # nodes in a PING's gossip section: max(3, known/10), as Redis
gossip_entries_max = 64  # bounds the PING size whatever the cluster size
ping_interval_ms_max = 1000  # ping every node at least once a second
ping_interval_ms_min = 20  # ... and not more often than this, whatever the timeout
client_port_max = 65535 - 10000  # the bus port (client port + 10000) must fit in 16 bits
nodes_max = 1000  # membership table bound: gossip from a broken peer cannot grow it without end

# Priorities in HELLO (lower is better). Disque: 1 healthy, 100 leaving; a node we
# cannot reach is still listed but worse than any healthy one.
priority_ok = 1
priority_unreachable = 10
priority_leaving = 100


def new_node_id(rng: random.Random) -> str:
    return f"{rng.getrandbits(160):040x}"


def is_node_id(text: str) -> bool:
    return len(text) == NODE_ID_LEN and all(c in "0123456789abcdef" for c in text)


def valid_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class Node:
    """One entry of the membership table (ourselves included)."""

    __slots__ = (
        "node_id", "ip", "port", "myself", "handshake", "meet", "pfail", "fail", "noaddr",
        "leaving", "ping_sent_ms", "pong_received_ms", "last_ping_ms", "ctime_ms",
        "link_up", "link_ctime_ms", "fail_reports", "header_version",
    )

    def __init__(self, node_id: str, ip: str, port: int, now_ms: int) -> None:
        self.node_id = node_id
        self.ip = ip
        self.port = port  # client port; the bus port is port + 10000
        self.myself = False
        self.handshake = False
        self.meet = False  # send MEET rather than PING until the handshake ends
        self.pfail = False
        self.fail = False
        self.noaddr = False
        self.leaving = False
        self.ping_sent_ms = 0  # oldest PING without a PONG yet (0 = none pending)
        self.pong_received_ms = 0
        self.last_ping_ms = 0
        self.ctime_ms = now_ms
        self.link_up = False
        self.link_ctime_ms = 0
        self.fail_reports: dict[str, int] = {}  # reporter id -> when reported, ms
        # the newest header version taken from this node: (its incarnation, its count of
        # flag changes); ours: what our headers carry (see Membership.header)
        self.header_version: tuple[int, int] = (0, 0)

    def flags(self) -> list[str]:
        out = []
        for name, on in (("myself", self.myself), ("fail?", self.pfail), ("fail", self.fail),
                         ("handshake", self.handshake), ("noaddr", self.noaddr),
                         ("leaving", self.leaving)):
            if on:
                out.append(name)
        return out

    def flags_text(self) -> str:
        return ",".join(self.flags()) or "noflags"

    @property
    def reachable(self) -> bool:
        return not (self.pfail or self.fail or self.handshake or self.noaddr)

    @property
    def linked(self) -> bool:
        """Our outbound link to it is up and has carried a PONG: a message we send
        now is written, not dropped. A peer loaded from nodes.conf, or whose link
        has just been lost (it restarted within the node timeout), is reachable
        but not linked until our new link answers a PING."""
        return self.link_up and self.pong_received_ms >= self.link_ctime_ms

    def __repr__(self) -> str:
        return f"Node({self.node_id[:8]} {self.ip}:{self.port} {self.flags_text()})"


# Actions the I/O side must carry out, returned by tick() and the receive calls.
@dataclass(slots=True)
class Ping:
    node: Node
    meet: bool


@dataclass(slots=True)
class Broadcast:
    kind: str  # "fail"
    meta: dict[str, Any]


@dataclass(slots=True)
class DropLink:
    node: Node


Action = Ping | Broadcast | DropLink


class Membership:
    """The membership table of one host and the rules that change it."""

    def __init__(self, my_id: str, ip: str, port: int, rng: random.Random, now_ms: int,
                 node_timeout_ms: int) -> None:
        self.rng = rng
        self.node_timeout_ms = node_timeout_ms
        self.myself = Node(my_id, ip, port, now_ms)
        self.myself.myself = True
        # Our headers' version: an incarnation drawn at start and a count of our flag
        # changes. A peer hears our header on two links (our PINGs on ours, our PONGs
        # on its), which its event loop may read in either order: a PONG written just
        # before a CLUSTER LEAVING must not undo the PING written after it.
        self.myself.header_version = (rng.getrandbits(48), 0)
        self.nodes: dict[str, Node] = {my_id: self.myself}
        self.banned: dict[str, int] = {}  # forgotten id -> until, ms
        self.stats_sent = 0
        self.stats_received = 0
        self.dirty = True  # table changed since the last save/publish

    # ---- queries -------------------------------------------------------------

    @property
    def my_id(self) -> str:
        return self.myself.node_id

    def others(self) -> Iterator[Node]:
        return (n for n in self.nodes.values() if not n.myself)

    def size(self) -> int:
        return sum(1 for n in self.nodes.values() if not (n.handshake or n.noaddr))

    def ping_interval_ms(self) -> int:
        return max(ping_interval_ms_min, min(self.node_timeout_ms // 10, ping_interval_ms_max))

    # ---- commands ------------------------------------------------------------

    def meet(self, ip: str, port: int, now_ms: int) -> Node | None:
        """CLUSTER MEET: start a handshake (None if one to that address is running)."""
        return self._start_handshake(ip, port, now_ms, meet=True)

    def forget(self, node_id: str, now_ms: int) -> str | None:
        """CLUSTER FORGET: an error text, or None when done."""
        if node_id == self.my_id:
            return "I tried hard but I can't forget myself..."
        node = self.nodes.get(node_id)
        if node is None:
            return f"Unknown node {node_id}"
        self._delete(node)
        self.banned[node_id] = now_ms + forget_ban_ms
        return None

    def reset(self, hard: bool, now_ms: int) -> None:
        """CLUSTER RESET: forget every other node; HARD also takes a new node ID."""
        for node in list(self.others()):
            self._delete(node)
        self.banned.clear()
        self._set_my_leaving(False)
        if hard:
            del self.nodes[self.my_id]
            self.myself.node_id = new_node_id(self.rng)
            self.nodes[self.my_id] = self.myself
        self.dirty = True

    def set_leaving(self, leaving: bool, now_ms: int) -> list[Action]:
        """CLUSTER LEAVING yes|no: ping everyone now so the cluster learns fast."""
        if self.myself.leaving == leaving:
            return []
        self._set_my_leaving(leaving)
        return [self.ping(n, now_ms) for n in self.others() if not n.noaddr]

    def _set_my_leaving(self, leaving: bool) -> None:
        if self.myself.leaving != leaving:
            self.myself.leaving = leaving
            incarnation, changes = self.myself.header_version
            self.myself.header_version = (incarnation, changes + 1)
            self.dirty = True

    def set_node_timeout(self, node_timeout_ms: int) -> None:
        self.node_timeout_ms = node_timeout_ms

    # ---- links (told by the I/O side) -----------------------------------------

    def link_connected(self, node: Node, now_ms: int) -> None:
        node.link_up = True
        node.link_ctime_ms = now_ms

    def link_lost(self, node: Node) -> None:
        if node.linked:
            self.dirty = True  # the workers must stop counting on this link
        node.link_up = False

    # ---- messages ------------------------------------------------------------

    def header(self) -> dict[str, Any]:
        me = self.myself
        return {"id": me.node_id, "port": me.port, "leaving": me.leaving,
                "hv": list(me.header_version)}

    def make_ping(self, node: Node | None = None) -> dict[str, Any]:
        """Header + gossip for a PING, MEET or PONG sent to ``node``."""
        meta = self.header()
        meta["gossip"] = self._gossip(node)
        return meta

    def _gossip(self, dest: Node | None) -> list[list[Any]]:
        pool = [n for n in self.others() if n is not dest and not n.handshake and not n.noaddr]
        wanted = min(len(pool), max(gossip_entries_min, len(self.nodes) // 10), gossip_entries_max)
        chosen = self.rng.sample(pool, wanted) if wanted < len(pool) else pool
        failing = [n for n in pool if (n.pfail or n.fail) and n not in chosen]
        return [[n.node_id, n.ip, n.port, n.flags(), n.ping_sent_ms, n.pong_received_ms]
                for n in (chosen + failing)[:gossip_entries_max]]

    def on_ping(self, meta: dict[str, Any], meet: bool, peer_ip: str, local_ip: str,
                now_ms: int) -> dict[str, Any] | None:
        """A PING or MEET on an inbound link: the PONG meta to reply, None to ignore."""
        sender_id, port = _sender(meta)
        if sender_id is None:
            return None
        if not self.myself.ip or self.myself.ip in ("0.0.0.0", "::"):
            self.myself.ip = local_ip  # learn our address as peers reach it
            self.dirty = True
        sender = self.nodes.get(sender_id)
        if sender is not None and sender.handshake:
            sender = None
        if sender is None and meet and sender_id != self.my_id and not self._banned(sender_id, now_ms):
            self._start_handshake(peer_ip, port, now_ms, meet=False)
        if sender is not None and not sender.myself:
            self._update_address(sender, peer_ip, port)
            self._update_from_header(sender, meta)
            self._process_gossip(sender, meta.get("gossip"), now_ms)
        return self.make_ping(sender)

    def _update_address(self, node: Node, ip: str, port: int) -> None:
        """A known node pings us from another address: it was restarted elsewhere
        (Redis' nodeUpdateAddressIfNeeded). The port is its own word; the source IP
        only counts while we cannot reach it where we thought (multi-homed hosts
        may ping from another interface than the one they are reached on)."""
        if port == node.port and (ip == node.ip or node.link_up or not valid_ip(ip)):
            return
        node.ip, node.port = (ip if valid_ip(ip) else node.ip), port
        node.noaddr = False
        self.dirty = True  # the bus redials: its link no longer matches the address

    def on_pong(self, node: Node, meta: dict[str, Any], now_ms: int) -> list[Action]:
        """A PONG on our outbound link to ``node``."""
        sender_id, port = _sender(meta)
        if sender_id is None or self.nodes.get(node.node_id) is not node:
            return []
        if node.handshake:
            if not self._finish_handshake(node, sender_id, now_ms):
                return []
        elif sender_id != node.node_id:
            # Someone else answers at this address now (it was reset): the entry
            # is stale, stop using the address (Redis marks it noaddr as well).
            node.noaddr = True
            self.dirty = True
            return [DropLink(node)]
        was_linked = node.linked
        node.pong_received_ms = now_ms
        if node.linked and not was_linked:
            self.dirty = True  # the first PONG on this link: the workers may use it
        node.ping_sent_ms = 0
        if node.pfail or node.fail:
            node.pfail = node.fail = False
            node.fail_reports.clear()
            self.dirty = True
        self._update_from_header(node, meta)
        self._process_gossip(node, meta.get("gossip"), now_ms)
        return []

    def on_fail(self, sender_id: str, meta: dict[str, Any], now_ms: int) -> None:
        """FAIL from a known node: trust it, as Redis does."""
        sender = self.nodes.get(sender_id)
        target = self.nodes.get(str(meta.get("id", "")))
        if sender is None or sender.handshake or target is None or target.myself:
            return
        if not target.fail:
            target.fail = True
            target.pfail = False
            self.dirty = True

    # ---- time ----------------------------------------------------------------

    def tick(self, now_ms: int) -> list[Action]:
        """Periodic work: PINGs due, handshakes expired, PFAIL/FAIL, stuck links."""
        actions: list[Action] = []
        self._expire_bans(now_ms)
        interval = self.ping_interval_ms()
        for node in list(self.others()):
            if node.noaddr:
                continue
            if node.handshake and now_ms - node.ctime_ms > max(handshake_timeout_ms_min,
                                                                self.node_timeout_ms):
                self._delete(node)
                continue
            if self._link_stuck(node, now_ms):
                actions.append(DropLink(node))
            if now_ms - node.last_ping_ms >= interval:
                actions.append(self.ping(node, now_ms))
            self._check_pfail(node, now_ms, actions)
        return actions

    def ping(self, node: Node, now_ms: int) -> Ping:
        """Record a PING as sent (even when the link is down: that is what makes an
        unreachable node PFAIL) and ask the I/O side to send it."""
        node.last_ping_ms = now_ms
        if node.ping_sent_ms == 0:
            node.ping_sent_ms = now_ms
        return Ping(node, node.meet)

    def _link_stuck(self, node: Node, now_ms: int) -> bool:
        half = self.node_timeout_ms // 2
        return (node.link_up and node.ping_sent_ms != 0 and now_ms - node.ping_sent_ms > half
                and now_ms - node.link_ctime_ms > half)

    def _check_pfail(self, node: Node, now_ms: int, actions: list[Action]) -> None:
        if node.handshake or node.ping_sent_ms == 0:
            return
        if not node.pfail and not node.fail and now_ms - node.ping_sent_ms > self.node_timeout_ms:
            node.pfail = True
            self.dirty = True
        if node.pfail:
            self._fail_if_quorum(node, now_ms, actions)

    def _fail_if_quorum(self, node: Node, now_ms: int, actions: list[Action]) -> None:
        validity_ms = self.node_timeout_ms * fail_report_validity_mult
        for reporter, when in list(node.fail_reports.items()):
            if now_ms - when > validity_ms or reporter not in self.nodes:
                del node.fail_reports[reporter]
        needed = self.size() // 2 + 1
        if len(node.fail_reports) + 1 < needed:
            return
        node.pfail = False
        node.fail = True
        self.dirty = True
        actions.append(Broadcast("fail", {"id": node.node_id}))

    # ---- internals -----------------------------------------------------------

    def _start_handshake(self, ip: str, port: int, now_ms: int, meet: bool) -> Node | None:
        if any(n.handshake and n.ip == ip and n.port == port for n in self.others()):
            return None  # one handshake per address at a time, as Redis
        if len(self.nodes) >= nodes_max:
            return None
        node = Node(new_node_id(self.rng), ip, port, now_ms)
        node.handshake = True
        node.meet = meet
        self.nodes[node.node_id] = node
        return node

    def _finish_handshake(self, node: Node, real_id: str, now_ms: int) -> bool:
        """Rename a handshake node to its real ID; False when the entry was dropped."""
        known = self.nodes.get(real_id)
        if known is not None or (self._banned(real_id, now_ms) and not node.meet):
            self._delete(node)  # ourselves, a node we know, or one we were told to forget
            return False
        self.banned.pop(real_id, None)  # an explicit CLUSTER MEET lifts a FORGET ban (Redis)
        del self.nodes[node.node_id]
        node.node_id = real_id
        node.handshake = False
        node.meet = False
        self.nodes[real_id] = node
        self.dirty = True
        return True

    def _update_from_header(self, node: Node, meta: dict[str, Any]) -> None:
        hv = meta.get("hv")
        if hv is not None:  # (a peer of an older version sends none: take its word)
            version = (hv[0], hv[1])
            mine = node.header_version
            if version[0] == mine[0] and version[1] < mine[1]:
                return  # older than a header we took already (it crossed on the other link)
            node.header_version = version
        leaving = bool(meta.get("leaving", False))
        if node.leaving != leaving:
            node.leaving = leaving
            self.dirty = True

    def _process_gossip(self, sender: Node, gossip: Any, now_ms: int) -> None:
        if not isinstance(gossip, list):
            return
        for entry in gossip[:gossip_entries_max]:
            parsed = _gossip_entry(entry)
            if parsed is None:
                continue
            node_id, ip, port, flags = parsed
            node = self.nodes.get(node_id)
            if node is not None:
                if node.myself:
                    continue
                if "fail?" in flags or "fail" in flags:
                    node.fail_reports[sender.node_id] = now_ms
                else:
                    node.fail_reports.pop(sender.node_id, None)
            elif not (self._banned(node_id, now_ms) or "noaddr" in flags
                      or "handshake" in flags):
                self._start_handshake(ip, port, now_ms, meet=False)

    def _banned(self, node_id: str, now_ms: int) -> bool:
        until = self.banned.get(node_id)
        return until is not None and until > now_ms

    def _expire_bans(self, now_ms: int) -> None:
        for node_id in [i for i, until in self.banned.items() if until <= now_ms]:
            del self.banned[node_id]

    def _delete(self, node: Node) -> None:
        self.nodes.pop(node.node_id, None)
        for other in self.nodes.values():
            other.fail_reports.pop(node.node_id, None)
        self.dirty = True

    # ---- persistence (nodes.conf, format and file I/O in bus/nodes_conf.py) ------

    def to_conf(self, vars_: dict[str, str] | None = None) -> NodesConf:
        """The table as nodes.conf holds it (handshakes are left out: they are
        retried from MEET or gossip, not from disk)."""
        me = _entry(self.myself)
        peers = [_entry(n) for n in self.others() if not n.handshake]
        return NodesConf(me, peers, dict(vars_ or {"currentEpoch": "0"}))

    def load_conf(self, nc: NodesConf, now_ms: int) -> None:
        """Peers from nodes.conf; our own entry there only restores ``leaving``."""
        self._set_my_leaving("leaving" in nc.myself.flags)
        for entry in nc.peers:
            if entry.node_id == self.my_id or not is_node_id(entry.node_id):
                continue
            if not 0 < entry.port <= client_port_max:
                continue
            node = Node(entry.node_id, entry.ip, entry.port, now_ms)
            node.leaving = "leaving" in entry.flags
            node.noaddr = "noaddr" in entry.flags
            self.nodes[node.node_id] = node
        self.dirty = False


def _entry(n: Node) -> NodeEntry:
    link = "connected" if n.myself or n.link_up else "disconnected"
    return NodeEntry(n.node_id, n.ip, n.port, n.flags() or ["noflags"], n.ping_sent_ms,
                     n.pong_received_ms, link)


def _sender(meta: dict[str, Any]) -> tuple[str | None, int]:
    sender_id = meta.get("id")
    port = meta.get("port")
    if not isinstance(sender_id, str) or not is_node_id(sender_id):
        return None, 0
    if not isinstance(port, int) or not 0 < port <= client_port_max:
        return None, 0
    return sender_id, port


def _gossip_entry(entry: Any) -> tuple[str, str, int, list[str]] | None:
    if not isinstance(entry, list) or len(entry) < 4:
        return None
    node_id, ip, port, flags = entry[:4]
    if not (isinstance(node_id, str) and is_node_id(node_id) and isinstance(ip, str)
            and valid_ip(ip) and isinstance(port, int) and 0 < port <= client_port_max
            and isinstance(flags, list)):
        return None
    return node_id, ip, port, [f for f in flags if isinstance(f, str)]


# ---- replies built from a snapshot (any worker can answer from one) -----------

def snapshot(m: Membership, wall_offset_ms: int = 0) -> dict[str, Any]:
    """The view other workers get over the mesh: enough for HELLO, CLUSTER NODES
    and INFO, and for the shard's peer list. Plain JSON-able data. The table may
    run on a monotonic clock; ``wall_offset_ms`` turns its times into epoch ms."""

    def wall(t: int) -> int:
        return t + wall_offset_ms if t else 0

    return {
        "myid": m.my_id,
        "leaving": m.myself.leaving,
        "size": m.size(),
        "sent": m.stats_sent,
        "received": m.stats_received,
        "nodes": [[n.node_id, n.ip, n.port, n.flags(), wall(n.ping_sent_ms),
                   wall(n.pong_received_ms), n.myself or n.link_up] for n in _ordered(m)],
        # other nodes our outbound link to has carried a PONG (Node.linked)
        "linked": sorted(n.node_id for n in m.others() if n.linked),
    }


def _ordered(m: Membership) -> list[Node]:
    return [m.myself] + sorted(m.others(), key=lambda n: n.node_id)


def nodes_text(view: dict[str, Any]) -> str:
    lines = []
    for node_id, ip, port, flags, ping_ms, pong_ms, link in view["nodes"]:
        state = "connected" if link else "disconnected"
        lines.append(f"{node_id} {ip}:{port} {','.join(flags) or 'noflags'} {ping_ms} "
                     f"{pong_ms} {state}\n")
    return "".join(lines)


def _healthy(flags: list[str]) -> bool:
    return not any(f in flags for f in ("fail?", "fail", "handshake", "noaddr"))


def info_text(view: dict[str, Any]) -> str:
    nodes = view["nodes"]
    reachable = sum(1 for n in nodes if "myself" not in n[3] and _healthy(n[3]))
    return (f"cluster_state:ok\r\ncluster_known_nodes:{len(nodes)}\r\n"
            f"cluster_reachable_nodes:{reachable}\r\ncluster_size:{view['size']}\r\n"
            f"cluster_stats_messages_sent:{view['sent']}\r\n"
            f"cluster_stats_messages_received:{view['received']}\r\n")


def priority(flags: list[str]) -> int:
    if "leaving" in flags:
        return priority_leaving
    return priority_ok if _healthy(flags) else priority_unreachable


def hello_reply(view: dict[str, Any]) -> list[Any]:
    """HELLO: version 1, our ID, then [id, ip, port, priority] per node (handshakes
    are not nodes yet and are left out, as Disque does)."""
    out: list[Any] = [1, view["myid"].encode()]
    for node_id, ip, port, flags, *_ in view["nodes"]:
        if "handshake" in flags:
            continue
        out.append([node_id.encode(), ip.encode(), str(port).encode(),
                    str(priority(flags)).encode()])
    return out


class Peer:
    """What the shard needs to know about another node."""

    __slots__ = ("node_id", "reachable", "leaving", "linked")

    def __init__(self, node_id: str, reachable: bool, leaving: bool,
                 linked: bool | None = None) -> None:
        self.node_id = node_id
        self.reachable = reachable
        self.leaving = leaving
        # a message to it is written now (Node.linked); reachable, without a link,
        # means failure detection has not noticed a lost link yet
        self.linked = reachable if linked is None else linked

    def __repr__(self) -> str:
        return (f"Peer({self.node_id[:8]} reachable={self.reachable} leaving={self.leaving}"
                f" linked={self.linked})")


def peers(view: dict[str, Any]) -> list[Peer]:
    """Every other known node (handshakes excluded), sorted by ID. A view without
    ``linked`` (built by hand) counts every reachable node as linked."""
    linked = view.get("linked")
    have = set(linked) if isinstance(linked, list) else None
    out = []
    for node_id, _ip, _port, flags, *_ in view["nodes"]:
        if "myself" in flags or "handshake" in flags:
            continue
        reachable = _healthy(flags)
        out.append(Peer(node_id, reachable, "leaving" in flags,
                        None if have is None else reachable and node_id in have))
    return out
