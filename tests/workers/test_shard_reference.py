"""Replay the reference transcripts 01 and 02 against Shard + cmd_jobs directly.

Commands answered by the front end (PING, HELLO, INFO server, CONFIG, unknown
commands, arity checks of the command table) are skipped; every other reply is
compared element by element. Job IDs are mapped reference -> ours as ADDJOB
mints them; times (ctime, next-*-within, age, idle) are compared loosely.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path
from typing import Any

from disque_mp.node.commands import jobs as cmd_jobs
from disque_mp.node.commands.table import run_on_shard
from tests import REFERENCE_DIR
from workers.replies import NULL_ARRAY, Error, Status
from workers.shard import Shard

REF = REFERENCE_DIR
NODE = "739317b21b9046a3454204425426c55a12ccc07a"
T0 = 1_795_301_808_328

# Answered by the front end, not the shard.
FRONT_END = {b"ping", b"hello", b"config", b"nosuchcommand"}
ARITY = {b"addjob": -4, b"pause": -3, b"getjob": -2}
LOOSE_FIELDS = {b"ctime", b"next-requeue-within", b"next-awake-within", b"age", b"idle"}


SETUP = "# (job created first with: "


def parse_transcript(path: Path) -> list[tuple[list[bytes], Any]]:
    out: list[tuple[list[bytes], Any]] = []
    lines = []
    for ln in path.read_text().splitlines():
        if ln.startswith(SETUP):  # "# (job created first with: ADDJOB ... -> D-...)"
            cmd, job_id = ln[len(SETUP) : -1].split(" -> ")
            out.append(([w.encode() for w in cmd.split()], ("+", job_id)))
        elif ln and not ln.startswith("#"):
            lines.append(ln)
    i = 0
    while i < len(lines):
        assert lines[i].startswith("> "), lines[i]
        cmd = [w.encode() for w in lines[i][2:].split()]
        reply, i = _parse_reply(lines, i + 1, 0)
        out.append((cmd, reply))
    return out


def _parse_reply(lines: list[str], i: int, depth: int) -> tuple[Any, int]:
    text = lines[i][2 * depth :]
    kind, rest = text[0], text[1:]
    if kind == "*":
        if rest == "nil":
            return ("*", None), i + 1
        items, i = [], i + 1
        for _ in range(int(rest)):
            item, i = _parse_reply(lines, i, depth + 1)
            items.append(item)
        return ("*", items), i
    if kind == "$":
        return ("$", None if rest == "nil" else ast.literal_eval(rest).encode()), i + 1
    if kind == ":":
        return (":", int(rest)), i + 1
    return (kind, rest), i + 1


def to_tree(r: Any) -> Any:
    """Our reply value in the transcript's tree form."""
    if isinstance(r, Status):
        return ("+", str(r))
    if isinstance(r, Error):
        return ("-", str(r))
    if r is None:
        return ("$", None)
    if r is NULL_ARRAY:
        return ("*", None)
    if isinstance(r, bool | int):
        return (":", int(r))
    if isinstance(r, str):
        return ("$", r.encode())
    if isinstance(r, bytes):
        return ("$", r)
    assert isinstance(r, list | tuple), r
    return ("*", [to_tree(x) for x in r])


class Replayer:
    def __init__(self) -> None:
        self.shard = Shard(NODE, 0, 1, b"seed", random.Random(3), T0)
        self.now = T0
        self.ids: dict[str, str] = {}  # reference ID -> ours

    def execute(self, cmd: list[bytes]) -> Any:
        name, args = cmd[0].lower(), cmd[1:]
        arity = ARITY.get(name)
        if arity is not None and len(cmd) < -arity:
            return Error(f"ERR wrong number of arguments for '{name.decode()}' command")
        args = [self.ids.get(a.decode(), a.decode()).encode() if a.startswith(b"D-") else a
                for a in args]
        s = self.shard
        if name == b"getjob":
            g = cmd_jobs.parse_getjob(args)
            if isinstance(g, Error):
                return g
            r = cmd_jobs.getjob_now(s, g, self.now)
            if r is None:  # GETJOB TIMEOUT: the front end times out and answers
                return NULL_ARRAY
            return r
        if name in (b"qscan", b"jscan"):
            return self.scan(name, args)
        if name == b"info":
            info = s.info()
            if args == [b"jobs"]:
                return f"# Jobs\r\nregistered_jobs:{info['registered_jobs']}\r\n".encode()
            return f"# Queues\r\nregistered_queues:{info['registered_queues']}\r\n".encode()
        if name == b"debug":
            s.op_flushall()
            return Status("OK")
        return run_on_shard(s, name, args, 1, self.now)

    def scan(self, name: bytes, args: list[bytes]) -> Any:
        s = self.shard
        if name == b"qscan":
            q = cmd_jobs.parse_qscan(args)
            if isinstance(q, Error):
                return q
            cursor, items = q.cursor, []
            while True:
                cursor, got = s.op_qscan(cursor, q.count, q.minlen, q.maxlen, q.importrate)
                items += got
                if cursor == 0:
                    return [b"0", items]
        j = cmd_jobs.parse_jscan(args)
        if isinstance(j, Error):
            return j
        cursor, items = j.cursor, []
        while True:
            cursor, got = s.op_jscan(cursor, j.count, j.queue, j.states, j.reply_all, self.now)
            items += got
            if cursor == 0:
                return [b"0", items]


def learn_ids(expected: Any, got: Any, ids: dict[str, str]) -> None:
    """Map reference IDs to ours where the same position holds a job ID."""
    if expected[0] in "+$" and isinstance(expected[1], str | bytes) and got[0] == expected[0]:
        e = expected[1].decode() if isinstance(expected[1], bytes) else expected[1]
        g = got[1].decode() if isinstance(got[1], bytes) else got[1]
        if e.startswith("D-739317b2-") and g.startswith("D-739317b2-") and e not in ids:
            ids[e] = g
    elif expected[0] == "*" and got[0] == "*" and expected[1] and got[1]:
        for e, g in zip(expected[1], got[1], strict=False):
            learn_ids(e, g, ids)


def normalise(tree: Any, ids: dict[str, str]) -> Any:
    kind, v = tree
    if kind == "*" and v is not None:
        items = [normalise(x, ids) for x in v]
        for k in range(len(items) - 1):  # loose time fields of SHOW / QSTAT arrays
            if items[k][0] == "$" and items[k][1] in LOOSE_FIELDS and items[k + 1][0] == ":":
                items[k + 1] = (":", "<time>")
        return ("*", items)
    if kind in "+$" and v is not None:
        text = v.decode() if isinstance(v, bytes) else v
        if text in ids:
            text = ids[text]
        return (kind, text.encode() if isinstance(v, bytes) else text)
    return tree


def unordered(tree: Any) -> Any:
    """QSCAN/JSCAN list order depends on hashing: compare as sorted lists."""
    kind, v = tree
    if kind == "*" and v and len(v) == 2 and v[0] == ("$", b"0") and v[1][0] == "*":
        return ("*", [v[0], ("*", sorted(v[1][1], key=repr))])
    return tree


# QSTAT's fields after the reference's (extensions append name/value pairs).
QSTAT_EXTENSION_FIELDS = {b"active", b"delayed", b"oldest-age", b"dead-len", b"groups"}


def qstat_reference_part(expected: Any, got: Any) -> Any:
    """The reference's part of a QSTAT reply, after checking that what follows it is
    extension fields as name/value pairs."""
    if not (expected[0] == got[0] == "*" and isinstance(got[1], list)):
        return got
    extra = got[1][len(expected[1]):]
    assert len(extra) % 2 == 0, got
    assert {name for _, name in extra[::2]} <= QSTAT_EXTENSION_FIELDS, got
    return ("*", got[1][:len(expected[1])])


TRANSCRIPTS = ["01-basics-and-errors.txt", "02-lifecycle-pause-scan-info.txt"]


def test_replay_reference() -> None:
    """02 was recorded on the same server right after 01: replay them in one session."""
    paths = [REF / name for name in TRANSCRIPTS]
    rp = Replayer()
    compared = 0
    for cmd, expected in [step for p in paths for step in parse_transcript(p)]:
        lname = cmd[0].lower()
        if lname in FRONT_END or (lname == b"info" and cmd[1:] not in ([b"jobs"], [b"queues"])):
            continue
        got = to_tree(rp.execute(cmd))
        if lname == b"qstat":
            got = qstat_reference_part(expected, got)
        learn_ids(expected, got, rp.ids)
        assert unordered(normalise(got, rp.ids)) == unordered(normalise(expected, rp.ids)), (
            f"{b' '.join(cmd).decode()}"
        )
        rp.shard.check()
        compared += 1
        rp.now += 1
    assert compared > 60


def test_reference_show_times_are_close() -> None:
    """next-requeue-within right after ADDJOB RETRY 30 is about 30 s (0..500 ms jitter)."""
    rp = Replayer()
    jid = rp.execute([b"ADDJOB", b"q2", b"hello", b"0", b"RETRY", b"30", b"TTL", b"3600"])
    sh = rp.execute([b"SHOW", str(jid).encode()])
    d = dict(zip(sh[::2], sh[1::2], strict=True))
    assert 30_000 <= d[b"next-requeue-within"] < 30_500
    assert d[b"next-awake-within"] == d[b"next-requeue-within"] - 500
    assert d[b"ctime"] == T0 * 1_000_000
