"""The ``import`` backend: an existing counterfactual set, audited as if an editor had made it.

Most sets researchers use already exist (FOCUS's 480 images, a lab's batch from an editor last
year). This backend "edits" by returning the candidate a table names for a request's source
and condition, so everything after the edit (alignment, gates, review, publish, trials, export,
resume, the content-addressed store, failed items) is the run's own machinery::

    editor:
      backend: import
      import: {table: pairs.csv, editor_name: nano-banana, editor_version: "2025-08"}

The table (CSV, JSONL or Parquet; :mod:`~counterfactory.generation.editors.tables`) has one row
per pair: a ``source`` (a source id of the spec's metadata, or the path of one of its photos,
relative to the table's folder), a ``candidate`` image path (relative to the table's folder),
one column per design axis (named as the axis unless ``condition_columns`` maps it; values
matched case-insensitively) and optionally an ``id`` and a ``prompt`` (the prompt the set was
made with, recorded on the item). ``table`` itself is relative to the spec's folder.

- The grid is the table: one cell per row (:meth:`ImportOptions.plan_grid`), whatever the
  design's strata, ``templates_per_stratum`` and ``conditions_per_template`` say; a source of
  the metadata that no row names is listed as excluded.
- Nothing is paid and nothing is retried with another seed: the backend reads neither prompt,
  seed nor mask (:meth:`ImportEditor.consumes`), so every attempt of a cell has one id, and a
  finished one is never run again.
- The lineage is the table's editor (``editor_name``, ``editor_version``) and a digest of the
  table as read: every row's source, condition, prompt and the sha256 of its candidate file.
  A re-run of the same table does no new work; a changed table (a candidate file replaced, a
  row added) makes new attempts for every row. The store is content-addressed, so an image in
  two rows is stored once.
- A missing or unreadable candidate is a ``failed`` attempt whose reason names the file, and a
  final one (``metadata["final"]``): running it again cannot change it, so a re-run does not.
  A candidate that decodes only with a warning (a PNG chunk with a bad CRC) is used, and the
  warning is kept in the attempt's ``output`` record, which the item carries.
- Before any work (:meth:`ImportEditor.prepare`), the table is refused, naming the row, for a
  condition outside the spec's axes, a source that is not one of the spec's, two rows for
  one source and condition, or two rows with one ``id``
  (:class:`~counterfactory.manifests.errors.SetupError`).
- Nothing the table names is trusted (:mod:`~counterfactory.manifests.safefiles`): every path
  (``candidate``, ``floor``, a ``source`` given by path, a dataset struct's ``path``, a file of a
  ``folder``) is resolved, symbolic links included, and must stay inside the table's folder (or
  a folder of ``allowed_roots``); an absolute path is refused unless an allowed root holds it; a
  file is read only when it is a regular file of at most ``max_file_bytes``, and hashed as a
  stream. Each refusal stops the run before any work, naming the row and the column, never the
  file's bytes.

- A set without source photos (``no_source``, shaped like PAIRS: one scene, several generated
  people): ``source_column`` names each row's scene, a source id of the spec's metadata whose
  photo stands for the scene in the release; cells are judged alone
  (:func:`~counterfactory.validation.judging.judge_alone`: no registration, only the gates that
  need no source), the others listed on each item as ``skipped_gates``.

Requests name no source, so the source a request is for is found from its pixels (the sha256 of
the decoded array), each of the table's sources decoded once, as the run decodes it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from pydantic import ConfigDict, Field, PrivateAttr, field_validator, model_validator

from counterfactory.generation.editors.base import EditorOptions, EditRequest, EditResult, SequentialEditor
from counterfactory.generation.editors.registry import EDITORS
from counterfactory.generation.editors.tables import TableError, TableRow, read_folder, read_table, table_folder
from counterfactory.generation.errors import SourceError
from counterfactory.generation.images import DEFAULT_MAX_PIXELS, decoder_warnings, load_image
from counterfactory.manifests.errors import SetupError
from counterfactory.manifests.safefiles import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_TABLE_BYTES,
    InputFileError,
    inside,
    sha256_file,
)

#: the attempt metadata key that marks a failure retrying cannot change (the run's
#: :func:`~counterfactory.manifests.lifecycle.attempt_finished` reads it)
FINAL = "final"
#: one table read at a time (the run's template threads share the options)
_READ_LOCK = threading.Lock()


@dataclass(frozen=True)
class _SpecContext:
    base_dir: Path
    axes: dict[str, list[str]]
    strata: list[str]
    photos: Path
    metadata: Path
    max_pixels: int = DEFAULT_MAX_PIXELS
    allowed_roots: tuple[Path, ...] = ()


def _conditions(axes: dict[str, list[str]]) -> list[dict[str, str]]:
    from itertools import product

    names = list(axes)
    return [dict(zip(names, values)) for values in product(*axes.values())]


@dataclass(frozen=True)
class ImportRow:
    """One table row, resolved: what cell it fills and where its candidate is.

    Attributes:
        number: the row's 1-based number among the table's data rows.
        row_id: the row's ``id`` column, else ``row<N>``.
        source_id: the spec's source the row is for.
        source_photo: that source's photo file.
        condition: axis -> value, in the design's axis order, spelt as the spec spells it.
        candidate: the candidate's path as the table gives it (None: the row names none).
        candidate_path: the candidate file (None: the row names none).
        candidate_sha256: the file's bytes' sha256 when read (None: missing or unreadable).
        problem: why the candidate cannot be read, when it cannot.
        prompt: the prompt the row says the candidate was made with.
        floor: the file the row names as the editor's output for "return this photo unchanged"
            of its source (the ``floor`` column), relative to the table's folder, or None.
        floor_read: ``(sha256, None)`` of the floor file, or ``(None, why it cannot be read)``;
            None without a floor.
    """

    number: int
    row_id: str
    source_id: str
    source_photo: Path
    condition: dict[str, str]
    candidate: str | None
    candidate_path: Path | None
    candidate_sha256: str | None
    problem: str | None
    prompt: str | None
    floor: Path | None = None
    floor_read: tuple[str | None, str | None] | None = None

    def record(self) -> dict[str, Any]:
        """What the item records about its row (``editor.output``)."""
        return {
            "row": self.number,
            "id": self.row_id,
            "file": self.candidate,
            "sha256": self.candidate_sha256,
            "prompt": self.prompt,
        }


def _file_sha256(
    path: Path, max_bytes: int = DEFAULT_MAX_FILE_BYTES, *, single_link: bool = True
) -> tuple[str | None, str | None]:
    """``(sha256, None)`` of the file's bytes (read as a stream), or ``(None, why it cannot be
    read)``. A file the table names must have one link (``single_link``): a hard link's other
    name may lie outside the table's folder, where :func:`inside` cannot see it.

    Raises:
        InputFileError: not a regular file (a FIFO, a device), hard-linked, or over
            ``max_bytes``: the caller refuses the row, naming it.
    """
    try:
        return sha256_file(path, max_bytes, single_link=single_link), None
    except FileNotFoundError:
        return None, "file not found"
    except IsADirectoryError:
        return None, "a folder, not an image file"
    except OSError as exc:
        return None, f"cannot read the file ({exc.strerror or exc})"


def _loose(label: str) -> str:
    """A condition label as matched: case, ``_``, ``-`` and repeated spaces ignored
    (``east_asian`` in a file name is ``East Asian``)."""
    return " ".join(label.replace("_", " ").replace("-", " ").casefold().split())


def _pixel_key(pixels: np.ndarray) -> str:
    digest = hashlib.sha256(str(pixels.shape).encode())
    digest.update(np.ascontiguousarray(pixels).tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class ImportTable:
    """A pair table read against a spec: every row resolved, refused rows raised.

    Attributes:
        path: the table file.
        rows: in table order.
        max_pixels: the spec's pixel limit (sources are decoded as the run decodes them).
        max_file_bytes: the largest file the table's rows may name.
    """

    path: Path
    rows: tuple[ImportRow, ...]
    max_pixels: int = DEFAULT_MAX_PIXELS
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES

    @classmethod
    def read(cls, options: ImportOptions, spec: _SpecContext) -> ImportTable:
        """Read and check the table ``options`` names against ``spec``.

        Raises:
            SetupError: see :meth:`ImportOptions.read`.
        """
        from counterfactory.generation.metadata import MetadataError, load_metadata

        path = options.table_path()
        try:
            if options.folder is not None:
                assert options.pattern is not None
                choices = {options.condition_columns.get(axis, axis): values for axis, values in spec.axes.items()}
                columns, table_rows = read_folder(path, options.pattern, choices, roots=spec.allowed_roots)
            else:
                columns, table_rows = read_table(
                    path,
                    run_folder=options._run_folder,
                    max_file_bytes=options.max_file_bytes,
                    max_table_bytes=options.max_table_bytes,
                )
        except TableError as exc:
            raise SetupError(f"editor.import.{options.table_field}: {exc}") from None
        unknown = sorted(set(options.condition_columns) - set(spec.axes))
        if unknown:
            raise SetupError(
                f"editor.import.condition_columns names {', '.join(unknown)}, which are not axes of the design "
                f"({', '.join(spec.axes)})"
            )
        condition_columns = {axis: options.condition_columns.get(axis, axis) for axis in spec.axes}
        needed = [options.source_column, options.candidate_column, *condition_columns.values()]
        missing = [c for c in dict.fromkeys(needed) if c not in columns]
        if missing and options.folder is not None:
            raise SetupError(
                f"editor.import.pattern: {options.pattern!r} has no field {', '.join(repr(c) for c in missing)} "
                f"(it has {', '.join(columns[:-2])}); name one field per design axis and the source, e.g. "
                "'{source}_{race}_{gender}.png', or map them (source_column, condition_columns: {axis: field})"
            )
        if missing:
            raise SetupError(
                f"editor.import.table: {path}: no column {', '.join(repr(c) for c in missing)} (it has "
                f"{', '.join(columns) or 'none'}); name the table's columns in editor.import (source_column, "
                "candidate_column, condition_columns: {axis: column})"
            )
        try:
            records = load_metadata(spec.metadata)
        except MetadataError as exc:
            raise SetupError(f"editor.import: the spec's metadata cannot be read: {exc}") from None
        photos = spec.photos.resolve()
        by_id = {r.id: r for r in records}
        # a metadata photo that leads outside the photos folder is failed by the run itself;
        # it is never a row's source by path (nor read here to match one by its bytes)
        by_path = {
            (photos / r.path).resolve(): r.id for r in records if (photos / r.path).resolve().is_relative_to(photos)
        }
        folder = table_folder(path)
        resolver = _SourceResolver(by_id, by_path, photos, options.max_file_bytes)
        allowed = {axis: {_loose(v): v for v in values} for axis, values in spec.axes.items()}
        if options.folder is None:
            cls._refuse_repeated_ids(options, path, table_rows)
        rows: list[ImportRow] = []
        first: dict[tuple[str, tuple[tuple[str, str], ...]], ImportRow] = {}
        for row in table_rows:
            resolved = cls._resolve(options, spec, path, folder, row, condition_columns, allowed, resolver)
            key = (resolved.source_id, tuple(resolved.condition.items()))
            if key in first:
                earlier = first[key]
                raise SetupError(
                    f"editor.import.table: {path}, row {row.number} (id {resolved.row_id!r}) gives source "
                    f"{resolved.source_id!r} the same condition as row {earlier.number} (id {earlier.row_id!r}); "
                    "a cell has one candidate: remove one of the rows"
                )
            first[key] = resolved
            rows.append(resolved)
        return cls(path, tuple(rows), spec.max_pixels, options.max_file_bytes)

    @staticmethod
    def _refuse_repeated_ids(options: ImportOptions, path: Path, table_rows: Sequence[TableRow]) -> None:
        """Two or more rows with one id (given, or ``row<N>``) stop the table, naming them."""
        numbers: dict[str, list[int]] = {}
        for row in table_rows:
            numbers.setdefault(row.get(options.id_column) or f"row{row.number}", []).append(row.number)
        repeated = {row_id: ns for row_id, ns in numbers.items() if len(ns) > 1}
        if repeated:
            row_id, ns = next(iter(repeated.items()))
            listed = ", ".join(map(str, ns[:-1])) + f" and {ns[-1]}"
            more = f" ({len(repeated) - 1} more id(s) repeat too)" if len(repeated) > 1 else ""
            raise SetupError(
                f"editor.import.table: {path}, rows {listed} share the id {row_id!r} (column "
                f"{options.id_column!r}){more}; an id names one row on its item: make each row's id unique"
            )

    @staticmethod
    def _resolve(
        options: ImportOptions,
        spec: _SpecContext,
        path: Path,
        folder: Path,
        row: TableRow,
        condition_columns: dict[str, str],
        allowed: dict[str, dict[str, str]],
        resolver: _SourceResolver,
    ) -> ImportRow:
        row_id = row.get(options.id_column) or f"row{row.number}"
        if options.folder is not None:
            where = f"editor.import.folder: {path}, file {row_id!r}"
        else:
            where = f"editor.import.table: {path}, row {row.number} (id {row_id!r})"

        def named(column: str, value: str) -> Path:
            """The file a cell names, kept inside the table's folder (or an allowed root)."""
            if column in row.embedded:
                return Path(value)  # the file the table's own bytes were written to
            try:
                return inside(folder, value, roots=spec.allowed_roots, what="the table's folder")
            except InputFileError as exc:
                raise SetupError(f"{where}, column {column!r}: {exc}") from None

        def hashed(column: str, file: Path) -> tuple[str | None, str | None]:
            """The file's sha256 or why it cannot be read; a file that must not be read stops the table."""
            try:
                sha, problem = _file_sha256(file, options.max_file_bytes)
            except InputFileError as exc:
                raise SetupError(f"{where}, column {column!r}: {exc}") from None
            expected = row.embedded.get(column)
            if expected is not None and sha != expected:
                raise SetupError(
                    f"{where}, column {column!r}: the copy of its embedded image changed while it was read "
                    "(another process writing the embedded folder?); run again"
                )
            return sha, problem

        condition: dict[str, str] = {}
        for axis, column in condition_columns.items():
            value = row.get(column)
            if value is None:
                raise SetupError(f"{where}: no value for the axis {axis!r} (column {column!r})")
            spelt = allowed[axis].get(_loose(value))
            if spelt is None:
                raise SetupError(
                    f"{where}: condition {axis}={value!r} is outside the spec's axes (design.axes.{axis}: "
                    f"{', '.join(allowed[axis].values())}); fix the row or add the value to the spec"
                )
            condition[axis] = spelt
        source = row.get(options.source_column)
        if source is None:
            raise SetupError(f"{where}: no source (column {options.source_column!r})")
        try:
            found = resolver.find(source, folder, None if options.source_column in row.embedded else spec.allowed_roots)
        except InputFileError as exc:
            raise SetupError(f"{where}, column {options.source_column!r}: {exc}") from None
        if found is None and options.no_source:
            raise SetupError(
                f"{where}: scene {source!r} (column {options.source_column!r}) is not a source id of the spec's "
                "metadata; with no_source the metadata lists each scene once (id: the scene, path: one of its "
                "images, which stands for the scene in the release, licence)"
            )
        if found is None:
            raise SetupError(
                f"{where}: source {source!r} is neither a source id of the spec's metadata nor the path of one of "
                f"its photos (relative to the table's folder {folder}); add the photo to the metadata, or name it "
                "by its id"
            )
        source_id, photo = found
        candidate = row.get(options.candidate_column)
        candidate_path = sha = None
        if candidate is None:
            problem = f"the row names no candidate (column {options.candidate_column!r} is empty)"
        else:
            candidate_path = named(options.candidate_column, candidate)
            sha, problem = hashed(options.candidate_column, candidate_path)
        floor_name = row.get(options.floor_column) if not options.no_source else None
        floor = named(options.floor_column, floor_name) if floor_name else None
        return ImportRow(
            number=row.number,
            row_id=row_id,
            source_id=source_id,
            source_photo=photo,
            condition=condition,
            candidate=candidate,
            candidate_path=candidate_path,
            candidate_sha256=sha,
            problem=problem,
            prompt=row.get(options.prompt_column),
            floor=floor,
            floor_read=hashed(options.floor_column, floor) if floor is not None else None,
        )

    def digest(self) -> str:
        """sha256 of what decides the outputs and their records: every row's source, condition,
        prompt, candidate (its sha256, or why it cannot be read) and floor file."""
        rows = [
            {
                "source": r.source_id,
                "condition": r.condition,
                "candidate_sha256": r.candidate_sha256,
                "problem": r.problem,
                "prompt": r.prompt,
                "row": [r.number, r.row_id, r.candidate],
                "floor_sha256": r.floor_read,
            }
            for r in self.rows
        ]
        blob = json.dumps(rows, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


class _SourceResolver:
    """A row's source as one of the spec's: by id, by path, or by the photo's bytes (a copy of
    the spec's photo elsewhere); each photo's sha256 computed only when first needed."""

    def __init__(self, by_id: dict[str, Any], by_path: dict[Path, str], photos: Path, max_bytes: int) -> None:
        self.by_id, self.by_path, self.photos, self.max_bytes = by_id, by_path, photos, max_bytes
        self._by_sha: dict[str, str] | None = None

    def find(self, source: str, folder: Path, roots: tuple[Path, ...] | None = ()) -> tuple[str, Path] | None:
        """The source ``source`` names: an id, one of the spec's photos by path (the spec's
        metadata named it, wherever it is), or a file inside ``folder`` (or ``roots``; None:
        the table's own embedded bytes, anywhere) holding one of its photo's bytes.

        Raises:
            InputFileError: a path that leads outside, or a file that must not be read.
        """
        if source in self.by_id:
            return source, (self.photos / self.by_id[source].path).resolve()
        if "\x00" in source:
            raise InputFileError("the path holds a NUL byte; write the file's name without it")
        path = (folder / source).resolve()
        if path in self.by_path:
            return self.by_path[path], path
        if roots is not None:
            path = inside(folder, source, roots=roots, what="the table's folder")
        if not path.exists():
            return None
        sha, _ = _file_sha256(path, self.max_bytes)
        if self._by_sha is None:
            self._by_sha = {}
            for photo, sid in self.by_path.items():
                try:
                    # the spec's own photos, not files the table names: a hard link there is the user's
                    photo_sha, _ = _file_sha256(photo, self.max_bytes, single_link=False)
                except InputFileError:
                    continue  # the run fails this source itself (load_image refuses it)
                if photo_sha is not None:
                    self._by_sha.setdefault(photo_sha, sid)
        sid = self._by_sha.get(sha) if sha is not None else None
        return (sid, (self.photos / self.by_id[sid].path).resolve()) if sid is not None else None


class ImportOptions(EditorOptions):
    """Options of the ``import`` backend (``editor.import`` in the spec)."""

    model_config = ConfigDict(extra="forbid")

    #: the outputs are an existing set's: a release's stats.json audits it (its QC figures
    #: beside FOCUS's published ones, the gates a set without source photos skipped;
    #: :func:`~counterfactory.flows.engine.stats.audit_stats`); a backend declares it, the
    #: engine never names one
    audits_imported_set: ClassVar[bool] = True

    #: the pair table (CSV, JSONL, Parquet, or a Hugging Face dataset folder), relative to the
    #: spec's folder; or ``folder`` and ``pattern`` instead
    table: str | None = Field(None, min_length=1)
    #: a folder of candidate images (relative to the spec's folder) whose paths, relative to it,
    #: follow ``pattern`` (``"{source}_{race}_{gender}.png"``): one row per file, its fields the
    #: columns (:func:`~counterfactory.generation.editors.tables.read_folder`); a file that does
    #: not match stops the run, naming it
    folder: str | None = Field(None, min_length=1)
    pattern: str | None = Field(None, min_length=1)
    #: the column naming each row's source: a source id of the spec's metadata, or the path of
    #: one of its photos relative to the table's folder
    source_column: str = "source"
    #: the column naming each row's candidate image, relative to the table's folder
    candidate_column: str = "candidate"
    #: design axis -> the column holding it; axes not listed are read from a column of their name
    condition_columns: dict[str, str] = Field(default_factory=dict)
    #: the column naming each row (shown in messages and on the item); rows without one are
    #: named ``row<N>``
    id_column: str = "id"
    #: the column holding the prompt each candidate was made with, where the set records it
    prompt_column: str = "prompt"
    #: the column naming, per row, the set's editor's output for "return this photo unchanged"
    #: of the row's source (its noise floor, relative to the table's folder); the run judges the
    #: source's cells above it. Rows without one: the cells are judged as measured
    floor_column: str = "floor"
    #: a set without source photos (like PAIRS: one scene, several generated people): the
    #: ``source_column`` names each row's scene, a source id of the spec's metadata whose photo
    #: is the image standing for the scene in the release (one of its candidates); nothing is
    #: registered, and only the gates that judge a candidate alone run (the others are listed
    #: as ``skipped_gates`` on every item and counted in stats.json ``audit.skipped``)
    no_source: bool = False
    #: with ``no_source``: a candidate that passes every gate that ran is ``accepted`` (judged
    #: on the remaining gates); False (the default): it goes to review
    #: (``import_source_gates_skipped``), since no gate judged what needs a source
    accept_on_remaining: bool = False
    #: the editor that made the set and its version, as far as known (the items' lineage)
    editor_name: str = Field("unknown", min_length=1)
    editor_version: str | None = None
    #: folders (absolute, or relative to the spec's folder) that the table's paths may also
    #: lead into: an absolute path, or one leaving the table's folder (``..``, a symbolic link),
    #: is refused unless it resolves inside one of them
    allowed_roots: list[str] = Field(default_factory=list, max_length=100)
    #: the largest image file (candidate, floor, source, embedded image) a row may name, in
    #: bytes; a larger one, or one that is not a regular file (a FIFO, a device), stops the run
    #: naming the row
    max_file_bytes: int = Field(DEFAULT_MAX_FILE_BYTES, ge=1, le=1 << 36)
    #: the largest table file (CSV, JSONL, one Parquet or JSONL shard of a dataset folder), in bytes
    max_table_bytes: int = Field(DEFAULT_MAX_TABLE_BYTES, ge=1, le=1 << 36)

    _spec: _SpecContext | None = PrivateAttr(default=None)
    _run_folder: Path | None = PrivateAttr(default=None)

    @staticmethod
    def canonical_trim(data: dict[str, Any]) -> dict[str, Any]:
        """``data`` (these options as JSON) without the file limits at their defaults and an empty
        ``allowed_roots``: a spec hashes as before they existed
        (:meth:`~counterfactory.manifests.spec.EditorConfig.canonical`)."""
        data = dict(data)
        if not data.get("allowed_roots"):
            data.pop("allowed_roots", None)
        for key, default in (("max_file_bytes", DEFAULT_MAX_FILE_BYTES), ("max_table_bytes", DEFAULT_MAX_TABLE_BYTES)):
            if data.get(key) == default:
                data.pop(key)
        return data

    @field_validator("allowed_roots")
    @classmethod
    def _roots(cls, value: list[str]) -> list[str]:
        for root in value:
            if not root.strip() or "\x00" in root:
                raise ValueError("folders named by a non-empty path without NUL bytes")
        return value

    @model_validator(mode="after")
    def _one_input(self) -> ImportOptions:
        if (self.table is None) == (self.folder is None):
            raise ValueError("name the set with either table (a pair table or dataset folder) or folder and pattern")
        if (self.folder is None) != (self.pattern is None):
            raise ValueError("folder and pattern go together: pattern maps each file's path to its row")
        return self

    @property
    def table_field(self) -> str:
        """The spec field naming the set: ``table`` or ``folder``."""
        return "table" if self.table is not None else "folder"

    _table: ImportTable | None = PrivateAttr(default=None)

    def bind_spec(self, spec: Any) -> None:
        """Take what the table is read against from the loaded ``spec``: its folder (``table``
        is relative to it), its design axes, its photos and metadata, and its pixel limit.
        :func:`~counterfactory.flows.engine.spec.load_spec` calls this on the active backend."""
        path = getattr(spec, "source_path", None)
        base_dir = Path(path).parent if path is not None else Path.cwd()
        self._spec = _SpecContext(
            base_dir=base_dir,
            axes={axis: [str(v) for v in values] for axis, values in spec.design.axes.items()},
            strata=list(spec.design.strata),
            photos=Path(spec.sources.photos),
            metadata=Path(spec.sources.metadata),
            max_pixels=int(spec.sources.max_pixels),
            allowed_roots=tuple((base_dir / root).resolve() for root in self.allowed_roots),
        )
        self._table = None

    def bind_run_folder(self, out: str | Path) -> None:
        """Keep the table's embedded images in the run's folder (``OUT/embedded``, mode 0700;
        :func:`~counterfactory.generation.editors.tables.embedded_dir`). The command line and
        :func:`~counterfactory.flows.resume.run_spec` call this (through
        :meth:`~counterfactory.flows.engine.spec.Spec.bind_run_folder`) before the table is read."""
        with _READ_LOCK:
            if self._run_folder != Path(out):
                self._run_folder = Path(out)
                self._table = None

    def table_path(self) -> Path:
        """The table's (or the folder's) path: relative to the spec's folder (the working folder when unbound)."""
        path = Path(self.table if self.table is not None else str(self.folder))
        if path.is_absolute():
            return path
        return (self._spec.base_dir if self._spec is not None else Path.cwd()) / path

    def named_files(self) -> dict[str, Path]:
        """The files these options name, by spec field, resolved: what
        :func:`~counterfactory.flows.engine.spec.load_spec` checks exist before any work."""
        return {f"editor.import.{self.table_field}": self.table_path().resolve()}

    def read(self) -> ImportTable:
        """The table, read and checked once (:class:`ImportTable`).

        Raises:
            SetupError: the options are not bound to a spec, the table cannot be read, lacks a
                column, or a row is refused (the message names the table and the row).
        """
        with _READ_LOCK:
            if self._table is None:
                if self._spec is None:
                    raise SetupError(
                        "editor.import: the import backend reads its table against a spec "
                        "(load the spec with load_spec, which binds it)"
                    )
                self._table = ImportTable.read(self, self._spec)
            return self._table

    def plan_grid(self, records: Sequence[Any], design: Any) -> Any:
        """The grid of a study whose cells are the table's rows (the run's
        :func:`~counterfactory.flows.engine.sources.plan_grid` asks the backend for it).

        Args:
            records: the usable sources' metadata records (a failed source's rows have no cell:
                the source is listed as failed).
            design: the spec's design (its axes order each condition, its strata name the
                strata; neither templates_per_stratum nor conditions_per_template applies).
        """
        from counterfactory.generation.sampling import (
            GENDER_AXIS,
            Cell,
            Exclusion,
            Grid,
            StratumSummary,
            Template,
            cell_id,
        )

        table = self.read()
        by_id = {r.id: r for r in records}
        rows_of: dict[str, list[ImportRow]] = {}
        for row in table.rows:
            if row.source_id in by_id:
                rows_of.setdefault(row.source_id, []).append(row)
        excluded = [
            Exclusion(sid, f"no row of the import table {table.path.name} names this source")
            for sid in sorted(by_id)
            if sid not in rows_of
        ]

        def field_value(record: Any, name: str) -> str | None:
            value = (record.extra or {}).get(name[6:]) if name.startswith("extra.") else getattr(record, name, None)
            return None if value is None or not str(value).strip() else str(value).strip()

        order = {tuple(c.items()): i for i, c in enumerate(_conditions(design.axes))}
        strata: dict[tuple[str | None, ...], list[str]] = {}
        for sid in sorted(rows_of):
            strata.setdefault(tuple(field_value(by_id[sid], n) for n in design.strata), []).append(sid)
        templates, summaries, cells = [], [], []
        for key in sorted(strata, key=lambda k: tuple((v is not None, v or "") for v in k)):
            stratum = dict(zip(design.strata, key))
            ids = strata[key]
            summaries.append(StratumSummary(stratum, len(ids), len(ids), tuple(ids)))
            for index, sid in enumerate(ids):
                templates.append(Template(sid, dict(stratum), index))
                gender = (by_id[sid].presented_gender or "").strip().casefold() or None
                for row in sorted(rows_of[sid], key=lambda r: order[tuple(r.condition.items())]):
                    wanted = (row.condition.get(GENDER_AXIS) or "").casefold() or None
                    match = None if wanted is None or gender is None else wanted == gender
                    cells.append(Cell(sid, dict(row.condition), cell_id(sid, row.condition), match))
        return Grid(design, tuple(templates), tuple(cells), tuple(summaries), tuple(excluded))


class ImportEditor(SequentialEditor):
    """Returns the candidate the table names for each request's source and condition."""

    name = "import"

    def __init__(self, options: ImportOptions) -> None:
        self.options = options
        self._lock = threading.Lock()
        self._by_cell: dict[tuple[str, tuple[tuple[str, str], ...]], ImportRow] | None = None
        self._source_of: dict[str, list[str]] | None = None

    def lineage(self) -> dict[str, Any]:
        """The set's editor and a digest of the table as read (:meth:`ImportTable.digest`):
        the same table gives the same attempt ids."""
        table = self.options.read()
        return {
            "backend": self.name,
            "model_id": self.options.editor_name,
            "revision": self.options.editor_version,
            "table": self.options.table
            if self.options.table is not None
            else f"{self.options.folder}:{self.options.pattern}",
            "table_sha256": table.digest(),
        }

    def consumes(self, kind: str) -> frozenset[str]:
        """Nothing but the source and condition decides what the table returns."""
        return frozenset()

    def prepare(self) -> None:
        """Read and check the table (before any work, so a refused row stops the run unrun).

        Raises:
            SetupError: naming the table and the row (see :meth:`ImportOptions.read`).
        """
        table = self.options.read()
        # two ids for one photo file (legitimate with several limb masks) cannot be told apart
        # by a request's pixels when the table gives both the same condition
        by_photo: dict[tuple[Path, tuple[tuple[str, str], ...]], ImportRow] = {}
        for row in table.rows:
            key = (row.source_photo, tuple(row.condition.items()))
            other = by_photo.setdefault(key, row)
            if other.source_id != row.source_id:
                raise SetupError(
                    f"editor.import.table: {table.path}, rows {other.number} and {row.number} give sources "
                    f"{other.source_id!r} and {row.source_id!r}, one photo ({row.source_photo.name}), the same "
                    "condition; the import backend tells sources apart by their pixels: import them separately"
                )

    def _index(self) -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], ImportRow], dict[str, list[str]]]:
        """(source id, condition) -> row, and pixel key -> source ids: each of the table's
        source photos decoded once, as the run decodes it."""
        with self._lock:
            if self._by_cell is None or self._source_of is None:
                table = self.options.read()
                by_cell = {(r.source_id, tuple(r.condition.items())): r for r in table.rows}
                photos: dict[str, Path] = {r.source_id: r.source_photo for r in table.rows}
                source_of: dict[str, list[str]] = {}
                folder = self.options._spec.photos.resolve() if self.options._spec is not None else None
                for sid, photo in sorted(photos.items()):
                    if folder is not None and not photo.is_relative_to(folder):
                        continue  # a link out of the photos folder: the run fails this source itself
                    try:
                        pixels = load_image(photo, max_pixels=table.max_pixels).pixels
                    except SourceError:
                        continue  # the run fails this source itself; it gets no request
                    source_of.setdefault(_pixel_key(pixels), []).append(sid)
                self._by_cell, self._source_of = by_cell, source_of
            return self._by_cell, self._source_of

    def _floor_of(self, request: EditRequest) -> ImportRow | None:
        """The first row naming a floor file for the request's source."""
        by_cell, source_of = self._index()
        ids = set(source_of.get(_pixel_key(request.image), ()))
        for (sid, _), row in sorted(by_cell.items(), key=lambda kv: kv[1].number):
            if sid in ids and row.floor is not None:
                return row
        return None

    def edit(self, request: EditRequest) -> EditResult:
        """The table's candidate for ``request``'s source and condition, decoded.

        A candidate file that is missing or does not decode, and a request the table has no
        row for, are final ``failed`` results whose reason names the file or the cell.
        """
        if not request.condition:
            # the run's noise-floor request ("return this photo unchanged"): the table's floor
            # file for this source, when it names one; else a set made elsewhere has no such
            # output, and its cells are judged as measured
            floor_row = self._floor_of(request)
            if floor_row is not None:
                floor = floor_row.floor
                assert floor is not None
                try:
                    image = load_image(floor)
                except SourceError as exc:
                    return EditResult(
                        request.attempt_id, "failed", reason=f"import_floor_unreadable: {exc}", metadata={FINAL: True}
                    )
                if floor_row.floor_read is None or image.sha256 != floor_row.floor_read[0]:
                    # the floor is re-hashed as the candidate is: bytes other than those the table
                    # was read with (and its lineage digested) are never used
                    return EditResult(
                        request.attempt_id,
                        "failed",
                        reason=f"import_changed: {floor} changed since the table was read; run again",
                    )
                return EditResult(
                    request.attempt_id,
                    "ok",
                    image=image.pixels,
                    metadata={"output": {"file": str(floor), "warnings": decoder_warnings(image.notes)}},
                )
            return EditResult(
                request.attempt_id,
                "failed",
                reason="import_no_floor: an imported set has no noise-floor output for this source",
                metadata={FINAL: True},
            )
        by_cell, source_of = self._index()
        condition = tuple((k, str(v)) for k, v in request.condition.items())
        rows = [
            by_cell[(sid, condition)]
            for sid in source_of.get(_pixel_key(request.image), ())
            if (sid, condition) in by_cell
        ]
        if not rows:
            return EditResult(
                request.attempt_id,
                "failed",
                reason="import_no_row: the table has no candidate for this source and condition",
                metadata={FINAL: True},
            )
        row = rows[0]
        record: dict[str, Any] = {**row.record(), "editor": self.options.editor_name}
        failed = {FINAL: True, "output": record}
        if row.problem is not None:
            where = row.candidate_path if row.candidate_path is not None else f"row {row.number} (id {row.row_id!r})"
            return EditResult(
                request.attempt_id, "failed", reason=f"import_unreadable: {where}: {row.problem}", metadata=failed
            )
        assert row.candidate_path is not None
        try:
            loaded = load_image(row.candidate_path)
        except SourceError as exc:
            return EditResult(request.attempt_id, "failed", reason=f"import_unreadable: {exc}", metadata=failed)
        if loaded.sha256 != row.candidate_sha256:
            # not final: the next run reads the table again and makes new attempts for it
            return EditResult(
                request.attempt_id,
                "failed",
                reason=f"import_changed: {row.candidate_path} changed since the table was read; run again",
                metadata={"output": record},
            )
        record.update(
            format=loaded.format,
            size=list(loaded.original_size),
            notes=list(loaded.notes),
            warnings=decoder_warnings(loaded.notes),
        )
        return EditResult(request.attempt_id, "ok", image=loaded.pixels, metadata={"output": record})


EDITORS.register("import", ImportOptions, ImportEditor)
