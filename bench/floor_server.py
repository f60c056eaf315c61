"""The floor under any Python front end: a do-nothing RESP server on uvloop.

    python -m bench.floor_server --port 7799

One process, asyncio Protocol, hiredis Reader, one write per read: every
command is answered with a canned reply (a job ID for ADDJOB, one job for
GETJOB, ``:1`` otherwise) and no work at all. redis-benchmark against it
shows the most a single worker process of this design can answer on this
machine, whatever the shard and the routing cost; bench/test_macro.py
records it next to the node and redis-server.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

import hiredis

ADDJOB_REPLY = b"+D-01234567-AAECAwQFBgcICQoLDA0ODxAR-05a1\r\n"
GETJOB_REPLY = (b"*1\r\n*3\r\n$1\r\nq\r\n$40\r\nD-01234567-AAECAwQFBgcICQoLDA0ODxAR-05a1\r\n"
                b"$1\r\nx\r\n")
OTHER_REPLY = b":1\r\n"


class FloorConn(asyncio.Protocol):
    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        out = []
        while (cmd := self.reader.gets()) is not False:
            name = cmd[0].upper() if cmd else b""
            out.append(ADDJOB_REPLY if name == b"ADDJOB" else
                       GETJOB_REPLY if name == b"GETJOB" else OTHER_REPLY)
        if out:
            self.transport.write(b"".join(out))


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(FloorConn, host, port, backlog=511)
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set_result, None)
    print(f"floor server on {host}:{port}", flush=True)
    await stop
    server.close()


def main(argv: list[str] | None = None) -> int:
    import uvloop

    p = argparse.ArgumentParser(prog="python -m bench.floor_server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=7799)
    a = p.parse_args(argv)
    uvloop.run(serve(a.host, a.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
