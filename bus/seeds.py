"""Joining by configuration: ``cluster-seeds host:port[,host:port...]``.

A node that knows no peer (no other node in its membership table, handshakes
aside) MEETs its seeds, as an operator's ``CLUSTER MEET`` would, and again after a
backoff (``seed_backoff_ms_min`` doubling up to ``seed_backoff_ms_max``) until one
answers; once a peer is known it stops, and it starts again (from the shortest
delay) if every peer is later forgotten (CLUSTER FORGET, CLUSTER RESET). A seed's
port is its client port, as CLUSTER MEET takes; its host is an IP or a name,
resolved at each attempt (a templated host's peers may not resolve yet).

``parse`` and ``Seeder`` are the pure rule (no clock, no socket: tests drive them
with a fake clock); ``SeedDialer`` is the I/O worker 0's cluster bus runs on each
tick: it resolves the seeds off the loop, skips the ones that are this node and
hands the rest to the bus's ``meet``. See docs/cluster.md, "Joining by
configuration".
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from bus.membership import Node, client_port_max

log = logging.getLogger("disque.cluster")

seeds_max = 64  # entries one cluster-seeds value may list
seed_host_bytes_max = 253  # a DNS name's longest text form
seed_backoff_ms_min = 1000  # the delay after a first attempt no seed answered ...
seed_backoff_ms_max = 30_000  # ... doubling up to this
resolve_timeout_s = 5.0  # one attempt's name resolution, all seeds together

_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")


class SeedError(ValueError):
    """A cluster-seeds value that cannot be used; the message says which entry and why."""


@dataclass(frozen=True, slots=True)
class Seed:
    host: str  # an IP or a name (IPv6 without its brackets)
    port: int  # the seed's client port

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _host_ok(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    if len(host.encode("utf-8", "surrogateescape")) > seed_host_bytes_max:
        return False
    return all(_LABEL.match(label) for label in host.rstrip(".").split("."))


def parse_entry(entry: str) -> Seed:
    """One ``host:port`` (``[v6]:port`` for an IPv6 address)."""
    if entry.startswith("["):
        close = entry.find("]")
        host, rest = entry[1:close], entry[close + 1:] if close > 0 else ""
        if close < 0 or not rest.startswith(":"):
            raise SeedError(f"cluster-seeds: '{entry}' is not [IPv6]:port")
        port_text = rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise SeedError(f"cluster-seeds: '{host}' in '{entry}' is not an IPv6 address") from None
    else:
        host, sep, port_text = entry.rpartition(":")
        if not sep or not host:
            raise SeedError(f"cluster-seeds: '{entry}' is not host:port")
        if ":" in host:
            raise SeedError(f"cluster-seeds: '{entry}': write an IPv6 address as [address]:port")
        if not _host_ok(host):
            raise SeedError(f"cluster-seeds: '{host}' in '{entry}' is neither an IP nor a host name")
    if not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5
            and 0 < int(port_text) <= client_port_max):
        raise SeedError(f"cluster-seeds: bad port '{port_text}' in '{entry}' (the client port, "
                        f"1-{client_port_max})")
    return Seed(host, int(port_text))


def parse(text: str) -> list[Seed]:
    """``host:port[,host:port...]`` (commas or spaces between entries) -> the seeds, in
    order, repeats dropped; "" -> []."""
    entries = [e for e in re.split(r"[\s,]+", text) if e]
    if len(entries) > seeds_max:
        raise SeedError(f"cluster-seeds: {len(entries)} entries, at most {seeds_max}")
    seeds: list[Seed] = []
    for entry in entries:
        seed = parse_entry(entry)
        if seed not in seeds:
            seeds.append(seed)
    return seeds


def normalize(text: str) -> str:
    """The value CONFIG GET shows: the entries as parsed, comma separated."""
    return ",".join(map(str, parse(text)))


def knows_peer(others: Iterable[Node]) -> bool:
    """A node other than us in the membership table (a handshake is not one yet)."""
    return any(not n.handshake for n in others)


def next_backoff_ms(last_ms: int) -> int:
    """The delay before the next attempt: the shortest first, doubling up to the longest."""
    return seed_backoff_ms_min if last_ms <= 0 else min(last_ms * 2, seed_backoff_ms_max)


class Seeder:
    """When to MEET which seeds: the pure rule, fed the time and whether a peer is known."""

    def __init__(self) -> None:
        self.text = ""  # the cluster-seeds value in effect
        self.seeds: list[Seed] = []
        self.next_ms = 0  # no attempt before this
        self.backoff_ms = 0  # the delay the last attempt set (0: none yet)
        self.seeking = False  # the last tick knew no peer
        self.attempts = 0  # attempts since seeking started
        self.last_outcome = ""

    def configure(self, text: str) -> None:
        """A (new) cluster-seeds value: a change starts over from the shortest delay.
        The value was checked when it was set (config.py): a bad one here is a bug."""
        if text != self.text:
            self.seeds = parse(text)
            self.text = text
            self.next_ms = self.backoff_ms = 0

    def due(self, now_ms: int, peer_known: bool) -> list[Seed]:
        """The seeds to MEET now ([] most ticks). A known peer stops seeding and resets
        the delay, so a node that later forgets every peer seeds again at once."""
        if not self.seeds:
            return []
        if peer_known:
            if self.seeking:
                self.seeking = False
                self.attempts = 0
                self.last_outcome = ""
                self.next_ms = self.backoff_ms = 0
                log.info("cluster-seeds: a peer is known, seeding stops")
            return []
        if not self.seeking:
            self.seeking = True
            log.info("cluster-seeds: no peer known, meeting the seeds %s", self.text)
        if now_ms < self.next_ms:
            return []
        self.backoff_ms = next_backoff_ms(self.backoff_ms)
        self.next_ms = now_ms + self.backoff_ms
        self.attempts += 1
        return list(self.seeds)

    def outcome(self, text: str) -> bool:
        """An attempt's outcome; True when it differs from the last one (log it at
        INFO: the same outcome every retry is logged at DEBUG)."""
        changed = text != self.last_outcome
        self.last_outcome = text
        return changed


def is_local(ip: str) -> bool:
    """An address of this host (one a socket may bind to)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


async def resolve(seed: Seed) -> str:
    """The seed's first address (getaddrinfo's order), off the loop; OSError when none."""
    try:
        return str(ipaddress.ip_address(seed.host))
    except ValueError:
        pass
    infos = await asyncio.get_running_loop().getaddrinfo(seed.host, seed.port,
                                                         type=socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"no address for {seed.host}")
    return str(infos[0][4][0])


class SeedDialer:
    """Worker 0's side: each bus tick asks the ``Seeder`` and, when seeds are due,
    resolves them in a task and MEETs those that are not this node."""

    def __init__(self, cfg: object, my_port: int) -> None:
        self.cfg = cfg  # read live: CONFIG SET cluster-seeds applies at the next tick
        self.my_port = my_port
        self.rule = Seeder()
        self.task: asyncio.Task[None] | None = None

    def tick(self, now_ms: int, others: Iterable[Node], meet: Callable[[str, int], object]) -> None:
        self.rule.configure(str(getattr(self.cfg, "cluster_seeds", "")))
        if not self.rule.seeds:
            return  # the default: nothing to do, not even a look at the table
        due = self.rule.due(now_ms, knows_peer(others))
        if due and (self.task is None or self.task.done()):
            self.task = asyncio.create_task(self.attempt(due, meet))

    async def attempt(self, due: list[Seed], meet: Callable[[str, int], object]) -> None:
        notes: list[str] = []
        met = 0
        for seed in due:
            try:
                ip = await asyncio.wait_for(resolve(seed), resolve_timeout_s)
            except (OSError, TimeoutError) as exc:
                notes.append(f"{seed} does not resolve ({exc or 'timeout'})")
                continue
            if seed.port == self.my_port and is_local(ip):
                notes.append(f"{seed} is this node")
                continue
            meet(ip, seed.port)
            met += 1
            notes.append(f"met {seed}" + ("" if ip == seed.host else f" ({ip})"))
        text = "; ".join(notes) + ("" if met else "; no seed to meet")
        level = logging.INFO if self.rule.outcome(text) else logging.DEBUG
        log.log(level, "cluster-seeds: attempt %d: %s; next in %d s unless one answers",
                self.rule.attempts, text, self.rule.backoff_ms // 1000)

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
