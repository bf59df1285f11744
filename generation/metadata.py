"""Read a metadata file (YAML, CSV or JSONL) into validated :class:`SourceRecord` s.

A broken file raises :class:`~counterfactory.generation.errors.MetadataError` listing every
invalid entry at once, with the file, the entry (index, id, line), the field, what was expected
and what was received.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from counterfactory.generation.errors import MetadataError, MetadataProblem
from counterfactory.generation.records import RECORD_FIELDS, SourceRecord
from counterfactory.manifests.yamlsafe import (
    MAX_NUMBER_CHARS,
    MAX_YAML_BYTES,
    MAX_YAML_EXPANDED_CHARS,
    MAX_YAML_NODES,
    YamlDuplicateKeyError,
    YamlLimitError,
    brief,
    json_int,
    load_with_node,
)

METADATA_SUFFIXES = (".yaml", ".yml", ".csv", ".jsonl")


@dataclass
class _Entry:
    index: int
    line: int | None
    raw: Any


def load_metadata(path: str | Path) -> list[SourceRecord]:
    """Read and validate a metadata file; the format follows the suffix.

    Formats:
        ``.yaml`` / ``.yml``: a list of mappings, or a mapping ``{"sources": [...]}``.
        ``.csv``: a header row of field names; empty cells mean "not given"; ``limb_mask``
        cells hold a mask file path or JSON text; ``extra.<key>`` columns fill ``extra``.
        ``.jsonl``: one JSON object per line; blank lines are skipped.

    Returns:
        The records in file order.

    Raises:
        MetadataError: the file is missing, unparsable, has an invalid entry or a duplicate id.
            Every invalid entry of the file is listed in one message.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in METADATA_SUFFIXES:
        expected = f"a metadata file ending in {', '.join(METADATA_SUFFIXES)}"
        raise _file_error(path, expected, repr(path.suffix or "no suffix"))
    if not path.is_file():
        raise _file_error(path, "an existing metadata file", "no such file")
    if path.stat().st_size > MAX_YAML_BYTES:
        raise _file_error(
            path, f"a metadata file of at most {MAX_YAML_BYTES:,} bytes", f"{path.stat().st_size:,} bytes"
        )
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _file_error(path, "UTF-8 text", f"undecodable bytes at offset {exc.start}") from None

    if suffix == ".csv":
        entries = list(_csv_entries(path, text))
    elif suffix == ".jsonl":
        entries = list(_jsonl_entries(path, text))
    else:
        entries = _yaml_entries(path, text)

    records: list[SourceRecord] = []
    problems: list[MetadataProblem] = []
    first_index: dict[str, int] = {}
    for entry in entries:
        raw_id = entry.raw.get("id") if isinstance(entry.raw, dict) else None
        shown_id = None if raw_id is None else str(raw_id)
        if not isinstance(entry.raw, dict):
            problems.append(
                MetadataProblem(
                    index=entry.index,
                    id=None,
                    line=entry.line,
                    field=None,
                    expected="a mapping of field names to values",
                    received=_abbrev(entry.raw),
                )
            )
            continue
        duplicate = isinstance(raw_id, str) and raw_id in first_index
        if duplicate:
            problems.append(
                MetadataProblem(
                    index=entry.index,
                    id=raw_id,
                    line=entry.line,
                    field="id",
                    expected=f"an id no other entry uses (entry {first_index[raw_id]} has it too)",
                    received=repr(raw_id),
                )
            )
        elif isinstance(raw_id, str):
            first_index[raw_id] = entry.index
        try:
            record = SourceRecord.model_validate(entry.raw)
        except ValidationError as exc:
            problems += [_pydantic_problem(err, entry.index, shown_id, entry.line) for err in exc.errors()]
            continue
        if not duplicate:
            records.append(record)
    if problems:
        raise MetadataError(path, problems)
    return records


def _file_error(path: Path, expected: str, received: str, line: int | None = None) -> MetadataError:
    """A MetadataError about the file as a whole (no entry, no field)."""
    return MetadataError(path, [MetadataProblem(None, None, line, None, expected, received)])


def _abbrev(value: Any, limit: int = 80) -> str:
    return brief(value, limit)


def _pydantic_problem(err: dict[str, Any], index: int, id_: str | None, line: int | None) -> MetadataProblem:
    # Tagged-union locations repeat the tag ("limb_mask.rle.rle.size"); drop the repeat.
    loc = [str(p) for p in err["loc"]]
    cleaned = [
        p for i, p in enumerate(loc) if not (i > 0 and loc[i - 1] == "limb_mask" and p in ("polygons", "file", "rle"))
    ]
    field = ".".join(cleaned) or None
    kind, msg = err["type"], err["msg"]
    received = _abbrev(err.get("input"))
    if kind == "missing":
        expected, received = "a value (this field is required)", "nothing"
    elif kind == "extra_forbidden":
        expected = (
            f"one of the known fields ({', '.join(RECORD_FIELDS)}); free-form data goes under "
            "'extra' (CSV: an 'extra.<key>' column)"
        )
        received = f"an unknown field {field!r} = {received}"
    elif kind == "value_error":
        expected = msg.removeprefix("Value error, ")
    else:
        expected = msg.removeprefix("Input should be ").removeprefix("Input should have ")
    return MetadataProblem(index, id_, line, field, expected, received)


def _yaml_entries(path: Path, text: str) -> list[_Entry]:
    try:
        data, node = load_with_node(text)
    except YamlDuplicateKeyError as exc:
        received = f"{brief(exc.key, 60)} twice (first on line {exc.first_line})"
        raise _file_error(path, "each key once per mapping", received, exc.line) from None
    except YamlLimitError as exc:
        expected = (
            f"at most {MAX_YAML_NODES:,} values and {MAX_YAML_EXPANDED_CHARS:,} characters once aliases are "
            f"expanded, nested to a readable depth, numbers of at most {MAX_NUMBER_CHARS} characters"
        )
        raise _file_error(path, expected, str(exc)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise _file_error(path, "valid YAML", f"a syntax error ({problem})", line) from None
    items_node = node
    if isinstance(data, dict) and set(data) == {"sources"}:
        data = data["sources"]
        items_node = next(v for k, v in node.value if k.value == "sources")
    if not isinstance(data, list):
        if isinstance(data, dict):
            received = f"a mapping with keys {sorted(map(str, data))}"
        else:
            received = _abbrev(data)
        expected = "a list of sources or a mapping with one key 'sources' holding that list"
        raise _file_error(path, expected, received)
    lines = [n.start_mark.line + 1 for n in items_node.value] if isinstance(items_node, yaml.SequenceNode) else []
    return [_Entry(i, lines[i] if i < len(lines) else None, raw) for i, raw in enumerate(data)]


def _jsonl_entries(path: Path, text: str) -> Iterator[_Entry]:
    index = 0
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line, parse_int=json_int)
        except (json.JSONDecodeError, YamlLimitError) as exc:
            problem = MetadataProblem(
                index=index,
                id=None,
                line=line_no,
                field=None,
                expected="one JSON object per line",
                received=(
                    f"invalid JSON ({exc.msg} at column {exc.colno})"
                    if isinstance(exc, json.JSONDecodeError)
                    else str(exc)
                ),
            )
            raise MetadataError(path, [problem]) from None
        yield _Entry(index, line_no, raw)
        index += 1


def _csv_problem(exc: csv.Error) -> str:
    """What the csv module refused, without the cell (a message never quotes the file)."""
    if "field larger than field limit" in str(exc):
        return f"a cell of more than {csv.field_size_limit():,} characters"
    return f"text the CSV reader refuses ({exc})"


def _csv_entries(path: Path, text: str) -> Iterator[_Entry]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise _file_error(path, "a header row of field names", "an empty file") from None
    except csv.Error as exc:
        raise _file_error(path, "a header row of field names", _csv_problem(exc), line=1) from None
    header = [h.strip() for h in header]
    if any(not h for h in header) or len(set(header)) != len(header):
        expected = "a header row of distinct, non-empty field names"
        raise _file_error(path, expected, _abbrev(header), line=1)
    index = 0
    start = reader.line_num + 1
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            problem = MetadataProblem(
                index=index,
                id=None,
                line=start,
                field=None,
                expected="CSV cells of a readable size",
                received=_csv_problem(exc),
            )
            raise MetadataError(path, [problem]) from None
        line = start
        start = reader.line_num + 1
        if not any(c.strip() for c in cells):
            continue
        if len(cells) > len(header):
            problem = MetadataProblem(
                index=index,
                id=cells[header.index("id")] if "id" in header else None,
                line=line,
                field=None,
                expected=f"at most {len(header)} cells (one per header column)",
                received=f"{len(cells)} cells",
            )
            raise MetadataError(path, [problem])
        raw: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for name, cell in zip(header, cells):
            value = cell.strip()
            if not value:
                continue
            if name.startswith("extra."):
                extra[name[len("extra.") :]] = value
            elif name == "extra":
                try:
                    loaded = json.loads(value)
                except json.JSONDecodeError:
                    loaded = value
                raw["extra"] = loaded
            else:
                raw[name] = value
        if extra:
            if isinstance(raw.get("extra"), dict):
                raw["extra"] = {**raw["extra"], **extra}
            elif "extra" not in raw:
                raw["extra"] = extra
        yield _Entry(index, line, raw)
        index += 1
