"""Who may speak on the cluster bus: the cluster secret, the handshake proofs, frame MACs.

Pure logic except ``load_keys`` (reads the secret file) and ``os.urandom`` for nonces.

Keys. ``cluster-secret-file`` names a file of one or more secrets, one per line
(blank lines and ``#`` comments skipped). Each line becomes a 32-byte key
(blake3's key derivation with our own context), so any text works and no line
is ever used as a key directly. The first key signs; every key is accepted: to
rotate, add the new key as a second line everywhere, then move it first
everywhere, then remove the old one (``CONFIG SET cluster-secret-file`` re-reads
the file on every worker).

Handshake (dialer D, acceptor A; every bus link and every data link):

    D -> A  HANDSHAKE {proto, id, port, [data], "n": Nd}
    A -> D  HANDSHAKE {proto, id, port, "n": Na, "p": proof(K, "A", ...)}    K = A's first key
    D -> A  AUTH      {"p": proof(K, "D", ...)}    D found K among its keys (else: wrong secret)

``proof(K, role, ...)`` is blake3 keyed with K over the role, both nonces (32
fresh random bytes each) and both node IDs, compared in constant time. Each
side proves it holds K against the other's fresh nonce, so nothing recorded
from an earlier link can be replayed. Then the frames of each write travel in
one SEALED frame (bus/hostbus.py) followed by a MAC (``mac_bytes``): blake3
keyed with that direction's session key (derived from K and both nonces) over
an implicit sequence number (sealed frames counted from 0 in that direction)
and the sealed frame. A bad, replayed, reordered, truncated or dropped frame
fails the check and the link is closed.
"""

from __future__ import annotations

import hmac
import os
import stat
import struct
from typing import Any

import blake3

KEY_BYTES = 32
NONCE_BYTES = 32
PROOF_BYTES = 32
mac_bytes = 16  # per frame: 128 bits, far beyond what an online forger can try
secret_file_bytes_max = 64 * 1024  # a handful of keys; refuse anything that looks like junk
secret_keys_max = 16  # several keys only during a rotation
secret_line_chars_min = 16  # a short line is a typo, not a secret
_KEY_CONTEXT = "disque-mp cluster secret 2026-11 key v1"
_SEQ = struct.Struct(">Q")
# Frames up to this size are hashed from one copy (one call into blake3: most bus
# frames are a few hundred bytes and call overhead dominates); larger ones in place.
mac_copy_bytes_max = 64 * 1024

# Counters of this process, summed over the workers by INFO (section stats).
STATS: dict[str, int] = {
    "auth_failures": 0,  # a peer that failed the handshake (wrong or missing secret)
    "bad_frames": 0,  # a frame that failed its MAC, its bounds or its validation
    "handshake_timeouts": 0,  # a link that did not finish its handshake in time
    "links_refused": 0,  # an inbound link over the cap
    "rejected_messages": 0,  # job traffic or FAIL from a node that is not a member
    "local_refused": 0,  # a local socket peer (mesh, handoff, agent) of another uid
    "client_auth_failures": 0,  # a client's AUTH (or HELLO AUTH) with a wrong password
}


def count(name: str) -> None:
    STATS[name] += 1


class SecretError(Exception):
    """The secret file cannot be used; the message says why."""


class AuthError(Exception):
    """The peer failed the handshake; the message is the reason (logged, never the key)."""


def derive_key(line: str) -> bytes:
    return blake3.blake3(line.encode(), derive_key_context=_KEY_CONTEXT).digest(KEY_BYTES)


def parse_keys(text: str) -> list[bytes]:
    keys: list[bytes] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if len(line) < secret_line_chars_min:
            raise SecretError(f"a key is shorter than {secret_line_chars_min} characters")
        keys.append(derive_key(line))
    if not keys:
        raise SecretError("no key in the file")
    if len(keys) > secret_keys_max:
        raise SecretError(f"more than {secret_keys_max} keys")
    return keys


def load_keys(path: str) -> list[bytes]:
    """The keys of a secret file (relative paths: to ``dir``, the node's working directory)."""
    try:
        with open(path, "rb") as f:
            data = f.read(secret_file_bytes_max + 1)
    except OSError as exc:
        raise SecretError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError:  # a NUL in the path
        raise SecretError(f"cannot read {path!r}: not a file name") from None
    if len(data) > secret_file_bytes_max:
        raise SecretError(f"{path} is larger than {secret_file_bytes_max} bytes")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise SecretError(f"{path} is not UTF-8 text") from None
    try:
        return parse_keys(text)
    except SecretError as exc:
        raise SecretError(f"{path}: {exc}") from None


# The keys the bus of this process uses now (the last Keyring configured): what a
# CONFIG SET cluster-secret-file must share a key with (check_new_secret_file).
keys_in_use: list[bytes] = []


def check_new_secret_file(path: str, replace_allowed: bool) -> list[bytes]:
    """The keys of a file CONFIG SET is asked to take, or SecretError: a regular file
    of the node's user (or root) that no other user may read or write, of secret-file
    syntax, sharing a key with the keys in use unless ``cluster-secret-replace`` is
    yes (a rotation always keeps one key; a file sharing none cuts every member off
    and lets whoever can read that file in)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise SecretError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError:
        raise SecretError(f"cannot read {path!r}: not a file name") from None
    if not stat.S_ISREG(st.st_mode):
        raise SecretError(f"{path} is not a regular file")
    if st.st_uid not in (os.geteuid(), 0):
        raise SecretError(f"{path} is owned by uid {st.st_uid}, not by the node's user")
    if st.st_mode & 0o077:
        raise SecretError(f"{path} has mode {st.st_mode & 0o7777:04o}: other users may read "
                          "or change it (chmod 600 it)")
    keys = load_keys(path)
    if keys_in_use and not replace_allowed and not set(keys) & set(keys_in_use):
        raise SecretError(f"{path} shares no key with the keys in use (to replace every "
                          "key at once, CONFIG SET cluster-secret-replace yes first)")
    return keys


class Keyring:
    """The keys this process accepts; ``keys[0]`` signs. Empty: no secret (open bus)."""

    __slots__ = ("keys",)

    def __init__(self) -> None:
        self.keys: list[bytes] = []

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def configure(self, path: str) -> None:
        """Load ``path`` ("" = no secret); SecretError leaves the keys as they were."""
        self.keys = load_keys(path) if path else []
        keys_in_use[:] = self.keys

    def holds(self, sealer: Sealer | None) -> bool:
        """Does a link's session still derive from one of our keys? (False once the
        key it was made with is removed from the secret file: drop that link.)"""
        if sealer is None or not sealer.kid or not self.keys:
            return True  # a link without a MAC, or from before key ids: nothing to tell
        return sealer.kid in {key_id(k) for k in self.keys}


def key_id(key: bytes) -> str:
    """A short public name of a key (which key a session came from, never the key)."""
    return blake3.blake3(b"disque-mp key id", key=key).hexdigest(8)



def _proof(key: bytes, role: bytes, dialer_nonce: bytes, acceptor_nonce: bytes,
           dialer_id: str, acceptor_id: str) -> bytes:
    h = blake3.blake3(b"disque-mp proof " + role, key=key)
    h.update(dialer_nonce)
    h.update(acceptor_nonce)
    h.update(dialer_id.encode() + b"/" + acceptor_id.encode())
    return h.digest(PROOF_BYTES)


def _session_key(key: bytes, direction: bytes, dialer_nonce: bytes, acceptor_nonce: bytes) -> bytes:
    h = blake3.blake3(b"disque-mp session " + direction, key=key)
    h.update(dialer_nonce)
    h.update(acceptor_nonce)
    return h.digest(KEY_BYTES)


def _hex_field(meta: dict[str, Any], name: str, size: int) -> bytes:
    value = meta.get(name)
    if not isinstance(value, str) or len(value) != 2 * size:
        raise AuthError(f"no valid '{name}' in its handshake")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise AuthError(f"no valid '{name}' in its handshake") from None


class Sealer:
    """MACs for the frames we send on one link."""

    __slots__ = ("key", "seq", "kid")

    def __init__(self, key: bytes, seq: int = 0, kid: str = "") -> None:
        self.key = key
        self.seq = seq
        self.kid = kid  # key_id of the cluster key the session key derives from

    def seal(self, frame: bytes) -> bytes:
        seq = _SEQ.pack(self.seq)
        self.seq += 1
        if len(frame) <= mac_copy_bytes_max:
            return blake3.blake3(seq + frame, key=self.key).digest(mac_bytes)
        h = blake3.blake3(seq, key=self.key)
        h.update(frame)
        return h.digest(mac_bytes)


class Opener:
    """Checks the MAC trailer of every frame we receive on one link (``FrameReader.mac``)."""

    __slots__ = ("key", "seq", "size")

    def __init__(self, key: bytes, seq: int = 0) -> None:
        self.key = key
        self.seq = seq
        self.size = mac_bytes

    def check(self, buf: bytes | bytearray, start: int, length: int) -> bool:
        """Is ``buf[start + length : + size]`` the MAC of ``buf[start : start + length]``?"""
        end = start + length
        if length <= mac_copy_bytes_max:
            mac = blake3.blake3(_SEQ.pack(self.seq) + buf[start:end], key=self.key).digest(mac_bytes)
        else:
            h = blake3.blake3(_SEQ.pack(self.seq), key=self.key)
            with memoryview(buf) as view, view[start:end] as frame:
                h.update(frame)
            mac = h.digest(mac_bytes)
        if not hmac.compare_digest(mac, bytes(buf[end:end + mac_bytes])):
            return False
        self.seq += 1
        return True


class LinkAuth:
    """The handshake of one link, either end; then its ``sealer`` and ``opener``."""

    __slots__ = ("keys", "dialer", "my_id", "peer_id", "nonce", "peer_nonce", "key", "done",
                 "sealer", "opener")

    def __init__(self, keys: list[bytes], dialer: bool, my_id: str) -> None:
        self.keys = list(keys)  # a snapshot: a reload mid-handshake does not change it
        self.dialer = dialer
        self.my_id = my_id
        self.peer_id = ""
        self.nonce = os.urandom(NONCE_BYTES)
        self.peer_nonce = b""
        self.key = b""
        self.done = False
        self.sealer: Sealer | None = None
        self.opener: Opener | None = None

    def hello(self) -> dict[str, Any]:
        """Dialer: the fields our HANDSHAKE adds."""
        return {"n": self.nonce.hex()}

    def answer(self, peer_id: str, meta: dict[str, Any]) -> dict[str, Any]:
        """Acceptor: the dialer's HANDSHAKE -> the fields of our HANDSHAKE in reply."""
        self.peer_id = peer_id
        self.peer_nonce = _hex_field(meta, "n", NONCE_BYTES)
        self.key = self.keys[0]
        proof = _proof(self.key, b"A", self.peer_nonce, self.nonce, peer_id, self.my_id)
        return {"n": self.nonce.hex(), "p": proof.hex()}

    def check_answer(self, peer_id: str, meta: dict[str, Any]) -> dict[str, Any]:
        """Dialer: the acceptor's HANDSHAKE -> the AUTH meta to send; the link is then up."""
        self.peer_id = peer_id
        self.peer_nonce = _hex_field(meta, "n", NONCE_BYTES)
        proof = _hex_field(meta, "p", PROOF_BYTES)
        for key in self.keys:  # constant time per key; which key matched is not secret
            if hmac.compare_digest(
                    _proof(key, b"A", self.nonce, self.peer_nonce, self.my_id, peer_id), proof):
                self.key = key
                break
        else:
            raise AuthError("it proved another cluster secret than ours")
        mine = _proof(self.key, b"D", self.nonce, self.peer_nonce, self.my_id, peer_id)
        self._finish()
        return {"p": mine.hex()}

    def check_auth(self, meta: dict[str, Any]) -> None:
        """Acceptor: the dialer's AUTH; the link is up when this returns."""
        proof = _hex_field(meta, "p", PROOF_BYTES)
        expected = _proof(self.key, b"D", self.peer_nonce, self.nonce, self.peer_id, self.my_id)
        if not hmac.compare_digest(expected, proof):
            raise AuthError("it does not hold our cluster secret")
        self._finish()

    def _finish(self) -> None:
        dn, an = (self.nonce, self.peer_nonce) if self.dialer else (self.peer_nonce, self.nonce)
        to_acceptor = _session_key(self.key, b"D>A", dn, an)
        to_dialer = _session_key(self.key, b"A>D", dn, an)
        send, recv = (to_acceptor, to_dialer) if self.dialer else (to_dialer, to_acceptor)
        self.sealer = Sealer(send, kid=key_id(self.key))
        self.opener = Opener(recv)
        self.done = True


def export_session(sealer: Sealer, opener: Opener) -> dict[str, Any]:
    """A link's MAC state, to hand the link to another worker of this host (local,
    same-uid datagram socket only: it carries the session keys)."""
    return {"ks": sealer.key.hex(), "ss": sealer.seq, "kr": opener.key.hex(), "sr": opener.seq,
            "kid": sealer.kid}


def import_session(state: Any) -> tuple[Sealer, Opener] | None:
    if not isinstance(state, dict):
        return None
    try:
        ks, kr = bytes.fromhex(str(state["ks"])), bytes.fromhex(str(state["kr"]))
        ss, sr = state["ss"], state["sr"]
    except (KeyError, ValueError):
        return None
    if len(ks) != KEY_BYTES or len(kr) != KEY_BYTES or type(ss) is not int or type(sr) is not int:
        return None
    kid = state.get("kid")
    return Sealer(ks, ss, kid if isinstance(kid, str) else ""), Opener(kr, sr)
