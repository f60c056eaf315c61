"""A raw RESP client for tests against real nodes (tests/nodeproc.py) that keeps
reply types apart (status vs bulk, null bulk vs null array), which redis-py and
hiredis do not."""

from __future__ import annotations

import socket
from typing import Any

raw_timeout_s = 20.0  # generous: other engineers' tests share the 2 cores


class Status(str):
    pass


class Err(str):
    pass


class NullBulk:
    def __repr__(self) -> str:
        return "$nil"


class NullArray:
    def __repr__(self) -> str:
        return "*nil"


NULL_BULK = NullBulk()
NULL_ARRAY = NullArray()


def encode_command(*args: Any) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        raw = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(parts)


def exchange(port: int, data: bytes, *, timeout_s: float = raw_timeout_s,
             host: str = "127.0.0.1", until: bytes | None = None) -> bytes:
    """Send ``data`` on a new connection, read what comes back until the server closes
    (or, with ``until``, the bytes read so far end with it: one reply line)."""
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(data)
        out = b""
        while until is None or not out.endswith(until):
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        return out


class RawClient:
    """Raw RESP over a socket: send bytes, read typed replies (RESP2 and RESP3 nulls)."""

    def __init__(self, port: int, timeout_s: float = raw_timeout_s) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def call(self, *args: Any) -> Any:
        self.send(encode_command(*args))
        return self.read()

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("connection closed by the server")
        self.buf += chunk

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def read(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return Status(rest.decode())
        if kind == b"-":
            return Err(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"_":
            return None
        if kind == b"$":
            n = int(rest)
            return NULL_BULK if n < 0 else self._exact(n)
        if kind in (b"*", b"%"):
            n = int(rest)
            if n < 0:
                return NULL_ARRAY
            items = [self.read() for _ in range(n * (2 if kind == b"%" else 1))]
            return dict(zip(items[::2], items[1::2], strict=True)) if kind == b"%" else items
        raise AssertionError(f"unexpected reply line {line!r}")

    def closed_now(self) -> bool:
        """True when the server has closed the connection already (does not wait)."""
        self.sock.setblocking(False)
        try:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return True
            self.buf += chunk
            return False
        except BlockingIOError:
            return False
        except ConnectionResetError:
            return True
        finally:
            self.sock.settimeout(raw_timeout_s)

    def closed(self) -> bool:
        """True when the server closed the connection (after any buffered replies)."""
        try:
            while True:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    return True
                self.buf += chunk
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True


def worker_of(client: RawClient) -> int:
    """Which worker holds this connection (INFO workers, connection_worker)."""
    text = client.call("INFO", "workers")
    assert isinstance(text, bytes)
    for line in text.decode().split("\r\n"):
        if line.startswith("connection_worker:"):
            return int(line.split(":")[1])
    raise AssertionError(f"no connection_worker in {text!r}")


def connect_to_worker(port: int, index: int, tries_max: int = 200) -> RawClient:
    """A connection held by worker ``index`` (the kernel spreads them at random)."""
    for _ in range(tries_max):
        c = RawClient(port)
        if worker_of(c) == index:
            return c
        c.close()
    raise AssertionError(f"no connection landed on worker {index} in {tries_max} tries")
