"""Fixtures of the bus tests."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest


@pytest.fixture
def mesh_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop set as the current one (a ``Mesh`` takes it when built), closed after."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield loop
    finally:
        asyncio.set_event_loop(None)
        loop.close()
