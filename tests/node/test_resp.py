"""RESP request parser (bounded, incremental) and reply encoder."""

from __future__ import annotations

import random

import hiredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque_mp.node.resp import RequestParser, encode, encode_jobs, split_inline
from workers.replies import NULL_ARRAY, Error, Status


def cmd(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def parser(bulk_max: int = 512 << 20, args_max: int = 1 << 20, buffer_max: int = 1 << 30) -> RequestParser:
    return RequestParser(bulk_max, args_max, buffer_max)


def feed_all(p: RequestParser, chunks: list[bytes]) -> tuple[list[list[bytes]], str | None]:
    out: list[list[bytes]] = []
    for chunk in chunks:
        cmds, err = p.feed(chunk)
        out += cmds
        if err:
            return out, err
    return out, None


def test_pipelined_and_byte_by_byte() -> None:
    data = cmd(b"ADDJOB", b"q", b"x" * 100, b"0") + b"PING\r\n" + cmd(b"QLEN", b"q") + b"*0\r\n*-1\r\n"
    want = [[b"ADDJOB", b"q", b"x" * 100, b"0"], [b"PING"], [b"QLEN", b"q"]]
    assert feed_all(parser(), [data]) == (want, None)
    p = parser()
    assert feed_all(p, [data[i : i + 1] for i in range(len(data))]) == (want, None)
    assert not p.buffered()


def test_big_bulk_in_pieces_is_joined_once() -> None:
    body = bytes(random.Random(1).randrange(256) for _ in range(300_000))
    data = cmd(b"ADDJOB", b"q", body, b"0")
    p = parser()
    chunks = [data[i : i + 4096] for i in range(0, len(data), 4096)]
    cmds, err = feed_all(p, chunks[:-1])
    assert cmds == [] and err is None and p.buffered()
    cmds, err = p.feed(chunks[-1])
    assert err is None and cmds == [[b"ADDJOB", b"q", body, b"0"]]


@pytest.mark.parametrize(("data", "error"), [
    (b"*1\r\n$abc\r\n", "Protocol error: invalid bulk length"),
    (b"*abc\r\n", "Protocol error: invalid multibulk length"),
    (b"*1\r\n:1\r\n", "Protocol error: expected '$', got ':'"),
    (b"*2\r\n$3\r\nabc\r\n$2000\r\n", "Protocol error: invalid bulk length"),
    (b"*200\r\n", "Protocol error: invalid multibulk length"),
    (b"x" * 70_000, "Protocol error: too big inline request"),
    (b"*" + b"1" * 70_000, "Protocol error: too big mbulk count string"),
    (b'SET "a\r\n', "Protocol error: unbalanced quotes in request"),
])
def test_errors(data: bytes, error: str) -> None:
    p = parser(bulk_max=1000, args_max=100)
    cmds, err = p.feed(b"PING\r\n" + data)
    assert cmds == [[b"PING"]] and err == error


def test_bounds_checked_before_the_data_arrives() -> None:
    p = parser(bulk_max=1000)
    assert p.feed(b"*1\r\n$1001\r\n") == ([], "Protocol error: invalid bulk length")
    p = parser(buffer_max=10_000)
    assert p.feed(b"*3\r\n$900\r\n" + b"x" * 902 + b"$900\r\n")[1] is None
    cmds, err = feed_all(p, [b"y" * 902, b"$9000\r\n", b"z" * 8500])
    assert err == "Protocol error: client query buffer over its limit"


def test_inline_split() -> None:
    assert split_inline(b"  ADDJOB  q \"a b\\n\" 'c d' ") == [b"ADDJOB", b"q", b"a b\n", b"c d"]
    assert split_inline(b"") == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=40), min_size=1, max_size=6), min_size=1, max_size=8),
       st.integers(min_value=1, max_value=50))
def test_any_split_gives_the_same_commands(commands: list[list[bytes]], step: int) -> None:
    data = b"".join(cmd(*c) for c in commands)
    got, err = feed_all(parser(), [data[i : i + step] for i in range(0, len(data), step)])
    assert err is None and got == commands


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_never_raises(data: bytes) -> None:
    p = parser(bulk_max=100, args_max=10, buffer_max=1000)
    cmds, err = p.feed(data)
    assert err is None or err.startswith("Protocol error: ")
    assert all(isinstance(a, bytes) for c in cmds for a in c)


def test_encode_matches_hiredis() -> None:
    value = [b"q", "D-x", 7, [Status("OK"), None], b"", NULL_ARRAY]
    data = encode(value)
    r = hiredis.Reader()
    r.feed(data)
    assert r.gets() == [b"q", b"D-x", 7, [b"OK", None], b"", None]
    assert encode(Error("ERR x")) == b"-ERR x\r\n"
    assert encode(None, resp3=True) == b"_\r\n" and encode(NULL_ARRAY, resp3=True) == b"_\r\n"
    assert encode(None) == b"$-1\r\n" and encode(NULL_ARRAY) == b"*-1\r\n"
    assert encode({"proto": 3}, resp3=True) == b"%1\r\n$5\r\nproto\r\n:3\r\n"
    assert encode({"proto": 2}) == b"*2\r\n$5\r\nproto\r\n:2\r\n"


@given(st.lists(st.tuples(st.binary(min_size=1, max_size=80), st.binary(max_size=2000),
                          st.booleans()), min_size=1, max_size=4))
@settings(max_examples=200, deadline=None)
def test_encode_jobs_matches_the_generic_encoder(items: list[tuple[bytes, bytes, bool]]) -> None:
    """GETJOB's fast encoder (one entry: cached queue header) gives the generic bytes."""
    entries: list[list[object]] = []
    for i, (queue, body, counters) in enumerate(items):
        job_id = f"D-0f0f0f0f-{i:024d}-0001"
        entries.append([queue, job_id, body, b"nacks", 0, b"additional-deliveries", 1] if counters
                       else [queue, job_id, body])
    assert encode_jobs(entries) == encode(entries)
    assert encode_jobs(entries) == encode(entries)  # second time from the header cache


def test_encode_jobs_of_one_queue_object_and_large_bodies() -> None:
    """Entries sharing their queue's name object (as a shard's deliveries do), the
    queue changing and coming back, bodies below and past the pre-built headers."""
    a, b = b"jobs", b"other"
    entries: list[list[object]] = [[q, f"D-0f0f0f0f-{i:024d}-0001", b"x" * size]
                                   for i, (q, size) in enumerate([(a, 0), (a, 1023), (a, 1024), (b, 5),
                                                                  (a, 70000), (a, 3)])]
    assert encode_jobs(entries) == encode(entries)


# Byte by byte: whatever the input (well-formed commands, inline ones, garbage
# spliced in), feeding it one byte at a time gives the same commands and the same
# error as feeding it at once, only protocol errors come out, and the buffer bound
# holds at every step.
_piece = st.one_of(
    st.lists(st.binary(max_size=30), min_size=1, max_size=5).map(lambda a: cmd(*a)),
    st.lists(st.text(alphabet="abcXYZ 019\"'\\", max_size=20), max_size=4)
    .map(lambda words: " ".join(words).encode() + b"\r\n"),
    st.binary(max_size=40),
    st.sampled_from([b"*", b"$", b"*-1\r\n", b"*0\r\n", b"$-1\r\n", b"*2\r\n$3\r\n", b"\r\n",
                     b"*99999999999\r\n", b"$99999999999\r\n", b"*1\r\n$5\r\nab", b"\n",
                     b"_\r\n", b"~1\r\n", b">0\r\n", b"|0\r\n", b"#f\r\n", b":0\r\n",
                     b"*1\r\n+PING\r\n", b"*1\r\n$03\r\nabc\r\n", b"*1\r\n:1\r\n",
                     b"*2\r\n$1\r\na\r\n$-1\r\n", b"~1\r\n$1\r\na\r\n"]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_piece, max_size=8))
def test_byte_by_byte_fuzz_matches_one_feed(pieces: list[bytes]) -> None:
    data = b"".join(pieces)
    whole, whole_err = parser(bulk_max=64, args_max=8, buffer_max=256).feed(data)
    p = parser(bulk_max=64, args_max=8, buffer_max=256)
    got, err = feed_all(p, [data[i : i + 1] for i in range(len(data))])
    assert (got, err) == (whole, whole_err)
    assert err is None or err.startswith("Protocol error: ")
    assert all(len(c) <= 8 and all(len(a) <= 64 for a in c) for c in got)


@pytest.mark.parametrize("inline", [b"_", b":0", b"#f", b",0", b"$-1", b"%0", b"~0", b">0", b"|0",
                                    b"*-1"])
def test_inline_text_after_a_multibulk_in_one_read_is_never_swallowed(inline: bytes) -> None:
    """The hiredis fast path read such lines as RESP3 values (null, 0, false...) and
    dropped them: the client got fewer replies than it sent commands."""
    for tail in (cmd(b"PING"), b""):
        cmds, err = parser().feed(cmd(b"PING") + inline + b"\r\n" + tail)
        want = [[b"PING"]] + ([] if inline == b"*-1" else [[inline]]) + ([[b"PING"]] if tail else [])
        assert (cmds, err) == (want, None), tail


@pytest.mark.parametrize("data", [
    cmd(b"PING") + b"*1\r\n+PING\r\n",  # a simple string where a bulk belongs
    b"*1\r\n$03\r\nabc\r\n" + cmd(b"PING"),  # a padded bulk length
    cmd(b"PING") + b"~1\r\n$4\r\nPING\r\n",  # a RESP3 set hiredis reads as a list
    cmd(b"PING") + b">1\r\n$4\r\nPING\r\n",  # a push, the same
    cmd(b"PING") + b"*2\r\n$4\r\nPING",  # a command cut by the read
    cmd(b"PING") + b"*2\r\n",  # only the header of the next one
    b"*1\r\n:1\r\n",  # an integer element
    # nested arrays (4 bytes over the sum each) cancelled by simple strings (3 under)
    b"*7\r\n" + b"*1\r\n$1\r\na\r\n" * 3 + b"+x\r\n" * 4,
    # padded lengths (1 byte over each) cancelled by a simple string (3 under)
    b"*4\r\n" + b"$01\r\na\r\n" * 3 + b"+x\r\n",
    b"*1\r\n$1\r\naXY",  # a bulk not followed by CRLF
    cmd(b"ADDJOB", b"q", b"x" * 12345, b"0") + cmd(b"PING") * 3,
])
def test_the_hiredis_path_agrees_with_the_exact_parser(data: bytes) -> None:
    """The fast path accepts a read only when it held exactly whole multibulks of
    bulk strings; whatever else it is given, its answer is the exact parser's."""
    fast = parser()
    exact = parser()
    assert fast.feed(data) == exact._feed_python(data)
    assert fast.feed(cmd(b"PING")) == exact.feed(cmd(b"PING"))  # and the stream goes on alike


def test_an_inline_argument_is_bounded_by_the_bulk_limit_too() -> None:
    """proto-max-bulk-len below an inline line's 64 KB applies to inline arguments."""
    cmds, err = parser(bulk_max=64, args_max=8, buffer_max=256).feed(b"\x00" * 70 + b"\r\n")
    assert (cmds, err) == ([], "Protocol error: invalid bulk length")
    cmds, err = parser(bulk_max=64, args_max=8, buffer_max=256).feed(b"a" * 64 + b"\r\n")
    assert (cmds, err) == ([[b"a" * 64]], None)
