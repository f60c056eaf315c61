"""bus/nodes_conf.py: the node ID and membership file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bus import nodes_conf as nc

A = "8fbfc3790ad6159886749a7241c766307c8fe7e5"
B = "8e0f8eae7bead44411d606e5776dd32b4da6cc92"


def test_new_node_ids_are_40_hex_and_distinct() -> None:
    ids = {nc.new_node_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"[0-9a-f]{40}", i) for i in ids)


def test_create_then_load_keeps_the_id(tmp_path: Path) -> None:
    path = str(tmp_path / "nodes.conf")
    first, created = nc.load_or_create(path, "127.0.0.1", 7711)
    assert created
    second, created = nc.load_or_create(path, "127.0.0.1", 7711)
    assert not created and second.node_id == first.node_id
    text = Path(path).read_text()
    assert f"{first.node_id} 127.0.0.1:7711 myself 0 0 connected\n" in text
    assert text.endswith("vars format 1 currentEpoch 0\n")
    assert list(tmp_path.iterdir()) == [tmp_path / "nodes.conf"]  # no temp file left


def test_address_change_is_saved(tmp_path: Path) -> None:
    path = str(tmp_path / "nodes.conf")
    first, _ = nc.load_or_create(path, "127.0.0.1", 7711)
    again, _ = nc.load_or_create(path, "127.0.0.1", 7800)
    assert again.node_id == first.node_id
    assert nc.load(path).myself.port == 7800  # type: ignore[union-attr]


def test_peers_and_unknown_vars_round_trip() -> None:
    text = (f"{A} 127.0.0.1:7711 myself 0 0 connected\n"
            f"{B} ::1:7712 noflags,leaving 10 20 disconnected\n"
            "vars format 1 currentEpoch 3 futureKey x\n")
    conf = nc.parse(text)
    assert conf.node_id == A
    peer = conf.peers[0]
    assert (peer.node_id, peer.ip, peer.port, peer.flags) == (B, "::1", 7712, ["noflags", "leaving"])
    assert (peer.ping_sent_ms, peer.pong_recv_ms, peer.link_state) == (10, 20, "disconnected")
    assert conf.vars == {"currentEpoch": "3", "futureKey": "x"}
    assert nc.parse(nc.render(conf)) == conf


def test_reads_disques_own_format() -> None:
    conf = nc.parse(f"{A} 127.0.0.1:7711 myself 0 0 connected\n")
    assert conf.node_id == A and conf.version == nc.FORMAT_VERSION


@pytest.mark.parametrize(("text", "what"), [
    (f"{A} 127.0.0.1:7711 noflags 0 0 connected\n", "0 'myself' nodes"),
    (f"{A} 127.0.0.1:7711 myself 0 0 connected\n{B} 127.0.0.1:7712 myself 0 0 connected\n",
     "2 'myself' nodes"),
    ("nothex 127.0.0.1:7711 myself 0 0 connected\n", "line 1: bad node ID"),
    (f"{A} 127.0.0.1 myself 0 0 connected\n", "line 1: bad address"),
    (f"{A} 127.0.0.1:99999 myself 0 0 connected\n", "line 1: bad address"),
    (f"{A} 127.0.0.1:7711 myself 0 0\n", "line 1: a node line has 6 fields"),
    (f"{A} 127.0.0.1:7711 myself x 0 connected\n", "line 1"),
    (f"{A} 127.0.0.1:7711 myself 0 0 connected\nvars format\n", "line 2: vars needs"),
    (f"{A} 127.0.0.1:7711 myself 0 0 connected\nvars format 2\n", "format 2 is newer"),
])
def test_corrupt_files_are_refused(text: str, what: str) -> None:
    with pytest.raises(nc.NodesConfError) as info:
        nc.parse(text)
    assert what in str(info.value)


def test_missing_or_empty_file_means_new_node(tmp_path: Path) -> None:
    path = tmp_path / "nodes.conf"
    assert nc.load(str(path)) is None
    path.write_text("\n  \n")
    assert nc.load(str(path)) is None
    _, created = nc.load_or_create(str(path), "127.0.0.1", 7711)
    assert created


def test_corrupt_file_is_not_replaced(tmp_path: Path) -> None:
    path = tmp_path / "nodes.conf"
    path.write_text("garbage\n")
    with pytest.raises(nc.NodesConfError):
        nc.load_or_create(str(path), "127.0.0.1", 7711)
    assert path.read_text() == "garbage\n"
