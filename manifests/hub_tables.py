"""A release's tables as Parquet shards that ``datasets`` loads, images embedded.

Each table of a release becomes one config, ``data/<config>/test-00000-of-0000N.parquet`` (one
``test`` split: an evaluation set):
``items`` from ``items.jsonl`` (always), ``trials`` from ``trials.jsonl`` and ``variants`` from
``derived.jsonl`` (the robustness variants) when the release has them.
Nested JSON is flattened into columns a user filters on (``condition_race``, ``status``,
``gate_identity_passed``, ``gate_identity_cosine``, ...): a dict becomes ``<key>_<field>``
columns, a list of strings stays a list, anything else nested becomes a JSON string. A value
that points at an image inside the release (a ``{"path": "images/<sha>.png", ...}`` dict, or a
string path) becomes a ``datasets`` ``Image`` column holding the file's exact bytes (so decoding
gives the release's pixels) and its release-relative path; a list of such paths (a trial's
``images``) becomes a list of images.

In ``items``, the counterfactual image is the ``counterfactual`` column and the source photo the
``source`` column. The schema's ``huggingface`` metadata carries the ``datasets`` features, so
``load_dataset`` decodes images without guessing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from counterfactory.manifests.release_folder import DERIVED, ITEMS, TRIALS, NotAReleaseError, ReleaseFolder

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".tif", ".tiff", ".bmp")
#: config name -> the release files it is read from, first found wins
TABLES = {"items": (ITEMS,), "trials": (TRIALS,), "variants": (DERIVED, "variants.jsonl")}
#: The one split of every config: the set is for evaluation, never for training.
SPLIT = "test"
#: Parquet row groups small enough for the Hub's viewer to page images (its guidance: ~100 rows).
ROWS_PER_GROUP = 100
#: A shard is closed once its images pass this many bytes (the Hub advises shards under ~500 MB).
SHARD_BYTES = 400 * 1024 * 1024
#: Columns a user reaches for first lead the table, in this order (prefixes end with "_").
LEADING = (
    "item_id",
    "cell_id",
    "template_id",
    "kind",
    "status",
    "reasons",
    "condition_",
    "gender_match",
    "source",
    "counterfactual",
    "gate_",
)
#: How the items table names its two image columns.
ITEM_RENAMES = {"image": "counterfactual", "gates": "gate"}


@dataclass(frozen=True)
class TableExport:
    """One exported table: its config name, row count, shard paths (relative) and columns."""

    name: str
    rows: int
    files: tuple[str, ...]
    columns: tuple[str, ...]
    image_columns: tuple[str, ...]


def _image_path(value: Any, release: Path) -> str | None:
    """Release-relative path of an image that ``value`` points at, else None."""
    if isinstance(value, dict):
        value = value.get("path")
    if isinstance(value, str) and value.lower().endswith(IMAGE_SUFFIXES) and not value.startswith("/"):
        if (release / value).is_file():
            return value
    return None


def _flatten(row: dict[str, Any], release: Path, prefix: str = "") -> dict[str, Any]:
    """Flat columns for one JSON row; image references become ``{"__image__": relpath}``."""
    flat: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        image = _image_path(value, release)
        if image is not None:
            flat[name] = {"__image__": image}
            if isinstance(value, dict):
                flat |= _flatten({k: v for k, v in value.items() if k != "path"}, release, f"{name}_")
        elif isinstance(value, dict):
            if prefix.startswith("gate") and set(value) >= {"metrics", "passed"}:
                # a gate result: its pass flag and metrics are what users filter on; thresholds
                # and reason lists are the same for every row and live in the card
                flat[f"{name}_passed"] = value.get("passed")
                flat |= _flatten(value.get("metrics") or {}, release, f"{name}_")
            elif value:
                flat |= _flatten(value, release, f"{name}_")
            else:
                flat[name] = None
        elif isinstance(value, list) and value and all(_image_path(v, release) for v in value):
            flat[name] = {"__images__": [_image_path(v, release) for v in value]}
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            flat[name] = value
        elif isinstance(value, list) and value and all(isinstance(v, bool) or v is None for v in value):
            flat[name] = value  # e.g. a 2AFC trial's gender_match per image: a list of booleans
        elif isinstance(value, (list, tuple)):
            flat[name] = json.dumps(value, sort_keys=True)
        elif isinstance(value, float) and not math.isfinite(value):
            flat[name] = None
        else:
            flat[name] = value
    return flat


def flatten_rows(table: str, rows: Sequence[dict[str, Any]], release: Path) -> list[dict[str, Any]]:
    """The rows of ``table`` as flat dicts (see the module docstring for the naming)."""
    out = []
    for row in rows:
        if table == "items":
            row = {ITEM_RENAMES.get(k, k): v for k, v in row.items()}
        if table == "trials" and isinstance(row.get("gender_match"), bool):
            # one type per column: a single-image trial's flag is a list of one, as a pair's is of two
            row = {**row, "gender_match": [row["gender_match"]]}
        out.append(_flatten(row, release))
    return out


def _features(flat: Sequence[dict[str, Any]]) -> tuple[Any, list[str], list[str]]:
    """``datasets.Features`` for the flat rows, the column order and the image columns."""
    import datasets
    import pyarrow as pa
    from datasets.features.features import generate_from_arrow_type

    columns: list[str] = []
    for row in flat:
        for key in row:
            if key not in columns:
                columns.append(key)

    def rank(column: str) -> int:
        for i, lead in enumerate(LEADING):
            if column == lead or (lead.endswith("_") and column.startswith(lead)):
                return i
        return len(LEADING)

    columns.sort(key=rank)  # stable: the rest keep their (sorted JSON) order

    def holds(column: str, key: str) -> bool:
        return any(isinstance(r.get(column), dict) and key in r[column] for r in flat)

    images = [c for c in columns if holds(c, "__image__") or holds(c, "__images__")]
    features = {}
    for column in columns:
        if column in images:
            features[column] = datasets.List(datasets.Image()) if holds(column, "__images__") else datasets.Image()
            continue
        values = [r.get(column) for r in flat]
        try:
            arrow_type = pa.array(values).type
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            arrow_type = None
        if arrow_type is None or pa.types.is_null(arrow_type):
            features[column] = datasets.Value("string")
        elif pa.types.is_list(arrow_type) and pa.types.is_boolean(arrow_type.value_type):
            features[column] = datasets.List(datasets.Value("bool"))
        elif pa.types.is_list(arrow_type):
            features[column] = datasets.List(datasets.Value("string"))
        else:
            features[column] = generate_from_arrow_type(arrow_type)
    return datasets.Features(features), columns, images


def _cell(value: Any, feature: Any, release: Path) -> Any:
    import datasets

    if isinstance(feature, datasets.Image):
        if value is None:
            return None
        rel = value["__image__"]
        return {"bytes": ReleaseFolder(release, need=()).read_image(rel, f"{release}: a table's image"), "path": rel}
    if isinstance(feature, datasets.List) and isinstance(feature.feature, datasets.Image):
        if value is None:
            return None
        if isinstance(value, list):  # no image at all (a no-image baseline trial)
            return []
        folder = ReleaseFolder(release, need=())
        return [
            {"bytes": folder.read_image(rel, f"{release}: a table's image"), "path": rel} for rel in value["__images__"]
        ]
    if isinstance(feature, datasets.Value) and feature.dtype == "string" and value is not None:
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return value


def _shards(flat: Sequence[dict[str, Any]], images: Sequence[str], release: Path) -> Iterator[Sequence[dict]]:
    """Consecutive row slices whose image bytes stay under :data:`SHARD_BYTES`."""
    start, size = 0, 0
    for i, row in enumerate(flat):
        paths = [p for c in images if row.get(c) for p in row[c].get("__images__", [row[c].get("__image__")])]
        folder = ReleaseFolder(release, need=())
        row_bytes = sum(folder.image(p, f"{release}: a table's image").stat().st_size for p in paths)
        if i > start and size + row_bytes > SHARD_BYTES:
            yield flat[start:i]
            start, size = i, 0
        size += row_bytes
    yield flat[start:]


def write_table(table: str, rows: Sequence[dict[str, Any]], release: Path, out_dir: Path) -> TableExport:
    """Write ``rows`` of ``table`` as Parquet shards under ``out_dir/data/<table>/``.

    Args:
        table: config name (``items``, ``trials``, ``variants``).
        rows: the table's JSON rows as the release holds them.
        release: the release folder the image paths are relative to.
        out_dir: the export folder (the repository's root).

    Returns:
        The shards written (paths relative to ``out_dir``), rows and columns.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    flat = flatten_rows(table, rows, release)
    features, columns, images = _features(flat)
    schema = features.arrow_schema
    slices = list(_shards(flat, images, release)) if flat else [[]]
    folder = out_dir / "data" / table
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for index, part in enumerate(slices):
        rel = f"data/{table}/{SPLIT}-{index:05d}-of-{len(slices):05d}.parquet"
        data = {c: [_cell(r.get(c), features[c], release) for r in part] for c in columns}
        arrow = pa.Table.from_pydict(data, schema=schema)
        pq.write_table(arrow, out_dir / rel, row_group_size=ROWS_PER_GROUP, compression="zstd")
        files.append(rel)
    return TableExport(table, len(flat), tuple(files), tuple(columns), tuple(images))


def release_tables(release: Path) -> dict[str, list[dict[str, Any]]]:
    """The tables a release holds, by config name in :data:`TABLES` order (``items`` always),
    read through :class:`~counterfactory.manifests.release_folder.ReleaseFolder` (bounded,
    regular files; a broken line names the file and line).

    Raises:
        NotAReleaseError: no ``items.jsonl``.
        ReleaseFileError: a table that breaks the reader's rules.
    """
    folder = ReleaseFolder(release, need=())
    tables = {}
    for name, files in TABLES.items():
        found = next((f for f in files if folder.has(f)), None)
        if found is not None:
            tables[name] = folder.rows(found)
        elif name == "items":
            raise NotAReleaseError(
                f"{folder.file(files[0])}: missing; a release always has {ITEMS} (is this a release folder?)"
            )
    return tables
