"""The client's argument building for the extensions (docs/extensions.md); the
methods against a real node are in tests/node/test_extensions.py."""

from __future__ import annotations

from disque_mp.client import core

JID = "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"


def test_nack_args() -> None:
    assert core.nack_args([JID], None) == ["NACK", JID]
    assert core.nack_args([JID, JID], 30) == ["NACK", JID, JID, "DELAY", 30]
    assert core.nack_args([JID], 0) == ["NACK", JID, "DELAY", 0]


def test_addjob_maxdeliver() -> None:
    assert core.addjob_args("q", b"b", 0, maxdeliver=5)[-2:] == ["MAXDELIVER", 5]
    assert "MAXDELIVER" not in core.addjob_args("q", b"b", 0)


def test_waitjob_and_delqueue_args() -> None:
    assert core.waitjob_args([JID], None) == ["WAITJOB", JID]
    assert core.waitjob_args([JID], 250) == ["WAITJOB", JID, "TIMEOUT", 250]
    assert core.delqueue_args("q", False) == ["DELQUEUE", "q"]
    assert core.delqueue_args(b"q", True) == ["DELQUEUE", b"q", "LOCAL"]


def test_nack_with_delay_goes_to_the_main_connection() -> None:
    """The trailing option is no job ID: the node splits the IDs itself."""
    assert core.owner_of_command(["NACK", JID, "DELAY", 5], 2) is None
    assert core.owner_of_command(["NACK", JID], 2) is not None
