"""Session checks shared by every test directory, and the real-node fixtures
(tests/nodeproc.py) of the node, bus and client tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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


# make test runs the files in parallel (pytest-xdist, `--dist loadgroup`): every test
# gets its file as its xdist group (a file's module-scoped node stays one per file),
# except these directories, whose files go to one worker together: the Spark tests share
# one session-scoped SparkSession (a JVM per worker otherwise, and the JVMs' Python
# workers failed to connect back in time on a loaded host).
XDIST_SHARED_GROUPS = {"tests/spark/": "spark"}
# The longest files, first (with --no-loadscope-reorder the groups go out in this
# order): started last, one of them would run alone at the end.
LONG_FIRST = ("tests/spark/", "tests/bench/test_instructions.py", "tests/bench/test_front_read.py",
              "tests/brokers/test_proof.py", "tests/bus/test_frames_fuzz.py")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if item.get_closest_marker("xdist_group") is None:
            group = next((g for p, g in XDIST_SHARED_GROUPS.items() if path.startswith(p)), path)
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: not item.nodeid.startswith(LONG_FIRST))  # stable


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
