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
