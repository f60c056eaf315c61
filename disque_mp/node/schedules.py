"""Schedules (``SCHEDULE SET / DEL / LIST / SHOW``): the table, its rules, no I/O.

A schedule is a name, a time rule (``CRON "m h dom mon dow" [TZ zone]`` or
``EVERY seconds``) and an ADDJOB (``queue body timeout [options]``, checked by
ADDJOB's own parser when the schedule is set). The table is node-wide: worker 0
of every host holds one (``schedule_host.py`` does its I/O: the bus, the
schedules file, the timer and the firing ADDJOB). This module is the part that
can be tested without a node: time comes in as ``now_ms``.

What holds across the cluster:

- **Known everywhere.** A SET or DEL carries a version (the setter's wall clock
  in ms, then its node ID): the newest version wins on every node (a DEL leaves a
  tombstone with its version, so an old SET arriving late does not bring the
  schedule back). Peers exchange a digest of their tables and send the whole
  table where they differ, so a node that joins or comes back learns them.
- **One firer.** The fire times are the same on every node (EVERY: multiples of
  the period since the epoch; CRON: the expression in its zone). The firer of a
  schedule is the first node of the rendezvous order (``blake3(name, node ID)``,
  highest first) over the nodes this node sees as reachable and not leaving.
  The node of rank ``r`` in that order fires a time itself only when no note of
  that firing came ``r * takeover_ms`` after it: a firer that failed or is cut off
  is replaced, a firer that fired (its note came) is not.
- **Keyed firings.** A firing is ``ADDJOB ... DEDUP <key>@<fire ms> DEDUP-KEEP 60``
  (the key is the options' DEDUP key, else ``schedule:<name>``): a firing retried or
  made by a second node that meets a copy of the first job answers that job's ID,
  also for a minute after that job was acknowledged.
- **Missed times.** A fire time that passed while this node was down (before its
  start) fires once after ``takeover_ms`` (its peers have told it their last
  firing by then) when it is later than every firing known, unless
  ``schedule-missed skip``; the other missed times count as skipped.

This is as honest as the rest of Disque: while nodes see each other a fire time
adds one job; while split, each side fires (at least one job per time; after
the heal both may stand); a note lost on the way can make a second firer add a
second job where no copy of the first is on its node.
"""

from __future__ import annotations

import datetime
import zoneinfo
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from blake3 import blake3

from disque_mp.node.commands.jobs import limits as addjob_limits
from disque_mp.node.commands.jobs import parse_addjob
from workers.replies import Error

# A firing's DEDUP key is ``<key>@<fire ms>`` and ADDJOB takes keys of 1..256 bytes:
# the schedule's name (in ``schedule:<name>``) and an options' DEDUP key must leave
# room for ``@`` and 13 digits.
name_bytes_max = 200
dedup_key_bytes_max = 240
every_s_max = 366 * 24 * 3600  # a year and a day: longer is a cron rule
tz_text_max = 64
cron_text_max = 256
# fire times counted one by one when a cron schedule has many due at once (a node
# down for a long time): past it the rest count as skipped all the same
due_count_max = 10_000
# due times one schedule keeps waiting for their firer's note (a backup waits
# rank * takeover; a period shorter than that keeps several): past it the oldest
# is skipped
pending_max = 64
# a firing's key is kept this long past its job's ACK (ADDJOB ... DEDUP-KEEP; at most
# dedup-keep-max): a second firer's ADDJOB of the same time after the first job was
# already run and acknowledged still meets the key on a node that held a copy, where
# plain DEDUP would have forgotten it at the ACK (a second firer comes within
# rank * schedule-takeover-ms of the time)
firing_dedup_keep_s = 60

ERR_NO_SCHEDULE = Error("ERR no such schedule")
ERR_NO_CRONSIM = Error("ERR CRON schedules need the cronsim package on this node "
                       "(pip install cronsim); EVERY works without it")
ERR_SCHEDULE_NAME = Error(f"ERR schedule name must be 1 to {name_bytes_max} bytes")
ERR_EVERY = Error(f"ERR EVERY must be a whole number of seconds from 1 to {every_s_max}")
ERR_SCHEDULE_DEDUP = Error(f"ERR DEDUP key of a schedule must be 1 to {dedup_key_bytes_max} bytes")
ERR_SCHEDULE_SYNTAX = Error(
    "ERR syntax: SCHEDULE SET name (CRON \"m h dom mon dow\" [TZ zone] | EVERY seconds) "
    "ADDJOB queue body timeout [options]")


@dataclass(slots=True)
class Spec:
    """What SCHEDULE SET said, and its version (``set_ms``, ``origin``)."""

    name: bytes
    cron: str  # "" for EVERY
    tz: str  # the cron's zone ("UTC" unless TZ)
    every_s: int  # 0 for CRON
    addjob: list[bytes]  # queue, body, timeout, options (as given)
    set_ms: int = 0
    origin: str = ""
    deleted: bool = False  # a tombstone: DEL, with the version that deleted it

    def version(self) -> tuple[int, str]:
        return (self.set_ms, self.origin)

    def rule_text(self) -> str:
        if self.every_s:
            return f"EVERY {self.every_s}"
        return f'CRON "{self.cron}" TZ {self.tz}'

    def dedup_base(self) -> bytes:
        """The DEDUP key a firing of this schedule extends with ``@<fire ms>``."""
        opts = self.addjob[3:]
        for i in range(len(opts) - 2, -1, -1):
            if opts[i].lower() == b"dedup":
                return opts[i + 1]
        return b"schedule:" + self.name

    def addjob_args(self, fire_ms: int) -> list[bytes]:
        """The firing's ADDJOB arguments (after the name), keyed by its fire time."""
        opts = self.addjob[3:]
        kept: list[bytes] = []
        i = 0
        while i < len(opts):  # the options' own DEDUP gives way to the firing's
            if opts[i].lower() == b"dedup" and i + 1 < len(opts):
                i += 2
                continue
            kept.append(opts[i])
            i += 1
        key = self.dedup_base() + b"@%d" % fire_ms
        if any(o.lower() == b"dedup-keep" for o in kept):  # the options' own stays
            return [*self.addjob[:3], *kept, b"DEDUP", key]
        keep = min(firing_dedup_keep_s, addjob_limits.dedup_keep_max_s)
        return [*self.addjob[:3], *kept, b"DEDUP", key, b"DEDUP-KEEP", b"%d" % keep]

    def next_after(self, t_ms: int) -> int:
        """The first fire time strictly after ``t_ms`` (epoch ms)."""
        if self.every_s:
            period = self.every_s * 1000
            return (t_ms // period + 1) * period
        from cronsim import CronSim  # a CRON schedule was checked: cronsim is there

        zone = zoneinfo.ZoneInfo(self.tz)
        start = datetime.datetime.fromtimestamp(t_ms // 1000, zone)
        return int(next(CronSim(self.cron, start)).timestamp()) * 1000

    def latest_due(self, next_ms: int, now_ms: int) -> tuple[int, int]:
        """The latest fire time in ``[next_ms, now_ms]`` and how many there are
        (``next_ms`` is a fire time and ``next_ms <= now_ms``)."""
        if self.every_s:
            period = self.every_s * 1000
            latest = now_ms // period * period
            return latest, (latest - next_ms) // period + 1
        latest, count = next_ms, 1
        while count < due_count_max:
            following = self.next_after(latest)
            if following > now_ms:
                return latest, count
            latest, count = following, count + 1
        return latest, count  # the rest of a long outage counts once


@dataclass(slots=True)
class Entry:
    """A schedule and what this node knows of its firings."""

    spec: Spec
    next_ms: int = 0  # the next fire time not yet looked at
    last_fire_ms: int = 0  # the newest firing known (ours or a peer's note)
    last_job_id: str = ""
    fired: int = 0  # firings this node made or heard of
    skipped: int = 0  # fire times that added no job (missed, skipped, failed)
    # due times waiting for their firer's note, oldest first: (fire ms, missed while
    # this node was down); a backup fires each once its wait is over
    pending: list[tuple[int, bool]] = field(default_factory=list)
    # the newest fire times known to have fired (ours or notes): a waiting time is
    # dropped when its own note came, not when a later one did (the firer may have
    # skipped it: it was starting, or it had just taken over)
    noted: list[int] = field(default_factory=list)
    last_error: str = ""


@dataclass(slots=True)
class Fire:
    """Run this ADDJOB for ``name`` at ``fire_ms`` (the caller reports back)."""

    name: bytes
    fire_ms: int
    args: list[bytes]
    missed: bool = False  # a time that passed while this node was down


def parse_set(args: list[bytes], body_bytes_max: int) -> Spec | Error:
    """``name (CRON expr [TZ zone] | EVERY s) ADDJOB queue body timeout [options]``:
    the words after ``SCHEDULE SET``; every part checked, the ADDJOB by its parser."""
    if len(args) < 6:
        return ERR_SCHEDULE_SYNTAX
    name = args[0]
    if not 0 < len(name) <= name_bytes_max:
        return ERR_SCHEDULE_NAME
    rule = args[1].lower()
    cron, tz, every_s = "", "UTC", 0
    if rule == b"every":
        every_s = _every(args[2])
        if every_s == 0:
            return ERR_EVERY
        at = 3
    elif rule == b"cron":
        cron = args[2].decode("utf-8", "replace").strip()
        at = 3
        if args[at].lower() == b"tz" and len(args) > at + 1:
            tz = args[at + 1].decode("utf-8", "replace")
            at += 2
        err = check_cron(cron, tz)
        if err is not None:
            return err
    else:
        return ERR_SCHEDULE_SYNTAX
    if at >= len(args) or args[at].lower() != b"addjob":
        return ERR_SCHEDULE_SYNTAX
    addjob = list(args[at + 1:])
    err = _check_addjob(addjob, body_bytes_max)
    if err is not None:
        return err
    return Spec(name, cron, tz, every_s, addjob)


def _every(raw: bytes) -> int:
    """EVERY's seconds, 0 when not a whole number in range."""
    if not raw.isdigit() or len(raw) > 12:
        return 0
    value = int(raw)
    return value if 0 < value <= every_s_max else 0


def check_cron(cron: str, tz: str) -> Error | None:
    """A cron expression and zone that cronsim and zoneinfo accept, or the reason."""
    if len(tz) > tz_text_max or not tz or tz.startswith(("/", ".")) or ".." in tz:
        return Error(f"ERR unknown time zone '{tz[:tz_text_max]}'")
    try:
        zone = zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return Error(f"ERR unknown time zone '{tz}'")
    if not cron or len(cron) > cron_text_max or len(cron.split()) != 5:
        return Error("ERR bad cron expression: it needs 5 fields (m h dom mon dow)")
    try:  # imported here: a node without the package serves everything but CRON
        from cronsim import CronSim, CronSimError
    except ImportError:
        return ERR_NO_CRONSIM
    try:
        next(CronSim(cron, datetime.datetime(2000, 1, 1, tzinfo=zone)))  # parses, no clock
    except (CronSimError, StopIteration, ValueError) as exc:
        return Error(f"ERR bad cron expression: {exc or 'it never fires'}")
    return None


def _check_addjob(addjob: list[bytes], body_bytes_max: int) -> Error | None:
    parsed = parse_addjob(addjob)
    if isinstance(parsed, Error):
        return parsed
    if len(parsed.body) > body_bytes_max:
        return Error(f"ERR schedule body too big (at most {body_bytes_max} bytes, "
                     "schedule-body-bytes-max)")
    if parsed.ext is not None and parsed.ext.dedup is not None \
            and len(parsed.ext.dedup) > dedup_key_bytes_max:
        return ERR_SCHEDULE_DEDUP
    return None


def _done(e: Entry, fire_ms: int, missed: bool) -> bool:
    """A fire time that needs no firing: its note came, or it was missed while we
    were down and a firing as late or later is known (a peer fired it or after it)."""
    return fire_ms in e.noted or (missed and fire_ms <= e.last_fire_ms)


def rank(name: bytes, me: str, nodes: Iterable[str]) -> int:
    """Our place in the rendezvous order of ``name`` over ``nodes``: 0 = the firer.
    Every node that sees the same nodes computes the same order; a node not among
    ``nodes`` (leaving) comes after all of them."""
    def weight(node_id: str) -> bytes:
        return blake3(name + b"\x00" + node_id.encode()).digest(8)

    others = set(nodes) - {me}
    if len(others) == len(set(nodes)):  # we may not fire (leaving): after every other node
        return len(others)
    mine = weight(me)
    return sum(1 for n in others if (weight(n), n) > (mine, me))


@dataclass
class Table:
    """The schedules of one node (worker 0's). The caller persists and sends what
    each verb returns True for; ``due`` says which firings to run now."""

    schedules_max: int
    missed: str = "once"  # schedule-missed: once | skip
    takeover_ms: int = 2000
    start_ms: int = 0  # when this node started: a fire time before it was missed
    entries: dict[bytes, Entry] = field(default_factory=dict)  # tombstones too

    def live(self) -> list[Entry]:
        return [e for e in self.entries.values() if not e.spec.deleted]

    def get(self, name: bytes) -> Entry | None:
        e = self.entries.get(name)
        return e if e is not None and not e.spec.deleted else None

    def full(self, name: bytes) -> bool:
        return self.get(name) is None and len(self.live()) >= self.schedules_max

    def apply(self, spec: Spec, bounded: bool = True) -> bool:
        """A SET or DEL (ours, a peer's or, not ``bounded``, the file's): True when it
        is newer than what we hold and was taken."""
        old = self.entries.get(spec.name)
        if old is not None and old.spec.version() >= spec.version():
            return False
        if bounded and not spec.deleted and (old is None or old.spec.deleted) \
                and len(self.live()) >= self.schedules_max:
            return False
        entry = Entry(spec)
        if old is not None and not old.spec.deleted and not spec.deleted \
                and old.spec.rule_text() == spec.rule_text():
            entry.last_fire_ms, entry.last_job_id = old.last_fire_ms, old.last_job_id
            entry.fired, entry.skipped, entry.noted = old.fired, old.skipped, old.noted
        if not spec.deleted:
            entry.next_ms = spec.next_after(max(spec.set_ms, entry.last_fire_ms, 0))
        self.entries[spec.name] = entry
        self._bound_tombstones()
        return True

    def _bound_tombstones(self) -> None:
        dead = [e for e in self.entries.values() if e.spec.deleted]
        if len(dead) <= self.schedules_max:
            return
        dead.sort(key=lambda e: e.spec.version())
        for e in dead[:len(dead) - self.schedules_max]:
            del self.entries[e.spec.name]

    def note_fired(self, name: bytes, fire_ms: int, job_id: str, count: bool = True) -> bool:
        """A firing (ours or a peer's note): True when it is news."""
        e = self.get(name)
        if e is None or fire_ms in e.noted or not fire_ms:
            return False
        e.noted.append(fire_ms)
        if len(e.noted) > pending_max:
            e.noted.pop(0)
        if count:
            e.fired += 1
        if fire_ms > e.last_fire_ms:
            e.last_fire_ms, e.last_job_id = fire_ms, job_id
        e.pending = [p for p in e.pending if not _done(e, *p)]
        if e.next_ms <= fire_ms:
            e.next_ms = e.spec.next_after(fire_ms)
        return True

    def note_failed(self, name: bytes, fire_ms: int, why: str) -> None:
        e = self.get(name)
        if e is not None:
            e.skipped += 1
            e.last_error = why

    def due(self, now_ms: int, me: str, nodes: list[str]) -> list[Fire]:
        """The firings this node runs now (``nodes``: the reachable ones, us too).
        Until ``takeover_ms`` after the start only missed times are looked at (the
        peers tell us their firings meanwhile); a missed time fires first."""
        out: list[Fire] = []
        in_grace = now_ms < self.start_ms + self.takeover_ms
        for e in self.live():
            if e.next_ms < self.start_ms <= now_ms:
                self._arrive(e, self.start_ms - 1, missed=True)
            if in_grace:
                continue
            if now_ms >= e.next_ms:
                self._arrive(e, now_ms, missed=False)
            if e.pending:
                self._fire_due(e, now_ms, rank(e.spec.name, me, nodes), out)
        return out

    def next_wake_ms(self, now_ms: int, me: str, nodes: list[str]) -> int | None:
        """When ``due`` has work next: a fire time, a waiting time's turn, the end of
        the start's grace (None: no schedule)."""
        live = self.live()
        if not live:
            return None
        grace_end_ms = self.start_ms + self.takeover_ms
        wake = min(e.next_ms for e in live)
        if now_ms < grace_end_ms:
            wake = min(wake, grace_end_ms)
        for e in live:
            if e.pending:
                wait_ms = rank(e.spec.name, me, nodes) * self.takeover_ms
                wake = min(wake, *(max(t, grace_end_ms) + wait_ms for t, _ in e.pending))
        return wake

    def _fire_due(self, e: Entry, now_ms: int, place: int, out: list[Fire]) -> None:
        """A waiting time fires here once its firer had ``place * takeover_ms`` to
        send its note (counted from the end of our start's grace for a missed time)."""
        wait_ms = place * self.takeover_ms
        grace_end_ms = self.start_ms + self.takeover_ms
        keep: list[tuple[int, bool]] = []
        for fire_ms, missed in e.pending:
            if _done(e, fire_ms, missed):
                continue
            if now_ms >= max(fire_ms, grace_end_ms) + wait_ms:
                out.append(Fire(e.spec.name, fire_ms, e.spec.addjob_args(fire_ms), missed))
            else:
                keep.append((fire_ms, missed))
        e.pending = keep

    def _arrive(self, e: Entry, upto_ms: int, missed: bool) -> None:
        """Fire times up to ``upto_ms`` reached: the latest one waits for its firer
        (older ones of the same step are skipped)."""
        latest, count = e.spec.latest_due(e.next_ms, upto_ms)
        e.next_ms = e.spec.next_after(latest)
        e.skipped += count - 1
        if _done(e, latest, missed):
            return
        if missed and self.missed == "skip":
            e.skipped += 1
            return
        e.pending.append((latest, missed))
        if len(e.pending) > pending_max:
            e.pending.pop(0)
            e.skipped += 1

    def digest(self) -> str:
        """What two nodes compare: every schedule's version and last firing."""
        h = blake3()
        for name in sorted(self.entries):
            e = self.entries[name]
            h.update(b"%s\x00%d\x00%s\x00%d\x00%d\n" % (name, e.spec.set_ms, e.spec.origin.encode(),
                                                        e.spec.deleted, e.last_fire_ms))
        return h.hexdigest()[:32]

    def show(self, name: bytes, me: str, nodes: list[str]) -> list[Any] | Error:
        e = self.get(name)
        if e is None:
            return ERR_NO_SCHEDULE
        s = e.spec
        return [b"name", s.name, b"rule", s.rule_text().encode(),
                b"addjob", list(s.addjob), b"next-fire", e.next_ms,
                b"last-fire", e.last_fire_ms, b"last-job-id", e.last_job_id.encode(),
                b"fired", e.fired, b"skipped", e.skipped,
                b"firer", b"yes" if rank(s.name, me, nodes) == 0 else b"no",
                b"set-ms", s.set_ms, b"set-by", s.origin.encode(),
                b"last-error", e.last_error.encode()]


def to_wire(e: Entry) -> tuple[dict[str, Any], list[bytes]]:
    """A schedule as one bus message (and one record of the schedules file):
    the name and the ADDJOB words travel as raw bodies, the rest as metadata."""
    s = e.spec
    meta = {"op": "set", "v": [s.set_ms, s.origin], "cron": s.cron, "tz": s.tz,
            "every": s.every_s, "del": s.deleted, "lf": e.last_fire_ms, "lj": e.last_job_id}
    return meta, [s.name, *([] if s.deleted else s.addjob)]


def from_wire(meta: dict[str, Any], bodies: list[bytes],
              body_bytes_max: int) -> tuple[Spec, int, str] | Error:
    """``to_wire``'s message back, checked as SCHEDULE SET checks a client's words
    (a peer or a file is data until it passes the same rules)."""
    set_ms, origin = meta["v"]
    if meta["del"]:
        if not 0 < len(bodies[0]) <= name_bytes_max:
            return ERR_SCHEDULE_NAME
        spec = Spec(bodies[0], "", "UTC", 0, [], set_ms, origin, True)
        return spec, 0, ""
    rule = [b"EVERY", b"%d" % meta["every"]] if meta["every"] else \
        [b"CRON", meta["cron"].encode(), b"TZ", meta["tz"].encode()]
    parsed = parse_set([bodies[0], *rule, b"ADDJOB", *bodies[1:]], body_bytes_max)
    if isinstance(parsed, Error):
        return parsed
    parsed.set_ms, parsed.origin = set_ms, origin
    return parsed, int(meta["lf"]), str(meta["lj"])
