"""SCHEDULE on real nodes: one node with its AOF (firings, restart, a missed time
fired once), three nodes joined with CLUSTER MEET (known everywhere, one job per
fire time, a killed firer replaced, a joining node learning the schedules), and
bad input refused with nothing changed. Spoken to with redis-py and the
project's client."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from disque_mp.client import Disque
from disque_mp.client.core import CommandError
from tests.nodeproc import NodeProc, queue_job_ids, running_cluster, wait_until
from tests.nodeproc import unique_queue as _q

pytestmark = pytest.mark.integration

wait_s = 60.0
CONF = {"appendonly": "yes", "schedules-max": 4, "schedule-body-bytes-max": 1024,
        "schedule-takeover-ms": 1000, "cluster-node-timeout": 2000}


def _r(node: NodeProc) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=node.port, protocol=2, socket_timeout=20)


def _names(node: NodeProc) -> list[bytes]:
    with _r(node) as r:
        return list(r.execute_command("SCHEDULE", "LIST"))


def _show(node: NodeProc, name: str) -> dict[str, Any]:
    with _r(node) as r:
        reply = r.execute_command("SCHEDULE", "SHOW", name)
    return {k.decode(): v for k, v in zip(reply[::2], reply[1::2], strict=True)}


def _err(node: NodeProc, *args: Any) -> str:
    with _r(node) as r, pytest.raises(redis.ResponseError) as exc:
        r.execute_command(*args)
    return str(exc.value)


def _jobs_by_fire_time(nodes: list[NodeProc], queue: str) -> dict[int, set[str]]:
    """Every job of ``queue`` any node holds, by the fire time in its DEDUP key."""
    ids: set[str] = set()
    for node in nodes:
        with _r(node) as r:
            ids |= queue_job_ids(r, queue)
    out: dict[int, set[str]] = {}
    for jid in ids:
        for node in nodes:
            with _r(node) as r:
                reply = r.execute_command("SHOW", jid)
            if reply:
                show = dict(zip(reply[::2], reply[1::2], strict=True))
                out.setdefault(int(show[b"dedup"].rsplit(b"@", 1)[1]), set()).add(jid)
                break
    return out


# ---------------------------------------------------------------- one node


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with NodeProc(Path(tmp_path_factory.mktemp("sched-one")), workers=2, conf=CONF) as n:
        yield n


def test_one_node_fires_keeps_across_restart_and_fires_a_missed_time_once(one: NodeProc) -> None:
    q = _q("every")
    with Disque([f"127.0.0.1:{one.port}"]) as c:
        c.schedule("tick", q, b"payload", every=1, retry=30)
        c.schedule("nightly", _q("cron"), "x", cron="0 3 * * *", tz="Europe/Paris")
        job = c.get_job(q, timeout_ms=10_000)
        assert job is not None and job.body == b"payload"
        c.ack(job)
        listed = {s["name"]: s for s in c.schedules()}
    assert set(listed) == {"tick", "nightly"}
    assert listed["tick"]["rule"] == "EVERY 1" and listed["tick"]["addjob"][:2] == [
        q.encode(), b"payload"]
    assert listed["nightly"]["rule"] == 'CRON "0 3 * * *" TZ Europe/Paris'
    assert listed["nightly"]["next-fire"] % 60_000 == 0 and listed["nightly"]["fired"] == 0
    wait_until(lambda: _show(one, "tick")["fired"] >= 2, wait_s, "two firings")

    one.stop()
    stopped_ms = int(time.time() * 1000)
    time.sleep(3.2)  # three fire times pass while the node is down
    with open(one.dir / "appendonly-schedules.aof", "ab") as f:
        f.write(b"\x00\x00\x01\x00torn")  # a torn tail: cut at start, the rest kept
    start_ms = int(time.time() * 1000)
    one.start()
    assert set(_names(one)) == {b"tick", b"nightly"}  # kept in the schedules file
    assert "damaged tail cut" in one.log_text()
    wait_until(lambda: _show(one, "tick")["last-fire"] > start_ms, wait_s,
               "firing again after the start")
    assert _show(one, "tick")["skipped"] >= 2  # the older missed times add nothing
    logged = re.findall(r"'tick': fire time (\d+) passed while this node was down",
                        one.log_text())
    assert len(logged) == 1  # schedule-missed once: the latest missed time, once
    missed = int(logged[0])
    assert stopped_ms < missed < int(time.time() * 1000)
    assert len(_jobs_by_fire_time([one], q)[missed]) == 1
    with Disque([f"127.0.0.1:{one.port}"]) as c:
        assert c.unschedule("tick") and not c.unschedule("tick")
        assert c.unschedule("nightly")
        assert c.schedules() == []


def test_bad_input_is_refused_and_changes_nothing(one: NodeProc) -> None:
    cases = [
        (("SCHEDULE", "SET", "b", "CRON", "61 * * * *", "ADDJOB", "q", "x", "0"),
         "ERR bad cron expression: Bad minute"),
        (("SCHEDULE", "SET", "b", "CRON", "* * * *", "ADDJOB", "q", "x", "0"),
         "ERR bad cron expression: it needs 5 fields"),
        (("SCHEDULE", "SET", "b", "EVERY", "0", "ADDJOB", "q", "x", "0"), "ERR EVERY must be"),
        (("SCHEDULE", "SET", "b", "EVERY", "-3", "ADDJOB", "q", "x", "0"), "ERR EVERY must be"),
        (("SCHEDULE", "SET", "b", "CRON", "* * * * *", "TZ", "Mars/Olympus", "ADDJOB", "q", "x",
          "0"), "ERR unknown time zone 'Mars/Olympus'"),
        (("SCHEDULE", "SET", "b", "CRON", "* * * * *", "TZ", "../../etc/passwd", "ADDJOB", "q",
          "x", "0"), "ERR unknown time zone"),
        (("SCHEDULE", "SET", "b", "EVERY", "1", "ADDJOB", "q", "x", "0", "RETRY", "x"),
         "RETRY time must be a non negative number"),
        (("SCHEDULE", "SET", "b", "EVERY", "1", "ADDJOB", "q", "x", "0", "BOGUS"),
         "ERR syntax error"),
        (("SCHEDULE", "SET", "b", "EVERY", "1", "ADDJOB", "q", "x" * 1025, "0"),
         "ERR schedule body too big (at most 1024 bytes"),
        (("SCHEDULE", "SET", "b", "EVERY", "1", "NOTADDJOB", "q", "x", "0"), "ERR syntax: SCHEDULE"),
        (("SCHEDULE", "SET", "n" * 201, "EVERY", "1", "ADDJOB", "q", "x", "0"),
         "ERR schedule name must be 1 to 200 bytes"),
        (("SCHEDULE", "SHOW", "nope"), "ERR no such schedule"),
        (("SCHEDULE", "LIST", "extra"), "ERR SCHEDULE subcommand must be"),
        (("SCHEDULE", "FLY"), "ERR SCHEDULE subcommand must be"),
        (("SCHEDULE",), "ERR wrong number of arguments for 'schedule' command"),
    ]
    for args, text in cases:
        assert text.removeprefix("ERR ").lower() in _err(one, *args).lower(), args
    assert _names(one) == []
    for i in range(4):  # schedules-max 4
        with _r(one) as r:
            r.execute_command("SCHEDULE", "SET", f"s{i}", "CRON", "0 0 1 1 *", "ADDJOB", "q", "x", "0")
    assert "schedules-max" in _err(one, "SCHEDULE", "SET", "s4", "EVERY", "5", "ADDJOB", "q", "x", "0")
    with _r(one) as r:  # replacing one at the bound is fine
        assert r.execute_command("SCHEDULE", "SET", "s0", "EVERY", "3600", "ADDJOB", "q", "y", "0")
        assert sorted(_names(one)) == [b"s0", b"s1", b"s2", b"s3"]
        for i in range(4):
            assert r.execute_command("SCHEDULE", "DEL", f"s{i}") == 1
    with Disque([f"127.0.0.1:{one.port}"]) as c:
        with pytest.raises(CommandError):
            c.schedule("b", "q", "x", every=0)
        with pytest.raises(TypeError):
            c.schedule("b", "q", "x", every=1, cron="* * * * *")
    assert one.proc is not None and one.proc.poll() is None


# ---------------------------------------------------------------- three nodes


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProc]]:
    base = tmp_path_factory.mktemp("sched-three")
    nodes = [NodeProc(base / f"n{i}", workers=2, conf=CONF) for i in range(3)]
    with running_cluster(nodes, wait_s) as up:
        yield up


def test_set_on_one_node_is_known_everywhere_one_job_per_fire_time(three: list[NodeProc]) -> None:
    q = _q("cluster")
    with Disque([f"127.0.0.1:{three[1].port}"]) as c:
        c.schedule("every1", q, b"job", every=1)
    wait_until(lambda: all(_names(n) == [b"every1"] for n in three), wait_s,
               "every node knowing the schedule")
    assert sum(_show(n, "every1")["firer"] == b"yes" for n in three) == 1
    wait_until(lambda: _show(three[0], "every1")["fired"] >= 4, wait_s, "four firings")
    by_time = _jobs_by_fire_time(three, q)
    assert len(by_time) >= 4
    assert all(len(ids) == 1 for ids in by_time.values()), by_time
    times = sorted(by_time)
    assert times == list(range(times[0], times[-1] + 1000, 1000))  # none missed


def test_killed_firer_is_replaced_restart_keeps_and_a_joining_node_learns(
        three: list[NodeProc], tmp_path_factory: pytest.TempPathFactory) -> None:
    firer = next(n for n in three if _show(n, "every1")["firer"] == b"yes")
    others = [n for n in three if n is not firer]
    firer.kill_group()
    killed_ms = int(time.time() * 1000)
    wait_until(lambda: _show(others[0], "every1")["last-fire"] > killed_ms + 5000, wait_s,
               "the survivors firing after the firer was killed")
    assert sum(_show(n, "every1")["firer"] == b"yes" for n in others) == 1
    firer.start()  # SIGKILLed: its schedules file brings the schedule back
    assert _names(firer) == [b"every1"]
    joiner = NodeProc(Path(tmp_path_factory.mktemp("sched-join")), workers=1, conf=CONF)
    with joiner:
        with _r(three[0]) as r:
            r.execute_command("CLUSTER", "MEET", "127.0.0.1", joiner.port)
        wait_until(lambda: _names(joiner) == [b"every1"], wait_s, "the joining node learning it")
        with _r(others[0]) as r:
            assert r.execute_command("SCHEDULE", "DEL", "every1") == 1
        wait_until(lambda: all(_names(n) == [] for n in [*three, joiner]), wait_s,
                   "the DEL reaching every node")
