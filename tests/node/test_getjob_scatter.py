"""GETJOB over queues of both workers of one node: every owner asked at once, the
answer the one a single shard gives (one job per queue per pass, left to right),
the surplus back in its queue with no delivery counted, each job delivered once,
and a worker killed mid-scatter costs an error or an answer, never a hang."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.httpclient import get
from tests.nodeproc import NodeProc, free_port
from tests.rawclient import NULL_ARRAY, Err, RawClient, Status, connect_to_worker, encode_command
from workers.ids import owner_of_queue

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    http = free_port()
    # appendonly: the records of a read of mesh frames reach the AOF before its replies
    conf = {"http-port": http, "appendonly": "yes"}
    with NodeProc(Path(tmp_path_factory.mktemp("scatter")), workers=2, conf=conf) as n:
        n.http_port = http  # type: ignore[attr-defined]
        yield n


def delivered(node: NodeProc) -> float:
    """The node's count of deliveries (every worker's), from /metrics."""
    reply = get(node.http_port, "/metrics")  # type: ignore[attr-defined]
    for line in reply.body.decode().splitlines():
        if line.startswith("disque_jobs_delivered_total "):
            return float(line.split()[1])
    raise AssertionError("no disque_jobs_delivered_total in /metrics")


def queues_of(index: int, n: int, prefix: str) -> list[str]:
    out = [f"{prefix}{i}" for i in range(2000) if owner_of_queue(f"{prefix}{i}".encode(), 2) == index]
    return out[:n]


def add(c: RawClient, q: str, body: str) -> str:
    reply = c.call("ADDJOB", q, body, 0)
    assert isinstance(reply, Status), reply
    return str(reply)


def test_priority_across_owners_is_one_shards_order(node: NodeProc) -> None:
    left, right = queues_of(1, 1, "pl")[0], queues_of(0, 1, "pr")[0]
    for worker in (0, 1):  # the coordinator on either side
        c = connect_to_worker(node.port, worker)
        r1, r2 = add(c, right, "r1"), add(c, right, "r2")
        l1, l2, l3 = add(c, left, "l1"), add(c, left, "l2"), add(c, left, "l3")
        got = c.call("GETJOB", "NOHANG", "FROM", left, right)
        assert [(g[0], g[1].decode()) for g in got] == [(left.encode(), l1)]
        # one job per queue per pass, left to right: l2 r1 l3 r2
        got = c.call("GETJOB", "NOHANG", "COUNT", 3, "FROM", left, right)
        assert [g[1].decode() for g in got] == [l2, r1, l3]
        got = c.call("GETJOB", "NOHANG", "COUNT", 3, "FROM", left, right)
        assert [g[1].decode() for g in got] == [r2]
        assert c.call("GETJOB", "NOHANG", "FROM", left, right) == NULL_ARRAY
        assert c.call("ACKJOB", l1, l2, l3, r1, r2) == 5
        c.close()


def test_surplus_back_in_its_queue_uncounted(node: NodeProc) -> None:
    mine, theirs = queues_of(0, 3, "sm"), queues_of(1, 3, "st")
    order = [q for pair in zip(mine, theirs, strict=True) for q in pair]  # alternate owners
    c = connect_to_worker(node.port, 0)
    ids = {q: [add(c, q, f"{q}-{k}") for k in range(4)] for q in order}
    got = c.call("GETJOB", "NOHANG", "COUNT", 8, "FROM", *order)
    # two passes over six queues cut at eight: the first job of each, then q0 q1
    want = [ids[q][0] for q in order] + [ids[order[0]][1], ids[order[1]][1]]
    assert [g[1].decode() for g in got] == want
    for q in order:  # everything not answered is back, queued, never counted delivered
        taken = 2 if q in order[:2] else 1
        assert c.call("QLEN", q) == 4 - taken
        for job_id in ids[q][taken:]:
            show = c.call("SHOW", job_id)
            fields = dict(zip(show[::2], show[1::2], strict=True))
            assert fields[b"state"] == b"queued", fields
            assert fields[b"nacks"] == 0 and fields[b"additional-deliveries"] == 0, fields
    rest = c.call("GETJOB", "NOHANG", "COUNT", 100, "WITHCOUNTERS", "FROM", *order)
    assert len(rest) == 24 - 8
    assert all(g[4] == 0 and g[6] == 0 for g in rest)
    assert c.call("ACKJOB", *[i for q in order for i in ids[q]]) == 24
    c.close()


def test_each_owner_delivers_exactly_its_part(node: NodeProc) -> None:
    """The coordinator takes from its own queues only once the other owner has told
    what its queues held, so each side delivers exactly its part of the one-shard
    answer: the node counts as many deliveries as the answers hold jobs, with
    queues paused for output on either side (they hold jobs that a take skips)."""
    for worker in (0, 1):
        here, there = queues_of(worker, 3, f"ex{worker}h"), queues_of(1 - worker, 3, f"ex{worker}t")
        order = [here[0], there[0], here[1], there[1], here[2], there[2]]
        c = connect_to_worker(node.port, worker)
        ids = {q: [add(c, q, f"{q}-{k}") for k in range(4)] for q in order}
        for paused in (here[2], there[2]):
            assert c.call("PAUSE", paused, "out") == "out"
        live = {q: v for q, v in ids.items() if q not in (here[2], there[2])}
        for count in (3, 6, 5, 1, 8):
            want = one_shard(order, live, count)
            before = delivered(node)
            got = c.call("GETJOB", "NOHANG", "COUNT", count, "FROM", *order)
            assert [g[1].decode() for g in got] == want, (worker, count)
            assert delivered(node) - before == len(want), (worker, count)
            for job_id in want:
                live[next(q for q in live if job_id in live[q])].remove(job_id)
        for paused in (here[2], there[2]):
            assert c.call("PAUSE", paused, "none") == "none"
        c.call("ACKJOB", *[i for v in ids.values() for i in v])
        c.close()


def test_each_job_delivered_once_to_concurrent_consumers(node: NodeProc) -> None:
    queues = queues_of(0, 5, "cm") + queues_of(1, 5, "cm")
    queues = [q for pair in zip(queues[:5], queues[5:], strict=True) for q in pair]
    c = RawClient(node.port)
    added = {add(c, queues[i % 10], f"j{i}") for i in range(300)}
    seen: list[str] = []
    lock = threading.Lock()

    def consume() -> None:
        cc = RawClient(node.port)
        for _ in range(400):  # bounded: 300 jobs over 4 consumers
            got = cc.call("GETJOB", "NOHANG", "COUNT", 7, "FROM", *queues)
            if got == NULL_ARRAY:
                break
            with lock:
                seen.extend(g[1].decode() for g in got)
        cc.close()

    threads = [threading.Thread(target=consume) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(seen) == len(set(seen)) == 300
    assert set(seen) == added
    assert c.call("ACKJOB", *sorted(added)) == 300
    c.close()


def test_worker_killed_mid_scatter(node: NodeProc) -> None:
    queues = queues_of(0, 20, "kq") + queues_of(1, 20, "kq")
    queues = [q for pair in zip(queues[:20], queues[20:], strict=True) for q in pair]
    c = connect_to_worker(node.port, 0)
    c.send(b"".join(encode_command("ADDJOB", queues[i % 40], f"k{i}", 0) for i in range(1200)))
    assert all(isinstance(c.read(), Status) for _ in range(1200))
    pid1 = int(c.call("INFO", "workers").decode().split("worker1:pid=")[1].split(",")[0])
    outcomes: list[object] = []

    def consume() -> None:
        cc = connect_to_worker(node.port, 0)
        cc.sock.settimeout(10)  # a hang fails the test instead of stalling it
        empty = 0
        try:
            for _ in range(2000):  # bounded: 1200 jobs, two at a time
                got = cc.call("GETJOB", "TIMEOUT", 100, "COUNT", 2, "FROM", *queues)
                outcomes.append(got)
                if isinstance(got, list):
                    cc.call("ACKJOB", *[g[1].decode() for g in got])
                empty = empty + 1 if got == NULL_ARRAY else 0
                if empty >= 3:
                    break
        except TimeoutError:
            outcomes.append("hang")
        cc.close()

    batched: list[object] = []

    def consume_pipelined() -> None:
        """Eight GETJOBs per write: their takes in flight at the owner as one batch."""
        cc = connect_to_worker(node.port, 0)
        cc.sock.settimeout(10)
        empty = 0
        try:
            for _ in range(200):  # bounded: 1200 jobs, up to sixteen per round
                cc.send(encode_command("GETJOB", "TIMEOUT", 100, "COUNT", 2, "FROM", *queues) * 8)
                got = [cc.read() for _ in range(8)]
                batched.extend(got)
                ids = [g[1].decode() for o in got if isinstance(o, list) for g in o]
                if ids:
                    cc.call("ACKJOB", *ids)
                empty = empty + 1 if all(o == NULL_ARRAY for o in got) else 0
                if empty >= 3:
                    break
        except TimeoutError:
            batched.append("hang")
        cc.close()

    threads = [threading.Thread(target=consume), threading.Thread(target=consume_pipelined)]
    for t in threads:
        t.start()
    node.wait_for(lambda: len(outcomes) >= 20 and len(batched) >= 40, 30, "the consumers under way")
    os.kill(pid1, signal.SIGKILL)
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    assert "hang" not in outcomes and "hang" not in batched
    assert all(isinstance(o, (list, Err)) or o == NULL_ARRAY for o in outcomes + batched), outcomes[:5]
    assert any(isinstance(o, list) for o in outcomes[25:])  # it went on after the kill
    delivered = [g for o in outcomes + batched if isinstance(o, list) for g in o]
    assert len({g[1] for g in delivered}) == len(delivered)
    # worker 0's jobs: each delivered once or still queued (worker 1's died with it)
    left = sum(c.call("QLEN", q) for q in queues[::2])
    assert left + sum(1 for g in delivered if owner_of_queue(g[0], 2) == 0) == 600
    node.wait_for(lambda: isinstance(RawClient(node.port).call("QLEN", queues[1]), int), 30, "worker 1")
    c.close()


def one_shard(order: list[str], jobs: dict[str, list[str]], count: int) -> list[str]:
    """What a single shard answers: one job per queue per pass, left to right."""
    left = {q: list(v) for q, v in jobs.items()}
    out: list[str] = []
    while len(out) < count:
        before = len(out)
        for q in order:
            if left.get(q):
                out.append(left[q].pop(0))
                if len(out) >= count:
                    break
        if len(out) == before:
            break
    return out


def test_queues_named_twice_and_paused_answer_as_one_shard(node: NodeProc) -> None:
    """A TAKE tells the owner what the coordinator's queues hold, so it takes about its
    own part: queues named twice and queues paused for output on either side still
    give the one-shard answer, and whatever was taken beyond it is back, uncounted."""
    for worker in (0, 1):
        here, there = queues_of(worker, 2, f"tw{worker}h"), queues_of(1 - worker, 2, f"tw{worker}t")
        order = [there[0], here[0], there[0], here[1], there[1], here[0], here[1]]
        c = connect_to_worker(node.port, worker)
        ids = {q: [add(c, q, f"{q}-{k}") for k in range(3)] for q in here + there}
        for paused in (here[1], there[1]):
            assert c.call("PAUSE", paused, "out") == "out"
        live = {q: v for q, v in ids.items() if q not in (here[1], there[1])}
        for count in (1, 4, 5):
            want = one_shard(order, live, count)
            got = c.call("GETJOB", "NOHANG", "COUNT", count, "FROM", *order)
            assert [g[1].decode() for g in got] == want, (worker, count)
            for job_id in want:
                live[next(q for q in live if job_id in live[q])].remove(job_id)
        for q, rest in live.items():  # nothing beyond the answers left its queue
            assert c.call("QLEN", q) == len(rest)
            for job_id in rest:
                show = c.call("SHOW", job_id)
                fields = dict(zip(show[::2], show[1::2], strict=True))
                assert fields[b"state"] == b"queued" and fields[b"nacks"] == 0, fields
                assert fields[b"additional-deliveries"] == 0, fields
        for paused in (here[1], there[1]):
            assert c.call("PAUSE", paused, "none") == "none"
        c.call("ACKJOB", *[i for v in ids.values() for i in v])
        assert [c.call("QLEN", q) for q in ids] == [0, 0, 0, 0]
        c.close()


def test_a_reads_getjobs_to_one_owner_answer_as_one_shard_in_order(node: NodeProc) -> None:
    """Pipelined GETJOBs over both workers, sent in one write: their takes leave for
    the other owner in one frame (with the forwarded ADDJOBs between them, in the
    client's order), and each answer is the one a single shard gives, in turn."""
    for worker in (0, 1):
        here = queues_of(worker, 3, f"bt{worker}h")
        there = queues_of(1 - worker, 3, f"bt{worker}t")
        order = [there[0], here[0], there[1], here[1], there[2], here[2]]  # another owner leads
        c = connect_to_worker(node.port, worker)
        ids = {q: [add(c, q, f"{q}-{k}") for k in range(8)] for q in order}
        counts = [3, 1, 6, 2, 4, 5, 1, 6]  # each queue gives at most one job per answer
        c.send(b"".join(encode_command("GETJOB", "NOHANG", "COUNT", n, "FROM", *order)
                        for n in counts))
        got = [c.read() for _ in counts]
        left = {q: list(v) for q, v in ids.items()}
        for n, answer in zip(counts, got, strict=True):
            want = one_shard(order, left, n)
            assert [g[1].decode() for g in answer] == want, (worker, n)
            for job_id in want:
                left[next(q for q in left if job_id in left[q])].remove(job_id)
        # a GETJOB, an ADDJOB for the other owner, a GETJOB, in one write: the order kept
        mine = queues_of(worker, 1, f"bo{worker}h")[0]
        theirs = queues_of(1 - worker, 1, f"bo{worker}t")[0]
        pipeline = [("GETJOB", "NOHANG", "FROM", theirs, mine), ("ADDJOB", theirs, "late", 0),
                    ("GETJOB", "NOHANG", "FROM", theirs, mine),
                    ("GETJOB", "NOHANG", "FROM", theirs, mine)]
        c.send(b"".join(encode_command(*cmd) for cmd in pipeline))
        first, added, second, third = (c.read() for _ in pipeline)
        assert first == NULL_ARRAY and third == NULL_ARRAY, (first, third)
        assert isinstance(added, Status) and [g[1].decode() for g in second] == [str(added)]
        c.call("ACKJOB", str(added), *[i for v in ids.values() for i in v])
        c.close()


def test_a_client_gone_before_its_batchs_answers_gets_nothing_counted(node: NodeProc) -> None:
    """Several GETJOBs of two clients at once, one client gone before the other owner
    answers their takes: whatever was taken for it is back in its queue, no delivery
    counted in the job, and the other client gets its answers. A job went into an
    answer (active) or is queued (no NACK, no additional delivery in SHOW)."""
    for worker in (0, 1):
        here = queues_of(worker, 2, f"bg{worker}h")
        there = queues_of(1 - worker, 2, f"bg{worker}t")
        order = [there[0], here[0], there[1], here[1]]  # another owner leads: no answer at once
        c = connect_to_worker(node.port, worker)
        ids = [add(c, q, f"{q}-{k}") for q in order for k in range(10)]
        gone, stays = connect_to_worker(node.port, worker), connect_to_worker(node.port, worker)
        five = b"".join(encode_command("GETJOB", "NOHANG", "COUNT", 3, "FROM", *order)
                        for _ in range(5))
        gone.send(five)
        stays.send(five)
        gone.close()
        answers = [stays.read() for _ in range(5)]
        got = [g[1].decode() for a in answers for g in a]
        assert len(got) == 15 and len(set(got)) == 15  # 40 jobs: every answer full
        assert all(_show(c, i)[b"state"] == b"active" for i in got)
        stays.close()

        settled = partial(_settled, c, ids, order)
        node.wait_for(settled, 10, "each job queued uncounted, or delivered")
        c.call("ACKJOB", *ids)
        c.close()


def _settled(c: RawClient, ids: list[str], order: list[str]) -> bool:
    states = [_show(c, i) for i in ids]
    active = sum(1 for f in states if f[b"state"] == b"active")
    queued = [f for f in states if f[b"state"] == b"queued"]
    return active + len(queued) == len(ids) and \
        all(f[b"nacks"] == 0 and f[b"additional-deliveries"] == 0 for f in queued) and \
        sum(c.call("QLEN", q) for q in order) == len(queued)


def _show(c: RawClient, job_id: str) -> dict[bytes, object]:
    show = c.call("SHOW", job_id)
    return dict(zip(show[::2], show[1::2], strict=True))


def test_an_owners_records_reach_the_aof_before_its_answers(node: NodeProc) -> None:
    """The owner writes the AOF records of a read of mesh frames before their answers
    leave (once per read): a forwarded ADDJOB's reply never comes before its record
    is in the owner's file (the kernel's page cache, which survives a SIGKILL)."""
    for worker in (0, 1):
        here = queues_of(worker, 4, f"af{worker}h")
        there = queues_of(1 - worker, 4, f"af{worker}t")
        c = connect_to_worker(node.port, worker)
        cmds = [encode_command("ADDJOB", q, f"{q}-{k}", 0) for k in range(20)
                for pair in zip(there, here, strict=True) for q in pair]
        c.send(b"".join(cmds))
        ids = [str(c.read()) for _ in cmds]
        logged = b"".join(p.read_bytes() for p in node.dir.glob("appendonly-w*-g*.aof"))
        assert [i for i in ids if i.encode() not in logged] == []
        c.call("ACKJOB", *ids)
        c.close()


def test_pipelined_getjobs_racing_for_our_queues_answer_as_one_shard(node: NodeProc) -> None:
    """GETJOBs over both workers in one write all measure our queues before the first
    of them takes from them: a later one, finding our jobs gone, asks the other owner
    again, so each answer is still the one a single shard gives, in turn."""
    for worker in (0, 1):
        mine = queues_of(worker, 2, f"rc{worker}h")
        theirs = queues_of(1 - worker, 2, f"rc{worker}t")
        c = connect_to_worker(node.port, worker)
        ids = {mine[0]: [add(c, mine[0], "m0")], mine[1]: [add(c, mine[1], "m1-a"), add(c, mine[1], "m1-b")],
               theirs[0]: [add(c, theirs[0], f"t0-{k}") for k in range(6)],
               theirs[1]: [add(c, theirs[1], f"t1-{k}") for k in range(6)]}
        shapes = [([mine[0], theirs[0]], 2), ([mine[0], theirs[0]], 2),
                  ([theirs[1], mine[1]], 3), ([mine[1], theirs[1]], 2), ([mine[1], theirs[1]], 3)]
        c.send(b"".join(encode_command("GETJOB", "NOHANG", "COUNT", n, "FROM", *order)
                        for order, n in shapes))
        got = [c.read() for _ in shapes]
        left = {q: list(v) for q, v in ids.items()}
        for (order, n), answer in zip(shapes, got, strict=True):
            want = one_shard(order, left, n)
            assert [g[1].decode() for g in answer] == want, (worker, order, n)
            for job_id in want:
                left[next(q for q in left if job_id in left[q])].remove(job_id)
        for q, rest in left.items():  # nothing beyond the answers left its queue
            assert c.call("QLEN", q) == len(rest), q
        c.call("ACKJOB", *[i for v in ids.values() for i in v])
        c.close()
