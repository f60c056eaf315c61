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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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
