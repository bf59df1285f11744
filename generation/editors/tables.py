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
  :func:`embedded_dir`, and the cell becomes that file's path (:attr:`TableRow.embedded` says
  which cells are such files, and their sha256). A file already there is re-hashed before it
  is used and written again when its bytes are not its name's.
- a **folder of images mapped by a pattern** (:func:`read_folder`): ``"{source}_{race}_{gender}.png"``
  makes one row per file whose path (relative to the folder) matches, its fields the columns.

Nothing a table names is trusted (:mod:`counterfactory.manifests.safefiles`): a table file and
a dataset shard are read only when regular and at most ``max_table_bytes``; a dataset shard or a
folder's file that is a symbolic link leading outside the folder is refused. The paths in the
cells are checked by the reader of the rows (the import backend), which knows each row.
"""

from __future__ import annotations

import atexit
import csv
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.safefiles import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_TABLE_BYTES,
    InputFileError,
    inside,
    private_dir,
    read_regular,
    sha256_file,
)
from counterfactory.manifests.yamlsafe import YamlLimitError, json_int

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
        embedded: column -> sha256, for the cells that hold image bytes embedded in the table:
            their value is the path of the file those bytes were written to (in
            :func:`embedded_dir`), not a path the table gave.
    """

    number: int
    values: dict[str, str]
    embedded: dict[str, str] = field(default_factory=dict)

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
#: the folder of a run's ``--out`` that holds the embedded images (mode 0700)
EMBEDDED_SUBDIR = "embedded"
#: a pattern's field: ``{name}``
_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_MAGIC = ((b"\x89PNG", ".png"), (b"\xff\xd8", ".jpg"), (b"RIFF", ".webp"), (b"GIF8", ".gif"))
_SUFFIX = re.compile(r"^\.[a-z0-9]{1,8}$")
_PROCESS_DIR: list[Path] = []
_PROCESS_LOCK = threading.Lock()


def table_folder(path: str | Path) -> Path:
    """The folder a table's relative paths are read from: the table's own folder, or the
    folder itself for a dataset folder or folder layout."""
    path = Path(path)
    return path if path.is_dir() else path.parent


def embedded_dir(run_folder: str | Path | None = None) -> Path:
    """Where embedded dataset images are written as files, made if missing: content-addressed,
    so a second read writes nothing, and re-hashed before each use, so a file put there by
    someone else is never taken for the image its name says.

    ``$COUNTERFACTORY_EMBEDDED_DIR`` when set (a folder of this user's own, not a link, made
    mode 0700); else ``embedded/`` in the run's folder
    (``run_folder``, mode 0700, refused when it belongs to another user); else a folder of this
    process's own (made with mode 0700 under an unguessable name, removed at exit). Never the
    shared temporary folder under a fixed name, which any local user could make first.
    """
    given = os.environ.get(EMBEDDED_DIR_ENV)
    if given:
        # held to the run folder's rule: a folder of this user's own (not a link), made 0700
        return private_dir(given)
    if run_folder is not None:
        return private_dir(Path(run_folder) / EMBEDDED_SUBDIR)
    with _PROCESS_LOCK:
        if not _PROCESS_DIR:
            made = Path(tempfile.mkdtemp(prefix="counterfactory-embedded-"))
            atexit.register(shutil.rmtree, made, ignore_errors=True)
            _PROCESS_DIR.append(made)
        return _PROCESS_DIR[0]


def _cached(target: Path, sha: str, max_bytes: int) -> bool:
    """Whether ``target`` is a regular file whose bytes hash to ``sha``."""
    try:
        return sha256_file(target, max_bytes) == sha
    except (OSError, InputFileError):
        return False


def _embedded(value: dict[str, Any], cache: Callable[[], Path], max_bytes: int) -> tuple[str | None, str | None]:
    """An image struct's cell: ``(the written file of its bytes, their sha256)``, else
    ``(its path as given, None)``."""
    data = value.get("bytes")
    if isinstance(data, (bytes, bytearray)) and data:
        if len(data) > max_bytes:
            raise InputFileError(
                f"embedded image bytes of {len(data):,} bytes, over the limit of {max_bytes:,} "
                "(editor.import.max_file_bytes)"
            )
        sha = hashlib.sha256(data).hexdigest()
        given = Path(str(value.get("path") or "").replace("\x00", "")).suffix.lower()
        suffix = (
            given
            if _SUFFIX.fullmatch(given)
            else next((ext for magic, ext in _MAGIC if data.startswith(magic)), ".img")
        )
        folder = cache()
        target = folder / f"{sha}{suffix}"
        if not _cached(target, sha, max_bytes):
            # a file of other bytes (or a link, or a FIFO) under this name is replaced, never used
            fd, partial = tempfile.mkstemp(prefix=f".{sha}.", suffix=".part", dir=folder)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(bytes(data))
                os.replace(partial, target)
            except BaseException:
                Path(partial).unlink(missing_ok=True)
                raise
        return str(target), sha
    path = value.get("path")
    return _text(path), None


def _dataset_files(path: Path) -> list[Path]:
    data = path / "data"
    where = data if data.is_dir() else path
    found = []
    for p in where.rglob("*"):
        if p.suffix.lower() not in (".parquet", ".jsonl") or not p.is_file():
            continue
        relative = p.relative_to(where).as_posix()
        try:
            inside(path, p.relative_to(path).as_posix(), what="the dataset folder")
        except InputFileError as exc:
            raise TableError(f"{path}: the dataset file {relative}: {exc}") from None
        found.append(p)
    return sorted(found, key=lambda p: p.relative_to(where).as_posix())


def _read_dataset(path: Path, max_table_bytes: int) -> tuple[list[str], list[dict[str, Any]]]:
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
        more, rows = read_table_file(file, max_bytes=max_table_bytes)
        columns.extend(c for c in more if c not in columns)
        raw.extend(rows)
    return columns, raw


def _label_regex(labels: list[str]) -> str:
    """Any of ``labels``, case-insensitively, a space in one also written ``_`` or ``-``."""
    variants = sorted(labels, key=len, reverse=True)
    return "(?i:" + "|".join(r"[ _-]".join(re.escape(w) for w in label.split()) for label in variants) + ")"


def read_folder(
    folder: str | Path, pattern: str, choices: dict[str, list[str]] | None = None, *, roots: tuple[Path, ...] = ()
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

    A file that is a symbolic link is followed; one leading outside ``folder`` (or into none of
    ``roots``) is refused, naming it.

    Raises:
        TableError: the folder is missing, the pattern has no field or repeats one, no file
            matches, a file does not match, or a link leads outside (the message names the
            files and the pattern).
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
    # (a link is followed: one to a file is that file, checked below to stay inside)
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    for relative in files:
        if any(part.startswith(".") for part in relative.split("/")):
            continue
        try:
            inside(folder, relative, roots=roots, what="the folder")
        except InputFileError as exc:
            raise TableError(f"{folder}: the file {relative}: {exc}") from None
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


def read_table(
    path: str | Path,
    *,
    run_folder: str | Path | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_table_bytes: int = DEFAULT_MAX_TABLE_BYTES,
) -> tuple[list[str], list[TableRow]]:
    """The columns and rows of the pair table at ``path``.

    Returns:
        ``(columns, rows)``: the column names in the table's order and every data row.

    ``path`` may also be a Hugging Face dataset folder (see the module's docstring); image
    structs become file paths, written into :func:`embedded_dir` of ``run_folder`` (only when
    a struct holds bytes) and listed in each row's :attr:`TableRow.embedded`.

    Args:
        path: the table file or dataset folder.
        run_folder: the run's ``--out``, which keeps the embedded images (see :func:`embedded_dir`).
        max_file_bytes: the largest embedded image.
        max_table_bytes: the largest table file or dataset shard.

    Raises:
        TableError: missing, unknown suffix, not a regular file or too large, not parseable
            (the message names the file and the row or line), a folder without dataset files,
            a dataset file that is a link leading outside it, an embedded image too large.
    """
    path = Path(path)
    if path.is_dir():
        columns, raw = _read_dataset(path, max_table_bytes)
    else:
        columns, raw = read_table_file(path, max_bytes=max_table_bytes)
    folder: list[Path] = []

    def cache() -> Path:
        if not folder:
            try:
                folder.append(embedded_dir(run_folder))
            except InputFileError as exc:
                raise TableError(f"{path}: the folder for its embedded images: {exc}") from None
        return folder[0]

    rows = []
    for number, row in enumerate(raw, start=1):
        values, embedded = {}, {}
        for k, v in row.items():
            sha = None
            if isinstance(v, dict) and ("bytes" in v or "path" in v):
                try:
                    t, sha = _embedded(v, cache, max_file_bytes)
                except InputFileError as exc:
                    raise TableError(f"{path}, row {number}, column {str(k)!r}: {exc}") from None
                except OSError as exc:
                    raise TableError(
                        f"{path}, row {number}, column {str(k)!r}: cannot write its embedded image into "
                        f"{cache()} ({exc.strerror or exc})"
                    ) from None
            else:
                t = _text(v)
            if t is not None:
                values[str(k)] = t
                if sha is not None:
                    embedded[str(k)] = sha
        rows.append(TableRow(number, values, embedded))
    return columns, rows


def read_table_file(path: Path, *, max_bytes: int = DEFAULT_MAX_TABLE_BYTES) -> tuple[list[str], list[dict[str, Any]]]:
    """The columns and raw rows (values as parsed) of one table file (a regular file of at
    most ``max_bytes``)."""
    if path.suffix.lower() not in TABLE_SUFFIXES:
        raise TableError(
            f"{path}: a pair table is one of {', '.join(TABLE_SUFFIXES)}; got {path.suffix or 'no suffix'!r}"
        )
    if not path.exists():
        raise TableError(f"{path}: table not found")
    try:
        data = read_regular(path, max_bytes, limit_field="editor.import.max_table_bytes")
    except InputFileError as exc:
        raise TableError(f"{path}: {exc}") from None
    except OSError as exc:
        raise TableError(f"{path}: cannot read the table ({exc.strerror or exc})") from None
    suffix = path.suffix.lower()
    raw: list[dict[str, Any]]
    if suffix == ".parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pq.read_table(pa.BufferReader(data))
        except Exception as exc:  # noqa: BLE001 - any pyarrow failure is this file's problem
            raise TableError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None
        columns = list(table.column_names)
        raw = table.to_pylist()
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise TableError(f"{path}: not UTF-8 text (undecodable bytes at offset {exc.start})") from None
        if suffix == ".csv":
            reader = csv.DictReader(io.StringIO(text, newline=""))
            raw, columns = [], None
            try:
                columns = [name.strip() for name in reader.fieldnames or []]
                for row in reader:
                    raw.append({k.strip(): v for k, v in row.items() if k is not None})
            except csv.Error as exc:
                where = f"row {len(raw) + 1} (line {reader.line_num + 1})" if columns is not None else "its header"
                limit = csv.field_size_limit()
                problem = (
                    f"a cell of more than {limit:,} characters"
                    if "field larger than field limit" in str(exc)
                    else f"not CSV ({exc})"
                )
                raise TableError(
                    f"{path}, {where}: {problem}; a pair table's cells are paths, ids and labels: check the file"
                ) from None
        else:
            columns, raw = [], []
            for line_no, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line, parse_int=json_int)
                except json.JSONDecodeError as exc:
                    raise TableError(f"{path}, line {line_no}: not JSON ({exc.msg})") from None
                except YamlLimitError as exc:
                    raise TableError(f"{path}, line {line_no}: {exc}") from None
                if not isinstance(obj, dict):
                    raise TableError(f"{path}, line {line_no}: expected a JSON object, got {type(obj).__name__}")
                columns.extend(k for k in obj if k not in columns)
                raw.append(obj)
    return columns, raw
