"""Which modules of ``workers/`` are compiled with mypyc, and whether they are current.

``setup.py`` compiles ``COMPILED_MODULES`` (``make`` does it in place). A module
imported from its extension is compiled; one whose extension is older than its
``.py`` would silently run old code, so the node logs it at start and the test
suite refuses to run (``make`` rebuilds).

Kept out of ``COMPILED_MODULES``: ``replies`` and ``invariant`` (subclasses of
``str`` and ``RuntimeError``, which mypyc's native classes cannot be; tiny) and
this module.
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
