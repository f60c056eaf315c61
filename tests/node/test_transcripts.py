"""Replay the reference transcripts (tests/reference/01 and 02) over raw RESP against a
real node with 1 and with 2 workers, and compare replies structurally: types,
field names and order, error texts and counts must match; job IDs, node IDs,
ports, times and memory figures are normalised.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from tests import REFERENCE_DIR
from tests.nodeproc import NodeProc
from tests.rawclient import NULL_ARRAY, NULL_BULK, Err, RawClient, Status

pytestmark = pytest.mark.integration

REFERENCE = REFERENCE_DIR
JOB_ID = re.compile(r"^D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}$")
NODE_ID = re.compile(r"^[0-9a-f]{40}$")
# Keys whose values depend on time (SHOW, QSTAT): any integer will do.
VOLATILE_KEYS = {b"ctime", b"next-requeue-within", b"next-awake-within", b"age", b"idle"}
# INFO fields compared by value; every other field only by name and position.
INFO_EXACT = {"registered_jobs", "registered_queues", "disque_version", "hz", "loading",
              "aof_enabled", "aof_state", "connected_clients", "blocked_clients"}


def parse_transcript(path: Path) -> list[tuple[list[str], Any]]:
    lines = path.read_text().splitlines()
    steps: list[tuple[list[str], Any]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("> "):
            reply, i = _parse_reply(lines, i + 1, 0)
            steps.append((line[2:].split(), reply))
        else:
            i += 1
    return steps


def _parse_reply(lines: list[str], i: int, depth: int) -> tuple[Any, int]:
    text = lines[i][2 * depth:]
    kind, rest = text[:1], text[1:]
    if kind == "+":
        return Status(rest), i + 1
    if kind == "-":
        return Err(rest), i + 1
    if kind == ":":
        return int(rest), i + 1
    if kind == "$":
        return (NULL_BULK if rest == "nil" else ast.literal_eval(rest).encode("latin-1")), i + 1
    if kind == "*":
        if rest == "nil":
            return NULL_ARRAY, i + 1
        items = []
        i += 1
        for _ in range(int(rest)):
            item, i = _parse_reply(lines, i, depth + 1)
            items.append(item)
        return items, i
    raise AssertionError(f"cannot parse transcript line {text!r}")


class Replay:
    def __init__(self, node: NodeProc) -> None:
        self.node = node
        self.client = RawClient(node.port)
        self.ids: dict[str, str] = {}  # reference job ID -> ours
        self.node_id = ""

    def run(self, words: list[str]) -> Any:
        args = [self.ids.get(w, w) for w in words]
        return self.client.call(*args)

    def compare(self, cmd: list[str], expected: Any, got: Any) -> None:
        name = cmd[0].upper()
        if name == "INFO":
            return self._compare_info(expected, got)
        if name == "QSTAT" and isinstance(expected, list) and isinstance(got, list):
            got = self._qstat_prefix(cmd, expected, got)
        if name in ("QSCAN", "JSCAN") and isinstance(expected, list) and len(expected) == 2:
            assert isinstance(got, list) and len(got) == 2, (cmd, got)
            assert got[0] == expected[0], (cmd, got)
            self._compare_set(cmd, expected[1], got[1])
            return
        self._compare(cmd, expected, got, None)

    def _qstat_prefix(self, cmd: list[str], expected: list[Any], got: list[Any]) -> list[Any]:
        """QSTAT's reference fields, in the reference's order, then ours (extensions
        append name/value pairs after them): the reference's part is compared."""
        extra = got[len(expected):]
        assert len(extra) % 2 == 0, (cmd, got)
        names = extra[::2]
        assert all(isinstance(k, bytes) for k in names), (cmd, got)
        assert not set(names) & set(expected[::2]), (cmd, got)
        return got[:len(expected)]

    def _compare_set(self, cmd: list[str], expected: list[Any], got: Any) -> None:
        assert isinstance(got, list) and len(got) == len(expected), (cmd, expected, got)
        if all(isinstance(e, list) for e in expected):
            for e, g in zip(expected, got, strict=True):
                self._compare(cmd, e, g, None)
            return
        want = sorted(self.ids.get(_s(e), _s(e)) for e in expected)
        assert sorted(_s(g) for g in got) == want, (cmd, want, got)
        assert {type(g) for g in got} == {type(e) for e in expected}, (cmd, got)

    def _compare(self, cmd: list[str], expected: Any, got: Any, key: bytes | None) -> None:
        where = (cmd, expected, got)
        if isinstance(expected, list):
            assert isinstance(got, list) and len(got) == len(expected), where
            prev: bytes | None = None
            for e, g in zip(expected, got, strict=True):
                self._compare(cmd, e, g, prev)
                prev = e if isinstance(e, bytes) else None
            return
        assert type(got) is type(expected), where
        if isinstance(expected, int):
            if key not in VOLATILE_KEYS:
                assert got == expected, where
            return
        if isinstance(expected, bytes | Status):
            self._compare_text(cmd, _s(expected), _s(got), key)
            return
        assert got == expected, where

    def _compare_text(self, cmd: list[str], expected: str, got: str, key: bytes | None) -> None:
        if JOB_ID.match(expected):
            assert JOB_ID.match(got), (cmd, expected, got)
            known = self.ids.setdefault(expected, got)
            assert known == got, (cmd, expected, got)
            return
        if NODE_ID.match(expected):
            assert NODE_ID.match(got), (cmd, got)
            self.node_id = self.node_id or got
            assert got == self.node_id, (cmd, got)
            return
        if cmd[0].upper() == "HELLO":
            return  # address and port of this node: ours differ by design
        assert got == expected, (cmd, expected, got)

    def _compare_info(self, expected: Any, got: Any) -> None:
        assert isinstance(got, bytes), got
        want, have = _sections(expected), _sections(got)
        # every reference section, in order, each starting with the reference's
        # fields in order; our extra fields (e.g. maxmemory) may follow them
        assert list(have)[: len(want)] == list(want), (want, have)
        for title, fields in want.items():
            ours = have[title]
            assert [k for k, _ in ours[: len(fields)]] == [k for k, _ in fields], (title, fields, ours)
            for (k, v), (_, gv) in zip(fields, ours, strict=False):
                if k in INFO_EXACT and k != "connected_clients":
                    assert gv == v, (k, v, gv)


def _s(x: Any) -> str:
    return x.decode("latin-1") if isinstance(x, bytes) else str(x)


def _sections(text: bytes) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    fields: list[tuple[str, str]] = []
    for line in text.decode().split("\r\n"):
        if line.startswith("#"):
            fields = out.setdefault(line, [])
        elif line:
            k, _, v = line.partition(":")
            fields.append((k, v))
    return out


def _replay(node: NodeProc, files: list[str]) -> None:
    replay = Replay(node)
    try:
        for name in files:
            path = next(REFERENCE.glob(f"{name}-*.txt"))
            if name == "02":  # the transcript starts from a job made beforehand
                our = replay.run("ADDJOB q2 hello 0 RETRY 30 TTL 3600".split())
                replay.ids["D-739317b2-YPF09KYnZ3P0tGXrKyoRkVu4-003d"] = str(our)
            for cmd, expected in parse_transcript(path):
                got = replay.run(cmd)
                replay.compare(cmd, expected, got)
    finally:
        replay.client.close()


def test_transcript_01_then_02(node: NodeProc) -> None:
    _replay(node, ["01", "02"])


@pytest.mark.parametrize("name", ["01", "02"])
def test_transcript_parses(name: str) -> None:
    steps = parse_transcript(next(REFERENCE.glob(f"{name}-*.txt")))
    assert len(steps) > 20
    assert all(cmd for cmd, _ in steps)
