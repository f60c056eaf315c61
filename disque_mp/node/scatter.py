"""Node-wide scatter/gather: every worker's part of one answer, the asking worker's
inline (``NodeView.local_op``), the others' over the local mesh (a SCATTER request,
answered by their ``local_op``: ``commands/server.py``); values cross the mesh
packed like any reply. The node-wide commands (``commands/``) and the HTTP endpoint
(``http/ops.py``) both gather this way."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bus import mesh as meshmod
from bus.mesh import unpack
from disque_mp.node.resp import encode
from workers.replies import PENDING, Error

if TYPE_CHECKING:
    from disque_mp.node.view import Client, NodeView


def on_every_worker(w: NodeView, op: str, arg: Any, done: Callable[[list[Any]], None]) -> None:
    """``done(results by worker index)`` once every worker answered ``op``; a worker
    that is down answers an ``Error`` (the mesh does it), so nothing hangs."""
    results: list[Any] = [None] * w.workers
    left = [w.workers]

    def put(index: int, value: Any) -> None:
        results[index] = value
        left[0] -= 1
        if left[0] == 0:
            done(results)

    for j in range(w.workers):
        if j == w.index:
            put(j, w.local_op(op, arg))
        else:
            w.mesh.request(j, meshmod.K_SCATTER, {"op": op, "a": arg}, (), _putter(put, j))


def _putter(put: Callable[[int, Any], None], j: int) -> Callable[[dict[str, Any], list[bytes]], None]:
    return lambda meta, bodies: put(j, unpack(meta.get("v"), bodies))


def gather(w: NodeView, conn: Client, op: str, arg: Any, finish: Callable[[list[Any]], Any]) -> Any:
    """Run ``local_op(op, arg)`` on every worker; reply ``finish(results by index)`` to
    ``conn`` (the first worker's error instead, if any). Returns ``PENDING``."""
    slot = conn.defer()

    def reply(results: list[Any]) -> None:
        errors = [r for r in results if isinstance(r, Error)]
        conn.fill(slot, encode(errors[0] if errors else finish(results), conn.resp3))

    on_every_worker(w, op, arg, reply)
    return PENDING
