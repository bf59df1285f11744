"""JSON Schemas for every JSON/JSONL file of a release, shipped in ``manifests/schemas/``.

Each release carries copies under ``schemas/`` so a harness can validate what it reads
without this package; ``counterfactory verify`` validates every file against the package's
schemas (a release cannot loosen its own rules by editing its copies).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

SCHEMAS_DIR = Path(__file__).resolve().parent / "schemas"

#: release file -> schema file (JSONL files: the schema of one row)
SCHEMA_FOR = {
    "manifest.jsonl": "manifest.schema.json",
    "items.jsonl": "item.schema.json",
    "derived.jsonl": "derived.schema.json",
    "trials.jsonl": "trial.schema.json",
    "left_out.jsonl": "left_out.schema.json",
    "stats.json": "stats.schema.json",
    "release.json": "release.schema.json",
    "diff.json": "diff.schema.json",
}
#: how many problems one file reports before the rest are summarised
_MAX_PER_FILE = 20


@cache
def load_schema(name: str) -> dict[str, Any]:
    """The parsed schema file ``name`` (e.g. ``"manifest.schema.json"``)."""
    return json.loads((SCHEMAS_DIR / name).read_text(encoding="utf-8"))


@cache
def _validator(name: str):
    from jsonschema import Draft202012Validator

    schema = load_schema(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def schema_files() -> list[Path]:
    """Every shipped schema file (copied into each release's ``schemas/``)."""
    return sorted(SCHEMAS_DIR.glob("*.schema.json"))


def _errors(name: str, where: str, value: Any) -> list[str]:
    out = []
    for error in sorted(_validator(name).iter_errors(value), key=lambda e: list(e.absolute_path)):
        at = "/".join(str(p) for p in error.absolute_path) or "(row)"
        out.append(f"{where}: {at}: {error.message[:200]} (schema {name})")
    return out


def validate_rows(release_file: str, rows: list[dict[str, Any]]) -> list[str]:
    """Schema problems of in-memory rows meant for ``release_file`` (used before sealing)."""
    name = SCHEMA_FOR[release_file]
    problems = []
    for n, row in enumerate(rows, start=1):
        problems += _errors(name, f"{release_file} row {n}", row)
    return problems


def validate_file(path: Path, release_file: str) -> list[str]:
    """Problems of one JSON or JSON-lines file against the schema for ``release_file``."""
    name = SCHEMA_FOR[release_file]
    problems: list[str] = []
    data = path.read_bytes()
    if release_file.endswith(".jsonl"):
        for n, raw in enumerate(data.split(b"\n"), start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as exc:
                problems.append(f"{release_file} line {n}: not JSON ({exc})")
                continue
            problems += _errors(name, f"{release_file} line {n}", row)
            if len(problems) > _MAX_PER_FILE:
                return problems[:_MAX_PER_FILE] + [f"{release_file}: more problems not shown"]
        return problems
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return [f"{release_file}: not JSON ({exc})"]
    return _errors(name, release_file, value)[:_MAX_PER_FILE]


def validate_release_files(release: Path) -> list[str]:
    """Validate every JSON/JSONL file of a release folder; a file with no schema is a problem."""
    release = Path(release)
    problems = []
    for path in sorted(release.rglob("*")):
        if not path.is_file() or path.suffix not in (".json", ".jsonl"):
            continue
        relative = path.relative_to(release).as_posix()
        if relative.startswith("schemas/"):
            try:
                from jsonschema import Draft202012Validator

                Draft202012Validator.check_schema(json.loads(path.read_text(encoding="utf-8")))
            except Exception as exc:  # noqa: BLE001 - any failure means "not a schema"
                problems.append(f"{relative}: not a valid JSON Schema ({str(exc)[:200]})")
            continue
        if relative not in SCHEMA_FOR:
            problems.append(f"{relative}: no schema for this file; releases hold only files they describe")
            continue
        problems += validate_file(path, relative)
    return problems
