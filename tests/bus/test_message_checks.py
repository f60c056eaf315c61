"""The edge's checks of job messages' node lists (ENQUEUE, SETACK): one match over
the joined list, with the same answers as a check per node ID."""

from __future__ import annotations

import pytest

from bus.messages import BadMessage, check_job, check_jobs
from workers.ids import slot_of_job_id
from workers.messages import node_list_max

JOB_ID = "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"
A, B = "a" * 40, "0123456789abcdef" * 2 + "01234567"


def _setack(nodes: object) -> dict[str, object]:
    return {"k": "SETACK", "s": slot_of_job_id(JOB_ID), "m": {"j": JOB_ID, "m": 2, "d": nodes}}


@pytest.mark.parametrize("nodes", [[], [A], [A, B], [A] * node_list_max])
def test_well_formed_node_lists_pass(nodes: list[str]) -> None:
    kind, _, inner = check_job(_setack(nodes), [])
    assert kind == "SETACK" and inner["d"] == nodes


@pytest.mark.parametrize("nodes", [
    [A.upper()],  # node IDs are lowercase hex
    [A[:39]], [A + "0"],  # 40 digits, no more, no less
    [A, A[:20] + "g" + A[21:]],  # a non-hex digit in the second
    [A[:39] + "\u00e9"],  # 40 characters, not all ASCII
    [A, 7], [A, None], [[A]],  # not strings
    (A,), A, {"a": A},  # not a list
    [A] * (node_list_max + 1),  # over the bound
])
def test_bad_node_lists_are_refused(nodes: object) -> None:
    with pytest.raises(BadMessage, match="bad SETACK node list"):
        check_job(_setack(nodes), [])
    meta = {"k": "ENQUEUE", "s": slot_of_job_id(JOB_ID), "m": {"j": JOB_ID, "d": nodes}}
    with pytest.raises(BadMessage, match="bad ENQUEUE node list"):
        check_job(meta, [])


def test_a_job_id_checked_before_gets_the_same_answers() -> None:
    """The edge remembers the job IDs it found well formed (and their slots): a second
    message about the job gets the answers of the first, also when the memo was
    emptied for room, and a slot that disagrees is refused every time."""
    from workers import messages

    slot = slot_of_job_id(JOB_ID)
    messages._checked_job_ids.clear()
    for _ in range(2):
        assert check_job({"k": "DELJOB", "s": slot, "m": {"j": JOB_ID}}, [])[0] == "DELJOB"
        with pytest.raises(BadMessage, match="job ID and slot disagree"):
            check_job({"k": "GOTJOB", "s": (slot + 1) % 16384, "m": {"j": JOB_ID}}, [])
        with pytest.raises(BadMessage, match="unexpected bodies"):
            check_job({"k": "GOTJOB", "s": slot, "m": {"j": JOB_ID}}, [b"x"])
    assert messages._checked_job_ids == {JOB_ID: slot}
    bad = JOB_ID[:-1] + "!"
    for _ in range(2):  # a bad ID is never remembered
        with pytest.raises(BadMessage, match="bad job ID"):
            check_job({"k": "DELJOB", "s": slot, "m": {"j": bad}}, [])
    assert bad not in messages._checked_job_ids
    messages._checked_job_ids.clear()
    for i in range(messages.checked_job_ids_max):  # bounded: emptied when full
        messages._checked_job_ids[f"x{i}"] = 0
    check_job({"k": "DELJOB", "s": slot, "m": {"j": JOB_ID}}, [])
    assert messages._checked_job_ids == {JOB_ID: slot}


def test_a_job_batch_is_checked_whole_before_any_message_is_taken() -> None:
    slot = slot_of_job_id(JOB_ID)
    good = ["GOTJOB", slot, {"j": JOB_ID}, 0]
    repl = ["REPLJOB", 3, {}, 1]
    got = check_jobs({"b": [good, repl, good]}, [b"record"])
    assert [(k, s, b) for k, s, _, b in got] == [("GOTJOB", slot, []), ("REPLJOB", 3, [b"record"]),
                                                 ("GOTJOB", slot, [])]
    for meta, bodies in [
        ({"b": []}, []),  # empty
        ({"b": "x"}, []),
        ({}, []),
        ({"b": [good, ["GOTJOB", slot, {"j": "D-bad"}, 0]]}, []),  # one bad message: all refused
        ({"b": [repl]}, []),  # its body missing
        ({"b": [good]}, [b"extra"]),  # a body nobody claims
        ({"b": [["GOTJOB", slot, {"j": JOB_ID}, -1]]}, []),
        ({"b": [["GOTJOB", slot, {"j": JOB_ID}]]}, []),
        ({"b": [good] * 5000}, []),  # over the batch bound
    ]:
        with pytest.raises(BadMessage):
            check_jobs(meta, bodies)
