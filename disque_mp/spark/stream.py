"""Streaming read, at-least-once end to end: the source process's memory of the
jobs taken and not acknowledged (``StreamState``, with its acker and
heartbeat threads) and the Spark-facing reader (the package doc tells the
protocol)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from disque_mp.client import (
    Disque,
    DisqueError,
    Job,
    pipeline_commands_max,
)
from disque_mp.spark.options import Address, Options

log = logging.getLogger("disque_mp.spark")


# Jobs one micro-batch takes at most: they sit in the driver-side source process
# until the batch commits, so memory is the limit (about 100 bytes + body each).
stream_batch_jobs_max = 1_000_000
# Heartbeat thread: how often it looks for batches due a WORKING, at most.
heartbeat_tick_s = 0.25
# A job in flight gets its first WORKING after this long (half of Disque's
# smallest RETRY), then again every half retry (the spec's example says 80 %;
# half leaves room for the tick above and a loaded machine).
stream_heartbeat_first_s = 0.5
stream_heartbeat_fraction = 0.5
# The stream source asks HELLO for the cluster's nodes again after this long.
node_refresh_s = 10.0
# How long stop() waits for the ACKs of committed batches to go out.
ack_drain_timeout_s = 30.0
# Jobs of a batch asked for their retry in the first heartbeat round.
heartbeat_sample_jobs = 16


class JobsPartition(InputPartition):
    """Jobs taken on the driver, shipped to the executor that turns them into rows."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        super().__init__(None)
        self.rows = rows


def _row(job: Job) -> tuple[Any, ...]:
    return (job.id, job.queue, job.body, "active", None, job.nacks or 0,
            job.additional_deliveries or 0)


@dataclass(slots=True)
class _Batch:
    jobs: list[Job]
    taken_at: float  # monotonic time GETJOB returned them
    next_beat: float  # monotonic time of the next WORKING round
    sampled: bool = False  # has the retry of a sample of its jobs been asked for
    committed: bool = False  # Spark committed it; the acker thread is ACKing it


def _new_batch(jobs: list[Job], taken_at: float) -> _Batch:
    return _Batch(jobs, taken_at, taken_at + stream_heartbeat_first_s)


class StreamState:
    """The source process's memory: jobs taken and not yet acknowledged, per batch.

    Lives only in the long-lived source runner process (never pickled). Three
    threads help the Spark-facing calls: the acker (commit hands it the IDs and
    returns; a crash before the ACK only means a duplicate delivery), the
    prefetcher (takes the next batch's jobs while Spark runs this one), and the
    heartbeat (WORKING for jobs held).
    """

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        # HELLO, QLEN, and ACKs whose node is gone
        self.client = opts.client(route_to_owner=opts.route_to_owner)
        self.take_lock = threading.Lock()  # one taker at a time: latestOffset or prefetcher
        # written under take_lock (entries are only added):
        self.node_clients: dict[Address, Disque] = {}  # one per node HELLO lists
        self.nodes_seen_at = -node_refresh_s  # monotonic time of the last HELLO
        self.next_node = 0  # round robin start over node_clients
        self.lock = threading.Lock()  # guards everything below
        self.origin: dict[str, Address] = {}  # job ID -> node that delivered it
        self.batches: dict[int, _Batch] = {}
        self.ready: _Batch | None = None  # prefetched, not offered to Spark yet
        self.prefetch_target = 0  # jobs to keep ready: the last batch limit
        self.issued = 0  # highest sequence number latestOffset returned
        self.available_now_left: int | None = None
        self.stopping = threading.Event()
        self.wake_prefetch = threading.Event()
        self.acks: queue.SimpleQueue[list[int] | None] = queue.SimpleQueue()
        self.threads = [self._start(self._ack_loop, "acker")]
        if opts.heartbeat:
            self.threads.append(self._start(self._beat_loop, "heartbeat"))
        if opts.prefetch:
            self.threads.append(self._start(self._prefetch_loop, "prefetch"))

    @staticmethod
    def _start(target: Any, name: str) -> threading.Thread:
        thread = threading.Thread(target=target, daemon=True, name=f"disque-stream-{name}")
        thread.start()
        return thread

    # ---- taking jobs

    def _nodes(self) -> list[tuple[Address, Disque]]:
        """Every node HELLO lists (refreshed every node_refresh_s), in round-robin order.

        Jobs are queued on one node at a time and GETJOB NOHANG does not pull
        jobs from other nodes (only a blocked GETJOB makes a node ask), so the
        source takes from every node itself. Called with take_lock held.
        """
        now = time.monotonic()
        if now - self.nodes_seen_at >= node_refresh_s:
            self.nodes_seen_at = now
            for node in self.client.hello().nodes:
                address = (node.host, node.port)
                if address not in self.node_clients:
                    self.node_clients[address] = self.opts.client(
                        [address], failover_attempts=0, follow_priority=False,
                        route_to_owner=self.opts.route_to_owner)
        nodes = list(self.node_clients.items())
        self.next_node = (self.next_node + 1) % max(1, len(nodes))
        return nodes[self.next_node:] + nodes[:self.next_node]

    def _getjob(self, want: int) -> list[Job]:
        """Up to want jobs from the nodes in turn, within the AvailableNow budget
        (call with take_lock held)."""
        with self.lock:
            if self.available_now_left is not None:
                want = min(want, self.available_now_left)
                self.available_now_left -= want
        got: list[Job] = []
        for address, client in self._nodes() if want > 0 else []:
            try:
                jobs = client.get_jobs(self.opts.queues, nohang=True, count=want - len(got),
                                       withcounters=True)
            except DisqueError as exc:  # down or leaving: the others still serve
                log.warning("disque stream: GETJOB on %s:%d failed: %s", *address, exc)
                continue
            with self.lock:
                for job in jobs:
                    self.origin[job.id] = address
            got += jobs
            if len(got) >= want:
                break
        with self.lock:
            if self.available_now_left is not None:
                self.available_now_left += want - len(got)
        return got

    def _by_node(self, ids: list[str]) -> dict[Address, list[str]]:
        """Job IDs grouped by the node that delivered them (call with self.lock held)."""
        groups: dict[Address, list[str]] = {}
        for job_id in ids:
            groups.setdefault(self.origin.get(job_id, ("", 0)), []).append(job_id)
        return groups

    def _send_by_node(self, verb: str, ids: list[str], per_command: int) -> list[Any]:
        """``verb`` for the IDs on the node that delivered each, pipelined; when that
        node fails, through the main client (any node of the cluster takes it).
        Replies in no particular order, errors as DisqueError values."""
        with self.lock:
            groups = self._by_node(ids)
        replies: list[Any] = []
        for address, group in groups.items():
            commands = [[verb, *group[i:i + per_command]]
                        for i in range(0, len(group), per_command)]
            client = self.node_clients.get(address, self.client)
            try:
                replies += client.execute_many(commands, raise_on_error=False)
            except DisqueError:
                replies += self.client.execute_many(commands, raise_on_error=False)
        return replies

    def _take(self, limit: int) -> list[Job]:
        jobs: list[Job] = []
        while len(jobs) < limit:
            want = min(self.opts.count, limit - len(jobs))
            got = self._getjob(want)
            jobs += got
            if len(got) < want:
                break
        return jobs

    def _prefetch_loop(self) -> None:
        while not self.stopping.is_set():
            self.wake_prefetch.wait()
            self.wake_prefetch.clear()
            while not self.stopping.is_set():
                with self.take_lock:
                    with self.lock:
                        held = len(self.ready.jobs) if self.ready else 0
                        want = min(self.opts.count, self.prefetch_target - held)
                    got = self._getjob(want) if want > 0 else []
                    if got:
                        with self.lock:
                            if self.ready is None:
                                self.ready = _new_batch([], time.monotonic())
                            self.ready.jobs += got
                if len(got) < want or want <= 0:
                    break

    def _claim_ready(self, limit: int) -> tuple[list[Job], float]:
        """Prefetched jobs, at most limit (with self.lock held)."""
        if self.ready is None:
            return [], time.monotonic()
        ready = self.ready
        jobs, ready.jobs = ready.jobs[:limit], ready.jobs[limit:]
        if not ready.jobs:
            self.ready = None
        return jobs, ready.taken_at

    def latest(self, start_seq: int, limit: int) -> int:
        with self.take_lock:
            with self.lock:
                self.issued = max(self.issued, start_seq)
                if self.issued > start_seq:  # offered before and not planned yet: again
                    return self.issued
                jobs, taken_at = self._claim_ready(limit)
            jobs += self._take(limit - len(jobs))
            with self.lock:
                self.prefetch_target = limit
                seq = self._next_offset(start_seq, jobs, taken_at)
        self.wake_prefetch.set()
        return seq

    def _next_offset(self, start_seq: int, jobs: list[Job], taken_at: float) -> int:
        if jobs:
            self.issued += 1
            self.batches[self.issued] = _new_batch(jobs, taken_at)
            return self.issued
        if any(seq <= start_seq and not b.committed for seq, b in self.batches.items()):
            self.issued += 1  # an empty batch, so Spark commits the ones before it
            return self.issued
        return start_seq

    def rows(self, start_seq: int, end_seq: int) -> list[tuple[Any, ...]]:
        with self.lock:
            return [_row(job) for seq, batch in sorted(self.batches.items())
                    if start_seq < seq <= end_seq for job in batch.jobs]

    # ---- acknowledging

    def commit(self, end_seq: int) -> None:
        with self.lock:
            done = [seq for seq, b in self.batches.items() if seq <= end_seq and not b.committed]
            for seq in done:
                self.batches[seq].committed = True
        if done:
            self.acks.put(done)

    def _ack_loop(self) -> None:
        verb = "FASTACK" if self.opts.fast_ack else "ACKJOB"
        while (done := self.acks.get()) is not None:
            with self.lock:
                ids = [job.id for seq in done for job in self.batches[seq].jobs]
            try:
                replies = self._send_by_node(verb, ids, pipeline_commands_max)
                failed = [r for r in replies if isinstance(r, DisqueError)]
                if failed:
                    raise failed[0]
                log.info("disque stream: acknowledged %d jobs of batches %s", len(ids), done)
            except DisqueError as exc:  # they will be delivered again after RETRY
                log.error("disque stream: ACK of %d jobs failed: %s", len(ids), exc)
            with self.lock:
                for seq in done:
                    self.batches.pop(seq, None)
                for job_id in ids:
                    self.origin.pop(job_id, None)

    # ---- heartbeat

    def _beat_loop(self) -> None:
        """WORKING for jobs held, before their retry time elapses.

        The first round asks a sample of a batch (WORKING returns the retry),
        then every job gets WORKING every half of the smallest retry seen, counted
        from when the jobs were taken. A job whose retry is shorter than every
        sampled one may be queued again while held: a duplicate delivery, never
        a lost job. Sampling keeps short batches free of WORKING traffic (a
        full round costs as much as the GETJOB that took the jobs).
        """
        while not self.stopping.wait(heartbeat_tick_s):
            now = time.monotonic()
            with self.lock:
                held = [*self.batches.values(), *([self.ready] if self.ready else [])]
                due = [b for b in held if b.next_beat <= now]
            for batch in due:
                with self.lock:
                    jobs = list(batch.jobs)
                if batch.sampled:
                    retry_s, since = self._beat(jobs), time.monotonic()
                else:
                    step = max(1, len(jobs) // heartbeat_sample_jobs)
                    retry_s = self._beat(jobs[::step][:heartbeat_sample_jobs])
                    since = batch.taken_at
                with self.lock:
                    batch.sampled = True
                    batch.next_beat = (since + retry_s * stream_heartbeat_fraction
                                       if retry_s > 0 else float("inf"))

    def _beat(self, jobs: list[Job]) -> int:
        """WORKING for the jobs; the smallest retry returned (0: none to keep)."""
        try:
            replies = self._send_by_node("WORKING", [j.id for j in jobs], 1)
        except DisqueError as exc:
            log.warning("disque stream heartbeat failed: %s", exc)
            return 1  # try again soon
        return min((r for r in replies if isinstance(r, int) and r > 0), default=0)

    # ---- end

    def close(self) -> None:
        """Finish the ACKs of committed batches; put prefetched jobs back in their queues.

        Batches planned but not committed stay un-acked: Disque delivers them
        again after their RETRY.
        """
        self.stopping.set()
        self.wake_prefetch.set()
        self.acks.put(None)
        for thread in self.threads:
            thread.join(timeout=ack_drain_timeout_s)
        with self.lock:
            ready, self.ready = self.ready, None
        if ready is not None and ready.jobs:
            try:
                self._send_by_node("ENQUEUE", [j.id for j in ready.jobs], pipeline_commands_max)
            except DisqueError as exc:
                log.warning("disque stream: could not requeue %d prefetched jobs (they come "
                            "back after RETRY): %s", len(ready.jobs), exc)
        for client in [self.client, *self.node_clients.values()]:
            client.close()


def queued_in_cluster(client: Disque, queues: list[str], opts: Options | None = None) -> int:
    """QLEN summed over every node HELLO lists (a job is queued on one node at a time)."""
    total = 0
    for node in client.hello().nodes:
        address = [(node.host, node.port)]
        other = opts.client(address, connect_timeout=2.0, socket_timeout=10.0) \
            if opts is not None else Disque(address, connect_timeout=2.0, socket_timeout=10.0)
        try:
            total += sum(other.qlen(q) for q in queues)
        except DisqueError as exc:  # unreachable: its jobs wait for the next run
            log.warning("disque: QLEN on %s failed: %s", node.address, exc)
        finally:
            other.close()
    return total


class DisqueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"seq": n}``: batch n holds the jobs latestOffset took for it."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self._state: StreamState | None = None

    # The reader is pickled to executors: ship options only, never threads or sockets.
    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.opts = state["opts"]
        self._state = None

    def _live(self) -> StreamState:
        if self._state is None:
            self._state = StreamState(self.opts)
        return self._state

    def initialOffset(self) -> dict:
        return {"seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.opts.max_jobs_per_batch)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if isinstance(limit, ReadMaxRows):
            most = min(limit.max_rows, stream_batch_jobs_max)
        elif isinstance(limit, ReadAllAvailable):
            most = stream_batch_jobs_max
        else:
            most = self.opts.max_jobs_per_batch
        return {"seq": self._live().latest(int(start.get("seq", 0)), most)}

    def prepareForTriggerAvailableNow(self) -> None:
        """The query ends after taking as many jobs as are queued now, cluster-wide."""
        state = self._live()
        state.available_now_left = queued_in_cluster(state.client, self.opts.queues, self.opts)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        rows = self._live().rows(int(start.get("seq", 0)), int(end.get("seq", 0)))
        if not rows:
            return []
        parts = min(self.opts.num_partitions, len(rows))
        return [JobsPartition(rows[i::parts]) for i in range(parts)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, JobsPartition)
        return iter(partition.rows)

    def commit(self, end: dict) -> None:
        self._live().commit(int(end.get("seq", 0)))

    def stop(self) -> None:
        """Query ended (or failed): jobs not committed stay un-acked and come back after RETRY."""
        if self._state is not None:
            self._state.close()
            self._state = None
