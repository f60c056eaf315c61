"""One fault run, start to verdict: network, nodes, cluster, clients, nemesis, heal,
drain, checks, history file.

    result = run(FaultRun(seed=7, nodes=3, kinds=("isolate", "kill9"), duration_s=75),
                 workdir, history_path)
    result["valid"], result["problems"]

Every phase has a bound (``FaultRun``'s ``*_s`` fields); the history is written
whatever happens, with the seed and the checks, so a failure can be replayed
(same seed, same schedule) and read.
"""

from __future__ import annotations

import random
import re
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from tests.faults import history as hist
from tests.faults.nemesis import Fault, Nemesis, schedule
from tests.faults.netns import Net
from tests.faults.nodes import FaultNode
from tests.faults.workload import Clients, retry_s

traceback_re = re.compile(r"^Traceback \(most recent call last\)", re.M)


@dataclass
class FaultRun:
    seed: int
    nodes: int = 3
    kinds: tuple[str, ...] = ("isolate", "kill9")
    duration_s: float = 75.0  # workload with faults
    healthy_s: tuple[float, float] = (6.0, 10.0)
    faulty_s: tuple[float, float] = (8.0, 14.0)
    replicate: int = 2  # REPLICATE of r2 values (REPLICATE - 1 crashes are survivable)
    rate_per_s: float = 8.0  # ADDJOBs per second per producer (one producer per node)
    node_timeout_ms: int = 2500  # cluster-node-timeout: failure detection inside a window
    workers: int = 2  # per node
    form_s: float = 90.0  # bound on forming the cluster
    converge_s: float = 90.0  # bound on every node seeing every other after the heal
    drain_quiet_s: float = 3.0 * retry_s + 2.0  # nothing new for this long: drained
    drain_max_s: float = 90.0
    stop_s: float = 30.0  # bound on clients and nemesis stopping


def _cluster_view(node: FaultNode) -> tuple[int, str]:
    """(reachable nodes, CLUSTER NODES text) of a node, (-1, error) if it does not answer."""
    try:
        r = node.client(socket_timeout=5)
        try:
            info = r.execute_command("CLUSTER", "INFO").decode()
            text = r.execute_command("CLUSTER", "NODES").decode()
        finally:
            r.close()
    except (redis.RedisError, OSError) as e:
        return -1, repr(e)
    fields = dict(line.split(":", 1) for line in info.split("\r\n") if ":" in line)
    return int(fields.get("cluster_reachable_nodes", -1)), text


def _wait_converged(nodes: list[FaultNode], bound_s: float) -> tuple[bool, list[str]]:
    """Until every node sees every other healthy (no fail/fail?/handshake flag)."""
    deadline = time.monotonic() + bound_s
    want = len(nodes) - 1
    views: list[str] = []
    while time.monotonic() < deadline:
        seen = [_cluster_view(n) for n in nodes]
        views = [f"{n.name}: reachable {c}\n{t}" for n, (c, t) in zip(nodes, seen, strict=True)]
        if all(c == want and not re.search(r"fail|handshake|noaddr", t) for c, t in seen):
            return True, views
        time.sleep(0.5)
    return False, views


def start_cluster(nodes: list[FaultNode], bound_s: float) -> None:
    """Start ``nodes`` side by side, wait until each answers, and form a cluster of them."""
    for n in nodes:
        n.start(wait=False)
    for n in nodes:
        n.wait_ready()
    _form(nodes, bound_s)


def _form(nodes: list[FaultNode], bound_s: float) -> None:
    r = nodes[0].client()
    try:
        for n in nodes[1:]:
            r.execute_command("CLUSTER", "MEET", n.ip, n.port)
    finally:
        r.close()
    ok, views = _wait_converged(nodes, bound_s)
    if not ok:
        raise TimeoutError("cluster did not form:\n" + "\n".join(views))


def run(cfg: FaultRun, workdir: Path, history_path: Path) -> dict[str, Any]:
    """Play ``cfg`` on real nodes; the checks, also written with the history."""
    rng = random.Random(cfg.seed)
    plan = schedule(rng, cfg.nodes, cfg.kinds, cfg.duration_s, cfg.healthy_s, cfg.faulty_s)
    run_id = secrets.token_hex(3)
    history = hist.History()
    result: dict[str, Any] = {"valid": False, "problems": ["run did not finish"]}
    extra: list[str] = []
    nodes: list[FaultNode] = []
    try:
        with Net(cfg.nodes, random.Random(cfg.seed)) as net:
            conf = {"cluster-node-timeout": cfg.node_timeout_ms, "appendonly": "yes",
                    "appendfsync": "everysec"}
            nodes = [FaultNode(net, i, workdir / f"n{i}", workers=cfg.workers, conf=conf)
                     for i in range(cfg.nodes)]
            try:
                start_cluster(nodes, cfg.form_s)
                history.t_start = time.monotonic()
                extra += _play(cfg, plan, net, nodes, history, rng, run_id)
                result = hist.check(history.ops, history.faults, run_id)
                result["lost_show"] = _show_lost(nodes, history, result)
                extra += _node_checks(nodes, cfg)
            finally:
                for n in nodes:
                    n.stop()
                extra += _tracebacks(nodes)
    finally:
        if extra:
            result["problems"] = [*result.get("problems", []), *extra]
            result["valid"] = False
        history.dump(history_path, seed=cfg.seed, run=run_id, config=asdict(cfg),
                     schedule=[asdict(f) for f in plan], checks=result,
                     node_dirs=[str(n.dir) for n in nodes])
    return result


def _play(cfg: FaultRun, plan: list[Fault], net: Net, nodes: list[FaultNode],
          history: hist.History, rng: random.Random, run_id: str) -> list[str]:
    """Workload and nemesis for ``duration_s``, then heal, converge and drain."""
    problems: list[str] = []
    clients = Clients(nodes, history, run_id, replicate=cfg.replicate,
                      rate_per_s=cfg.rate_per_s, seed=cfg.seed, workers=cfg.workers)
    nemesis = Nemesis(plan, net, nodes, history, rng)
    clients.start()
    nemesis.start()
    time.sleep(cfg.duration_s)
    nemesis.finish(cfg.stop_s + 60.0)  # a window may end with a restart
    clients.stop(cfg.stop_s)
    # Whatever the nemesis left: heal, resume, start what is down.
    net.heal()
    for n in nodes:
        n.resume()
        if not n.alive():
            problems.append(f"{n.name} was not running at the end (exit {n.proc and n.proc.poll()})")
            n.start()
    ok, views = _wait_converged(nodes, cfg.converge_s)
    if not ok:
        problems.append("nodes did not all see each other again after the heal:\n"
                        + "\n".join(views))
    expected = {op["v"] for op in history.ops
                if op["f"] == "enqueue" and op["type"] == "ok" and ":r2:" in op["v"]}
    clients.drain(expected, cfg.drain_quiet_s, cfg.drain_max_s)
    problems += clients.errors + nemesis.errors
    return problems


show_lost_max = 20  # lost values looked up with SHOW on every node, for the diagnosis


def _show_lost(nodes: list[FaultNode], history: hist.History,
               result: dict[str, Any]) -> dict[str, Any]:
    """What every node still knows of the first lost values (SHOW <job id>)."""
    lost = (result["r2"]["lost"] + result["r0"]["lost"])[:show_lost_max]
    ids = {op["v"]: op["id"] for op in history.ops
           if op["f"] == "enqueue" and op["type"] == "ok" and op["v"] in set(lost)}
    out: dict[str, Any] = {}
    for value, job_id in ids.items():
        seen: dict[str, Any] = {}
        for n in nodes:
            try:
                r = n.client(socket_timeout=5)
                try:
                    reply = r.execute_command("SHOW", job_id)
                finally:
                    r.close()
            except (redis.RedisError, OSError) as e:
                seen[n.name] = repr(e)
                continue
            if reply:
                fields = dict(zip(reply[::2], reply[1::2], strict=False))
                seen[n.name] = {k.decode(): v for k, v in fields.items() if k != b"body"}
        out[value] = {"id": job_id, "show": seen}
    return out


def _node_checks(nodes: list[FaultNode], cfg: FaultRun) -> list[str]:
    problems = []
    for n in nodes:
        if not n.alive():
            problems.append(f"{n.name} is not running after the drain")
    return problems


def _tracebacks(nodes: list[FaultNode]) -> list[str]:
    out = []
    for n in nodes:
        text = n.log_text()
        found = traceback_re.findall(text)
        if found:
            i = traceback_re.search(text)
            where = text[i.start():i.start() + 1500] if i else ""
            out.append(f"{n.name}: {len(found)} traceback(s) in its log; first:\n{where}")
    return out
