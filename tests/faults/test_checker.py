"""The history checker on small hand-made histories: it must see every kind of
violation (a checker that passes everything would make the fault runs worthless)."""

from __future__ import annotations

from typing import Any

from tests.faults.history import check

RUN = "abc123"


def _enq(value: str, type_: str, t0: float = 1.0) -> dict[str, Any]:
    return {"p": "p0", "n": 0, "f": "enqueue", "type": type_, "t0": t0, "t1": t0 + 0.01,
            "v": value, "id": "D-x"}


def _deq(values: list[str], t0: float = 5.0, type_: str = "ok") -> dict[str, Any]:
    return {"p": "c0", "n": 1, "f": "dequeue", "type": type_, "t0": t0, "t1": t0 + 0.01,
            "v": [[v, "D-x"] for v in values]}


def test_a_clean_history_is_valid() -> None:
    ops = [_enq(f"{RUN}:r2:0:1", "ok"), _enq(f"{RUN}:r0:0:4", "ok"),
           _enq(f"{RUN}:r2:0:2", "fail"), _enq(f"{RUN}:r2:0:3", "info"),
           _deq([f"{RUN}:r2:0:1", f"{RUN}:r0:0:4"])]
    res = check(ops, [], RUN)
    assert res["valid"], res["problems"]
    assert res["r2"]["ok"] == 1 and res["r2"]["fail"] == 1 and res["r2"]["info"] == 1
    assert res["r2"]["lost"] == [] and res["unexpected"] == []


def test_lost_unexpected_and_duplicates_are_found() -> None:
    ops = [_enq(f"{RUN}:r2:0:1", "ok"), _enq(f"{RUN}:r2:0:2", "ok"),
           _enq(f"{RUN}:r2:0:3", "fail"), _enq(f"{RUN}:r0:0:4", "ok"),
           _deq([f"{RUN}:r2:0:2", f"{RUN}:r2:0:2", f"{RUN}:r2:0:3", "other:r2:0:9",
                 f"{RUN}:r0:0:4", f"{RUN}:r0:0:4"])]
    res = check(ops, [], RUN)
    assert not res["valid"]
    assert res["r2"]["lost"] == [f"{RUN}:r2:0:1"]
    assert res["unexpected"] == sorted([f"{RUN}:r2:0:3", "other:r2:0:9"])
    assert res["r2"]["duplicated"] == 1 and res["r2"]["extra_deliveries"] == 1
    assert res["r0"]["duplicated"] == 1
    assert len(res["problems"]) == 3  # r2 lost, unexpected, r0 duplicated


def test_one_value_under_two_job_ids_is_a_problem() -> None:
    value = f"{RUN}:r2:0:1"
    deq = _deq([value, value])
    deq["v"][1][1] = "D-y"
    res = check([_enq(value, "ok"), deq], [], RUN)
    assert res["values_with_several_ids"] == [value]
    assert not res["valid"]


def test_a_lost_at_most_once_value_needs_a_fault_after_it() -> None:
    early, late = f"{RUN}:r0:0:4", f"{RUN}:r0:0:8"
    ops = [_enq(early, "ok", t0=1.0), _enq(late, "ok", t0=20.0)]
    faults = [{"kind": "isolate", "targets": [[0], [1, 2]], "t0": 5.0, "t1": 15.0}]
    res = check(ops, faults, RUN)
    assert res["r0"]["lost"] == [early, late]
    assert res["r0"]["lost_unexplained"] == [late]
    assert not res["valid"]
    # a GETJOB whose reply was lost after it explains the late one too
    res = check([*ops, _deq([], t0=21.0, type_="info")], faults, RUN)
    assert res["valid"], res["problems"]


def _ack(ids: list[str], t0: float, type_: str = "ok") -> dict[str, Any]:
    return {"p": "c0", "n": 1, "f": "ack", "type": type_, "t0": t0, "t1": t0 + 0.01,
            "ids": ids, "acked": len(ids)}


def test_a_delivery_after_an_answered_ack_needs_a_fault_at_the_ack() -> None:
    value = f"{RUN}:r2:0:1"
    ops = [_enq(value, "ok"), _deq([value], t0=5.0), _ack(["D-x"], t0=6.0),
           _deq([value], t0=9.0)]
    res = check(ops, [], RUN)
    assert res["after_ack"] == {"jobs": 1, "explained": [], "unexplained": ["D-x"]}
    assert not res["valid"]
    # a partition open while the ACK ran explains it
    faults = [{"kind": "isolate", "targets": [[0], [1, 2]], "t0": 5.5, "t1": 7.0}]
    res = check(ops, faults, RUN)
    assert res["after_ack"]["explained"] == ["D-x"] and res["valid"], res["problems"]
    # one healed long before does not; an ACK whose reply was lost is not answered
    faults = [{"kind": "isolate", "targets": [[0], [1, 2]], "t0": 0.0, "t1": 6.0 - 20.0}]
    assert not check(ops, faults, RUN)["valid"]
    ops[2] = _ack(["D-x"], t0=6.0, type_="info")
    res = check(ops, [], RUN)
    assert res["after_ack"]["jobs"] == 0 and res["valid"], res["problems"]
