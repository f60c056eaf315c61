"""A Celery chord of 100 tasks: the disque:// result backend against Redis'.

    python -m bench.chord_results               # chord of 100, 3 rounds each
    python -m bench.chord_results --tasks 20 --rounds 1 --out /tmp/c

One node (2 workers) is the broker for both runs; the result backend is the node
itself (``backend="disque://..."``, disque_mp/kombu/backend.py) or a redis-server
started on a free port (Celery's own Redis backend). A real ``celery worker`` (``-c
2``, the app of tests/brokers/celery_app.py) runs the header's ``add`` tasks and the
``tsum`` callback; the figure is the time from ``chord(header)(body)`` to the
callback's value in the producer (``AsyncResult.get()``), rounds interleaved,
median and each round. Results go to ``bench/results/chord-results.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from celery import Celery, chord, signature

import disque_mp.kombu  # noqa: F401  (registers disque://)
from bench import record
from bench.redisq import RedisServer
from tests.brokers.conftest import WorkerProc
from tests.nodeproc import NodeProc, free_port, unique_queue

TASKS = "tests.brokers.celery_app"
NOTE = ("Why: Redis' backend joins natively (a counter per chord, the callback sent by "
        "the header's last task); the disque:// backend has no native join, so Celery's "
        "`chord_unlock` task polls the header's results, re-queued with a countdown of "
        "1 s (a Disque DELAY is whole seconds): the callback waits up to a second after "
        "the header is done.")


def _worker(url: str, backend: str, queue: str, log: Path) -> WorkerProc:
    env = {"DISQUE_BROKER_URL": url, "BROKER_TEST_QUEUE": queue, "DISQUE_RESULT_BACKEND": backend,
           "BROKER_RECORD_FILE": str(log.with_suffix(".jsonl")), "DISQUE_VISIBILITY_S": "30"}
    args = ["celery", "-A", TASKS, "worker", "-Q", queue, "-c", "2", "-l", "warning",
            "--without-mingle", "--without-gossip", "-n", f"chord-{queue}@%h"]
    return WorkerProc(args, env, log).start()


def _app(url: str, backend: str, queue: str) -> Celery:
    app = Celery("chords", broker=url, backend=backend, set_as_current=False)
    app.conf.task_default_queue = queue
    return app


def one_chord(app: Celery, queue: str, tasks: int) -> float:
    header = [signature(f"{TASKS}.add", args=(i, i), app=app, queue=queue) for i in range(tasks)]
    body = signature(f"{TASKS}.tsum", app=app, queue=queue)
    t0 = time.perf_counter()
    total = chord(header, app=app)(body).get(timeout=300)
    took = time.perf_counter() - t0
    if total != sum(2 * i for i in range(tasks)):
        raise RuntimeError(f"chord answered {total}")
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chord_results")
    p.add_argument("--tasks", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=record.REPO / "bench" / "results")
    args = p.parse_args(argv)
    times: dict[str, list[float]] = {"disque": [], "redis": []}
    with tempfile.TemporaryDirectory() as tmp, NodeProc(Path(tmp) / "n", workers=2) as n:
        redis_server = RedisServer(Path(tmp) / "redis", free_port()).start()
        try:
            url = f"disque://127.0.0.1:{n.port}"
            backends = {"disque": url, "redis": f"redis://127.0.0.1:{redis_server.port}/0"}
            sides: dict[str, Any] = {}
            for name, backend in backends.items():
                queue = unique_queue(f"chord-{name}")
                w = _worker(url, backend, queue, Path(tmp) / f"{name}.log")
                app = _app(url, backend, queue)
                one_chord(app, queue, 2)  # the worker is up and warm
                sides[name] = (w, app, queue)
            try:
                for _ in range(args.rounds):
                    for name, (_w, app, queue) in sides.items():
                        times[name].append(one_chord(app, queue, args.tasks))
            finally:
                for side in sides.values():
                    side[0].stop()
        finally:
            redis_server.stop()
    res = {"tasks": args.tasks, "rounds": args.rounds, "seconds": times,
           "median_s": {k: statistics.median(v) for k, v in times.items()},
           "provenance": record.provenance()}
    res["ratio_disque_to_redis"] = res["median_s"]["disque"] / res["median_s"]["redis"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "chord-results.json").write_text(json.dumps(res, indent=1) + "\n")
    lines = [f"# A Celery chord of {args.tasks} tasks: disque:// result backend against Redis'",
             "", "`python -m bench.chord_results` (bench/chord_results.py says how). "
             + record.provenance_line(), "",
             "| result backend | median to the callback (s) | rounds (s) |", "|---|---|---|"]
    for name, v in times.items():
        lines.append(f"| {name} | {statistics.median(v):.2f} | "
                     + ", ".join(f"{x:.2f}" for x in v) + " |")
    lines += ["", f"disque / Redis: {res['ratio_disque_to_redis']:.2f}x the time "
              "(the broker is the same node in both).", "", NOTE]
    (args.out / "chord-results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
