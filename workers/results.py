"""Job results and progress (``ACKJOB id RESULT value``, ``RESULT id [TIMEOUT ms]``,
``WORKING id PROGRESS value``; docs/extensions.md): what this shard keeps of them.

``Results`` is a part the shard owns (``Shard.results``). It holds:

- ``values``: job ID -> (value, expire ms), oldest first. A value is stored by
  ``ACKJOB id RESULT value`` here, or by a SETACK that carries it (the acking node
  sends it with the ACK to every node that may hold a copy: ``AckGc.start_gc``
  reads ``value_of``), and kept ``ttl_s`` (config result-ttl) whatever becomes of
  the job. Bounded: one value at most ``value_bytes_max`` (config
  result-bytes-max, refused past it), all of them ``store_bytes_max`` (config
  result-store-bytes-max, the oldest dropped past it); under memory pressure they
  are the first thing evicted (workers/evict.py). With appendonly on, a value is
  an AOF record (``result_record``) so a restart keeps it until it expires;
- ``progress``: job ID -> the last ``WORKING id PROGRESS value`` of a job held here
  and not acknowledged (SHOW lists it); dropped when the job is acknowledged or
  leaves. Each value at most ``progress_bytes_max`` (config progress-bytes-max);
  there is at most one per job held;
- the RESULT commands waiting on this shard: a ``ResultWait`` for a job held here
  and still pending (answered when it is acknowledged or leaves, or at its
  timeout), and a ``ResultAsk`` gathering the other nodes' answers (RESULTASK /
  RESULTIS, workers/messages.py) for a job this node does not hold.

RESULT's replies: the value (a bulk string) once the job is acknowledged with
one; ``["progress", value]`` (a 2-element array) for a job still pending that
reported progress; null otherwise (no result, a job long gone, a pending job
without progress at the end of its wait).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, Final

from workers import messages as msg
from workers.core import Core, Events
from workers.ids import slot_of_job_id
from workers.job import ACKED, RESULT_RECORD_TAG, Timed
from workers.replies import PENDING, Error

# Defaults of the config values (disque_mp/node/config.py says why each).
result_ttl_default_s: Final = 3600
result_bytes_max_default: Final = 1 << 20
result_store_bytes_max_default: Final = 256 << 20
progress_bytes_max_default: Final = 4096
# What a stored value costs beyond its bytes (dict slot, tuple, ints, bytes header):
# the memory estimate counts it (measured with tracemalloc, about 200 bytes).
result_entry_bytes: Final = 200
# RESULT on a node that does not hold the job: how long it waits for the other
# nodes' answers (as GLOBALQLEN does); a node that has not answered is left out.
result_ask_timeout_ms: Final = 1000
# RESULT commands one shard keeps waiting (blocked RESULTs and cluster asks);
# one more is refused with ERR_WAITS_MAX.
result_waits_max: Final = 100_000
# Values one sweep drops (the timer fires again at once when there are more).
sweep_max: Final = 1000

PROGRESS: Final = b"progress"
ERR_WAITS_MAX: Final = Error(
    f"ERR too many RESULT commands waiting: at most {result_waits_max} per worker, try later")
ERR_UNKNOWN_ID: Final = Error(
    "ERR unknown job ID: no node of this cluster created it")
ERR_RESULT_SIZE_FMT: Final = "ERR RESULT value too large (at most {} bytes: result-bytes-max)"
ERR_PROGRESS_SIZE_FMT: Final = "ERR PROGRESS value too large (at most {} bytes: progress-bytes-max)"

# The AOF record of a stored value: RESULT_RECORD_TAG (workers/job.py: never a job
# record version nor the deletion tag), the expire time (ms, u64), the 40-character
# job ID, the value.
_RESULT_HEAD: Final = struct.Struct(">BQ")
JOB_ID_BYTES: Final = 40


def result_record(job_id: str, value: bytes, expire_ms: int) -> bytes:
    return _RESULT_HEAD.pack(RESULT_RECORD_TAG, expire_ms) + job_id.encode() + value


def parse_result_record(rec: bytes) -> tuple[str, bytes, int]:
    """(job ID, value, expire ms) of a result record; ``ValueError`` when malformed."""
    head = _RESULT_HEAD.size
    if len(rec) < head + JOB_ID_BYTES or rec[0] != RESULT_RECORD_TAG:
        raise ValueError("not a result record")
    expire_ms = _RESULT_HEAD.unpack_from(rec)[1]
    job_id = rec[head:head + JOB_ID_BYTES].decode("ascii", "strict")
    return job_id, rec[head + JOB_ID_BYTES:], expire_ms


class ResultWait(Timed):
    """A RESULT waiting on this shard: for a pending job held here (``ask`` False),
    or for the other nodes' answers (``ask`` True; ``waiting``: nodes not answered
    yet, ``progress``: the best answer so far)."""

    __slots__ = ("token", "job_id", "ask", "waiting", "progress", "finished")

    def __init__(self, token: int, job_id: str, ask: bool) -> None:
        self.token = token
        self.job_id = job_id
        self.ask = ask
        self.waiting: set[str] = set()
        self.progress: bytes | None = None
        self.finished = False
        self.awake_ms = 0


class Sweep(Timed):
    """The timer of the oldest stored value's expiry (one per shard)."""

    __slots__ = ()

    def __init__(self) -> None:
        self.awake_ms = 0


class Results(Events):
    """The stored results, the progress values and the waiting RESULTs of one shard."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.ttl_s = result_ttl_default_s
        self.value_bytes_max = result_bytes_max_default
        self.store_bytes_max = result_store_bytes_max_default
        self.progress_bytes_max = progress_bytes_max_default
        self.sweep = Sweep()
        self.stored = 0  # values stored (monotonic)
        self.expired = 0  # dropped at their TTL (monotonic)
        self.evicted = 0  # dropped at store_bytes_max or under memory pressure (monotonic)
        self.values: dict[str, tuple[bytes, int]] = {}
        self.progress: dict[str, bytes] = {}
        self.held_bytes = 0  # values and progress, with their entries (memory estimate)
        self.waits: dict[str, list[ResultWait]] = {}
        self.asks: dict[int, ResultWait] = {}
        self.wait_count = 0
        # subscribed to the job events only while progress or a wait is held: a
        # plain job's ACK and removal then call nothing of this part
        self.watching = False

    def reset(self) -> None:
        """FLUSHALL: every value, progress and wait goes (waiting RESULTs answer null)."""
        for ws in list(self.waits.values()):
            for w in list(ws):
                self._finish(w, None)
        for w in list(self.asks.values()):
            self._finish(w, None)
        self.values = {}
        self.progress = {}
        self.held_bytes = 0
        self.waits = {}
        self.asks = {}
        self.wait_count = 0
        self._unwatch_if_idle()
        self.core.unschedule(self.sweep)

    # ------------------------------------------------------------------ values

    def value_of(self, job_id: str, now_ms: int) -> bytes | None:
        """The stored value (None: none, or expired)."""
        got = self.values.get(job_id)
        if got is None or got[1] <= now_ms:
            return None
        return got[0]

    def store(self, job_id: str, value: bytes, now_ms: int, expire_ms: int = 0,
              log: bool = True) -> None:
        """Keep ``value`` as the job's result until ``expire_ms`` (0: ttl_s from now)."""
        self.drop(job_id)
        if not expire_ms:
            expire_ms = now_ms + self.ttl_s * 1000
        if expire_ms <= now_ms:
            return
        self.values[job_id] = (value, expire_ms)
        self.held_bytes += result_entry_bytes + len(value)
        self.stored += 1
        while self.held_bytes > self.store_bytes_max and len(self.values) > 1:
            self._drop_oldest()
        if log and self.core.aof_on():
            self.core.log_record(result_record(job_id, value, expire_ms))
        if self.sweep.awake_ms == 0:
            self.core.schedule(self.sweep, expire_ms)

    def drop(self, job_id: str) -> bool:
        got = self.values.pop(job_id, None)
        if got is None:
            return False
        self.held_bytes -= result_entry_bytes + len(got[0])
        return True

    def _drop_oldest(self) -> None:
        job_id = next(iter(self.values))
        self.drop(job_id)
        self.evicted += 1

    def evict(self, count: int) -> int:
        """Memory pressure: drop up to ``count`` of the oldest values; how many went."""
        n = 0
        while self.values and n < count:
            self._drop_oldest()
            n += 1
        return n

    def fire_sweep(self, now_ms: int) -> None:
        """Drop the values whose TTL elapsed, oldest first (bounded); re-arm."""
        values = self.values
        n = 0
        while values and n < sweep_max:
            job_id = next(iter(values))
            expire_ms = values[job_id][1]
            if expire_ms > now_ms:
                break
            self.drop(job_id)
            self.expired += 1
            n += 1
        if values:
            first = values[next(iter(values))][1]
            # a value stored before a lower result-ttl may expire after a later one:
            # the sweep looks again at the oldest's time, or soon after a full sweep
            self.core.schedule(self.sweep, now_ms if n >= sweep_max else max(first, now_ms + 1))

    def items(self, now_ms: int) -> Iterator[tuple[str, bytes, int]]:
        """Every stored value (AOF rewrite, the admin CLI's listing)."""
        now = now_ms
        for job_id, (value, expire_ms) in self.values.items():
            if expire_ms > now:
                yield job_id, value, expire_ms

    # ------------------------------------------------------------------ progress

    def _watch(self) -> None:
        if not self.watching:
            self.watching = True
            self.core.subscribe(self, "after_ack", "after_job_gone")

    def _unwatch_if_idle(self) -> None:
        if self.watching and not self.progress and not self.waits:
            self.watching = False
            self.core.unsubscribe(self, "after_ack", "after_job_gone")

    def set_progress(self, job_id: str, value: bytes) -> None:
        self._watch()
        old = self.progress.get(job_id)
        if old is not None:
            self.held_bytes -= result_entry_bytes + len(old)
        self.progress[job_id] = value
        self.held_bytes += result_entry_bytes + len(value)

    def progress_of(self, job_id: str) -> bytes | None:
        return self.progress.get(job_id) if self.progress else None

    def _drop_progress(self, job_id: str) -> None:
        old = self.progress.pop(job_id, None)
        if old is not None:
            self.held_bytes -= result_entry_bytes + len(old)
            if not self.progress:
                self._unwatch_if_idle()

    def pending_reply(self, job_id: str) -> Any:
        """RESULT of a pending job: its progress (distinct shape) or null."""
        p = self.progress_of(job_id)
        return None if p is None else [PROGRESS, p]

    # ------------------------------------------------------------------ RESULT

    def op_result(self, token: int, job_id: str, timeout_ms: int | None, now_ms: int) -> Any:
        """``RESULT id [TIMEOUT ms]`` on the job's owner: the value, the progress of a
        pending job, null; PENDING while it waits (``Wake(token, reply)`` later):
        for a pending job held here when TIMEOUT was given (0: until the job is done),
        for the other nodes' answers when this node does not hold the job."""
        value = self.value_of(job_id, now_ms)
        if value is not None:
            return value
        c = self.core
        job = c.lookup(job_id)
        if job is not None:
            if job.state == ACKED or timeout_ms is None:
                return None if job.state == ACKED else self.pending_reply(job_id)
            if self.wait_count >= result_waits_max:
                return ERR_WAITS_MAX
            w = ResultWait(token, job_id, False)
            self._watch()
            self.waits.setdefault(job_id, []).append(w)
            self.wait_count += 1
            if timeout_ms:
                c.schedule(w, now_ms + timeout_ms)
            return PENDING
        v = c.view()
        creator = job_id[2:10]
        if creator != v.node_id[:8] and all(n[:8] != creator for n in v.known):
            return ERR_UNKNOWN_ID  # no node of this cluster made it
        nodes = v.reach if v.reach is not None else v.peers
        if not nodes:
            return None
        if self.wait_count >= result_waits_max:
            return ERR_WAITS_MAX
        w = ResultWait(token, job_id, True)
        w.waiting = set(nodes)
        self.asks[token] = w
        self.wait_count += 1
        slot = slot_of_job_id(job_id)
        for n in nodes:
            c.send(n, msg.RESULTASK, slot, msg.resultask_meta(job_id, token))
        c.schedule(w, now_ms + result_ask_timeout_ms)
        return PENDING

    def fire_wait(self, w: ResultWait, now_ms: int) -> None:
        """A RESULT's timeout: what is known now."""
        if w.finished:
            return
        if w.ask:
            self._finish(w, None if w.progress is None else [PROGRESS, w.progress])
        else:
            value = self.value_of(w.job_id, now_ms)
            self._finish(w, value if value is not None else self.pending_reply(w.job_id))

    def _finish(self, w: ResultWait, reply: Any) -> None:
        if w.finished:
            return
        w.finished = True
        self.wait_count -= 1
        self.core.unschedule(w)
        if w.ask:
            self.asks.pop(w.token, None)
        else:
            ws = self.waits.get(w.job_id)
            if ws is not None:
                if w in ws:
                    ws.remove(w)
                if not ws:
                    del self.waits[w.job_id]
                    self._unwatch_if_idle()
        self.core.wake(w.token, reply)

    def after_ack(self, job_id: str) -> None:
        if self.progress:
            self._drop_progress(job_id)
        if self.waits:
            self._job_done(job_id)

    def after_job_gone(self, job_id: str) -> None:
        if self.progress:
            self._drop_progress(job_id)
        if self.waits:
            self._job_done(job_id)

    def _job_done(self, job_id: str) -> None:
        ws = self.waits.get(job_id)
        if ws is None:
            return
        got = self.values.get(job_id)
        value = None if got is None else got[0]
        for w in list(ws):
            self._finish(w, value)

    # ------------------------------------------------------------------ messages

    def on_resultask(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                     now_ms: int) -> None:
        """Another node asks for a job's result: the value, the progress of a pending
        job held here, or nothing."""
        job_id = meta["j"]
        value = self.value_of(job_id, now_ms)
        slot = slot_of_job_id(job_id)
        if value is not None:
            self.core.send(sender, msg.RESULTIS, slot,
                           msg.resultis_meta(job_id, meta["r"], msg.RESULT_VALUE), [value])
            return
        job = self.core.lookup(job_id)
        p = self.progress_of(job_id) if job is not None and job.state != ACKED else None
        if p is not None:
            self.core.send(sender, msg.RESULTIS, slot,
                           msg.resultis_meta(job_id, meta["r"], msg.RESULT_PROGRESS), [p])
            return
        self.core.send(sender, msg.RESULTIS, slot,
                       msg.resultis_meta(job_id, meta["r"], msg.RESULT_NONE))

    def on_resultis(self, sender: str, meta: dict[str, Any], bodies: list[bytes],
                    now_ms: int) -> None:
        w = self.asks.get(meta["r"])
        if w is None or sender not in w.waiting or w.job_id != meta["j"]:
            return
        w.waiting.discard(sender)
        kind = meta["s"]
        if kind == msg.RESULT_VALUE:
            self._finish(w, bytes(bodies[0]))
            return
        if kind == msg.RESULT_PROGRESS and w.progress is None:
            w.progress = bytes(bodies[0])
        if not w.waiting:
            self.fire_wait(w, now_ms)

    # ------------------------------------------------------------------ figures

    def info(self) -> dict[str, int]:
        return {"results": len(self.values), "results_bytes": self.held_bytes,
                "results_stored": self.stored, "results_expired": self.expired,
                "results_evicted": self.evicted, "progress_jobs": len(self.progress),
                "results_waiting": self.wait_count}
