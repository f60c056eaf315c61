"""disque_mp/node/memory.py: level computation, the live-data estimate against
tracemalloc, INFO field order against the reference, and the shard's level 1."""

from __future__ import annotations

import gc
import random
import re
import tracemalloc
from typing import Any

import pytest

from disque_mp.node import errors, memory
from tests import REFERENCE_DIR
from workers.replies import ERR_NOREPL, Error
from workers.shard import ERR_NOREPL_LEAVING, ERR_NOREPL_MEMORY, Shard
from workers.timers import timer_farther_resolution_ms

NODE = "739317b21b9046a3454204425426c55a12ccc07a"
T0 = 1_795_301_808_328
REF = REFERENCE_DIR


@pytest.mark.parametrize(
    ("used", "level"),
    [(0, 0), (749, 0), (750, 1), (949, 1), (950, 2), (1000, 2), (1001, 3), (10**9, 3)],
)
def test_level_thresholds(used: int, level: int) -> None:
    assert memory.level_of(used, 1000) == level


def test_level_zero_maxmemory_means_no_limit() -> None:
    assert memory.level_of(10**12, 0) == 0


def test_level_exact_for_big_budgets() -> None:
    gb = 1 << 30
    assert memory.level_of(gb * 3 // 4 - 1, gb) == 0
    assert memory.level_of(gb * 3 // 4, gb) == 1
    assert memory.level_of(gb, gb) == 2
    assert memory.level_of(gb + 1, gb) == 3


def test_human_matches_redis_style() -> None:
    assert memory.human(0) == "0B"
    assert memory.human(1023) == "1023B"
    assert memory.human(781488) == "763.17K"  # reference 02
    assert memory.human(547832832) == "522.45M"  # reference 02
    assert memory.human(1 << 30) == "1.00G"


def _add(s: Shard, queue: bytes, body: bytes, now: int, **kw: Any) -> Any:
    args: dict[str, Any] = dict(timeout_ms=0, replicate=None, delay_s=0, retry_s=None,
                                ttl_s=86400, maxlen=0, async_=False, token=0)
    args.update(kw)
    return s.op_addjob(queue, body, now_ms=now, **args)


def _estimate(s: Shard) -> int:
    info = s.info()
    return memory.shard_used_bytes(info["registered_jobs"], s.body_bytes, info["registered_queues"])


@pytest.mark.parametrize("body_len", [0, 100, 1000, 20000])
def test_estimate_tracks_tracemalloc(body_len: int) -> None:
    """Per added job the estimate is within 15 % of what the shard really allocates,
    and not below it by more than 5 % (the node must not run far past maxmemory).

    The shard is warmed first: its 4096 job-table bucket dicts are a fixed cost
    (about 1 MB once all exist, docs/memory.md), not a per-job one."""
    n = 3000
    s = Shard(NODE, 0, 1, b"seed", random.Random(1), T0)
    now = T0
    for _ in range(8 * 4096):
        _add(s, b"warm", b"", now)
    # The measured jobs' TTL timers in buckets of their own: a warm bucket's list (made
    # before tracing starts) reallocated by them would count whole, not by its growth.
    now += 2 * timer_farther_resolution_ms
    gc.collect()
    est_before = _estimate(s)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            now += i % 100 == 0
            body = (b"%08d" % i) * (body_len // 8) + b"x" * (body_len % 8)
            _add(s, b"q%d" % (i % 10), body, now)
        gc.collect()
        real = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    est = _estimate(s) - est_before
    assert s.body_bytes == n * body_len
    assert real * 0.95 <= est <= real * 1.15, (est, real, est / real)


def test_info_fields_follow_the_reference_order() -> None:
    path = REF / "02-lifecycle-pause-scan-info.txt"
    text = path.read_text()
    block = re.search(r"# Memory\\r\\n(.*?)'", text)
    assert block is not None
    ref_names = [f.split(":")[0] for f in block.group(1).split("\\r\\n") if f]
    parts = [{"rss": 1000, "mem": {"used": 300, "peak": 500, "level": 1, "evicted_jobs": 2,
                                   "evicted_queues": 1}},
             {"rss": 2000, "mem": {"used": 200, "peak": 200, "level": 0, "evicted_jobs": 3,
                                   "evicted_queues": 0}}]
    fields = memory.info_fields(1 << 20, "acks", parts)
    names = [k for k, _ in fields]
    assert names[: len(ref_names)] == ref_names
    got = dict(fields)
    assert got["used_memory"] == 500 and got["used_memory_rss"] == 3000
    assert got["used_memory_peak"] == 500 and got["mem_fragmentation_ratio"] == "6.00"
    assert got["memory_warning_level"] == 1 and got["memory_warning_level_min"] == 0
    assert got["evicted_jobs"] == 5
    assert got["maxmemory"] == 1 << 20 and got["maxmemory_human"] == "1.00M"


def test_info_fields_without_data() -> None:
    got = dict(memory.info_fields(0, "acks", [{"rss": 5, "mem": None}]))
    assert got["used_memory"] == 0 and got["mem_fragmentation_ratio"] == "0.00"


def test_shard_level_one_replicates_externally() -> None:
    s = Shard(NODE, 0, 1, b"seed", random.Random(1), T0)
    s.set_memory_level(memory.LEVEL_WARN)
    assert _add(s, b"q", b"x", T0) == ERR_NOREPL_MEMORY
    assert _add(s, b"q", b"x", T0, replicate=2) == ERR_NOREPL  # not the last copy missing
    # argument checks still come first, in Disque's order
    assert "RETRY set to 0" in str(_add(s, b"q", b"x", T0, retry_s=0, replicate=2))
    s.set_leaving(True)
    assert _add(s, b"q", b"x", T0) == ERR_NOREPL_LEAVING  # leaving wins the reason
    s.set_leaving(False)
    s.set_memory_level(0)
    reply = _add(s, b"q", b"x", T0)
    assert not isinstance(reply, Error) and s.op_qlen(b"q") == 1
    assert str(ERR_NOREPL_MEMORY).endswith("for the following reason: I'm out of memory")
    assert str(errors.ERR_OOM) == "OOM command not allowed when used memory > 'maxmemory'."


@pytest.mark.parametrize(
    ("used", "near"),
    [(0, False), (699, False), (700, True), (749, True), (750, False), (899, False),
     (900, True), (950, True), (960, True), (1000, True), (1001, False)],
)
def test_near_threshold(used: int, near: bool) -> None:
    assert memory.near_threshold(used, 1000) is near
    assert memory.near_threshold(used, 0) is False


@pytest.mark.parametrize("how", ["fastack", "ackjob", "deljob_queued", "ttl"])
def test_dead_jobs_release_their_bodies(how: str) -> None:
    """The estimate drops to 0 when jobs go; the memory must really go too, although
    stale timer/deque entries may keep the dead records for a while."""
    s = Shard(NODE, 0, 1, b"seed", random.Random(1), T0)
    now = T0
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        ids = []
        for i in range(300):
            now += i % 7 == 0
            ids.append(str(_add(s, b"big", b"%d" % i + b"x" * 20000, now, ttl_s=60)))
        full = tracemalloc.get_traced_memory()[0] - base
        if how in ("fastack", "ackjob"):
            got = s.op_take([b"big"], 300, False, now)
            assert len(got) == 300
            del got
            op = s.op_fastack if how == "fastack" else s.op_ackjob
            assert op(ids, now) == 300
        elif how == "deljob_queued":
            assert s.op_deljob(ids, now) == 300
        else:
            now += 61_000
            while (due := s.tick(now)) is not None and due <= now:
                pass
        assert s.info()["registered_jobs"] == 0 and s.body_bytes == 0
        gc.collect()
        left = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert full > 300 * 20000
    assert left < full * 0.1, (how, full, left)
