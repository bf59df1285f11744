"""One error root: every exception class the package defines derives from CounterfactoryError,
keeps the builtin base callers catch, and is listed in the root's documented tree."""

from __future__ import annotations

import ast
import builtins
import importlib

import pytest

from counterfactory.manifests import errors
from counterfactory.manifests.errors import CounterfactoryError
from tests.conftest import REPO

PACKAGE_DIRS = ("counterfactory", "flows", "generation", "validation", "manifests")


def _class_definitions() -> list[tuple[str, str, list[str]]]:
    """``(file, class name, base names)`` of every class defined in the package's modules."""
    found = []
    for folder in PACKAGE_DIRS:
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                    found.append((str(path.relative_to(REPO)), node.name, bases))
    return found


DEFINITIONS = _class_definitions()
BASES: dict[str, list[list[str]]] = {}
for _file, _name, _bases in DEFINITIONS:
    BASES.setdefault(_name, []).append(_bases)


def _builtin_exception(name: str) -> bool:
    value = getattr(builtins, name, None)
    return isinstance(value, type) and issubclass(value, BaseException)


def _is_exception(name: str, seen: frozenset[str] = frozenset()) -> bool:
    if _builtin_exception(name):
        return True
    if name in seen:
        return False
    if name not in BASES:  # a third-party base: an exception by its name
        return name.endswith(("Error", "Exception"))
    return any(_is_exception(b, seen | {name}) for bases in BASES[name] for b in bases)


def _reaches_root(bases: list[str], seen: frozenset[str] = frozenset()) -> bool:
    for base in bases:
        if base == "CounterfactoryError":
            return True
        if base not in seen and any(_reaches_root(more, seen | {base}) for more in BASES.get(base, [])):
            return True
    return False


EXCEPTIONS = [
    (file, name, bases)
    for file, name, bases in DEFINITIONS
    if name != "CounterfactoryError" and any(_is_exception(b) for b in bases)
]


def test_the_walk_finds_the_package_exceptions():
    # the check below is only as good as the walk: it must see the classes spread over the layers
    names = {name for _, name, _ in EXCEPTIONS}
    assert {"SpecError", "TrialError", "SetupError", "PublishError", "SourceError", "RayTargetError"} <= names
    assert len(names) >= 29


@pytest.mark.parametrize(("file", "name", "bases"), EXCEPTIONS, ids=[f"{f}:{n}" for f, n, _ in EXCEPTIONS])
def test_every_exception_class_derives_from_the_root(file, name, bases):
    assert _reaches_root(bases), f"{file}: class {name}({', '.join(bases)}) does not derive from CounterfactoryError"


def test_the_root_documents_every_exception_class():
    tree = errors.__doc__ or ""
    missing = sorted({name for _, name, _ in EXCEPTIONS} - {w.strip("(),:") for w in tree.split()})
    assert not missing, f"not in manifests/errors.py's tree: {missing}"


@pytest.mark.parametrize(
    ("module", "name", "builtin"),
    [
        ("counterfactory.manifests.spec", "SpecError", ValueError),
        ("counterfactory.manifests.trials", "TrialError", ValueError),
        ("counterfactory.manifests.errors", "SetupError", RuntimeError),
        ("counterfactory.manifests.ledger", "LedgerError", RuntimeError),
        ("counterfactory.manifests.store", "MissingBlobError", FileNotFoundError),
        ("counterfactory.manifests.store", "DamagedBlobError", OSError),
        ("counterfactory.manifests.hub", "HubTransferError", RuntimeError),
        ("counterfactory.generation.errors", "MetadataError", ValueError),
        ("counterfactory.generation.masks", "MaskError", ValueError),
        ("counterfactory.flows.publish", "IncompleteGridError", RuntimeError),
        ("counterfactory.flows.schedule", "ScheduleError", ValueError),
    ],
)
def test_each_class_keeps_the_builtin_base_its_callers_catch(module, name, builtin):
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, CounterfactoryError) and issubclass(cls, builtin)
