"""The history of a fault run and its checker (Jepsen's "total queue").

Every client operation is one record, written when it completes:

    {"p": "c2", "n": 1, "f": "dequeue", "type": "ok", "t0": 12.301, "t1": 12.344,
     "v": [["<value>", "<job id>"], ...]}

``p`` the client, ``n`` the node it spoke to, ``f`` enqueue | dequeue | ack,
``t0``/``t1`` invocation and completion in seconds since the start of the run,
``type`` the outcome: ``ok``; ``fail`` when the node said it did nothing (for
ADDJOB: ``-NOREPL Not enough reachable nodes``, ``-OOM``, ``-PAUSED``,
``-LEAVING``); ``info`` when we cannot know (a timeout, a lost connection, an
ADDJOB that timed out while its copies were on their way: those copies may
live on and be delivered). Enqueued values are unique strings
``<run>:<stream>:<producer>:<seq>``; the stream ``r2`` is at-least-once
(RETRY > 0), ``r0`` at-most-once (RETRY 0).

``check(ops, ...)`` reads the whole history afterwards, as sets, never in the
middle of a fault:

- lost: an ``r2`` value whose ADDJOB answered a job ID and that no GETJOB ever
  returned (after the heal and the drain). Must be empty.
- unexpected: a value no client enqueued, or whose ADDJOB definitely failed.
  Must be empty.
- duplicated: values delivered more than once, and the extra deliveries.
- one value delivered under several job IDs: must not happen (each ADDJOB is
  sent once: the clients have redis-py's own retries off).
  Allowed for ``r2`` (at-least-once, counted and reported), must be 0 for ``r0``.
- redelivered after an answered ACK: a job an ``ok`` ACKJOB named, returned again by
  a GETJOB sent after that ACKJOB's reply came. Explained when a fault window was
  open during the ACKJOB, or ended less than ``heal_slack_s`` before it (links
  and failure detection need that long to come back): a holder of a copy may then
  not have heard of the ACK. An unexplained one fails the run: without faults an
  answered ACK is final.
- ``r0`` values lost: at-most-once delivery may lose a job in a fault: its
  holder crashes (its jobs come back active, never queued again), the
  YOURJOBS that moves its only queued copy to another node is dropped by a
  partition, a GETJOB's reply is lost. Counted; a lost ``r0`` value is
  unexplained, and fails the run, when no fault window was open at or after
  its ADDJOB and no GETJOB with an unknown outcome was in flight at or after it.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

streams = ("r2", "r0")
# After a fault window ends, the nodes' bus links redial and failure detection
# clears its flags within a few node timeouts (2.5 s in the fault runs): an ACK
# in this time may still miss a holder.
heal_slack_s = 10.0


class History:
    """Thread-safe, append-only list of operation records and fault windows."""

    def __init__(self) -> None:
        self.t_start = time.monotonic()
        self.ops: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        return round(time.monotonic() - self.t_start, 4)

    def record(self, p: str, n: int, f: str, type_: str, t0: float, **extra: Any) -> None:
        op = {"p": p, "n": n, "f": f, "type": type_, "t0": t0, "t1": self.now(), **extra}
        with self._lock:
            self.ops.append(op)

    def fault(self, kind: str, targets: Any, t0: float, t1: float, **extra: Any) -> None:
        with self._lock:
            self.faults.append({"kind": kind, "targets": targets, "t0": t0, "t1": t1, **extra})

    def dump(self, path: Path, **meta: Any) -> None:
        """One JSON document: meta, faults, then one op per line (diffable, greppable);
        gzipped when ``path`` ends with ``.gz`` (a 10-minute run has ~50k operations)."""
        with self._lock:
            ops = list(self.ops)
            faults = list(self.faults)
        path.parent.mkdir(parents=True, exist_ok=True)
        with (gzip.open(path, "wt") if path.suffix == ".gz" else open(path, "w")) as f:
            f.write("{\n")
            for k, v in meta.items():
                f.write(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True, default=_jsonable)},\n")
            f.write('"faults": [\n')
            f.write(",\n".join(json.dumps(x, sort_keys=True, default=_jsonable) for x in faults))
            f.write('\n],\n"ops": [\n')
            f.write(",\n".join(json.dumps(x, sort_keys=True, default=_jsonable) for x in ops))
            f.write("\n]\n}\n")


def _jsonable(x: Any) -> Any:
    if isinstance(x, bytes):
        return x.decode(errors="replace")
    raise TypeError(f"{type(x).__name__} in a history")


def load(path: Path) -> dict[str, Any]:
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    data: dict[str, Any] = json.loads(raw)
    return data


def stream_of(value: str, run: str) -> str | None:
    """The stream of a value this run enqueued, None for anything else."""
    parts = value.split(":")
    if len(parts) != 4 or parts[0] != run or parts[1] not in streams:
        return None
    return parts[1]


def check(ops: list[dict[str, Any]], faults: list[dict[str, Any]], run: str) -> dict[str, Any]:
    """The verdict on a history: counts, the offending values, ``valid`` and why not."""
    outcome: dict[str, str] = {}
    for op in ops:
        if op["f"] == "enqueue":
            outcome[op["v"]] = op["type"]
    deliveries: Counter[str] = Counter()
    ids_of: dict[str, set[str]] = {}
    dequeue_info = 0
    for op in ops:
        if op["f"] != "dequeue":
            continue
        if op["type"] == "ok":
            for value, job_id in op["v"]:
                deliveries[value] += 1
                ids_of.setdefault(value, set()).add(job_id)
        elif op["type"] == "info":
            dequeue_info += 1
    res: dict[str, Any] = {"operations": len(ops), "faults": len(faults),
                           "dequeue_info": dequeue_info}
    for s in streams:
        mine = {v: o for v, o in outcome.items() if stream_of(v, run) == s}
        ok = {v for v, o in mine.items() if o == "ok"}
        got = {v for v in deliveries if stream_of(v, run) == s}
        dup = {v: c for v, c in deliveries.items() if c > 1 and stream_of(v, run) == s}
        res[s] = {
            "attempted": len(mine),
            "ok": len(ok),
            "fail": sum(1 for o in mine.values() if o == "fail"),
            "info": sum(1 for o in mine.values() if o == "info"),
            "info_delivered": sum(1 for v, o in mine.items() if o == "info" and v in got),
            "delivered": len(got),
            "deliveries": sum(deliveries[v] for v in got),
            "lost": sorted(ok - got),
            "duplicated": len(dup),
            "extra_deliveries": sum(c - 1 for c in dup.values()),
            "duplicated_values": sorted(dup)[:50],
        }
    unexpected = sorted(v for v in deliveries
                        if stream_of(v, run) is None or outcome.get(v) in (None, "fail"))
    res["unexpected"] = unexpected
    # Each ADDJOB is sent once, so a value is one job: several IDs mean a client re-sent
    # a command or a node minted a second job.
    several_ids = sorted(v for v, ids in ids_of.items() if len(ids) > 1)
    res["values_with_several_ids"] = several_ids
    # The last moment something could have lost an at-most-once job in transit.
    last_fault_s = max([f["t1"] for f in faults]
                       + [op["t1"] for op in ops if op["f"] == "dequeue" and op["type"] == "info"],
                       default=-1.0)
    enqueued_at = {op["v"]: op["t0"] for op in ops if op["f"] == "enqueue"}
    r0_unexplained = sorted(v for v in res["r0"]["lost"] if enqueued_at[v] > last_fault_s)
    res["r0"]["lost_unexplained"] = r0_unexplained
    res["after_ack"] = after_ack(ops, faults)
    problems = []
    if res["r2"]["lost"]:
        problems.append(f"{len(res['r2']['lost'])} acknowledged RETRY>0 values lost")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected values delivered")
    if res["r0"]["duplicated"]:
        problems.append(f"{res['r0']['duplicated']} RETRY 0 values delivered more than once")
    if several_ids:
        problems.append(f"{len(several_ids)} values delivered under several job IDs")
    if r0_unexplained:
        problems.append(f"{len(r0_unexplained)} RETRY 0 values lost with no fault "
                        "at or after their ADDJOB")
    if res["after_ack"]["unexplained"]:
        problems.append(f"{len(res['after_ack']['unexplained'])} jobs delivered again after "
                        "an answered ACK with no fault at the time of the ACK")
    res["problems"] = problems
    res["valid"] = not problems
    return res


def after_ack(ops: list[dict[str, Any]], faults: list[dict[str, Any]]) -> dict[str, Any]:
    """Jobs delivered again after an ACKJOB naming them was answered: the count, the
    job IDs a fault explains (a window open during that ACKJOB, or closed less than
    ``heal_slack_s`` before it) and those no fault explains."""
    acked: dict[str, tuple[float, float]] = {}  # job id -> (t0, t1) of its first answered ACK
    for op in ops:
        if op["f"] == "ack" and op["type"] == "ok":
            for jid in op["ids"]:
                if jid not in acked or op["t1"] < acked[jid][1]:
                    acked[jid] = (op["t0"], op["t1"])
    again: dict[str, tuple[float, float]] = {}
    for op in ops:
        if op["f"] == "dequeue" and op["type"] == "ok":
            for _value, jid in op["v"]:
                if jid in acked and op["t0"] > acked[jid][1]:
                    again[jid] = acked[jid]
    explained = sorted(jid for jid, (t0, t1) in again.items()
                       if any(f["t0"] <= t1 and t0 <= f["t1"] + heal_slack_s for f in faults))
    return {"jobs": len(again), "explained": explained,
            "unexplained": sorted(set(again) - set(explained))}
