"""The catalogue of cluster messages between shards, as Disque's
``CLUSTERMSG_TYPE_*`` in cluster.h: one line per kind with its name, its fields
and the check of its shape.

A sender names the kind by its constant here (``QUEUED`` ...) and builds its
meta with the kind's function here (``queued_meta`` ...), never a bare string or
a dict of its own; the core makes the ``Send(node, kind, slot, meta, bodies)``
effects (``Core.send``, ``Core.send_job``). The edge
(bus/messages.py ``check_job``) runs the kind's ``check`` before any state
changes; the shard (workers/shard.py ``Shard.on_message``) dispatches to the
kind's handler, a method of one of its parts bound by reference in
``Shard.handlers`` (typed: a handler of another shape does not type-check). Adding
a kind is one line in ``KINDS``, its name and meta function, plus its handler (a
test checks that every kind has a check and a handler). ``meta`` is JSON; job records, queue names
and job IDs travel in ``bodies`` as raw bytes. A message about a job goes to
the job's slot (carried by its ID), so on the receiving host it reaches the
worker owning the same slot; a queue message uses the queue's slot.

=========  ===================================================  ====================
kind       meta                                                 bodies
=========  ===================================================  ====================
REPLJOB    {}                                                   [job record]
GOTJOB     {"j": id}
ENQUEUE    {"j": id, "d": [node, ...]}
WILLQUEUE  {"j": id}
QUEUED     {"j": id[, "f": 2|4 (increment nacks|deliveries)]
            [, "w": ms (NACK DELAY), "dl": 1 (moved to dead:<queue>)
            [, "why": reason], "rd": 1 (moved back by REDRIVE)]}
WORKING    {"j": id}
SETACK     {"j": id, "m": may-have[, "d": [node, ...]]}           [[result value]]
GOTACK     {"j": id, "k": 0|1 (known)}
DELJOB     {"j": id}
NEEDJOBS   {"c": count}                                         [queue name]
YOURJOBS   {}                                                   [job record, ...]
PAUSE      {"f": pause flags}                                   [queue name]
QLIMIT     {"a": ACTIVE, "r": RATE, "g": GROUP-ACTIVE}          [queue name]
QLENASK    {"r": request}                                       [queue name]
QLENIS     {"r": request, "n": queued jobs}
DELQ       {"r": request}                                       [queue name]
DELQDONE   {"r": request}                                       [40-byte IDs, joined]
RESULTASK  {"j": id, "r": request}
RESULTIS   {"j": id, "r": request, "s": 0|1|2 (none|value|progress)} [[value]]
=========  ===================================================  ====================

SETACK's optional body is the job's result (``ACKJOB id RESULT value``,
workers/results.py): a node that does not send it is still understood, and a node
that gets none stores none. RESULTASK / RESULTIS are RESULT's question to the other
nodes for a job this node does not hold, and their answers (workers/results.py).
QLENASK ... DELQDONE are the extensions' (GLOBALQLEN, DELQUEUE: workers/extensions.py);
a request goes to the queue's slot on every reachable node and the answer to the
same slot here, the worker that asked. A kind this catalogue does not know (a
newer peer's) passes the edge only without bodies, and the shard drops it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Final

from workers.ids import SLOTS, is_valid_job_id, slot_of, slot_of_job_id
from workers.job import dead_reason_bytes_max, delay_max_s
from workers.limit import limit_value_limit

u32_max: Final = (1 << 32) - 1
# ENQUEUE's and SETACK's node lists: at most every node of a cluster (the
# membership table keeps at most 1000, bus/membership.py's nodes_max).
node_list_max: Final = 1000
# NEEDJOBS / PAUSE / QLENASK / DELQ: longer than any queue a client could name.
queue_name_bytes_max: Final = 64 * 1024
request_id_max: Final = (1 << 63) - 1  # a worker's request token
queued_wait_ms_max: Final = delay_max_s * 1000  # QUEUED "w": a NACK's DELAY, at most ADDJOB's
_NODE_ID_LEN: Final = 40
# One match over the joined list: a set of characters per node ID was a fifth of a
# replica's SETACK check.
_hex_run: Final = re.compile("[0-9a-f]*").fullmatch

# The shape check of a kind: (slot, meta, bodies) -> None when well formed, else
# what is wrong (the edge drops the link with it).
Check = Callable[[int, dict[str, Any], list[bytes]], str | None]


class Kind:
    """One message kind: its name, its fields (as the table above) and its check."""

    __slots__ = ("name", "meta", "bodies", "check")

    def __init__(self, name: str, meta: str, bodies: str, check: Check) -> None:
        self.name = name
        self.meta = meta
        self.bodies = bodies
        self.check = check


def _int(value: Any, lo: int, hi: int) -> bool:
    return type(value) is int and lo <= value <= hi


def _node_list(nodes: Any) -> bool:
    """A list of node IDs (40 lowercase hex digits each), at most ``node_list_max``."""
    if type(nodes) is not list or len(nodes) > node_list_max:
        return False
    for n in nodes:
        if not isinstance(n, str) or len(n) != _NODE_ID_LEN:
            return False
    return _hex_run("".join(nodes)) is not None


# Job IDs this process found well formed, with the slot each carries. A job's messages
# name it several times (a replica gets SETACK then DELJOB; an origin GOTJOB and GOTACK
# from every replica), and the ID's pattern match and slot decoding were a tenth of a
# replica's instructions per job. A memo of a pure function (the answers do not change);
# emptied when full.
checked_job_ids_max: Final = 4096
_checked_job_ids: Final[dict[str, int]] = {}


def _about_job(slot: int, meta: dict[str, Any], bodies: list[bytes]) -> str | None:
    jid = meta.get("j")
    if not isinstance(jid, str):
        return "bad job ID"
    carried = _checked_job_ids.get(jid)
    if carried is None:
        if not is_valid_job_id(jid):
            return "bad job ID"
        carried = slot_of_job_id(jid)
        if len(_checked_job_ids) >= checked_job_ids_max:
            _checked_job_ids.clear()
        _checked_job_ids[jid] = carried
    if carried != slot:
        return "job ID and slot disagree"
    return "unexpected bodies" if bodies else None


def _records(slot: int, meta: dict[str, Any], bodies: list[bytes]) -> str | None:
    return None if bodies else "no job record"


def _repljob(slot: int, meta: dict[str, Any], bodies: list[bytes]) -> str | None:
    return None if len(bodies) == 1 else "REPLJOB carries one job record"


def _enqueue(slot: int, meta: dict[str, Any], bodies: list[bytes]) -> str | None:
    err = _about_job(slot, meta, bodies)
    if err is None and not _node_list(meta.get("d", [])):
        return "bad ENQUEUE node list"
    return err


def _queued(slot: int, meta: dict[str, Any], bodies: list[bytes]) -> str | None:
    """QUEUED's optional fields: the counter to increment, the extensions' NACK
    DELAY wait and dead-letter move (workers/extensions.py)."""
    err = _about_job(slot, meta, bodies)
    if err is None and not (_int(meta.get("f", 0), 0, 255)
                            and _int(meta.get("w", 0), 0, queued_wait_ms_max)
                            and _int(meta.get("dl", 0), 0, 1)
                            and _int(meta.get("rd", 0), 0, 1)
                            and _reason(meta.get("why", ""))):
        return "bad QUEUED fields"
    return err


def _reason(value: Any) -> bool:
    """QUEUED "why": a dead-letter reason as latin-1 text, bounded as the job's."""
    if type(value) is not str or len(value) > dead_reason_bytes_max:
        return False
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def _setack(slot: int, meta: dict[str, Any], bodies: list[bytes]) -> str | None:
    err = _about_job(slot, meta, [])
    if err is not None:
        return err
    if len(bodies) > 1 or (bodies and len(bodies[0]) > result_value_bytes_max):
        return "bad SETACK result"
    if not _int(meta.get("m"), 0, u32_max):
        return "bad SETACK count"
    # the sender's node list (optional: the spec sends a count)
    return None if _node_list(meta.get("d", [])) else "bad SETACK node list"


def _gotack(slot: int, meta: dict[str, Any], bodies: list[bytes]) -> str | None:
    err = _about_job(slot, meta, bodies)
    if err is None and (type(meta.get("k")) is not int or meta.get("k") not in (0, 1)):
        return "bad GOTACK flag"
    return err


def _queue_body(slot: int, bodies: list[bytes]) -> str | None:
    if len(bodies) != 1 or len(bodies[0]) > queue_name_bytes_max:
        return "bad queue name"
    return None if slot_of(bodies[0]) == slot else "queue name and slot disagree"


def _needjobs(slot: int, meta: dict[str, Any], bodies: list[bytes]) -> str | None:
    err = _queue_body(slot, bodies)
    if err is None and not _int(meta.get("c"), 0, u32_max):
        return "bad NEEDJOBS count"
    return err


def _pause(slot: int, meta: dict[str, Any], bodies: list[bytes]) -> str | None:
    err = _queue_body(slot, bodies)
    if err is None and not _int(meta.get("f"), 0, 255):
        return "bad PAUSE flags"
    return err


def _qlimit(slot: int, meta: dict[str, Any], bodies: list[bytes]) -> str | None:
    err = _queue_body(slot, bodies)
    if err is None and not (_int(meta.get("a"), 0, limit_value_limit)
                            and _int(meta.get("r"), 0, limit_value_limit)
                            and _int(meta.get("g"), 0, limit_value_limit)):
        return "bad QLIMIT limits"
    return err


def _request(slot: int, meta: dict[str, Any], bodies: list[bytes]) -> str | None:
    """QLENASK / DELQ: a request number and the queue."""
    err = _queue_body(slot, bodies)
    if err is None and not _int(meta.get("r"), 0, request_id_max):
        return "bad request number"
    return err


def _qlenis(slot: int, meta: dict[str, Any], bodies: list[bytes]) -> str | None:
    if bodies:
        return "unexpected bodies"
    if not (_int(meta.get("r"), 0, request_id_max) and _int(meta.get("n"), 0, 1 << 62)):
        return "bad QLENIS"
    return None


def _delqdone(slot: int, meta: dict[str, Any], bodies: list[bytes]) -> str | None:
    if not _int(meta.get("r"), 0, request_id_max):
        return "bad request number"
    if len(bodies) > 1 or (bodies and len(bodies[0]) % 40):
        return "bad DELQDONE job IDs"
    return None


def _resultask(slot: int, meta: dict[str, Any], bodies: list[bytes]) -> str | None:
    err = _about_job(slot, meta, bodies)
    if err is None and not _int(meta.get("r"), 0, request_id_max):
        return "bad RESULTASK request"
    return err


def _resultis(slot: int, meta: dict[str, Any], bodies: list[bytes]) -> str | None:
    err = _about_job(slot, meta, [])
    if err is not None:
        return err
    if not (_int(meta.get("r"), 0, request_id_max) and _int(meta.get("s"), 0, 2)):
        return "bad RESULTIS fields"
    want = 0 if meta["s"] == RESULT_NONE else 1
    if len(bodies) != want or (bodies and len(bodies[0]) > result_value_bytes_max):
        return "bad RESULTIS value"
    return None


# A result or progress value on the bus: at most this (config result-bytes-max and
# progress-bytes-max are checked by the node that took the value; this bounds a frame).
result_value_bytes_max: Final = 64 << 20
RESULT_NONE: Final = 0
RESULT_VALUE: Final = 1
RESULT_PROGRESS: Final = 2

REPLJOB: Final = "REPLJOB"
GOTJOB: Final = "GOTJOB"
ENQUEUE: Final = "ENQUEUE"
WILLQUEUE: Final = "WILLQUEUE"
QUEUED: Final = "QUEUED"
WORKING: Final = "WORKING"
SETACK: Final = "SETACK"
GOTACK: Final = "GOTACK"
DELJOB: Final = "DELJOB"
NEEDJOBS: Final = "NEEDJOBS"
YOURJOBS: Final = "YOURJOBS"
PAUSE: Final = "PAUSE"
QLIMIT: Final = "QLIMIT"
QLENASK: Final = "QLENASK"
QLENIS: Final = "QLENIS"
DELQ: Final = "DELQ"
DELQDONE: Final = "DELQDONE"
RESULTASK: Final = "RESULTASK"
RESULTIS: Final = "RESULTIS"

_JOB: Final = '{"j": id}'
KINDS: Final = (
    Kind(REPLJOB, "{}", "[job record]", _repljob),
    Kind(GOTJOB, _JOB, "", _about_job),
    Kind(ENQUEUE, '{"j": id, "d": [node, ...]}', "", _enqueue),
    Kind(WILLQUEUE, _JOB, "", _about_job),
    Kind(QUEUED, '{"j": id[, "f": incr][, "w": ms][, "dl": 1[, "why": text]][, "rd": 1]}',
         "", _queued),
    Kind(WORKING, _JOB, "", _about_job),
    Kind(SETACK, '{"j": id, "m": may-have[, "d": [node, ...]]}', "[[result]]", _setack),
    Kind(GOTACK, '{"j": id, "k": 0|1}', "", _gotack),
    Kind(DELJOB, _JOB, "", _about_job),
    Kind(NEEDJOBS, '{"c": count}', "[queue name]", _needjobs),
    Kind(YOURJOBS, "{}", "[job record, ...]", _records),
    Kind(PAUSE, '{"f": pause flags}', "[queue name]", _pause),
    Kind(QLIMIT, '{"a": ACTIVE, "r": RATE, "g": GROUP-ACTIVE}', "[queue name]", _qlimit),
    Kind(QLENASK, '{"r": request}', "[queue name]", _request),
    Kind(QLENIS, '{"r": request, "n": queued jobs}', "", _qlenis),
    Kind(DELQ, '{"r": request}', "[queue name]", _request),
    Kind(DELQDONE, '{"r": request}', "[40-byte job IDs, joined]", _delqdone),
    Kind(RESULTASK, '{"j": id, "r": request}', "", _resultask),
    Kind(RESULTIS, '{"j": id, "r": request, "s": 0|1|2}', "[[value]]", _resultis),
)
CATALOGUE: Final = {k.name: k for k in KINDS}


def check(kind: str, slot: int, meta: dict[str, Any], bodies: list[bytes]) -> str | None:
    """A job message's shape: None when well formed, else what is wrong."""
    if not 0 <= slot < SLOTS:
        return "malformed job frame"
    k = CATALOGUE.get(kind)
    if k is None:
        # a newer peer's kind: the shard ignores kinds it does not know
        return f"unknown job message {kind[:32]!r} with bodies" if bodies else None
    return k.check(slot, meta, bodies)


# ---- the senders' side: each kind's meta, built here only (the fields above)


def records_meta() -> dict[str, Any]:
    """REPLJOB, YOURJOBS: no fields (the job records are the bodies)."""
    return {}


def job_meta(job_id: str) -> dict[str, Any]:
    """GOTJOB, WILLQUEUE, WORKING, DELJOB: the job."""
    return {"j": job_id}


def enqueue_meta(job_id: str, nodes: Sequence[str]) -> dict[str, Any]:
    """ENQUEUE: the job, and every node that may have a copy (the holder that queues
    it must know them all for the ACK GC)."""
    return {"j": job_id, "d": list(nodes)}


def queued_meta(job_id: str, incr: int = 0, wait_ms: int = 0, dead: bool = False,
                reason: bytes = b"", redrive: bool = False) -> dict[str, Any]:
    """QUEUED: the job; ``incr`` the counter the sender incremented (QUEUED_INCR_*),
    ``wait_ms`` a NACK's DELAY, ``dead`` moved to its dead-letter queue (with its
    ``reason``), ``redrive`` moved back; each field only when set."""
    meta: dict[str, Any] = {"j": job_id}
    if dead:
        meta["dl"] = 1
    if incr:
        meta["f"] = incr
    if wait_ms:
        meta["w"] = wait_ms
    if reason:
        meta["why"] = reason.decode("latin-1")
    if redrive:
        meta["rd"] = 1
    return meta


def setack_meta(job_id: str, may_have: int, nodes: Sequence[str] | None = None) -> dict[str, Any]:
    """SETACK: the job, the count of nodes that may have a copy (0: unknown, ask
    everyone), and the nodes themselves when known."""
    if nodes is None:
        return {"j": job_id, "m": may_have}
    return {"j": job_id, "m": may_have, "d": list(nodes)}


def gotack_meta(job_id: str, known: bool) -> dict[str, Any]:
    """GOTACK: the job, and whether we knew it."""
    return {"j": job_id, "k": 1 if known else 0}


def needjobs_meta(count: int) -> dict[str, Any]:
    """NEEDJOBS: how many jobs we ask for (the queue is the body)."""
    return {"c": count}


def pause_meta(flags: int) -> dict[str, Any]:
    """PAUSE: the queue's pause flags (the queue is the body)."""
    return {"f": flags}


def qlimit_meta(active: int, rate: int, group_active: int) -> dict[str, Any]:
    """QLIMIT: a queue's limits (the queue is the body; all 0: reset)."""
    return {"a": active, "r": rate, "g": group_active}


def request_meta(request: int) -> dict[str, Any]:
    """QLENASK, DELQ and the answer DELQDONE: the asker's request number."""
    return {"r": request}


def qlenis_meta(request: int, queued: int) -> dict[str, Any]:
    """QLENIS: the request answered and the jobs queued here."""
    return {"r": request, "n": queued}


def resultask_meta(job_id: str, request: int) -> dict[str, Any]:
    """RESULTASK: the job whose result the asker wants, and its request number."""
    return {"j": job_id, "r": request}


def resultis_meta(job_id: str, request: int, kind: int) -> dict[str, Any]:
    """RESULTIS: the answer (RESULT_NONE, RESULT_VALUE or RESULT_PROGRESS: the value is
    the body)."""
    return {"j": job_id, "r": request, "s": kind}
