"""Counts the local mesh's frames and messages by kind in every node process, for
``bench.cycle_instructions`` (which puts this folder first on PYTHONPATH and sets
``MESHCOUNT_DIR``). Each process keeps its counters in a small file of its own,
mapped in memory, so nothing has to run at exit: a worker killed by the supervisor
still leaves its figures. Slots 0..31 count frames by kind, 32..63 the messages they
carry (a CMDS, REPLIES, RAW or RAWREPLIES batch carries several). Nothing here runs
unless the variable is set; the node itself never imports this file."""

from __future__ import annotations

import os
from typing import Any

_DIR = os.environ.get("MESHCOUNT_DIR")


def _install(directory: str) -> None:
    import mmap

    from bus import mesh

    state: dict[str, object] = {"pid": -1, "view": None}
    real = mesh.encode

    def counters() -> memoryview:
        pid = os.getpid()
        if state["pid"] != pid:
            path = os.path.join(directory, f"mesh.{pid}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            os.ftruncate(fd, 8 * 64)
            mm = mmap.mmap(fd, 8 * 64)
            os.close(fd)
            state["pid"], state["view"], state["mm"] = pid, memoryview(mm).cast("Q"), mm
        view = state["view"]
        assert isinstance(view, memoryview)
        return view

    def encode(kind: int, meta: dict[str, Any], bodies: Any) -> bytes:
        frame = real(kind, meta, bodies)
        view = counters()
        if kind in (mesh.K_RAW, mesh.K_RAWREPLIES) or kind == getattr(mesh, "K_TOOKS", -1):
            n = len(bodies[0]) // 4
        elif kind == 3 and not meta:  # a TAKES batch (a lone TAKE has its rid in meta)
            n = _takes_in(bodies[0])
        elif kind in (mesh.K_CMDS, mesh.K_REPLIES):
            n = len(meta["r"])
        else:
            n = 1
        view[kind] += 1
        view[32 + kind] += n
        return frame

    mesh.encode = encode
    real_batch = getattr(mesh, "encode_batch", None)
    if real_batch is not None:  # the batch frames' own encoder (RAW, RAWREPLIES, TOOKS, TAKES)
        def encode_batch(kind: int, first: bytes, second: bytes | None, parts: list[bytes]) -> bytes:
            frame = real_batch(kind, first, second, parts)
            view = counters()
            view[kind] += 1
            view[32 + kind] += _batch_messages(kind, first)
            return frame

        mesh.encode_batch = encode_batch


def _batch_messages(kind: int, first: bytes) -> int:
    """How many messages a batch frame carries, from its first body (``bus/mesh.py``:
    a RAW head is the first id's four bytes and a flag per command, RAWREPLIES and
    TOOKS hold an id and a length per answer; an older tree's, an id per message)."""
    from bus import mesh

    if kind == 3:
        return _takes_in(first)
    if not hasattr(mesh, "raw_first_id"):  # an older tree: u32 ids in each
        return len(first) // 4
    if kind == mesh.K_RAW:
        return len(first) - 4
    return len(first) // 8  # RAWREPLIES, TOOKS


def _takes_in(words_bytes: bytes) -> int:
    """How many takes a TAKES frame's words hold (``bus/mesh.py``, ``Link.add_take``)."""
    import array

    words = array.array("q")
    words.frombytes(words_bytes)
    n = i = 0
    while i + 5 <= len(words):
        i += 5 + words[i + 3] + words[i + 4]
        n += 1
    return n


if _DIR:
    _install(_DIR)
