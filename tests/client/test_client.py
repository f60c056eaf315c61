"""disque_mp.client (sync) and disque_mp.client.aio (asyncio) against a real node."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from disque_mp.client import (
    AckBatcher,
    AddWindow,
    BadIdError,
    CommandError,
    Disque,
    DisqueConnectionError,
    DisqueError,
    Hello,
    Job,
    NodeInfo,
    NoJobError,
    NoReplicationError,
    PausedError,
    TooLateError,
    Topology,
    error_from_reply,
    is_leaving,
)
from disque_mp.client.aio import AsyncDisque
from tests.nodeproc import NodeProc
from tests.nodeproc import unique_queue as _q
from workers.ids import is_valid_job_id

pytestmark = pytest.mark.integration

UNKNOWN_ID = "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with NodeProc(Path(tmp_path_factory.mktemp("client-node")), workers=2) as proc:
        yield proc


@pytest.fixture
def d(node: NodeProc) -> Iterator[Disque]:
    with Disque([f"127.0.0.1:{node.port}"], socket_timeout=30) as client:
        yield client


# ----------------------------------------------------------------------------- handshake


def test_hello_learns_the_node(d: Disque, node: NodeProc) -> None:
    hello = d.hello()
    assert hello.version == 1
    assert len(hello.node_id) == 40
    assert d.node_id == hello.node_id
    me = [n for n in hello.nodes if n.id == hello.node_id]
    assert len(me) == 1 and me[0].port == node.port and me[0].priority == 1
    assert d.address == ("127.0.0.1", node.port)
    assert d.ping()
    assert int(d.info()["registered_jobs"]) >= 0
    assert "registered_jobs" in d.info("jobs")


def test_unreachable_seeds_are_skipped_and_reported(node: NodeProc) -> None:
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()[1]
        for _ in range(5):  # the first node is picked at random: both orders must work
            with Disque([f"127.0.0.1:{dead}", f"127.0.0.1:{node.port}"]) as c:
                assert c.ping()
                assert c.address == ("127.0.0.1", node.port)
        with pytest.raises(DisqueConnectionError) as excinfo:
            Disque([f"127.0.0.1:{dead}"]).ping()
    assert f"127.0.0.1:{dead}" in str(excinfo.value)


def test_bad_node_addresses_are_refused() -> None:
    with pytest.raises(ValueError, match="is not host:port"):
        Disque(["127.0.0.1"])
    with pytest.raises(ValueError, match="is not host:port"):
        Disque("127.0.0.1:99999")


# ----------------------------------------------------------------------------- jobs


def test_add_job_options_show_up_in_show(d: Disque) -> None:
    q = _q()
    job_id = d.add_job(q, b"payload", 0, replicate=1, retry=30, ttl=3600, maxlen=10)
    assert is_valid_job_id(job_id)
    info = d.show(job_id)
    assert info is not None
    assert info["id"] == job_id and info["queue"] == q and info["state"] == "queued"
    assert (info["repl"], info["retry"], info["ttl"]) == (1, 30, 3600)
    assert info["body"] == b"payload"
    assert info["nodes-delivered"] == [d.node_id]
    assert d.add_job(q, "text", async_=True)
    delayed = d.add_job(q, "later", delay=50, ttl=100)
    assert d.show(delayed)["delay"] == 50
    assert d.qlen(q) == 2  # the delayed job is not queued yet
    assert int(d.add_job(q, "x", retry=0, replicate=1)[-4:], 16) % 2 == 0  # at-most-once ID


def test_get_jobs_ack_and_counters(d: Disque) -> None:
    q = _q()
    ids = [d.add_job(q, f"b{i}", retry=60) for i in range(5)]
    jobs = d.get_jobs(q, count=3, nohang=True, withcounters=True)
    assert [j.id for j in jobs] == ids[:3]
    assert jobs[0] == Job(q, ids[0], b"b0", 0, 0)
    plain = d.get_jobs([q, _q("empty")], timeout_ms=100)
    assert plain == [Job(q, ids[3], b"b3")]
    assert d.get_job(q).id == ids[4]  # type: ignore[union-attr]
    assert d.get_jobs(q, nohang=True) == []
    assert d.get_jobs(q, timeout_ms=100) == []
    assert d.show(ids[0])["state"] == "active"
    assert d.ack(ids[0], jobs[1]) == 2
    assert d.fast_ack([ids[2], ids[3]]) == 2
    assert d.ack(ids[0]) == 0
    assert d.show(ids[0]) is None


def test_nack_working_enqueue_dequeue_deljob(d: Disque) -> None:
    q = _q()
    job_id = d.add_job(q, "work", retry=30)
    job = d.get_job(q)
    assert job is not None and job.id == job_id
    assert d.working(job) == 30
    assert d.nack(job_id) == 1
    assert d.show(job_id)["nacks"] == 1
    again = d.get_jobs(q, nohang=True, withcounters=True)
    assert again[0].nacks == 1
    assert d.dequeue(job_id) == 0
    assert d.enqueue(job_id) == 1
    assert d.enqueue(job_id) == 0
    assert d.qlen(q) == 1
    assert d.dequeue(job_id) == 1
    assert d.qlen(q) == 0
    assert d.del_job(job_id) == 1
    assert d.show(job_id) is None
    assert d.del_job(job_id) == 0


def test_qpeek_qstat_pause(d: Disque) -> None:
    q = _q()
    ids = [d.add_job(q, f"p{i}") for i in range(3)]
    assert [j.id for j in d.qpeek(q, 10)] == ids
    assert [j.id for j in d.qpeek(q, -1)] == ids[-1:]
    stat = d.qstat(q)
    assert stat is not None
    assert stat["name"] == q and stat["len"] == 3 and stat["pause"] == "none"
    assert stat["import-from"] == []
    assert d.qstat(_q("nosuch")) is None
    assert d.pause(q, "in") == "in"
    assert d.pause(q, "state") == "in"
    with pytest.raises(PausedError, match="Queue paused in input"):
        d.add_job(q, "refused")
    assert d.pause(q, "none") == "none"
    d.add_job(q, "accepted")


def test_scans(d: Disque) -> None:
    q1, q2 = _q("scan"), _q("scan")
    a = d.add_job(q1, "a")
    b = d.add_job(q2, "b")
    d.add_job(q2, "c")
    names = set(d.iter_queues(count=2))
    assert {q1, q2} <= names
    assert q1 not in set(d.iter_queues(minlen=2))
    assert set(d.iter_jobs(queue=q1)) == {a}
    assert b in set(d.iter_jobs(states=["queued"], count=1))
    full = list(d.iter_jobs(queue=q1, reply_all=True))
    assert [(j["id"], j["body"], j["state"]) for j in full] == [(a, b"a", "queued")]
    assert len(list(d.iter_jobs(queue=q2))) == 2


def test_add_jobs_pipelines_and_stops_at_the_first_error(d: Disque) -> None:
    q = _q("bulk")
    ids = d.add_jobs(((q, f"j{i}") for i in range(2500)), retry=60)
    assert len(set(ids)) == 2500 and d.qlen(q) == 2500
    assert [j.body for j in d.qpeek(q, 3)] == [b"j0", b"j1", b"j2"]
    with pytest.raises(CommandError, match="TTL must be a number > 0"):
        d.add_jobs([(q, "x")], ttl=0)


def test_add_window_bounds_pipelines_and_resends_after_a_drop(d: Disque) -> None:
    q = _q("window")
    w = AddWindow(d, window=4)
    for i in range(20):
        w.add(q, f"j{i}", retry=60)
        assert w.pending <= 4
    w.flush()
    assert w.pending == 0 and w.confirmed == 20 and d.qlen(q) == 20
    # the node closes the window's connection: the next adds go on a new one, and
    # what was written and not answered is written again
    sock = w._conn._sock
    host, port = sock.getsockname()[:2]
    for _ in range(50):  # bounded: a connection in the middle of a hand-off between
        try:             # workers is briefly on neither worker's client list
            d.execute("CLIENT", "KILL", f"{host}:{port}")
            break
        except CommandError:
            time.sleep(0.1)
    # CLIENT KILL of a connection held by another worker is carried out after its reply:
    # wait for the close, so no add below runs on the old connection (one answered there
    # but closed before its reply came back would rightly be sent twice: at-least-once)
    timeout_s = sock.gettimeout()
    sock.settimeout(10)
    assert sock.recv(1, socket.MSG_PEEK) == b""
    sock.settimeout(timeout_s)
    for i in range(20, 30):
        w.add(q, f"j{i}", retry=60)
    w.close()
    assert d.qlen(q) == 30
    assert sorted(j.body for j in d.qpeek(q, 30)) == sorted(f"j{i}".encode() for i in range(30))
    with pytest.raises(ValueError, match="window"):
        AddWindow(d, window=0)


def test_add_window_raises_an_error_reply_once_and_goes_on(d: Disque) -> None:
    paused, other = _q("wpaused"), _q("wother")
    d.pause(paused, "in")
    w = AddWindow(d)
    raised, sent = [], 0
    for target in (paused, other, other, other):
        try:
            w.add(target, "x")
            sent += target == other
        except PausedError as exc:  # the paused add's error: this add sent nothing
            raised.append(exc)
    try:
        w.flush()
    except PausedError as exc:
        raised.append(exc)
    w.flush()  # raised once only
    assert len(raised) == 1 and d.qlen(other) == sent >= 2 and d.qlen(paused) == 0
    d.pause(paused, "none")
    w.close()


def test_ack_batcher_acks_everything_in_few_commands(d: Disque) -> None:
    q = _q("acks")
    ids = d.add_jobs((q, f"j{i}") for i in range(200))
    jobs = d.get_jobs(q, count=200, nohang=True)
    assert len(jobs) == 200
    acks = AckBatcher(d)
    for job in jobs:
        acks.ack(job.id)
    assert acks.flush()
    assert 1 <= acks.batches < 200
    acks.close()
    acks.ack(ids[0])  # after close: an ACKJOB of its own
    assert all(d.show(i) is None for i in ids)


# ----------------------------------------------------------------------------- errors


def test_server_errors_map_to_classes(d: Disque) -> None:
    with pytest.raises(BadIdError) as bad:
        d.ack("notajobid")
    assert str(bad.value) == "BADID Invalid Job ID format." and bad.value.code == "BADID"
    with pytest.raises(NoJobError, match="^NOJOB Job not known"):
        d.working(UNKNOWN_ID)
    with pytest.raises(NoReplicationError, match="^NOREPL Not enough reachable nodes"):
        d.add_job(_q(), "x", replicate=5)
    with pytest.raises(CommandError) as err:
        d.add_job(_q(), "x", ttl=0)
    assert str(err.value) == "ERR TTL must be a number > 0"
    with pytest.raises(CommandError, match="syntax error"):
        d.execute("ADDJOB", "q", "x", 0, "BADOPT", 1)
    with pytest.raises(DisqueError):
        d.pause(_q(), "bogus")
    assert d.show(UNKNOWN_ID) is None
    assert d.ack(UNKNOWN_ID) == 0


def test_working_past_half_the_ttl_is_too_late(d: Disque) -> None:
    q = _q("late")
    d.add_job(q, "short-lived", ttl=2, retry=1)
    job = d.get_job(q)
    assert job is not None
    time.sleep(1.2)  # past half of TTL 2 s
    with pytest.raises(TooLateError, match="^TOOLATE"):
        d.working(job)


def test_error_text_mapping_is_total() -> None:
    assert type(error_from_reply("OOM command not allowed")).__name__ == "OutOfMemoryError"
    assert type(error_from_reply("LEAVING This node is leaving")).__name__ == "LeavingError"
    assert type(error_from_reply("TOOLATE Half of job TTL already elapsed")).__name__ == \
        "TooLateError"
    assert type(error_from_reply("WEIRD thing")) is DisqueError
    assert is_leaving(error_from_reply(
        "NOREPL Not enough reachable nodes for the requested replication level, since I'm "
        "unable to hold a copy of the message for the following reason: I'm leaving the cluster"))
    assert not is_leaving(error_from_reply("NOREPL Not enough reachable nodes"))


def test_topology_prefers_low_priority_and_the_producer() -> None:
    a, b, c = ("10.0.0.1", 7711), ("10.0.0.2", 7711), ("10.0.0.3", 7711)
    ids = ["a" * 40, "b" * 40, "c" * 40]
    hello = Hello(1, ids[0], (NodeInfo(ids[0], *a, 100), NodeInfo(ids[1], *b, 1),
                             NodeInfo(ids[2], *c, 1)))
    topo = Topology([a], prefer_producer=True, rng=random.Random(7))
    topo.learn(hello, a)
    assert topo.candidates(avoid=a)[-1] == a
    assert set(topo.candidates()[:2]) == {b, c}
    assert set(topo.better_nodes()) == {b, c}
    foreign = [Job("q", f"D-{'c' * 8}-{'x' * 24}-05a1", b"") for _ in range(999)]
    assert topo.note_jobs(foreign) is None  # not enough seen yet
    assert topo.note_jobs(foreign[:1]) == c


# ----------------------------------------------------------------------------- consumer helper


def test_consume_sends_working_while_the_handler_runs(d: Disque, node: NodeProc) -> None:
    q = _q("slow")
    job_id = d.add_job(q, "slow", retry=2)
    seen: list[dict] = []
    with Disque([f"127.0.0.1:{node.port}"]) as observer:

        def handler(job: Job) -> None:
            start = time.monotonic()
            first = observer.show(job.id)
            time.sleep(3.2)  # past RETRY 2 s: without WORKING the job would be queued again
            later = observer.show(job.id)
            elapsed_ms = (time.monotonic() - start) * 1000
            seen.extend([first, later])
            # the requeue deadline moved forward (WORKING), beyond the original one
            assert later["next-requeue-within"] > first["next-requeue-within"] - elapsed_ms + 500
            assert observer.get_jobs(q, nohang=True) == []

        assert d.consume(q, handler, max_jobs=1) == 1
        assert [s["state"] for s in seen] == ["active", "active"]
        assert seen[1]["additional-deliveries"] == 0
        assert d.show(job_id) is None  # acked after the handler returned


def test_consume_keeps_jobs_waiting_in_its_batch_alive(d: Disque, node: NodeProc) -> None:
    q = _q("batch")
    d.add_jobs(((q, f"w{i}") for i in range(3)), retry=2)
    later_states: list[tuple[str, int]] = []
    with Disque([f"127.0.0.1:{node.port}"]) as observer:

        def handler(job: Job) -> None:
            info = observer.show(job.id)
            later_states.append((info["state"], info["additional-deliveries"]))
            assert observer.get_jobs(q, nohang=True) == []
            time.sleep(1.3)  # the third job waits 2.6 s > RETRY before its turn

        assert d.consume(q, handler, count=3, max_jobs=3) == 3
    assert later_states == [("active", 0)] * 3


def test_consume_nacks_when_the_handler_raises(d: Disque) -> None:
    q = _q("flaky")
    job_id = d.add_job(q, "flaky", retry=60)
    nacks_seen: list[int | None] = []

    def handler(job: Job) -> None:
        nacks_seen.append(job.nacks)
        if len(nacks_seen) == 1:
            raise RuntimeError("first attempt fails")

    assert d.consume(q, handler, max_jobs=2, poll_ms=200) == 2
    assert nacks_seen == [0, 1]  # NACKed, delivered again at once with the nack counted
    assert d.show(job_id) is None


def test_consume_as_iterator_acks_on_next_and_nacks_on_break(d: Disque) -> None:
    q = _q("iter")
    ids = [d.add_job(q, f"i{i}", retry=60) for i in range(4)]
    got = [job.id for job in d.consume(q, max_jobs=2)]
    assert got == ids[:2]
    assert d.show(ids[0]) is None and d.show(ids[1]) is None
    for job in d.consume(q, count=2):
        assert job.id == ids[2]
        break
    # the job in hand and the one taken with it went back to the queue at once
    assert d.show(ids[2])["nacks"] == 1
    assert d.qlen(q) == 2
    stop = threading.Event()
    handled: list[str] = []

    def handler(job: Job) -> None:
        handled.append(job.id)
        if len(handled) == 2:
            stop.set()

    assert d.consume(q, handler, stop=stop, poll_ms=100) == 2
    assert sorted(handled) == sorted(ids[2:])


# ----------------------------------------------------------------------------- asyncio twin


def test_async_client_same_methods(node: NodeProc) -> None:
    async def main() -> None:
        async with AsyncDisque([f"127.0.0.1:{node.port}"]) as a:
            hello = await a.hello()
            assert a.node_id == hello.node_id
            q = _q("async")
            job_id = await a.add_job(q, b"hi", retry=30, ttl=600)
            assert (await a.show(job_id))["ttl"] == 600
            assert await a.qlen(q) == 1
            assert [j.id for j in await a.qpeek(q, 1)] == [job_id]
            assert (await a.qstat(q))["len"] == 1
            assert q in [name async for name in a.iter_queues()]
            assert [i async for i in a.iter_jobs(queue=q)] == [job_id]
            ids = await a.add_jobs([(q, "b1"), (q, "b2")])
            job = await a.get_job(q, nohang=True)
            assert job == Job(q, job_id, b"hi")
            assert await a.working(job) == 30
            assert await a.nack(job) == 1
            assert await a.ping()
            assert "registered_jobs" in await a.info("jobs")
            assert await a.dequeue(job) == 1 and await a.enqueue(job) == 1
            assert await a.pause(q, "out") == "out" and await a.pause(q, "none") == "none"
            extra = await a.add_job(q, "extra")
            assert await a.del_job(extra) == 1
            extra = await a.add_job(q, "extra")
            assert await a.fast_ack(extra) == 1
            with pytest.raises(NoJobError):
                await a.working(UNKNOWN_ID)
            with pytest.raises(BadIdError):
                await a.ack("bad")

            seen: list[int | None] = []

            async def handler(j: Job) -> None:
                seen.append(j.nacks)
                if j.id == ids[0] and j.nacks == 0:
                    raise ValueError("retry me")

            assert await a.consume(q, handler, max_jobs=4, poll_ms=200) == 4
            assert sorted(seen, key=lambda x: x or 0) == [0, 0, 1, 1]
            assert await a.qlen(q) == 0

            await a.add_jobs([(q, "c1"), (q, "c2")], retry=60)
            taken = []
            async with contextlib.aclosing(a.iterate(q)) as jobs:
                async for j in jobs:
                    taken.append(j.id)
                    if len(taken) == 2:
                        break
            assert await a.qlen(q) == 1  # the second one was NACKed back
            assert (await a.show(taken[0])) is None

    asyncio.run(main())


def test_async_consume_heartbeat(node: NodeProc) -> None:
    async def main() -> None:
        async with AsyncDisque([f"127.0.0.1:{node.port}"]) as a:
            q = _q("aslow")
            job_id = await a.add_job(q, "slow", retry=1)
            states: list[str] = []

            async def handler(j: Job) -> None:
                await asyncio.sleep(2.5)  # past RETRY 1 s
                states.append((await a.show(j))["state"])
                assert await a.qlen(q) == 0

            assert await a.consume(q, handler, max_jobs=1) == 1
            assert states == ["active"]
            assert await a.show(job_id) is None

    asyncio.run(main())
