"""Behaviours where disque-mp used to differ from the reference Disque, each on
real node processes: CLUSTER RESET empties the node, the memory level follows
CONFIG SET and DEBUG FLUSHALL at once, delivery counters travel between nodes."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.nodeproc import NodeProc, node_cluster, wait_until
from tests.nodeproc import unique_queue as _q
from tests.rawclient import NULL_ARRAY, Err, RawClient, encode_command
from workers.ids import owner_of_queue

pytestmark = pytest.mark.integration

wait_s = 30.0
node_timeout_ms = 2000


def _r(node: NodeProc) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=node.port, protocol=2, socket_timeout=20)


@pytest.fixture
def three(tmp_path: Path) -> Iterator[list[NodeProc]]:
    with node_cluster(tmp_path, 3, workers=2, node_timeout_ms=node_timeout_ms) as nodes:
        yield nodes


def _info(node: NodeProc, section: str) -> dict[str, Any]:
    return dict(_r(node).info(section))


def _scan_all(r: redis.Redis, cmd: str) -> list[bytes]:
    cursor, found = b"0", []
    for _ in range(1000):  # bounded: a few calls are enough for a handful of items
        cursor, items = r.execute_command(cmd, cursor, "COUNT", 100)
        found += items
        if cursor in (b"0", 0):
            return found
    raise AssertionError(f"{cmd} never came back to cursor 0")


@pytest.mark.parametrize("mode", ["SOFT", "HARD"])
def test_cluster_reset_empties_the_node(three: list[NodeProc], mode: str) -> None:
    a = _r(three[0])
    queues = [_q("reset") for _ in range(6)]  # spread over both workers
    ids = [a.execute_command("ADDJOB", q, "body", 0, "REPLICATE", 2).decode() for q in queues]
    assert _info(three[0], "jobs")["registered_jobs"] >= len(ids)
    old_id = a.execute_command("CLUSTER", "MYID")
    blocked = [RawClient(three[0].port) for _ in range(3)]  # held by either worker
    for i, c in enumerate(blocked):
        c.send(encode_command("GETJOB", "TIMEOUT", 60_000, "FROM", _q(f"empty{i}"), _q("other")))
    wait_until(lambda: _info(three[0], "clients")["blocked_clients"] == 3, wait_s, "3 blocked")
    assert a.execute_command("CLUSTER", "RESET", mode) in (b"OK", "OK", True)
    for c in blocked:  # answered as on timeout, as the reference's flushServerData does
        assert c.read() is NULL_ARRAY
        c.close()
    wait_until(lambda: _info(three[0], "clients")["blocked_clients"] == 0, wait_s, "unblocked")
    assert _info(three[0], "jobs")["registered_jobs"] == 0
    left = _scan_all(a, "QSCAN")
    assert _info(three[0], "queues")["registered_queues"] == 0, [
        (q, a.execute_command("QSTAT", q)) for q in left]
    assert left == []
    assert _scan_all(a, "JSCAN") == []
    for job_id in ids:
        assert a.execute_command("SHOW", job_id) is None
    info = a.execute_command("CLUSTER", "INFO").decode()
    assert "cluster_known_nodes:1" in info, info
    assert (a.execute_command("CLUSTER", "MYID") != old_id) == (mode == "HARD")
    # The node keeps serving; the others still hold their copies.
    assert a.execute_command("ADDJOB", _q("after"), "x", 0, "REPLICATE", 1)
    # Each job on at least one of them (REPLICATE 2; on a loaded machine the 50 ms
    # replication step may have made a copy on both).
    held = [sum(1 for n in three[1:] if _r(n).execute_command("SHOW", job_id)) for job_id in ids]
    assert all(held), held


def test_memory_level_follows_config_set_and_flushall_at_once(three: list[NodeProc]) -> None:
    a = _r(three[0])
    a.execute_command("CONFIG", "SET", "maxmemory", "3145728")
    body = "x" * 5000
    queue = _q("mem")
    last: list[str] = []

    def a_keeps_no_copy() -> bool:
        job_id = a.execute_command("ADDJOB", queue, body, 5000, "REPLICATE", 2).decode()
        last[:] = [job_id]
        return a.execute_command("SHOW", job_id) is None

    # One job per 10 ms: the node samples its memory every 100 ms, so the level reaches 1
    # (75 %) well before the jobs added meanwhile could take it past maxmemory (OOM); a
    # tight loop on an idle machine went from level 0 to OOM between two samples.
    wait_until(a_keeps_no_copy, wait_s, "A replicating externally (memory level 1)", poll_s=0.01)
    a.execute_command("CONFIG", "SET", "maxmemory", "1073741824")
    for n in three:
        assert _r(n).execute_command("DEBUG", "FLUSHALL") in (b"OK", "OK", True)
    job_id = a.execute_command("ADDJOB", queue, body, 5000, "REPLICATE", 3).decode()
    assert a.execute_command("SHOW", job_id) is not None  # A holds a copy again
    assert _info(three[0], "memory")["memory_warning_level"] == 0


def _counters(entry: list[Any]) -> dict[str, Any]:
    rest = entry[3:]
    return {k.decode(): v for k, v in zip(rest[::2], rest[1::2], strict=True)}


def test_additional_deliveries_travel_between_nodes(three: list[NodeProc]) -> None:
    a = _r(three[0])
    queue = _q("deliv")
    job_id = a.execute_command("ADDJOB", queue, "body", 0, "REPLICATE", 3, "RETRY", 3).decode()
    [[_, got_id, _]] = a.execute_command("GETJOB", "NOHANG", "FROM", queue)
    assert got_id.decode() == job_id  # delivered once, never acked

    def queued_again_somewhere() -> bool:
        return any(_r(n).execute_command("QLEN", queue) for n in three)

    wait_until(queued_again_somewhere, wait_s, "a holder re-queueing the job after RETRY")
    entries = a.execute_command("GETJOB", "TIMEOUT", int(wait_s * 1000), "WITHCOUNTERS", "FROM", queue)
    assert entries, "the re-queued job was not delivered on A"
    [entry] = entries
    assert entry[1].decode() == job_id
    assert _counters(entry)["additional-deliveries"] > 0, entry


@pytest.fixture
def four(tmp_path: Path) -> Iterator[list[NodeProc]]:
    with node_cluster(tmp_path, 4, workers=2) as nodes:
        yield nodes


restart_rounds = 6
addjobs_after_restart = 40  # queues spread over both workers


def _connect_as_soon_as_possible(node: NodeProc) -> RawClient:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return RawClient(node.port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.002)


def test_restarted_node_accepts_replicated_addjob_as_soon_as_it_answers(four: list[NodeProc]) -> None:
    """The reference treats the peers it knows as reachable until failure detection
    says otherwise: ADDJOBs sent the moment a restarted node accepts a connection
    wait for their copies. A worker used to serve commands forwarded by another
    worker before its shard had the membership view: -NOREPL."""
    a = four[0]
    for round_no in range(restart_rounds):
        a.kill_group()
        wait_until(lambda: not a.group_pids(), wait_s, "the killed node's workers gone")
        a.start(wait=False)
        c = _connect_as_soon_as_possible(a)
        c.send(b"".join(encode_command("ADDJOB", _q(f"r{round_no}-{i}"), "myjob", 5000,
                                       "REPLICATE", 3, "RETRY", 5)
                        for i in range(addjobs_after_restart)))
        replies = [c.read() for _ in range(addjobs_after_restart)]
        errors = [r for r in replies if isinstance(r, Err)]
        assert not errors, (round_no, len(errors), errors[0])
        c.close()
        a.wait_ready()


def _ping_answers(node: NodeProc) -> bool:
    try:
        return bool(redis.Redis(host="127.0.0.1", port=node.port, protocol=2,
                                socket_timeout=2).ping())
    except (redis.RedisError, OSError):
        return False


workload_s = 6.0  # ADDJOB / GETJOB / ACKJOB right after formation, and again after a worker restart
retry_s = 2


def _workload(nodes: list[NodeProc], rng: Any, seconds: float, acked: dict[str, int],
              delivered: dict[str, int], queues: list[str]) -> None:
    rs = [_r(n) for n in nodes]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        rs[rng.randrange(len(rs))].execute_command("ADDJOB", rng.choice(queues), "x", 5000,
                                                   "REPLICATE", 3, "RETRY", retry_s)
        got = rs[rng.randrange(len(rs))].execute_command("GETJOB", "TIMEOUT", 100, "COUNT", 2,
                                                         "FROM", *queues)
        for _, job_id, _ in got or []:
            jid = job_id.decode()
            delivered[jid] = delivered.get(jid, 0) + 1
            if rs[rng.randrange(len(rs))].execute_command("ACKJOB", jid) is not None:
                acked[jid] = acked.get(jid, 0) + 1


def test_fault_free_run_delivers_every_acked_job_once(tmp_path: Path) -> None:
    import random

    rng = random.Random(4)
    queues = [_q("once") for _ in range(4)]  # on both workers
    acked: dict[str, int] = {}
    delivered: dict[str, int] = {}
    with node_cluster(tmp_path, 4, workers=2) as nodes:
        _workload(nodes, rng, workload_s, acked, delivered, queues)  # links still being set up
        victim = nodes[1]
        before = set(victim.worker_pids())
        os.kill(max(before), signal.SIGKILL)  # one worker: the supervisor restarts it
        wait_until(lambda: len(set(victim.worker_pids()) - before) == 1, wait_s,
                   "the killed worker restarted", detail=victim.output)
        wait_until(lambda: _ping_answers(victim), wait_s, "the node answering")
        acked_before_restart = set(acked)
        _workload(nodes, rng, workload_s, acked, delivered, queues)  # data links redialled
        time.sleep(retry_s * 3)  # any copy left behind is queued again by now
        for n in nodes:  # drain everything left, acking it
            r = _r(n)
            for _ in range(1000):
                got = r.execute_command("GETJOB", "NOHANG", "COUNT", 100, "FROM", *queues)
                if not got:
                    break
                for _, job_id, _ in got:
                    jid = job_id.decode()
                    delivered[jid] = delivered.get(jid, 0) + 1
                    r.execute_command("ACKJOB", jid)
        again = {j: delivered[j] for j in acked if delivered[j] > 1}
        # Jobs acked in the moment before the kill may have lost their SETACKs with the
        # worker (a fault); everything acked after the restart must be delivered once.
        assert not {j for j in again if j not in acked_before_restart}, again
        assert len(again) <= len(acked_before_restart) // 100 + 1, again
        assert len(acked) > 50


def _worker_pid(node: NodeProc, index: int) -> int:
    c = RawClient(node.port)
    text = c.call("INFO", "workers").decode()
    c.close()
    for line in text.split("\r\n"):
        if line.startswith(f"worker{index}:"):
            return int(line.split("pid=", 1)[1].split(",", 1)[0])
    raise AssertionError(f"no worker{index} in {text!r}")


def test_acks_right_after_a_worker_restart_reach_every_holder(three: list[NodeProc]) -> None:
    """ACKJOBs sent the moment a restarted worker serves again (it lost its copies:
    each is a dummy ACK, which tells every known node) must reach the other holders.
    A worker used to serve forwarded commands before it knew its peers: the dummy
    ACK had nobody to tell, and the holders queued the job again after RETRY."""
    a, b = three[0], three[1]
    queues = [q for q in (_q("ack1") for _ in range(200)) if owner_of_queue(q.encode(), 2) == 1][:6]
    ids = []
    for q in queues:
        for _ in range(5):
            _r(a).execute_command("ADDJOB", q, "x", 0, "REPLICATE", 3, "RETRY", 60)
        ids += [e[1].decode() for e in _r(a).execute_command("GETJOB", "COUNT", 5, "FROM", q)]
    assert len(ids) == 30
    victim = _worker_pid(b, 1)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: victim not in b.worker_pids(), wait_s, "the killed worker gone")
    pending = list(ids)
    deadline = time.monotonic() + wait_s
    while pending and time.monotonic() < deadline:  # an error while worker 1 is down
        try:
            c = RawClient(b.port)
            c.send(b"".join(encode_command("ACKJOB", j) for j in pending))
            replies = [c.read() for _ in pending]
            c.close()
        except OSError:  # the connection landed on the worker as it restarted
            continue
        pending = [j for j, r in zip(pending, replies, strict=True) if isinstance(r, Err)]
    assert not pending

    def all_acked_on_a() -> bool:
        for job_id in ids:
            show = _r(a).execute_command("SHOW", job_id)
            if show is not None and dict(zip(show[::2], show[1::2], strict=True))[b"state"] != b"acked":
                return False
        return True

    wait_until(all_acked_on_a, wait_s, "every holder learning of the ACKs")
