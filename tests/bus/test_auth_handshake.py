"""The bus handshake, the keyring and the per-frame MACs (bus/auth.py), and the
shape checks at the edge (bus/messages.py), without sockets."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from bus import auth, frames
from bus.messages import BadMessage, check_fail, check_header, check_job

ID_D = "d" * 40
ID_A = "a" * 40
KEY1 = auth.derive_key("first secret of the cluster")
KEY2 = auth.derive_key("second secret of the cluster")


def handshake(dialer_keys: list[bytes], acceptor_keys: list[bytes]) -> tuple[auth.LinkAuth, auth.LinkAuth]:
    d = auth.LinkAuth(dialer_keys, True, ID_D)
    a = auth.LinkAuth(acceptor_keys, False, ID_A)
    answer = a.answer(ID_D, d.hello())
    a.check_auth(d.check_answer(ID_A, answer))
    return d, a


def reader_for(opener: auth.Opener) -> frames.FrameReader:
    r = frames.FrameReader()
    r.mac = opener
    return r


def test_keys_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("# rotation in progress\n\nfirst secret of the cluster\nsecond secret of the cluster\n")
    assert auth.load_keys(str(path)) == [KEY1, KEY2]
    ring = auth.Keyring()
    ring.configure(str(path))
    assert ring.enabled and ring.keys[0] == KEY1
    ring.configure("")
    assert not ring.enabled
    for text, reason in [("", "no key"), ("short\n", "shorter"),
                         ("\n".join(f"key number {i:08d}" for i in range(20)), "more than")]:
        path.write_text(text)
        with pytest.raises(auth.SecretError, match=reason):
            auth.load_keys(str(path))
    with pytest.raises(auth.SecretError, match="cannot read"):
        auth.load_keys(str(tmp_path / "missing"))
    path.write_bytes(b"\xff" * 40)
    with pytest.raises(auth.SecretError, match="UTF-8"):
        auth.load_keys(str(path))
    good = tmp_path / "good"
    good.write_text("first secret of the cluster\n")
    ring.configure(str(good))
    with pytest.raises(auth.SecretError):
        ring.configure(str(path))
    assert ring.keys == [KEY1]  # a failed reload keeps the keys in use


def test_handshake_gives_both_sides_matching_session_keys() -> None:
    d, a = handshake([KEY1], [KEY1])
    assert d.done and a.done and d.key == a.key == KEY1
    assert d.sealer is not None and a.opener is not None and a.sealer is not None and d.opener is not None
    # each direction has its own key
    assert d.sealer.key == a.opener.key and a.sealer.key == d.opener.key
    assert d.sealer.key != a.sealer.key
    # and no session repeats: fresh nonces every time
    d2, _ = handshake([KEY1], [KEY1])
    assert d2.sealer is not None and d2.sealer.key != d.sealer.key


def test_rotation_any_key_is_accepted_the_first_signs() -> None:
    d, a = handshake([KEY1, KEY2], [KEY2, KEY1])  # acceptor moved the new key first
    assert d.key == a.key == KEY2
    d, a = handshake([KEY2, KEY1], [KEY1])  # the dialer holds the acceptor's first key
    assert d.key == a.key == KEY1
    with pytest.raises(auth.AuthError, match="another cluster secret"):
        handshake([KEY2], [KEY1, KEY2])  # the acceptor signs with its first: not held


def test_wrong_key_and_forged_proofs_are_refused() -> None:
    with pytest.raises(auth.AuthError):
        handshake([KEY2], [KEY1])
    d = auth.LinkAuth([KEY1], True, ID_D)
    a = auth.LinkAuth([KEY1], False, ID_A)
    answer = a.answer(ID_D, d.hello())
    with pytest.raises(auth.AuthError):  # the proof is bound to the IDs
        auth.LinkAuth([KEY1], True, "e" * 40).check_answer(ID_A, answer)
    with pytest.raises(auth.AuthError, match="does not hold"):
        a.check_auth({"p": "00" * auth.PROOF_BYTES})
    # replaying a proof recorded on another link fails: the acceptor's nonce is new
    d2 = auth.LinkAuth([KEY1], True, ID_D)
    a2 = auth.LinkAuth([KEY1], False, ID_A)
    proof = d2.check_answer(ID_A, a2.answer(ID_D, d2.hello()))
    a3 = auth.LinkAuth([KEY1], False, ID_A)
    a3.answer(ID_D, {"n": d2.nonce.hex()})
    with pytest.raises(auth.AuthError):
        a3.check_auth(proof)
    for meta in ({}, {"n": "zz" * 32}, {"n": "00"}):
        with pytest.raises(auth.AuthError):
            auth.LinkAuth([KEY1], False, ID_A).answer(ID_D, meta)


def _sealed(d: auth.LinkAuth, *metas: dict[str, object]) -> list[bytes]:
    assert d.sealer is not None
    out = []
    for meta in metas:
        f = frames.encode(2, meta, [b"body"])
        out.append(f + d.sealer.seal(f))
    return out


def test_frames_with_macs_arrive_and_tampering_is_caught() -> None:
    d, a = handshake([KEY1], [KEY1])
    assert a.opener is not None
    wire = _sealed(d, {"i": 1}, {"i": 2}, {"i": 3})
    r = reader_for(a.opener)
    for byte in b"".join(wire):  # byte by byte: the trailer waits like the frame does
        r.feed(bytes([byte]))
        got = r.next()
        if got is not None:
            assert got[2] == [b"body"]
    assert a.opener.seq == 3

    def fails(tamper: object) -> None:
        d, acc = handshake([KEY1], [KEY1])
        assert acc.opener is not None
        one, two = _sealed(d, {"i": 1}, {"i": 2})
        rd = reader_for(acc.opener)
        rd.feed(tamper(one, two))  # type: ignore[operator]
        with pytest.raises(frames.FrameError, match="MAC"):
            while rd.next() is not None:
                pass
        assert acc.opener.seq == 0

    def flip(one: bytes, two: bytes) -> bytes:
        b = bytearray(one)
        b[-auth.mac_bytes - 2] ^= 0x01  # a bit of the body
        return bytes(b)

    fails(flip)
    fails(lambda one, two: one[:-auth.mac_bytes] + bytes(auth.mac_bytes))  # a forged MAC
    fails(lambda one, two: one[:-8] + two)  # a truncated MAC: the next bytes do not match
    # replay and reorder need the session of the sender: rebuild one
    d, a = handshake([KEY1], [KEY1])
    assert a.opener is not None
    one, two = _sealed(d, {"i": 1}, {"i": 2})
    r = reader_for(a.opener)
    r.feed(one + one)  # replayed
    assert r.next() is not None
    with pytest.raises(frames.FrameError, match="MAC"):
        r.next()
    d, a = handshake([KEY1], [KEY1])
    assert a.opener is not None
    one, two = _sealed(d, {"i": 1}, {"i": 2})
    r = reader_for(a.opener)
    r.feed(two + one)  # reordered
    with pytest.raises(frames.FrameError, match="MAC"):
        r.next()


def test_session_travels_to_another_worker() -> None:
    d, a = handshake([KEY1], [KEY1])
    assert a.sealer is not None and a.opener is not None and d.sealer is not None
    (first,) = _sealed(d, {"i": 1})
    reader_for(a.opener).feed(first)
    state = auth.export_session(a.sealer, a.opener)
    session = auth.import_session(state)
    assert session is not None
    sealer, opener = session
    assert opener.key == a.opener.key and sealer.seq == a.sealer.seq
    assert auth.import_session({"ks": "00"}) is None
    assert auth.import_session(None) is None


def test_tight_bounds_before_the_handshake() -> None:
    r = frames.FrameReader(None, 4096, 16384)
    r.feed(frames.encode(1, {"x": "y" * 5000}))
    with pytest.raises(frames.FrameError, match="bound"):
        r.next()
    r = frames.FrameReader(None, 4096, 16384)
    with pytest.raises(frames.FrameError, match="buffer"):
        r.feed(b"\x00" * 20000)


def job_id_for(slot: int) -> str:
    return "D-00000000-" + base64.b64encode(slot.to_bytes(2, "big") + bytes(16)).decode() + "-0001"


def test_messages_are_checked_at_the_edge() -> None:
    good = {"id": ID_A, "port": 7711, "leaving": False,
            "gossip": [[ID_D, "127.0.0.1", 7712, ["fail?"], 0, 0]]}
    assert check_header(good) == ID_A
    for bad in ({**good, "id": "x"}, {**good, "port": 0}, {**good, "port": "7711"},
                {**good, "leaving": "no"}, {**good, "gossip": {}}, {**good, "gossip": [[1, 2]]},
                {**good, "gossip": [[ID_D, "127.0.0.1", 7712, "fail"]]},
                {**good, "gossip": [[ID_D, "127.0.0.1", 7712, [], -5, 0]]},
                {**good, "gossip": [[ID_D, "127.0.0.1", 7712, []]] * 65}):
        with pytest.raises(BadMessage):
            check_header(bad)
    assert check_fail({"id": ID_D}) == ID_D
    with pytest.raises(BadMessage):
        check_fail({"id": 5})
    jid = job_id_for(100)
    assert check_job({"k": "GOTJOB", "s": 100, "m": {"j": jid}}, []) == ("GOTJOB", 100, {"j": jid})
    for meta, bodies in [({"k": "GOTJOB", "s": 101, "m": {"j": jid}}, []),  # slot disagrees
                         ({"k": "GOTJOB", "s": 16384, "m": {"j": jid}}, []),
                         ({"k": "GOTJOB", "s": True, "m": {"j": jid}}, []),
                         ({"k": "GOTJOB", "s": 100, "m": {"j": jid}}, [b"x"]),
                         ({"k": "SETACK", "s": 100, "m": {"j": jid, "m": -1}}, []),
                         ({"k": "GOTACK", "s": 100, "m": {"j": jid, "k": 2}}, []),
                         ({"k": "ENQUEUE", "s": 100, "m": {"j": jid, "d": ["x"]}}, []),
                         ({"k": "NEEDJOBS", "s": 0, "m": {"c": 1}}, [b"q"]),  # q's slot is not 0
                         ({"k": "REPLJOB", "s": 0, "m": {}}, [b"a", b"b"]),
                         ({"k": "YOURJOBS", "s": 0, "m": {}}, []),
                         ({"k": 5, "s": 0, "m": {}}, [])]:
        with pytest.raises(BadMessage):
            check_job(meta, bodies)
