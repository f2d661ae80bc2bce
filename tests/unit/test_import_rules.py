"""The import rules each package states in its docstring hold on the import graph.

Every package ``__init__`` of the project (and each module at the top of ``celery_beetle``)
says what it may import and what must not import it, as two fields of its docstring::

    :May import: ``kombu_beetle``, ``celery_beetle.store``, ...
    :Not imported by: ``celery_beetle.store``, ...

This test reads those fields, walks every module of ``kombu_beetle`` and ``celery_beetle``
with :mod:`ast` (nothing is imported) and checks each import against them. A module obeys
its own docstring's fields if it has them, else those of the nearest package above it; a
wing's modules import each other freely (the two top packages have no such freedom: their
fields say what they may import). What counts as an import:

- every ``import`` and ``from ... import`` statement, wherever it is: at the top, inside a
  function (moving an import into a function hides a circle, it does not open it), and under
  ``if TYPE_CHECKING:`` (a circle made only of types is still two modules that each need
  the other to be read);
- importing ``a.b.c`` also runs the ``__init__`` of ``a.b``: the importer depends on those
  packages too (unless it sits inside them);
- ``from x import y`` imports the module ``x.y`` when there is one, else ``x``.

It also checks that no module imports another back through a circle (Tarjan's strongly
connected components over that graph), and that nothing in the repository imports a module
path that moved (:data:`celery_beetle._moved.MOVED`: those are for code outside it).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from celery_beetle._moved import MOVED, MOVED_NAMES

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kombu_beetle", "celery_beetle")
#: every Python file of the repository that could import an old path
SOURCES = ("kombu_beetle", "celery_beetle", "tests", "benchmarks", "examples", "docs", "scripts")

FIELD = re.compile(r"^:(May import|Not imported by):(.*?)(?=^:[A-Z]|^\S|\Z)", re.M | re.S)
NAME = re.compile(r"``([\w.]+)``")


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool

    @property
    def tree(self) -> ast.Module:
        return ast.parse(self.path.read_text(encoding="utf-8"), str(self.path))


@dataclass(frozen=True)
class Rule:
    """The fields of one docstring: ``may`` None means anything."""

    holder: str
    own: str | None
    may: frozenset[str] | None
    not_by: frozenset[str]


def project_modules() -> dict[str, Module]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join(parts)] = Module(".".join(parts), path, is_package)
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imported_names(module: Module, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The dotted names one statement imports (for ``from x import y``: ``x.y``, and ``x``)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, *([base] if base else [])])
    for alias in node.names:
        yield f"{base}.{alias.name}"
    yield base


def import_graph(modules: dict[str, Module]) -> dict[str, dict[str, int]]:
    """module -> {module of the project it imports: the line of the first such import}."""
    graph: dict[str, dict[str, int]] = {}
    for module in modules.values():
        edges = graph[module.name] = {}
        own_ancestors = set(_ancestors(module.name))
        for node in ast.walk(module.tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in imported_names(module, node):
                while name and name not in modules:  # a class or function: its module
                    name = name.rpartition(".")[0]
                if not name or name == module.name:
                    continue
                for target in [*_ancestors(name), name]:
                    if target not in own_ancestors and target != module.name:
                        edges.setdefault(target, node.lineno)
    return graph


def _names(text: str) -> frozenset[str]:
    return frozenset(NAME.findall(text))


def rules(modules: dict[str, Module]) -> dict[str, Rule]:
    """The rules stated by docstrings, by the name of the module or package stating them."""
    found = {}
    for module in modules.values():
        fields = {key: value for key, value in FIELD.findall(ast.get_docstring(module.tree) or "")}
        if "May import" not in fields:
            continue
        may_text = fields["May import"].strip()
        may = None if may_text.startswith("anything") else _names(may_text)
        # a wing's modules import each other freely; a top package lists what it may import
        own = module.name if "." in module.name or not module.is_package else None
        not_by = _names(fields.get("Not imported by", ""))
        found[module.name] = Rule(module.name, own, may, not_by)
    return found


def rule_for(name: str, stated: dict[str, Rule]) -> Rule | None:
    for candidate in [name, *reversed(_ancestors(name))]:
        if candidate in stated:
            return stated[candidate]
    return None


def violations(graph: dict[str, dict[str, int]], stated: dict[str, Rule]) -> list[str]:
    found = []
    for importer, targets in sorted(graph.items()):
        rule = rule_for(importer, stated)
        assert rule is not None, f"{importer}: no docstring above it states its import rules"
        for target, line in sorted(targets.items()):
            if rule.own is not None and _within(target, rule.own):
                continue
            where = f"{importer} (line {line}) imports {target}"
            if rule.may is not None and not any(_within(target, may) for may in rule.may):
                found.append(f"{where}: {rule.holder} may import only {sorted(rule.may)}")
            target_rule = rule_for(target, stated)
            if target_rule is not None and any(_within(importer, x) for x in target_rule.not_by):
                found.append(f"{where}: {target_rule.holder} says it is not imported by it")
    return found


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next((c for c in children if c in graph), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    return project_modules()


@pytest.fixture(scope="module")
def graph(modules: dict[str, Module]) -> dict[str, dict[str, int]]:
    return import_graph(modules)


def test_every_import_keeps_the_rules_its_packages_docstrings_state(modules, graph):
    found = violations(graph, rules(modules))
    assert not found, "imports against the stated rules:\n" + "\n".join(found)


def test_no_module_imports_another_back_through_a_circle(graph):
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_wings_and_the_top_modules_state_their_rules(modules):
    """Each wing's package, and each module at the top of celery_beetle, states its rules
    itself: none of them falls back on the permissive rule of the package above it."""
    stated = rules(modules)
    must = {n for n in modules if n in PACKAGES or re.fullmatch(r"celery_beetle\.\w+", n)}
    assert must - set(stated) == set()
    assert stated["kombu_beetle"].may == frozenset({"kombu_beetle"})
    assert stated["celery_beetle.store"].may == frozenset({"kombu_beetle"})
    for wing in ("celery_beetle.store", "celery_beetle.worker"):
        assert not {"celery_beetle.ops", "celery_beetle.outbox", "celery_beetle.cli"} & set(
            stated[wing].may or {"anything"}
        )


def test_nothing_in_the_repository_imports_a_path_that_moved():
    found = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                else:
                    continue
                for name in names:
                    old = name in MOVED or any(_within(name, m) for m in MOVED)
                    if old or tuple(name.rsplit(".", 1)) in MOVED_NAMES:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not found, "imports of old paths (import the new ones):\n" + "\n".join(found)


def test_the_rules_catch_a_forbidden_import_and_a_circle(tmp_path):
    """The checks themselves: a store module importing the worker, and a circle."""
    store = Module("celery_beetle.store", tmp_path / "s.py", True)
    store.path.write_text('"""The store.\n\n:May import: ``kombu_beetle``\n"""\n')
    worker = Module("celery_beetle.worker", tmp_path / "w.py", True)
    worker.path.write_text(
        '"""The worker.\n\n:May import: ``celery_beetle.store``\n'
        ':Not imported by: ``celery_beetle.store``\n"""\n'
    )
    gate = Module("celery_beetle.store.gate", tmp_path / "g.py", False)
    gate.path.write_text("from celery_beetle.worker import run\n")
    run = Module("celery_beetle.worker.run", tmp_path / "r.py", False)
    run.path.write_text("import celery_beetle.store.gate\n")
    modules = {m.name: m for m in (store, worker, gate, run)}
    graph = import_graph(modules)
    assert violations(graph, rules(modules)) == [
        "celery_beetle.store.gate (line 1) imports celery_beetle.worker: celery_beetle.store "
        "may import only ['kombu_beetle']",
        "celery_beetle.store.gate (line 1) imports celery_beetle.worker: celery_beetle.worker "
        "says it is not imported by it",
        "celery_beetle.store.gate (line 1) imports celery_beetle.worker.run: "
        "celery_beetle.store may import only ['kombu_beetle']",
        "celery_beetle.store.gate (line 1) imports celery_beetle.worker.run: "
        "celery_beetle.worker says it is not imported by it",
    ]
    assert circles(graph) == [["celery_beetle.store.gate", "celery_beetle.worker.run"]]


#: the layout's other rule: a module per idea, none longer than this (docs/guides/layout.md)
MAX_MODULE_LINES = 600


def test_no_module_outside_testing_is_longer_than_600_lines(modules):
    long = {
        name: lines
        for name, module in modules.items()
        if not _within(name, "celery_beetle.testing")
        and (lines := module.path.read_text(encoding="utf-8").count("\n")) > MAX_MODULE_LINES
    }
    assert not long, f"split by idea (or say in docs/guides/layout.md why not): {long}"
