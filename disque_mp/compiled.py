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

import importlib.util
import os
import sys

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


def _origin(name: str) -> str:
    """The file the import system loads ``name`` from (a compiled module's own
    ``__file__`` depends on the order the group's modules were first imported)."""
    spec = importlib.util.find_spec(name)
    return (spec.origin or "") if spec is not None else ""


def status() -> dict[str, list[str]]:
    """``compiled``: modules running from an extension; ``pure``: from source;
    ``stale``: compiled from an older version of their source."""
    out: dict[str, list[str]] = {"compiled": [], "pure": [], "stale": []}
    for name in COMPILED_MODULES:
        path = _origin(name)
        if not path or path.endswith(".py"):
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


def main(argv: list[str]) -> int:
    """``python -m disque_mp.compiled [touch]``: print the build; ``touch`` marks the
    extensions just built as current (make runs it after building)."""
    if argv[:1] == ["touch"]:
        for name in COMPILED_MODULES:
            path = _origin(name)
            if path and not path.endswith(".py"):
                os.utime(path)
    print(summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
