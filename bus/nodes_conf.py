"""``nodes.conf``: the node's identity and the cluster membership it knows.

The node ID (40 hex chars) is created once and kept here, inside ``dir``, so a
node restarted with the same config (even after SIGKILL) returns with the same
ID and peers. The format is Disque's (one line per node, the CLUSTER NODES
shape) plus a ``vars`` line that carries the format version:

    # disque-mp cluster state (written by the node; do not edit while it runs)
    8fbfc3790ad6159886749a7241c766307c8fe7e5 127.0.0.1:7711 myself 0 0 connected
    8e0f8eae7bead44411d606e5776dd32b4da6cc92 127.0.0.1:7712 noflags 0 0 connected
    vars format 1 currentEpoch 0

A node line is ``<id> <ip>:<port> <flags,comma,separated> <ping_sent_ms>
<pong_recv_ms> <link-state>``; exactly one carries the ``myself`` flag.
``vars`` holds key/value pairs; the cluster work may add keys (readers keep
the ones they do not know) and must bump ``format`` for incompatible changes.
Writes go to a temp file, fsync, rename, fsync of the directory: a crash
leaves either the old or the new file, never a torn one.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from bus.durable import write_atomic

FORMAT_VERSION = 1
HEADER = "# disque-mp cluster state (written by the node; do not edit while it runs)"
_ID_RE = re.compile(r"^[0-9a-f]{40}$")
nodes_conf_bytes_max = 64 << 20  # thousands of peers fit in far less; refuse junk


class NodesConfError(Exception):
    """A corrupt or unsupported nodes.conf: refuse to start rather than invent an ID."""


@dataclass(slots=True)
class NodeEntry:
    node_id: str
    ip: str
    port: int
    flags: list[str] = field(default_factory=lambda: ["noflags"])
    ping_sent_ms: int = 0
    pong_recv_ms: int = 0
    link_state: str = "connected"

    @property
    def myself(self) -> bool:
        return "myself" in self.flags

    def line(self) -> str:
        flags = ",".join(self.flags) or "noflags"
        return (f"{self.node_id} {self.ip}:{self.port} {flags} "
                f"{self.ping_sent_ms} {self.pong_recv_ms} {self.link_state}")


@dataclass(slots=True)
class NodesConf:
    myself: NodeEntry
    peers: list[NodeEntry] = field(default_factory=list)
    vars: dict[str, str] = field(default_factory=lambda: {"currentEpoch": "0"})
    version: int = FORMAT_VERSION

    @property
    def node_id(self) -> str:
        return self.myself.node_id


def new_node_id() -> str:
    """40 hex chars from the OS CSPRNG, as Disque's getRandomHexChars."""
    return os.urandom(20).hex()


def _parse_node(words: list[str]) -> NodeEntry:
    if len(words) != 6:
        raise ValueError(f"a node line has 6 fields, got {len(words)}")
    node_id, addr, flags, ping, pong, link = words
    if not _ID_RE.match(node_id):
        raise ValueError(f"bad node ID {node_id!r}")
    ip, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"bad address {addr!r}")
    return NodeEntry(node_id, ip, int(port), flags.split(","), int(ping), int(pong), link)


def _parse_vars(words: list[str]) -> dict[str, str]:
    if len(words) % 2 == 0:
        raise ValueError("vars needs key value pairs")
    return dict(zip(words[1::2], words[2::2], strict=True))


def parse(text: str) -> NodesConf:
    """Parse nodes.conf text; NodesConfError names the line."""
    nodes: list[NodeEntry] = []
    vars_: dict[str, str] = {}
    for no, raw in enumerate(text.splitlines(), 1):
        words = raw.split()
        if not words or words[0].startswith("#"):
            continue
        try:
            if words[0] == "vars":
                vars_.update(_parse_vars(words))
            else:
                nodes.append(_parse_node(words))
        except ValueError as e:
            raise NodesConfError(f"corrupted cluster config file, line {no}: {e}") from None
    return _assemble(nodes, vars_)


def _assemble(nodes: list[NodeEntry], vars_: dict[str, str]) -> NodesConf:
    version_text = vars_.pop("format", "1")  # Disque's own files have no format var
    if not version_text.isdigit():
        raise NodesConfError(f"corrupted cluster config file: format {version_text!r}")
    version = int(version_text)
    if version > FORMAT_VERSION:
        raise NodesConfError(
            f"nodes.conf format {version} is newer than this disque-mp reads ({FORMAT_VERSION})")
    mine = [n for n in nodes if n.myself]
    if len(mine) != 1:
        raise NodesConfError(
            f"corrupted cluster config file: {len(mine)} 'myself' nodes, expected 1")
    peers = [n for n in nodes if not n.myself]
    return NodesConf(mine[0], peers, vars_ or {"currentEpoch": "0"}, FORMAT_VERSION)


def render(nc: NodesConf) -> str:
    vars_line = " ".join(["vars", "format", str(nc.version),
                          *(f"{k} {v}" for k, v in nc.vars.items())])
    lines = [HEADER, nc.myself.line(), *(p.line() for p in nc.peers), vars_line]
    return "\n".join(lines) + "\n"


def load(path: str) -> NodesConf | None:
    """The saved state, or None when there is none yet (missing or empty file)."""
    try:
        with open(path, "rb") as f:
            data = f.read(nodes_conf_bytes_max + 1)
    except FileNotFoundError:
        return None
    if len(data) > nodes_conf_bytes_max:
        raise NodesConfError(f"{path} is larger than {nodes_conf_bytes_max} bytes")
    text = data.decode("utf-8", errors="replace")
    if not text.strip():
        return None
    return parse(text)


def save(path: str, nc: NodesConf) -> None:
    """Write atomically: temp file, fsync, rename over, fsync the directory."""
    write_atomic(path, render(nc).encode(), 0o600)  # our node ID: no other user's business


def load_or_create(path: str, ip: str, port: int) -> tuple[NodesConf, bool]:
    """Our identity: the saved one (address refreshed) or a new one, saved.

    Returns (state, created). A corrupt file raises NodesConfError: a node that
    silently took a new ID would look like a new node to its peers.
    """
    nc = load(path)
    if nc is None:
        nc = NodesConf(NodeEntry(new_node_id(), ip, port, ["myself"]))
        save(path, nc)
        return nc, True
    if (nc.myself.ip, nc.myself.port) != (ip, port):
        nc.myself.ip, nc.myself.port = ip, port
        save(path, nc)
    return nc, False
