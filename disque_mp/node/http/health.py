"""``GET /healthz`` and ``GET /readyz``: the probes a load balancer, systemd or
Kubernetes asks, as they ask Redis' PING or RabbitMQ's ``/api/health/checks``.

``/healthz`` says the process answers HTTP (the worker serving it is up): 200
always. ``/readyz`` asks every worker over the mesh, as INFO does, and reads the
membership view: 200 when every worker answered and the node knows its
membership; 503 otherwise, with the same JSON body saying what is missing. Workers
that do not answer within ``readyz-timeout-ms`` count as down (when the wait runs
out, every other worker does: the gather answers all at once). Failing
peers do not make a node unready (Disque is AP: a node serves through a partition),
the body names them.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import orjson

from disque_mp.node.http.ops import gather
from disque_mp.node.http.server import Request, Response

if TYPE_CHECKING:
    from disque_mp.node.view import NodeView


async def get_healthz(w: NodeView, req: Request, args: list[str]) -> Response:
    return Response(200, orjson.dumps({"status": "ok", "node_id": w.node_id}))


def cluster_state(w: NodeView) -> dict[str, Any]:
    """The membership view this worker holds: known nodes, failing ones, links down."""
    view: dict[str, Any] = w.agent.view if w.agent is not None else {}
    nodes = view.get("nodes") or []
    failing = sorted(str(n[0]) for n in nodes if any("fail" in str(f) for f in n[3]))
    unlinked = sorted(str(n[0]) for n in nodes if "myself" not in n[3] and not n[6])
    known = w.agent is None or any("myself" in n[3] for n in nodes)
    state = "ok" if known and not failing and not unlinked else ("degraded" if known else "unknown")
    return {"state": state, "nodes": len(nodes), "failing": failing, "disconnected": unlinked}


async def get_readyz(w: NodeView, req: Request, args: list[str]) -> Response:
    answers = gather(w, "http.health", None)
    try:
        parts = await asyncio.wait_for(asyncio.shield(answers),
                                       w.cfg.readyz_timeout_ms / 1000)
    except TimeoutError:  # a worker stopped or stuck: not ready, and say so now
        answers.cancel()
        parts = [None] * w.workers
        parts[w.index] = {"worker": w.index}
    down = [i for i, p in enumerate(parts) if not isinstance(p, dict)]
    cluster = cluster_state(w)
    ready = not down and cluster["state"] != "unknown"
    body = {"status": "ready" if ready else "not ready", "node_id": w.node_id,
            "workers": w.workers, "workers_up": w.workers - len(down), "workers_down": down,
            "cluster": cluster}
    return Response(200 if ready else 503, orjson.dumps(body))
