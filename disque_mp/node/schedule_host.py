"""Worker 0's schedules: the I/O around ``schedules.Table``.

Worker 0 holds the node's schedules, beside membership (it owns the cluster bus
the schedules travel on). This part:

- runs ``SCHEDULE`` (any worker hands it here through the cluster agent, area
  ``"schedule"``: ``commands/schedule.py``);
- keeps the schedules file ``<appendfilename stem>-schedules<suffix>`` in ``dir``
  while ``appendonly`` is on: one framed record (the AOF's frame: length, crc32)
  per SET, DEL and firing, fsynced per ``appendfsync``, rewritten from the table
  when it holds four times more records than schedules; loaded at start;
- speaks SCHED frames with worker 0 of the other hosts (``bus/hostbus.py``,
  checked by ``bus/messages.check_schedule``): a SET or DEL to every member, a
  firing's note, and every ``digest_interval_ms`` (and at once to a member seen
  for the first time) the table's digest; a member whose digest differs gets our
  whole table;
- fires: a timer that sleeps until the table's next fire time (or a change) asks
  it what is due and runs each firing as a client's ADDJOB on this worker (``http.commands.call``: the command path's
  routing to the queue's owner, its replication and its errors).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import zlib
from typing import TYPE_CHECKING, Any

import orjson

from bus import membership as mb
from bus.clock import wall_ms
from bus.durable import write_atomic
from disque_mp.node import schedules as sch
from disque_mp.node.aof_format import FRAME
from workers.replies import OK, Error

if TYPE_CHECKING:
    from bus.hostbus import ClusterBus
    from disque_mp.node.view import NodeView

log = logging.getLogger("disque.schedules")

# The timer sleeps until the next fire time, a waiting time's turn, the next digest
# or a change (SET, DEL, a peer's frame, a membership view): no schedule, no peer,
# no wake-up. With a schedule at most this long, so a wall clock that jumps is noticed:
wake_ms_max = 60_000
digest_interval_ms = 5000  # every member gets our digest this often
fired_in_flight_max = 1024  # firings running at once (each waits for its ADDJOB)
record_bytes_max = 64 << 20  # a record of the schedules file (a body is bounded far below)
_U32 = struct.Struct(">I")

ERR_SCHEDULES_FULL = "ERR too many schedules (at most {}, schedules-max)"


def file_path(cfg: Any) -> str:
    stem, dot, suffix = str(cfg.appendfilename).rpartition(".")
    base = f"{stem}-schedules.{suffix}" if dot else f"{cfg.appendfilename}-schedules"
    return os.path.join(str(cfg.dir), base)


def encode_record(meta: dict[str, Any], bodies: list[bytes]) -> bytes:
    head = orjson.dumps({**meta, "nb": len(bodies)})
    payload = b"".join([_U32.pack(len(head)), head,
                        *(_U32.pack(len(b)) + b for b in bodies)])
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def decode_records(data: bytes) -> tuple[list[tuple[dict[str, Any], list[bytes]]], int]:
    """The records of a schedules file and the length of its sound part (a torn or
    damaged tail is cut there, as the AOF's)."""
    out: list[tuple[dict[str, Any], list[bytes]]] = []
    at = 0
    while at + FRAME.size <= len(data):
        size, crc = FRAME.unpack_from(data, at)
        payload = data[at + FRAME.size:at + FRAME.size + size]
        if size > record_bytes_max or len(payload) < size or zlib.crc32(payload) != crc:
            break
        try:
            out.append(_decode_payload(payload))
        except (ValueError, KeyError, struct.error):
            break
        at += FRAME.size + size
    return out, at


def _decode_payload(payload: bytes) -> tuple[dict[str, Any], list[bytes]]:
    (n,) = _U32.unpack_from(payload, 0)
    meta = orjson.loads(payload[4:4 + n])
    p = 4 + n
    bodies = []
    for _ in range(int(meta.pop("nb"))):
        (m,) = _U32.unpack_from(payload, p)
        bodies.append(payload[p + 4:p + 4 + m])
        p += 4 + m
    return meta, bodies


class ScheduleFile:
    """The schedules file (appendonly yes): appends, fsync per policy, rewrites."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.path = file_path(cfg)
        self.fd = -1
        self.records = 0
        self.dirty = False

    def load(self) -> list[tuple[dict[str, Any], list[bytes]]]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        records, sound = decode_records(data)
        if sound < len(data):
            log.warning("schedules file %s: %d bytes of a damaged tail cut", self.path,
                        len(data) - sound)
            os.truncate(self.path, sound)
        self.records = len(records)
        return records

    def append(self, meta: dict[str, Any], bodies: list[bytes]) -> None:
        if not self.cfg.appendonly:
            return
        if self.fd < 0:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                              0o644)
        os.write(self.fd, encode_record(meta, bodies))
        self.records += 1
        self.dirty = True
        if self.cfg.appendfsync == "always":
            self.sync()

    def sync(self) -> None:
        if self.dirty and self.fd >= 0 and self.cfg.appendfsync != "no":
            os.fsync(self.fd)
        self.dirty = False

    def rewrite(self, records: list[tuple[dict[str, Any], list[bytes]]]) -> None:
        if not self.cfg.appendonly:
            return
        self.close()
        write_atomic(self.path, b"".join(encode_record(m, b) for m, b in records))
        self.records = len(records)

    def close(self) -> None:
        if self.fd >= 0:
            self.sync()
            os.close(self.fd)
            self.fd = -1


class ScheduleHost:
    """The schedules of this node, on worker 0 (see the module's docstring)."""

    def __init__(self, w: NodeView, bus: ClusterBus) -> None:
        self.w = w
        self.bus = bus
        cfg = w.cfg
        self.table = sch.Table(int(cfg.schedules_max), str(cfg.schedule_missed),
                               int(cfg.schedule_takeover_ms), wall_ms())
        self.file = ScheduleFile(cfg)
        self.task: asyncio.Task[None] | None = None
        self.in_flight: set[asyncio.Task[None]] = set()
        self.greeted: set[str] = set()  # members sent our digest since they came into view
        self.digest_at_ms = 0
        self.refused = 0  # records of the schedules file this node could not read
        self.changed = asyncio.Event()  # wakes the timer early (see wake_ms_max)

    @property
    def body_bytes_max(self) -> int:
        return int(self.w.cfg.schedule_body_bytes_max)

    def me(self) -> str:
        return self.bus.my_id

    def start(self) -> None:
        for meta, bodies in self.file.load():
            self._load_record(meta, bodies)
        self._compact()
        self.bus.on_schedule = self.on_schedule
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        self.file.close()

    def _load_record(self, meta: dict[str, Any], bodies: list[bytes]) -> None:
        try:
            if meta["op"] == "fired":
                self.table.note_fired(bodies[0], int(meta["t"]), str(meta["j"]))
                return
            got = sch.from_wire(meta, bodies, 1 << 62)  # kept before: the bound then held
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            got = Error(f"ERR malformed record ({exc!r})")
        if isinstance(got, Error):
            log.warning("schedules file: a record refused: %s", got)
            self.refused += 1
            return
        spec, last_fire_ms, last_job = got
        self.table.apply(spec, bounded=False)  # what the file holds stays, whatever the bound
        self.table.note_fired(spec.name, last_fire_ms, last_job, count=False)
        entry = self.table.entries.get(spec.name)
        if entry is not None:
            entry.fired = max(entry.fired, int(meta.get("fc", 0)))
            entry.skipped = max(entry.skipped, int(meta.get("sk", 0)))

    def _compact(self) -> None:
        if self.refused or self.file.records <= 4 * len(self.table.entries) + 64:
            return  # a record this node could not read (no cronsim ...) is never rewritten away
        records = []
        for entry in self.table.entries.values():
            meta, bodies = sch.to_wire(entry)
            records.append(({**meta, "fc": entry.fired, "sk": entry.skipped}, bodies))
        self.file.rewrite(records)

    # ---- SCHEDULE (any worker's client, run here) -------------------------------

    def execute(self, bus: ClusterBus, args: list[bytes]) -> Any:
        self.wake()
        sub = args[0].lower() if args else b""
        now = wall_ms()
        if sub == b"set":
            return self._set(args[1:], now)
        if sub == b"del" and len(args) == 2:
            entry = self.table.get(args[1])
            if entry is None:
                return 0
            spec = sch.Spec(args[1], "", "UTC", 0, [], max(now, entry.spec.set_ms + 1),
                            self.me(), True)
            self._take(spec)
            return 1
        if sub == b"list" and len(args) == 1:
            return sorted(e.spec.name for e in self.table.live())
        if sub == b"show" and len(args) == 2:
            return self.table.show(args[1], self.me(), self.nodes())
        return Error("ERR SCHEDULE subcommand must be SET, DEL name, LIST or SHOW name")

    def _set(self, args: list[bytes], now: int) -> Any:
        spec = sch.parse_set(args, self.body_bytes_max)
        if isinstance(spec, Error):
            return spec
        if self.table.full(spec.name):
            return Error(ERR_SCHEDULES_FULL.format(self.table.schedules_max))
        old = self.table.entries.get(spec.name)
        spec.set_ms = max(now, old.spec.set_ms + 1 if old is not None else 0)
        spec.origin = self.me()
        self._take(spec)
        return OK

    def _take(self, spec: sch.Spec) -> None:
        """A SET or DEL of ours: into the table, the file and every member."""
        if not self.table.apply(spec):
            return
        entry = self.table.entries[spec.name]
        meta, bodies = sch.to_wire(entry)
        self.file.append(meta, bodies)
        self.bus.send_schedule("*", meta, bodies)

    # ---- SCHED frames from the other nodes ----------------------------------------

    def on_schedule(self, sender: str, meta: dict[str, Any], bodies: list[bytes]) -> None:
        self.wake()
        op = meta["op"]
        if op == "sum":
            if meta["h"] != self.table.digest():
                self._send_table(sender)
            return
        if op == "fired":
            if self.table.note_fired(bodies[0], int(meta["t"]), str(meta["j"])):
                self.file.append(meta, bodies)
            return
        got = sch.from_wire(meta, bodies, self.body_bytes_max)
        if isinstance(got, Error):
            log.warning("schedule %r from %s refused: %s", bodies[0][:64], sender[:8], got)
            return
        spec, last_fire_ms, last_job = got
        if self.table.apply(spec):
            self.file.append(*sch.to_wire(self.table.entries[spec.name]))
        elif not spec.deleted and self.table.full(spec.name):
            log.warning("schedule %r from %s refused: schedules-max (%d) reached",
                        spec.name[:64], sender[:8], self.table.schedules_max)
        if self.table.note_fired(spec.name, last_fire_ms, last_job, count=False):
            self.file.append({"op": "fired", "t": last_fire_ms, "j": last_job}, [spec.name])

    def _send_table(self, node_id: str) -> None:
        for entry in list(self.table.entries.values()):
            meta, bodies = sch.to_wire(entry)
            self.bus.send_schedule(node_id, meta, bodies)

    # ---- time -------------------------------------------------------------------

    def nodes(self) -> list[str]:
        """Who may fire: the members we see as reachable and not leaving, and us
        unless we are leaving (then we fire only after all of them had their turn)."""
        view = self.bus.view()
        others = [p.node_id for p in mb.peers(view) if p.reachable and not p.leaving]
        return others if view.get("leaving") else [self.me(), *others]

    def wake(self) -> None:
        """Something changed (a SET or DEL, a peer's frame, the membership view): the
        timer looks again now."""
        self.changed.set()

    async def _run(self) -> None:
        while True:
            try:
                sleep_ms = self.tick(wall_ms())
            except Exception:  # a bug here must not stop every schedule for good
                log.exception("schedules tick failed")
                sleep_ms = wake_ms_max
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(),
                                       None if sleep_ms is None else sleep_ms / 1000)

    def tick(self, now: int) -> int | None:
        """Fire what is due, greet new members; the ms until the next look (None:
        nothing to look at until a change)."""
        nodes = self.nodes()
        self._greet(nodes, now)
        for fire in self.table.due(now, self.me(), nodes):
            if len(self.in_flight) >= fired_in_flight_max:
                self.table.note_failed(fire.name, fire.fire_ms, "too many firings in flight")
                continue
            task = asyncio.get_running_loop().create_task(self._fire(fire))
            self.in_flight.add(task)
            task.add_done_callback(self.in_flight.discard)
        self.file.sync()
        self._compact()
        wake = []
        due_ms = self.table.next_wake_ms(now, self.me(), nodes)
        if due_ms is not None:
            wake.append(min(due_ms, now + wake_ms_max))
        if len(nodes) > 1 or nodes[:1] != [self.me()]:
            wake.append(self.digest_at_ms)
        return max(min(wake) - now, 1) if wake else None

    def _greet(self, nodes: list[str], now: int) -> None:
        members = set(nodes) - {self.me()}
        self.greeted &= members
        digest = {"op": "sum", "h": self.table.digest()}
        if now >= self.digest_at_ms:
            self.digest_at_ms = now + digest_interval_ms
            self.bus.send_schedule("*", digest, [])
            self.greeted = members
            return
        for node_id in members - self.greeted:
            if self.bus.send_schedule(node_id, digest, []):
                self.greeted.add(node_id)

    async def _fire(self, fire: sch.Fire) -> None:
        from disque_mp.node.http.commands import ReplyError, call

        if fire.missed:
            log.info("schedule %r: fire time %d passed while this node was down: firing it "
                     "once (schedule-missed once)", fire.name[:64], fire.fire_ms)
        try:
            reply = await call(self.w, b"ADDJOB", *fire.args)
        except ReplyError as exc:
            log.warning("schedule %r: ADDJOB at %d failed: %s", fire.name[:64], fire.fire_ms, exc)
            self.table.note_failed(fire.name, fire.fire_ms, str(exc))
            return
        job_id = reply.decode() if isinstance(reply, bytes) else str(reply)
        if self.table.note_fired(fire.name, fire.fire_ms, job_id):
            meta = {"op": "fired", "t": fire.fire_ms, "j": job_id}
            self.file.append(meta, [fire.name])
            self.bus.send_schedule("*", meta, [fire.name])
            self.wake()  # the next look fsyncs the record (appendfsync everysec)
