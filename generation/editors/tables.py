"""Tables of existing counterfactual pairs (CSV, JSONL, Parquet), read for ``measure --batch`` and
the ``import`` editor backend.

A table has one row per pair: a source image, a candidate image and any condition labels. Paths
in it are relative to the table's own folder (:func:`table_folder`). Cells are read as text (a
Parquet integer becomes its decimal string); empty cells and nulls are "not given".

Besides a file, a table may be:

- a **Hugging Face dataset folder** (:func:`read_table` on a directory): its ``data/`` files (or
  its top-level ones), ``*.parquet`` and ``*.jsonl``, read with pyarrow and no network. An image
  column holds a path relative to the dataset folder, or the ``{"bytes": ..., "path": ...}``
  struct ``datasets`` writes: embedded bytes are written once, named by their sha256, into
  :func:`embedded_dir`, and the cell becomes that file's path.
- a **folder of images mapped by a pattern** (:func:`read_folder`): ``"{source}_{race}_{gender}.png"``
  makes one row per file whose path (relative to the folder) matches, its fields the columns.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from counterfactory.manifests.errors import CounterfactoryError

#: what a pair table may be
TABLE_SUFFIXES = (".csv", ".jsonl", ".parquet")


class TableError(CounterfactoryError, ValueError):
    """A table that cannot be read at all (a row's problem is that row's, not the table's)."""


@dataclass(frozen=True)
class TableRow:
    """One row of a pair table.

    Attributes:
        number: the row's 1-based number among the table's data rows (the header is not a row).
        values: column -> text, with empty cells left out.
    """

    number: int
    values: dict[str, str]

    def get(self, column: str) -> str | None:
        return self.values.get(column)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    return text or None


#: overrides where embedded images of a Hugging Face dataset are written (:func:`embedded_dir`)
EMBEDDED_DIR_ENV = "COUNTERFACTORY_EMBEDDED_DIR"
#: a pattern's field: ``{name}``
_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_MAGIC = ((b"\x89PNG", ".png"), (b"\xff\xd8", ".jpg"), (b"RIFF", ".webp"), (b"GIF8", ".gif"))


def table_folder(path: str | Path) -> Path:
    """The folder a table's relative paths are read from: the table's own folder, or the
    folder itself for a dataset folder or folder layout."""
    path = Path(path)
    return path if path.is_dir() else path.parent


def embedded_dir() -> Path:
    """Where embedded dataset images are written as files (``$COUNTERFACTORY_EMBEDDED_DIR``,
    else ``counterfactory-embedded`` in the system's temporary folder): content-addressed, so a
    second read writes nothing."""
    given = os.environ.get(EMBEDDED_DIR_ENV)
    return Path(given) if given else Path(tempfile.gettempdir()) / "counterfactory-embedded"


def _embedded(value: dict[str, Any], folder: Path) -> str | None:
    """An image struct's cell: the written file of its bytes, else its path (relative to ``folder``)."""
    data = value.get("bytes")
    if isinstance(data, (bytes, bytearray)) and data:
        sha = hashlib.sha256(data).hexdigest()
        given = Path(str(value.get("path") or "")).suffix.lower()
        suffix = given or next((ext for magic, ext in _MAGIC if data.startswith(magic)), ".img")
        target = embedded_dir() / f"{sha}{suffix}"
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.{os.getpid()}.part")
            partial.write_bytes(bytes(data))
            partial.replace(target)
        return str(target)
    return _text(value.get("path"))


def _dataset_files(path: Path) -> list[Path]:
    data = path / "data"
    where = data if data.is_dir() else path
    found = [p for p in where.rglob("*") if p.is_file() and p.suffix.lower() in (".parquet", ".jsonl")]
    return sorted(found, key=lambda p: p.relative_to(where).as_posix())


def _read_dataset(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    files = _dataset_files(path)
    if not files:
        raise TableError(
            f"{path}: a folder as a pair table is a Hugging Face dataset folder, with data/*.parquet or "
            "data/*.jsonl (or those files at its top); none found. Name a table file, or use "
            "editor.import.folder with a pattern for a folder of images"
        )
    columns: list[str] = []
    raw: list[dict[str, Any]] = []
    for file in files:
        more, rows = read_table_file(file)
        columns.extend(c for c in more if c not in columns)
        raw.extend(rows)
    return columns, raw


def _label_regex(labels: list[str]) -> str:
    """Any of ``labels``, case-insensitively, a space in one also written ``_`` or ``-``."""
    variants = sorted(labels, key=len, reverse=True)
    return "(?i:" + "|".join(r"[ _-]".join(re.escape(w) for w in label.split()) for label in variants) + ")"


def read_folder(
    folder: str | Path, pattern: str, choices: dict[str, list[str]] | None = None
) -> tuple[list[str], list[TableRow]]:
    """The rows of a folder of images whose paths follow ``pattern``.

    ``pattern`` is a path relative to ``folder`` with ``{field}`` parts, e.g.
    ``"{source}_{race}_{gender}.png"`` or ``"{race}/{source}.jpg"``; a field matches one or more
    characters other than ``/`` (the shortest that lets the whole path match), and a field
    ``choices`` names (a design axis) only one of its labels, in any case, a space also written
    ``_`` or ``-`` (so ``{source}_{race}_{gender}.png`` reads ``src_ann_east_asian_female.png``
    as source ``src_ann``, race ``east_asian``, gender ``female``). Each file whose
    path matches is a row: its fields, ``candidate`` (its path relative to ``folder``) and
    ``id`` (the same path). Hidden files (a part starting with ``.``) are not read.

    Raises:
        TableError: the folder is missing, the pattern has no field or repeats one, no file
            matches, or a file does not match (the message names the files and the pattern).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise TableError(f"{folder}: not a folder (editor.import.folder names the folder holding the images)")
    fields = _FIELD.findall(pattern)
    if not fields:
        raise TableError(f"pattern {pattern!r} has no {{field}}; write one per column, e.g. '{{source}}_{{race}}.png'")
    repeated = sorted({f for f in fields if fields.count(f) > 1})
    if repeated:
        raise TableError(f"pattern {pattern!r} names {', '.join(repeated)} twice; name each field once")
    if any(c in _FIELD.sub("", pattern) for c in "{}"):
        raise TableError(f"pattern {pattern!r}: a brace outside a {{field}}; fields are {{name}}, letters, digits, _")
    regex, at = "", 0
    for m in _FIELD.finditer(pattern):
        name = m.group(1)
        body = _label_regex(choices[name]) if choices and choices.get(name) else "[^/]+?"
        regex += re.escape(pattern[at : m.start()]) + f"(?P<{name}>{body})"
        at = m.end()
    compiled = re.compile(regex + re.escape(pattern[at:]))
    rows: list[TableRow] = []
    unmatched: list[str] = []
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    for relative in files:
        if any(part.startswith(".") for part in relative.split("/")):
            continue
        m = compiled.fullmatch(relative)
        if m is None:
            unmatched.append(relative)
            continue
        values = {k: v.strip() for k, v in m.groupdict().items() if v.strip()}
        rows.append(TableRow(len(rows) + 1, {**values, "candidate": relative, "id": relative}))
    if unmatched:
        shown = ", ".join(unmatched[:5]) + (f" and {len(unmatched) - 5} more" if len(unmatched) > 5 else "")
        raise TableError(
            f"{folder}: {len(unmatched)} file(s) do not match the pattern {pattern!r}"
            + (f" (with {', '.join(f'{{{k}}} one of {v}' for k, v in choices.items())})" if choices else "")
            + f": {shown}; rename or move them, or change editor.import.pattern"
        )
    if not rows:
        raise TableError(f"{folder}: no file matches the pattern {pattern!r}")
    return [*fields, "candidate", "id"], rows


def read_table(path: str | Path) -> tuple[list[str], list[TableRow]]:
    """The columns and rows of the pair table at ``path``.

    Returns:
        ``(columns, rows)``: the column names in the table's order and every data row.

    ``path`` may also be a Hugging Face dataset folder (see the module's docstring); image
    structs become file paths.

    Raises:
        TableError: missing, unknown suffix, not parseable (the message names the file and,
            for JSONL, the line), a folder without dataset files.
    """
    path = Path(path)
    if path.is_dir():
        columns, raw = _read_dataset(path)
    else:
        columns, raw = read_table_file(path)
    rows = []
    for number, row in enumerate(raw, start=1):
        values = {}
        for k, v in row.items():
            t = _embedded(v, path) if isinstance(v, dict) and ("bytes" in v or "path" in v) else _text(v)
            if t is not None:
                values[str(k)] = t
        rows.append(TableRow(number, values))
    return columns, rows


def read_table_file(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """The columns and raw rows (values as parsed) of one table file."""
    if path.suffix.lower() not in TABLE_SUFFIXES:
        raise TableError(
            f"{path}: a pair table is one of {', '.join(TABLE_SUFFIXES)}; got {path.suffix or 'no suffix'!r}"
        )
    if not path.is_file():
        raise TableError(f"{path}: table not found")
    suffix = path.suffix.lower()
    raw: list[dict[str, Any]]
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        except Exception as exc:  # noqa: BLE001 - any pyarrow failure is this file's problem
            raise TableError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None
        columns = list(table.column_names)
        raw = table.to_pylist()
    else:
        try:
            text = path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as exc:
            raise TableError(f"{path}: cannot read the table ({exc})") from None
        if suffix == ".csv":
            reader = csv.DictReader(io.StringIO(text, newline=""))
            columns = [name.strip() for name in reader.fieldnames or []]
            raw = [{k.strip(): v for k, v in row.items() if k is not None} for row in reader]
        else:
            columns, raw = [], []
            for line_no, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TableError(f"{path}, line {line_no}: not JSON ({exc.msg})") from None
                if not isinstance(obj, dict):
                    raise TableError(f"{path}, line {line_no}: expected a JSON object, got {type(obj).__name__}")
                columns.extend(k for k in obj if k not in columns)
                raw.append(obj)
    return columns, raw
