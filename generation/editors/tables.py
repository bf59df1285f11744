"""Tables of existing counterfactual pairs (CSV, JSONL, Parquet), read for ``measure --batch`` and
the ``import`` editor backend.

A table has one row per pair: a source image, a candidate image and any condition labels. Paths
in it are relative to the table's own folder. Cells are read as text (a Parquet integer becomes
its decimal string); empty cells and nulls are "not given".
"""

from __future__ import annotations

import csv
import io
import json
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


def read_table(path: str | Path) -> tuple[list[str], list[TableRow]]:
    """The columns and rows of the pair table at ``path``.

    Returns:
        ``(columns, rows)``: the column names in the table's order and every data row.

    Raises:
        TableError: missing, unknown suffix, not parseable (the message names the file and,
            for JSONL, the line).
    """
    path = Path(path)
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
    rows = []
    for number, row in enumerate(raw, start=1):
        values = {str(k): t for k, v in row.items() if (t := _text(v)) is not None}
        rows.append(TableRow(number, values))
    return columns, rows
