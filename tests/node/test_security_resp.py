"""The request parser resumes a multibulk cut by a read (each byte parsed once,
byte-by-byte reads give the same commands) and holds the small bounds before AUTH."""

from __future__ import annotations

import random

from disque_mp.node.resp import RequestParser


def cmd(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def parser(buffer_max: int = 1 << 30) -> RequestParser:
    return RequestParser(512 << 20, 1 << 20, buffer_max)


def stream() -> tuple[bytes, list[list[bytes]]]:
    many = [b"%d" % i for i in range(300)]
    big = bytes(random.Random(3).randrange(256) for _ in range(70_000))
    want = [[b"ADDJOB", b"q", b"x" * 100, b"0"], [b"PING"], many, [b"ADDJOB", b"q", big, b"0"],
            [b"QLEN", b"q"], [b"a", b""]]
    data = cmd(*want[0]) + b"PING\r\n" + cmd(*many) + cmd(*want[3]) + b"*0\r\n" + cmd(*want[4]) \
        + b"*-1\r\n" + cmd(b"a", b"")
    return data, want


def feed_in(p: RequestParser, data: bytes, sizes: list[int]) -> list[list[bytes]]:
    out: list[list[bytes]] = []
    at = 0
    for size in sizes:
        cmds, err = p.feed(data[at : at + size])
        assert err is None
        out += cmds
        at += size
    assert at >= len(data)
    return out


def test_byte_by_byte_and_random_cuts_give_the_same_commands() -> None:
    data, want = stream()
    p = parser()
    assert feed_in(p, data, [1] * len(data)) == want
    assert not p.buffered()
    rng = random.Random(7)
    for _ in range(20):
        sizes = []
        while sum(sizes) < len(data):
            sizes.append(rng.choice((1, 2, 3, 7, 64, 1000, 5000)))
        assert feed_in(parser(), data, sizes) == want


def test_a_cut_multibulk_keeps_its_parsed_arguments() -> None:
    """The arguments before the cut are parsed once and kept; the tail buffered is
    only the argument that was cut."""
    p = parser()
    head = b"*1000000\r\n" + b"$1\r\nx\r\n" * 5000
    assert p.feed(head + b"$1\r") == ([], None)
    assert p._buf == b"$1\r" and p._args is not None and len(p._args) == 5000
    assert p.feed(b"\nx\r\n") == ([], None)
    assert p._buf == b"" and len(p._args) == 5001 and p.buffered()


def test_the_query_buffer_bound_counts_the_parsed_arguments() -> None:
    p = parser(buffer_max=4096)
    cmds, err = p.feed(b"*100000\r\n")
    for _ in range(1000):
        cmds, err = p.feed(b"$1\r\nx\r\n")
        if err:
            break
    assert err == "Protocol error: client query buffer over its limit"
    assert not p.buffered()
    assert p.feed(cmd(b"PING")) == ([[b"PING"]], None)  # a new stream is parsed again


def test_restricted_bounds_and_their_texts() -> None:
    p = parser()
    p.restrict(10, 16 * 1024)
    assert p.feed(b"*11\r\n") == ([], "Protocol error: unauthenticated multibulk length")
    p = parser()
    p.restrict(10, 16 * 1024)
    assert p.feed(b"*1\r\n$16385\r\n") == ([], "Protocol error: unauthenticated bulk length")
    p = parser()
    p.restrict(10, 16 * 1024)
    assert p.feed(cmd(*[b"a"] * 10)) == ([[b"a"] * 10], None)
    p.unrestrict()
    assert p.feed(cmd(*[b"a"] * 11)) == ([[b"a"] * 11], None)


def test_once_gives_one_command_at_a_time() -> None:
    p = parser()
    data = cmd(b"AUTH", b"pw") + b"PING\r\n" + cmd(b"QLEN", b"q")
    assert p.feed(data, once=True) == ([[b"AUTH", b"pw"]], None)
    assert p.buffered()
    assert p.feed(b"", once=True) == ([[b"PING"]], None)
    assert p.feed(b"") == ([[b"QLEN", b"q"]], None)
    assert not p.buffered()
