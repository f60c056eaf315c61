"""Power loss of a whole cluster: kill -9 of every process of every node at once
under load, then each AOF cut to what the last fdatasync made durable (the worst
a power loss leaves: the page cache's unsynced bytes are gone), then a restart.

The nodes run with ``DISQUE_MP_AOF_SYNCED_DIR`` (``aof_format.SYNCED_ENV``): every
AOF opened for appending and every fdatasync writes how many of its bytes are
durable. An ADDJOB counts as answered when its ID reached the client; after the
restart a job is lost when no node has it (JSCAN of every node).

    python -m tests.faults.power_loss --fsync everysec --seconds 5 --rounds 3

prints, per round, the jobs answered, the bytes the power loss cut, the answered
jobs lost, how many of them were answered in the last second before the kill,
and the oldest loss's age. ``tests/node/test_power_loss.py`` runs it with
``appendfsync always`` (nothing answered may be lost).
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from disque_mp.node.aof_format import SYNCED_ENV
from tests.nodeproc import NodeProc, cluster_form_timeout_s, form_cluster, wait_until

kill_wait_s = 20.0  # every process of every node gone after SIGKILL (generous)


@dataclass
class Outcome:
    fsync: str
    answered: int = 0
    cut_bytes: int = 0
    # answered jobs no node has after the restart: (ID, seconds before the kill)
    lost: list[tuple[str, float]] = field(default_factory=list)

    def lost_in_last(self, seconds: float) -> int:
        return sum(1 for _j, age in self.lost if age <= seconds)

    def line(self) -> str:
        oldest = max((age for _j, age in self.lost), default=0.0)
        return (f"appendfsync {self.fsync}: {self.answered} answered, {self.cut_bytes} bytes "
                f"cut, {len(self.lost)} lost ({self.lost_in_last(1.0)} answered in the last "
                f"1 s before the kill), oldest loss {oldest * 1000:.0f} ms before the kill")


class Producer(threading.Thread):
    """ADDJOBs on one node until it dies; remembers when each ID was answered."""

    def __init__(self, port: int, queue: str, replicate: int) -> None:
        super().__init__(daemon=True)
        self.port, self.queue, self.replicate = port, queue, replicate
        self.answered: dict[str, float] = {}

    def run(self) -> None:
        r = redis.Redis(host="127.0.0.1", port=self.port, protocol=2, socket_timeout=10)
        n = 0
        while True:
            n += 1
            try:
                jid = r.execute_command("ADDJOB", self.queue, f"{self.queue}-{n}", 0,
                                        "REPLICATE", self.replicate, "RETRY", 300)
            except (redis.RedisError, OSError):
                return  # killed (or refused while dying): stop
            self.answered[jid.decode()] = time.monotonic()


def make_nodes(base: Path, fsync: str, workers: int) -> list[NodeProc]:
    nodes = []
    for i in range(3):
        d = base / f"n{i}"
        (d / "synced").mkdir(parents=True, exist_ok=True)
        nodes.append(NodeProc(d, workers=workers, env={SYNCED_ENV: str(d / "synced")},
                              conf={"appendonly": "yes", "appendfsync": fsync,
                                    "cluster-node-timeout": 3000}))
    return nodes


def kill_all(nodes: list[NodeProc]) -> float:
    """SIGKILL every process group at once; wait until every process is gone."""
    at = time.monotonic()
    for n in nodes:
        if n.pgid is not None:
            try:
                os.killpg(n.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for n in nodes:
        if n.proc is not None:
            n.proc.wait(timeout=kill_wait_s)
    wait_until(lambda: not any(n.group_pids() for n in nodes), kill_wait_s,
               "every process of every node gone")
    return at


def power_cut(node: NodeProc) -> int:
    """Cut each AOF of ``node`` to its durable size; the bytes cut."""
    cut = 0
    for note in (node.dir / "synced").glob("*.synced"):
        path = node.dir / note.name.removesuffix(".synced")
        if not path.exists():
            continue  # superseded and removed by a rewrite
        durable = int(note.read_text().split()[0])
        size = path.stat().st_size
        if size > durable:
            os.truncate(path, durable)
            cut += size - durable
    return cut


def jscan_all(node: NodeProc) -> set[str]:
    r = node.client(protocol=2)
    ids: set[str] = set()
    cursor: object = b"0"
    try:
        for _ in range(1_000_000):
            cursor, batch = r.execute_command("JSCAN", cursor, "COUNT", 1000)
            ids |= {x.decode() for x in batch}
            if cursor in (b"0", "0", 0):
                break
    finally:
        r.close()
    return ids


def run(base: Path, fsync: str, load_s: float, *, replicate: int = 2, workers: int = 2,
        producers: int = 6) -> Outcome:
    """One round: a 3-node cluster under ``load_s`` seconds of ADDJOBs, power loss of
    every node at once, restart; what was lost."""
    nodes = make_nodes(base, fsync, workers)
    out = Outcome(fsync)
    try:
        for n in nodes:
            n.start()
        form_cluster(nodes, cluster_form_timeout_s)
        threads = [Producer(nodes[i % 3].port, f"pl{i}", replicate) for i in range(producers)]
        for t in threads:
            t.start()
        time.sleep(load_s)
        killed_at = kill_all(nodes)
        for t in threads:
            t.join(timeout=kill_wait_s)
        out.cut_bytes = sum(power_cut(n) for n in nodes)
        for n in nodes:
            n.start()
        present = set().union(*(jscan_all(n) for n in nodes))
        answered = {j: at for t in threads for j, at in t.answered.items()}
        out.answered = len(answered)
        out.lost = sorted(((j, killed_at - at) for j, at in answered.items() if j not in present),
                          key=lambda x: x[1])
    finally:
        for n in nodes:
            n.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fsync", default="everysec", choices=["always", "everysec", "no"])
    ap.add_argument("--seconds", type=float, default=5.0, help="load before the kill")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replicate", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="powerloss-") as tmp:
            o = run(Path(tmp), args.fsync, args.seconds, replicate=args.replicate,
                    workers=args.workers)
        print(f"round {i + 1}: {o.line()}", flush=True)


if __name__ == "__main__":
    main()
