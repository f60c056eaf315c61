"""maxmemory counts the extensions' bytes: on a real node, jobs with every
extension field set (a distinct 256-byte DEDUP key and GROUP name each, then a
distinct 1 KB dead-letter REASON each) grow INFO ``used_memory`` within 20 % of
what they grow the workers' RSS (/proc)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis

from tests.nodeproc import NodeProc

pytestmark = pytest.mark.integration

jobs = 20_000  # enough that the jobs dominate the interpreter's own noise
field_bytes = 256
reason_bytes = 1024
batch = 500
tolerance = 0.20
_PAGE = os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with NodeProc(tmp_path_factory.mktemp("memext"), workers=2) as n:
        yield n


def used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def workers_rss(node: NodeProc) -> int:
    total = 0
    for pid in node.worker_pids():
        with open(f"/proc/{pid}/statm") as f:
            total += int(f.read().split()[1]) * _PAGE
    return total


def settled_used(node: NodeProc, r: redis.Redis) -> int:
    """INFO used_memory once two samples a lanes walk apart agree."""
    last = [-1]

    def still() -> bool:
        now = used_memory(r)
        same, last[0] = now == last[0], now
        return same

    node.wait_for(still, timeout_s=30, what="used_memory settled")
    return last[0]


def add_with_every_field(r: redis.Redis, tag: str, n: int) -> list[str]:
    ids: list[str] = []
    for start in range(0, n, batch):
        p = r.pipeline(transaction=False)
        for i in range(start, min(n, start + batch)):
            key = f"{tag}-{i}".encode().ljust(field_bytes, b"k")
            p.execute_command("ADDJOB", f"mq{i % 4}", b"b" * 100, 0, "DEDUP", key,
                              "GROUP", key.replace(b"k", b"g"))
        ids += [j.decode() for j in p.execute()]
    for start in range(0, n, batch):
        p = r.pipeline(transaction=False)
        for j in ids[start : start + batch]:
            p.execute_command("DEADLETTER", j, "REASON", (j * 30).encode()[:reason_bytes])
        p.execute()
    return ids


def test_used_memory_follows_rss_for_jobs_with_every_extension_field(node: NodeProc) -> None:
    r = node.client(protocol=2, socket_timeout=60)
    add_with_every_field(r, "warm", 2_000)  # the allocator's arenas and caches exist
    used0, rss0 = settled_used(node, r), workers_rss(node)
    add_with_every_field(r, "m", jobs)
    used1, rss1 = settled_used(node, r), workers_rss(node)
    grew_used, grew_rss = used1 - used0, rss1 - rss0
    assert grew_rss > jobs * reason_bytes, "the jobs were held"
    assert abs(grew_used - grew_rss) <= tolerance * grew_rss, (
        f"used_memory grew {grew_used / 2**20:.1f} MB, the workers' RSS "
        f"{grew_rss / 2**20:.1f} MB for {jobs} jobs")


def test_plain_jobs_cost_what_they_did(node: NodeProc) -> None:
    """The estimate of a job without extension fields is unchanged: 415 bytes plus
    its body (docs/memory.md)."""
    r = node.client(protocol=2)
    r.execute_command("ADDJOB", "plain", b"x", 0)  # the queue exists from here
    before = settled_used(node, r)
    p = r.pipeline(transaction=False)
    for _ in range(1000):
        p.execute_command("ADDJOB", "plain", b"x" * 100, 0)
    p.execute()
    node.wait_for(lambda: used_memory(r) - before == 1000 * (415 + 100),
                  what="1000 plain jobs counted as 515 bytes each")


def test_results_are_counted_and_evicted_first(node: NodeProc) -> None:
    """A stored result costs its bytes and ~200 of entry (docs/memory.md); past 95 %
    of maxmemory the results go before anything else (a queued job stays)."""
    r = node.client(protocol=2, socket_timeout=60)
    n, value = 1000, b"v" * 1024
    ids = [r.execute_command("ADDJOB", "resq", b"x" * 100, 0).decode() for _ in range(n)]
    kept = r.execute_command("ADDJOB", "resq-stay", b"x", 0).decode()
    before = settled_used(node, r)
    p = r.pipeline(transaction=False)
    for jid in ids:
        p.execute_command("ACKJOB", jid, "RESULT", value)
    assert p.execute() == [1] * n
    # each job goes (415 + 100 bytes) and its result stays (200 + 1024)
    node.wait_for(lambda: used_memory(r) - before == n * (200 + 1024 - 415 - 100),
                  what="the results counted in used_memory")
    stats = r.info("stats")
    evicted0 = int(stats["results_evicted"])
    limit = int(r.config_get("maxmemory")["maxmemory"])
    try:
        r.config_set("maxmemory", int(used_memory(r) / 0.96))
        node.wait_for(lambda: int(r.info("stats")["results_evicted"]) > evicted0,
                      what="results evicted past 95 %")
        assert r.execute_command("SHOW", kept) is not None  # the queued job stays
    finally:
        r.config_set("maxmemory", limit)
    r.execute_command("DELJOB", kept)
