"""The /metrics histograms' bucket of a time (``workers.core.latency_bucket``): the
same answer as ``bisect_left`` over the bounds for every time at and around each
bound, and an acknowledged job counted in that bucket."""

from __future__ import annotations

import random
from bisect import bisect_left

from workers.core import latency_bounds_ms, latency_bucket
from workers.shard import Shard

NODE = "739317b21b9046a3454204425426c55a12ccc07a"
T0 = 1_795_301_808_328


def test_bucket_is_bisect_left_over_the_bounds() -> None:
    times = [-5, 0, 1, 10**9] + [b + d for b in latency_bounds_ms for d in (-1, 0, 1)]
    for ms in times:
        assert latency_bucket(ms) == bisect_left(latency_bounds_ms, ms), ms


def test_acked_jobs_land_in_their_processing_bucket() -> None:
    s = Shard(NODE, 0, 1, b"seed", random.Random(3), T0)
    took = [0, 5, 6, 250, 251, 3_600_000, 3_600_001]
    for ms in took:
        s.op_addjob(b"q", b"x", timeout_ms=0, replicate=None, delay_s=0, retry_s=None,
                    ttl_s=86400 * 2, maxlen=0, async_=False, token=0, now_ms=T0)
        [[_, job_id, _]] = s.op_take([b"q"], 1, False, T0)
        assert s.op_ackjob([job_id], T0 + ms) == 1
    counts = s.metrics(100, T0)["proc_counts"]
    want = [0] * (len(latency_bounds_ms) + 1)
    for ms in took:
        want[bisect_left(latency_bounds_ms, ms)] += 1
    assert counts == want
    assert s.metrics(100, T0)["proc_sum_ms"] == sum(took)
    s.check()
