"""The edge's checks of job messages' node lists (ENQUEUE, SETACK): one match over
the joined list, with the same answers as a check per node ID."""

from __future__ import annotations

import pytest

from bus.messages import BadMessage, check_job
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
