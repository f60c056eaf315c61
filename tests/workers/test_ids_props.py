"""The job ID's checks against their first forms (a regex, the base64 decoder), kept
here as oracles: the table-driven ``is_valid_job_id``, ``slot_of_valid_id`` and
``slot_of_job_id`` (workers/ids.py) give the same answer for every input, well
formed or not (padding, non-ASCII, wrong lengths, a byte off anywhere)."""

from __future__ import annotations

import binascii
import itertools
import random
import re
import string
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from workers.ids import (
    SLOTS,
    JobIdGen,
    is_valid_job_id,
    owner_of_job_id,
    slot_of_job_id,
    slot_of_valid_id,
)

_ID_RE = re.compile(rb"\AD-[0-9a-fA-F]{8}-[A-Za-z0-9+/]{24}-[0-9a-fA-F]{4}\Z")
B64 = string.ascii_letters + string.digits + "+/"
HEX = "0123456789abcdefABCDEF"
# characters next to the alphabets' edges, padding, separators and a few beyond ASCII
ODD = "=-_.:!@ \x00\x7f\x80\xff\xe9\u0100\u20ac\U0001f600" + "Gg" + B64[:3]


def old_is_valid(job_id: bytes | str) -> bool:
    raw = job_id.encode() if isinstance(job_id, str) else job_id
    return len(raw) == 40 and _ID_RE.match(raw) is not None


def old_slot(job_id: str) -> int:
    try:
        raw = binascii.a2b_base64(job_id[11:35], strict_mode=True)
    except binascii.Error:
        return 0
    return int.from_bytes(raw[:2], "big") % SLOTS


def outcome(fn: Callable[[Any], Any], arg: Any) -> Any:
    """The value, or the exception's type (the decoder refuses non-ASCII text)."""
    try:
        return fn(arg)
    except Exception as exc:  # noqa: BLE001 - the type is what is compared
        return type(exc)


def well_formed(rnd: random.Random) -> str:
    def pick(chars: str, n: int) -> str:
        return "".join(rnd.choice(chars) for _ in range(n))

    if rnd.random() < 0.5:
        return JobIdGen("ab" * 20, rnd.randbytes(4)).make(rnd.randrange(SLOTS), rnd.randrange(10**7),
                                                         rnd.randrange(3))
    return f"D-{pick(HEX, 8)}-{pick(B64, 24)}-{pick(HEX, 4)}"


def malformed(rnd: random.Random) -> str:
    """A good ID with one to four characters replaced, cut or added (mostly malformed,
    sometimes still good: a base64 character for another), the base64 part padded or
    cut short (the decoder's edge cases), or any text."""
    kind = rnd.randrange(4)
    if kind == 3:
        return "".join(rnd.choice(ODD + B64 + HEX) for _ in range(rnd.randrange(49)))
    if kind == 2:
        part = "".join(rnd.choice(B64 + "==") for _ in range(rnd.randrange(27)))
        return "D-0123abcd-" + part + "".join(rnd.choice("-0a") for _ in range(rnd.randrange(6)))
    s = well_formed(rnd)
    for _ in range(rnd.randrange(1, 5)):
        at, ch, how = rnd.randrange(len(s) + 1), rnd.choice(ODD + HEX), rnd.randrange(3)
        if how == 0:
            s = s[:at] + ch + s[at + 1:]
        elif how == 1:
            s = s[:at] + s[at + 1:]
        else:
            s = s[:at] + ch + s[at:]
    return s


def cases(seed: int, n: int) -> Iterator[str]:
    rnd = random.Random(seed)
    for _ in range(n):
        yield well_formed(rnd) if rnd.random() < 0.3 else malformed(rnd)


@pytest.mark.parametrize("seed", [1, 2])
def test_slot_of_job_id_and_the_check_are_the_old_ones_for_every_string(seed: int) -> None:
    for job_id in cases(seed, 20000):
        assert outcome(slot_of_job_id, job_id) == outcome(old_slot, job_id), (seed, job_id)
        assert outcome(is_valid_job_id, job_id) == outcome(old_is_valid, job_id), (seed, job_id)
        if outcome(old_slot, job_id) is not ValueError:
            assert owner_of_job_id(job_id, 3) == old_slot(job_id) % 3, (seed, job_id)


@pytest.mark.parametrize("seed", [1, 2])
def test_slot_of_valid_id_checks_as_the_regex_and_finds_the_decoders_slot(seed: int) -> None:
    rnd = random.Random(seed)
    texts = (job_id.encode("utf-8", "surrogatepass") for job_id in cases(seed, 20000))
    for raw in itertools.chain(texts, (rnd.randbytes(rnd.randrange(49)) for _ in range(5000))):
        valid = old_is_valid(raw)
        assert is_valid_job_id(raw) == valid, (seed, raw)
        assert slot_of_valid_id(raw) == (old_slot(raw.decode()) if valid else -1), (seed, raw)


def test_every_slot_round_trips_through_both_forms() -> None:
    gen = JobIdGen("ab" * 20, b"s")
    for slot in range(SLOTS):
        jid = gen.make(slot, 3600, slot % 2)
        assert slot_of_job_id(jid) == slot_of_valid_id(jid.encode()) == old_slot(jid) == slot


def test_minted_ids_carry_the_slot_in_their_decoded_bytes_and_never_repeat() -> None:
    """Over several blocks of the generator: each ID is well formed, its base64 part
    decodes strictly to 18 bytes whose first 2 are the slot, none repeats, the same
    seed mints the same IDs and another seed others; the suffix's parity says RETRY."""
    gen, twin, other = JobIdGen("ab" * 20, b"seed"), JobIdGen("ab" * 20, b"seed"), JobIdGen("ab" * 20, b"deed")
    rnd = random.Random(7)
    seen: set[str] = set()
    for n in range(3150):
        slot, retry = rnd.randrange(SLOTS), n % 3
        jid = gen.make(slot, 3600, retry)
        assert jid == twin.make(slot, 3600, retry)
        assert jid != other.make(slot, 3600, retry)
        assert old_is_valid(jid) and jid.startswith("D-abababab-"), jid
        raw = binascii.a2b_base64(jid[11:35], strict_mode=True)
        assert len(raw) == 18 and int.from_bytes(raw[:2], "big") == slot, jid
        assert int(jid[36:], 16) % 2 == (1 if retry else 0), jid
        assert jid not in seen
        seen.add(jid)
