"""Session checks shared by every test directory, and the real-node fixtures
(tests/nodeproc.py) of the node, bus and client tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from disque_mp import compiled  # DISQUE_MP_PURE=1 installs the source finder here
from tests.nodeproc import NodeProc


def pytest_sessionstart(session: pytest.Session) -> None:
    # A compiled module whose source changed since the build would test old code.
    stale = compiled.status()["stale"]
    if stale:
        raise pytest.UsageError(
            f"compiled modules built from another version of their source: {', '.join(stale)}; "
            "run `make compile` (or `make pure` to test the plain Python)")


# make test runs the files in parallel (pytest-xdist, `-n 4 --dist loadfile`): a file
# goes to one worker whole (its module-scoped node stays one per file), except these
# directories, whose files go to one worker together: the Spark tests share one
# session-scoped SparkSession (a JVM per worker otherwise: with four, the JVMs' Python
# workers failed to connect back in time on a loaded host). A scheduler of our own
# because xdist's `loadgroup` (xdist_group marks) groups nothing under pytest 9: it
# renames item._nodeid, which pytest 9 no longer reads.
XDIST_SHARED_GROUPS = {"tests/spark/": "tests/spark/"}
# The longest files first (the units go out in collection order, with
# --no-loadscope-reorder): started last, one of them would run alone at the end.
LONG_FIRST = ("tests/spark/", "tests/bench/test_instructions.py", "tests/bench/test_front_read.py",
              "tests/brokers/test_proof.py", "tests/bus/test_frames_fuzz.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(LONG_FIRST))  # stable


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own for every other mode
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        """loadfile, with each of XDIST_SHARED_GROUPS one unit."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return next((g for p, g in XDIST_SHARED_GROUPS.items() if path.startswith(p)), path)

    return FileScheduling(config, log)


def pytest_report_header(config: pytest.Config) -> str:
    return f"shard modules: {compiled.summary()}"


@pytest.fixture(params=[1, 2], ids=["1worker", "2workers"])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NodeProc]:
    with NodeProc(tmp_path / "node", workers=request.param) as n:
        yield n


@pytest.fixture
def node2(tmp_path: Path) -> Iterator[NodeProc]:
    with NodeProc(tmp_path / "node2", workers=2) as n:
        yield n
