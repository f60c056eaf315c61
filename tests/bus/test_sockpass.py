"""bus/sockpass.py: a real socket moved between two SocketPass instances in one event
loop, and the datagrams its receive path must drop (closing what they carried)."""

from __future__ import annotations

import array
import asyncio
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from bus import auth, peercred
from bus.datalink import FDPASS_PURPOSE
from bus.mesh import HANDOFF_PURPOSE
from bus.sockpass import SocketPass, socket_name

STATE_MAX = 1024
PURPOSE = "test.sockpass.{index}"

Received = list[tuple[socket.socket, dict[str, Any]]]
Scenario = Callable[[SocketPass, SocketPass, Received, asyncio.Queue[None]], Awaitable[None]]


def _run(scenario: Scenario) -> Received:
    """Workers 0 and 1 of a node of its own (a random ID: names are per node),
    ``scenario(sender, receiver, received, arrivals)`` in one event loop."""
    received: Received = []

    async def main() -> None:
        arrivals: asyncio.Queue[None] = asyncio.Queue()

        def on_socket(sock: socket.socket, state: dict[str, Any]) -> None:
            received.append((sock, state))
            arrivals.put_nowait(None)

        node_id = os.urandom(20).hex()
        sender = SocketPass(7711, node_id, 0, PURPOSE, on_socket, STATE_MAX)
        receiver = SocketPass(7711, node_id, 1, PURPOSE, on_socket, STATE_MAX)
        try:
            await scenario(sender, receiver, received, arrivals)
        finally:
            sender.close()
            receiver.close()

    asyncio.run(main())
    return received


async def _arrival(arrivals: asyncio.Queue[None]) -> None:
    await asyncio.wait_for(arrivals.get(), 5)


def _raw_send(to: SocketPass, data: bytes, fds: list[int]) -> None:
    """A datagram to ``to`` as any local process could send it."""
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendmsg([data], anc, 0, to.name)


def _closed_by_receiver(mine: socket.socket) -> bool:
    """True when the other end of ``mine``'s pair is closed everywhere (EOF)."""
    mine.settimeout(5)
    return mine.recv(16) == b""


def test_names_of_both_uses_live_in_the_private_directory() -> None:
    node_id = "ab" * 20
    where = peercred.socket_dir()
    st = os.stat(where)
    assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
    assert socket_name(7711, node_id, 3, HANDOFF_PURPOSE) == f"{where}/7711.{node_id[:16]}.3.fd"
    assert socket_name(7711, node_id, 3, FDPASS_PURPOSE) == \
        f"{where}/7711.{node_id[:16]}.cluster.fd.3"


def test_a_socket_and_its_state_arrive_and_work() -> None:
    mine, theirs = socket.socketpair()
    state = {"id": "n" * 40, "resp": 3, "auth": [1, 2]}

    async def scenario(sender: SocketPass, receiver: SocketPass, received: Received,
                       arrivals: asyncio.Queue[None]) -> None:
        assert sender.give(1, theirs.fileno(), state)
        theirs.close()  # ours only: the descriptor in flight keeps the connection
        await _arrival(arrivals)

    received = _run(scenario)
    assert len(received) == 1
    sock, got = received[0]
    assert got == state
    with mine, sock:
        sock.setblocking(True)
        sock.settimeout(5)
        mine.settimeout(5)
        mine.sendall(b"ping")
        assert sock.recv(16) == b"ping"
        sock.sendall(b"pong")
        assert mine.recv(16) == b"pong"


def test_an_oversize_state_is_refused_on_both_ends() -> None:
    mine, theirs = socket.socketpair()
    big = {"x": "y" * STATE_MAX}

    async def scenario(sender: SocketPass, receiver: SocketPass, received: Received,
                       arrivals: asyncio.Queue[None]) -> None:
        assert not sender.give(1, theirs.fileno(), big)  # the sender keeps it
        assert theirs.fileno() != -1
        # a sender that does not check: the datagram is cut, the descriptor closed
        _raw_send(receiver, orjson.dumps(big), [theirs.fileno()])
        theirs.close()
        other, spare = socket.socketpair()
        with other, spare:
            assert sender.give(1, spare.fileno(), {})  # the reader is still there
            await _arrival(arrivals)

    received = _run(scenario)
    assert [state for _, state in received] == [{}]  # only the good one
    received[0][0].close()
    with mine:
        assert _closed_by_receiver(mine)


def test_bad_datagrams_are_dropped_and_their_descriptors_closed() -> None:
    kept, kept_far = socket.socketpair()
    extra, extra_far = socket.socketpair()
    bad_json, bad_json_far = socket.socketpair()
    not_object, not_object_far = socket.socketpair()
    refused_before = auth.STATS["local_refused"]

    async def scenario(sender: SocketPass, receiver: SocketPass, received: Received,
                       arrivals: asyncio.Queue[None]) -> None:
        _raw_send(receiver, b'{"no": "descriptor"}', [])
        _raw_send(receiver, b"not json", [bad_json_far.fileno()])
        _raw_send(receiver, b"[1, 2]", [not_object_far.fileno()])
        # two descriptors in one datagram: the first is taken, the extra one closed
        _raw_send(receiver, b'{"n": 2}', [kept_far.fileno(), extra_far.fileno()])
        for s in (bad_json_far, not_object_far, kept_far, extra_far):
            s.close()
        await _arrival(arrivals)
        await asyncio.sleep(0.05)  # anything that would wrongly follow
        assert arrivals.empty()

    received = _run(scenario)
    assert [state for _, state in received] == [{"n": 2}]
    assert auth.STATS["local_refused"] == refused_before  # all from our own user
    sock, _ = received[0]
    with sock, kept:
        sock.settimeout(5)
        kept.sendall(b"x")
        assert sock.recv(1) == b"x"
    for mine in (extra, bad_json, not_object):
        with mine:
            assert _closed_by_receiver(mine)


def test_give_to_a_worker_that_is_not_there() -> None:
    mine, theirs = socket.socketpair()

    async def scenario(sender: SocketPass, receiver: SocketPass, received: Received,
                       arrivals: asyncio.Queue[None]) -> None:
        assert not sender.give(7, theirs.fileno(), {})

    with mine, theirs:
        assert _run(scenario) == []


def test_a_second_socket_on_the_same_name_fails_and_leaks_nothing() -> None:
    async def scenario(sender: SocketPass, receiver: SocketPass, received: Received,
                       arrivals: asyncio.Queue[None]) -> None:
        before = len(os.listdir("/proc/self/fd"))
        with pytest.raises(OSError):
            SocketPass(sender.port, sender.node_id, 1, PURPOSE, lambda s, st: None, STATE_MAX)
        assert len(os.listdir("/proc/self/fd")) == before

    _run(scenario)


def test_directories_of_dead_processes_are_swept() -> None:
    base = Path(tempfile.mkdtemp(prefix="sw", dir="/tmp"))  # short: sun_path holds 108 bytes
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = base / f"disque-mp-{dead.pid}-abcdefgh"
    stale.mkdir(mode=0o700)
    (stale / "7711.x.0").write_text("")
    alive = base / f"disque-mp-{os.getpid()}-abcdefgh"
    alive.mkdir(mode=0o700)
    saved = (os.environ.get(peercred.SOCKET_DIR_ENV), tempfile.tempdir)
    tempfile.tempdir = str(base)
    try:
        made = peercred.make_socket_dir()
        assert not stale.exists() and alive.exists() and Path(made).parent == base
    finally:
        if saved[0] is None:
            os.environ.pop(peercred.SOCKET_DIR_ENV, None)
        else:
            os.environ[peercred.SOCKET_DIR_ENV] = saved[0]
        tempfile.tempdir = saved[1]
        shutil.rmtree(base)
