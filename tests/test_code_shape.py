"""The code stays readable at a glance: no function in the node's packages is longer
than a screen (``FUNCTION_LINES_MAX``), no class longer than a few screens
(``CLASS_LINES_MAX``), and no module imports, even for types only or inside a
function, a module that imports it back (the import graph has no circle). Checked
on the source's AST, docstrings and comments included, as a reader sees them."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("disque_mp", "workers", "bus")
FUNCTION_LINES_MAX = 70  # one screen: a longer function hides its branches
CLASS_LINES_MAX = 450  # past this a class holds more than one job


def _sources() -> list[Path]:
    sources = [p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]
    assert len(sources) > 50  # the walk found the packages
    return sources


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _defs(path: Path, kinds: tuple[type, ...]) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, kinds):
            assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            assert node.end_lineno is not None
            out.append((f"{path.relative_to(REPO)}:{node.lineno} {node.name}",
                        node.end_lineno - node.lineno + 1))
    return out


def test_no_function_is_longer_than_a_screen() -> None:
    too_long = [(name, lines) for p in _sources()
                for name, lines in _defs(p, (ast.FunctionDef, ast.AsyncFunctionDef))
                if lines > FUNCTION_LINES_MAX]
    assert too_long == [], too_long


def test_no_class_is_longer_than_a_few_screens() -> None:
    too_long = [(name, lines) for p in _sources() for name, lines in _defs(p, (ast.ClassDef,))
                if lines > CLASS_LINES_MAX]
    assert too_long == [], too_long


def _imported(module: str, path: Path, node: ast.ImportFrom | ast.Import,
              modules: set[str]) -> set[str]:
    """The modules of ours one import statement names: ``from a import b`` names the
    module ``a.b`` where it is one, else ``a``."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in modules}
    if node.level:
        base = module.split(".")
        if path.name != "__init__.py":
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    out = set()
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        name = sub if sub in modules else target
        if name in modules:
            out.add(name)
    return out


def _import_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in _sources()}
    modules = set(paths)
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _imported(module, path, node, modules)
        edges.discard(module)
        graph[module] = edges
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_circle_finder_sees_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]


def test_no_import_circle() -> None:
    graph = _import_graph()
    assert "disque_mp.node.worker" in graph and graph["disque_mp.node.worker"]
    assert _circles(graph) == []


# ---- the shard's core speaks in verbs (workers/core.py)

WORKERS = REPO / "workers"


def _parts(*but: str) -> list[Path]:
    return [p for p in sorted(WORKERS.glob("*.py")) if p.name not in but]


def test_job_flags_only_through_the_jobs_named_methods() -> None:
    """No raw flag bit operation outside workers/job.py: the parts read and set a
    job's flags through ``Job``'s named methods (``mark_delivered`` ...)."""
    raw = []
    for p in _parts("job.py"):
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            name = (node.id if isinstance(node, ast.Name) else node.name
                    if isinstance(node, ast.alias) else "")
            if name.startswith(("FLAG_", "FLAGS_")) or (
                    isinstance(node, ast.Attribute) and node.attr == "flags"):
                raw.append(f"{p.name}:{getattr(node, 'lineno', '?')}")
    assert raw == [], raw


def test_one_aof_append_verb() -> None:
    """Only the core makes AOF records (``Core.log_job``, and its deletion record
    when a job leaves): a move ends with the verb, never with a record of its own."""
    makers = []
    for p in _parts("core.py", "effects.py"):
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "AofAppend":
                makers.append(f"{p.name}:{node.lineno}")
    assert makers == [], makers


def _core_fields_touched() -> dict[str, set[str]]:
    """Attributes of a ``Core`` that are not methods, as the parts reach them
    (``self.core.x``, a local bound to ``self.core``, a parameter typed ``Core``),
    with the files that do."""
    import workers.core

    verbs = {n for n in dir(workers.core.Core) if callable(getattr(workers.core.Core, n))}
    out: dict[str, set[str]] = {}
    for p in _parts("core.py"):
        for fn in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if not isinstance(fn, ast.FunctionDef):
                continue
            bound = {a.arg for a in fn.args.args
                     if isinstance(a.annotation, ast.Name) and a.annotation.id == "Core"}
            for n in ast.walk(fn):
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Attribute) \
                        and n.value.attr == "core" and isinstance(n.targets[0], ast.Name):
                    bound.add(n.targets[0].id)
            for n in ast.walk(fn):
                if not isinstance(n, ast.Attribute) or n.attr in verbs:
                    continue
                v = n.value
                if (isinstance(v, ast.Name) and v.id in bound) or (
                        isinstance(v, ast.Attribute) and v.attr == "core"
                        and isinstance(v.value, ast.Name) and v.value.id == "self"):
                    out.setdefault(n.attr, set()).add(p.name)
    return out


def test_the_field_finder_sees_a_field() -> None:
    import workers.core

    core = workers.core.Core
    assert not callable(getattr(core, "queues", None))  # a field (compiled: a descriptor)
    assert callable(core.find_queue) and callable(core.view)  # verbs, inherited ones too


def test_parts_reach_the_core_through_verbs_only() -> None:
    """No part reads or writes a field of the core: ``core.x`` from workers/ outside
    core.py is a method call (a move, or a read-only fact such as ``view()``,
    ``now_ms()``, ``tally()``)."""
    touched = _core_fields_touched()
    assert touched == {}, {f: sorted(files) for f, files in touched.items()}
