"""The code stays readable at a glance: no function in the node's packages is longer
than a screen (``FUNCTION_LINES_MAX``). Checked on the source's AST, docstrings and
comments included, as a reader sees them."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("disque_mp", "workers", "bus")
FUNCTION_LINES_MAX = 70  # one screen: a longer function hides its branches


def _functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno is not None
            out.append((f"{path.relative_to(REPO)}:{node.lineno} {node.name}",
                        node.end_lineno - node.lineno + 1))
    return out


def test_no_function_is_longer_than_a_screen() -> None:
    sources = [p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]
    assert len(sources) > 50  # the walk found the packages
    too_long = [(name, lines) for p in sources for name, lines in _functions(p)
                if lines > FUNCTION_LINES_MAX]
    assert too_long == [], too_long
