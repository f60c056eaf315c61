"""Job IDs and slots (workers/ids.py): shape, slot round trip, TTL field parity."""

from __future__ import annotations

from workers.ids import (
    JOB_ID_LEN,
    SLOTS,
    JobIdGen,
    is_at_most_once_id,
    is_valid_job_id,
    owner_of_job_id,
    owner_of_queue,
    slot_of,
    slot_of_job_id,
    ttl_minutes_field,
)

NODE = "739317b21b9046a3454204425426c55a12ccc07a"


def test_shape_and_prefix() -> None:
    gen = JobIdGen(NODE, b"seed")
    jid = gen.make(123, 86400, 300)
    assert len(jid) == JOB_ID_LEN and jid.startswith("D-739317b2-") and jid[35] == "-"
    assert is_valid_job_id(jid) and is_valid_job_id(jid.encode())


def test_slot_round_trip_every_slot_sample() -> None:
    gen = JobIdGen(NODE, b"seed")
    for slot in (0, 1, 255, 256, 8191, SLOTS - 1):
        assert slot_of_job_id(gen.make(slot, 60, 1)) == slot
    for q in (b"q", b"queue:1", b"\x00", b"x" * 1000):
        s = slot_of(q)
        assert 0 <= s < SLOTS
        assert owner_of_queue(q, 3) == s % 3
        assert owner_of_job_id(gen.make(s, 60, 1), 3) == s % 3


def test_ids_unique_and_deterministic() -> None:
    a = [JobIdGen(NODE, b"s").make(1, 60, 1) for _ in range(2)]
    assert a[0] == a[1]  # same seed, same counter: same ID
    gen = JobIdGen(NODE, b"s")
    ids = {gen.make(1, 60, 1) for _ in range(2000)}
    assert len(ids) == 2000


def test_ttl_field_parity() -> None:
    assert ttl_minutes_field(86400, 300) == 0x05A1
    assert ttl_minutes_field(86400, 0) == 0x05A0
    assert ttl_minutes_field(100, 10) == 0x0001
    assert ttl_minutes_field(3600, 30) == 0x003D
    assert ttl_minutes_field(10**9, 1) == 0xFFFF
    gen = JobIdGen(NODE, b"s")
    assert is_at_most_once_id(gen.make(0, 86400, 0))
    assert not is_at_most_once_id(gen.make(0, 86400, 5))


def test_invalid_ids() -> None:
    good = "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"
    assert is_valid_job_id(good)
    for bad in ("", "notajobid", good[:-1], good + "0", "X" + good[1:], good.replace("-05a1", "_05a1"),
                good.replace("dcb833cf", "dcb833cg"), good.replace("8YL1", "8Y!1")):
        assert not is_valid_job_id(bad), bad
    assert not is_valid_job_id(b"\xff" * 40)
