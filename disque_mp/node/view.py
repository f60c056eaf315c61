"""What the node-wide parts see of their worker: narrow, typed views.

The node-wide commands (``commands/``), the HTTP endpoint (``http/``)
and the memory monitor (``memory.py``) run inside a worker but do not import
it: each takes one of these protocols, which list exactly what it uses. The
``Worker`` (``worker.py``) satisfies them all (mypy checks it where it passes
itself), and its ``ClientConn`` (``connection.py``) satisfies ``Client``, so these
parts depend on this module and never on the worker or its connections.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio

    from bus.mesh import Mesh
    from disque_mp.node.config import Config
    from disque_mp.node.slowlog import SlowLog
    from workers.shard import Shard


class Client(Protocol):
    """What the connection and node-wide commands (CLIENT, AUTH, HELLO, INFO, ...)
    and the HTTP API use of a client connection (``connection.ClientConn``)."""

    id: int
    addr: str
    name: bytes
    lib_name: bytes
    lib_ver: bytes
    resp3: bool
    authed: bool
    auth_fails: int
    closing: bool
    close_after_write: bool
    transport: asyncio.Transport | None
    ctime_s: float
    last_s: float
    last_cmd: str
    waiters: set[Any]  # blocked GETJOBs: CLIENT LIST's flag b

    def defer(self) -> Any: ...  # a reply slot that ``fill`` completes later
    def fill(self, slot: Any, data: bytes) -> None: ...
    def data_received(self, data: bytes) -> None: ...  # the HTTP API feeds it RESP


class WorkerBasics(Protocol):
    """What every node-wide part uses of its worker: the config, where it sits, its
    loop, the mesh to the other workers and its shard."""

    @property
    def cfg(self) -> Config: ...
    @property
    def index(self) -> int: ...
    @property
    def workers(self) -> int: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def mesh(self) -> Mesh: ...  # to ask the other workers for their figures
    @property
    def shard(self) -> Shard: ...


class MemoryHost(WorkerBasics, Protocol):
    """What ``memory.Monitor`` uses of its worker."""

    oom: bool  # set at level 3: denyoom commands answer ERR_OOM

    def drain_effects(self) -> None: ...  # after an eviction pass (the AOF's DELJOBs)


class MemoryGauge(Protocol):
    """What node-wide commands use of the memory monitor."""

    def local_used(self) -> int: ...
    def update(self) -> None: ...  # CONFIG SET maxmemory: the level follows at once
    def exchange(self, arg: Any) -> list[int]: ...  # another worker's figure in, ours out


class NodeView(WorkerBasics, Protocol):
    """What the node-wide and connection commands (``commands/``) and the
    HTTP endpoint (``http/``) use of the worker that runs them."""

    @property
    def node_id(self) -> str: ...
    @property
    def parent_pid(self) -> int: ...  # the supervisor: SHUTDOWN signals it; INFO's process_id
    @property
    def start_s(self) -> float: ...
    @property
    def now_ms(self) -> int: ...
    @property
    def aof(self) -> Any: ...  # the AOF manager, or None
    @property
    def agent(self) -> Any: ...  # the cluster agent, or None (no bus in this build)
    @property
    def memory(self) -> MemoryGauge | None: ...
    @property
    def conns(self) -> AbstractSet[Client]: ...  # CLIENT LIST / KILL
    @property
    def slowlog(self) -> SlowLog: ...

    rewrite_aof_at_exit: bool  # SHUTDOWN REWRITE-AOF

    def log(self, text: str) -> None: ...
    def local_stats(self) -> dict[str, Any]: ...  # INFO, metrics: this worker's figures
    def flush_all(self) -> None: ...  # DEBUG FLUSHALL, CLUSTER RESET
    def reset_stats(self) -> None: ...  # CONFIG RESETSTAT
    def connection(self) -> Client: ...  # the HTTP API runs commands on one
    def command_names(self) -> list[str]: ...  # the command table's, in order (INFO)
    def local_op(self, op: str, arg: Any) -> Any: ...  # this worker's part of a gather
