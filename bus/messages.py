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

from typing import Any, Final

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
    """A JOB frame -> (kind, slot, inner meta), checked by its kind's rule in the
    catalogue (workers/messages.py)."""
    kind, slot, inner = meta.get("k"), meta.get("s"), meta.get("m")
    if not isinstance(kind, str) or type(slot) is not int or type(inner) is not dict:
        raise BadMessage("malformed job frame")
    err = catalogue.check(kind, slot, inner, bodies)
    if err is not None:
        raise BadMessage(err)
    return kind, slot, inner


# ---- the packed form of the hot job messages -------------------------------------
#
# REPLJOB, GOTJOB, SETACK, GOTACK and DELJOB (a replicated job's messages) may travel
# without JSON, as a bus frame of kind JOB_PACKED whose first body is
#
#     code u8 | slot u16 | job ID (40 ASCII bytes; not for REPLJOB) | per kind:
#     GOTACK: known u8;  SETACK: may-have u32, node IDs (40 ASCII bytes each)
#
# and whose other bodies are the message's. A node sends it only to a peer whose
# handshake (or DATA_READY) says "pk": 1; a peer that does not say so (an older node,
# which would refuse the unknown frame kind and drop the link) gets the JSON form, which
# every node keeps reading. What the packed form cannot say (other kinds, other fields)
# goes as JSON. Both forms pass the same catalogue check.

PACKED_KINDS: Final = ("REPLJOB", "GOTJOB", "SETACK", "GOTACK", "DELJOB")
_PACKED_CODE: Final = {kind: code for code, kind in enumerate(PACKED_KINDS)}
_ID_BYTES: Final = 40
_u32_max: Final = (1 << 32) - 1


def _ascii_id(value: Any) -> bool:
    return type(value) is str and len(value) == _ID_BYTES and value.isascii()


def pack_job(kind: str, slot: int, meta: dict[str, Any]) -> bytes | None:
    """The packed head of a job message (its bodies follow it in the frame), or None
    when the message has no packed form (send it as JSON)."""
    code = _PACKED_CODE.get(kind, -1)
    if code < 0 or not 0 <= slot <= 0xFFFF:
        return None
    head = bytes((code, slot >> 8, slot & 0xFF))
    if code == 0:  # REPLJOB: {} and the job record
        return None if meta else head
    jid = meta.get("j")
    if not isinstance(jid, str) or not _ascii_id(jid):
        return None
    fields = len(meta)
    if code == 1 or code == 4:  # GOTJOB, DELJOB: {"j": id}
        return head + jid.encode() if fields == 1 else None
    if code == 3:  # GOTACK: {"j": id, "k": 0|1}
        known = meta.get("k")
        if fields != 2 or type(known) is not int or not 0 <= known <= 1:
            return None
        return head + jid.encode() + bytes((known,))
    may_have, nodes = meta.get("m"), meta.get("d")  # SETACK
    if fields != 3 or type(may_have) is not int or not 0 <= may_have <= _u32_max \
            or type(nodes) is not list:
        return None
    for node in nodes:
        if not _ascii_id(node):
            return None
    return head + jid.encode() + may_have.to_bytes(4, "big") + "".join(nodes).encode()


def unpack_job(bodies: list[bytes]) -> tuple[str, int, dict[str, Any], list[bytes]]:
    """A JOB_PACKED frame's bodies -> (kind, slot, meta, the message's bodies); a head
    that is not one raises ``BadMessage``. The catalogue's check follows as for JSON."""
    if not bodies or len(bodies[0]) < 3 or bodies[0][0] >= len(PACKED_KINDS):
        raise BadMessage("malformed packed job frame")
    head = bodies[0]
    code = head[0]
    slot = head[1] << 8 | head[2]
    rest = bodies[1:]
    size = len(head)
    if code == 0:
        if size != 3:
            raise BadMessage("malformed packed REPLJOB")
        return "REPLJOB", slot, {}, rest
    if size < 3 + _ID_BYTES or not head[3:43].isascii():
        raise BadMessage("malformed packed job frame")
    jid = head[3:43].decode("ascii")
    kind = PACKED_KINDS[code]
    if code == 1 or code == 4:
        if size != 43:
            raise BadMessage(f"malformed packed {kind}")
        return kind, slot, {"j": jid}, rest
    if code == 3:
        if size != 44:
            raise BadMessage("malformed packed GOTACK")
        return kind, slot, {"j": jid, "k": head[43]}, rest
    if size < 47 or (size - 47) % _ID_BYTES or not head[47:].isascii():
        raise BadMessage("malformed packed SETACK")
    ids = head[47:].decode("ascii")
    nodes = [ids[i : i + _ID_BYTES] for i in range(0, len(ids), _ID_BYTES)]
    return kind, slot, {"j": jid, "m": int.from_bytes(head[43:47], "big"), "d": nodes}, rest


def check_packed_job(bodies: list[bytes]) -> tuple[str, int, dict[str, Any], list[bytes]]:
    """A JOB_PACKED frame -> (kind, slot, inner meta, bodies), checked by its kind's
    rule in the catalogue as a JSON frame is (``check_job``)."""
    kind, slot, inner, rest = unpack_job(bodies)
    err = catalogue.check(kind, slot, inner, rest)
    if err is not None:
        raise BadMessage(err)
    return kind, slot, inner, rest
