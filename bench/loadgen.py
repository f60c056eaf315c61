"""Load generator for disque-mp and for a Redis list-based reliable queue.

    python -m bench.loadgen cycle --target disque --port 7711 --procs 2 --duration-s 10
    python -m bench.loadgen cycle --target redis --port 6379 --procs 2 --duration-s 10
    disque-mp bench produce --pipeline 32 --json

Workloads:
    produce  ADDJOB (disque) / LPUSH (redis), ``--pipeline`` commands per write.
    consume  prefill, then GETJOB NOHANG COUNT n (disque) / n x LMOVE src processing
             (redis) until the queues are empty or the time is up.
    cycle    N producers and M consumers per process: ADDJOB -> GETJOB -> ACKJOB, or
             LPUSH -> BLMOVE src processing RIGHT LEFT -> LREM processing 1 item
             ("Redis as a jobs queue", the thing Disque replaces). The producer puts
             its send time in the body; latency is add-to-ack, end to end.

Every process runs asyncio on uvloop with raw RESP over ``asyncio.Protocol`` and a
``hiredis.Reader`` (no redis-py in the hot loop). Processes are forked before any
event loop exists. A progress line goes to stderr once a second; ``--json`` prints
the result as JSON on stdout. Every loop is bounded in count and time: the run
stops by itself (``--duration-s`` or ``--jobs``, whichever comes first, plus a
bounded drain for the cycle).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import hiredis

# Bounds (the generator must stop by itself whatever the server does).
duration_s_max = 3600.0  # one run never lasts longer than an hour
procs_max = 64  # more processes than cores only measures the scheduler
conns_per_proc_max = 1024  # file descriptors and memory stay modest
pipeline_max = 10_000  # commands per write; deeper only grows buffers
count_max = 10_000  # jobs asked per GETJOB / moves per consumer batch
body_bytes_max = 16 << 20  # one body; larger is not a queue benchmark
jobs_max = 1 << 40  # total job count accepted on the command line
drain_s_max = 10.0  # cycle: consumers keep draining this long after producers stop
connect_s_max = 10.0  # opening one connection
prefill_s_max = 600.0  # consume: the prefill phase of all processes
errors_max = 1000  # error replies tolerated before the run aborts
backlog_poll_s = 0.0002  # first re-check of a full backlog ...
backlog_poll_s_max = 0.004  # ... doubling up to this: polling must not eat the server's CPU
block_ms = 100  # consumers' blocking wait: short, so stop conditions are re-checked
stop_grace_s = 30.0  # after the planned end, children are killed if still running
ts_digits = 20  # decimal nanoseconds at the head of cycle bodies

DEFAULT_PORTS = {"disque": 7711, "redis": 6379}


@dataclass(slots=True)
class Settings:
    workload: str = "cycle"
    target: str = "disque"
    host: str = "127.0.0.1"
    port: int = 7711
    procs: int = 2
    conns: int = 4
    producers: int = 2
    consumers: int = 2
    pipeline: int = 1
    count: int = 0  # 0 = same as pipeline
    body_bytes: int = 100
    replicate: int = 0  # 0 = server default
    queues: int = 1
    duration_s: float = 10.0
    jobs: int = 0  # 0 = no count limit
    prefill: int = 100_000
    prefix: str = ""
    quiet: bool = False
    backlog: int = 2000  # cycle: producers wait while this many jobs are added but not acked
    rate: float = 0.0  # cycle/produce: total jobs/s offered (0 = as fast as possible)

    def take_count(self) -> int:
        return self.count or self.pipeline


# ---------------------------------------------------------------- histogram


class Histogram:
    """Log-linear histogram of microseconds, <1 % relative error, mergeable.

    Values below 128 us have their own bucket; above, each power of two is cut
    into 128 buckets. Sparse dict, so it crosses process boundaries cheaply.
    """

    __slots__ = ("counts", "total", "max_us", "sum_us")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.total = 0
        self.max_us = 0
        self.sum_us = 0

    def record(self, us: int) -> None:
        if us < 128:
            i = us if us > 0 else 0
        else:
            shift = us.bit_length() - 8
            i = (shift + 1) * 128 + (us >> shift) - 128
        self.counts[i] = self.counts.get(i, 0) + 1
        self.total += 1
        self.sum_us += us
        if us > self.max_us:
            self.max_us = us

    @staticmethod
    def value_of(i: int) -> float:
        if i < 128:
            return float(i)
        shift = i // 128 - 1
        low = (i % 128 + 128) << shift
        return low + ((1 << shift) - 1) / 2

    def merge(self, other: dict[str, Any]) -> None:
        for k, v in other["counts"].items():
            self.counts[int(k)] = self.counts.get(int(k), 0) + v
        self.total += other["total"]
        self.sum_us += other["sum_us"]
        self.max_us = max(self.max_us, other["max_us"])

    def dump(self) -> dict[str, Any]:
        return {"counts": self.counts, "total": self.total, "max_us": self.max_us,
                "sum_us": self.sum_us}

    def percentile(self, p: float) -> float:
        if not self.total:
            return 0.0
        rank = p / 100.0 * self.total
        seen = 0
        for i in sorted(self.counts):
            seen += self.counts[i]
            if seen >= rank:
                return self.value_of(i)
        return float(self.max_us)

    def summary(self) -> dict[str, float]:
        mean = self.sum_us / self.total if self.total else 0.0
        return {"p50_us": self.percentile(50), "p99_us": self.percentile(99),
                "p999_us": self.percentile(99.9), "max_us": float(self.max_us),
                "mean_us": round(mean, 1), "samples": self.total}


# ---------------------------------------------------------------- RESP


def encode(*args: bytes) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn(asyncio.Protocol):
    """One client connection: write a batch, await its ``want`` replies, in order."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.transport: asyncio.Transport | None = None
        self.replies: list[Any] = []
        self.done_ns: list[int] = []
        self.want = 0
        self.waiter: asyncio.Future[None] | None = None
        self.lost: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        now = time.monotonic_ns()
        replies, done = self.replies, self.done_ns
        while (r := self.reader.gets()) is not False:
            replies.append(r)
            done.append(now)
        w = self.waiter
        if w is not None and len(replies) >= self.want and not w.done():
            w.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionResetError("server closed the connection")
        w = self.waiter
        if w is not None and not w.done():
            w.set_exception(self.lost)

    async def call(self, payload: bytes, want: int) -> tuple[list[Any], list[int], int]:
        """Send ``payload`` (``want`` commands); return replies, their arrival ns, send ns."""
        if self.lost is not None or self.transport is None:
            raise ConnectionError(f"connection lost: {self.lost}")
        self.replies, self.done_ns, self.want = [], [], want
        self.waiter = asyncio.get_running_loop().create_future()
        sent = time.monotonic_ns()
        self.transport.write(payload)
        await self.waiter
        self.waiter = None
        return self.replies, self.done_ns, sent

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def connect(s: Settings) -> Conn:
    return await connect_to(s.host, s.port)


async def connect_to(host: str, port: int) -> Conn:
    loop = asyncio.get_running_loop()
    _, proto = await asyncio.wait_for(loop.create_connection(Conn, host, port), connect_s_max)
    return proto


# ---------------------------------------------------------------- targets

Item = tuple[Any, bytes]  # (what the ack needs, body)


class DisqueTarget:
    """ADDJOB / GETJOB [NOHANG] COUNT n FROM q.. / ACKJOB id.."""

    name = "disque"

    def __init__(self, s: Settings) -> None:
        self.tail = encode(b"0")[4:]  # ADDJOB's ms-timeout argument
        self.nargs = 4
        if s.replicate:
            self.tail += encode(b"REPLICATE", b"%d" % s.replicate)[4:]
            self.nargs += 2

    def adder(self, queue: bytes) -> Callable[[bytes], bytes]:
        head = b"*%d\r\n$6\r\nADDJOB\r\n$%d\r\n%s\r\n" % (self.nargs, len(queue), queue)
        tail = self.tail
        return lambda body: b"%s$%d\r\n%s\r\n%s" % (head, len(body), body, tail)

    def take(self, queues: list[bytes], count: int, block: bool, turn: int) -> tuple[bytes, int]:
        wait = [b"TIMEOUT", b"%d" % block_ms] if block else [b"NOHANG"]
        return encode(b"GETJOB", *wait, b"COUNT", b"%d" % count, b"FROM", *queues), 1

    def parse_take(self, replies: list[Any]) -> list[Item]:
        r = replies[0]
        if r is None or isinstance(r, hiredis.ReplyError):
            return []
        return [(job[1], job[2]) for job in r]

    def ack(self, items: list[Item]) -> tuple[bytes, int]:
        return encode(b"ACKJOB", *[i[0] for i in items]), 1

    def acked(self, replies: list[Any], items: list[Item]) -> int:
        return len(items) if not isinstance(replies[0], hiredis.ReplyError) else 0


class RedisTarget:
    """LPUSH / BLMOVE (+ LMOVE) src processing RIGHT LEFT / LREM processing 1 item."""

    name = "redis"

    def __init__(self, s: Settings) -> None:
        self.owner = b""  # set per consumer: its processing lists

    def adder(self, queue: bytes) -> Callable[[bytes], bytes]:
        head = b"*3\r\n$5\r\nLPUSH\r\n$%d\r\n%s\r\n" % (len(queue), queue)
        return lambda body: b"%s$%d\r\n%s\r\n" % (head, len(body), body)

    def processing(self, queue: bytes) -> bytes:
        return queue + b":processing:" + self.owner

    def take(self, queues: list[bytes], count: int, block: bool, turn: int) -> tuple[bytes, int]:
        # Like GETJOB COUNT n: block for the first item only, take up to n.
        q = queues[turn % len(queues)]
        dst = self.processing(q)
        first = encode(b"BLMOVE", q, dst, b"RIGHT", b"LEFT", b"%g" % (block_ms / 1000)) \
            if block else encode(b"LMOVE", q, dst, b"RIGHT", b"LEFT")
        self.last_dst = dst
        rest = encode(b"LMOVE", q, dst, b"RIGHT", b"LEFT") * (count - 1)
        return first + rest, count

    def parse_take(self, replies: list[Any]) -> list[Item]:
        dst = self.last_dst
        return [(dst, r) for r in replies if isinstance(r, bytes)]

    def ack(self, items: list[Item]) -> tuple[bytes, int]:
        return b"".join(encode(b"LREM", dst, b"1", body) for dst, body in items), len(items)

    def acked(self, replies: list[Any], items: list[Item]) -> int:
        return sum(1 for r in replies if r == 1)


Target = DisqueTarget | RedisTarget


def make_target(s: Settings) -> Target:
    return DisqueTarget(s) if s.target == "disque" else RedisTarget(s)


# ---------------------------------------------------------------- one process


class Shared:
    """Counters each process publishes after every batch; the parent and the
    other processes read them (progress line, the cycle's drain condition)."""

    def __init__(self, ctx: Any, procs: int) -> None:
        self.produced = ctx.RawArray("q", procs)
        self.taken = ctx.RawArray("q", procs)
        self.acked = ctx.RawArray("q", procs)
        self.errors = ctx.RawArray("q", procs)
        self.ready = ctx.RawArray("b", procs)  # 0 starting, 1 ready, -1 failed
        self.producers_done = ctx.RawArray("b", procs)
        self.start = ctx.Event()


class Child:
    """State of one load-generator process."""

    def __init__(self, s: Settings, index: int, shared: Shared) -> None:
        self.s, self.index, self.shared = s, index, shared
        self.hist = Histogram()
        self.produced = self.taken = self.acked = self.errors = 0
        self.take_calls = self.empty_takes = 0  # mean batch = taken / take_calls
        self.first_error = ""
        self.t0_ns = self.last_ns = 0
        self.stop = False

    def publish(self) -> None:
        sh, i = self.shared, self.index
        sh.produced[i], sh.taken[i] = self.produced, self.taken
        sh.acked[i], sh.errors[i] = self.acked, self.errors

    def note_errors(self, replies: list[Any]) -> int:
        bad = 0
        for r in replies:
            if isinstance(r, hiredis.ReplyError):
                bad += 1
                self.first_error = self.first_error or str(r)
        if bad:
            self.errors += bad
            self.stop = self.errors > errors_max
        return bad

    def cycle_finished(self) -> bool:
        sh = self.shared
        return all(sh.producers_done) and sum(sh.acked) >= sum(sh.produced)

    def queue(self, k: int) -> bytes:
        return f"{self.s.prefix}:{k % self.s.queues}".encode()

    def consumer_queues(self, j: int, total: int) -> list[bytes]:
        q = self.s.queues
        ks = [k for k in range(q) if k % total == j] if total <= q else [j % q]
        return [self.queue(k) for k in ks]

    def result(self) -> dict[str, Any]:
        return {"index": self.index, "produced": self.produced, "taken": self.taken,
                "acked": self.acked, "errors": self.errors, "first_error": self.first_error,
                "take_calls": self.take_calls, "empty_takes": self.empty_takes,
                "elapsed_ns": max(0, self.last_ns - self.t0_ns), "hist": self.hist.dump()}


def split(total: int, parts: int, index: int) -> int:
    return total // parts + (1 if index < total % parts else 0)


def stamp_body(size: int) -> Callable[[], bytes]:
    pad = b"x" * max(0, size - ts_digits)
    return lambda: b"%020d" % time.monotonic_ns() + pad


def stamp_of(body: bytes) -> int | None:
    try:
        return int(body[:ts_digits])
    except ValueError:
        return None


async def produce_loop(c: Child, conn: Conn, queue: bytes, share: int, end_ns: int,
                       timed: bool) -> None:
    """ADDJOB/LPUSH ``share`` jobs in batches of ``--pipeline``; one write per batch."""
    add = make_target(c.s).adder(queue)
    body = stamp_body(c.s.body_bytes)
    done, t0 = 0, time.monotonic_ns()
    per_conn_rate = c.s.rate / (c.s.procs * (c.s.producers if c.s.workload == "cycle" else c.s.conns))
    while done < share and not c.stop and time.monotonic_ns() < end_ns:
        n = min(c.s.pipeline, share - done)
        if per_conn_rate and c.t0_ns:  # not while prefilling
            await pace(t0 + int(done / per_conn_rate * 1e9), end_ns)
        if c.s.workload == "cycle":
            await wait_backlog(c, end_ns)
        replies, done_ns, sent = await conn.call(b"".join([add(body()) for _ in range(n)]), n)
        ok = n - c.note_errors(replies)
        done += n
        c.produced += ok
        if timed:
            for t in done_ns:
                c.hist.record((t - sent) // 1000)
            c.last_ns = done_ns[-1]
        c.publish()


async def pace(due_ns: int, end_ns: int) -> None:
    """Open-loop pacing for --rate: sleep until this batch is due."""
    wait_ns = min(due_ns, end_ns) - time.monotonic_ns()
    if wait_ns > 0:
        await asyncio.sleep(wait_ns / 1e9)


async def wait_backlog(c: Child, end_ns: int) -> None:
    """Closed loop: without it producers outrun consumers and the measured latency is
    only the age of an ever-growing queue."""
    sh, wait_s = c.shared, backlog_poll_s
    while sum(sh.produced) - sum(sh.acked) >= c.s.backlog and time.monotonic_ns() < end_ns:
        await asyncio.sleep(wait_s)
        wait_s = min(wait_s * 2, backlog_poll_s_max)


def consumer_target(c: Child, j: int) -> Target:
    """Consumer ``j``'s target (on Redis, with its own processing lists)."""
    t = make_target(c.s)
    if isinstance(t, RedisTarget):
        t.owner = b"%d:%d" % (c.index, j)
    return t


async def take_batch(c: Child, conn: Conn, t: Target, queues: list[bytes], block: bool,
                     turn: int) -> tuple[list[Item], list[int], int]:
    """One take round trip, counted: the items, the replies' arrival times, the send time."""
    payload, want = t.take(queues, c.s.take_count(), block, turn)
    replies, done_ns, sent = await conn.call(payload, want)
    c.note_errors(replies)
    items = t.parse_take(replies)
    c.take_calls += 1
    c.empty_takes += 0 if items else 1
    c.taken += len(items)
    return items, done_ns, sent


async def cycle_consume(c: Child, conn: Conn, j: int, total: int, end_ns: int) -> None:
    """Take a batch (blocking briefly), ack it, record add-to-ack latency per job."""
    t = consumer_target(c, j)
    queues, turn = c.consumer_queues(j, total), 0
    while not c.stop and time.monotonic_ns() < end_ns:
        items, _, _ = await take_batch(c, conn, t, queues, True, turn)
        turn += 1
        if not items:
            if c.cycle_finished():
                return
            continue
        payload, want = t.ack(items)
        replies, done_ns, _ = await conn.call(payload, want)
        c.note_errors(replies)
        c.acked += t.acked(replies, items)
        c.last_ns = end = done_ns[-1]
        for _, body in items:
            ts = stamp_of(body)
            if ts is not None:
                c.hist.record((end - ts) // 1000)
        c.publish()


async def drain_consume(c: Child, conn: Conn, j: int, total: int, end_ns: int) -> None:
    """Take without blocking until every queue of this consumer is empty."""
    t = consumer_target(c, j)
    queues, turn, empty_turns = c.consumer_queues(j, total), 0, 0
    while not c.stop and time.monotonic_ns() < end_ns and empty_turns < len(queues):
        items, done_ns, sent = await take_batch(c, conn, t, queues, False, turn)
        turn += 1
        empty_turns = 0 if items else empty_turns + 1
        if items:
            c.last_ns = done_ns[-1]
            us = (done_ns[-1] - sent) // 1000
            for _ in items:
                c.hist.record(us)
        c.publish()


async def wait_start(shared: Shared) -> None:
    deadline = time.monotonic() + prefill_s_max + stop_grace_s
    while not shared.start.is_set():
        if time.monotonic() > deadline:
            raise TimeoutError("the parent never gave the start signal")
        await asyncio.sleep(0.002)


async def prefill(c: Child, conns: list[Conn]) -> None:
    share = split(c.s.prefill, c.s.procs, c.index)
    end = time.monotonic_ns() + int(prefill_s_max * 1e9)
    await asyncio.gather(*[
        produce_loop(c, conn, c.queue(c.index * len(conns) + k), split(share, len(conns), k),
                     end, False)
        for k, conn in enumerate(conns)])


def plan_tasks(c: Child, prod: list[Conn], cons: list[Conn]) -> list[Any]:
    s, t0 = c.s, c.t0_ns
    end = t0 + int(s.duration_s * 1e9)
    total = s.jobs or jobs_max
    if s.workload == "consume":
        n = len(cons) * s.procs
        return [drain_consume(c, conn, c.index * len(cons) + k, n, end)
                for k, conn in enumerate(cons)]
    share = split(total, s.procs, c.index)
    producers = [produce_loop(c, conn, c.queue(c.index * len(prod) + k),
                              split(share, len(prod), k), end, s.workload == "produce")
                 for k, conn in enumerate(prod)]
    if s.workload == "produce":
        return producers

    async def producers_then_flag() -> None:
        try:
            await asyncio.gather(*producers)
        finally:
            c.shared.producers_done[c.index] = 1

    n = len(cons) * s.procs
    drain_end = end + int(drain_s_max * 1e9)
    return [producers_then_flag()] + [cycle_consume(c, conn, c.index * len(cons) + k, n, drain_end)
                                       for k, conn in enumerate(cons)]


async def child_main(s: Settings, index: int, shared: Shared) -> dict[str, Any]:
    c = Child(s, index, shared)
    nprod, ncons = (s.producers, s.consumers) if s.workload == "cycle" else (s.conns, 0)
    prod = [await connect(s) for _ in range(nprod)]
    cons = [await connect(s) for _ in range(ncons)]
    try:
        if s.workload == "consume":
            await prefill(c, prod)
            c.produced, cons = 0, prod
            c.publish()
        shared.ready[index] = 1
        await wait_start(shared)
        c.t0_ns = c.last_ns = time.monotonic_ns()
        outcomes = await asyncio.gather(*plan_tasks(c, prod, cons), return_exceptions=True)
        for o in outcomes:
            if isinstance(o, BaseException):
                c.first_error = c.first_error or f"{type(o).__name__}: {o}"
                c.errors += 1
        c.publish()
        return c.result()
    finally:
        for conn in prod + cons:
            conn.close()


def child_entry(s: Settings, index: int, shared: Shared, results: Any) -> None:
    import uvloop

    try:
        res = uvloop.run(child_main(s, index, shared))
    except BaseException as e:  # report every failure to the parent, then exit
        shared.ready[index] = -1
        res = {"index": index, "fatal": f"{type(e).__name__}: {e}"}
    results.put(res)


# ---------------------------------------------------------------- the parent


def progress_line(s: Settings, sh: Shared, t_s: float, last: dict[str, int]) -> str:
    now = {"produced": sum(sh.produced), "taken": sum(sh.taken), "acked": sum(sh.acked)}
    parts = [f"[{t_s:5.1f}s]"]
    for k in ("produced", "taken", "acked"):
        if now[k] or k == {"produce": "produced", "consume": "taken"}.get(s.workload, "acked"):
            parts.append(f"{k} {now[k]:,} ({now[k] - last.get(k, 0):,}/s)")
    parts.append(f"errors {sum(sh.errors)}")
    last.update(now)
    return " ".join(parts)


def wait_ready(s: Settings, sh: Shared, procs: list[Any]) -> None:
    deadline = time.monotonic() + connect_s_max * 2 + prefill_s_max
    next_tick = time.monotonic() + 1
    while not all(r == 1 for r in sh.ready):
        if any(r == -1 for r in sh.ready) or not all(p.is_alive() for p in procs):
            return  # a child failed: its report says why
        if time.monotonic() > deadline:
            raise TimeoutError("load generator processes did not get ready")
        if not s.quiet and time.monotonic() >= next_tick:
            print(f"prefill: {sum(sh.produced):,} jobs", file=sys.stderr, flush=True)
            next_tick += 1
        time.sleep(0.01)


def collect(s: Settings, sh: Shared, results: Any, procs: list[Any]) -> list[dict[str, Any]]:
    import queue as queue_mod

    t0 = time.monotonic()
    deadline = t0 + s.duration_s + drain_s_max + stop_grace_s
    out: list[dict[str, Any]] = []
    last: dict[str, int] = {}
    next_tick = t0 + 1
    while len(out) < len(procs) and time.monotonic() < deadline:
        try:
            out.append(results.get(timeout=max(0.01, min(next_tick, deadline) - time.monotonic())))
        except queue_mod.Empty:
            pass
        if time.monotonic() >= next_tick:
            if not s.quiet:
                print(progress_line(s, sh, time.monotonic() - t0, last), file=sys.stderr, flush=True)
            next_tick += 1
    return out


def merge(s: Settings, parts: list[dict[str, Any]], procs: int) -> dict[str, Any]:
    fatal = [p["fatal"] for p in parts if "fatal" in p]
    if len(parts) < procs:
        fatal.append(f"{procs - len(parts)} process(es) did not report in time")
    hist = Histogram()
    tot = {"produced": 0, "taken": 0, "acked": 0, "errors": 0, "take_calls": 0, "empty_takes": 0}
    elapsed_ns, first_error = 0, ""
    for p in parts:
        if "fatal" in p:
            continue
        for k in tot:
            tot[k] += p[k]
        hist.merge(p["hist"])
        elapsed_ns = max(elapsed_ns, p["elapsed_ns"])
        first_error = first_error or p["first_error"]
    main_count = {"produce": "produced", "consume": "taken"}.get(s.workload, "acked")
    elapsed_s = elapsed_ns / 1e9
    return {"settings": asdict(s), **tot, "first_error": first_error, "fatal": fatal,
            "elapsed_s": round(elapsed_s, 3),
            "jobs_per_s": round(tot[main_count] / elapsed_s, 1) if elapsed_s else 0.0,
            "latency_kind": {"produce": "command", "consume": "take batch"}.get(
                s.workload, "add-to-ack"),
            "latency": hist.summary()}


def run(s: Settings) -> dict[str, Any]:
    """Run one load test to completion and return the merged result."""
    import multiprocess

    check(s)
    s.prefix = s.prefix or f"lg{os.getpid()}-{time.time_ns() % 10**9}"
    ctx = multiprocess.get_context("fork")  # forked before any event loop exists
    sh, results = Shared(ctx, s.procs), ctx.Queue()
    procs = [ctx.Process(target=child_entry, args=(s, i, sh, results), daemon=True)
             for i in range(s.procs)]
    for p in procs:
        p.start()
    try:
        wait_ready(s, sh, procs)
        sh.start.set()
        parts = collect(s, sh, results, procs)
    finally:
        for p in procs:
            p.join(timeout=2)
            if p.is_alive():
                p.kill()  # a child stuck on a silent server: ours to end
                p.join(timeout=2)
    return merge(s, parts, s.procs)


def check(s: Settings) -> None:
    """Reject settings outside the bounds with a clear message."""
    limits = [("procs", s.procs, 1, procs_max), ("conns", s.conns, 1, conns_per_proc_max),
              ("producers", s.producers, 1, conns_per_proc_max),
              ("consumers", s.consumers, 1, conns_per_proc_max),
              ("pipeline", s.pipeline, 1, pipeline_max), ("count", s.count, 0, count_max),
              ("body-bytes", s.body_bytes, 1, body_bytes_max), ("queues", s.queues, 1, 1 << 20),
              ("jobs", s.jobs, 0, jobs_max), ("prefill", s.prefill, 0, jobs_max),
              ("replicate", s.replicate, 0, 1 << 16), ("backlog", s.backlog, 1, jobs_max)]
    for name, v, lo, hi in limits:
        if not lo <= v <= hi:
            raise ValueError(f"--{name} must be between {lo} and {hi}, got {v}")
    if not 0 <= s.rate <= 1e8:
        raise ValueError("--rate must be between 0 and 1e8 jobs/s")
    if not 0 < s.duration_s <= duration_s_max:
        raise ValueError(f"--duration-s must be in (0, {duration_s_max}]")
    if s.workload == "consume" and s.jobs:
        s.prefill = s.jobs  # consume exactly the jobs asked for
    if s.workload == "cycle" and s.body_bytes < ts_digits:
        s.body_bytes = ts_digits  # the add time rides in the body


def parse_args(argv: list[str]) -> tuple[Settings, bool]:
    p = argparse.ArgumentParser(prog="disque-mp bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", choices=["produce", "consume", "cycle"])
    p.add_argument("--target", choices=["disque", "redis"], default="disque",
                   help="disque: ADDJOB/GETJOB/ACKJOB; redis: LPUSH/BLMOVE/LREM reliable queue")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, help="default 7711 (disque) or 6379 (redis)")
    p.add_argument("--procs", type=int, default=2, help="load generator processes")
    p.add_argument("--conns", type=int, default=4, help="connections per process (produce, consume)")
    p.add_argument("--producers", type=int, default=2, help="producer connections per process (cycle)")
    p.add_argument("--consumers", type=int, default=2, help="consumer connections per process (cycle)")
    p.add_argument("--pipeline", type=int, default=1, help="commands per write (producers)")
    p.add_argument("--count", type=int, default=0, help="jobs per take (GETJOB COUNT); 0 = --pipeline")
    p.add_argument("--body-bytes", type=int, default=100)
    p.add_argument("--replicate", type=int, default=0, help="ADDJOB REPLICATE (0 = server default)")
    p.add_argument("--queues", type=int, default=1)
    p.add_argument("--duration-s", type=float, default=0.0, help="default 10, or 600 with --jobs")
    p.add_argument("--jobs", type=int, default=0, help="total jobs (0 = until --duration-s)")
    p.add_argument("--prefill", type=int, default=100_000, help="consume: jobs queued first")
    p.add_argument("--backlog", type=int, default=2000,
                   help="cycle: most jobs added but not yet acked (closed loop)")
    p.add_argument("--rate", type=float, default=0.0,
                   help="total jobs/s the producers offer (0 = as fast as they can)")
    p.add_argument("--prefix", default="", help="queue name prefix (default: unique per run)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    a = p.parse_args(argv)
    duration = a.duration_s or (600.0 if a.jobs else 10.0)
    s = Settings(workload=a.workload, target=a.target, host=a.host,
                 port=a.port or DEFAULT_PORTS[a.target], procs=a.procs, conns=a.conns,
                 producers=a.producers, consumers=a.consumers, pipeline=a.pipeline,
                 count=a.count, body_bytes=a.body_bytes, replicate=a.replicate, queues=a.queues,
                 duration_s=duration, jobs=a.jobs,
                 prefill=a.prefill,
                 prefix=a.prefix, quiet=a.quiet, backlog=a.backlog, rate=a.rate)
    return s, a.json


def human(r: dict[str, Any]) -> str:
    s, lat = r["settings"], r["latency"]
    lines = [f"{s['workload']} against {s['target']} {s['host']}:{s['port']}: "
             f"procs {s['procs']}, pipeline {s['pipeline']}, body {s['body_bytes']} B, "
             f"queues {s['queues']}",
             f"  {r['jobs_per_s']:,.0f} jobs/s over {r['elapsed_s']} s; produced {r['produced']:,}, "
             f"taken {r['taken']:,}, acked {r['acked']:,}, errors {r['errors']}; "
             f"{r['take_calls']:,} takes ({r['empty_takes']:,} empty)",
             f"  latency ({r['latency_kind']}, us): p50 {lat['p50_us']:.0f}  p99 {lat['p99_us']:.0f}  "
             f"p99.9 {lat['p999_us']:.0f}  max {lat['max_us']:.0f}"]
    if r["first_error"]:
        lines.append(f"  first error: {r['first_error']}")
    lines += [f"  FAILED: {f}" for f in r["fatal"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        s, as_json = parse_args(sys.argv[1:] if argv is None else argv)
        r = run(s)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(r, indent=2) if as_json else human(r))
    return 1 if r["fatal"] else 0


if __name__ == "__main__":
    sys.exit(main())
