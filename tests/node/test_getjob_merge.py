"""The merge of a GETJOB over several owners: what one shard holding every queue
answers (one job per queue per pass, left to right, up to COUNT), whatever way the
queues were split between the takes, and the rest as surplus by owner; the owners'
answers as they cross the mesh (``took_bytes``, ``Took``)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from bus.mesh import unpack_took
from disque_mp.node.getjob import (
    Plan,
    Took,
    encode_getjob,
    merge_by_place,
    part_of,
    pick_round_robin,
    share_of_held,
    take_share,
    took_bytes,
)
from disque_mp.node.resp import entry_resp


def one_shard(queues: list[bytes], jobs: dict[bytes, list[str]], count: int) -> list[Any]:
    left = {q: list(v) for q, v in jobs.items()}
    out: list[Any] = []
    while len(out) < count:
        before = len(out)
        for q in queues:
            if left.get(q):
                out.append([q, left[q].pop(0), b""])
                if len(out) >= count:
                    break
        if len(out) == before:
            break
    return out


def random_case(rng: random.Random) -> tuple[list[bytes], dict[bytes, list[str]], int, dict[bytes, int]]:
    """A GETJOB drawn at random: the queues it names (repeats allowed), the jobs each
    holds, its COUNT and each queue's owner among 3 workers."""
    names = [f"q{i}".encode() for i in range(rng.randint(1, 6))]
    queues = [rng.choice(names) for _ in range(rng.randint(1, 8))]
    jobs = {q: [f"{q.decode()}-{k}" for k in range(rng.randint(0, 4))] for q in names}
    count = rng.randint(1, 10)
    owner = {q: rng.randint(0, 2) for q in names}
    return queues, jobs, count, owner


def runs_of(queues: list[bytes], owner: dict[bytes, int]) -> list[tuple[int, list[bytes]]]:
    """The router's route of ``queues``: runs of consecutive queues of one owner."""
    runs: list[tuple[int, list[bytes]]] = []
    for q in queues:
        if runs and runs[-1][0] == owner[q]:
            runs[-1][1].append(q)
        else:
            runs.append((owner[q], [q]))
    return runs


def test_any_split_gives_one_shards_answer() -> None:
    rng = random.Random(7)
    for _ in range(300):
        queues, jobs, count, owner = random_case(rng)
        cut = rng.randint(0, len(queues))  # a group's queues taken in two parts
        state = {q: list(v) for q, v in jobs.items()}
        taken = []
        for part in (queues[:cut], queues[cut:]):
            for o in range(3):
                mine = [q for q in part if owner[q] == o]
                sub = {q: state[q] for q in set(mine)}
                got = one_shard(mine, sub, count)
                for e in got:
                    state[e[0]].remove(e[1])
                if got:
                    taken.append((o, [e[0] for e in got], got))
        chosen, surplus = pick_round_robin(queues, taken, count)
        assert chosen == one_shard(queues, jobs, count)
        back = [e for o, es in surplus.items() for e in es]
        assert all(owner[e[0]] == o for o, es in surplus.items() for e in es)
        assert sorted(e[1] for e in chosen + back) == sorted(e[1] for t in taken for e in t[2])


def test_surplus_keeps_each_queues_jobs_in_pop_order() -> None:
    """What goes back (RETURN) is, per owner, each of its queues' jobs left over in the
    order that owner popped them (queue by queue, in the order its take named them),
    whichever jobs the merge chose and however many each queue gave."""
    rng = random.Random(17)
    for _ in range(500):
        queues, jobs, count, owner = random_case(rng)
        taken = []
        for o in range(3):
            mine = [q for q in queues if owner[q] == o]
            got = one_shard(mine, {q: jobs[q] for q in set(mine)}, 10)
            if got:
                taken.append((o, [e[0] for e in got], got))
        chosen, surplus = pick_round_robin(queues, taken, count)
        ids = {e[1] for e in chosen}
        for o, names, got in taken:
            want = [e for q in dict.fromkeys(names) for e in got if e[0] == q and e[1] not in ids]
            assert surplus.get(o, []) == want


def test_take_share_covers_the_owners_part() -> None:
    """What an owner takes for a TAKE (``take_share``): never less than its part of the
    one-shard answer, whatever the others hold beyond their hints; exactly its part
    when the hints are the others' true lengths (no surplus)."""
    rng = random.Random(11)
    for _ in range(1000):
        queues, jobs, count, owner = random_case(rng)
        part = sum(1 for e in one_shard(queues, jobs, count) if owner[e[0]] == 0)
        own = [q for q in queues if owner[q] == 0]
        lengths = {q: len(jobs[q]) for q in own}
        first: dict[bytes, int] = {}
        exact, low = [], []
        for i, q in enumerate(queues):
            if owner[q] == 0:
                exact.append(-1)
                low.append(-1)
            elif q in first:  # a queue named again: where it was named first
                exact.append(-2 - first[q])
                low.append(-2 - first[q] if rng.random() < 0.5 else 0)
            else:
                first[q] = i
                exact.append(len(jobs[q]))
                low.append(rng.randint(0, len(jobs[q])))
        assert take_share(exact, own, lengths, count) == part
        assert take_share(low, own, lengths, count) >= part
        assert take_share(low, own, lengths, count) <= min(count, sum(lengths.values()))


def test_part_of_is_each_owners_part() -> None:
    """The coordinator's own part (``part_of``) from what every queue holds: exactly
    what the one-shard answer takes from those queues, repeats and empty queues too."""
    rng = random.Random(13)
    for _ in range(1000):
        queues, jobs, count, owner = random_case(rng)
        answer = one_shard(queues, jobs, count)
        sizes = {q: len(jobs[q]) for q in set(queues)}
        for o in range(3):
            mine = {q for q in queues if owner[q] == o}
            assert part_of(queues, sizes, mine, count) == sum(1 for e in answer if e[0] in mine)


def test_took_carries_each_job_as_one_shard_encodes_it() -> None:
    """A TAKE's answer (``took_bytes``, read back as ``Took``): each job's queue, its
    RESP entry, its ID, and the whole answer, the bytes ``encode_getjob`` gives for
    the same jobs; with and without what the queues held."""
    rng = random.Random(17)
    for _ in range(200):
        names = [f"q{i}".encode() for i in range(rng.randint(1, 5))]
        queues = [rng.choice(names) for _ in range(rng.randint(1, 6))]
        counters = rng.random() < 0.3
        entries: list[list[Any]] = []
        for k in range(rng.randint(0, 6)):
            entry: list[Any] = [rng.choice(queues), f"D-{k:08x}-{'A' * 24}-0001", rng.randbytes(rng.randint(0, 40))]
            if counters:
                entry += ["nacks", rng.randint(0, 3), "additional-deliveries", rng.randint(0, 3)]
            entries.append(entry)
        held = [rng.randint(0, 9) for _ in queues] if rng.random() < 0.5 else []
        blob = took_bytes(queues, held, entries)
        assert unpack_took(blob)[0] == held
        took = Took.of(1, queues, blob)
        assert took.names() == [e[0] for e in entries]
        assert took.parts() == [entry_resp(e) for e in entries]
        assert took.ids() == [e[1] for e in entries]
        if entries:
            assert took.reply() == encode_getjob(entries, counters, False)
            assert took.reply() == encode_getjob(entries, counters, True)


def test_a_malformed_take_answer_is_refused() -> None:
    blob = took_bytes([b"q"], [3], [[b"q", "D-00000000-" + "A" * 24 + "-0001", b"body"]])
    for bad in (blob[:-1], blob + b"x", blob[:6]):
        with pytest.raises(ValueError):
            unpack_took(bad)


def test_merge_by_place_gives_one_shards_answer() -> None:
    """The place-order merge (``merge_by_place``): our entries and the other owners'
    takes, each in its owner's pop order, give the bytes of the one-shard answer when
    every job taken is in it and no queue is named twice; else it leaves the answer to
    ``pick_round_robin`` (None), never a different one."""
    rng = random.Random(23)
    placed = 0
    for _ in range(1000):
        queues, jobs, count, owner = random_case(rng)
        if rng.random() < 0.7:
            queues = list(dict.fromkeys(queues))
        ids = {q: [f"D-{k:04x}{n:04x}-{'A' * 24}-0001" for k in range(len(v))]
               for n, (q, v) in enumerate(jobs.items())}
        take_count = count if rng.random() < 0.8 else 10
        plan = Plan(runs_of(queues, owner), 0)
        got: list[Any] = []
        taken: list[Took] = []
        for o in range(3):
            mine = plan.here if o == 0 else plan.remote.get(o, [])
            part = [[e[0], e[1], b"body-" + e[1].encode()] for e in one_shard(mine, {q: ids[q] for q in set(mine)}, take_count)]
            if o == 0:
                got = part
            elif part:
                taken.append(Took.of(o, mine, took_bytes(mine, [], [list(e) for e in part])))
        merged = merge_by_place(plan, got, taken, count)
        everyone = {q: ids[q] for q in set(queues)}
        want = [[e[0], e[1], b"body-" + e[1].encode()] for e in one_shard(queues, everyone, count)]
        total = len(got) + sum(len(t.lens) for t in taken)
        if len(set(queues)) == len(queues) and total <= count:
            assert merged is not None
        if merged is not None:
            placed += 1
            assert merged == encode_getjob(want, False, False) if want else merged == b"*0\r\n"
    assert placed > 300


def test_share_of_held_is_take_share() -> None:
    """The owner's share from the sums and the first pass (``share_of_held``, the list
    of what its queues held) is ``take_share``'s, repeats and all."""
    rng = random.Random(29)
    for _ in range(1000):
        queues, jobs, count, owner = random_case(rng)
        if rng.random() < 0.5:
            queues = list(dict.fromkeys(queues))
        own = [q for q in queues if owner[q] == 0]
        held = [len(jobs[q]) for q in own]
        first: dict[bytes, int] = {}
        hints = []
        for i, q in enumerate(queues):
            if owner[q] == 0:
                hints.append(-1)
            elif q in first:
                hints.append(-2 - first[q])
            else:
                first[q] = i
                hints.append(rng.randint(0, len(jobs[q])))
        lengths = {q: len(jobs[q]) for q in own}
        assert share_of_held(hints, own, held, count) == take_share(hints, own, lengths, count)


def test_plan_places_each_queue_with_its_owner() -> None:
    """A ``Plan``: our queues and each other owner's in the client's order, and for each
    place named its owner and its index in that owner's list."""
    rng = random.Random(31)
    for _ in range(300):
        queues, _, _, owner = random_case(rng)
        plan = Plan(runs_of(queues, owner), 0)
        assert plan.here == [q for q in queues if owner[q] == 0]
        for o in (1, 2):
            assert plan.remote.get(o, []) == [q for q in queues if owner[q] == o]
        for p, q in enumerate(queues):
            o = plan.owner_at[p]
            assert o == owner[q]
            assert (plan.here if o == 0 else plan.remote[o])[plan.index_at[p]] == q
            assert (plan.here_at if o == 0 else plan.remote_at[o])[plan.index_at[p]] == p
        assert plan.is_distinct() == (len(set(queues)) == len(queues))
