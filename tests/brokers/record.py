"""What a task run leaves for the test: one JSON line appended per call."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any


def record(task: str, task_id: Any, **fields: Any) -> None:
    path = os.environ.get("BROKER_RECORD_FILE")
    if not path:
        return
    line = json.dumps({"task": task, "id": str(task_id), "t": time.time(), "pid": os.getpid(),
                       "host": socket.gethostname(), **fields})
    # O_APPEND: lines of several worker processes do not interleave
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            out.append(json.loads(line))
    return out
