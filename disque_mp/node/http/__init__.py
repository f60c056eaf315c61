"""The node's HTTP endpoint: Prometheus ``/metrics``, a JSON admin API and a dashboard.

Served by the workers' own event loops on ``http-port`` (``server.start``); see
``docs/observability.md``.
"""

from disque_mp.node.http.server import start

__all__ = ["start"]
