"""`make bench`'s summary names the build its nodes ran, as INFO workers does."""

from __future__ import annotations

from bench.plots import summary
from bench.run_all import machine
from disque_mp import compiled


def test_the_summary_names_the_node_build() -> None:
    info = machine()
    assert info["build"] == compiled.summary()
    head = summary([], info).splitlines()[2]
    assert f"node build {info['build']} (INFO workers: shard_build)" in head
    assert f"Code at commit {info['commit']}" in head
