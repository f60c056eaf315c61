"""workers/ is a pure state machine: no I/O, no clock, no global randomness,
and nothing from the I/O packages, so that a whole cluster of shards runs in one
process under a seeded simulation. Checked on the source's AST."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

WORKERS = Path(__file__).resolve().parents[2] / "workers"
FORBIDDEN = {"socket", "asyncio", "time", "os", "disque_mp", "bus", "select", "selectors",
             "threading", "multiprocessing", "multiprocess", "subprocess", "signal", "uvloop",
             "datetime", "secrets"}
# `random` may be imported for the type of the seeded generator passed in, never
# for its module-level functions (which share one hidden global state).
RANDOM_ALLOWED_ATTRS = {"Random"}

SOURCES = sorted(WORKERS.glob("*.py"))


def _imports(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_forbidden_imports(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    for name in _imports(tree):
        assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_random_only_as_a_type(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "random":
            assert {a.name for a in node.names} <= RANDOM_ALLOWED_ATTRS, path.name
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "random"):
            assert node.attr in RANDOM_ALLOWED_ATTRS, f"{path.name}: random.{node.attr}"


def test_checker_catches_violations() -> None:
    """The checks above would fail on impure code (guards against a vacuous test)."""
    bad = ast.parse("import time\nfrom bus.frames import encode\nimport random\nrandom.random()\n")
    assert {"time", "bus.frames"} <= set(_imports(bad))
    attrs = [n.attr for n in ast.walk(bad) if isinstance(n, ast.Attribute)]
    assert "random" in attrs and "random" not in RANDOM_ALLOWED_ATTRS


def test_sources_found() -> None:
    assert {p.name for p in SOURCES} >= {"shard.py", "job.py", "queue.py", "ids.py"}
