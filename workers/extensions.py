# mypy: disable-error-code="misc"
# (Mixin methods take ``self: Shard``, as in workers/federation.py.)
"""The shard's side of the extensions beyond the reference (docs/extensions.md):
NACK ... DELAY, ADDJOB ... MAXDELIVER (dead letters).

``ExtOps`` is a base of ``Shard`` like ``ClusterOps``: the extensions change the
same job records and timers as the reference's commands, so they live on the same
object; keeping them in their own file keeps the reference's state machine
readable on its own. Cluster messages they add to (``QUEUED``) are listed in
workers/federation.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from workers.effects import AofAppend
from workers.federation import QUEUED_INCR_NACKS, ClusterOps
from workers.job import (
    DEAD_PREFIX,
    FLAG_NACK_DELAYED,
    FLAG_QUEUED_ONCE,
    FLAG_WILLQUEUE_SENT,
    FLAGS_DELAY_MASK,
    QUEUED,
    Job,
)

if TYPE_CHECKING:
    from workers.shard import Shard

# QUEUED's extension fields: "w" the ms the sender waits before queueing the job
# (NACK ... DELAY: no other holder may queue it earlier), "dl" 1 when the sender
# moved the job to its dead-letter queue (every holder follows).
QUEUED_WAIT: Final = "w"
QUEUED_DEAD: Final = "dl"


def dead_queue_of(queue: bytes) -> bytes:
    return DEAD_PREFIX + queue


class ExtOps(ClusterOps):
    """NACK DELAY and MAXDELIVER on the shard (mixin of Shard). One chain of bases
    (ClusterOps, ExtOps, Shard): mypyc compiles single inheritance only."""

    # ------------------------------------------------------------------ NACK DELAY

    def _nack_later(self: Shard, job: Job, delay_ms: int, now_ms: int) -> None:
        """NACK ... DELAY: the job stays active (not deliverable) until the delay
        ends, then is queued without counting a further delivery. Every other
        holder pushes its own requeue past the delay (QUEUED with "w")."""
        self._forget_delivery(job)
        job.flags = (job.flags & ~FLAG_WILLQUEUE_SENT) | FLAG_NACK_DELAYED
        job.qtime_ms = now_ms + delay_ms
        self._reschedule(job)
        others = self._others(job)
        if others:
            self._send_job(others, "QUEUED", job,
                           {"j": job.id, "f": QUEUED_INCR_NACKS, QUEUED_WAIT: delay_ms})
        if self.aof:
            self._effects.append(AofAppend(job.to_record()))

    # ------------------------------------------------------------------ MAXDELIVER

    def _past_maxdeliver(self: Shard, job: Job) -> bool:
        """The job was delivered ``maxdeliver`` times (first delivery, then one per
        NACK or redelivery, as this node counts them) and is not a dead letter yet."""
        cap = job.maxdeliver
        return bool(cap) and job.nacks + job.additional_deliveries >= cap \
            and not job.queue.startswith(DEAD_PREFIX)

    def _dead_letter(self: Shard, job: Job, now_ms: int, incr: int) -> None:
        """Queue the job in ``dead:<queue>`` (same ID, same counters) instead of its
        queue; the other holders move their copies too (QUEUED with "dl")."""
        self.stat_dead_lettered += 1
        dq = self._move_to_dead(job, now_ms)
        self._enqueue(job, dq, now_ms)
        others = self._others(job)
        if others and job.state == QUEUED:
            meta: dict[str, Any] = {"j": job.id, QUEUED_DEAD: 1}
            if incr:
                meta["f"] = incr
            self._send_job(others, "QUEUED", job, meta)
        if self.aof:
            self._effects.append(AofAppend(job.to_record()))

    def _move_to_dead(self: Shard, job: Job, now_ms: int) -> Any:
        """Point a job that is not queued at its dead-letter queue (the same slot,
        so the same owner: workers/ids.py), keeping the per-queue bookkeeping."""
        self._forget_delivery(job)
        if job.flags & FLAGS_DELAY_MASK and not job.flags & FLAG_QUEUED_ONCE:
            self._undelay(job)
            job.flags |= FLAG_QUEUED_ONCE
        job.flags &= ~FLAG_NACK_DELAYED
        dq = self._queue(dead_queue_of(job.queue), now_ms)
        job.queue = dq.name
        return dq

    def _follow_dead_letter(self: Shard, job: Job, now_ms: int) -> None:
        """Another holder dead-lettered the job (QUEUED "dl"): our copy (active)
        belongs to the dead-letter queue from now on."""
        if job.queue.startswith(DEAD_PREFIX):
            return
        self._move_to_dead(job, now_ms)
        if self.aof:
            self._effects.append(AofAppend(job.to_record()))
