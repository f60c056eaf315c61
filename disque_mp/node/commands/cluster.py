"""CLUSTER subcommands and HELLO's node list (front-end side of the cluster).

The front end calls:

    agent = make_agent(cfg, index, node_id, workers, on_message, on_view)  # every worker
    await agent.start() ... await agent.close()
    cluster(agent, args, done)   # args = the words after CLUSTER; done(reply) maybe later
    hello(agent) -> reply        # HELLO with no argument, from the latest membership view
    agent.send(node_id, kind, slot, meta, bodies)   # a shard's Send effect

CLUSTER runs on worker 0, which owns membership (``bus/agent.py`` carries
it there from other workers). Error texts are the reference's (tests/reference/03) or,
where it has none, Redis Cluster's, which Disque's cluster.c shares.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bus import membership as mb
from bus.agent import ClusterAgent, Done, OnMessage, OnView
from bus.hostbus import ClusterBus, Later
from disque_mp.node import tls
from disque_mp.node.errors import ERR_CLUSTER, ERR_SYNTAX
from workers.replies import OK, Error, Status


def make_agent(cfg: Any, index: int, node_id: str, workers: int, on_message: OnMessage,
               on_view: OnView | None = None,
               on_batch: Callable[[bool], None] | None = None) -> ClusterAgent:
    agent = ClusterAgent(cfg, index, node_id, workers, on_message, execute, on_view, on_batch)
    if getattr(cfg, "tls_cluster", False):
        agent.tls = tls.bus_contexts(cfg)  # TlsConfigError stops the worker with the reason
    ip = cfg.bind.split()[0] if cfg.bind.split() else ""
    agent.view["nodes"] = [[node_id, ip, cfg.port, ["myself"], 0, 0, True]]
    return agent


def cluster(agent: ClusterAgent, args: list[bytes], done: Done) -> None:
    """CLUSTER <subcommand> ...: checked here, run on worker 0."""
    if not args:
        done(ERR_CLUSTER)
        return
    agent.command(args, done)


def hello(agent: ClusterAgent) -> list[Any]:
    return mb.hello_reply(agent.view)


def execute(bus: ClusterBus, args: list[bytes]) -> Any:
    """Run one CLUSTER subcommand against the bus (worker 0 only)."""
    sub = args[0].lower() if args else b""
    handler = _HANDLERS.get((sub, len(args)))
    if handler is None:
        return ERR_CLUSTER
    return handler(bus, args[1:])


def _meet(bus: ClusterBus, args: list[bytes]) -> Any:
    ip_raw, port_raw = args
    ip = ip_raw.decode("utf-8", "replace")
    port_text = port_raw.decode("utf-8", "replace")
    try:
        port = int(port_text)
    except ValueError:
        return Error(f"ERR Invalid TCP port specified: {port_text}")
    if not mb.valid_ip(ip) or not 0 < port <= mb.client_port_max:
        return Error(f"ERR Invalid node address specified: {ip}:{port_text}")
    bus.meet(ip, port)
    return OK


def _nodes(bus: ClusterBus, args: list[bytes]) -> Any:
    return mb.nodes_text(bus.view()).encode()


def _info(bus: ClusterBus, args: list[bytes]) -> Any:
    return mb.info_text(bus.view()).encode()


def _myid(bus: ClusterBus, args: list[bytes]) -> Any:
    return bus.my_id.encode()


def _forget(bus: ClusterBus, args: list[bytes]) -> Any:
    err = bus.forget(args[0].decode("utf-8", "replace"))
    return OK if err is None else Error(f"ERR {err}")


def _reset(bus: ClusterBus, args: list[bytes]) -> Any:
    mode = args[0].lower() if args else b"soft"
    if mode not in (b"hard", b"soft"):
        return ERR_SYNTAX
    bus.reset(hard=mode == b"hard")
    return OK


def _leaving(bus: ClusterBus, args: list[bytes]) -> Any:
    if not args:
        return Status("yes" if bus.m.myself.leaving else "no")
    value = args[0].lower()
    if value not in (b"yes", b"no"):
        return ERR_SYNTAX
    answer = Later()  # once every worker of every linked peer knows (bus/hostbus.py)
    bus.set_leaving(value == b"yes").then(lambda _: answer.resolve(OK))
    return answer


_HANDLERS = {
    (b"meet", 3): _meet,
    (b"nodes", 1): _nodes,
    (b"info", 1): _info,
    (b"myid", 1): _myid,
    (b"forget", 2): _forget,
    (b"reset", 1): _reset,
    (b"reset", 2): _reset,
    (b"leaving", 1): _leaving,
    (b"leaving", 2): _leaving,
}
