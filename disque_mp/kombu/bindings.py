"""Exchange bindings shared through Disque: how a fanout or topic publish on
``disque://`` reaches queues that other processes, on other hosts, consume.

kombu's virtual transports route a publish with the exchange's binding table,
kept in the memory of each process: a ``celery inspect`` process does not know
the queue a worker bound to the ``celery.pidbox`` exchange. kombu's Redis
transport keeps the tables in Redis (a set per exchange, ``_kombu.binding.<exchange>``)
and broadcasts with PUBLISH. Disque has neither keys nor pub/sub, but it has
jobs with a TTL, so:

- a binding of a fanout or topic exchange, or of a transient queue (auto-delete
  or not durable: pidbox reply queues on a direct exchange) is a job in the
  Disque queue ``_kombu.binding.<exchange>``, its body the binding (queue,
  routing key, pattern, whether the queue is transient, the TTL of messages for
  it), ``RETRY 0`` (nobody consumes it: it is read with ``QPEEK``), ``TTL``
  ``binding_ttl`` (30 s). The process that bound it adds a fresh one every third
  of that and acknowledges the old one, so a dead process's bindings fall out
  within ``binding_ttl``; ``queue_delete`` and a closed connection acknowledge
  them at once.
- a publish reads the table (``QPEEK``, at most ``bindings_read_max`` entries)
  and adds one job per bound queue: for a transient queue an at-most-once copy
  (``RETRY 0``, ``REPLICATE 1``, TTL the queue's ``x-message-ttl`` or
  ``fanout_message_ttl``, never past the message's ``expires``), which the
  consumer acknowledges as it receives it (no-ack consumers: pidbox, event
  receivers); for a durable queue the ordinary ``_put``. Fanout publishes
  (broadcasts: rare) and direct publishes that match no binding of this process
  (replies) read the table afresh; topic publishes (Celery events: frequent)
  keep a read for ``bindings_cache_s`` (1 s).

In a cluster, a registration is added to every node the client's HELLO lists
(each copy ``REPLICATE 1``, queued where it was added), so the node a publisher
talks to lists every binding; the copy it adds there reaches a consumer blocked
on another node through Disque's federation (NEEDJOBS / YOURJOBS), like any job.
A node that joins later learns a binding at its next refresh.

Why not one reply queue per worker, polled: a broadcast must reach workers the
sender never heard of, so some shared list of who listens is needed anyway.
Why not JSCAN: it walks every job of the node; QPEEK reads only the
registry's queue.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from disque_mp.client import Disque, DisqueConnectionError, DisqueError

log = logging.getLogger("disque_mp.kombu")

# The registry's Disque queue of an exchange (kombu's Redis transport names its
# sets the same way).
registry_prefix = "_kombu.binding."
# A registration lives this long unless refreshed: a process that dies without
# unbinding stops receiving copies within it.
binding_ttl_default_s = 30
# Registrations read per table (QPEEK count): the most queues one exchange routes to.
bindings_read_max = 4096
# How long a topic exchange's table is kept before it is read again.
bindings_cache_s = 1.0
# TTL of a copy for a transient queue that declares no x-message-ttl.
fanout_message_ttl_default_s = 60


@dataclass(frozen=True, slots=True)
class Binding:
    """One queue bound to an exchange, as kept in the registry."""

    queue: str
    routing_key: str
    pattern: str
    transient: bool
    message_ttl_s: int

    def encode(self) -> str:
        return json.dumps({"queue": self.queue, "key": self.routing_key,
                           "pattern": self.pattern, "transient": self.transient,
                           "ttl": self.message_ttl_s}, separators=(",", ":"))

    @classmethod
    def decode(cls, body: bytes) -> Binding | None:
        """The binding a registration job holds; None for a body that is not one."""
        try:
            raw = json.loads(body)
            return cls(str(raw["queue"]), str(raw["key"]), str(raw["pattern"]),
                       bool(raw["transient"]), max(1, int(raw["ttl"])))
        except (ValueError, KeyError, TypeError):
            return None


def copy_ttl_s(binding: Binding, headers: dict[str, Any], now_s: float) -> int:
    """TTL of a copy for a transient queue: the queue's message TTL, cut to the
    message's ``expires`` (a UNIX time; 0 or absent: none), at least 1 s."""
    ttl_s = binding.message_ttl_s
    expires = headers.get("expires")
    if isinstance(expires, int | float) and expires > 0:
        ttl_s = min(ttl_s, math.ceil(expires - now_s))
    return max(1, ttl_s)


class SharedBindings:
    """The registry seen from one kombu connection: its own registrations (kept
    alive by a thread) and the tables it reads to route a publish."""

    def __init__(self, client: Callable[[], Disque],
                 node_client: Callable[[tuple[str, int]], Disque],
                 ttl_s: int = binding_ttl_default_s) -> None:
        if int(ttl_s) < 3:
            raise ValueError("disque:// binding_ttl must be >= 3 seconds")
        self._client = client
        self._node_client = node_client  # a client that stays on the node it is given
        self._nodes: dict[tuple[str, int], Disque] = {}
        # nodes that failed since the last refresh: a bind does not wait on them again
        self._unreachable: set[tuple[str, int]] = set()
        self.ttl_s = int(ttl_s)
        self._lock = threading.Lock()
        # (exchange, binding) -> its registration on each node: [(node, job ID)]
        self._own: dict[tuple[str, Binding], list[tuple[tuple[str, int], str]]] = {}
        self._cache: dict[str, tuple[float, list[Binding]]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned_full: set[str] = set()

    def bind(self, exchange: str, binding: Binding) -> None:
        """Register ``binding`` of ``exchange`` now and keep it alive."""
        added = self._register(exchange, binding)
        with self._lock:
            old = self._own.get((exchange, binding), [])
            self._own[(exchange, binding)] = added
            self._cache.pop(exchange, None)
            if self._thread is None:
                self._thread = threading.Thread(target=self._keep_alive,
                                                name="disque-bindings", daemon=True)
                self._thread.start()
        self._ack(old)

    def unbind_queue(self, queue: str) -> None:
        """Drop every registration of ``queue`` (queue_delete)."""
        with self._lock:
            keys = [k for k in self._own if k[1].queue == queue]
            added = [x for k in keys for x in self._own.pop(k)]
            for exchange, _ in keys:
                self._cache.pop(exchange, None)
        self._ack(added)

    def table(self, exchange: str, *, fresh: bool) -> list[Binding]:
        """The bindings of ``exchange`` registered by any process; ``fresh=False``
        accepts a read up to ``bindings_cache_s`` old."""
        now = time.monotonic()
        if not fresh:
            cached = self._cache.get(exchange)
            if cached is not None and now - cached[0] < bindings_cache_s:
                return cached[1]
        jobs = self._client().qpeek(registry_prefix + exchange, bindings_read_max)
        if len(jobs) >= bindings_read_max and exchange not in self._warned_full:
            self._warned_full.add(exchange)
            log.warning("exchange %r has %d or more registered bindings: publishes reach "
                        "the first %d only", exchange, bindings_read_max, bindings_read_max)
        seen: set[Binding] = set()
        bindings = []
        for job in jobs:
            binding = Binding.decode(job.body)
            if binding is not None and binding not in seen:  # a refresh overlaps its old one
                seen.add(binding)
                bindings.append(binding)
        self._cache[exchange] = (now, bindings)
        return bindings

    def close(self) -> None:
        """Stop refreshing and acknowledge every registration of this connection."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)
        with self._lock:
            added = [x for xs in self._own.values() for x in xs]
            self._own.clear()
        self._ack(added)
        nodes, self._nodes = self._nodes, {}
        for client in nodes.values():
            client.close()

    def _register(self, exchange: str, binding: Binding) -> list[tuple[tuple[str, int], str]]:
        """Add the registration to every node the client knows; [(node, job ID)]. A
        node that cannot be reached is skipped (the next refresh tries it again);
        the one the client is connected to must take it."""
        main = self._client()
        if main.topology.current is None:
            main.hello()  # connects
        here = main.topology.current
        hello = main.topology.hello
        nodes = [(n.host, n.port) for n in hello.nodes] if hello is not None else []
        args = (registry_prefix + exchange, binding.encode())
        added = [(here, main.add_job(*args, retry=0, replicate=1, ttl=self.ttl_s))] \
            if here is not None else []
        for node in nodes:
            if node == here or node in self._unreachable:
                continue
            try:
                client = self._nodes.get(node) or self._nodes.setdefault(
                    node, self._node_client(node))
                added.append((node, client.add_job(*args, retry=0, replicate=1,
                                                   ttl=self.ttl_s)))
            except DisqueError as exc:
                self._unreachable.add(node)
                log.info("binding not registered on %s:%d (%s): retried at the next "
                         "refresh", node[0], node[1], exc)
        return added

    def _ack(self, added: list[tuple[tuple[str, int], str]]) -> None:
        """Acknowledge registrations, each on the node that holds it."""
        by_node: dict[tuple[str, int], list[str]] = {}
        for node, job_id in added:
            by_node.setdefault(node, []).append(job_id)
        here = self._client().topology.current
        for node, ids in by_node.items():
            try:
                client = self._client() if node == here else self._nodes.get(node)
                if client is not None:
                    client.ack(ids)
            except DisqueError as exc:
                log.info("could not unregister %d bindings on %s:%d (%s): they expire "
                         "in %d s", len(ids), node[0], node[1], exc, self.ttl_s)

    def _keep_alive(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self._refresh()
            except (DisqueError, DisqueConnectionError) as exc:
                log.warning("refreshing shared bindings failed (%s): retrying in %.0f s",
                            exc, self.ttl_s / 3)

    def _refresh(self) -> None:
        with self._lock:
            own = list(self._own.items())
        if own:
            self._client().hello()  # the nodes now in the cluster
            self._unreachable.clear()
        replaced = []
        for key, old in own:
            added = self._register(*key)
            with self._lock:
                if self._own.get(key) is not old:  # unbound or bound again meanwhile
                    replaced += added
                    continue
                self._own[key] = added
            replaced += old
        self._ack(replaced)
