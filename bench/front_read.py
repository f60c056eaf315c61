"""CPU of one client read through a worker's front end, in process, tree against tree.

    python -m bench.front_read before=/tmp/base after=. [--reads 2000] [--repeats 25] \\
        [--pipeline 1 32]

``bench.ab`` measures whole nodes under redis-benchmark; on a shared 2-core machine
its node CPU per request moves by 10 to 30 % from run to run. This one measures
only our code: for each tree (``label=dir``, its compiled build if it has one) a
child process builds a ``Worker`` (one worker, a real shard, an AOF manager with
appendonly no, as a node has) and one ``ClientConn`` whose transport is a byte
sink, and feeds it reads of one command each (``ADDJOB q:N x 0``, then
``GETJOB NOHANG FROM q:N``, over 10,000 queues as in bench.ab): the parse, the
router's fast path, the shard, the reply, the end of the batch. No socket, no
event-loop wake-up and no other process inside the measured time: the best of
``--repeats`` passes is the CPU a read of one command costs (what -P 1 pays per
command, less the kernel's part). ``--pipeline 32`` puts 32 commands in each read
(what -P 32 pays per command). The trees alternate; each runs twice.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

queues_n = 10_000  # as bench.ab's redis-benchmark -r 10000
child_timeout_s = 300.0

# Runs inside the child, against the tree on PYTHONPATH (older trees included:
# only names every version has).
CHILD = r"""
import asyncio, os, random, sys, tempfile, time
import disque_mp
if not os.path.realpath(disque_mp.__file__).startswith(os.path.realpath(sys.argv[4]) + os.sep):
    sys.exit(f"disque_mp comes from {disque_mp.__file__}, not from the tree")
from disque_mp.node.aof import AofManager, ShardAdapter
from disque_mp.node.config import Config
from disque_mp.node.connection import ClientConn
from disque_mp.node.worker import Worker
from workers.shard import Shard

class Sink(asyncio.Transport):
    def write(self, data): pass
    def get_write_buffer_size(self): return 0

reads, repeats, queues, pipeline = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                    int(sys.argv[5]))
asyncio.set_event_loop(asyncio.new_event_loop())
cfg = Config(workers=1, dir=tempfile.mkdtemp(prefix="front-read-"))
w = Worker(cfg, 0, "ab" * 20)
w.loop = asyncio.get_event_loop()
now_ms = int(time.time() * 1000)
w.shard = Shard("ab" * 20, 0, 1, os.urandom(16), random.Random(1), now_ms)
w.tick_at = now_ms + 100  # as after a tick: the next one within a period
w.aof = AofManager(cfg, 0, ShardAdapter(w.shard))
w.aof.load(now_ms)
conn = ClientConn(w)
conn.transport = Sink()
rnd = random.Random(2)
def req(*words):
    return b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(x), x) for x in words)
for name, words in (("ADDJOB", lambda q: (b"ADDJOB", q, b"x", b"0")),
                    ("GETJOB", lambda q: (b"GETJOB", b"NOHANG", b"FROM", q))):
    cmds = [req(*words(b"q:%d" % rnd.randrange(queues))) for _ in range(reads * pipeline)]
    data = [b"".join(cmds[i:i + pipeline]) for i in range(0, len(cmds), pipeline)]
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for d in data:
            conn.data_received(d)
        best = min(best, (time.perf_counter() - t0) / len(cmds))
    print(name, round(best * 1e9))
"""


def run_tree(tree: Path, reads: int, repeats: int, pipeline: int = 1) -> dict[str, int]:
    """One child process on ``tree``: ns per command, ``pipeline`` commands a read."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(reads), str(repeats), str(queues_n),
                          str(tree), str(pipeline)],
                         cwd=tree, env=env, capture_output=True, text=True,
                         timeout=child_timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"{tree}: {out.stderr[-2000:]}")
    return {name: int(ns) for name, ns in (line.split() for line in out.stdout.splitlines())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.front_read")
    p.add_argument("trees", nargs="+", help="label=dir")
    p.add_argument("--reads", type=int, default=2000, help="reads per pass")
    p.add_argument("--repeats", type=int, default=25, help="passes; the best one counts")
    p.add_argument("--pipeline", type=int, nargs="+", default=[1],
                   help="commands per read (as redis-benchmark -P); several run one after the other")
    a = p.parse_args(argv)
    for pipeline in a.pipeline:
        compare(sides_of(a.trees), a.reads, a.repeats, pipeline)
    return 0


def sides_of(trees: list[str]) -> list[tuple[str, Path]]:
    return [(label, Path(d).resolve()) for label, _, d in (s.partition("=") for s in trees)]


def compare(sides: list[tuple[str, Path]], reads: int, repeats: int, pipeline: int) -> None:
    """Each tree twice, alternating; the best pass of each counts."""
    best: dict[str, dict[str, int]] = {}
    for turn in range(2):
        for label, tree in sides if turn == 0 else sides[::-1]:
            got = run_tree(tree, reads, repeats, pipeline)
            mine = best.setdefault(label, got)
            for name, ns in got.items():
                mine[name] = min(mine[name], ns)
    first = sides[0][0]
    for label, _ in sides:
        row = ", ".join(f"{name} {ns:,} ns/command ({100 * (ns / best[first][name] - 1):+.1f} %)"
                        for name, ns in best[label].items())
        print(f"{label:>12} -P {pipeline:<2}: {row}")


if __name__ == "__main__":
    sys.exit(main())
