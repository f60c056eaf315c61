"""Node-wide scatter/gather: every worker's part of one answer, the asking worker's
inline, the others' over the local mesh (a SCATTER request, answered by their
``commands.admin.local_op``; values cross the mesh packed like any reply). The
node-wide commands (``commands/admin.py``) and the HTTP endpoint
(``http/ops.py``) both gather this way."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bus import mesh as meshmod
from bus.mesh import unpack

if TYPE_CHECKING:
    from disque_mp.node.view import NodeView

# local(w, op, arg): this worker's part
LocalOp = Callable[["NodeView", str, Any], Any]


def on_every_worker(w: NodeView, op: str, arg: Any, local: LocalOp,
                    done: Callable[[list[Any]], None]) -> None:
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
            put(j, local(w, op, arg))
        else:
            w.mesh.request(j, meshmod.K_SCATTER, {"op": op, "a": arg}, (), _putter(put, j))


def _putter(put: Callable[[int, Any], None], j: int) -> Callable[[dict[str, Any], list[bytes]], None]:
    return lambda meta, bodies: put(j, unpack(meta.get("v"), bodies))
