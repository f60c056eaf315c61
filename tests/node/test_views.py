"""The node-wide parts see their worker through ``disque_mp/node/view.py`` only:
the commands, the memory monitor and the HTTP endpoint never import the worker,
its per-command parts or its connection class, not even for type checking
(checked on the source's AST, ``TYPE_CHECKING`` blocks included), and import our
modules at module level only, so no import loop hides inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

NODE = Path(__file__).resolve().parents[2] / "disque_mp" / "node"
VIEWERS = sorted([*(NODE / "commands").glob("*.py"), NODE / "memory.py", NODE / "view.py",
                  *(NODE / "http").glob("*.py")])
FORBIDDEN = {"disque_mp.node.worker", "disque_mp.node.router", "disque_mp.node.peers",
             "disque_mp.node.handoff", "disque_mp.node.getjob", "disque_mp.node.connection",
             "disque_mp.node.core"}
OURS = ("disque_mp", "workers", "bus")


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


@pytest.mark.parametrize("path", VIEWERS, ids=lambda p: str(p.relative_to(NODE)))
def test_no_worker_import(path: Path) -> None:
    found = _imports(ast.parse(path.read_text(), str(path))) & FORBIDDEN
    assert not found, f"{path.name} imports {sorted(found)}"


@pytest.mark.parametrize("path", VIEWERS, ids=lambda p: str(p.relative_to(NODE)))
def test_no_function_level_import_of_ours(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    late = [f"{fn.name}: {sorted(_imports(fn))}"
            for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            if any(name.split(".")[0] in OURS for name in _imports(fn))]
    assert not late, f"{path.name} imports inside functions: {late}"
