"""ARCHITECTURE.md is a map people follow: every file it names exists, and every package module
above 600 lines is in its table of long modules with the one job it does (issue 35); no package
module is over 900 lines at all, and no function in validation/gates/ is over 80 lines: a gate is
its measures and a rule table (issue 46)."""

from __future__ import annotations

import ast
import re
import subprocess

from tests.conftest import REPO

LONG = 600
#: the hard cap: a module this long is split along a seam, not listed
MAX_LINES = 900
PACKAGE_DIRS = ("flows/", "generation/", "validation/", "manifests/")


def _architecture() -> str:
    return (REPO / "ARCHITECTURE.md").read_text()


def _long_modules_table(text: str) -> dict[str, str]:
    section = text.split("## The long modules, one job each", 1)[1]
    return dict(re.findall(r"^\| `([^`]+\.py)` \| (.+?) \|$", section, flags=re.M))


def _package_modules() -> list[str]:
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [p for p in out.split() if p.startswith(PACKAGE_DIRS)]


def test_every_long_module_is_listed_with_its_one_job():
    table = _long_modules_table(_architecture())
    long = {p for p in _package_modules() if len((REPO / p).read_text().splitlines()) > LONG}
    assert long, "the walk found no module: the rule would be vacuous"
    assert not long - set(table), (
        f"modules above {LONG} lines not in ARCHITECTURE.md's table: {sorted(long - set(table))}"
    )
    for path, job in table.items():
        assert (REPO / path).is_file(), path
        assert job.strip() and len(job) < 120, (path, job)


def test_every_file_the_map_names_exists():
    text = _architecture()
    named = set(
        re.findall(
            r"`((?:flows|generation|validation|manifests|tests|benchmarks|assets)/[\w/.-]+\.(?:py|md|json|sh))", text
        )
    )
    assert len(named) > 30
    missing = sorted(p for p in named if not (REPO / p).exists())
    assert not missing, f"ARCHITECTURE.md names files that do not exist: {missing}"


def test_no_package_module_is_over_the_hard_cap():
    sizes = {p: len((REPO / p).read_text().splitlines()) for p in _package_modules()}
    assert len(sizes) > 60, "the walk found too few modules: the rule would be vacuous"
    over = {p: n for p, n in sizes.items() if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split each along a seam, one job a module): {over}"


#: a gate function longer than this is deciding in prose: its checks belong in its rule table
MAX_GATE_FUNCTION_LINES = 80


def test_no_gate_function_is_over_80_lines():
    sizes = {}
    for path in sorted((REPO / "validation" / "gates").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                sizes[f"{path.name}::{node.name}"] = node.end_lineno - node.lineno + 1
    assert len(sizes) > 40, "the walk found too few functions: the rule would be vacuous"
    over = {name: n for name, n in sizes.items() if n > MAX_GATE_FUNCTION_LINES}
    assert not over, f"gate functions over {MAX_GATE_FUNCTION_LINES} lines (measures + a rule table): {over}"


#: the ledger's writing methods (manifests/ledger.py::Ledger)
LEDGER_WRITES = {
    "record_source",
    "record_sources",
    "start_attempt",
    "finish_attempt",
    "reopen_attempt",
    "record_candidate",
    "start_run",
    "finish_run",
}


def test_the_validation_layer_writes_nothing_to_the_ledger():
    """Judging is the validation layer's; recording a verdict is the engine's
    (flows/engine/judge.py::TemplateJudge, issue 46): no module under validation/ calls a writing
    method of the ledger, and none names the engine's workspace."""
    import ast

    from counterfactory.manifests.ledger import Ledger

    assert LEDGER_WRITES <= set(vars(Ledger)), sorted(LEDGER_WRITES - set(vars(Ledger)))
    found = []
    for path in _package_modules():
        if not path.startswith("validation/"):
            continue
        text = (REPO / path).read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LEDGER_WRITES:
                found.append(f"{path}:{node.lineno} .{node.func.attr}()")
        if "Workspace" in text:
            found.append(f"{path}: names the engine's Workspace")
    assert not found, found


#: package -> the test package mirroring it: every module has ``test_<module>.py`` there
MIRRORED = {"flows/engine": "tests/flows/engine", "validation/scoring": "tests/validation/scoring"}


def test_every_engine_and_scoring_module_has_its_test_file():
    missing = []
    for package, tests in MIRRORED.items():
        for module in sorted((REPO / package).glob("*.py")):
            if module.name != "__init__.py" and not (REPO / tests / f"test_{module.name}").is_file():
                missing.append(f"{package}/{module.name}: add {tests}/test_{module.name}")
    assert not missing, "modules without their test file:\n" + "\n".join(missing)
