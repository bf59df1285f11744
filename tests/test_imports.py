"""The package's import layering, read from the source with ``ast`` (nothing is imported).

An import is any way a module names another: an import statement at module level, inside a
function (a lazy import is still a dependency) or under ``if TYPE_CHECKING:`` (the module still
knows the other), and a string that names a module of the package (``model_at("x.y", ...)``,
``import_module("x.y")``, an entry-point string ``"x.y:name"``, a constant holding a module
path): a module reached by name is still a module the namer knows.

- ``generation``, ``validation`` and ``manifests`` never import ``counterfactory.flows`` or
  Prefect (``prefect``, ``prefect_ray``): the engine below ``flows/`` runs without the
  orchestrator, and ``flows/`` is the only layer that wires it in.
- ``manifests`` is the bottom layer: it imports nothing from ``generation``, ``validation`` or
  ``flows``, by statement or by name, and no string of its code (a docstring aside) names a
  module above it, whole or in part (``"counterfactory.validation.x"``, ``"validation.x"``), so a
  table of module names it loads by name would be caught; nor does it read anything from the
  package root (``counterfactory/__init__.py``) but ``__version__``, and the root names no module
  of the layers, so a table kept there for the bottom layer to read is caught too. Each
  registry lives with its kind (``generation/editors/registry.py``, ``validation/gates/``, ...);
  the spec is composed in the engine (``flows/engine/spec.py``).
- No two modules of the package import each other, directly or through others: the module
  import graph has no cycle. This rule counts the import statements that run (not
  ``TYPE_CHECKING`` blocks, not names: a registry loading its plug-ins by name is how a bottom
  layer reaches the layers above without importing them). Relative imports and ``from
  counterfactory.x import y`` (``y`` a module or a name in ``x``) are both resolved to the
  module they load.

Folders map to packages as ``pyproject.toml``'s ``package-dir`` says (``flows/`` is
``counterfactory.flows``, ...).
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tests.conftest import REPO

#: the layers below flows/: none of them may import what is named in FORBIDDEN
LOWER = ("counterfactory.generation", "counterfactory.validation", "counterfactory.manifests")
FORBIDDEN = ("counterfactory.flows", "prefect", "prefect_ray")
#: what manifests/ (the bottom layer) may not import
ABOVE_MANIFESTS = ("counterfactory.generation", "counterfactory.validation", "counterfactory.flows")


@dataclass(frozen=True)
class Import:
    """One import statement's target, resolved to a module name where it is the package's."""

    source: str  # the importing module
    target: str  # the dotted name imported (a module of the package, or an outside name)
    line: int
    lazy: bool  # inside a function (or a class body), not at module level
    type_only: bool  # under ``if TYPE_CHECKING:``
    by_name: bool = False  # a string naming the module, not an import statement

    def where(self) -> str:
        how = "".join(
            f", {word}"
            for word, on in (("lazy", self.lazy), ("TYPE_CHECKING", self.type_only), ("by name", self.by_name))
            if on
        )
        return f"{self.source} -> {self.target} (line {self.line}{how})"


#: a string that names a module of the package: a dotted path, or an entry point ``path:name``
MODULE_NAME = re.compile(r"^counterfactory(?:\.\w+)+(?::[\w.]+)?$")


@cache
def modules() -> dict[str, tuple[Path, bool]]:
    """``{module name: (file, is a package)}`` for every ``.py`` file of the package."""
    roots = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    out: dict[str, tuple[Path, bool]] = {}
    for package, folder in roots.items():
        base = REPO / folder
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            if "__pycache__" in rel.parts:
                continue
            # a nested folder belongs to the package whose folder is nearest (the longest root)
            owner = max((p for p, f in roots.items() if path.is_relative_to(REPO / f)), key=len)
            if owner != package:
                continue
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([package, *parts])
            out[name] = (path, rel.name == "__init__")
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(name: str, known: dict[str, tuple[Path, bool]]) -> str:
    """The longest prefix of ``name`` that is a module of the package, or ``name`` itself."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in known:
            return candidate
    return name


@cache
def imports_of(module: str) -> tuple[Import, ...]:
    """Every import ``module`` makes, at any depth of its syntax tree."""
    known = modules()
    path, is_package = known[module]
    return imports_in(path.read_text(encoding="utf-8"), module, is_package, known)


def imports_in(source: str, module: str, is_package: bool, known: dict[str, tuple[Path, bool]]) -> tuple[Import, ...]:
    """Every import the module ``module`` whose text is ``source`` makes: statements and names."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                visit(child, True, type_only)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), lazy, True)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), lazy, type_only)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(Import(module, _resolve(alias.name, known), child.lineno, lazy, type_only))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (child.level - 1)]
                    base = ".".join(anchor + ([child.module] if child.module else []))
                else:
                    base = child.module or ""
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    target = sub if sub in known else _resolve(base, known)
                    found.append(Import(module, target, child.lineno, lazy, type_only))
            elif isinstance(child, ast.Constant) and isinstance(child.value, str) and MODULE_NAME.match(child.value):
                target = _resolve(child.value.partition(":")[0], known)
                found.append(Import(module, target, child.lineno, lazy, type_only, by_name=True))
            else:
                visit(child, lazy, type_only)

    visit(tree, False, False)
    return tuple(found)


def _in(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_modules_are_found():
    """The walk sees the package (a broken mapping would make the rules below vacuous)."""
    found = modules()
    for expected in (
        "counterfactory",
        "counterfactory.flows.cli",
        "counterfactory.generation.editors",
        "counterfactory.validation.gates.locality",
        "counterfactory.manifests.spec",
    ):
        assert expected in found
    assert len(found) > 60
    edges = [i for m in found for i in imports_of(m) if i.target in found]
    assert len(edges) > 200


def test_imports_by_name_and_for_type_checking_are_imports():
    """The reader counts what the layering rules count (a reader that missed these would make
    the rule for manifests/ vacuous)."""
    known = modules()
    source = """
from typing import TYPE_CHECKING
import importlib
from counterfactory.manifests.registry import model_at
if TYPE_CHECKING:
    from counterfactory.generation.align import AlignConfig
Design = model_at("counterfactory.generation.sampling", "DesignConfig")
def load():
    return importlib.import_module("counterfactory.validation.release_derived")
ENTRY = "counterfactory.flows.cli:main"
NOT_A_MODULE = "counterfactory is a package; see counterfactory.flows.cli"
"""
    found = imports_in(source, "counterfactory.manifests.example", False, known)
    assert [(i.target, i.type_only, i.by_name, i.lazy) for i in found] == [
        ("typing", False, False, False),
        ("importlib", False, False, False),
        ("counterfactory.manifests.registry", False, False, False),
        ("counterfactory.generation.align", True, False, False),
        ("counterfactory.generation.sampling", False, True, False),
        ("counterfactory.validation.release_derived", False, True, True),
        ("counterfactory.flows.cli", False, True, False),
    ]
    above = [i for i in found if _in(i.target, ABOVE_MANIFESTS)]
    assert len(above) == 4


def test_lower_layers_never_import_flows_or_prefect():
    bad = [
        i.where() + (" [TYPE_CHECKING]" if i.type_only else "")
        for m in modules()
        if _in(m, LOWER)
        for i in imports_of(m)
        if _in(i.target, FORBIDDEN)
    ]
    assert not bad, "generation/, validation/ and manifests/ must not import flows or prefect:\n" + "\n".join(bad)


def test_manifests_imports_nothing_above_it():
    bad = [
        i.where()
        for m in modules()
        if _in(m, ("counterfactory.manifests",))
        for i in imports_of(m)
        if _in(i.target, ABOVE_MANIFESTS)
    ]
    assert not bad, "manifests/ is the bottom layer and must not import generation, validation or flows:\n" + "\n".join(
        bad
    )


#: a string naming a module above manifests/: dotted, anywhere in the string, or a bare subpackage path
UPPER_NAME = re.compile(
    r"\bcounterfactory\.(?:generation|validation|flows)\b|^(?:generation|validation|flows)(?:\.\w+)+$"
)
#: what manifests/ may read from the package root
ROOT_NAMES = frozenset({"__version__"})


def _docstrings(tree: ast.AST) -> set[int]:
    """``id`` of every docstring node (a module's, class's or function's first statement string)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def upper_names_in(source: str) -> list[tuple[int, str]]:
    """``(line, string)`` of every string of ``source`` (docstrings aside) that names a module
    of ``generation``, ``validation`` or ``flows``."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docs
        and UPPER_NAME.search(node.value)
    ]


def root_reads_in(source: str) -> list[tuple[int, str]]:
    """``(line, name)`` of what ``source`` takes from the package root ``counterfactory`` beyond
    :data:`ROOT_NAMES`: ``from counterfactory import X``, ``import counterfactory`` then
    ``counterfactory.X`` (a subpackage's attribute path is not the root's)."""
    tree = ast.parse(source)
    found = []
    root_aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "counterfactory" and not node.level:
            found += [(node.lineno, a.name) for a in node.names if a.name not in ROOT_NAMES]
        elif isinstance(node, ast.Import):
            root_aliases |= {a.asname or a.name for a in node.names if a.name == "counterfactory"}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in root_aliases
            and node.attr not in ROOT_NAMES
            and f"counterfactory.{node.attr}" not in modules()
        ):
            found.append((node.lineno, node.attr))
    return found


def test_the_string_and_root_readers_catch_a_table_of_upper_modules():
    """What the two rules below count (readers that missed these would make them vacuous): a
    table of module names in manifests/, and one in the package root that manifests/ reads."""
    in_manifests = '''"""Docstrings may point a reader at counterfactory.flows.cli."""
from counterfactory import BUILT_IN_MODULES, __version__
import counterfactory
BUILT_INS = {"editor": ("counterfactory.generation.editors",), "gate": ("validation.gates",)}
HINT = f"see counterfactory.validation.gates for {BUILT_INS}"
kinds = counterfactory.BUILT_IN_MODULES
version = counterfactory.__version__
SAME_LAYER = ("counterfactory.manifests.protocols", "generation of trials")
'''
    assert sorted(line for line, _ in upper_names_in(in_manifests)) == [4, 4, 5]
    assert root_reads_in(in_manifests) == [(2, "BUILT_IN_MODULES"), (6, "BUILT_IN_MODULES")]
    in_root = '''"""The package; its subpackages are counterfactory.flows, counterfactory.generation, ..."""
BUILT_IN_MODULES = {"editor": ("counterfactory.generation.editors",)}
'''
    assert [line for line, _ in upper_names_in(in_root)] == [2]


def test_manifests_names_no_upper_module_in_any_string():
    bad = [
        f"{m} line {line}: {value[:80]!r}"
        for m, (path, _) in modules().items()
        if _in(m, ("counterfactory.manifests",))
        for line, value in upper_names_in(path.read_text(encoding="utf-8"))
    ]
    assert not bad, "manifests/ names no module above it, even as a string to import by name:\n" + "\n".join(bad)


def test_manifests_reads_no_table_from_the_package_root_and_the_root_names_no_layer_module():
    reads = [
        f"{m} line {line}: counterfactory.{name}"
        for m, (path, _) in modules().items()
        if _in(m, ("counterfactory.manifests",))
        for line, name in root_reads_in(path.read_text(encoding="utf-8"))
    ]
    assert not reads, "manifests/ reads nothing from the package root but __version__:\n" + "\n".join(reads)
    root, _ = modules()["counterfactory"]
    named = upper_names_in(root.read_text(encoding="utf-8"))
    assert not named, f"the package root names modules of the layers (a table of built-ins?): {named}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, or a module importing
    itself (Tarjan's algorithm), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def strong(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
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
            if len(component) > 1 or v in graph.get(v, ()):
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _path(graph: dict[str, set[str]], start: str, members: set[str]) -> list[str]:
    """A shortest cycle through ``start`` inside ``members`` (breadth first), as a module list
    that begins and ends with ``start``."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in a cycle but no path leads back to it")


def test_no_import_cycles_lazy_imports_included():
    known = modules()
    graph: dict[str, set[str]] = {m: set() for m in known}
    lines: dict[tuple[str, str], Import] = {}
    for m in known:
        for i in imports_of(m):
            if i.target in known and not i.type_only and not i.by_name:
                graph[m].add(i.target)
                lines.setdefault((m, i.target), i)
    report = []
    for component in _cycles(graph):
        path = _path(graph, component[0], set(component))
        steps = [lines[(a, b)].where() for a, b in zip(path, path[1:])]
        report.append(f"cycle among {len(component)} modules {component}:\n  " + "\n  ".join(steps))
    assert not report, "import cycles (a lazy import counts):\n" + "\n".join(report)


def test_the_cycle_finder_finds_a_lazy_cycle_and_its_path():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(graph) == [["a", "b", "c"], ["e"]]
    assert _path(graph, "a", {"a", "b", "c"}) == ["a", "b", "c", "a"]
    assert _path(graph, "e", {"e"}) == ["e", "e"]
