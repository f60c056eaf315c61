"""``/metrics``: the node's state in Prometheus' text format.

Built at scrape time from every worker's snapshot (``ops.worker_snapshot``) by a
custom collector that yields metric families; prometheus_client writes the
exposition. Nothing is kept between scrapes: counters are the workers' own
totals, so a restarted worker shows up as a counter reset, which ``rate()``
handles.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from disque_mp import DISQUE_VERSION, __version__, compiled
from workers.shard import latency_bounds_ms

if TYPE_CHECKING:
    from disque_mp.node.view import NodeView

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PAUSE_VALUES = {"none": 0, "in": 1, "out": 2, "all": 3}
# Requeue reasons: the shard's counter for each (snapshot key)
REQUEUE_REASONS = (("retry", "requeued_retry"), ("nack", "requeued_nack"),
                   ("enqueue", "requeued_enqueue"))


label_hash_bytes = 8  # the digest that keeps two cut names apart (16 hex characters)


def queue_label(name: bytes, bytes_max: int = 1 << 30) -> str:
    """A queue's label: its name, or past ``http-metrics-label-bytes-max`` its first
    bytes, "~" and a digest of the whole name (a 64 KB name would make each scrape
    megabytes; two long names sharing their start keep two series)."""
    if len(name) <= bytes_max:
        return name.decode("utf-8", "replace")
    digest = hashlib.blake2b(name, digest_size=label_hash_bytes).hexdigest()
    keep = max(0, bytes_max - len(digest) - 1)
    return name[:keep].decode("utf-8", "ignore") + "~" + digest


def merge_queue_rows(parts: list[dict[str, Any]], queues_max: int) -> list[list[Any]]:
    """Every worker's largest queues, then the ``queues_max`` largest of those."""
    rows = [row for p in parts for row in p["metrics"]["queue_rows"]]
    if len(rows) > queues_max:
        rows = heapq.nlargest(queues_max, rows, key=lambda r: (r[1], r[2]))
    rows.sort(key=lambda r: (-r[1], r[0]))
    return rows


class SnapshotCollector:
    """Yields the families of one scrape from the gathered worker snapshots."""

    def __init__(self, w: NodeView, parts: list[Any]) -> None:
        self.w = w
        self.indexed = list(enumerate(parts))
        self.parts: list[dict[str, Any]] = [p for p in parts if isinstance(p, dict)]

    def describe(self) -> list[Metric]:
        return []  # no second collect() at registration

    def collect(self) -> Iterator[Metric]:
        yield from self._build()
        yield from self._queues()
        yield from self._node()
        yield from self._histograms()
        yield from self._commands()
        yield from self._workers()
        yield from self._cluster()

    def _sum(self, key: str) -> float:
        return sum(float(p["metrics"][key]) for p in self.parts)

    def _build(self) -> Iterator[Metric]:
        info = InfoMetricFamily("disque_build", "Version and build of this node")
        info.add_metric([], {"version": __version__, "disque_version": DISQUE_VERSION,
                             "shard_build": compiled.summary(), "node_id": self.w.node_id,
                             "workers": str(self.w.workers)})
        yield info

    def _queues(self) -> Iterator[Metric]:
        cap = self.w.cfg.http_metrics_queues_max
        label_max = self.w.cfg.http_metrics_label_bytes_max
        rows = merge_queue_rows(self.parts, cap)
        fams: list[GaugeMetricFamily | CounterMetricFamily] = [
            GaugeMetricFamily("disque_queue_jobs_queued", "Jobs waiting in the queue", labels=["queue"]),
            GaugeMetricFamily("disque_queue_jobs_active", "Jobs delivered and not acknowledged",
                              labels=["queue"]),
            GaugeMetricFamily("disque_queue_jobs_delayed", "Jobs waiting for their DELAY",
                              labels=["queue"]),
            GaugeMetricFamily("disque_queue_oldest_job_age_seconds",
                              "Age of the oldest queued job (0 when empty)", labels=["queue"]),
            CounterMetricFamily("disque_queue_jobs_in", "Jobs queued (QSTAT jobs-in)", labels=["queue"]),
            CounterMetricFamily("disque_queue_jobs_out", "Jobs delivered (QSTAT jobs-out)",
                                labels=["queue"]),
            GaugeMetricFamily("disque_queue_blocked_clients", "Clients blocked in GETJOB",
                              labels=["queue"]),
            GaugeMetricFamily("disque_queue_paused", "Pause state: 0 none, 1 in, 2 out, 3 all",
                              labels=["queue"]),
            GaugeMetricFamily("disque_queue_import_rate", "Jobs/s imported from other nodes",
                              labels=["queue"]),
            GaugeMetricFamily("disque_queue_dead_jobs",
                              "Jobs queued in the queue's dead-letter queue dead:<queue> (QSTAT dead-len)",
                              labels=["queue"]),
        ]
        for name, queued, active, delayed, age_ms, jin, jout, blocked, pause, rate, dead in rows:
            label = [queue_label(name, label_max)]
            values = (queued, active, delayed, max(age_ms, 0) / 1000, jin, jout, blocked,
                      PAUSE_VALUES.get(pause, 0), rate, dead)
            for fam, value in zip(fams, values, strict=True):
                fam.add_metric(label, value)
        yield from fams
        total = sum(int(p["metrics"]["queues"]) for p in self.parts)
        yield GaugeMetricFamily("disque_metrics_queues_exported",
                                f"Queues with their own series (http-metrics-queues-max {cap}; "
                                f"{total} registered)", value=len(rows))

    def _node(self) -> Iterator[Metric]:
        for key, name, text in (
                ("added", "disque_jobs_added", "Jobs created by ADDJOB"),
                ("delivered", "disque_jobs_delivered", "Jobs delivered by GETJOB"),
                ("acked", "disque_jobs_acked", "Jobs acknowledged (ACKJOB, FASTACK)"),
                ("nacked", "disque_jobs_nacked", "Jobs given back with NACK"),
                ("expired", "disque_jobs_expired", "Jobs deleted when their TTL elapsed")):
            yield CounterMetricFamily(name, text, value=self._sum(key))
        requeued = CounterMetricFamily("disque_jobs_requeued", "Jobs queued again, by reason",
                                       labels=["reason"])
        for reason, key in REQUEUE_REASONS:
            requeued.add_metric([reason], self._sum(key))
        yield requeued
        mem = [p.get("mem") or {} for p in self.parts]
        yield CounterMetricFamily("disque_jobs_evicted", "Jobs evicted under memory pressure",
                                  value=sum(int(m.get("evicted_jobs", 0)) for m in mem))
        yield CounterMetricFamily("disque_queues_evicted", "Queues evicted under memory pressure",
                                  value=sum(int(m.get("evicted_queues", 0)) for m in mem))
        for key, name, text in (
                ("jobs", "disque_jobs_registered", "Jobs held by this node (INFO registered_jobs)"),
                ("queues", "disque_queues_registered", "Queues (INFO registered_queues)"),
                ("queued", "disque_jobs_queued", "Jobs waiting in queues"),
                ("active", "disque_jobs_active", "Jobs delivered and not acknowledged"),
                ("delayed", "disque_jobs_delayed", "Jobs waiting for their DELAY")):
            yield GaugeMetricFamily(name, text, value=self._sum(key))
        yield GaugeMetricFamily("disque_connected_clients", "Client connections",
                                value=sum(int(p["clients"]) for p in self.parts))
        yield GaugeMetricFamily("disque_blocked_clients", "Clients blocked in GETJOB",
                                value=sum(int(p["blocked"]) for p in self.parts))
        yield GaugeMetricFamily("disque_memory_used_bytes", "Used memory (INFO used_memory)",
                                value=sum(int(m.get("used", 0)) for m in mem))
        yield GaugeMetricFamily("disque_memory_max_bytes", "maxmemory", value=self.w.cfg.maxmemory)
        yield GaugeMetricFamily("disque_memory_level",
                                "Memory warning level: 0 ok, 1 >= 75 %, 2 >= 95 %, 3 >= 100 %",
                                value=max([int(m.get("level", 0)) for m in mem] or [0]))
        yield GaugeMetricFamily("disque_slowlog_length", "Entries in the slow log",
                                value=sum(int(p["slowlog_len"]) for p in self.parts))
        yield from self._aof()

    def _aof(self) -> Iterator[Metric]:
        fields = [dict(tuple(f) for f in p["aof"]) for p in self.parts if p.get("aof")]
        state = GaugeMetricFamily("disque_aof_state", "AOF state (1 for the current one)",
                                  labels=["state"])
        states = {str(f.get("aof_state", "off")) for f in fields} or {"off"}
        for s in ("off", "on", "wait_rewrite"):
            state.add_metric([s], 1 if s in states else 0)
        yield state
        ok = all(f.get("aof_last_write_status", "ok") == "ok" for f in fields)
        yield GaugeMetricFamily("disque_aof_last_write_ok", "1 if the last AOF write succeeded",
                                value=1 if ok else 0)

    def _histograms(self) -> Iterator[Metric]:
        for key, name, text in (
                ("wait", "disque_job_wait_seconds", "Time from ADDJOB to a job's first delivery"),
                ("proc", "disque_job_processing_seconds", "Time from a delivery to the ACK")):
            counts = [0] * (len(latency_bounds_ms) + 1)
            total_ms = 0
            for p in self.parts:
                m = p["metrics"]
                for i, c in enumerate(m[key + "_counts"]):
                    counts[i] += int(c)
                total_ms += int(m[key + "_sum_ms"])
            buckets = []
            running = 0
            for bound, c in zip((*latency_bounds_ms, None), counts, strict=True):
                running += c
                buckets.append(("+Inf" if bound is None else _seconds(bound), running))
            yield HistogramMetricFamily(name, text, buckets=buckets, sum_value=total_ms / 1000)

    def _commands(self) -> Iterator[Metric]:
        calls = CounterMetricFamily("disque_commands", "Commands run, by name", labels=["command"])
        secs = CounterMetricFamily("disque_commands_seconds", "Time spent in commands, by name",
                                   labels=["command"])
        merged: dict[str, list[int]] = {}
        for p in self.parts:
            for name, (n, ns) in p["cmdstats"].items():
                m = merged.setdefault(name, [0, 0])
                m[0] += int(n)
                m[1] += int(ns)
        for name in sorted(merged):
            calls.add_metric([name], merged[name][0])
            secs.add_metric([name], merged[name][1] / 1e9)
        yield calls
        yield secs

    def _workers(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("disque_worker_up", "1 if the worker answered this scrape",
                               labels=["worker"])
        Getter = Callable[[dict[str, Any]], Any]
        fams: list[tuple[GaugeMetricFamily | CounterMetricFamily, Getter]] = [
            (GaugeMetricFamily("disque_worker_jobs", "Jobs held by the worker", labels=["worker"]),
             lambda p: p["metrics"]["jobs"]),
            (GaugeMetricFamily("disque_worker_queues", "Queues owned by the worker", labels=["worker"]),
             lambda p: p["metrics"]["queues"]),
            (GaugeMetricFamily("disque_worker_clients", "Client connections held by the worker",
                               labels=["worker"]), lambda p: p["clients"]),
            (CounterMetricFamily("disque_worker_commands", "Commands run by the worker",
                                 labels=["worker"]), lambda p: p["commands"]),
            (GaugeMetricFamily("disque_worker_rss_bytes", "Resident memory of the worker",
                               labels=["worker"]), lambda p: p["rss"]),
            (CounterMetricFamily("disque_worker_cpu_seconds", "CPU time of the worker (user + sys)",
                                 labels=["worker"]), lambda p: float(p["cpu_user"]) + float(p["cpu_sys"])),
        ]
        for index, p in self.indexed:
            label = [str(index)]
            alive = isinstance(p, dict)
            up.add_metric(label, 1 if alive else 0)
            if alive:
                for fam, get in fams:
                    fam.add_metric(label, float(get(p)))
        yield up
        for fam, _ in fams:
            yield fam

    def _cluster(self) -> Iterator[Metric]:
        agent = self.w.agent
        view: dict[str, Any] = agent.view if agent is not None else {}
        nodes = view.get("nodes") or []
        others = [n for n in nodes if "myself" not in n[3]]
        reachable = sum(1 for n in others if not set(n[3]) & {"fail?", "fail", "handshake", "noaddr"})
        yield GaugeMetricFamily("disque_cluster_known_nodes", "Nodes known, this one included",
                                value=max(len(nodes), 1))
        yield GaugeMetricFamily("disque_cluster_reachable_nodes", "Other nodes reachable",
                                value=reachable)
        yield GaugeMetricFamily("disque_cluster_bus_links", "Other nodes with a bus link up",
                                value=sum(1 for n in others if n[6]))
        yield CounterMetricFamily("disque_cluster_messages_sent", "Cluster bus messages sent",
                                  value=float(view.get("sent", 0)))
        yield CounterMetricFamily("disque_cluster_messages_received", "Cluster bus messages received",
                                  value=float(view.get("received", 0)))
        if "refused" in view:  # the bus counts frames it refused (bad MAC, unknown sender)
            yield CounterMetricFamily("disque_cluster_bus_frames_refused",
                                      "Bus frames refused at the edge", value=float(view["refused"]))


def _seconds(bound_ms: int) -> str:
    return repr(bound_ms / 1000)


def render(w: NodeView, parts: list[Any]) -> bytes:
    """The exposition text of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(w, parts))
    return generate_latest(registry)

