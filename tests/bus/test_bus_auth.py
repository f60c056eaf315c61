"""Only the cluster's own nodes get in: real nodes with a cluster secret, strangers
without it (or with another one), and a raw bus peer that holds the secret but
tampers with its frames or is no member."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from bus import auth, frames
from bus.hostbus import BUS_PROTO, K_AUTH, K_FAIL, K_HANDSHAKE, K_JOB, K_PING, K_PONG, K_SEALED
from tests.nodeproc import NodeProc, form_cluster, unique_queue, wait_until

pytestmark = pytest.mark.integration

SECRET = "the cluster secret, shared by every node of this test"
OTHER = "another cluster's secret, which must not get in"
NEW = "the secret we rotate to, second of this test"
wait_s = 40.0  # nodes of 2 workers each on 2 busy cores


def write_secret(path: Path, *lines: str) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    os.chmod(path, 0o600)
    return str(path)


def secret_node(tmp: Path, name: str, *lines: str, **conf: Any) -> NodeProc:
    d = tmp / name
    d.mkdir()
    base = {"cluster-node-timeout": 3000}
    if lines:
        base["cluster-secret-file"] = write_secret(d / "cluster.secret", *lines)
    return NodeProc(d, workers=2, conf={**base, **conf})


def cmd(node: NodeProc, *words: Any) -> Any:
    r = node.client(protocol=2)
    try:
        return r.execute_command(*words)
    finally:
        r.close()


def nodes_lines(node: NodeProc) -> list[list[str]]:
    return [line.split() for line in cmd(node, "CLUSTER", "NODES").decode().splitlines()]


def bus_stat(node: NodeProc, name: str) -> int:
    return int(cmd(node, "INFO", "stats")[f"cluster_bus_{name}"])


class RawPeer:
    """A bus peer written by hand: it runs the real handshake with the keys it is given."""

    def __init__(self, port: int, keys: list[bytes], my_id: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port + 10000), timeout=15)
        self.my_id = my_id
        self.reader = frames.FrameReader()
        self.auth = auth.LinkAuth(keys, True, my_id)
        self.sealer: auth.Sealer | None = None

    def handshake(self) -> str:
        """Run the whole handshake; returns the node's ID (AuthError if it proves another key)."""
        self.send_plain(K_HANDSHAKE, {"proto": BUS_PROTO, "id": self.my_id, "port": 4242,
                                      **self.auth.hello()})
        frame = self.recv()
        assert frame is not None and frame[0] == K_HANDSHAKE
        node_id = str(frame[1]["id"])
        self.send_plain(K_AUTH, self.auth.check_answer(node_id, frame[1]))
        self.sealer = self.auth.sealer
        self.reader.mac = self.auth.opener
        return node_id

    def send_plain(self, kind: int, meta: dict[str, Any]) -> None:
        self.sock.sendall(frames.encode(kind, meta))

    def sealed(self, kind: int, meta: dict[str, Any], bodies: list[bytes] | None = None) -> bytes:
        """One frame in a sealed batch of its own, with the batch's MAC."""
        assert self.sealer is not None
        batch = frames.encode(K_SEALED, {}, [frames.encode(kind, meta, bodies or [])])
        return batch + self.sealer.seal(batch)

    def recv(self) -> tuple[int, dict[str, Any], list[bytes]] | None:
        """The next frame (the first of a sealed batch); None when the node closed the link."""
        while (frame := self.reader.next()) is None:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.reader.feed(data)
        if frame[0] == K_SEALED:
            inner = frames.FrameReader()
            inner.feed(frame[2][0])
            return inner.next()
        return frame

    def closed_by_node(self) -> bool:
        """True once the node closes the link (it sends nothing we did not ask for)."""
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def ping(self) -> bytes:
        return self.sealed(K_PING, {"id": self.my_id, "port": 4242, "leaving": False,
                                    "gossip": []})

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def trio(tmp_path: Path) -> Any:
    nodes = [secret_node(tmp_path, f"n{i}", SECRET) for i in range(3)]
    try:
        for n in nodes:
            n.start()
        form_cluster(nodes, wait_s)
        yield nodes
        for n in nodes:
            assert "Traceback" not in n.log_text(), n.log_text()[-3000:]
    finally:
        for n in nodes:
            n.stop()


def test_strangers_can_neither_join_nor_be_joined(trio: list[NodeProc], tmp_path: Path) -> None:
    a = trio[0]
    q = unique_queue()
    jid = cmd(a, "ADDJOB", q, "body", 5000, "REPLICATE", 3)
    assert len(cmd(a, "SHOW", jid)) > 0  # replicated on an authenticated cluster
    other = secret_node(tmp_path, "other", OTHER)
    open_node = secret_node(tmp_path, "open")  # no secret at all
    with other, open_node:
        before = bus_stat(a, "auth_failures")
        for stranger in (other, open_node):
            # the stranger MEETs us: refused on our side, flagged on its side
            assert cmd(stranger, "CLUSTER", "MEET", "127.0.0.1", a.port) == b"OK"
            stranger.wait_for(lambda s=stranger: any("auth-failed" in line[2]
                                                     for line in nodes_lines(s)),
                              wait_s, "the stranger's MEET flagged auth-failed")
            # we MEET the stranger: flagged on our side
            assert cmd(a, "CLUSTER", "MEET", "127.0.0.1", stranger.port) == b"OK"
            a.wait_for(lambda s=stranger: any(line[1].endswith(f":{s.port}")
                                              and "auth-failed" in line[2]
                                              for line in nodes_lines(a)),
                       wait_s, "our MEET to the stranger flagged auth-failed")
        assert bus_stat(a, "auth_failures") > before
        assert "authentication failed" in a.log_text() or "refusing" in a.log_text()
        assert "check cluster-secret-file" in other.log_text()
        assert "has no cluster secret" in a.log_text() or "has no cluster secret" in open_node.log_text()
        # nobody was added: the trio still has 3 members, the strangers only themselves
        time.sleep(1)
        for n in trio:
            assert cmd(n, "CLUSTER", "INFO").decode().count("cluster_size:3") == 1
        for s in (other, open_node):
            assert "cluster_size:1" in cmd(s, "CLUSTER", "INFO").decode()
    assert "OTHER" not in str(cmd(a, "CONFIG", "GET", "cluster-secret-file"))
    assert cmd(a, "CONFIG", "GET", "cluster-secret-file")[1].endswith(b"cluster.secret")


def test_wrong_key_tampered_frames_and_silent_peers_lose_their_link(trio: list[NodeProc]) -> None:
    a = trio[0]
    keys = [auth.derive_key(SECRET)]
    # a wrong key: the node proves a key we do not have, and refuses our proof
    peer = RawPeer(a.port, [auth.derive_key(OTHER)], "e" * 40)
    with pytest.raises(auth.AuthError):
        peer.handshake()
    peer.close()
    failures = bus_stat(a, "auth_failures")
    peer = RawPeer(a.port, keys, "e" * 40)
    peer.send_plain(K_HANDSHAKE, {"proto": BUS_PROTO, "id": "e" * 40, "port": 4242,
                                  **peer.auth.hello()})
    assert peer.recv() is not None
    peer.send_plain(K_AUTH, {"p": "00" * auth.PROOF_BYTES})
    assert peer.closed_by_node()
    peer.close()
    wait_until(lambda: bus_stat(a, "auth_failures") > failures, wait_s, "auth failure counted")

    # the right key: PING gets a PONG; then a replayed, a flipped and a truncated frame
    def tampered(make: Any) -> None:
        bad = bus_stat(a, "bad_frames")
        p = RawPeer(a.port, keys, "e" * 40)
        p.handshake()
        first = p.ping()
        p.sock.sendall(first)
        pong = p.recv()
        assert pong is not None and pong[0] == K_PONG
        p.sock.sendall(make(p, first))
        assert p.closed_by_node()
        p.close()
        wait_until(lambda: bus_stat(a, "bad_frames") > bad, wait_s, "bad frame counted")

    def flipped(p: RawPeer, first: bytes) -> bytes:
        b = bytearray(p.ping())
        b[20] ^= 0x04
        return bytes(b)

    tampered(lambda p, first: first)  # replayed
    tampered(flipped)
    tampered(lambda p, first: p.ping()[:-8] + p.ping())  # truncated MAC
    # a plain frame after the handshake (no MAC at all)
    tampered(lambda p, first: frames.encode(K_PING, {"id": p.my_id, "port": 4242}) + b"\0" * 64)
    # a sealed batch whose MAC is right but whose last frame is cut short
    def cut(p: RawPeer, first: bytes) -> bytes:
        assert p.sealer is not None
        ping = frames.encode(K_PING, {"id": p.my_id, "port": 4242, "leaving": False, "gossip": []})
        batch = frames.encode(K_SEALED, {}, [ping + ping[:-3]])
        return batch + p.sealer.seal(batch)

    tampered(cut)

    # a handshake that never completes is closed after its deadline
    timeouts = bus_stat(a, "handshake_timeouts")
    silent = socket.create_connection(("127.0.0.1", a.port + 10000), timeout=30)
    silent.sendall(b"DQ")  # two bytes, then nothing
    assert silent.recv(10) == b""
    silent.close()
    wait_until(lambda: bus_stat(a, "handshake_timeouts") > timeouts, wait_s, "timeout counted")
    assert all(n.proc is not None and n.proc.poll() is None for n in trio)


def test_authenticated_non_members_are_not_believed(trio: list[NodeProc]) -> None:
    a, b = trio[0], trio[1]
    b_id = cmd(b, "CLUSTER", "MYID").decode()
    keys = [auth.derive_key(SECRET)]
    rejected = bus_stat(a, "rejected_messages")
    # holds the secret but was never MEET: its job traffic and FAIL reports are ignored
    p = RawPeer(a.port, keys, "f" * 40)
    p.handshake()
    q = unique_queue()
    jid = cmd(a, "ADDJOB", q, "x", 5000, "REPLICATE", 1)
    slot_meta = {"j": jid.decode()}
    from workers.ids import slot_of_job_id

    slot = slot_of_job_id(jid.decode())
    p.sock.sendall(p.sealed(K_JOB, {"k": "DELJOB", "s": slot, "m": slot_meta})
                   + p.sealed(K_FAIL, {"id": b_id}))
    wait_until(lambda: bus_stat(a, "rejected_messages") >= rejected + 2, wait_s,
               "non-member messages rejected")
    assert cmd(a, "QLEN", q) == 1  # DELJOB ignored
    assert not any("fail" in line[2].split(",") for line in nodes_lines(a) if line[0] == b_id)
    # a forged sender: PING claiming to be B on our link closes it
    p.sock.sendall(p.sealed(K_PING, {"id": b_id, "port": b.port, "leaving": False, "gossip": []}))
    assert p.closed_by_node()
    p.close()
    # the cluster is unharmed
    assert int(cmd(a, "CLUSTER", "INFO").decode().split("cluster_reachable_nodes:")[1][0]) == 2
    cmd(a, "ACKJOB", jid)


def test_keys_rotate_on_a_live_cluster_with_jobs_flowing(trio: list[NodeProc]) -> None:
    q = unique_queue()
    added: list[bytes] = []
    errors: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        clients = [n.client(protocol=2, socket_timeout=20) for n in trio]
        i = 0
        while not stop.is_set():
            try:
                added.append(clients[i % 3].execute_command(
                    "ADDJOB", q, f"job {i}", 10000, "REPLICATE", 3, "RETRY", 300))
            except redis.ResponseError as exc:  # NOREPL would be a lost cluster link
                errors.append(str(exc))
            i += 1
            time.sleep(0.01)
        for c in clients:
            c.close()

    producer = threading.Thread(target=produce)
    producer.start()
    paths = [str(Path(n.dir) / "cluster.secret") for n in trio]
    try:
        for lines in ((SECRET, NEW), (NEW, SECRET), (NEW,)):
            time.sleep(1.0)
            for n, path in zip(trio, paths, strict=True):
                write_secret(Path(path), *lines)
                assert cmd(n, "CONFIG", "SET", "cluster-secret-file", path) == b"OK"
        time.sleep(1.0)
    finally:
        stop.set()
        producer.join(60)
    assert not errors, errors[:3]
    assert len(added) > 50
    # none lost: every acknowledged ADDJOB is queued on some node
    found: set[bytes] = set()
    for n in trio:
        while True:
            got = cmd(n, "GETJOB", "NOHANG", "COUNT", 1000, "FROM", q)
            if not got:
                break
            found.update(job[1] for job in got)
    missing = set(added) - found
    assert not missing, f"{len(missing)} of {len(added)} jobs lost"
    # links made from now on use the new key only: a restarted node must rejoin
    trio[2].restart()
    wait_until(lambda: all(int(cmd(n, "CLUSTER", "INFO").decode()
                               .split("cluster_reachable_nodes:")[1][0]) == 2 for n in trio),
               wait_s, "the cluster whole again on the new key")
    jid = cmd(trio[2], "ADDJOB", q, "after", 10000, "REPLICATE", 3)
    assert all(len(cmd(n, "SHOW", jid)) > 0 for n in trio)
    # and a bad file is refused, the keys in use kept
    bad = Path(trio[0].dir) / "bad.secret"
    bad.write_text("short\n")
    with pytest.raises(redis.ResponseError, match="Invalid argument"):
        cmd(trio[0], "CONFIG", "SET", "cluster-secret-file", str(bad))
    assert cmd(trio[0], "CONFIG", "GET", "cluster-secret-file")[1] == paths[0].encode()
