"""Argument parsing of the job/queue commands: values, defaults and error texts."""

from __future__ import annotations

import random
from typing import Any

import pytest

from disque_mp.node.commands import jobs as C
from disque_mp.node.commands.table import run_on_shard
from workers.replies import ERR_BADID, ERR_SYNTAX, NULL_ARRAY, Error, Status
from workers.shard import Shard

NODE = "739317b21b9046a3454204425426c55a12ccc07a"
T0 = 1_795_301_808_328
GOOD_ID = "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"


@pytest.fixture
def shard() -> Shard:
    return Shard(NODE, 0, 1, b"seed", random.Random(1), T0)


def run(shard: Shard, *words: str | bytes) -> Any:
    args = [w.encode() if isinstance(w, str) else w for w in words]
    return run_on_shard(shard, args[0].lower(), args[1:], 1, T0)


@pytest.mark.parametrize(
    ("raw", "value"),
    [(b"0", 0), (b"7", 7), (b"-12", -12), (b"9223372036854775807", (1 << 63) - 1),
     (b"-9223372036854775808", -(1 << 63))],
)
def test_parse_int_accepts(raw: bytes, value: int) -> None:
    assert C.parse_int(raw) == value


@pytest.mark.parametrize(
    "raw",
    [b"", b"-", b"+1", b" 1", b"1 ", b"01", b"-0", b"1.5", b"1e3", b"0x10", b"abc",
     b"9223372036854775808", b"-9223372036854775809", b"\xff", b"\xd9\xa3"],
)
def test_parse_int_rejects(raw: bytes) -> None:
    assert C.parse_int(raw) is None


def test_parse_int_agrees_with_redis_strict_form_at_every_length() -> None:
    """The hand-summed short form and the regex form answer alike around the bound
    between them (9 digits), with leading zeros, signs and every digit."""
    import re

    strict = re.compile(rb"\A(?:0|-?[1-9][0-9]{0,18})\Z")
    for text in ("0", "00", "7", "10", "999999999", "1000000000", "123456789", "012345678",
                 "-1", "-999999999", "4294967296", "1" * 19, "9" * 19, "1" * 20):
        raw = text.encode()
        want = int(raw) if strict.match(raw) and -(1 << 63) <= int(raw) < (1 << 63) else None
        assert C.parse_int(raw) == want, text


def test_addjob_options_parsed(shard: Shard) -> None:
    a = C.parse_addjob([b"q", b"b", b"100", b"REPLICATE", b"1", b"delay", b"5", b"Retry", b"7",
                        b"TTL", b"60", b"MAXLEN", b"3", b"ASYNC"])
    assert a == C.AddJobArgs(b"q", b"b", 100, 1, 5, 7, 60, 3, True)
    assert C.parse_addjob([b"q", b"b", b"0"]) == C.AddJobArgs(b"q", b"b", 0)


@pytest.mark.parametrize(
    ("words", "err"),
    [
        (["q", "body", "notanumber"], "ERR timeout is not an integer or out of range"),
        (["q", "body", "-1"], "ERR timeout is negative"),
        (["q", "body", "0", "BADOPT", "1"], "ERR syntax error"),
        (["q", "body", "0", "TTL"], "ERR syntax error"),  # option without its value
        (["q", "body", "0", "TTL", "0"], "ERR TTL must be a number > 0"),
        (["q", "body", "0", "TTL", "x"], "ERR TTL must be a number > 0"),
        (["q", "body", "0", "MAXLEN", "0"], "ERR MAXLEN must be a positive number"),
        (["q", "body", "0", "RETRY", "-1"], "ERR RETRY time must be a non negative number"),
        (["q", "body", "0", "DELAY", "-1"], "ERR Delay time must be a non negative number"),
        (["q", "body", "0", "REPLICATE", "0"], "ERR REPLICATE must be between 1 and 65535"),
        (["q", "body", "0", "REPLICATE", "65536"], "ERR REPLICATE must be between 1 and 65535"),
        # options are checked before the timeout, as in Disque
        (["q", "body", "x", "TTL", "0"], "ERR TTL must be a number > 0"),
        (["q", "body"], "ERR wrong number of arguments for 'addjob' command"),
    ],
)
def test_addjob_errors(shard: Shard, words: list[str], err: str) -> None:
    r = run(shard, "ADDJOB", *words)
    assert isinstance(r, Error) and r == err


def test_addjob_shard_level_errors(shard: Shard) -> None:
    assert run(shard, "ADDJOB", "q", "b", "0", "REPLICATE", "5").startswith("NOREPL ")
    assert run(shard, "ADDJOB", "q", "b", "0", "RETRY", "0", "REPLICATE", "2") == (
        "ERR With RETRY set to 0 please explicitly set  REPLICATE to 1 (at-most-once delivery)")
    assert run(shard, "ADDJOB", "q", "b", "0", "DELAY", "200", "TTL", "100") == (
        "ERR The specified DELAY is greater than TTL. Job refused since would never be delivered")


def test_addjob_success_and_binary_body(shard: Shard) -> None:
    body = bytes(range(256)) * 3
    jid = run(shard, "ADDJOB", b"q\x00\xff", body, "0")
    assert isinstance(jid, Status)
    assert shard.op_take([b"q\x00\xff"], 1, False, T0) == [[b"q\x00\xff", jid, body]]
    assert isinstance(run(shard, "ADDJOB", "q", "b", "0", "REPLICATE", "1", "RETRY", "0"), Status)


def test_getjob_parse() -> None:
    g = C.parse_getjob([b"NOHANG", b"TIMEOUT", b"100", b"COUNT", b"5", b"WITHCOUNTERS",
                        b"FROM", b"a", b"FROM", b"nohang"])
    assert g == C.GetJobArgs(True, 100, 5, True, [b"a", b"FROM", b"nohang"])
    assert C.parse_getjob([b"from", b"q"]) == C.GetJobArgs(False, 0, 1, False, [b"q"])


def test_getjob_parse_whole_command_any_case() -> None:
    """The router's fast path parses the whole command from index 1, with the same
    result as the general path for every spelling of the option words."""
    for words in ([b"NOHANG", b"COUNT", b"2", b"FROM", b"q"], [b"nohang", b"count", b"2", b"from", b"q"],
                  [b"NoHang", b"Count", b"2", b"From", b"q"]):
        assert C.parse_getjob([b"GETJOB", *words], 1) == C.parse_getjob(words) \
            == C.GetJobArgs(True, 0, 2, False, [b"q"])
    assert C.parse_getjob([b"getjob", b"FROM"], 1) == ERR_SYNTAX


def test_getjob_now_and_addjob_plain(shard: Shard) -> None:
    """The one non-blocking GETJOB and the one short ADDJOB both paths run."""
    g = C.parse_getjob([b"FROM", b"q"])
    assert isinstance(g, C.GetJobArgs)
    assert C.getjob_now(shard, g, T0) is None  # would block: the caller decides
    g.nohang = True
    assert C.getjob_now(shard, g, T0) is NULL_ARRAY
    assert C.addjob_plain(shard, b"q", b"b", b"x", 1, T0) == "ERR timeout is not an integer or out of range"
    jid = C.addjob_plain(shard, b"q", b"b", b"0", 2, T0)
    assert isinstance(jid, Status)
    assert C.getjob_now(shard, g, T0) == [[b"q", jid, b"b"]]


@pytest.mark.parametrize(
    ("words", "err"),
    [
        ([b"FROM"], "ERR syntax error"),
        ([b"NOHANG"], "ERR syntax error"),
        ([b"BOGUS", b"FROM", b"q"], "ERR syntax error"),
        ([b"TIMEOUT", b"x", b"FROM", b"q"], "ERR timeout is not an integer or out of range"),
        ([b"TIMEOUT", b"-5", b"FROM", b"q"], "ERR timeout is negative"),
        ([b"COUNT", b"0", b"FROM", b"q"], "ERR COUNT must be a number greater than zero"),
        ([b"COUNT", b"x", b"FROM", b"q"], "ERR value is not an integer or out of range"),
        ([b"TIMEOUT"], "ERR syntax error"),
    ],
)
def test_getjob_errors(words: list[bytes], err: str) -> None:
    assert C.parse_getjob(words) == err


def test_getjob_now_paths(shard: Shard) -> None:
    g = C.parse_getjob([b"NOHANG", b"FROM", b"q"])
    assert isinstance(g, C.GetJobArgs)
    assert C.getjob_now(shard, g, T0) is NULL_ARRAY
    g2 = C.parse_getjob([b"FROM", b"q"])
    assert isinstance(g2, C.GetJobArgs)
    assert C.getjob_now(shard, g2, T0) is None  # the client is to wait
    shard.op_block(2, g2.queues, g2.count, g2.withcounters, T0)
    jid = run(shard, "ADDJOB", "q", "x", "0")
    (wake,) = shard.take_effects()
    assert wake.token == 2 and wake.reply == [[b"q", jid, b"x"]]


def test_qscan_parse() -> None:
    assert C.parse_qscan([]) == C.QScan(0, 100, False, 0, 0, 0)
    assert C.parse_qscan([b"COUNT", b"10", b"MINLEN", b"1"]) == C.QScan(0, 10, False, 1, 0, 0)
    busy = C.limits.scan_count_max  # BUSYLOOP: as much as one call may do
    assert C.parse_qscan([b"0", b"BUSYLOOP"]) == C.QScan(0, busy, True, 0, 0, 0)
    assert C.parse_qscan([b"busyloop", b"42", b"maxlen", b"3", b"importrate", b"2"]) == (
        C.QScan(42, busy, True, 0, 3, 2))
    assert C.parse_qscan([b"x"]) == "ERR invalid cursor"
    assert C.parse_qscan([b"1", b"2"]) == ERR_SYNTAX
    assert C.parse_qscan([b"COUNT", b"x"]) == "ERR value is not an integer or out of range"
    assert C.parse_qscan([b"COUNT", b"0"]) == ERR_SYNTAX


def test_jscan_parse() -> None:
    assert C.parse_jscan([]) == C.JScan(0, 100, False, None, None, False)
    j = C.parse_jscan([b"0", b"BUSYLOOP", b"QUEUE", b"q4", b"REPLY", b"all"])
    assert j == C.JScan(0, C.limits.scan_count_max, True, b"q4", None, True)
    j = C.parse_jscan([b"STATE", b"queued", b"COUNT", b"5", b"STATE", b"ACKED", b"7"])
    assert isinstance(j, C.JScan) and j.states == {2, 3} and j.cursor == 7 and j.count == 5
    assert C.parse_jscan([b"STATE", b"bogus"]) == "ERR Invalid job state name"
    assert C.parse_jscan([b"REPLY", b"some"]) == ERR_SYNTAX
    assert C.parse_jscan([b"-1"]) == "ERR invalid cursor"


def test_ids_commands_validate_every_id_first(shard: Shard) -> None:
    jid = run(shard, "ADDJOB", "q", "x", "0")
    for cmd in ("ACKJOB", "FASTACK", "NACK", "ENQUEUE", "DEQUEUE", "DELJOB"):
        assert run(shard, cmd, str(jid), "notajobid") is ERR_BADID
    assert shard.op_qlen(b"q") == 1  # nothing was acted on
    assert run(shard, "SHOW", "badid") is ERR_BADID
    assert run(shard, "WORKING", "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a") is ERR_BADID
    assert run(shard, "ACKJOB") == 0


def test_ids_commands_reply_counts(shard: Shard) -> None:
    jid = str(run(shard, "ADDJOB", "q", "x", "0"))
    assert run(shard, "ACKJOB", GOOD_ID) == 0
    assert run(shard, "FASTACK", GOOD_ID) == 0
    assert run(shard, "NACK", GOOD_ID) == 0
    assert run(shard, "WORKING", GOOD_ID) == "NOJOB Job not known in the context of this node."
    assert run(shard, "SHOW", GOOD_ID) is None
    assert run(shard, "DEQUEUE", jid, jid) == 1
    assert run(shard, "ENQUEUE", jid) == 1
    assert run(shard, "WORKING", jid) == 300
    assert run(shard, "NACK", jid) == 1
    assert run(shard, "ACKJOB", jid, GOOD_ID) == 1


def test_queue_commands(shard: Shard) -> None:
    run(shard, "ADDJOB", "q", "x", "0")
    assert run(shard, "QLEN", "q") == 1
    assert run(shard, "QPEEK", "q", "x") == "ERR value is not an integer or out of range"
    assert len(run(shard, "QPEEK", "q", "-1")) == 1
    assert run(shard, "QSTAT", "nosuchqueue") is NULL_ARRAY
    assert run(shard, "PAUSE", "q3", "in") == Status("in")
    assert run(shard, "PAUSE", "q3", "bogus") == ERR_SYNTAX
    assert run(shard, "PAUSE", "q3", "IN", "bogus") == ERR_SYNTAX
    assert run(shard, "PAUSE", "q3", "STATE") == "in"  # the bad command changed nothing
    assert run(shard, "PAUSE", "q3") == "ERR wrong number of arguments for 'pause' command"
    assert run(shard, "QLEN") == "ERR wrong number of arguments for 'qlen' command"
    assert run(shard, "NOSUCH") == "ERR unknown command 'nosuch'"


def test_fuzz_never_raises(shard: Shard) -> None:
    """Random words into every command: an Error or a value, never an exception."""
    rng = random.Random(5)
    vocab = [b"0", b"1", b"-1", b"x", b"COUNT", b"TTL", b"DELAY", b"RETRY", b"REPLICATE",
             b"MAXLEN", b"ASYNC", b"FROM", b"q", GOOD_ID.encode(), b"99999999999999999999",
             b"in", b"out", b"state", b"", b"\x00"]
    names = [b"addjob", b"qlen", b"qpeek", b"qstat", b"pause", b"ackjob", b"fastack",
             b"nack", b"enqueue", b"dequeue", b"deljob", b"working", b"show"]
    for _ in range(3000):
        args = [rng.choice(vocab) for _ in range(rng.randrange(0, 8))]
        run_on_shard(shard, rng.choice(names), args, 1, T0)
        C.parse_getjob(args)
        C.parse_qscan(args)
        C.parse_jscan(args)
    shard.check()


def test_counts_are_clamped_to_the_configured_limits() -> None:
    from disque_mp.node.commands import jobs as cmd_jobs

    saved = (cmd_jobs.limits.getjob_count_max, cmd_jobs.limits.scan_count_max)
    try:
        cmd_jobs.limits.getjob_count_max, cmd_jobs.limits.scan_count_max = 7, 3
        g = cmd_jobs.parse_getjob([b"COUNT", b"9223372036854775807", b"FROM", b"q"])
        assert isinstance(g, cmd_jobs.GetJobArgs) and g.count == 7
        g = cmd_jobs.parse_getjob([b"COUNT", b"5", b"FROM", b"q"])
        assert isinstance(g, cmd_jobs.GetJobArgs) and g.count == 5
        for parse in (cmd_jobs.parse_qscan, cmd_jobs.parse_jscan):
            s = parse([b"COUNT", b"1000000"])
            assert not isinstance(s, cmd_jobs.Error) and s.count == 3
            s = parse([b"BUSYLOOP"])
            assert not isinstance(s, cmd_jobs.Error) and s.count == 3
    finally:
        cmd_jobs.limits.getjob_count_max, cmd_jobs.limits.scan_count_max = saved
