"""The drain rule (disque_mp/node/drain.py): progress from INFO / HELLO, when a drain
is done, and when it must refuse to start."""

from __future__ import annotations

from bus.membership import priority_leaving, priority_ok, priority_unreachable
from disque_mp.node import drain

ME = "a" * 40


def facts(queued: int = 0, wait_repl: int = 0, registered: int = 0,
          priorities: tuple[int, ...] = (), leaving: bool = False) -> drain.Progress:
    nodes = [(ME, priority_ok)] + [(chr(ord("b") + i) * 40, p) for i, p in enumerate(priorities)]
    info = {"registered_jobs": str(registered), "queued_jobs": str(queued),
            "wait_repl_jobs": str(wait_repl)}
    return drain.progress(info, ME, nodes, leaving)


def test_only_other_reachable_nodes_that_are_not_leaving_count():
    p = facts(priorities=(priority_ok, priority_leaving, priority_unreachable, priority_ok))
    assert p.peers_ok == 2


def test_done_once_leaving_with_nothing_queued_or_waiting_for_copies():
    assert not facts(leaving=False).done
    assert not facts(queued=1, leaving=True).done
    assert not facts(wait_repl=1, leaving=True).done
    p = facts(registered=7, leaving=True)  # copies of other nodes' jobs are not waited for
    assert p.done and p.left == 0
    assert p.as_dict()["registered"] == 7
    assert p.line().startswith("jobs left: 0 (queued 0, waiting for copies 0); 7 jobs held")


def test_a_node_with_nothing_to_move_may_always_go():
    assert drain.refusal(facts(registered=3), repl_max=0) is None


def test_jobs_and_no_reachable_peer_not_leaving_are_refused():
    for priorities in ((), (priority_leaving,), (priority_unreachable,)):
        why = drain.refusal(facts(queued=2, priorities=priorities), repl_max=1)
        assert why is not None and "no other node is reachable and not leaving" in why
        assert "nothing changed" in why
    assert drain.refusal(facts(wait_repl=1), repl_max=2) is not None


def test_replicate_r_needs_r_minus_1_other_nodes():
    assert [drain.repl_needed(r) for r in (1, 2, 3, 5)] == [1, 1, 2, 4]
    two = facts(queued=5, priorities=(priority_ok, priority_ok))
    assert drain.refusal(two, repl_max=3) is None
    why = drain.refusal(two, repl_max=4)
    assert why is not None and "REPLICATE 4" in why and "need 3 other nodes" in why
    assert drain.refusal(facts(queued=5, priorities=(priority_ok,)), repl_max=2) is None


def test_the_highest_repl_of_scanned_jobs():
    assert drain.repl_of([]) == 0
    assert drain.repl_of([{"repl": 1}, {"repl": 3}, {"repl": 2}]) == 3


def test_timeout_text_says_what_is_left_and_that_the_node_stays_leaving():
    text = drain.timeout_text(facts(queued=4, leaving=True), 1)
    assert "drain timed out after 1 s" in text and "jobs left: 4" in text
    assert "stays LEAVING" in text
