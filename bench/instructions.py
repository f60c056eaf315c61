"""A/B of source trees in instructions per request, under callgrind: the guard that a
shared 2-core machine cannot blur.

    python -m bench.instructions before=/tmp/base after=. [--requests 20000] \\
        [--pipeline 1 32] [--workers 2]
    python -m bench.instructions now=. --shape random per-connection \\
        --connections 64 [--pipeline 32] [--workers 1 2 16] [--command QLEN] [--keep DIR]

``bench.ab`` and ``bench.front_read`` time the trees; on a busy or throttled machine
their figures move by 5 to 30 % between runs. Here each tree (``label=dir``, its
compiled build if it has one) runs as a whole node (every worker and the
supervisor) under ``valgrind --tool=callgrind``, with ``PYTHONHASHSEED=0``, and
redis-benchmark sends ``--requests`` ``ADDJOB q:__rand_int__ x 0`` and then as many
``GETJOB NOHANG FROM q:__rand_int__`` over 10,000 queues (as bench.ab). The counters
of every process are dumped and zeroed between the phases (``callgrind_control
-d``), so each phase's instructions are its own: the per-request figure is the
CPU work of the node's code for that command, kernel excluded, the same from run
to run within a few tenths of a percent. Needs valgrind (``apt-get install
valgrind``) and redis-benchmark.

    python -m bench.instructions before=/tmp/base after=. --celery [--requests 5000]

``--celery``: the Celery-shaped consumer instead, ``GETJOB NOHANG COUNT 4 FROM``
one queue against the same over five queues spread over every worker (owners 0, 1,
... in turn), each with jobs present (filled first, never drained: every queue
holds more than the phase takes) and with the queues empty; four phases on one
node per tree and depth, the ratio of five queues to one printed beside.

``--shape`` measures one command alone with a client of its own (``shape_tree``):
``--command`` (ADDJOB, the default; QLEN, QSTAT, or QPEEK q 1), ``--connections``
connections, each keeping ``--pipeline`` of them in flight,
over 10,000 random queues (``random``) or a queue per connection
(``per-connection``, as ``bench.scaling``'s cores run); a warm-up first (every
random queue created by an ADDJOB; each connection handed to its queue's owner),
then the counted requests. It prints instructions per request for each tree, worker
count and shape, and each shape's ratio to the first.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

start_timeout_s = 180.0  # a node under callgrind starts some 20x slower
phase_timeout_s = 900.0
PHASES = (("ADDJOB", "ADDJOB q:__rand_int__ x 0"), ("GETJOB NOHANG", "GETJOB NOHANG FROM q:__rand_int__"))
TOTALS = re.compile(rb"^(?:summary|totals): (\d+)", re.M)


def _dump_all(pids: list[int]) -> None:
    subprocess.run(["callgrind_control", "-d", *map(str, pids)], capture_output=True,
                   timeout=60, check=True)


def _node_pids(root: int) -> list[int]:
    out = subprocess.run(["pgrep", "-g", str(root)], capture_output=True, text=True).stdout
    return sorted(int(p) for p in out.split())


def _phase_totals(work: Path, dump: int) -> int:
    """Instructions of one dump, over every process of the node."""
    total = 0
    for path in work.glob(f"cg.*.{dump}"):
        m = TOTALS.search(path.read_bytes())
        total += int(m.group(1)) if m else 0
    return total


def start_under_callgrind(tree: Path, work: Path, port: int, workers: int,
                          env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A node of ``tree`` under callgrind (every process; the counters in ``work``),
    in a session of its own; ``env`` on top of ours (PYTHONPATH at least)."""
    return subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--trace-children=yes",
         f"--callgrind-out-file={work}/cg.%p", sys.executable, "-m", "disque_mp",
         "--port", str(port), "--dir", str(work), "--workers", str(workers),
         "--maxmemory", "8gb", "--loglevel", "warning"],
        cwd=tree, env={**os.environ, "PYTHONHASHSEED": "0", **env},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


@contextmanager
def callgrind_node(tree: Path, workers: int) -> Iterator[tuple[int, Path, list[int]]]:
    """A node of ``tree`` under callgrind, ready: its port, the folder of its
    callgrind files and its processes; stopped on leaving."""
    from tests.nodeproc import free_port

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="instructions-") as tmp:
        work = Path(tmp)
        proc = start_under_callgrind(tree, work, port, workers, {"PYTHONPATH": str(tree)})
        try:
            _wait_ready(proc, port)
            yield port, work, _node_pids(proc.pid)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=120)


def run_tree(tree: Path, workers: int, requests: int, pipeline: int) -> dict[str, float]:
    """Instructions per request of each phase on one node of ``tree``."""
    with callgrind_node(tree, workers) as (port, work, pids):
        _dump_all(pids)  # dump 1: the start
        out: dict[str, float] = {}
        for dump, (name, cmd) in enumerate(PHASES, start=2):
            subprocess.run(["redis-benchmark", "-p", str(port), "-c", "50", "-n", str(requests),
                            "-P", str(pipeline), "-q", "-r", "10000", *cmd.split()],
                           capture_output=True, timeout=phase_timeout_s, check=True)
            _dump_all(pids)
            out[name] = _phase_totals(work, dump) / requests
        return out


CELERY_COUNT = 4
CELERY_QUEUES = 5


def celery_queues(prefix: str, n: int, workers: int) -> list[bytes]:
    """``n`` queue names whose owners go round every worker (0, 1, ... in turn)."""
    from workers.ids import owner_of_queue

    out: list[bytes] = []
    i = 0
    while len(out) < n:
        name = f"{prefix}{i}".encode()
        if owner_of_queue(name, workers) == len(out) % workers:
            out.append(name)
        i += 1
    return out


def run_celery(tree: Path, workers: int, requests: int, pipeline: int) -> dict[str, float]:
    """Instructions per GETJOB NOHANG COUNT 4 of the four Celery phases on one node."""

    one_full, one_empty = celery_queues("one-full-", 1, 1), celery_queues("one-empty-", 1, 1)
    five_full = celery_queues("five-full-", CELERY_QUEUES, workers)
    five_empty = celery_queues("five-empty-", CELERY_QUEUES, workers)
    fills = [(one_full[0], CELERY_COUNT * requests + 100)] + [(q, requests + 100) for q in five_full]
    phases = (("1 queue, jobs", one_full), (f"{CELERY_QUEUES} queues, jobs", five_full),
              ("1 queue, empty", one_empty), (f"{CELERY_QUEUES} queues, empty", five_empty))
    with callgrind_node(tree, workers) as (port, work, pids):
        for queue, n in fills:
            _bench(port, n, 32, ["ADDJOB", queue.decode(), "x", "0"])
        _dump_all(pids)  # dump 1: the start and the fill
        out: dict[str, float] = {}
        for dump, (name, queues) in enumerate(phases, start=2):
            _bench(port, requests, pipeline,
                   ["GETJOB", "NOHANG", "COUNT", str(CELERY_COUNT), "FROM",
                    *(q.decode() for q in queues)])
            _dump_all(pids)
            out[name] = _phase_totals(work, dump) / requests
        return out


def _bench(port: int, requests: int, pipeline: int, cmd: list[str]) -> None:
    subprocess.run(["redis-benchmark", "-p", str(port), "-c", "50", "-n", str(requests),
                    "-P", str(pipeline), "-q", *cmd],
                   capture_output=True, timeout=phase_timeout_s, check=True)


def _print_celery(label: str, pipeline: int, got: dict[str, float], first: dict[str, float]) -> None:
    names = list(got)
    cells = ", ".join(f"{name} {n:,.0f} ({100 * (n / first[name] - 1):+.2f} %)"
                      for name, n in got.items())
    ratios = ", ".join(f"{got[names[i + 1]] / got[names[i]]:.2f}x" for i in (0, 2))
    print(f"{label:>12} -P {pipeline:<2}: {cells} instr/req; five/one: jobs, empty {ratios}",
          flush=True)


def _wait_ready(proc: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + start_timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        ok = subprocess.run(["redis-cli", "-p", str(port), "PING"], capture_output=True).stdout
        if ok.strip() == b"PONG":
            return
        time.sleep(0.5)
    raise RuntimeError(f"node under callgrind on port {port} did not start")


def main(argv: list[str] | None = None) -> int:
    if "--shape" in (sys.argv[1:] if argv is None else argv):
        return shape_main(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m bench.instructions")
    p.add_argument("trees", nargs="+", help="label=dir")
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--pipeline", type=int, nargs="+", default=[1, 32])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--celery", action="store_true",
                   help="GETJOB NOHANG COUNT 4 over five queues against one")
    a = p.parse_args(argv)
    for tool in ("valgrind", "callgrind_control", "redis-benchmark"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed")
    sides = [(label, Path(d).resolve()) for label, _, d in (s.partition("=") for s in a.trees)]
    if a.celery:
        for pipeline in a.pipeline:
            rows = {label: run_celery(tree, a.workers, a.requests, pipeline) for label, tree in sides}
            for label, got in rows.items():
                _print_celery(label, pipeline, got, rows[sides[0][0]])
        return 0
    for pipeline in a.pipeline:
        rows = {label: run_tree(tree, a.workers, a.requests, pipeline) for label, tree in sides}
        first = rows[sides[0][0]]
        for label, got in rows.items():
            cells = ", ".join(f"{name} {n:,.0f} instr/req ({100 * (n / first[name] - 1):+.2f} %)"
                              for name, n in got.items())
            print(f"{label:>12} -P {pipeline:<2}: {cells}", flush=True)
    return 0


# ----- --shape: ADDJOB alone, random queues or a queue per connection --------

SHAPES = ("random", "per-connection")
RANDOM_QUEUES = 10_000
# --command: what the counted rounds send for each queue (the warm-up always ADDs, so
# every queue exists and holds jobs), and the type of reply each must get
COMMANDS: dict[str, tuple[bytes, type]] = {
    "ADDJOB": (b"x 0", bytes),
    "QLEN": (b"", int),
    "QSTAT": (b"", list),
    "QPEEK": (b"1", list),
}


def _addjob(queue: bytes) -> bytes:
    return b"*4\r\n$6\r\nADDJOB\r\n$%d\r\n%s\r\n$1\r\nx\r\n$1\r\n0\r\n" % (len(queue), queue)


def _request(command: str, queue: bytes) -> bytes:
    """``command`` of ``queue`` as RESP (``COMMANDS``: the words after the queue)."""
    if command == "ADDJOB":
        return _addjob(queue)
    words = [command.encode(), queue, *COMMANDS[command][0].split()]
    return b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)


def _check(command: str, reply: object) -> None:
    want = COMMANDS[command][1]
    if not isinstance(reply, want) or (isinstance(reply, bytes) and not reply.startswith(b"D-")):
        raise RuntimeError(f"unexpected {command} reply {reply!r}")


def _rounds(port: int, shape: str, conns: int, pipeline: int, rounds: int, seed: int,
            command: str = "ADDJOB") -> None:
    """``rounds`` times: a pipeline of ``command`` sent on every connection, then every
    reply read (checked: +id for ADDJOB, a reply of its type for the others). The
    random queues come from ``seed``: the same commands for every tree; seed 0 names
    them in order instead (q:0, q:1 ...: a warm-up that creates every queue, so that
    no counted request pays a queue's first sight)."""
    import random
    import socket

    import hiredis

    rng = random.Random(seed)
    seq = iter(range(rounds * conns * pipeline))
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(conns)]
    try:
        readers = [hiredis.Reader() for _ in socks]
        for _ in range(rounds):
            for c, s in enumerate(socks):
                if shape == "per-connection":
                    s.sendall(_request(command, b"c:%d" % c) * pipeline)
                else:
                    s.sendall(b"".join(_request(command, b"q:%d" % (
                        next(seq) % RANDOM_QUEUES if seed == 0 else rng.randrange(RANDOM_QUEUES)))
                        for _ in range(pipeline)))
            for s, r in zip(socks, readers, strict=True):
                for _ in range(pipeline):
                    reply = r.gets()
                    while reply is False:
                        data = s.recv(1 << 16)
                        if not data:
                            raise RuntimeError("the node closed a connection")
                        r.feed(data)
                        reply = r.gets()
                    _check(command, reply)
    finally:
        for s in socks:
            s.close()


def _warm_owners(port: int, workers: int) -> None:
    """Every worker's memo of queue owners filled with every random queue (a QLEN of
    each on a connection of each worker): a node that has run a while has seen
    them all, and a name's first sight (its hash) is no per-request cost."""
    from tests.rawclient import RawClient, worker_of

    names = [b"q:%d" % i for i in range(RANDOM_QUEUES)]
    sweep = b"".join(b"*2\r\n$4\r\nQLEN\r\n$%d\r\n%s\r\n" % (len(q), q) for q in names)
    seen: set[int] = set()
    for _ in range(50 * workers):
        if len(seen) == workers:
            return
        c = RawClient(port, timeout_s=600.0)
        try:
            w = worker_of(c)
            if w not in seen:
                seen.add(w)
                c.send(sweep)
                for _ in names:
                    c.read()
        finally:
            c.close()
    raise RuntimeError(f"no connection landed on some of the {workers} workers")


def _dump_each(pids: list[int]) -> None:
    """``_dump_all`` for many processes under callgrind on a few cores: an idle one
    dumps when it next wakes (its timers), so each gets minutes."""
    subprocess.run(["callgrind_control", "-d", *map(str, pids)], capture_output=True,
                   timeout=60 + 30 * len(pids), check=True)


def shape_tree(tree: Path, workers: int, shape: str, conns: int, requests: int,
               pipeline: int, keep: Path | None = None, command: str = "ADDJOB") -> float:
    """``command``'s instructions per request on one node of ``tree`` (every
    process), after a warm-up round of ADDJOB on the same connections' queues.
    ``keep``: the counted phase's callgrind files (dump 2 of every process) are
    copied there, for ``callgrind_annotate``."""
    rounds = max(1, requests // (conns * pipeline))
    with callgrind_node(tree, workers) as (port, work, pids):
        # warm-up: every queue created (random), every connection moved to its
        # queue's owner (per-connection: the handoff follows a streak)
        warm = -(-RANDOM_QUEUES // (conns * pipeline)) if shape == "random" else 2
        _rounds(port, shape, conns, pipeline, warm, seed=0)
        if shape == "random":
            _warm_owners(port, workers)
        _dump_each(pids)  # dump 1: the start and the warm-up
        _rounds(port, shape, conns, pipeline, rounds, seed=2, command=command)
        _dump_each(pids)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for path in work.glob("cg.*.2"):
                shutil.copy(path, keep / path.name)
        return _phase_totals(work, 2) / (rounds * conns * pipeline)


def shape_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.instructions")
    p.add_argument("trees", nargs="+", help="label=dir")
    p.add_argument("--shape", nargs="+", choices=SHAPES, required=True)
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--pipeline", type=int, nargs="+", default=[32])
    p.add_argument("--command", choices=list(COMMANDS), default="ADDJOB",
                   help="what the counted rounds send (QPEEK: QPEEK q 1)")
    p.add_argument("--keep", type=Path,
                   help="copy each run's counted callgrind files under this folder "
                        "(LABEL-pP-Nw-SHAPE/cg.PID.2)")
    a = p.parse_args(argv)
    sides = [(label, Path(d).resolve()) for label, _, d in (s.partition("=") for s in a.trees)]
    for pipeline in a.pipeline:
        for workers in a.workers:
            for label, tree in sides:
                got = {shape: shape_tree(tree, workers, shape, a.connections, a.requests, pipeline,
                                         a.keep / f"{label}-p{pipeline}-{workers}w-{shape}"
                                         if a.keep else None, a.command)
                       for shape in a.shape}
                first = got[a.shape[0]]
                cells = ", ".join(f"{shape} {n:,.0f} instr/req ({n / first:.2f}x)"
                                  for shape, n in got.items())
                print(f"{label:>12} -P {pipeline:<2} {workers:>2} workers, {a.connections} conns: "
                      f"{a.command} {cells}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
