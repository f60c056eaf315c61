"""Run a Disque command from the HTTP side exactly as a client would.

The API has the commands' semantics because it *is* the commands: each call is
RESP bytes fed to a ``ClientConn`` of this worker whose transport is an
in-process sink. Routing, forwarding to the owning worker, replication waits,
``appendfsync always`` holds and the error texts are the command path's own;
the reply is parsed back with hiredis. The connection is never registered with
the worker (it is not a client in INFO or CLIENT LIST), is already
authenticated (HTTP basic auth ran first) and never blocks (no blocking GETJOB
is sent).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import hiredis

from disque_mp.node.resp import encode_request

if TYPE_CHECKING:
    from disque_mp.node.view import NodeView


class ReplyError(Exception):
    """A Disque error reply (``-ERR ...``, ``-BADID ...``): ``str(e)`` is its text."""


class _Sink(asyncio.Transport):
    """The connection's transport: collects the reply bytes, parses one reply."""

    def __init__(self, fut: asyncio.Future[Any]) -> None:
        super().__init__()
        self.fut = fut
        self.reader = hiredis.Reader()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.reader.feed(bytes(data))
        reply = self.reader.gets()
        if reply is not False and not self.fut.done():
            if isinstance(reply, hiredis.ReplyError):
                self.fut.set_exception(ReplyError(str(reply)))
            else:
                self.fut.set_result(reply)

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default  # no socket: never handed off to another worker

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def call(w: NodeView, *args: bytes | str | int) -> Any:
    """One command's reply (bytes, int, list ...); raises ``ReplyError`` for an error."""
    raw = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    fut: asyncio.Future[Any] = w.loop.create_future()
    conn = w.connection()
    conn.authed = True
    conn.addr = "http"
    conn.transport = _Sink(fut)
    conn.data_received(encode_request(raw))
    return await fut
