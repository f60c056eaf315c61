"""disque_mp.client.core without a server: reply parsing (on reply shapes taken from a
disque-mp node through redis-py in RESP2), argument building, error mapping, the
failover decision, and Topology's node choice."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from redis._parsers.base import BaseParser

from disque_mp.client import core
from disque_mp.client.core import (
    DEFAULT_NODE,
    ClientSettings,
    DisqueConnectionError,
    DisqueError,
    Hello,
    Job,
    NodeInfo,
    Topology,
    addjob_args,
    chunks_by_size,
    consume_batch,
    consume_done,
    getjob_args,
    job_ids_of,
    jscan_args,
    parse_address,
    parse_hello,
    parse_info,
    parse_jobs,
    parse_nodes,
    parse_pairs,
    parse_scan,
    qscan_args,
)

CORE = Path(core.__file__)

NODE_A = "fdcf7c55d3a7dc30154a0756ce1aa81578dfedf7"
NODE_B = "474beb0174a0e471b55506706b5677f12b7e1ac7"
NODE_C = "9b0e4c1d" + "0" * 32
JOB_ID = "D-fdcf7c55-EC5H013msqbh3OMjSlUAF0X/-000b"
JOB_ID_B = "D-474beb01-EC4GpLpjmS0olQn+ZtIlGnas-05a1"

# Replies as redis.Redis(protocol=2) returned them from a one-worker disque-mp node.
HELLO_ONE = [1, NODE_A.encode(), [NODE_A.encode(), b"127.0.0.1", b"13802", b"1"]]
QPEEK = [[b"cq", JOB_ID.encode(), b"bo\x00dy"]]
GETJOB_WITHCOUNTERS = [[b"cq", JOB_ID.encode(), b"bo\x00dy", b"nacks", 0,
                        b"additional-deliveries", 0]]
SHOW = [b"id", JOB_ID.encode(), b"queue", b"cq", b"state", b"queued", b"repl", 1,
        b"ttl", 600, b"ctime", 1795618441199000000, b"delay", 0, b"retry", 30,
        b"nacks", 0, b"additional-deliveries", 0, b"nodes-delivered", [NODE_A.encode()],
        b"nodes-confirmed", [], b"next-requeue-within", 30094,
        b"next-awake-within", 29594, b"body", b"bo\x00dy"]
QSTAT = [b"name", b"cq", b"len", 1, b"age", 0, b"idle", 0, b"blocked", 0,
         b"import-from", [], b"import-rate", 0, b"jobs-in", 1, b"jobs-out", 0,
         b"pause", b"none"]
QSCAN_LAST = [b"0", [b"cq"]]
JSCAN_MORE = [b"1600", []]
JSCAN_ALL = [b"0", [[b"id", JOB_ID_B.encode(), b"queue", b"cq", b"state", b"queued",
                     b"repl", 1, b"ttl", 86400, b"nodes-delivered", [NODE_B.encode()],
                     b"nodes-confirmed", [], b"body", b"body"]]]
INFO_JOBS = b"# Jobs\r\nregistered_jobs:1\r\n"


# ----------------------------------------------------------------------------- the core is pure


def test_core_loads_without_asyncio_threading_sockets_or_redis() -> None:
    """Loaded alone (not through the package, whose __init__ brings the sync client)."""
    probe = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('client_core', {str(CORE)!r})\n"
        "mod = importlib.util.module_from_spec(spec)\n"
        "sys.modules['client_core'] = mod\n"
        "spec.loader.exec_module(mod)\n"
        "assert mod.parse_address('h:1') == ('h', 1)\n"
        "print(' '.join(m for m in ('asyncio', 'threading', 'socket', 'selectors', 'ssl',"
        " 'redis') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == ""


# ----------------------------------------------------------------------------- parsing


def test_parse_hello_of_a_node() -> None:
    hello = parse_hello(HELLO_ONE, "127.0.0.1", 13802)
    assert hello == Hello(1, NODE_A, (NodeInfo(NODE_A, "127.0.0.1", 13802, 1),))
    assert hello.nodes[0].address == "127.0.0.1:13802"


def test_parse_hello_cluster_and_the_reference_standalone_shape() -> None:
    reply = [1, NODE_A.encode(),
             [NODE_A.encode(), b"", b"7711", b"1"],        # a standalone reference node: no IP
             [NODE_B.encode(), b"10.0.0.2", b"7712", b"100"],  # leaving
             [NODE_C.encode(), b"", b"", b"1"]]           # another node without an address
    hello = parse_hello(reply, "192.0.2.7", 7000)
    assert hello.node_id == NODE_A
    assert hello.nodes == (NodeInfo(NODE_A, "192.0.2.7", 7000, 1),
                           NodeInfo(NODE_B, "10.0.0.2", 7712, 100))


def test_parse_jobs_without_and_with_counters() -> None:
    [peeked] = parse_jobs(QPEEK)
    assert peeked == Job("cq", JOB_ID, b"bo\x00dy", None, None)
    [got] = parse_jobs(GETJOB_WITHCOUNTERS)
    assert got == Job("cq", JOB_ID, b"bo\x00dy", 0, 0)
    assert isinstance(got.body, bytes)
    assert got.producer_prefix == "fdcf7c55" == NODE_A[:8]
    [redelivered] = parse_jobs([[b"q", JOB_ID.encode(), b"x", b"nacks", 3,
                                 b"additional-deliveries", 2]])
    assert (redelivered.nacks, redelivered.additional_deliveries) == (3, 2)


def test_parse_jobs_of_a_timeout_or_nohang_is_empty() -> None:
    assert parse_jobs(None) == []
    assert parse_jobs([]) == []


def test_parse_pairs_show_keeps_the_body_bytes() -> None:
    show = parse_pairs(SHOW)
    assert show is not None
    assert show["id"] == JOB_ID and show["queue"] == "cq" and show["state"] == "queued"
    assert show["ttl"] == 600 and show["retry"] == 30 and show["nacks"] == 0
    assert show["nodes-delivered"] == [NODE_A] and show["nodes-confirmed"] == []
    assert show["body"] == b"bo\x00dy"
    assert parse_pairs(None) is None


def test_parse_pairs_qstat_and_a_resp3_map() -> None:
    qstat = parse_pairs(QSTAT)
    assert qstat == {"name": "cq", "len": 1, "age": 0, "idle": 0, "blocked": 0,
                     "import-from": [], "import-rate": 0, "jobs-in": 1, "jobs-out": 0,
                     "pause": "none"}
    resp3 = {b"name": b"cq", b"len": 1, b"import-from": [b"n1"]}
    assert parse_pairs(resp3) == {"name": "cq", "len": 1, "import-from": ["n1"]}


def test_parse_scan_replies() -> None:
    assert parse_scan(QSCAN_LAST) == (0, [b"cq"])
    assert parse_scan(JSCAN_MORE) == (1600, [])
    assert parse_scan([b"5", None]) == (5, [])
    cursor, items = parse_scan(JSCAN_ALL)
    assert cursor == 0
    job = parse_pairs(items[0])
    assert job is not None
    assert job["id"] == JOB_ID_B and job["nodes-delivered"] == [NODE_B] and job["body"] == b"body"


def test_parse_info_keeps_the_text_after_the_first_colon() -> None:
    assert parse_info(INFO_JOBS) == {"registered_jobs": "1"}
    text = "# Server\r\nexecutable:/usr/bin/x\r\nconfig_file:C:\\d.conf\r\n\r\nno colon\r\n"
    assert parse_info(text) == {"executable": "/usr/bin/x", "config_file": "C:\\d.conf"}


def test_node_addresses() -> None:
    assert parse_address("127.0.0.1:7711") == ("127.0.0.1", 7711)
    assert parse_address(" 10.0.0.1:7712 ") == ("10.0.0.1", 7712)
    assert parse_address("[::1]:7711") == ("::1", 7711)
    assert parse_address(("h", "7711")) == ("h", 7711)  # type: ignore[arg-type]
    for bad in ("7711", "host:", ":7711", "host:0", "host:65536", "host:77x"):
        with pytest.raises(ValueError, match="host:port"):
            parse_address(bad)
    assert parse_nodes(None) == [parse_address(DEFAULT_NODE)]
    assert parse_nodes("a:1, b:2,") == [("a", 1), ("b", 2)]
    assert parse_nodes(["a:1", ("b", 2)]) == [("a", 1), ("b", 2)]
    with pytest.raises(ValueError, match="no node address"):
        parse_nodes([])


# ----------------------------------------------------------------------------- arguments


def test_addjob_args() -> None:
    assert addjob_args("q", b"x") == ["ADDJOB", "q", b"x", 0]
    assert addjob_args("q", "x", 1500, replicate=2, delay=1, retry=30, ttl=600, maxlen=10,
                       async_=True) == [
        "ADDJOB", "q", "x", 1500, "REPLICATE", 2, "DELAY", 1, "RETRY", 30, "TTL", 600,
        "MAXLEN", 10, "ASYNC"]
    assert addjob_args("q", b"x", retry=0) == ["ADDJOB", "q", b"x", 0, "RETRY", 0]
    assert addjob_args("q", b"x", maxdeliver=3, replicate=None) == [
        "ADDJOB", "q", b"x", 0, "MAXDELIVER", 3]
    with pytest.raises(TypeError, match="retries"):
        addjob_args("q", b"x", retries=3)  # type: ignore[call-arg]


def test_getjob_args() -> None:
    assert getjob_args("q") == ["GETJOB", "FROM", "q"]
    assert getjob_args(["a", b"b"], timeout_ms=1000, count=5, nohang=True,
                       withcounters=True) == [
        "GETJOB", "NOHANG", "TIMEOUT", 1000, "COUNT", 5, "WITHCOUNTERS", "FROM", "a", b"b"]
    assert getjob_args(q for q in ("a", "b"))[-3:] == ["FROM", "a", "b"]
    assert getjob_args("q", timeout_ms=None, count=None) == ["GETJOB", "FROM", "q"]
    with pytest.raises(TypeError, match="GETJOB option.*timeout\\b"):
        getjob_args("q", timeout=5)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="at least one queue"):
        getjob_args([])


def test_scan_args() -> None:
    assert qscan_args(0, None, None, None, None) == ["QSCAN", 0]
    assert qscan_args(7, 100, 1, 50, 2) == [
        "QSCAN", 7, "COUNT", 100, "MINLEN", 1, "MAXLEN", 50, "IMPORTRATE", 2]
    assert jscan_args(0, None, None, [], False) == ["JSCAN", 0, "REPLY", "id"]
    assert jscan_args(3, 10, "q", ["queued", "active"], True) == [
        "JSCAN", 3, "COUNT", 10, "QUEUE", "q", "STATE", "queued", "STATE", "active",
        "REPLY", "all"]


def test_ids_accept_ids_jobs_and_one_iterable() -> None:
    job = Job("q", JOB_ID_B, b"")
    assert job_ids_of((JOB_ID, job)) == [JOB_ID, JOB_ID_B]
    assert job_ids_of(([JOB_ID, job],)) == [JOB_ID, JOB_ID_B]
    assert job_ids_of((JOB_ID.encode(),)) == [JOB_ID]  # type: ignore[arg-type]
    assert job_ids_of(((j for j in [job]),)) == [JOB_ID_B]


def test_pipelines_split_by_size_in_order() -> None:
    commands: list[list[Any]] = [["ACKJOB", "x" * 100] for _ in range(10)]  # ~16+6 + 16+100 bytes each
    chunks = list(chunks_by_size(commands, 300))
    assert [len(c) for c in chunks] == [2, 2, 2, 2, 2]
    assert [cmd for c in chunks for cmd in c] == commands
    big: list[list[Any]] = [["ADDJOB", "q", "x" * 1000, 0]]
    assert list(chunks_by_size(big + commands[:1], 300)) == [big, commands[:1]]  # alone
    assert list(chunks_by_size([], 300)) == []
    assert list(chunks_by_size(commands, 1 << 20)) == [commands]


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(("text", "cls"), [
    ("ERR unknown command 'FOO'", core.CommandError),
    ("NOREPL Not enough reachable nodes for the requested replication level", core.NoReplicationError),
    ("PAUSED Queue paused in input, try later", core.PausedError),
    ("LEAVING This node is leaving the cluster", core.LeavingError),
    ("NOJOB Job not known in the context of this node.", core.NoJobError),
    ("BADID Invalid Job ID format.", core.BadIdError),
    ("TOOLATE Half of job TTL already elapsed, you are no longer allowed to postpone",
     core.TooLateError),
    ("OOM command not allowed when used memory > 'maxmemory'.", core.OutOfMemoryError),
    ("WEIRD something new", DisqueError),
])
def test_error_from_reply(text: str, cls: type[DisqueError]) -> None:
    err = core.error_from_reply(text)
    assert type(err) is cls
    assert err.code == text.split(" ", 1)[0]
    assert str(err) == text


def test_error_classes_are_found_by_the_code_in_their_header() -> None:
    class AppPaused(core.PausedError):  # a user's subclass: PAUSED replies stay PausedError
        pass

    assert AppPaused("x").code == "PAUSED"
    assert type(core.error_from_reply("PAUSED Queue paused")) is core.PausedError
    assert core.DisqueConnectionError("x").code == "CONNECTION"
    # a client-side failure, not a reply code: a CONNECTION reply is a plain DisqueError
    assert type(core.error_from_reply("CONNECTION x")) is DisqueError


def test_map_redis_error_puts_back_the_code_redis_py_strips() -> None:
    # redis-py's own parser, as it turns the error lines a node sent into exceptions
    stripped = BaseParser.parse_error("ERR wrong number of arguments for 'addjob' command")
    assert isinstance(stripped, redis.ResponseError) and stripped.status_code == "ERR"
    err = core.map_redis_error(stripped)
    assert type(err) is core.CommandError
    assert str(err) == "ERR wrong number of arguments for 'addjob' command"
    oom = core.map_redis_error(BaseParser.parse_error(
        "OOM command not allowed when used memory > 'maxmemory'."))
    assert type(oom) is core.OutOfMemoryError and str(oom).startswith("OOM command not allowed")
    kept = BaseParser.parse_error("NOJOB Job not known in the context of this node.")
    assert getattr(kept, "status_code", None) is None  # redis-py leaves Disque's codes
    assert type(core.map_redis_error(kept)) is core.NoJobError


def test_is_leaving() -> None:
    assert core.is_leaving(core.error_from_reply("LEAVING This node is leaving the cluster"))
    assert core.is_leaving(core.error_from_reply(
        "NOREPL Timeout reached before replicating to the requested number of nodes, "
        "unable to hold a copy of the message for the following reason: "
        "I'm leaving the cluster"))
    assert not core.is_leaving(core.error_from_reply("NOREPL Not enough reachable nodes"))
    assert not core.is_leaving(core.error_from_reply("PAUSED Queue paused in input, try later"))


# ----------------------------------------------------------------------------- settings


class _Settings(ClientSettings):
    def _init_io(self) -> None:
        self.io_ready = True


def _hello(*nodes: tuple[str, str, int, int], me: str | None = None) -> Hello:
    infos = tuple(NodeInfo(*n) for n in nodes)
    return Hello(1, me or infos[0].id, infos)


def test_settings_leave_the_io_to_the_client() -> None:
    with pytest.raises(NotImplementedError):
        ClientSettings()
    s = _Settings("h:1", socket_timeout=3.0, connect_timeout=0.5, password="pw",
                  redis_kwargs={"ssl": True})
    assert s.io_ready
    assert s._redis_options("10.0.0.1", 7711) == {
        "host": "10.0.0.1", "port": 7711, "protocol": 2, "driver_info": None,
        "password": "pw", "socket_timeout": 3.0, "socket_connect_timeout": 0.5, "ssl": True}
    assert s.node_id is None and s.address is None
    s.topology.learn(_hello((NODE_A, "10.0.0.1", 7711, 1)), ("10.0.0.1", 7711))
    assert s.node_id == NODE_A and s.address == ("10.0.0.1", 7711)


def test_failover_budget_is_the_nodes_known() -> None:
    s = _Settings(["a:1", "b:2"])
    assert s._attempts() == 2
    s.topology.learn(_hello((NODE_A, "a", 1, 1), (NODE_B, "b", 2, 1), (NODE_C, "c", 3, 1)),
                     ("a", 1))
    assert s._attempts() == 3
    assert _Settings("a:1", failover_attempts=0)._attempts() == 0


def test_leaving_and_dropped_connections_retry_within_budget() -> None:
    s = _Settings(["a:1", "b:2"])
    leaving = core.error_from_reply("LEAVING This node is leaving the cluster")
    dropped = redis.ConnectionError("Connection closed by server.")
    for attempt in (0, 1):
        s._raise_unless_retrying(leaving, attempt, "ADDJOB")  # returns: try another node
        s._raise_unless_retrying(dropped, attempt, "ADDJOB")
    with pytest.raises(core.LeavingError) as leaving_info:
        s._raise_unless_retrying(leaving, 2, "ADDJOB")
    assert leaving_info.value is leaving and leaving_info.value.__suppress_context__
    with pytest.raises(core.DisqueConnectionError, match="ADDJOB failed: Connection closed") as info:
        s._raise_unless_retrying(dropped, 2, "ADDJOB")
    assert info.value.__cause__ is dropped


def test_other_error_replies_raise_at_once() -> None:
    s = _Settings(["a:1", "b:2"])
    paused = core.error_from_reply("PAUSED Queue paused in input, try later")
    with pytest.raises(core.PausedError):
        s._raise_unless_retrying(paused, 0, "ADDJOB")
    sticky = _Settings(["a:1", "b:2"], failover_attempts=0)
    with pytest.raises(core.LeavingError):
        sticky._raise_unless_retrying(core.error_from_reply("LEAVING bye"), 0, "GETJOB")


def test_consume_loop_decisions() -> None:
    class Flag:
        def __init__(self, value: bool) -> None:
            self.value = value

        def is_set(self) -> bool:
            return self.value

    assert not consume_done(None, 10**6, None)
    assert consume_done(3, 3, None) and not consume_done(3, 2, None)
    assert consume_done(None, 0, Flag(True)) and not consume_done(5, 0, Flag(False))
    assert consume_batch(10, None, 7) == 10
    assert consume_batch(10, 12, 7) == 5
    assert consume_batch(2, 12, 7) == 2


# ----------------------------------------------------------------------------- topology

A, B, C = ("10.0.0.1", 7711), ("10.0.0.2", 7711), ("10.0.0.3", 7711)


def _three(pa: int, pb: int, pc: int, me: str = NODE_A) -> Hello:
    return _hello((NODE_A, *A, pa), (NODE_B, *B, pb), (NODE_C, *C, pc), me=me)


def _jobs(prefix: str, n: int) -> list[Job]:
    return [Job("q", f"D-{prefix[:8]}-{'x' * 24}-05a1", b"") for _ in range(n)]


def test_candidates_before_hello_are_the_seeds_shuffled() -> None:
    seeds = [A, B, C]
    orders = {tuple(Topology(list(seeds), rng=random.Random(i)).candidates()) for i in range(40)}
    assert all(sorted(o) == sorted(seeds) for o in orders)
    assert len(orders) > 1


def test_candidates_by_priority_ties_shuffled_then_unknown_seeds() -> None:
    extra = ("10.0.0.9", 7711)
    firsts = set()
    for i in range(40):
        topo = Topology([A, extra], rng=random.Random(i))
        topo.learn(_three(100, 1, 1), A)
        order = topo.candidates()
        assert set(order[:2]) == {B, C} and order[2:] == [A, extra]
        firsts.add(order[0])
    assert firsts == {B, C}


def test_candidates_put_the_avoided_node_last() -> None:
    topo = Topology([A], rng=random.Random(1))
    topo.learn(_three(1, 2, 3), A)
    assert topo.candidates() == [A, B, C]
    assert topo.candidates(avoid=A) == [B, C, A]
    lone = Topology([A], rng=random.Random(1))
    assert lone.candidates(avoid=A) == [A]


def test_learn_resets_the_producer_sample() -> None:
    topo = Topology([A], prefer_producer=True, rng=random.Random(1))
    topo.learn(_three(1, 1, 1), A)
    assert topo.note_jobs(_jobs(NODE_B, 10)) is None
    assert topo.received == 10 and topo.produced[NODE_B[:8]] == 10
    topo.learn(_three(1, 1, 1, me=NODE_B), B)
    assert topo.hello is not None and topo.hello.node_id == NODE_B and topo.current == B
    assert topo.received == 0 and not topo.produced


def test_producer_to_follow_and_trying_only() -> None:
    topo = Topology([A], prefer_producer=True, rng=random.Random(1))
    topo.learn(_three(1, 1, 1), A)
    assert topo.producer_to_follow(_jobs(NODE_A, core.producer_sample_jobs)) is None  # on it
    target = topo.producer_to_follow(_jobs(NODE_C, core.producer_sample_jobs))
    assert target == C
    hello = topo.hello
    with topo.trying_only(C):
        assert topo.seeds == [C] and topo.hello is None and topo.candidates() == [C]
        raise DisqueConnectionError("C unreachable")  # swallowed: the client stays
    assert topo.seeds == [A] and topo.hello is hello
    with pytest.raises(ValueError), topo.trying_only(C):
        raise ValueError("not a connection failure")  # not swallowed
    assert topo.seeds == [A]


def test_better_nodes() -> None:
    topo = Topology([A], rng=random.Random(3))
    assert topo.better_nodes() == []
    topo.learn(_three(100, 1, 5), A)  # we are on a leaving node
    assert topo.better_nodes() == [B, C]
    topo.learn(_three(1, 1, 5), A)
    assert topo.better_nodes() == []
    topo.learn(_hello((NODE_B, *B, 1), me=NODE_A), A)  # HELLO without ourselves
    assert topo.better_nodes() == []


def test_note_jobs_follows_a_majority_producer_after_the_sample() -> None:
    topo = Topology([A], prefer_producer=True, rng=random.Random(1))
    topo.learn(_three(1, 1, 1), A)
    assert topo.note_jobs(_jobs(NODE_C, core.producer_sample_jobs - 1)) is None
    assert topo.note_jobs(_jobs(NODE_C, 1)) == C
    assert topo.received == 0 and not topo.produced  # a new sample starts


def test_note_jobs_stays_for_own_jobs_a_minority_or_a_worse_node() -> None:
    n = core.producer_sample_jobs
    off = Topology([A], prefer_producer=False)
    off.learn(_three(1, 1, 1), A)
    assert off.note_jobs(_jobs(NODE_C, n)) is None and off.received == 0
    topo = Topology([A], prefer_producer=True, rng=random.Random(1))
    assert topo.note_jobs(_jobs(NODE_C, n)) is None and topo.received == 0  # no HELLO yet
    topo.learn(_three(1, 1, 1), A)
    assert topo.note_jobs(_jobs(NODE_A, n)) is None  # already on the producer
    mixed = _jobs(NODE_B, n // 2 - 1) + _jobs(NODE_C, n // 2 - 1) + _jobs(NODE_A, 2)
    assert topo.note_jobs(mixed) is None  # no node produced half
    topo.learn(_three(1, 1, 100), A)  # the producer is leaving
    assert topo.note_jobs(_jobs(NODE_C, n)) is None


def test_the_sample_size_is_read_from_the_core_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core, "producer_sample_jobs", 4)
    topo = Topology([A], prefer_producer=True, rng=random.Random(1))
    topo.learn(_three(1, 1, 1), A)
    assert topo.note_jobs(_jobs(NODE_B, 3)) is None
    assert topo.note_jobs(_jobs(NODE_B, 1)) == B


# ----------------------------------------------------------------------------- worker ports


def _id_of_slot(slot: int) -> str:
    """A valid job ID carrying ``slot`` (the node's layout: workers.ids)."""
    import base64

    mid = base64.b64encode(slot.to_bytes(2, "big") + bytes(16)).decode()
    return f"D-fdcf7c55-{mid}-000b"


def test_parse_worker_layout() -> None:
    info = parse_info(b"# Workers\r\nworkers:2\r\nconnection_worker:1\r\n"
                      b"worker_ports:7800,7801\r\nworker0:pid=1,clients=0\r\n")
    assert core.parse_worker_layout(info) == core.WorkerLayout(2, (7800, 7801))
    for bad in ({"workers": "2", "worker_ports": ""},          # off
                {"workers": "2"},                              # an older node
                {},                                            # the reference Disque
                {"workers": "3", "worker_ports": "7800,7801"},  # not one per worker
                {"workers": "2", "worker_ports": "7800,x"},
                {"workers": "1", "worker_ports": "70000"}):
        assert core.parse_worker_layout(bad) is None


def test_owner_of_command_follows_the_nodes_slot_rule() -> None:
    from workers.ids import owner_of_job_id, owner_of_queue

    for q in ("a", "b", "emails", "q-17", "ü"):
        want = owner_of_queue(q.encode(), 4)
        assert core.owner_of_command(addjob_args(q, b"x", 0, retry=5), 4) == want
        assert core.owner_of_command(addjob_args(q.encode(), b"x"), 4) == want
        assert core.owner_of_command(getjob_args(q), 4) == want
        assert core.owner_of_command(getjob_args([q], timeout_ms=10, count=3, nohang=True,
                                                 withcounters=True), 4) == want
    ids = [_id_of_slot(s) for s in (1, 5, 9, 2)]  # owners with 4 workers: 1, 1, 1, 2
    assert [owner_of_job_id(i, 4) for i in ids] == [1, 1, 1, 2]
    for name in ("ACKJOB", "FASTACK", "NACK", "WORKING", "SHOW", "ackjob", "DELJOB"):
        assert core.owner_of_command([name, ids[0]], 4) == 1
    assert core.owner_of_command(["ACKJOB", *ids[:3]], 4) == 1
    assert core.owner_of_command(["FASTACK", *[i.encode() for i in ids[:3]]], 4) == 1


def test_owner_of_command_leaves_the_rest_to_the_main_connection() -> None:
    ids = [_id_of_slot(1), _id_of_slot(2)]
    for args in (["ACKJOB", *ids],                       # spread over two workers
                 ["ACKJOB", ids[0], "not-an-id"],        # the node answers -BADID
                 ["ACKJOB"],
                 getjob_args(["a", "b"]),                # two queues: the node coordinates
                 ["GETJOB", "FROM"], ["GETJOB", "BOGUS", "FROM", "a"],
                 ["ADDJOB", "q"],                        # wrong arity: the node answers
                 ["QLEN", "q"], ["INFO"], ["HELLO"], []):
        assert core.owner_of_command(args, 2) is None, args
    assert core.owner_of_command(["ADDJOB", "q", "x", 0], 0) is None
    assert core.owner_of_command(["ADDJOB", "q", "x", 0], 1) == 0


def test_worker_routes_split_and_rest_a_failed_port(monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.ids import owner_of_queue

    routes = core.WorkerRoutes("127.0.0.1", core.WorkerLayout(2, (7800, 7801)))
    queues = [f"q{i}" for i in range(40)]
    cmds: list[list[Any]] = [addjob_args(q, b"x") for q in queues] + [["QLEN", "q0"]]
    groups = routes.split(cmds, now=100.0)
    assert groups[None] == [40]
    for k in (0, 1):
        assert groups[k] == [i for i, q in enumerate(queues) if owner_of_queue(q.encode(), 2) == k]
    assert routes.port_of(1) == 7801
    monkeypatch.setattr(core, "worker_port_retry_s", 5.0)
    routes.mark_down(1, now=100.0)
    one = next(q for q in queues if owner_of_queue(q.encode(), 2) == 1)
    assert routes.route(addjob_args(one, b"x"), now=104.9) is None  # resting: main port
    assert routes.route(addjob_args(one, b"x"), now=105.0) == 1     # tried again
    assert set(routes.split(cmds, now=101.0)) == {0, None}


def test_route_to_owner_is_off_by_default() -> None:
    class Settings(ClientSettings):
        def _init_io(self) -> None:
            pass

    assert Settings()._route_to_owner is False and Settings().routes is None
    assert Settings(route_to_owner=True)._route_to_owner is True


def test_worker_conn_is_made_once_and_dropped_after_a_move() -> None:
    made: list[tuple[str, int]] = []

    class Settings(ClientSettings[tuple[str, int]]):
        def _init_io(self) -> None:
            pass

        def _make_redis(self, host: str, port: int) -> tuple[str, int]:
            made.append((host, port))
            return (host, port)

    s = Settings(route_to_owner=True)
    assert s._workers == {} and s._redis is None  # the base holds both, the twin the lock
    routes = s.routes = core.WorkerRoutes("127.0.0.1", core.WorkerLayout(2, (7800, 7801)))
    assert s._worker_conn(routes, 1) == ("127.0.0.1", 7801)
    assert s._worker_conn(routes, 1) == ("127.0.0.1", 7801) and made == [("127.0.0.1", 7801)]
    s.routes = None  # moved to another node: the old routes' connections are not used
    with pytest.raises(ConnectionError, match="the node changed"):
        s._worker_conn(routes, 0)
