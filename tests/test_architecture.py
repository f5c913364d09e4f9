"""The layout is the architecture: imports only point down the layers, and never in a circle.

Read from the source with :mod:`ast` (nothing is imported), so it also holds for code paths
the other tests do not reach. docs/architecture.md explains the layers.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "tenure"

#: Lowest first. A module may import its own capability and the layers below it, never one
#: above it, nor a sibling capability on its own layer (`tenure/__init__.py`, the public
#: facade, sits above everything and imports lazily).
LAYERS: list[set[str]] = [
    {"tenure.errors"},
    {"tenure.metrics", "tenure.tracing", "tenure.validation", "tenure._compat", "tenure._acompat"},
    {"tenure.db"},
    {"tenure.leases"},
    {"tenure.exec", "tenure.outbox", "tenure.scheduler"},
    # @tenure.once: a guard over exec's slots and the scheduler's schedules; no framework.
    {"tenure.guard"},
    # Integrations use the capabilities (the scheduler, exec's slots, the outbox); the command
    # line never imports them, so that `tenure` loads no framework. `tenure verify` drives the
    # lease core and the scheduler under faults, beside them.
    # tenure.testing: the pytest plugin users load, beside the integrations.
    {"tenure.observability", "tenure.contrib", "tenure.verify", "tenure.ui", "tenure.testing"},
    {"tenure.cli"},
]


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    load_time: bool  # at module level, not under TYPE_CHECKING


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(current: str, is_package: bool, level: int, module: str | None) -> str:
    if level == 0:
        return module or ""
    base = current.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _is_type_checking(test: ast.expr) -> bool:
    name = getattr(test, "id", None) or getattr(test, "attr", None)
    return name == "TYPE_CHECKING"


def imports_of(name: str, path: Path, known: set[str]) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[Import] = []

    def visit(node: ast.AST, load_time: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, False)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit_stmt(stmt, False)
                for stmt in child.orelse:
                    visit_stmt(stmt, load_time)
            else:
                visit_stmt(child, load_time)

    def visit_stmt(node: ast.AST, load_time: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tenure"):
                    found.append(Import(name, alias.name, node.lineno, load_time))
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(name, path.name == "__init__.py", node.level, node.module)
            if base.startswith("tenure"):
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.append(
                        Import(name, sub if sub in known else base, node.lineno, load_time)
                    )
        visit(node, load_time)

    visit(tree, True)
    return found


def layer_of(module: str) -> tuple[int, str] | None:
    for rank, layer in enumerate(LAYERS):
        for unit in layer:
            if module == unit or module.startswith(unit + "."):
                return rank, unit
    return None


def all_imports() -> list[Import]:
    found = modules()
    known = set(found)
    return [imp for name, path in found.items() for imp in imports_of(name, path, known)]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def test_every_module_belongs_to_a_layer() -> None:
    outside = [m for m in modules() if m != "tenure" and m != "tenure.__main__" and not layer_of(m)]
    assert outside == [], f"add these to a package (or LAYERS): {outside}"


def test_no_import_cycles_at_load_time() -> None:
    edges: dict[str, set[str]] = {}
    for imp in all_imports():
        if imp.load_time and imp.target != imp.source:
            edges.setdefault(imp.source, set()).add(imp.target)
    assert cycles(edges) == []


def test_imports_point_down_the_layers() -> None:
    """Lazy imports (inside functions) and typing-only ones count too: a cycle dodged by
    moving an import into a function is still a cycle in the design."""
    wrong = []
    for imp in all_imports():
        if imp.source in ("tenure", "tenure.__main__"):
            continue  # the facade
        here, there = layer_of(imp.source), layer_of(imp.target)
        if here is None or there is None or here[1] == there[1]:
            continue
        if there[0] >= here[0]:
            wrong.append(f"{imp.source}:{imp.line} imports {imp.target}")
    assert wrong == []


def test_no_imports_below_the_first_definition() -> None:
    """No import hides at the bottom of a file to dodge a cycle."""
    late = []
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        seen_definition = False
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                seen_definition = True
            elif isinstance(node, (ast.Import, ast.ImportFrom)) and seen_definition:
                late.append(f"{name}:{node.lineno}")
    assert late == []


def test_the_checks_catch_a_cycle_and_an_upward_import() -> None:
    """The graph code itself: a made-up cycle is found, a made-up upward import is flagged."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert layer_of("tenure.leases._async.client") == (3, "tenure.leases")
    assert layer_of("tenure.cli.main") == (7, "tenure.cli")
    known = set(modules())
    imports = imports_of("tenure.db.queries", PACKAGE / "db" / "queries.py", known)
    assert all(layer_of(i.target) is not None for i in imports)


@pytest.mark.parametrize(
    ("source", "target", "ok"),
    [
        ("tenure.leases._async.client", "tenure.db.queries", True),
        ("tenure.db.queries", "tenure.leases.models", False),
        ("tenure.scheduler.worker", "tenure.outbox.relay", False),
        ("tenure.cli.exec", "tenure.exec.runner", True),
        ("tenure.guard", "tenure.exec.slots", True),
        ("tenure.contrib.once", "tenure.guard", True),
        ("tenure.contrib.asgi", "tenure.observability.http", False),
    ],
)
def test_layer_rule(source: str, target: str, ok: bool) -> None:
    here, there = layer_of(source), layer_of(target)
    assert here is not None and there is not None
    assert (there[1] == here[1] or there[0] < here[0]) is ok


def unit_of(module: str) -> str:
    """The package (capability) a module belongs to: its unit in LAYERS."""
    layer = layer_of(module)
    return layer[1] if layer else module


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_definitions(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Each private name tenure defines (a function, class, attribute or variable), with the
    packages that define it."""
    defined: dict[str, set[str]] = {}
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = node.name
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                name = node.attr
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                name = node.id
            else:
                continue
            if _private(name):
                defined.setdefault(name, set()).add(unit_of(module))
    return defined


def private_reaches(trees: dict[str, ast.Module]) -> list[str]:
    """Where a package uses another package's private names: ``x._name`` where ``_name`` is
    defined by other tenure packages and not by this one (``self._x`` and ``cls._x`` are the
    object's own), and ``from tenure.<other> import _name``. Names tenure does not define
    (``os._exit``, a NamedTuple's ``_fields``) are someone else's interface."""
    defined = private_definitions(trees)
    known = set(trees)
    found = []
    for module, tree in trees.items():
        here = unit_of(module)
        is_package = module == "tenure" or module.endswith("__init__")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                owners = defined.get(node.attr, set())
                if owners and here not in owners:
                    found.append(f"{module}:{node.lineno} {ast.unparse(node)} ({min(owners)})")
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, is_package, node.level, node.module)
                there = unit_of(base if base in known else base.rsplit(".", 1)[0])
                if base.startswith("tenure") and there != here:
                    for alias in node.names:
                        if _private(alias.name):
                            found.append(f"{module}:{node.lineno} imports {base}.{alias.name}")
    return sorted(found)


def test_no_package_uses_another_packages_private_names() -> None:
    """The packages above the lease core reach the database through its public door
    (:mod:`tenure.db.executor`), not the client's pool or private helpers; the same holds
    between any two packages."""
    trees = {m: ast.parse(p.read_text(encoding="utf-8")) for m, p in modules().items()}
    assert private_reaches(trees) == []


def test_the_private_names_check_catches_a_reach() -> None:
    trees = {
        "tenure.leases.client": ast.parse(
            "class Client:\n    def __init__(self):\n        self._pool = 1\ndef _helper(): ...\n"
        ),
        "tenure.outbox.relay": ast.parse(
            "from ..leases.client import _helper\n"
            "def f(client, row):\n    self = client\n"
            "    return client._pool, self._pool, row._fields\n"
        ),
    }
    assert private_reaches(trees) == [
        "tenure.outbox.relay:1 imports tenure.leases.client._helper",
        "tenure.outbox.relay:4 client._pool (tenure.leases)",
    ]


def test_docs_architecture_names_every_module() -> None:
    """docs/architecture.md names each module (the generated ``_sync`` twins are named by
    their ``_async`` source): by its path under src/tenure, or by its file name in a
    paragraph, table row or list item that names its package."""
    doc = (SRC.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    chunks = re.split(r"\n\s*\n|\n(?=\|)|\n(?=\s*\* )", doc)
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if path.name == "__init__.py" or "_sync" in rel.parts:
            continue
        package = f"{rel.parts[0]}/" if len(rel.parts) > 1 else ""
        named = rel.as_posix() in doc or any(
            path.name in chunk and package in chunk for chunk in chunks
        )
        if not named:
            missing.append(rel.as_posix())
    assert missing == []
