"""The code says what it is at a glance, checked on the source's AST (docstrings and
comments included, as a reader sees them), in the node's packages:

- no function is longer than a screen (``FUNCTION_LINES_MAX``);
- no module imports, even for types only or inside a function, a module that
  imports it back (the import graph has no circle);
- a method lives in its class: no module function takes ``self``, nor acts as one
  (its first parameter annotated with a class of its module whose private
  members it reaches);
- no method only returns a field (a property-like getter: read the field, or
  give the class the verb its callers want), except where an interface asks for
  a method (listed below, each with its reason);
- no part reaches another part's private members: ``x._y`` only where ``x`` is
  ``self``, ``cls``, a module, ``super()``, or an instance of the class the
  code sits in (which defines ``_y``).

The shard (``workers/``) is shaped by its own rules below; where it breaks one of
these, its sites are listed as an allowance that only shrinks."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("disque_mp", "workers", "bus")
FUNCTION_LINES_MAX = 70  # one screen: a longer function hides its branches


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


def _first_param_class(fn: ast.FunctionDef | ast.AsyncFunctionDef, classes: set[str]) -> str | None:
    args = fn.args.args
    if not args:
        return None
    ann = args[0].annotation
    name = ann.id if isinstance(ann, ast.Name) else (
        ann.value if isinstance(ann, ast.Constant) and isinstance(ann.value, str) else None)
    return name if name in classes else None


def _members(cls: ast.ClassDef) -> set[str]:
    """The names a class defines: its methods, class attributes, ``__slots__`` and
    the fields its methods assign on ``self``."""
    out: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "self":
            out.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            out |= {c.value for c in ast.walk(node.value)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return out


def _is_private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__")


def _methods_out_of_class(path: Path, root: Path = REPO) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
    out = []
    for fn in tree.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not fn.args.args:
            continue
        first = fn.args.args[0].arg
        owner = _first_param_class(fn, set(classes))
        reaches = owner is not None and any(
            isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == first
            and _is_private(n.attr) and n.attr in _members(classes[owner]) for n in ast.walk(fn))
        if first in ("self", "cls") or reaches:
            out.append(f"{path.relative_to(root)}:{fn.lineno} {fn.name}")
    return out


def test_the_method_finder_sees_a_method_out_of_its_class(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("class R:\n    def _w(self) -> None: ...\n\n"
                   "def a(self: R) -> None: ...\n\n"
                   "def b(r: R) -> None:\n    r._w()\n\n"
                   "def c(r: R) -> None:\n    r.x = 1\n")
    assert [s.split(" ")[1] for s in _methods_out_of_class(src, tmp_path)] == ["a", "b"]


def test_no_method_lives_out_of_its_class() -> None:
    """A module function taking ``self: SomeClass`` (or a parameter of its module's
    class whose private members it reaches) is a method moved out of its class,
    most often to fit a size bound: the class's size is then hidden, not cut."""
    found = [site for p in _sources() for site in _methods_out_of_class(p)]
    assert found == [], found


# Methods that only return a field, kept because an interface asks a method.
GETTERS_ALLOWED = {
    # asyncio.Transport's interface: the HTTP endpoint's sink stands in for a socket
    "disque_mp/node/http/commands.py _Sink.is_closing",
    # the parser's public question: ``_pending`` is the resume state of ``feed``'s
    # loop, set in several places inside it; the handoff and the tests ask the answer
    "disque_mp/node/resp.py RequestParser.buffered",
}
# workers/: the core's read-only facts are methods by the shard's own rule (no part
# reads a field of the core: ``test_parts_reach_the_core_through_verbs_only``); an
# allowance that only shrinks as the shard's moves own their state.
GETTERS_ALLOWED_WORKERS = {
    "workers/core.py CoreState." + name
    for name in ("view", "now_ms", "random", "tally", "aof_on", "job_count",
                 "body_bytes_held", "job_table", "queue_scan_table",
                 "queue_table")
}


def _getters(path: Path, root: Path = REPO) -> list[str]:
    """Methods whose body (past a docstring) is ``return self.<field>`` alone, in
    classes that are not Protocols (a Protocol's methods are its interface)."""
    out = []
    for cls in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(cls, ast.ClassDef) or any(
                (isinstance(b, ast.Name) and b.id == "Protocol") or
                (isinstance(b, ast.Attribute) and b.attr == "Protocol") for b in cls.bases):
            continue
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef) or fn.name.startswith("__") or len(fn.args.args) != 1:
                continue
            body = [b for b in fn.body
                    if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
            if len(body) == 1 and isinstance(body[0], ast.Return):
                v = body[0].value
                if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "self":
                    out.append(f"{path.relative_to(root)} {cls.name}.{fn.name}")
    return out


def test_no_method_only_returns_a_field() -> None:
    found = {g for p in _sources() for g in _getters(p)}
    assert found - GETTERS_ALLOWED - GETTERS_ALLOWED_WORKERS == set()
    assert GETTERS_ALLOWED_WORKERS - found == set(), "an allowance left behind: drop it"
    assert GETTERS_ALLOWED - found == set(), "an allowance left behind: drop it"


# Private members reached from outside their class, kept with their reason.
PRIVATE_ALLOWED = {
    # the libraries' own extension points, as their adapters are written
    "disque_mp/dramatiq/broker.py message._message",  # dramatiq's MessageProxy
    "disque_mp/dramatiq/broker.py message._exception",
    "disque_mp/kombu/transport.py self.connection._deliver",  # kombu's virtual transport
    "disque_mp/kombu/transport.py c._consumers",
    # the pipelined ADDJOB helper borrows the sync client's connection and failover;
    # the tests drive the same private seams (tests/client), so they stay named so
    "disque_mp/client/batching.py self.client._client",
    "disque_mp/client/batching.py self.client._make_redis",
    "disque_mp/client/batching.py self.client._raise_unless_retrying",
}


def _private_reaches(path: Path, root: Path = REPO) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            modules |= {a.asname or a.name for a in node.names}
    out = []

    def visit(node: ast.AST, own: set[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, own | _members(child))
                continue
            if isinstance(child, ast.Attribute) and _is_private(child.attr):
                v = child.value
                fine = (isinstance(v, ast.Name) and (v.id in ("self", "cls") or v.id in modules)) \
                    or (isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super") \
                    or child.attr in own
                if not fine:
                    out.append(f"{path.relative_to(root)} {ast.unparse(child)}")
            visit(child, own)

    visit(tree, set())
    return out


def test_the_finders_see_a_getter_and_a_private_reach(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import os\n\n"
                   "class A:\n    __slots__ = ('_n',)\n\n"
                   "    def n(self) -> int:\n        \"\"\"doc\"\"\"\n        return self._n\n\n"
                   "    def same(self, other: A) -> int:\n        return other._n + os._exit.__code__.co_argcount\n\n"
                   "class B:\n    def peek(self, a: A) -> int:\n        return a._n\n")
    assert _getters(src, tmp_path) == ["m.py A.n"]
    assert _private_reaches(src, tmp_path) == ["m.py a._n"]


def test_no_part_reaches_another_parts_private_members() -> None:
    found = {site for p in _sources() for site in _private_reaches(p)}
    assert found - PRIVATE_ALLOWED == set()
    assert PRIVATE_ALLOWED - found == set(), "an allowance left behind: drop it"


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


def test_job_state_only_through_its_moves() -> None:
    """``job.state`` is written by ``Job.move`` (a move of the state table),
    ``Job.enter`` (a job entering a table) or, on the per-job path, by the core's
    inline moves: each in the verb ``core.INLINE_MOVES`` names it under, writing the
    state named there (the table checks every one against ``MOVES`` at import)."""
    import workers.core
    import workers.job

    found = []
    for p in _parts("job.py"):
        for fn in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for n in ast.walk(fn):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target] \
                    if isinstance(n, (ast.AugAssign, ast.AnnAssign)) else []
                for t in targets:
                    if isinstance(t, ast.Attribute) and t.attr == "state":
                        value = n.value
                        to = getattr(workers.job, value.id, None) \
                            if isinstance(value, ast.Name) else None
                        found.append((p.name, fn.name, to))
    inline = {("core.py", verb, to) for verb, (_, to) in workers.core.INLINE_MOVES.items()}
    assert set(found) == inline and len(found) == len(inline), found


def test_parts_count_through_the_tallys_verbs() -> None:
    """No part writes a field of the core's ``Tally`` (``core.tally()``) or of its
    ``Stats``: they count their moves through the tally's verbs (``count_added``,
    ``undo_take`` ...); the core's own moves keep the rest."""
    writes = []
    for p in _parts("core.py"):
        for fn in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if not isinstance(fn, ast.FunctionDef):
                continue
            bound = set()
            for n in ast.walk(fn):
                if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and (
                        "tally()" in ast.unparse(n.value) or ".stats" in ast.unparse(n.value)):
                    bound.add(n.targets[0].id)
            for n in ast.walk(fn):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target] \
                    if isinstance(n, ast.AugAssign) else []
                for t in targets:
                    if not isinstance(t, (ast.Attribute, ast.Subscript)):
                        continue
                    text = ast.unparse(t)
                    root = t
                    while isinstance(root, (ast.Attribute, ast.Subscript)):
                        root = root.value
                    if "tally()" in text or ".stats" in text or (
                            isinstance(root, ast.Name) and root.id in bound):
                        writes.append(f"{p.name}:{n.lineno} {text}")
    assert writes == [], writes


def test_senders_name_kinds_and_build_meta_by_the_catalogue() -> None:
    """A cluster message leaves with its kind named by the catalogue's constant
    (``msg.QUEUED`` ...) and its meta built by the kind's function there
    (``queued_meta`` ...): no ``send``/``send_job`` call in workers/ passes a bare
    kind string or a dict of its own, and no other module of workers/ writes a kind's name."""
    import workers.messages

    kinds = {k.name for k in workers.messages.KINDS}
    found = []
    for p in _parts("messages.py"):
        for n in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                    and n.func.attr in ("send", "send_job"):
                for a in n.args[1:]:
                    if isinstance(a, (ast.Constant, ast.Dict)):
                        found.append(f"{p.name}:{n.lineno} {ast.unparse(a)}")
            elif isinstance(n, ast.Compare) or isinstance(n, ast.Call):
                for c in ast.walk(n):
                    if isinstance(c, ast.Constant) and c.value in kinds:
                        found.append(f"{p.name}:{n.lineno} {c.value}")
    assert found == [], found


def test_one_requeue_formula() -> None:
    """A job's next requeue (RETRY from now plus the jitter) is computed in one place,
    the core's requeue verb ``retry_at``: no other code scales a ``retry_s`` to ms."""
    sites = []
    for p in _parts():
        tree = ast.parse(p.read_text(), filename=str(p))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for n in ast.walk(fn):
                if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and any(
                        isinstance(a, ast.Attribute) and a.attr == "retry_s"
                        or isinstance(a, ast.Name) and a.id == "retry_s"
                        or isinstance(a, ast.Call) and "retry_s" in ast.unparse(a)
                        for a in (n.left, n.right)):
                    sites.append(f"{p.name} {fn.name}")
    assert sites == ["core.py retry_at"], sites


# Where a part writes a job's record itself, with the reason: the ACK kept for the
# GC (``AckGc.ack_cluster``) is the ack GC's own move, its record between its GC
# state (the attempts forgotten) and the next attempt armed.
LOG_JOB_OUTSIDE_CORE = {"ackgc.py ack_cluster"}


def test_the_moves_write_their_own_records() -> None:
    """A job's AOF record is written by the core's verb that makes the move
    (``activate``, ``arrive``, ``requeue``, ``dequeue(record=True)``, ``working``,
    ``nack_later``, ``dead_letter`` ...), not by a part calling ``log_job`` after
    writes of its own."""
    callers = set()
    for p in _parts("core.py"):
        for fn in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(fn, ast.FunctionDef) and any(
                    isinstance(n, ast.Attribute) and n.attr == "log_job" for n in ast.walk(fn)):
                callers.add(f"{p.name} {fn.name}")
    assert callers == LOG_JOB_OUTSIDE_CORE, callers


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


def test_no_interpreted_class_subclasses_a_compiled_one() -> None:
    """A class of a module outside disque_mp.compiled's list whose base is defined in
    a listed module fails at import in the compiled build ("interpreted classes cannot
    inherit from compiled"), while the pure run passes: the module must be compiled."""
    from disque_mp.compiled import COMPILED_MODULES

    compiled_classes: dict[str, str] = {}
    for path in _sources():
        name = _module_name(path)
        if name in COMPILED_MODULES:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    compiled_classes.setdefault(node.name, name)
    bad = []
    for path in _sources():
        if _module_name(path) in COMPILED_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    base_name = base.id if isinstance(base, ast.Name) else \
                        base.attr if isinstance(base, ast.Attribute) else ""
                    if base_name in compiled_classes:
                        bad.append(f"{path.relative_to(REPO)}: {node.name}({base_name}) "
                                   f"of {compiled_classes[base_name]}")
    assert not bad, bad
