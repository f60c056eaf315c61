"""Hosts that come and go under load: a membership run, start to verdict.

    result = run_membership(MembershipRun(seed=7), workdir, history_path)
    result["valid"], result["problems"]

Each host is a real node in its own network namespace (tests/faults/netns.py). Five
start and form a cluster; producers on every live host add ``REPLICATE 3`` jobs (and
at-most-once ones) and consumers take and acknowledge them from other hosts, as in the
fault runs (tests/faults/workload.py), while the membership changes:

1. a sixth host starts with ``cluster-seeds`` naming two of the five: it joins by
   configuration alone, then gets producers and consumers;
2. a seventh joins the same way, naming the sixth and a first one;
3. one host is cut from every other for a while, then healed (a fault window);
4. two hosts are drained one after the other with ``disque-mp admin drain`` (the
   operator's command, run as an operator would), each after the consumers paused
   for ``backlog_s`` so that it holds queued jobs: LEAVING, its queued jobs pulled away
   by the consumers on the other hosts (federation), SHUTDOWN; each must exit 0, and
   is then forgotten (CLUSTER FORGET) by every host left.

Then the clients stop, the hosts left must all see each other, every job left is
taken, and the history is checked (tests/faults/history.py): nothing an answered
ADDJOB created is lost, nothing whose ACKJOB was answered is delivered again unless
the cut explains it, and every error a client saw is one of the documented replies
(``documented_errors``). Every phase is bounded.
"""

from __future__ import annotations

import random
import re
import secrets
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from tests.faults import history as hist
from tests.faults.netns import Net
from tests.faults.nodes import REPO, FaultNode
from tests.faults.runner import _cluster_view, _tracebacks, _wait_converged, start_cluster
from tests.faults.workload import Clients, retry_s

# What a client of a host that joins, leaves or is cut off may be told: the reference's
# replies (NOREPL, LEAVING), a timeout of its own, or a connection refused, closed or
# reset while a host stops or is cut off. Anything else fails the run.
documented_errors = tuple(re.compile(p) for p in (
    r"^NOREPL ", r"^LEAVING ", r"^Timeout", r"timed out", r"^Error \d+ connecting to ",
    r"^Connection closed by server", r"^Error while reading from ", r"Connection reset by peer",
    r"^Error \d+ while writing to socket", r"^ERR cluster bus owner",
))


@dataclass
class MembershipRun:
    seed: int
    start_nodes: int = 5
    added: int = 2
    drained: int = 2
    replicate: int = 3
    rate_per_s: float = 6.0  # ADDJOBs per second per producer
    node_timeout_ms: int = 2500
    workers: int = 1  # per host: seven hosts share two cores
    phase_s: float = 6.0  # load between two membership changes
    backlog_s: float = 3.0  # before a drain, consumers pause so the host holds queued jobs
    cut_s: float = 8.0  # the cut host's window
    join_s: float = 60.0  # bound on a seeded host seeing every other
    node_drain_s: float = 90.0  # `admin drain --timeout`
    form_s: float = 90.0
    converge_s: float = 90.0
    drain_quiet_s: float = 3.0 * retry_s + 2.0
    drain_max_s: float = 90.0
    stop_s: float = 30.0


def _my_id(node: FaultNode) -> str:
    r = node.client(socket_timeout=10)
    try:
        return r.execute_command("CLUSTER", "MYID").decode()
    finally:
        r.close()


def _sees(node: FaultNode, others: int) -> bool:
    reachable, text = _cluster_view(node)
    return reachable == others and not re.search(r"fail|handshake|noaddr", text)


def _join(node: FaultNode, seeds: list[FaultNode], others: int, bound_s: float) -> float:
    """Start ``node`` with cluster-seeds naming ``seeds``; seconds until it sees ``others``."""
    node.conf["cluster-seeds"] = ",".join(f"{s.ip}:{s.port}" for s in seeds)
    t0 = time.monotonic()
    node.start()
    deadline = t0 + bound_s
    while time.monotonic() < deadline:
        if _sees(node, others):
            return time.monotonic() - t0
        time.sleep(0.5)
    raise TimeoutError(f"{node.name} (cluster-seeds {node.conf['cluster-seeds']}) did not "
                       f"join: {_cluster_view(node)}")


def _drain(node: FaultNode, timeout_s: float) -> dict[str, Any]:
    """``disque-mp admin drain`` against ``node``, as an operator runs it; its exit, its
    last lines, and the node's own exit status."""
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "disque_mp", "admin", "--node",
                          f"{node.ip}:{node.port}", "drain", "--timeout", str(timeout_s)],
                         capture_output=True, text=True, cwd=str(REPO), timeout=timeout_s + 60)
    status = None
    if node.proc is not None:
        try:
            status = node.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            status = None
    return {"node": node.name, "exit": out.returncode, "node_exit": status,
            "seconds": round(time.monotonic() - t0, 1),
            "output": [lines[0], *lines[-2:]] if (lines := (out.stdout + out.stderr)
                                                   .strip().splitlines()) else []}


def _queued_jobs(node: FaultNode) -> int:
    r = node.client(socket_timeout=10)
    try:
        return int(r.info("jobs")["queued_jobs"])
    finally:
        r.close()


def _forget(nodes: list[FaultNode], node_id: str) -> list[str]:
    problems = []
    for n in nodes:
        try:
            r = n.client(socket_timeout=10)
            try:
                r.execute_command("CLUSTER", "FORGET", node_id)
            finally:
                r.close()
        except (redis.RedisError, OSError) as e:
            problems.append(f"CLUSTER FORGET {node_id[:8]} on {n.name}: {e!r}")
    return problems


def undocumented_errors(ops: list[dict[str, Any]]) -> list[str]:
    """The errors clients saw that are not among ``documented_errors``."""
    out = []
    for op in ops:
        err = op.get("err")
        if err and not any(p.search(err) for p in documented_errors):
            out.append(f"{op['p']} on n{op['n']} ({op['f']}): {err}")
    return out


def run_membership(cfg: MembershipRun, workdir: Path, history_path: Path) -> dict[str, Any]:
    rng = random.Random(cfg.seed)
    run_id = secrets.token_hex(3)
    history = hist.History()
    total = cfg.start_nodes + cfg.added
    result: dict[str, Any] = {"valid": False, "problems": ["run did not finish"]}
    events: list[dict[str, Any]] = []
    extra: list[str] = []
    nodes: list[FaultNode] = []
    try:
        with Net(total, random.Random(cfg.seed)) as net:
            conf = {"cluster-node-timeout": cfg.node_timeout_ms, "appendonly": "yes",
                    "appendfsync": "everysec"}
            nodes = [FaultNode(net, i, workdir / f"n{i}", workers=cfg.workers, conf=dict(conf))
                     for i in range(total)]
            try:
                start_cluster(nodes[:cfg.start_nodes], cfg.form_s)
                history.t_start = time.monotonic()
                extra += _play(cfg, rng, net, nodes, history, run_id, events)
                result = hist.check(history.ops, history.faults, run_id)
                extra += undocumented_errors(history.ops)
            finally:
                for n in nodes:
                    n.stop()
                extra += _tracebacks(nodes)
    finally:
        result["events"] = events
        if extra:
            result["problems"] = [*result.get("problems", []), *extra]
            result["valid"] = False
        history.dump(history_path, seed=cfg.seed, run=run_id, config=asdict(cfg),
                     events=events, checks=result, node_dirs=[str(n.dir) for n in nodes])
    return result


def _play(cfg: MembershipRun, rng: random.Random, net: Net, nodes: list[FaultNode],
          history: hist.History, run_id: str, events: list[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    clients = Clients(nodes, history, run_id, replicate=cfg.replicate,
                      rate_per_s=cfg.rate_per_s, seed=cfg.seed, workers=cfg.workers)
    live = list(range(cfg.start_nodes))
    clients.producing = set(live)
    clients.consuming = set(live)
    clients.start()
    try:
        for i in range(cfg.start_nodes, cfg.start_nodes + cfg.added):
            time.sleep(cfg.phase_s)
            seeds = [nodes[live[-1]], nodes[live[0]]]
            t0 = history.now()
            took = _join(nodes[i], seeds, len(live), cfg.join_s)
            live.append(i)
            clients.producing.add(i)
            clients.consuming.add(i)
            events.append({"event": "join", "node": i, "seeds": [s.name for s in seeds],
                           "t0": t0, "t1": history.now(), "seconds": round(took, 1)})
        time.sleep(cfg.phase_s)
        cut = rng.choice(live)
        t0 = history.now()
        net.partition([[cut], [n for n in live if n != cut]])
        time.sleep(cfg.cut_s)
        net.heal()
        history.fault("isolate", [[cut], [n for n in live if n != cut]], t0, history.now())
        ok, views = _wait_converged([nodes[n] for n in live], cfg.converge_s)
        if not ok:
            problems.append("hosts did not see each other after the cut:\n" + "\n".join(views))
        for victim in rng.sample([n for n in live if n != 0], cfg.drained):
            time.sleep(cfg.phase_s)
            node = nodes[victim]
            node_id = _my_id(node)
            consumers = clients.consuming - {victim}
            clients.consuming = set()  # a backlog builds up, on the victim too ...
            time.sleep(cfg.backlog_s)
            queued = _queued_jobs(node)
            clients.consuming = consumers  # ... which the others' consumers pull away
            t0 = history.now()
            got = _drain(node, cfg.node_drain_s)
            got["queued_before"] = queued
            clients.producing.discard(victim)
            live.remove(victim)
            if got["exit"] != 0 or got["node_exit"] != 0:
                problems.append(f"draining {node.name}: {got}")
            problems += _forget([nodes[n] for n in live], node_id)
            events.append({"event": "drain", "t0": t0, "t1": history.now(), **got})
        time.sleep(cfg.phase_s)
    finally:
        clients.stop(cfg.stop_s)
    net.heal()
    ok, views = _wait_converged([nodes[n] for n in live], cfg.converge_s)
    if not ok:
        problems.append("the hosts left did not all see each other:\n" + "\n".join(views))
    expected = {op["v"] for op in history.ops
                if op["f"] == "enqueue" and op["type"] == "ok" and ":r2:" in op["v"]}
    clients.drain(expected, cfg.drain_quiet_s, cfg.drain_max_s)
    return problems + clients.errors
