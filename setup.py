"""Build of disque-mp: the shard's state machine (``workers/``) compiled with mypyc.

mypyc (part of mypy, already a dependency) turns the typed, pure modules of
``workers/`` into C extension modules: the same source, about twice as fast
(per-job Python in the shard was the measured limit). Nothing here is
required: with ``DISQUE_MP_PURE=1`` in the environment, or without mypyc, the
package installs as plain Python and behaves the same.

``make`` builds them in place (``setup.py build_ext --inplace``) so the source
tree, the tests and ``make run`` all use the compiled modules; see
``disque_mp/compiled.py`` for the check that they are not older than their source.
"""

from __future__ import annotations

import os
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
# Twice: mypy (mypyc's type check) takes sys.path minus its first entry as the installed
# packages' path, and that is where it must find the tree's own packages (disque_mp, bus,
# workers), as it does under `python setup.py` (sys.path[0] is this directory already).
# Under pip's PEP 517 hook sys.path[0] is pip's own directory: with the tree only at
# sys.path[0], mypy dropped it, checked the uncompiled modules that the compiled ones
# import (the command table) as sources, and failed on their import cycle
# ("Cannot determine type of cmd_ackjob"), so `pip install .` did not build.
sys.path[:0] = [ROOT, ROOT]
from disque_mp.compiled import COMPILED_MODULES  # noqa: E402


def ext_modules() -> list:
    if os.environ.get("DISQUE_MP_PURE"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        return []
    paths = [name.replace(".", "/") + ".py" for name in COMPILED_MODULES]
    # The group library inside a package (disque_mp/_native__mypyc.*.so): importable
    # wherever the package is, not only with the source root on sys.path.
    return mypycify(paths, opt_level="3", group_name="disque_mp._native")


setup(ext_modules=ext_modules())
