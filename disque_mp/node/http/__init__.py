"""The node's HTTP endpoint: Prometheus ``/metrics``, a JSON admin API and a dashboard.

Served by the workers' own event loops on ``http-port``: ``server.py`` speaks
HTTP, ``api.py`` answers the requests; see ``docs/observability.md``.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import TYPE_CHECKING

from disque_mp.node.http import api, server

if TYPE_CHECKING:
    from disque_mp.node.view import NodeView

__all__ = ["start"]


async def start(w: NodeView, ctx: ssl.SSLContext | None = None) -> list[asyncio.AbstractServer]:
    """Listen on ``http-bind``:``http-port`` (nothing when the port is 0)."""
    return await server.start(w, api.handle, ctx)
