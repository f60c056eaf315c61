"""Build of disque-mp: the shard's state machine (``workers/``) compiled with mypyc.

mypyc (part of mypy, already a dependency) turns the typed, pure modules of
``workers/`` into C extension modules: the same source, about twice as fast
(per-job Python in the shard was the measured limit). Nothing here is
required: with ``DISQUE_MP_PURE=1`` in the environment, or without mypyc, the
package installs as plain Python and behaves the same.

``make`` builds them in place (``setup.py build_ext --inplace``) so the source
tree, the tests and ``make run`` all use the compiled modules; see
``disque_mp/compiled.py`` for the check that they are not older than their source.

The C build uses every core: mypyc writes one C file per module (``multi_file``)
and ``ParallelBuildExt`` runs one gcc per file, ``MYPYC_JOBS`` at a time (default:
the CPUs this process may use). A file whose object is newer than it and than the
group's headers is not compiled again (mypyc rewrites only the C files whose text
changed), so a rebuild after an edit compiles the edited modules only, unless the
edit changed a type the other modules see. ``MYPYC_OPT_LEVEL`` (default 3) is gcc's
``-O`` level: ``MYPYC_OPT_LEVEL=0`` builds several times faster, for a quick look.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

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


def build_jobs() -> int:
    """gcc processes at once: MYPYC_JOBS, else every CPU this process may run on."""
    wanted = os.environ.get("MYPYC_JOBS", "")
    if wanted.isdigit() and int(wanted) > 0:
        return int(wanted)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# The group library inside a package (disque_mp/_native__mypyc.*.so): importable
# wherever the package is, not only with the source root on sys.path.
GROUP = "disque_mp._native"


def opt_level() -> str:
    return os.environ.get("MYPYC_OPT_LEVEL", "3")


def ext_modules() -> list:
    if os.environ.get("DISQUE_MP_PURE"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        return []
    paths = [name.replace(".", "/") + ".py" for name in COMPILED_MODULES]
    extensions = mypycify(paths, opt_level=opt_level(), multi_file=True, group_name=GROUP)
    # multi_file writes a C file per module in build/ but the group's headers beside its
    # own C file, in build/disque_mp/, which its include path leaves out
    headers = os.path.join("build", *GROUP.split(".")[:-1])
    for ext in extensions:
        ext.include_dirs.append(headers)
    return extensions


def _up_to_date(obj: str, src: str, depends: list[str]) -> bool:
    try:
        built = os.stat(obj).st_mtime
        return all(os.stat(p).st_mtime <= built for p in (src, *depends))
    except OSError:
        return False


class ParallelBuildExt(build_ext):
    """setuptools compiles the sources of one extension one after the other; mypyc's
    group library is one extension of many C files. Here they compile side by side,
    each skipped when its object is current."""

    def finalize_options(self) -> None:
        super().finalize_options()
        # objects of another -O level are never taken for current ones
        self.build_temp = os.path.join(self.build_temp, "O" + opt_level())

    def build_extension(self, ext: Any) -> None:
        compiler = self.compiler
        serial = compiler.compile
        jobs = build_jobs()

        def compile_all(sources: list[str], output_dir: str | None = None, *args: Any,
                        **kw: Any) -> list[str]:
            outdir = output_dir if output_dir is not None else compiler.output_dir or ""
            objects = compiler.object_filenames(sources, strip_dir=False, output_dir=outdir)
            depends = list(kw.get("depends") or ext.depends or [])
            todo = [s for s, o in zip(sources, objects, strict=True)
                    if not _up_to_date(o, s, depends)]
            for obj in objects:  # before the threads: distutils' mkpath keeps a cache
                compiler.mkpath(os.path.dirname(obj))
            with ThreadPoolExecutor(max(1, min(jobs, len(todo)))) as pool:
                for _ in pool.map(lambda s: serial([s], output_dir, *args, **kw), todo):
                    pass
            return objects

        compiler.compile = compile_all
        try:
            super().build_extension(ext)
        finally:
            compiler.compile = serial


setup(ext_modules=ext_modules(), cmdclass={"build_ext": ParallelBuildExt})
