"""A tiny HTTP client for the node's HTTP endpoint tests (http.client, one request
per connection unless told otherwise)."""

from __future__ import annotations

import base64
import http.client
import json
from typing import Any

http_timeout_s = 30.0  # generous: other engineers' tests share the cores


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"Reply({self.status}, {self.body[:300]!r})"


def request(port: int, method: str, path: str, body: Any = None, *, json_body: bool = True,
            headers: dict[str, str] | None = None, password: str | None = None) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=http_timeout_s)
    hdrs = dict(headers or {})
    data: bytes | None = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        if json_body:
            hdrs.setdefault("Content-Type", "application/json")
    elif method == "POST" and json_body:
        hdrs.setdefault("Content-Type", "application/json")
    if password is not None:
        hdrs["Authorization"] = "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()
    try:
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def get(port: int, path: str, **kw: Any) -> Reply:
    return request(port, "GET", path, **kw)


def post(port: int, path: str, body: Any = None, **kw: Any) -> Reply:
    return request(port, "POST", path, body, **kw)
