"""Which modules are compiled with mypyc, and whether they are current.

``setup.py`` compiles ``COMPILED_MODULES`` (``make`` does it in place). A module
imported from its extension is compiled; one whose extension is older than its
``.py`` would silently run old code, so the node logs it at start and the test
suite refuses to run (``make`` rebuilds).

Compiled: the shard (``workers/``) and the per-command path of the front end.
Kept out: ``workers.replies`` and ``workers.invariant`` (subclasses of ``str`` and
``RuntimeError``, which mypyc's native classes cannot be; tiny), and everything
that runs once per connection, per second or per admin command (config, INFO,
AOF, the bus): no measurable gain there, and mypyc checks every annotation at
run time, so a module is compiled only where the tests exercise it thoroughly.
"""

from __future__ import annotations

import importlib
import os

COMPILED_MODULES = (
    "workers.shard",
    "workers.cluster",
    "workers.job",
    "workers.queue",
    "workers.ids",
    "workers.effects",
    "workers.evict",
    # the front end's per-command path: RESP, connections, ADDJOB/GETJOB parsing, the worker
    "disque_mp.resp",
    "disque_mp.server",
    "disque_mp.cmd_jobs",
    "disque_mp.worker",
)


def status() -> dict[str, list[str]]:
    """``compiled``: modules running from an extension; ``pure``: from source;
    ``stale``: compiled from an older version of their source."""
    out: dict[str, list[str]] = {"compiled": [], "pure": [], "stale": []}
    for name in COMPILED_MODULES:
        mod = importlib.import_module(name)
        path = getattr(mod, "__file__", None) or ""
        if path.endswith(".py"):
            out["pure"].append(name)
            continue
        out["compiled"].append(name)
        src = os.path.join(os.path.dirname(path), name.rsplit(".", 1)[1] + ".py")
        try:
            if os.path.getmtime(src) > os.path.getmtime(path):
                out["stale"].append(name)
        except OSError:
            pass  # installed without its source: nothing to compare
    return out


def summary() -> str:
    """One word for INFO and the start-up log: ``mypyc``, ``pure``, ``mixed`` or ``stale``."""
    st = status()
    if st["stale"]:
        return "stale"
    if not st["pure"]:
        return "mypyc"
    return "pure" if not st["compiled"] else "mixed"
