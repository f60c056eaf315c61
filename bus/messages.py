"""Shape and value checks of every cluster message, at the edge.

A peer's frame is data until it passed here: the bus (worker 0) and the data
links (other workers) call these before any state changes, so membership and
the shard only ever see well-formed messages (they do not catch KeyError or
TypeError). A message that fails raises ``BadMessage`` (a ``FrameError``): the
link is closed and the frame counted (INFO ``cluster_bus_bad_frames``).

Job messages (``workers/federation.py`` lists their meta): the slot is in range
and, for a message about a job, is the slot of its job ID (so it reaches the
worker that owns the job); a kind added there must add its rule here.
"""

from __future__ import annotations

from typing import Any

from bus.frames import FrameError
from bus.membership import client_port_max, gossip_entries_max, is_node_id, nodes_max
from workers.ids import SLOTS, is_valid_job_id, slot_of, slot_of_job_id
from workers.job import delay_max_s

u32_max = (1 << 32) - 1
node_list_max = nodes_max  # ENQUEUE's holder list: at most every node of the cluster
flags_max = 16  # gossip flags per entry (we know 6)
queue_name_bytes_max = 64 * 1024  # NEEDJOBS / PAUSE: longer than any queue a client could name
ip_text_max = 64
request_id_max = (1 << 63) - 1  # a worker's request token
queued_wait_ms_max = delay_max_s * 1000  # QUEUED "w": a NACK's DELAY, at most ADDJOB's


class BadMessage(FrameError):
    """A message whose shape or values are wrong: drop the link."""


def _int(value: Any, lo: int, hi: int) -> bool:
    return type(value) is int and lo <= value <= hi


def check_header(meta: dict[str, Any]) -> str:
    """PING, MEET and PONG: the sender's header and gossip; returns the sender ID."""
    sender = meta.get("id")
    if not isinstance(sender, str) or not is_node_id(sender):
        raise BadMessage("bad sender ID")
    if not _int(meta.get("port"), 1, client_port_max):
        raise BadMessage("bad sender port")
    if type(meta.get("leaving", False)) is not bool:
        raise BadMessage("bad leaving flag")
    gossip = meta.get("gossip", [])
    if type(gossip) is not list or len(gossip) > gossip_entries_max:
        raise BadMessage("bad gossip section")
    for entry in gossip:
        _check_gossip_entry(entry)
    return sender


def _check_gossip_entry(entry: Any) -> None:
    if type(entry) is not list or not 4 <= len(entry) <= 6:
        raise BadMessage("bad gossip entry")
    node_id, ip, port, flags = entry[:4]
    if not (isinstance(node_id, str) and is_node_id(node_id) and isinstance(ip, str)
            and len(ip) <= ip_text_max and _int(port, 0, client_port_max)
            and type(flags) is list and len(flags) <= flags_max
            and all(isinstance(f, str) and len(f) <= 16 for f in flags)):
        raise BadMessage("bad gossip entry")
    if not all(_int(t, 0, 1 << 62) for t in entry[4:]):
        raise BadMessage("bad gossip entry times")


def check_fail(meta: dict[str, Any]) -> str:
    target = meta.get("id")
    if not isinstance(target, str) or not is_node_id(target):
        raise BadMessage("bad FAIL target")
    return target


def check_job(meta: dict[str, Any], bodies: list[bytes]) -> tuple[str, int, dict[str, Any]]:
    """A JOB frame -> (kind, slot, inner meta), checked for its kind."""
    kind, slot, inner = meta.get("k"), meta.get("s"), meta.get("m")
    if not isinstance(kind, str) or type(slot) is not int or not 0 <= slot < SLOTS \
            or type(inner) is not dict:
        raise BadMessage("malformed job frame")
    rule = _RULES.get(kind)
    if rule is None:
        if bodies:
            raise BadMessage(f"unknown job message {kind[:32]!r} with bodies")
        return kind, slot, inner  # a newer peer's kind: the shard ignores kinds it does not know
    rule(slot, inner, bodies)
    return kind, slot, inner


def _job_id(slot: int, inner: dict[str, Any]) -> None:
    jid = inner.get("j")
    if not isinstance(jid, str) or not is_valid_job_id(jid):
        raise BadMessage("bad job ID")
    if slot_of_job_id(jid) != slot:
        raise BadMessage("job ID and slot disagree")


def _no_bodies(bodies: list[bytes]) -> None:
    if bodies:
        raise BadMessage("unexpected bodies")


def _about_job(slot: int, inner: dict[str, Any], bodies: list[bytes]) -> None:
    _job_id(slot, inner)
    _no_bodies(bodies)


def _records(slot: int, inner: dict[str, Any], bodies: list[bytes]) -> None:
    if not bodies:
        raise BadMessage("no job record")


def _repljob(slot: int, inner: dict[str, Any], bodies: list[bytes]) -> None:
    if len(bodies) != 1:
        raise BadMessage("REPLJOB carries one job record")


def _enqueue(slot: int, inner: dict[str, Any], bodies: list[bytes]) -> None:
    _about_job(slot, inner, bodies)
    nodes = inner.get("d", [])
    if type(nodes) is not list or len(nodes) > node_list_max \
            or not all(isinstance(n, str) and is_node_id(n) for n in nodes):
        raise BadMessage("bad ENQUEUE node list")


def _queued(slot: int, inner: dict[str, Any], bodies: list[bytes]) -> None:
    """QUEUED's optional fields: the counter to increment, the extensions' NACK
    DELAY wait and dead-letter move (workers/extensions.py)."""
    _about_job(slot, inner, bodies)
    if not (_int(inner.get("f", 0), 0, 255) and _int(inner.get("w", 0), 0, queued_wait_ms_max)
            and _int(inner.get("dl", 0), 0, 1)):
        raise BadMessage("bad QUEUED fields")


def _setack(slot: int, inner: dict[str, Any], bodies: list[bytes]) -> None:
    _about_job(slot, inner, bodies)
    if not _int(inner.get("m"), 0, u32_max):
        raise BadMessage("bad SETACK count")
    nodes = inner.get("d", [])  # the sender's node list (optional: the spec sends a count)
    if type(nodes) is not list or len(nodes) > node_list_max \
            or not all(isinstance(n, str) and is_node_id(n) for n in nodes):
        raise BadMessage("bad SETACK node list")


def _gotack(slot: int, inner: dict[str, Any], bodies: list[bytes]) -> None:
    _about_job(slot, inner, bodies)
    if inner.get("k") not in (0, 1) or type(inner.get("k")) is not int:
        raise BadMessage("bad GOTACK flag")


def _queue_body(slot: int, bodies: list[bytes]) -> None:
    if len(bodies) != 1 or len(bodies[0]) > queue_name_bytes_max:
        raise BadMessage("bad queue name")
    if slot_of(bodies[0]) != slot:
        raise BadMessage("queue name and slot disagree")


def _needjobs(slot: int, inner: dict[str, Any], bodies: list[bytes]) -> None:
    _queue_body(slot, bodies)
    if not _int(inner.get("c"), 0, u32_max):
        raise BadMessage("bad NEEDJOBS count")


def _pause(slot: int, inner: dict[str, Any], bodies: list[bytes]) -> None:
    _queue_body(slot, bodies)
    if not _int(inner.get("f"), 0, 255):
        raise BadMessage("bad PAUSE flags")


def _request(slot: int, inner: dict[str, Any], bodies: list[bytes]) -> None:
    """QLENASK / DELQ (workers/extensions.py): a request number and the queue."""
    _queue_body(slot, bodies)
    if not _int(inner.get("r"), 0, request_id_max):
        raise BadMessage("bad request number")


def _qlenis(slot: int, inner: dict[str, Any], bodies: list[bytes]) -> None:
    _no_bodies(bodies)
    if not (_int(inner.get("r"), 0, request_id_max) and _int(inner.get("n"), 0, 1 << 62)):
        raise BadMessage("bad QLENIS")


def _delqdone(slot: int, inner: dict[str, Any], bodies: list[bytes]) -> None:
    if not _int(inner.get("r"), 0, request_id_max):
        raise BadMessage("bad request number")
    if len(bodies) > 1 or (bodies and len(bodies[0]) % 40):
        raise BadMessage("bad DELQDONE job IDs")


_RULES: dict[str, Any] = {
    "REPLJOB": _repljob,
    "GOTJOB": _about_job,
    "ENQUEUE": _enqueue,
    "WILLQUEUE": _about_job,
    "QUEUED": _queued,
    "WORKING": _about_job,
    "SETACK": _setack,
    "GOTACK": _gotack,
    "DELJOB": _about_job,
    "NEEDJOBS": _needjobs,
    "YOURJOBS": _records,
    "PAUSE": _pause,
    "QLENASK": _request,
    "QLENIS": _qlenis,
    "DELQ": _request,
    "DELQDONE": _delqdone,
}
