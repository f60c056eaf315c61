"""Which modules are compiled with mypyc, and whether they are current.

``setup.py`` compiles ``COMPILED_MODULES`` (``make`` does it in place, then records
the digest of every compiled source in ``.native-stamp.json``). A module imported
from its extension is compiled; one whose source changed since the build would
silently run old code, so the node logs it at start and the test suite refuses
to run (``make`` rebuilds). ``DISQUE_MP_PURE=1`` in the environment runs the plain
Python instead (``force_pure``), extensions or not.

Compiled: the shard (``workers/``), the per-command path of the front end and
the cluster bus's per-frame path (frames, messages, the host bus, the agent, the
data link). Kept out: ``workers.replies`` and ``workers.invariant`` (subclasses of
``str`` and ``RuntimeError``, which mypyc's native classes cannot be; tiny), and
everything that runs once per connection, per second or per admin command (config,
INFO, AOF, the bus's membership and handshakes): no measurable gain there, and mypyc checks every annotation at
run time, so a module is compiled only where the tests exercise it thoroughly.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import json
import os
import sys
from typing import Any

COMPILED_MODULES = (
    "workers.shard",
    "workers.core",
    "workers.lifecycle",
    "workers.pause",
    "workers.persistence",
    "workers.replication",
    "workers.ackgc",
    "workers.views",
    "workers.federation",
    "workers.extensions",
    "workers.dedup",
    "workers.results",  # a part of the shard: subclasses the compiled core's Events
    "workers.job",
    "workers.queue",
    "workers.lanes",
    "workers.ids",
    "workers.effects",
    "workers.evict",
    "workers.timers",
    # the front end's per-command path: RESP, connections, ADDJOB/GETJOB parsing, the
    # worker, its shared base (core) and its parts (the router, the owner side, the
    # asking side, the mesh serving, the handoff, GETJOB coordination)
    "disque_mp.node.resp",
    "disque_mp.node.core",
    "disque_mp.node.connection",
    "disque_mp.node.commands.jobs",
    "disque_mp.node.worker",
    "disque_mp.node.router",
    "disque_mp.node.owner",
    "disque_mp.node.forward",
    "disque_mp.node.peers",
    "disque_mp.node.handoff",
    "disque_mp.node.getjob",
    "disque_mp.node.hints",  # the empty-queue hints a GETJOB reads per remote owner
    "bus.clock",  # read once per client read: a Python-level call otherwise
    "bus.mesh",  # the worker mesh: every forwarded command's batch, frame and relay
    # the cluster bus's per-frame path: framing (also the worker mesh's), the checks at
    # the edge and the catalogue they read, the links, the bus, the agent, the data links
    "bus.frames",
    "bus.messages",
    "workers.messages",
    "bus.hostbus",
    "bus.agent",
    "bus.datalink",
)


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Loads the listed modules from their ``.py`` even where an extension sits beside it."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in COMPILED_MODULES:
            return None
        leaf = fullname.rsplit(".", 1)[1] + ".py"
        for entry in path if path is not None else sys.path:
            src = os.path.join(entry or ".", leaf)
            if os.path.isfile(src):
                return importlib.util.spec_from_file_location(fullname, src)
        return None


def force_pure() -> None:
    """Run the plain Python of every listed module (``DISQUE_MP_PURE=1``): to test the
    source as written, or to rule the compiled build out. Call before they are imported."""
    if not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFinder())


def _origin(name: str) -> str:
    """The file the import system loads ``name`` from (a compiled module's own
    ``__file__`` depends on the order the group's modules were first imported)."""
    spec = importlib.util.find_spec(name)
    return (spec.origin or "") if spec is not None else ""


STAMP = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".native-stamp.json")


def _source_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha1(f.read()).hexdigest()


def _source_of(name: str, ext_path: str) -> str:
    return os.path.join(os.path.dirname(ext_path), name.rsplit(".", 1)[1] + ".py")


def status() -> dict[str, list[str]]:
    """``compiled``: modules running from an extension; ``pure``: from source;
    ``stale``: compiled from another version of their source (judged from the
    digests ``stamp`` recorded at the build; a wheel has no stamp, nothing to judge)."""
    out: dict[str, list[str]] = {"compiled": [], "pure": [], "stale": []}
    try:
        with open(STAMP) as f:
            stamp: dict[str, str] = json.load(f)
    except (OSError, ValueError):
        stamp = {}
    for name in COMPILED_MODULES:
        path = _origin(name)
        if not path or path.endswith(".py"):
            out["pure"].append(name)
            continue
        out["compiled"].append(name)
        if stamp:
            try:
                if stamp.get(name) != _source_digest(_source_of(name, path)):
                    out["stale"].append(name)
            except OSError:
                pass  # no source beside the extension: nothing to compare
    return out


def stamp() -> None:
    """Record the digest of each compiled module's source (make runs it after a build)."""
    digests = {}
    for name in COMPILED_MODULES:
        path = _origin(name)
        if path and not path.endswith(".py"):
            digests[name] = _source_digest(_source_of(name, path))
    with open(STAMP, "w") as f:
        json.dump(digests, f, indent=1, sort_keys=True)


def summary() -> str:
    """One word for INFO and the start-up log: ``mypyc``, ``pure``, ``mixed`` or ``stale``."""
    st = status()
    if st["stale"]:
        return "stale"
    if not st["pure"]:
        return "mypyc"
    return "pure" if not st["compiled"] else "mixed"


def main(argv: list[str]) -> int:
    """``python -m disque_mp.compiled [stamp]``: print the build; ``stamp`` records the
    sources the extensions were just built from (make runs it after building)."""
    if argv[:1] == ["stamp"]:
        stamp()
    print(summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
