"""JSON Schemas for every JSON/JSONL file of a release, shipped in ``manifests/schemas/``.

Each release carries copies under ``schemas/`` so a harness can validate what it reads
without this package; ``counterfactory verify`` validates every file against the package's
schemas (a release cannot loosen its own rules by editing its copies).

Plug-ins extend two of them: a release file a plug-in registers
(:mod:`counterfactory.manifests.release_files`) brings its own row schema, and a trial protocol
a plug-in registers is added to ``trial.schema.json``'s ``protocol`` values (in the copy a
release ships only when its bank uses one, so other releases' copies are the files as shipped).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from counterfactory.manifests.release_files import ReleaseFile, registered_schema, schema_file_name

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


TRIAL_SCHEMA = "trial.schema.json"


def trial_schema(protocols: Sequence[str]) -> dict[str, Any]:
    """``trial.schema.json`` whose ``protocol`` values also hold ``protocols`` (those not in it
    already, in the order given); the file's own schema when there are none."""
    schema = load_schema(TRIAL_SCHEMA)
    known = schema["properties"]["protocol"]["enum"]
    extra = [p for p in dict.fromkeys(protocols) if p not in known]
    if not extra:
        return schema
    out = copy.deepcopy(schema)
    out["properties"]["protocol"]["enum"] = [*known, *extra]
    return out


def _plugin_protocols() -> tuple[str, ...]:
    from counterfactory.manifests.trials import protocol_names

    return tuple(protocol_names())


def _validator(name: str):
    """The validator of the schema ``name``: a shipped file (the trial schema with every
    registered protocol), or ``plugin:<release file>`` for a plug-in's release file."""
    return _compiled(name, _plugin_protocols() if name == TRIAL_SCHEMA else ())


@cache
def _compiled(name: str, protocols: tuple[str, ...]):
    from jsonschema import Draft202012Validator

    if name.startswith("plugin:"):
        schema = registered_schema(name.removeprefix("plugin:")) or {}
    elif name == TRIAL_SCHEMA:
        schema = trial_schema(protocols)
    else:
        schema = load_schema(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def schema_name_for(release_file: str) -> str | None:
    """The schema a release file is checked against, or None when it has none: a shipped
    schema file's name, or ``plugin:<release file>`` for a registered plug-in release file."""
    if release_file in SCHEMA_FOR:
        return SCHEMA_FOR[release_file]
    if release_file.endswith(".jsonl") and "/" not in release_file:
        if registered_schema(release_file) is not None:
            return f"plugin:{release_file}"
    return None


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
    name = schema_name_for(release_file) or SCHEMA_FOR[release_file]
    problems = []
    for n, row in enumerate(rows, start=1):
        problems += _errors(name, f"{release_file} row {n}", row)
    return problems


def validate_file(path: Path, release_file: str) -> list[str]:
    """Problems of one JSON or JSON-lines file against the schema for ``release_file``."""
    name = schema_name_for(release_file) or SCHEMA_FOR[release_file]
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
        if schema_name_for(relative) is None:
            problems.append(f"{relative}: no schema for this file; releases hold only files they describe")
            continue
        problems += validate_file(path, relative)
    return problems


def write_release_schemas(
    folder: Any, protocols: Sequence[str], built: dict[str, tuple[list[Any], ReleaseFile]]
) -> None:
    """Beside the shipped schema copies in ``folder``: the trial schema holding the plug-in
    protocols ``protocols`` uses (only when it uses one) and each built plug-in file's schema."""
    folder = Path(folder)
    trial = trial_schema(protocols)
    if trial != load_schema(TRIAL_SCHEMA):
        (folder / TRIAL_SCHEMA).write_text(json.dumps(trial, indent=2) + "\n", encoding="utf-8")
    for name, (_, made) in built.items():
        (folder / schema_file_name(name)).write_text(json.dumps(made.schema, indent=2) + "\n", encoding="utf-8")
