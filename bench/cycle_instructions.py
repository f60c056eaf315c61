"""The many-queue cycle in work counts: callgrind instructions per job over every
process of the node, and the local mesh's frames and messages per job by kind.

    python -m bench.cycle_instructions before=/tmp/base after=. [--jobs 4000] [--workers 1 2] [--queues 100]

The cycle of ``bench.peers`` (``bench/peers_load.py``), with a fixed number of jobs
instead of a fixed time: 2 producers pipeline ADDJOB in batches of 50 round robin
over 100 queues (``--queues``), 2 consumers each take ``GETJOB TIMEOUT 100 COUNT 50``
over its 50 queues (consumer c: queues c, c + 2, ...; every queue when there are fewer
queues than consumers: ``--queues 1`` is the single-queue cycle of ``bench.peers
--setting single``) and ACKJOB what they got (one ACKJOB with
every ID, as ``disque_mp.client`` does), until every job is acked. Each tree
(``label=dir``, its compiled build if it has one) runs as a whole node under
``valgrind --tool=callgrind`` (as ``bench.instructions``); the counters are dumped
before and after the cycle, so the figure is the cycle's own work, kernel excluded.
Mesh frames are counted by ``bench/meshcount/sitecustomize.py`` (put first on the
node's PYTHONPATH: it wraps the mesh's frame encoder; the node's code is not
changed). Timing does not enter the figures, but the interleaving of the clients
does (how deep the queues are when a GETJOB comes): counts move by a few percent
between runs, far less than between 1 and 2 workers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hiredis

from bench.instructions import (
    TOTALS,
    _dump_all,
    _node_pids,
    _phase_totals,
    _wait_ready,
    start_under_callgrind,
)

QUEUES = 100
CLIENTS = 2
BATCH = 50
BODY = b"x" * 100
# The node idle for this long before the cycle: its timers' rate under callgrind, which
# runs every process ~50x slower, so a wall-clock timer fires ~50x more often per job
# than at native speed (the figure net of it is the one that carries).
idle_s = 10.0
KIND_NAMES = {1: "CMD", 2: "REPLY", 3: "TAKE(S)", 4: "BLOCK", 5: "UNBLOCK", 6: "WAKE", 7: "RETURN",
              8: "SCATTER", 9: "CMDS", 10: "REPLIES", 11: "RAW", 12: "RAWREPLIES", 13: "TOOKS"}
HERE = Path(__file__).resolve().parent


class Conn:
    def __init__(self, port: int) -> None:
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.r = hiredis.Reader()

    def send(self, cmds: list[list[bytes]]) -> list[object]:
        out = bytearray()
        for cmd in cmds:
            out += b"*%d\r\n" % len(cmd)
            for a in cmd:
                out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.s.sendall(out)
        replies: list[object] = []
        while len(replies) < len(cmds):
            data = self.s.recv(1 << 20)
            if not data:
                raise ConnectionError("node closed the connection")
            self.r.feed(data)
            while (r := self.r.gets()) is not False:
                if isinstance(r, hiredis.ReplyError):
                    raise RuntimeError(str(r))
                replies.append(r)
        return replies


def drive(port: int, jobs: int, prefix: str, nqueues: int = QUEUES) -> None:
    """The cycle: ``jobs`` added, taken and acked over ``nqueues`` queues."""
    queues = [f"{prefix}-{i}".encode() for i in range(nqueues)]
    acked = [0]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def producer(index: int) -> None:
        c = Conn(port)
        n = 0
        share = jobs // CLIENTS
        while n < share:
            k = min(BATCH, share - n)
            c.send([[b"ADDJOB", queues[(n + i) % nqueues], BODY, b"0"] for i in range(k)])
            n += k

    def consumer(index: int) -> None:
        c = Conn(port)
        mine = queues[index::CLIENTS] if nqueues >= CLIENTS else queues
        while True:
            with lock:
                if acked[0] >= jobs:
                    return
            got: Any = c.send([[b"GETJOB", b"TIMEOUT", b"100", b"COUNT", b"%d" % BATCH, b"FROM", *mine]])[0]
            if not got:
                continue
            ids = [j[1] for j in got]
            c.send([[b"ACKJOB", *ids]])
            with lock:
                acked[0] += len(ids)

    def guard(fn: Callable[[int], None], i: int) -> None:
        try:
            fn(i)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=guard, args=(f, i)) for f in (consumer, producer)
               for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(1800)
    if errors:
        raise errors[0]


def _totals(path: Path) -> int:
    m = TOTALS.search(path.read_bytes())
    return int(m.group(1)) if m else 0


def mesh_counts(work: Path) -> dict[int, tuple[int, int]]:
    """Frames and messages by kind, over every process that sent any."""
    import array

    out: dict[int, tuple[int, int]] = {}
    for path in work.glob("mesh.*"):
        view = array.array("Q")
        view.frombytes(path.read_bytes()[: 8 * 64])
        for kind in KIND_NAMES:
            f, m = out.get(kind, (0, 0))
            out[kind] = (f + view[kind], m + view[32 + kind])
    return out


def run_tree(tree: Path, workers: int, jobs: int, keep: str | None = None,
             nqueues: int = QUEUES) -> dict[str, object]:
    from tests.nodeproc import free_port

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="cycle-instr-") as tmp:
        work = Path(tmp)
        proc = start_under_callgrind(tree, work, port, workers, {
            "PYTHONPATH": f"{HERE / 'meshcount'}:{tree}", "MESHCOUNT_DIR": str(work)})
        try:
            _wait_ready(proc, port)
            pids = _node_pids(proc.pid)
            drive(port, 200, "warm", nqueues)  # first-use costs (imports, code paths) out of the figure
            _dump_all(pids)  # dump 1: start and warm-up
            time.sleep(idle_s)
            _dump_all(pids)  # dump 2: the node idle (its timers, under callgrind's slowness)
            idle_rate = _phase_totals(work, 2) / idle_s
            before = mesh_counts(work)
            t0 = time.monotonic()
            drive(port, jobs, "cycle", nqueues)
            _dump_all(pids)  # dump 3: the cycle
            seconds = time.monotonic() - t0
            after = mesh_counts(work)
            instr = _phase_totals(work, 3) / jobs
            per_process = {p.name: _totals(p) / jobs for p in work.glob("cg.*.3")}
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=120)
            if keep:
                dest = Path(keep) / f"w{workers}-{tree.name}"
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(work, dest, ignore=shutil.ignore_patterns("*.aof*", "*.sock*"))
    mesh = {KIND_NAMES[k]: ((after.get(k, (0, 0))[0] - before.get(k, (0, 0))[0]) / jobs,
                            (after.get(k, (0, 0))[1] - before.get(k, (0, 0))[1]) / jobs) for k in KIND_NAMES}
    # what the timers alone would have cost over the cycle's (slowed) seconds
    idle = idle_rate * seconds / jobs
    return {"instr": instr, "idle": idle, "seconds": seconds, "mesh": mesh, "per_process": per_process}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cycle_instructions")
    p.add_argument("trees", nargs="+", help="label=dir")
    p.add_argument("--jobs", type=int, default=4000)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--queues", type=int, default=QUEUES, help="queues the producers spread over (1: one queue)")
    p.add_argument("--keep", help="copy each node's callgrind files under this folder")
    a = p.parse_args(argv)
    if a.queues < 1:
        p.error("--queues must be at least 1")
    for tool in ("valgrind", "callgrind_control", "redis-cli"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed")
    sides = [(label, Path(d).resolve()) for label, _, d in (s.partition("=") for s in a.trees)]
    print(f"load at start: {os.getloadavg()}", flush=True)
    for workers in a.workers:
        for label, tree in sides:
            got = run_tree(tree, workers, a.jobs, a.keep, a.queues)
            mesh = got["mesh"]
            assert isinstance(mesh, dict)
            frames = sum(f for f, _ in mesh.values())
            msgs = sum(m for _, m in mesh.values())
            per = {k: round(float(v)) for k, v in got["per_process"].items()}  # type: ignore[attr-defined]
            kinds = ", ".join(f"{k} {f:.3f}/{m:.3f}" for k, (f, m) in mesh.items() if f)
            instr, idle = float(got["instr"]), float(got["idle"])  # type: ignore[arg-type]
            print(f"{label:>8} workers {workers}: {instr:,.0f} instr/job, of which "
                  f"{idle:,.0f} the idle node's rate over the cycle's {got['seconds']:.0f} s "
                  f"(net {instr - idle:,.0f}); mesh frames "
                  f"{frames:.3f}/job, messages {msgs:.3f}/job; by kind (frames/messages per "
                  f"job): {kinds or '-'}; per process {per}", flush=True)
    print(f"load at end: {os.getloadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
