"""The two workloads of ``make bench-peers``, one forked process per client.

- ``cycle``: ``clients`` producers add batches of ``batch`` jobs for ``seconds``
  (round robin over the queues), ``clients`` consumers take up to ``batch`` jobs at a
  time and ack them (consumer c serves queues c, c + clients, ...); the figure is jobs
  acked over the time from the start to the last ack, every job produced acked.
- ``paced``: one producer adds jobs at ``rate`` per second for ``seconds`` (each
  batch holds the jobs due at that moment, at most ``batch``), one consumer takes and
  acks them; each job's body carries its add time (CLOCK_MONOTONIC, the same clock in
  every process), so the consumer measures add-to-delivery latency.

Bodies are ``BODY_BYTES`` long and unique (producer, sequence), so the Redis list's
LREM finds each one.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import queue as queue_mod
import struct
import time
from array import array
from typing import Any

from bench.peers_drivers import Target, connect

BODY_BYTES = 100
BATCH = 50  # jobs per produce call and per consume call
consume_wait_s = 0.05  # one consume call waits this long for a first job
drain_max_s = 60.0  # after the producers stop, the consumers get this long to finish
start_timeout_s = 120.0  # every client process connected (a loaded machine forks slowly)
paced_overrun_max = 2.0  # a paced producer that cannot keep its rate stops at 2x the time
_STAMP = struct.Struct(">QII")
_PAD = b"x" * (BODY_BYTES - _STAMP.size)
_CTX = mp.get_context("fork")


def body(producer: int, seq: int) -> bytes:
    return _STAMP.pack(time.monotonic_ns(), producer, seq) + _PAD


def stamp_of(b: bytes) -> int:
    return int(_STAMP.unpack_from(b)[0])


def _producer(target: Target, queues: list[str], seconds: float, index: int,
              barrier: Any, produced: Any) -> None:
    d = connect(target)
    barrier.wait(start_timeout_s)
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        d.produce([(queues[(n + k) % len(queues)], body(index, n + k)) for k in range(BATCH)])
        n += BATCH
    with produced.get_lock():
        produced.value += n
    d.close()


def _consumer(target: Target, queues: list[str], deadline_s: float, barrier: Any,
              producing: Any, produced: Any, acked: Any, out: Any) -> None:
    d = connect(target)
    barrier.wait(start_timeout_s)
    deadline = time.monotonic() + deadline_s
    last = 0.0
    while time.monotonic() < deadline:
        jobs = d.consume(queues, BATCH, consume_wait_s)
        if jobs:
            d.ack([h for h, _ in jobs])
            last = time.monotonic()
            with acked.get_lock():
                acked.value += len(jobs)
        elif not producing.is_set() and acked.value >= produced.value:
            break
    out.put(last)
    d.close()


def _finish(procs: list[Any], timeout_s: float) -> None:
    for p in procs:
        p.join(timeout_s)
        if p.is_alive():
            p.kill()
            p.join()


def cycle(target: Target, queues: list[str], clients: int, seconds: float) -> dict[str, Any]:
    """N producers, N consumers: jobs/s from the start to the last ack, the CPU the
    servers' processes (``target.pids``) spent per job meanwhile, and the CPU the
    client processes spent per job (what is left of the machine's cores for the
    server: on 2 cores the clients' share bounds any server's figure)."""
    from bench.scaling import children_cpu_s, cpu_s

    cpu0 = sum(cpu_s(p) for p in target.pids)
    kids0 = children_cpu_s()
    barrier = _CTX.Barrier(2 * clients + 1)
    producing = _CTX.Event()
    producing.set()
    produced, acked = _CTX.Value("q", 0), _CTX.Value("q", 0)
    out: Any = _CTX.Queue()
    cons = [_CTX.Process(target=_consumer, args=(target, queues[c::clients] or queues,
                                                 seconds + drain_max_s, barrier, producing,
                                                 produced, acked, out))
            for c in range(clients)]
    prods = [_CTX.Process(target=_producer, args=(target, queues, seconds, i, barrier, produced))
             for i in range(clients)]
    for p in cons + prods:
        p.start()
    barrier.wait(start_timeout_s)
    t0 = time.monotonic()
    _finish(prods, seconds + start_timeout_s)
    producing.clear()
    lasts = []
    for _ in cons:
        try:
            lasts.append(out.get(timeout=drain_max_s + start_timeout_s))
        except queue_mod.Empty:
            break
    _finish(cons, 10)
    elapsed = max(lasts, default=t0) - t0
    server_s = sum(cpu_s(p) for p in target.pids) - cpu0
    clients_s = children_cpu_s() - kids0  # the client processes, all joined by now
    return {"jobs": acked.value, "produced": produced.value,
            "server_us_per_job": 1e6 * server_s / max(1, acked.value) if target.pids else None,
            "clients_us_per_job": 1e6 * clients_s / max(1, acked.value),
            "jobs_per_s": acked.value / elapsed if elapsed > 0 else 0.0,
            "complete": acked.value >= produced.value}


def _paced_producer(target: Target, q: str, rate: float, seconds: float, barrier: Any,
                    sent_out: Any, achieved: Any, producing: Any) -> None:
    d = connect(target)
    barrier.wait(start_timeout_s)
    total = int(rate * seconds)
    t0 = time.monotonic()
    stop = t0 + seconds * paced_overrun_max
    sent = 0
    while sent < total and time.monotonic() < stop:
        now = time.monotonic()
        due = min(total, int((now - t0) * rate) + 1) - sent
        if due <= 0:
            time.sleep(max(0.0, t0 + sent / rate - now))
            continue
        n = min(due, BATCH)
        d.produce([(q, body(0, sent + k)) for k in range(n)])
        sent += n
    sent_out.value = sent
    achieved.value = sent / (time.monotonic() - t0)
    producing.clear()
    d.close()


def _paced_consumer(target: Target, q: str, deadline_s: float, barrier: Any, sent: Any,
                    producing: Any, out: Any) -> None:
    d = connect(target)
    barrier.wait(start_timeout_s)
    deadline = time.monotonic() + deadline_s
    lat = array("q")
    while time.monotonic() < deadline:
        jobs = d.consume([q], BATCH, consume_wait_s)
        now = time.monotonic_ns()
        if jobs:
            lat.extend(now - stamp_of(b) for _, b in jobs)
            d.ack([h for h, _ in jobs])
        elif not producing.is_set() and len(lat) >= sent.value:
            break
    out.put(lat.tobytes())
    d.close()


def paced(target: Target, q: str, rate: float, seconds: float) -> dict[str, Any]:
    """One producer at ``rate`` jobs/s, one consumer: add-to-delivery latencies (ns), and
    the CPU the servers' processes spent per job meanwhile (at a paced rate that is
    mostly what each wake-up costs: the loop turn, the flush, a blocked GETJOB woken)."""
    from bench.scaling import cpu_s

    cpu0 = sum(cpu_s(p) for p in target.pids)
    barrier = _CTX.Barrier(3)
    producing = _CTX.Event()
    producing.set()
    sent, achieved = _CTX.Value("q", 0), _CTX.Value("d", 0.0)
    out: Any = _CTX.Queue()
    deadline = seconds * paced_overrun_max + drain_max_s
    cons = _CTX.Process(target=_paced_consumer,
                        args=(target, q, deadline, barrier, sent, producing, out))
    prod = _CTX.Process(target=_paced_producer,
                        args=(target, q, rate, seconds, barrier, sent, achieved, producing))
    cons.start()
    prod.start()
    barrier.wait(start_timeout_s)
    try:
        raw = out.get(timeout=deadline + start_timeout_s)
    except queue_mod.Empty:
        raw = b""
    _finish([prod, cons], 10)
    server_s = sum(cpu_s(p) for p in target.pids) - cpu0
    lat = array("q")
    lat.frombytes(raw)
    return {"rate": rate, "achieved_rate": achieved.value, "sent": sent.value,
            "received": len(lat), "latency_ns": sorted(lat),
            "server_us_per_job": 1e6 * server_s / max(1, len(lat)) if target.pids else None}


def percentile(sorted_ns: list[int], p: float) -> float:
    """The p-th percentile of sorted nanoseconds, in milliseconds (nearest rank)."""
    if not sorted_ns:
        return float("nan")
    k = min(len(sorted_ns) - 1, max(0, math.ceil(p / 100 * len(sorted_ns)) - 1))
    return sorted_ns[k] / 1e6
