"""Clients of a fault run: producers, consumers and the final drain.

Producer k speaks to node k: ADDJOB of unique values, ``r2`` values with
``REPLICATE <r> RETRY 2`` and, one in ``r0_every``, an ``r0`` value with
``REPLICATE 1 RETRY 0`` (Disque requires REPLICATE 1 for at-most-once jobs).
Consumer k takes jobs (GETJOB TIMEOUT ... COUNT ... FROM both queues) from a
node other than k, moving to another one every ``consumer_hop_ops`` operations,
and ACKs them (ACKJOB, the full garbage collection). Every call is recorded in
the history with its outcome. Every loop stops on the run's stop event, and
every call has a socket timeout.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import redis
from blake3 import blake3

from tests.faults.history import History
from tests.faults.nodes import FaultNode

addjob_timeout_ms = 2000  # ADDJOB's own replication timeout
getjob_timeout_ms = 1000  # a blocked GETJOB returns empty after this
call_margin_s = 5.0  # socket timeout = the command's own timeout + this (loaded host)
getjob_count = 4
consumer_hop_ops = 20  # consumer operations before it moves to another node
drain_count = 100  # GETJOB COUNT while draining
retry_s = 2  # RETRY of r2 values
r0_every = 4  # one value in r0_every belongs to the at-most-once stream

# -NOREPL for want of nodes, -OOM, -PAUSED, -LEAVING: the node created no job. A
# connection that could not even be opened sent nothing: also a definite failure.
definite_addjob_errors = ("NOREPL Not enough reachable nodes", "OOM", "PAUSED", "LEAVING")


def queue_names(prefix: str, workers: int) -> list[str]:
    """One queue name per worker of a node, so every worker holds jobs and a killed
    worker is a real holder (a queue's owner is slot % workers, with the slot taken
    from blake3 of its name as every node computes it)."""
    names: dict[int, str] = {}
    for i in range(1000):  # bounded; each try hits a given worker with odds 1/workers
        name = f"{prefix}-{i}"
        slot = int.from_bytes(blake3(name.encode()).digest()[:2], "big") % 16384
        names.setdefault(slot % workers, name)
        if len(names) == workers:
            break
    return [names[w] for w in sorted(names)]


def _outcome(e: Exception) -> str:
    if isinstance(e, redis.ConnectionError) and "connecting to" in str(e):
        return "fail"  # refused or unreachable before the command was sent
    if isinstance(e, redis.ResponseError):
        text = str(e)
        if any(text.startswith(p) for p in definite_addjob_errors):
            return "fail"
    return "info"


class Clients:
    def __init__(self, nodes: list[FaultNode], history: History, run: str, *, replicate: int,
                 rate_per_s: float, seed: int, workers: int) -> None:
        self.nodes = nodes
        self.history = history
        self.run = run
        self.replicate = replicate
        self.interval_s = 1.0 / rate_per_s
        self.seed = seed
        self.q_r2 = queue_names(f"faults-{run}-r2", workers)
        self.q_r0 = queue_names(f"faults-{run}-r0", workers)
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []
        # the nodes a producer adds on and a consumer takes from: every node, unless a
        # membership run adds a host later or takes one out (tests/faults/membership.py)
        self.producing: set[int] = set(range(len(nodes)))
        self.consuming: set[int] = set(range(len(nodes)))

    def _conn(self, cache: dict[int, redis.Redis], n: int, timeout_s: float) -> redis.Redis:
        if n not in cache:
            cache[n] = self.nodes[n].client(socket_timeout=timeout_s,
                                            socket_connect_timeout=call_margin_s)
        return cache[n]

    def start(self) -> None:
        for k in range(len(self.nodes)):
            self.threads.append(threading.Thread(target=self._guard, args=(self._produce, k),
                                                 name=f"p{k}", daemon=True))
            self.threads.append(threading.Thread(target=self._guard, args=(self._consume, k),
                                                 name=f"c{k}", daemon=True))
        for t in self.threads:
            t.start()

    def stop(self, timeout_s: float) -> None:
        self.stop_event.set()
        deadline = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(max(0.1, deadline - time.monotonic()))
            if t.is_alive():
                self.errors.append(f"client {t.name} did not stop within {timeout_s} s")

    def _guard(self, body: Any, k: int) -> None:
        try:
            body(k)
        except Exception as e:  # noqa: BLE001 - a client bug must fail the run, not vanish
            self.errors.append(f"client {threading.current_thread().name}: {e!r}")

    # -- producers ------------------------------------------------------------

    def _produce(self, k: int) -> None:
        conns: dict[int, redis.Redis] = {}
        seq = 0
        while not self.stop_event.is_set():
            if k not in self.producing:
                self.stop_event.wait(self.interval_s)
                continue
            seq += 1
            stream = "r0" if seq % r0_every == 0 else "r2"
            value = f"{self.run}:{stream}:{k}:{seq}"
            if stream == "r2":
                args: list[Any] = ["ADDJOB", self.q_r2[seq % len(self.q_r2)], value, addjob_timeout_ms,
                                   "REPLICATE", self.replicate, "RETRY", retry_s]
            else:
                args = ["ADDJOB", self.q_r0[(seq // r0_every) % len(self.q_r0)], value, addjob_timeout_ms,
                        "REPLICATE", 1, "RETRY", 0]
            t0 = self.history.now()
            try:
                r = self._conn(conns, k, addjob_timeout_ms / 1000 + call_margin_s)
                job_id = r.execute_command(*args)
                self.history.record(f"p{k}", k, "enqueue", "ok", t0, v=value,
                                    id=job_id.decode())
            except (redis.RedisError, OSError) as e:
                self.history.record(f"p{k}", k, "enqueue", _outcome(e), t0, v=value,
                                    err=str(e)[:120])
            self.stop_event.wait(self.interval_s)
        for c in conns.values():
            c.close()

    # -- consumers ------------------------------------------------------------

    def _consume(self, k: int) -> None:
        rng = random.Random(self.seed * 1000 + k)
        conns: dict[int, redis.Redis] = {}
        n_nodes = len(self.nodes)
        node = (k + 1) % n_nodes
        ops = 0
        while not self.stop_event.is_set():
            ops += 1
            others = sorted(self.consuming - {k})
            if not others:
                self.stop_event.wait(self.interval_s)
                continue
            if (ops % consumer_hop_ops == 0 and n_nodes > 2) or node not in self.consuming:
                node = rng.choice(others)
            self.take_and_ack(f"c{k}", node, conns, getjob_timeout_ms, getjob_count)
            self.stop_event.wait(self.interval_s / 2)
        for c in conns.values():
            c.close()

    def take_and_ack(self, p: str, node: int, conns: dict[int, redis.Redis],
                     timeout_ms: int | None, count: int) -> int:
        """One GETJOB (NOHANG when ``timeout_ms`` is None) and one ACKJOB of what it
        returned; how many jobs it returned."""
        block = ["NOHANG"] if timeout_ms is None else ["TIMEOUT", timeout_ms]
        wait_s = (timeout_ms or 0) / 1000 + call_margin_s
        t0 = self.history.now()
        try:
            r = self._conn(conns, node, wait_s)
            reply = r.execute_command("GETJOB", *block, "COUNT", count,
                                      "FROM", *self.q_r2, *self.q_r0)
        except (redis.RedisError, OSError) as e:
            self.history.record(p, node, "dequeue", "info", t0, err=str(e)[:120])
            return 0
        jobs = [(body.decode(errors="replace"), jid.decode()) for _q, jid, body in reply or []]
        self.history.record(p, node, "dequeue", "ok", t0, v=[[v, j] for v, j in jobs])
        if not jobs:
            return 0
        t0 = self.history.now()
        ids = [j for _v, j in jobs]
        try:
            acked = r.execute_command("ACKJOB", *ids)
            self.history.record(p, node, "ack", "ok", t0, ids=ids, acked=int(acked))
        except (redis.RedisError, OSError) as e:
            self.history.record(p, node, "ack", _outcome(e), t0, ids=ids, err=str(e)[:120])
        return len(jobs)

    # -- drain ----------------------------------------------------------------

    def drain(self, expected: set[str], quiet_s: float, max_s: float) -> None:
        """Take every job left on every node until each value of ``expected`` came out
        and nothing more came for ``quiet_s``, or ``max_s`` passed."""
        conns: dict[int, redis.Redis] = {}
        deadline = time.monotonic() + max_s
        last_job = time.monotonic()
        missing = set(expected)
        seen_ops = 0  # values delivered before the drain count too
        while time.monotonic() < deadline:
            got = 0
            for n in sorted(self.consuming):
                got += self.take_and_ack("drain", n, conns, None, drain_count)
            for op in self.history.ops[seen_ops:]:
                if op["f"] == "dequeue" and op["type"] == "ok":
                    missing.difference_update(v for v, _j in op["v"])
            seen_ops = len(self.history.ops)
            if got:
                last_job = time.monotonic()
            elif not missing and time.monotonic() - last_job >= quiet_s:
                break
            else:
                time.sleep(0.2)
        for c in conns.values():
            c.close()
