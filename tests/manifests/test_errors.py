"""One error root: every exception class the package defines derives from CounterfactoryError,
keeps the builtin base callers catch, and is listed in the root's documented tree."""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from pathlib import Path

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


#: one entry of the documented tree: the drawing, the class, its builtin bases, its module
_ENTRY = re.compile(
    r"^    (?P<drawing>[ │├└─]*)(?P<name>_?[A-Z]\w*)(?: \((?P<builtins>[A-Za-z, ]+)\))?\s+(?P<module>[a-z_][\w.]*):"
)


def _module_of(file: str) -> str:
    """``manifests/paid/fal.py`` -> ``manifests.paid.fal`` (as the tree names modules)."""
    parts = list(Path(file).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def documented_tree(doc: str) -> dict[str, tuple[str, str | None, tuple[str, ...]]]:
    """``{class: (module, parent class, builtin bases)}`` read from the tree drawn in ``doc``:
    an entry's parent is the nearest entry above it drawn one level (4 columns) less deep."""
    tree: dict[str, tuple[str, str | None, tuple[str, ...]]] = {}
    stack: list[tuple[int, str]] = []
    for line in doc.split("::", 1)[1].splitlines():
        match = _ENTRY.match(line)
        if match is None:
            continue
        depth = len(match["drawing"]) // 4
        del stack[depth:]
        assert len(stack) == depth, f"the tree skips a level at {line.strip()!r}"
        name = match["name"]
        assert name not in tree, f"{name} is drawn twice in the tree"
        builtins_ = tuple(b.strip() for b in (match["builtins"] or "").split(",") if b.strip())
        tree[name] = (match["module"], stack[-1][1] if stack else None, builtins_)
        stack.append((depth, name))
    return tree


def test_the_tree_reader_reads_depth_builtins_and_modules():
    doc = """x::

    Root                      a.b: the root.
    ├── One (ValueError)      a.c: one,
    │   │                     more.
    │   └── Two               a.d.e: two.
    └── Three (OSError, KeyError)  f: three.
    """
    assert documented_tree(doc) == {
        "Root": ("a.b", None, ()),
        "One": ("a.c", "Root", ("ValueError",)),
        "Two": ("a.d.e", "One", ()),
        "Three": ("f", "Root", ("OSError", "KeyError")),
    }


def test_the_root_documents_every_exception_class_with_its_module_and_bases():
    """The tree in manifests/errors.py's docstring is the package's: the same classes, each in
    the module that defines it, under its package base, with the builtins it keeps."""
    tree = documented_tree(errors.__doc__ or "")
    defined = {name: (file, bases) for file, name, bases in EXCEPTIONS}
    defined["CounterfactoryError"] = ("manifests/errors.py", ["Exception"])
    assert len(defined) == len(EXCEPTIONS) + 1, "two exception classes share a name: the tree cannot tell them apart"
    assert sorted(set(defined) - set(tree)) == [], "exception classes missing from manifests/errors.py's tree"
    assert sorted(set(tree) - set(defined)) == [], "classes in manifests/errors.py's tree that the package lacks"
    wrong = []
    for name, (module, parent, builtins_) in tree.items():
        file, bases = defined[name]
        if module != _module_of(file):
            wrong.append(f"{name}: drawn in {module}, defined in {_module_of(file)}")
        own = [b for b in bases if not _builtin_exception(b)]
        kept = tuple(b for b in bases if _builtin_exception(b) and b != "Exception")
        if own != ([parent] if parent else []):
            wrong.append(f"{name}: drawn under {parent}, derives from {', '.join(own) or 'no package class'}")
        if kept != builtins_:
            wrong.append(f"{name}: drawn with builtins {builtins_}, keeps {kept}")
    assert not wrong, "manifests/errors.py's tree has drifted:\n" + "\n".join(wrong)


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
        ("counterfactory.flows.engine.release", "IncompleteGridError", RuntimeError),
        ("counterfactory.flows.schedule", "ScheduleError", ValueError),
    ],
)
def test_each_class_keeps_the_builtin_base_its_callers_catch(module, name, builtin):
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, CounterfactoryError) and issubclass(cls, builtin)


def test_no_module_raises_a_bare_file_not_found_error():
    """What a user can cause (a folder that is not a release, a missing file) raises a class of
    the tree, which the CLI turns into one ``error:`` line; a bare ``FileNotFoundError`` would be
    a traceback (``release_tables`` and ``ReleaseStage.seal`` raised one)."""
    import ast

    from tests.conftest import REPO

    bare = []
    for folder in ("flows", "generation", "validation", "manifests"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                call = node.exc if isinstance(node, ast.Raise) else None
                func = call.func if isinstance(call, ast.Call) else call
                if isinstance(func, ast.Name) and func.id == "FileNotFoundError":
                    bare.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not bare, bare


def test_a_folder_that_is_not_a_release_is_named_in_one_error(tmp_path):
    from counterfactory.manifests.hub_tables import release_tables
    from counterfactory.manifests.release import NotAReleaseError

    with pytest.raises(NotAReleaseError, match="items.jsonl"):
        release_tables(tmp_path)
