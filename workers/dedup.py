"""Idempotent adds (``ADDJOB ... DEDUP <key>``, docs/extensions.md): the index of
the deduplication keys this shard's jobs hold.

A job added with ``DEDUP <key>`` holds the key in its queue while it is not
acknowledged: queued, delayed, active or waiting for its copies. An ADDJOB with
the same queue and key then adds nothing and answers the holder's ID
(``Shard.op_addjob`` asks ``held``). The key travels with every copy of the job
(record version 3: REPLJOB, YOURJOBS, the AOF), so the index is kept from the
core's events, whichever path a job enters or leaves the table by:

- ``after_ext_registered``: a job with extension fields entered the table (ADDJOB,
  a REPLJOB copy, YOURJOBS, AOF load): its key is held, unless it is acknowledged
  already (an AOF record of an acked job). Two jobs may hold one key on a node:
  producers added it on two nodes with no copy of each other's job, then one job
  came to the other node (YOURJOBS, or a copy). The first one here answers; the
  others wait in ``more`` and the next one answers when it leaves;
- ``after_ack``: acknowledged here (ACKJOB, or the ACK of another holder): the
  key is free again, though the job stays for the ACK's garbage collection;
- ``after_ext_unregistered``: the job left the table (FASTACK, DELJOB, TTL, the
  ACK GC, a failed replication, DELQUEUE): the key is free again.

A dead-letter queue shares its queue's keys: the key's queue is the job's queue
without ``dead:``. So a job moved to ``dead:<queue>`` (MAXDELIVER, DEADLETTER)
still holds its key until it is acknowledged, deleted or expired: a producer that
re-sends it gets the dead letter's ID rather than a second job, and a job moved
back to its queue keeps its key. FLUSHALL empties the index (``reset``).

Keys kept past the ACK (``ADDJOB ... DEDUP key DEDUP-KEEP seconds``, the job's
``ext.keep_s``, carried with its copies and records like the key): when such a job
is acknowledged here (ACKJOB, or the ACK of another holder: SETACK), its key moves
to ``kept`` with the time it stops answering, and ``held`` answers the job's ID
until then, so a producer that re-sends after the ACK adds nothing. A job that
leaves otherwise (FASTACK, DELJOB, TTL) frees its key as before. Kept keys are this
node's: with appendonly on each is an AOF record (``kept_record``, loaded back
until it expires; one forgotten at the bound may come back after a restart until
then), count in ``keys_max`` (the kept ones are
forgotten first) and in the memory estimate (``kept_bytes``); an expired one goes
when it is next looked up, or at the bound. DEDUP-KEEP is at most ``keep_max_s``
(config dedup-keep-max).

Bound: ``keys_max`` keys per shard (config ``dedup-keys-max``, per worker). At
the bound the oldest key is forgotten (its job stays, it is only no longer
deduplicated), counted in ``forgotten``: an ADDJOB never fails for the index, as
a producer expects of an add, and a key is forgotten only after the newest
``keys_max`` ones, the way Redis' IDMP and NATS' duplicate window forget the
oldest ids. INFO shows ``dedup_keys``, ``dedup_hits``, ``dedup_keys_forgotten``.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from typing import Final

from workers.core import Core, Events
from workers.ids import DEAD_PREFIX
from workers.invariant import InvariantError, invariant
from workers.job import (
    ACKED,
    KEPT_KEY_RECORD_TAG,
    Job,
    dedup_bytes_max,
    dedup_entry_bytes,
    queue_name_bytes_max,
)

# Keys one shard holds, by default (config dedup-keys-max): a key costs about 200
# bytes beside its job (which costs more), so the index stays a fraction of the jobs'
# own memory; past it the oldest key is forgotten.
dedup_keys_max_default: Final = 1_000_000

_DEAD_PREFIX_LEN: Final = len(DEAD_PREFIX)

_Key = tuple[bytes, bytes]  # (the queue without dead:, the DEDUP key)
_KEPT_HEAD: Final = struct.Struct(">BQ")
_QUEUE_LEN: Final = struct.Struct(">H")
_JOB_ID_BYTES: Final = 40


def kept_record(k: _Key, job_id: str, until_ms: int) -> bytes:
    """The AOF record of a kept key (KEPT_KEY_RECORD_TAG, workers/job.py)."""
    return (_KEPT_HEAD.pack(KEPT_KEY_RECORD_TAG, until_ms) + job_id.encode()
            + _QUEUE_LEN.pack(len(k[0])) + k[0] + k[1])


def parse_kept_record(rec: bytes) -> tuple[_Key, str, int]:
    """(key, job ID, until ms) of a kept key record; ``ValueError`` when malformed."""
    at = _KEPT_HEAD.size + _JOB_ID_BYTES
    if len(rec) < at + _QUEUE_LEN.size or rec[0] != KEPT_KEY_RECORD_TAG:
        raise ValueError("not a kept key record")
    until_ms = _KEPT_HEAD.unpack_from(rec)[1]
    job_id = rec[_KEPT_HEAD.size:at].decode("ascii", "strict")
    qlen = _QUEUE_LEN.unpack_from(rec, at)[0]
    at += _QUEUE_LEN.size
    queue, key = rec[at:at + qlen], rec[at + qlen:]
    if len(queue) != qlen or qlen > queue_name_bytes_max or not 0 < len(key) <= dedup_bytes_max:
        raise ValueError("kept key record: bad queue or key")
    return (queue, key), job_id, until_ms


def home_queue(queue: bytes) -> bytes:
    """The queue whose keys a job of ``queue`` holds: a dead-letter queue's own."""
    if queue[:_DEAD_PREFIX_LEN] == DEAD_PREFIX:
        return queue[_DEAD_PREFIX_LEN:]
    return queue


class Dedup(Events):
    """The DEDUP keys held by this shard's jobs (``Shard.dedup``)."""

    def __init__(self, core: Core, keys_max: int = dedup_keys_max_default) -> None:
        self.core = core
        invariant(keys_max > 0, "dedup keys_max must be positive")
        self.keys_max = keys_max
        # (queue, key) -> the ID of the job holding it, oldest first (the bound
        # forgets from the front)
        self.keys: OrderedDict[_Key, str] = OrderedDict()
        # further jobs holding a key already in ``keys``, in arrival order (rare)
        self.more: dict[_Key, list[str]] = {}
        self.more_count = 0  # sum of the lists' lengths
        self.hits = 0  # ADDJOBs answered with a held job's ID (monotonic)
        self.forgotten = 0  # keys forgotten at the bound while their job stayed (monotonic)
        # a key was forgotten since the last FLUSHALL: some job may hold no entry
        # (the invariant check then skips its completeness half)
        self.partial = False
        # keys of acknowledged jobs kept answering (DEDUP-KEEP): key -> (the job's
        # ID, until ms), in the order they were kept
        self.kept: OrderedDict[_Key, tuple[str, int]] = OrderedDict()
        self.kept_by_job: dict[str, _Key] = {}  # the AOF rewrite finds a kept key by its job
        self.kept_bytes = 0  # their memory estimate (dedup_entry_bytes + the key's bytes)
        self.keep_max_s = 7 * 24 * 3600  # config dedup-keep-max
        core.subscribe(self, "after_ack", "after_ext_registered", "after_ext_unregistered")

    def held(self, queue: bytes, key: bytes, now_ms: int = 0) -> str | None:
        """ADDJOB ... DEDUP: the ID of the job that holds ``key`` in ``queue`` (or
        held it and was acknowledged less than its DEDUP-KEEP ago), or None (the
        ADDJOB adds its job)."""
        k = (home_queue(queue), key)
        jid = self.keys.get(k)
        if jid is None and self.kept:
            got = self.kept.get(k)
            if got is not None:
                if got[1] > now_ms:
                    jid = got[0]
                else:
                    self._unkeep(k)
        if jid is not None:
            self.hits += 1
        return jid

    def _keep(self, k: _Key, job_id: str, until_ms: int, log: bool = True) -> None:
        if k in self.kept:
            self._unkeep(k)
        if self.count() >= self.keys_max:
            self._forget_oldest()
        self.kept[k] = (job_id, until_ms)
        self.kept_by_job[job_id] = k
        self.kept_bytes += dedup_entry_bytes + len(k[0]) + len(k[1])
        if log and self.core.aof_on():
            self.core.log_record(kept_record(k, job_id, until_ms))

    def _unkeep(self, k: _Key) -> None:
        job_id, _until = self.kept.pop(k)
        self.kept_by_job.pop(job_id, None)
        self.kept_bytes -= dedup_entry_bytes + len(k[0]) + len(k[1])

    def load_kept(self, record: bytes, now_ms: int) -> None:
        """Replay a kept key record (until it expires; a key another job holds stays
        that job's; the job's own record may come first, its deletion after)."""
        k, job_id, until_ms = parse_kept_record(record)
        if until_ms > now_ms and self.keys.get(k, job_id) == job_id:
            self._keep(k, job_id, until_ms, log=False)

    def kept_record_of(self, job_id: str) -> bytes | None:
        """The AOF record of the key kept for ``job_id`` (the rewrite), or None."""
        k = self.kept_by_job.get(job_id)
        if k is None:
            return None
        return kept_record(k, job_id, self.kept[k][1])

    def set_keys_max(self, n: int) -> None:
        """config dedup-keys-max: a lower bound forgets the oldest keys at once."""
        invariant(n > 0, "dedup keys_max must be positive")
        self.keys_max = n
        while self.count() > n:
            self._forget_oldest()

    def reset(self) -> None:
        """FLUSHALL: every job is gone (the counters stay)."""
        self.keys = OrderedDict()
        self.more = {}
        self.more_count = 0
        self.partial = False
        self.kept = OrderedDict()
        self.kept_by_job = {}
        self.kept_bytes = 0

    def count(self) -> int:
        """The jobs whose key is held or kept (what ``keys_max`` bounds)."""
        return len(self.keys) + self.more_count + len(self.kept)

    # ------------------------------------------------------------------ events

    def after_ext_registered(self, job: Job) -> None:
        ext = job.ext
        if ext is None or not ext.dedup or job.state == ACKED:
            return
        k = (home_queue(job.queue), ext.dedup)
        keys = self.keys
        if self.count() >= self.keys_max:
            self._forget_oldest()
        if k not in keys:
            keys[k] = job.id
            return
        more = self.more.get(k)  # another job here holds it: the first one answers
        if more is None:
            self.more[k] = [job.id]
        else:
            more.append(job.id)
        self.more_count += 1

    def after_ack(self, job_id: str) -> None:
        if self.keys:
            job = self.core.lookup(job_id)
            if job is not None:
                self._release(job, True)

    def after_ext_unregistered(self, job: Job) -> None:
        if self.keys:
            self._release(job, False)

    def _release(self, job: Job, acked: bool) -> None:
        """The job no longer holds its key; ``acked``: by its ACK (its DEDUP-KEEP,
        if any, keeps the key answering from the time of the ACK, ``Core.now_ms``)."""
        ext = job.ext
        if ext is None or not ext.dedup:
            return
        k = (home_queue(job.queue), ext.dedup)
        jid = job.id
        keys = self.keys
        held = keys.get(k)
        if held is None:
            return
        more = self.more.get(k) if self.more_count else None
        if held == jid:
            if more is None:
                del keys[k]
                if acked and ext.keep_s:
                    self._keep(k, jid, self.core.now_ms() + min(ext.keep_s, self.keep_max_s) * 1000)
                return
            keys[k] = more.pop(0)  # the next job holding it answers (same age)
        elif more is None or jid not in more:
            return
        else:
            more.remove(jid)
        self.more_count -= 1
        if not more:
            del self.more[k]

    def _forget_oldest(self) -> None:
        if self.kept:  # a kept key (its job is done) goes before a held one
            self._unkeep(next(iter(self.kept)))
            self.forgotten += 1
            return
        k, _jid = self.keys.popitem(last=False)
        forgotten = 1
        if self.more_count:
            more = self.more.pop(k, None)
            if more is not None:
                forgotten += len(more)
                self.more_count -= len(more)
        self.forgotten += forgotten
        self.partial = True

    # ------------------------------------------------------------------ checks

    def check(self) -> None:
        """Every key names a registered, unacknowledged job of its queue with that
        key; every such job's key is held (by it or by an earlier job) unless a key
        was forgotten at the bound (tests; O(jobs))."""
        keys = self.keys
        invariant(self.count() <= self.keys_max, f"{self.count()} dedup keys > {self.keys_max}")
        invariant(self.more_count == sum(len(m) for m in self.more.values()),
                  "dedup more_count wrong")
        invariant(self.kept_bytes == sum(dedup_entry_bytes + len(q) + len(key)
                                         for q, key in self.kept), "dedup kept_bytes wrong")
        held: list[tuple[_Key, str]] = list(keys.items())
        for k, more in self.more.items():
            invariant(k in keys and bool(more), f"dedup key {k!r}: more without a first")
            held += [(k, jid) for jid in more]
        ids = {jid for _k, jid in held}
        invariant(len(ids) == len(held), "a job holds a dedup key twice")
        core = self.core
        for (queue, key), jid in held:
            job = core.lookup(jid)
            if job is None:
                raise InvariantError(f"dedup key {key!r} names a job not held: {jid}")
            invariant(job.state != ACKED, f"dedup key {key!r} held by acked job {jid}")
            invariant(job.dedup == key and home_queue(job.queue) == queue,
                      f"dedup key ({queue!r}, {key!r}) names job {jid} of "
                      f"({job.queue!r}, {job.dedup!r})")
        if self.partial:
            return
        for job in core.jobs():
            ext = job.ext
            if ext is not None and ext.dedup and job.state != ACKED:
                invariant(job.id in ids,
                          f"job {job.id} holds dedup key {ext.dedup!r} not in the index")
