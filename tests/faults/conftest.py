"""Fault tests marked ``netns`` need root and iproute2 (network namespaces); elsewhere
they skip, saying why."""

from __future__ import annotations

import pytest

from tests.faults.netns import missing_requirements

_why_not: str | None = None
_probed = False


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "netns: needs root and network namespaces")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    global _why_not, _probed
    mine = [i for i in items if i.get_closest_marker("netns") is not None]
    if not mine:
        return
    if not _probed:
        _why_not, _probed = missing_requirements(), True
    if _why_not:
        for item in mine:
            item.add_marker(pytest.mark.skip(reason=_why_not))
