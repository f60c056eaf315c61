"""Shape and value checks of every cluster message, at the edge.

A peer's frame is data until it passed here: the bus (worker 0) and the data
links (other workers) call these before any state changes, so membership and
the shard only ever see well-formed messages (they do not catch KeyError or
TypeError). A message that fails raises ``BadMessage`` (a ``FrameError``): the
link is closed and the frame counted (INFO ``cluster_bus_bad_frames``).

Job messages: the kind's rule in the one catalogue of kinds (workers/messages.py,
which the shard's dispatch reads too): the slot is in range and, for a message
about a job, is the slot of its job ID (so it reaches the worker that owns the job).
"""

from __future__ import annotations

from typing import Any

from bus.frames import FrameError
from bus.membership import client_port_max, gossip_entries_max, is_node_id, nodes_max
from workers import messages as catalogue
from workers.invariant import invariant

flags_max = 16  # gossip flags per entry (we know 6)
ip_text_max = 64
invariant(catalogue.node_list_max >= nodes_max,
          "a job message's node list holds every node membership may know")


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
    hv = meta.get("hv")
    if hv is not None and not (type(hv) is list and len(hv) == 2
                               and all(_int(v, 0, 1 << 62) for v in hv)):
        raise BadMessage("bad header version")
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


job_batch_messages_max = 4096  # messages in one JOBS frame (senders close theirs at 1024)


def check_jobs(meta: dict[str, Any], bodies: list[bytes]) -> list[tuple[str, int, dict[str, Any], list[bytes]]]:
    """A JOBS frame -> its messages (kind, slot, inner meta, bodies), each checked as a
    JOB frame is; one bad message refuses the whole frame, before any is delivered."""
    batch = meta.get("b")
    if type(batch) is not list or not 0 < len(batch) <= job_batch_messages_max:
        raise BadMessage("malformed job batch")
    out: list[tuple[str, int, dict[str, Any], list[bytes]]] = []
    at = 0
    for entry in batch:
        if type(entry) is not list or len(entry) != 4 or not _int(entry[3], 0, len(bodies) - at):
            raise BadMessage("malformed job batch entry")
        kind, slot, inner, n = entry
        parts = bodies[at:at + n]
        at += n
        if not isinstance(kind, str) or type(slot) is not int or type(inner) is not dict:
            raise BadMessage("malformed job frame")
        err = catalogue.check(kind, slot, inner, parts)
        if err is not None:
            raise BadMessage(err)
        out.append((kind, slot, inner, parts))
    if at != len(bodies):
        raise BadMessage("job batch bodies do not add up")
    return out


def check_job(meta: dict[str, Any], bodies: list[bytes]) -> tuple[str, int, dict[str, Any]]:
    """A JOB frame -> (kind, slot, inner meta), checked by its kind's rule in the
    catalogue (workers/messages.py)."""
    kind, slot, inner = meta.get("k"), meta.get("s"), meta.get("m")
    if not isinstance(kind, str) or type(slot) is not int or type(inner) is not dict:
        raise BadMessage("malformed job frame")
    err = catalogue.check(kind, slot, inner, bodies)
    if err is not None:
        raise BadMessage(err)
    return kind, slot, inner


# SCHED frames (node-wide schedules, disque_mp/node/schedules.py): worker 0 to worker 0.
sched_bodies_max = 256  # the name and the ADDJOB words (options are a few dozen at most)
sched_text_max = 256  # cron expression, zone, job ID, digest, origin
_SCHED_OPS = frozenset({"set", "fired", "sum"})


def _text(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= sched_text_max


def check_schedule(meta: dict[str, Any], bodies: list[bytes]) -> str:
    """A SCHED frame's shape (its values are checked again as SCHEDULE SET checks a
    client's words, by the receiver); returns its op."""
    op = meta.get("op")
    if not isinstance(op, str) or op not in _SCHED_OPS or len(bodies) > sched_bodies_max:
        raise BadMessage("malformed schedule message")
    if op == "sum":
        if not _text(meta.get("h")):
            raise BadMessage("bad schedule digest")
        return "sum"
    if not bodies:
        raise BadMessage("schedule message without a name")
    if op == "fired":
        if not (_int(meta.get("t"), 0, 1 << 62) and _text(meta.get("j")) and len(bodies) == 1):
            raise BadMessage("bad schedule firing")
        return "fired"
    version = meta.get("v")
    if not (type(version) is list and len(version) == 2 and _int(version[0], 0, 1 << 62)
            and _text(version[1]) and _text(meta.get("cron")) and _text(meta.get("tz"))
            and _int(meta.get("every"), 0, 1 << 40) and type(meta.get("del")) is bool
            and _int(meta.get("lf"), 0, 1 << 62) and _text(meta.get("lj"))):
        raise BadMessage("bad schedule")
    return "set"
