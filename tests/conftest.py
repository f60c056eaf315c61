"""Session checks shared by every test directory."""

from __future__ import annotations

import pytest

from disque_mp import compiled  # DISQUE_MP_PURE=1 installs the source finder here


def pytest_sessionstart(session: pytest.Session) -> None:
    # A compiled module whose source changed since the build would test old code.
    stale = compiled.status()["stale"]
    if stale:
        raise pytest.UsageError(
            f"compiled modules built from another version of their source: {', '.join(stale)}; "
            "run `make compile` (or `make pure` to test the plain Python)")


def pytest_report_header(config: pytest.Config) -> str:
    return f"shard modules: {compiled.summary()}"
