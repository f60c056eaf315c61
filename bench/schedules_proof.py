"""SCHEDULE's proof: jobs per fire time of ``EVERY 1`` on 3 nodes through faults,
beside Celery beat (one process, on the same cluster) killed for as long.

    python -m bench.schedules_proof [--seconds 60]     (root: network namespaces)

Three nodes, each in its network namespace (tests/faults/netns.py), AOF on,
default schedule settings. ``SCHEDULE SET proof EVERY 1 ADDJOB <q> x 0``, then:

- t = 10 s: the schedule's firer is SIGKILLed; t = 20 s: restarted (same dir);
- t = 35 s: the firer of that moment is cut off from the other two (both sides
  serve their clients); t = 45 s: healed;
- at the same time a real ``celery beat`` (PersistentScheduler, a 1 s entry
  publishing to the cluster through disque://) is SIGKILLed at 35 s and
  restarted at 45 s.

Afterwards every job of both queues is read from every node (JSCAN, SHOW): the
schedule's by the fire time in its DEDUP key, beat's by its creation second.
Written: bench/results/schedules-proof.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.record import provenance_line
from tests.faults.netns import Net
from tests.faults.nodes import REPO, FaultNode
from tests.nodeproc import queue_job_ids

RESULTS = REPO / "bench" / "results"
NODE_CONF = {"appendonly": "yes", "cluster-node-timeout": 3000}
form_timeout_s = 60.0

if os.environ.get("SCHEDULES_PROOF_BROKER"):  # the beat process: `celery -A bench.schedules_proof`
    from celery import Celery

    import disque_mp.kombu  # noqa: F401  (registers disque://)

    app = Celery("schedules_proof", broker=os.environ["SCHEDULES_PROOF_BROKER"])
    app.conf.beat_schedule = {"proof": {"task": "proof.tick", "schedule": 1.0,
                                        "options": {"queue": os.environ["SCHEDULES_PROOF_QUEUE"]}}}
    app.conf.broker_connection_retry_on_startup = True


def _wait(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except Exception:  # a node still starting
            pass
        time.sleep(0.2)
    raise TimeoutError(what)


def _show(node: FaultNode, *args: Any) -> dict[bytes, Any]:
    r = node.client()
    try:
        reply = r.execute_command(*args)
    finally:
        r.close()
    return dict(zip(reply[::2], reply[1::2], strict=True)) if reply else {}


def _reachable(node: FaultNode) -> int:
    r = node.client()
    try:
        text = r.execute_command("CLUSTER", "INFO").decode()
    finally:
        r.close()
    fields = dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)
    return int(fields["cluster_reachable_nodes"])


def _firer(nodes: list[FaultNode], up: set[int]) -> int:
    for i in sorted(up):
        try:
            if _show(nodes[i], "SCHEDULE", "SHOW", "proof").get(b"firer") == b"yes":
                return i
        except Exception:
            continue
    return min(up)


def _job_ids(node: FaultNode, queue: str) -> set[str]:
    r = node.client()
    try:
        return queue_job_ids(r, queue)
    finally:
        r.close()


def _buckets(nodes: list[FaultNode], queue: str, key: Any) -> dict[int, int]:
    """Jobs of ``queue`` any node holds, counted by ``key(SHOW)`` (a second)."""
    ids = set().union(*(_job_ids(n, queue) for n in nodes))
    out: dict[int, int] = {}
    for jid in ids:
        for n in nodes:
            show = _show(n, "SHOW", jid)
            if show:
                second = key(show)
                out[second] = out.get(second, 0) + 1
                break
    return out


def _beat(nodes: list[FaultNode], queue: str, workdir: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, SCHEDULES_PROOF_BROKER=";".join(f"disque://{n.ip}:{n.port}" for n in nodes),
               SCHEDULES_PROOF_QUEUE=queue,
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    out = open(workdir / "beat.log", "ab")  # noqa: SIM115 (the process keeps it)
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "bench.schedules_proof", "beat",
                             "-s", str(workdir / "beat-schedule"), "-l", "info"],
                            cwd=str(REPO), env=env, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=20)


def run(seconds: int, workdir: Path) -> dict[str, Any]:
    events: list[tuple[float, str]] = []
    with Net(3) as net:
        nodes = [FaultNode(net, i, workdir / f"n{i}", conf=NODE_CONF) for i in range(3)]
        for n in nodes:
            n.start()
        try:
            r = nodes[0].client()
            for n in nodes[1:]:
                r.execute_command("CLUSTER", "MEET", n.ip, n.port)
            r.close()
            _wait(lambda: all(_reachable(n) == 2 for n in nodes), form_timeout_s,
                  "the cluster forming")
            r = nodes[1].client()
            r.execute_command("SCHEDULE", "SET", "proof", "EVERY", 1, "ADDJOB", "sched-proof", "x", 0)
            r.close()
            _wait(lambda: all(_show(n, "SCHEDULE", "SHOW", "proof") for n in nodes), 30,
                  "every node knowing the schedule")
            beat = _beat(nodes, "beat-proof", workdir)
            t0 = time.time()
            up = {0, 1, 2}
            killed = cut = -1
            plan = [(10, "kill"), (20, "restart"), (35, "cut"), (45, "heal"), (seconds, "end")]
            for at, what in plan:
                time.sleep(max(0.0, t0 + at - time.time()))
                if what == "kill":
                    killed = _firer(nodes, up)
                    nodes[killed].kill9()
                    up.discard(killed)
                elif what == "restart":
                    nodes[killed].start()
                    up.add(killed)
                elif what == "cut":
                    cut = _firer(nodes, up)
                    net.partition([[cut], [i for i in range(3) if i != cut]])
                    _kill(beat)
                elif what == "heal":
                    net.heal()
                    beat = _beat(nodes, "beat-proof", workdir)
                who = killed if what in ("kill", "restart") else cut
                events.append((round(time.time() - t0, 1), what if what == "end" else f"{what} n{who}"))
            _kill(beat)
            time.sleep(3)  # notes and copies settle
            sched = _buckets(nodes, "sched-proof",
                             lambda s: int(s[b"dedup"].rsplit(b"@", 1)[1]) // 1000)
            beat_jobs = _buckets(nodes, "beat-proof", lambda s: int(s[b"ctime"]) // 1_000_000_000)
        finally:
            for n in nodes:
                n.stop()
    start = int(t0) + 2
    return {"t0": t0, "events": events, "seconds": seconds,
            "schedule": {str(t - int(t0)): c for t, c in sorted(sched.items()) if t >= start},
            "beat": {str(t - int(t0)): c for t, c in sorted(beat_jobs.items()) if t >= start},
            "window": [2, seconds]}


def _phase(t: int) -> str:
    if 10 <= t < 20:
        return "firer killed"
    if 35 <= t < 45:
        return "split"
    return "connected"


def report(res: dict[str, Any]) -> str:
    lo, hi = res["window"]
    rows = []
    tally: dict[str, dict[str, int]] = {}
    for t in range(lo, hi):
        s, b = res["schedule"].get(str(t), 0), res["beat"].get(str(t), 0)
        phase = _phase(t)
        rows.append(f"| {t} | {phase} | {s} | {b} |")
        for who, n in (("schedule", s), ("beat", b)):
            d = tally.setdefault(f"{who}:{phase}", {"seconds": 0, "missed": 0, "one": 0, "more": 0})
            d["seconds"] += 1
            d["missed" if n == 0 else "one" if n == 1 else "more"] += 1
    summary = ["| who | phase | seconds | 0 jobs (missed) | 1 job | 2+ jobs |", "|---|---|---|---|---|---|"]
    for key in sorted(tally):
        who, phase = key.split(":")
        d = tally[key]
        summary.append(f"| {who} | {phase} | {d['seconds']} | {d['missed']} | {d['one']} | {d['more']} |")
    return "\n".join([
        "# SCHEDULE EVERY 1 on 3 nodes through faults, beside Celery beat",
        "", provenance_line(), "",
        f"Command: `python -m bench.schedules_proof --seconds {res['seconds']}`. Three nodes in "
        "network namespaces, `appendonly yes`, `cluster-node-timeout 3000`, schedule settings "
        "at their defaults (`schedule-takeover-ms 2000`). Events (s after the start): "
        + ", ".join(f"{t} {what}" for t, what in res["events"]) + ". Celery beat (one "
        "process, PersistentScheduler, a 1 s entry, publishing through disque:// to the same "
        "cluster) is SIGKILLed during the split and restarted at its end.", "",
        "Jobs per fire time (schedule: the fire time in the job's DEDUP key; beat: the "
        "second its job was created), seconds 2 to the end:", "",
        *summary, "", "| second | phase | SCHEDULE jobs | beat jobs |", "|---|---|---|---|", *rows, ""])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=int, default=60)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="sched-proof-") as d:
        res = run(args.seconds, Path(d))
    (RESULTS / "schedules-proof.json").write_text(json.dumps(res, indent=1) + "\n")
    text = report(res)
    (RESULTS / "schedules-proof.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
