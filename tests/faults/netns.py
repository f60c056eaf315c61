"""A private network for fault tests: one network namespace per node, a bridge.

    with Net(3) as net:                  # namespaces, veth pairs, bridge, addresses
        net.exec_prefix(0)               # ["ip", "netns", "exec", <ns of node 0>]
        net.ip(0), net.host_ip           # node 0's address; the bridge's (clients)
        net.cut(0, 1)                    # node 0 and node 1 no longer reach each other
        net.heal()                       # every cut removed

Every node sits in its own namespace with one veth interface (``eth0``) whose
peer is a port of a bridge in the root namespace; the bridge has an address
too, so clients run from the root namespace and reach every node whatever
the partition. A cut is a pair of blackhole routes, one in each node's
namespace: packets between the two nodes are dropped silently (the way a
broken switch or a firewall drops them), while both still answer clients.

Names carry a random suffix (namespaces ``dqf<hex>-n<i>``, bridge
``dqf<hex>br``) and the /24 is picked among 10.231.0.0/16 networks no
interface of this host uses, so parallel runs do not collide. ``destroy()``
kills what still runs in the namespaces and deletes them and the bridge; it
runs on ``__exit__``, at interpreter exit and is safe to call twice.
"""

from __future__ import annotations

import atexit
import os
import random
import secrets
import shutil
import signal
import subprocess
import time
from types import TracebackType

ip_timeout_s = 20.0  # one `ip` command; a loaded host can be slow, never hangs forever
subnet_tries_max = 200  # random /24s tried before giving up
name_prefix = "dqf"


class NetError(RuntimeError):
    pass


def missing_requirements() -> str | None:
    """Why network namespaces cannot be used here, None when they can."""
    if os.geteuid() != 0:
        return "fault tests need root (network namespaces, veth pairs, a bridge)"
    if shutil.which("ip") is None:
        return "fault tests need iproute2's `ip` command"
    probe = f"{name_prefix}{secrets.token_hex(3)}-probe"
    try:
        _ip("netns", "add", probe)
    except NetError as e:
        return f"`ip netns add` does not work here: {e}"
    try:
        _ip("netns", "del", probe)
    except NetError:
        pass
    return None


def _ip(*args: str, check: bool = True) -> str:
    try:
        res = subprocess.run(["ip", *args], capture_output=True, text=True,
                             timeout=ip_timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetError(f"ip {' '.join(args)}: {e}") from e
    if check and res.returncode != 0:
        raise NetError(f"ip {' '.join(args)}: {res.stderr.strip()}")
    return res.stdout


def _used_24s() -> set[str]:
    """The 10.231.x prefixes some interface of this host already has."""
    used = set()
    for line in _ip("-4", "-o", "addr", "show").splitlines():
        for word in line.split():
            if word.startswith("10.231."):
                used.add(".".join(word.split(".")[:3]))
    return used


class Net:
    def __init__(self, count: int, rng: random.Random | None = None) -> None:
        self.count = count
        self.tag = f"{name_prefix}{secrets.token_hex(3)}"
        self.bridge = f"{self.tag}br"
        rng = rng or random.Random()
        used = _used_24s()
        for _ in range(subnet_tries_max):
            prefix = f"10.231.{rng.randrange(1, 255)}"
            if prefix not in used:
                break
        else:
            raise NetError("no free 10.231.x.0/24 network")
        self.prefix = prefix
        self.host_ip = f"{prefix}.254"
        self.created_ns: list[str] = []
        self.bridge_created = False
        self.cuts: set[tuple[int, int]] = set()

    def ns(self, i: int) -> str:
        return f"{self.tag}-n{i}"

    def ip(self, i: int) -> str:
        return f"{self.prefix}.{i + 1}"

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns(i)]

    def create(self) -> Net:
        atexit.register(self.destroy)
        _ip("link", "add", self.bridge, "type", "bridge")
        self.bridge_created = True
        _ip("addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(self.count):
            ns, host_end, node_end = self.ns(i), f"{self.tag}h{i}", f"{self.tag}p{i}"
            _ip("netns", "add", ns)
            self.created_ns.append(ns)
            _ip("link", "add", host_end, "type", "veth", "peer", "name", node_end)
            _ip("link", "set", node_end, "netns", ns)
            _ip("link", "set", host_end, "master", self.bridge)
            _ip("link", "set", host_end, "up")
            _ip("-n", ns, "link", "set", node_end, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        return self

    # -- partitions -----------------------------------------------------------

    def cut(self, a: int, b: int) -> None:
        """Nodes a and b drop each other's packets (both directions)."""
        key = (min(a, b), max(a, b))
        if a == b or key in self.cuts:
            return
        _ip("-n", self.ns(a), "route", "add", "blackhole", f"{self.ip(b)}/32")
        _ip("-n", self.ns(b), "route", "add", "blackhole", f"{self.ip(a)}/32")
        self.cuts.add(key)

    def partition(self, groups: list[list[int]]) -> None:
        """Cut every pair of nodes that are not in the same group."""
        where = {n: g for g, members in enumerate(groups) for n in members}
        for a in range(self.count):
            for b in range(a + 1, self.count):
                if where.get(a, -1 - a) != where.get(b, -1 - b):
                    self.cut(a, b)

    def heal(self) -> None:
        for ns in self.created_ns:
            _ip("-n", ns, "route", "flush", "type", "blackhole", check=False)
        self.cuts.clear()

    # -- teardown -------------------------------------------------------------

    def _kill_inside(self, ns: str) -> None:
        for _ in range(5):  # bounded: processes may fork while we look
            pids = [int(p) for p in _ip("netns", "pids", ns, check=False).split() if p.isdigit()]
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)

    def destroy(self) -> None:
        for ns in list(self.created_ns):
            self._kill_inside(ns)
            _ip("netns", "del", ns, check=False)  # takes its veth end and the peer
            self.created_ns.remove(ns)
        if self.bridge_created:
            _ip("link", "del", self.bridge, check=False)
            self.bridge_created = False
        atexit.unregister(self.destroy)

    def __enter__(self) -> Net:
        try:
            return self.create()
        except BaseException:
            self.destroy()
            raise

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.destroy()
