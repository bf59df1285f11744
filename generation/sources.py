"""Source photos and their metadata: the read-only inputs every study starts from.

A *source* is a real photo plus a metadata record (id, licence, occupation, presented gender,
an optional limb mask). This module reads metadata files (:func:`load_metadata`), decodes
photos into one canonical form (:func:`load_image`: ``(H, W, 3)`` ``uint8`` RGB, upright,
no alpha) and pairs the two (:func:`load_sources`).

Problems come in two sizes. A broken *metadata file* makes the whole study impossible, so it
raises :class:`MetadataError` naming the file, the entry, the field, what was expected and what
was found. A broken *photo* is one item's problem: :func:`load_image` raises
:class:`SourceError`, and :func:`load_sources` turns that into a :class:`FailedSource` value
with its reason, so one bad file never stops a batch and is never dropped silently.

Everything returned is read-only: pixel arrays have ``writeable=False``; copy before editing.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Annotated, Any

import numpy as np
import yaml
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

#: Default pixel budget of one photo (width x height); larger photos are refused unread.
DEFAULT_MAX_PIXELS = 64_000_000
#: The shortest side a usable photo may have, in pixels (face detectors need some room).
MIN_SIDE_PX = 64

METADATA_SUFFIXES = (".yaml", ".yml", ".csv", ".jsonl")

_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


# --------------------------------------------------------------------------- errors


class SourceError(Exception):
    """One photo cannot be used. ``str(error)`` is ``"<path>: <reason>"``.

    Attributes:
        path: the photo's path as given.
        reason: what is wrong and, where one exists, how to fix it.
    """

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(str(path), reason)
        self.path = Path(path)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass(frozen=True)
class MetadataProblem:
    """One thing wrong in a metadata file.

    Attributes:
        index: 0-based position of the entry (data row for CSV, non-blank line for JSONL);
            ``None`` for problems with the file as a whole.
        id: the entry's ``id`` as written, if it had one.
        line: 1-based line in the file where the entry starts, when known.
        field: dotted path of the field (``"limb_mask.rle.counts"``), or ``None``.
        expected: what the field or file should hold.
        received: what it held, abbreviated.
    """

    index: int | None
    id: str | None
    line: int | None
    field: str | None
    expected: str
    received: str

    def __str__(self) -> str:
        where = []
        if self.index is not None:
            detail = []
            if self.id is not None:
                detail.append(f"id {self.id!r}")
            if self.line is not None:
                detail.append(f"line {self.line}")
            where.append(f"entry {self.index}" + (f" ({', '.join(detail)})" if detail else ""))
        elif self.line is not None:
            where.append(f"line {self.line}")
        if self.field is not None:
            where.append(f"field {self.field!r}")
        prefix = ": ".join(where)
        text = f"expected {self.expected}, received {self.received}"
        return f"{prefix}: {text}" if prefix else text


class MetadataError(ValueError):
    """A metadata file cannot be used as a whole.

    The message names the file and, for each problem, the entry (index, id, line), the field,
    what was expected and what was received. ``problems`` holds the same facts as values.
    """

    def __init__(self, path: str | Path, problems: list[MetadataProblem] | tuple[MetadataProblem, ...]):
        super().__init__(str(path), tuple(problems))
        self.path = Path(path)
        self.problems = tuple(problems)

    def __str__(self) -> str:
        if len(self.problems) == 1:
            return f"{self.path}: {self.problems[0]}"
        lines = [f"{self.path}: {len(self.problems)} problems"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


# --------------------------------------------------------------------------- records


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PolygonMask(_Strict):
    """Limb mask as polygons in pixel coordinates of the upright photo.

    ``polygons`` is a list of polygons, each a list of ``[x, y]`` points (at least 3), x to the
    right and y down, in continuous pixel units: pixel ``(col, row)`` covers
    ``[col, col + 1) x [row, row + 1)``. The mask is the union of the polygons.
    """

    polygons: list[list[tuple[float, float]]]

    @field_validator("polygons")
    @classmethod
    def _check(cls, polygons: list[list[tuple[float, float]]]) -> list[list[tuple[float, float]]]:
        if not polygons:
            raise ValueError("at least one polygon")
        for i, poly in enumerate(polygons):
            if len(poly) < 3:
                raise ValueError(f"polygons of at least 3 [x, y] points (polygon {i} has {len(poly)})")
            if not all(math.isfinite(v) for point in poly for v in point):
                raise ValueError(f"finite coordinates (polygon {i} has NaN or infinity)")
        return polygons


class FileMask(_Strict):
    """Limb mask as an image file (relative to the photos folder); pixels > 127 are inside."""

    file: str

    @field_validator("file")
    @classmethod
    def _relative(cls, value: str) -> str:
        return _check_relative_path(value)


class RLE(_Strict):
    """Uncompressed COCO run-length encoding.

    ``size`` is ``[height, width]``; ``counts`` are run lengths over the pixels in
    column-major (Fortran) order, alternating outside/inside and starting with *outside*
    (so a mask whose first pixel is inside starts with a 0). ``sum(counts) == height * width``.
    """

    size: tuple[int, int]
    counts: list[int]

    @field_validator("size")
    @classmethod
    def _size(cls, size: tuple[int, int]) -> tuple[int, int]:
        if size[0] < 1 or size[1] < 1:
            raise ValueError("[height, width] with both at least 1")
        return size

    @field_validator("counts", mode="before")
    @classmethod
    def _not_compressed(cls, counts: Any) -> Any:
        if isinstance(counts, (str, bytes)):
            raise ValueError(
                "a list of integer run lengths (compressed COCO RLE strings are not supported; "
                "decode them with pycocotools.mask.decode and store the uncompressed counts)"
            )
        return counts

    @model_validator(mode="after")
    def _total(self) -> RLE:
        if any(c < 0 for c in self.counts):
            raise ValueError("non-negative run lengths")
        h, w = self.size
        if sum(self.counts) != h * w:
            raise ValueError(f"run lengths summing to height x width = {h * w} (they sum to {sum(self.counts)})")
        return self


class RLEMask(_Strict):
    """Limb mask as an uncompressed COCO RLE (see :class:`RLE`)."""

    rle: RLE


def _limb_mask_kind(value: Any) -> str | None:
    if isinstance(value, dict):
        keys = [k for k in ("polygons", "file", "rle") if k in value]
        return keys[0] if len(keys) == 1 else None
    for cls, tag in ((PolygonMask, "polygons"), (FileMask, "file"), (RLEMask, "rle")):
        if isinstance(value, cls):
            return tag
    return None


LimbMask = Annotated[
    Annotated[PolygonMask, Tag("polygons")] | Annotated[FileMask, Tag("file")] | Annotated[RLEMask, Tag("rle")],
    Discriminator(
        _limb_mask_kind,
        custom_error_type="limb_mask_kind",
        custom_error_message=(
            "a mapping with exactly one of 'polygons', 'file' or 'rle' (or, as a shorthand, the mask file's path)"
        ),
    ),
]


def _check_relative_path(value: str) -> str:
    text = value.strip()
    if not text:
        raise ValueError("a non-empty relative path")
    if PurePosixPath(text).is_absolute() or PureWindowsPath(text).is_absolute() or PureWindowsPath(text).drive:
        raise ValueError("a path relative to the photos folder, not an absolute path")
    if ".." in PurePosixPath(text.replace("\\", "/")).parts:
        raise ValueError("a path inside the photos folder (no '..')")
    return text


class SourceRecord(BaseModel):
    """One row of source metadata.

    Attributes:
        id: unique, letters/digits/``._-`` (it becomes part of file names and cell ids).
        path: the photo, relative to the photos folder (``/`` separators, no ``..``).
        licence: the photo's licence or rights statement; required, never empty.
        occupation, context, presented_gender: stratification metadata; empty means unknown
            (``None``). ``presented_gender`` is compared case-insensitively with a design's
            ``gender`` axis values (``"male"``, ``"female"``).
        limb_mask: optional limb region: :class:`PolygonMask`, :class:`FileMask` or
            :class:`RLEMask`. A bare string is read as a mask file path, and a string starting
            with ``{`` as JSON (that is how CSV cells carry it).
        notes: free text for people.
        extra: free-form metadata (any keys); CSV columns named ``extra.<key>`` land here.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    path: str
    licence: str
    occupation: str | None = None
    context: str | None = None
    presented_gender: str | None = None
    limb_mask: LimbMask | None = None
    notes: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _ID_PATTERN.match(value):
            raise ValueError(
                "an id of 1-128 letters, digits, '.', '_' or '-', starting with a letter or "
                "digit (it becomes part of file names and cell ids)"
            )
        return value

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return _check_relative_path(value)

    @field_validator("licence")
    @classmethod
    def _licence(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a non-empty licence or rights statement")
        return value.strip()

    @field_validator("occupation", "context", "presented_gender", "notes")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return value.strip() or None

    @field_validator("limb_mask", mode="before")
    @classmethod
    def _mask_shorthand(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        text = value.strip()
        if not text:
            return None
        if text.startswith("{"):
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"valid JSON text for the mask mapping ({exc.msg} at char {exc.pos})") from None
        return {"file": text}


RECORD_FIELDS = tuple(SourceRecord.model_fields)


# --------------------------------------------------------------------------- metadata files


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
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
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
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            problem = MetadataProblem(
                index=index,
                id=None,
                line=line_no,
                field=None,
                expected="one JSON object per line",
                received=f"invalid JSON ({exc.msg} at column {exc.colno})",
            )
            raise MetadataError(path, [problem]) from None
        yield _Entry(index, line_no, raw)
        index += 1


def _csv_entries(path: Path, text: str) -> Iterator[_Entry]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise _file_error(path, "a header row of field names", "an empty file") from None
    header = [h.strip() for h in header]
    if any(not h for h in header) or len(set(header)) != len(header):
        expected = "a header row of distinct, non-empty field names"
        raise _file_error(path, expected, _abbrev(header), line=1)
    index = 0
    start = reader.line_num + 1
    for cells in reader:
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


# --------------------------------------------------------------------------- images


@dataclass(frozen=True, eq=False)
class LoadedImage:
    """A decoded, normalised photo.

    Attributes:
        pixels: ``(H, W, 3)`` ``uint8`` RGB, upright (EXIF orientation applied), read-only.
        sha256: hex sha256 of the file's bytes (the source's address, before any decoding).
        original_mode: the PIL mode as stored (``"RGBA"``, ``"I;16"``, ``"CMYK"``, ...).
        original_size: ``(width, height)`` as stored, before the EXIF rotation.
        format: the PIL format name (``"JPEG"``, ``"PNG"``, ...).
        notes: one line per thing normalisation did (rotation, alpha, bit depth, ...).
    """

    pixels: np.ndarray
    sha256: str
    original_mode: str
    original_size: tuple[int, int]
    format: str | None
    notes: tuple[str, ...]


_ORIENTATION_NAMES = {
    2: "mirrored left-right",
    3: "rotated 180 degrees",
    4: "mirrored top-bottom",
    5: "transposed",
    6: "rotated 90 degrees clockwise",
    7: "transversed",
    8: "rotated 90 degrees counter-clockwise",
}
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")
_ALPHA_MODES = ("RGBA", "RGBa", "LA", "La", "PA")


def load_image(
    path: str | Path,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    min_side_px: int = MIN_SIDE_PX,
) -> LoadedImage:
    """Decode one photo into ``(H, W, 3)`` ``uint8`` RGB, upright, without alpha.

    What it normalises (each step adds a line to ``notes``):
        - EXIF orientation: the pixels are rotated/flipped upright
          (:func:`PIL.ImageOps.exif_transpose`).
        - alpha (RGBA, LA, PA, palette or single-colour transparency): composited onto white,
          ``out = rgb * a + 255 * (1 - a)`` with ``a = alpha / 255``, rounded.
        - greyscale (``L``, ``1``): replicated into the three channels (``1`` becomes 0/255).
        - 16-bit greyscale (``I;16``, ``I;16B``, ``I`` with values in 0..65535): scaled, not
          clipped: ``round(v * 255 / 65535)``. (16-bit RGB PNGs reach us already reduced to
          8 bits by PIL, which keeps the high byte.)
        - palette (``P``), ``CMYK`` and other modes: PIL's own conversion to RGB (CMYK uses
          PIL's formula; no ICC colour management is applied to any mode).

    The size is checked from the header before any pixel is decoded, so an oversized file
    costs only its header. The whole image is then decoded (truncated files are errors;
    ``ImageFile.LOAD_TRUNCATED_IMAGES`` is left alone).

    Args:
        path: the photo file.
        max_pixels: refuse images with more than this many pixels (width x height).
        min_side_px: refuse images whose shorter side is below this, in pixels.

    Raises:
        SourceError: missing, empty, not an image, truncated or corrupt, too large, too small,
            or an unsupported pixel format; the message says which and how to fix it.
    """
    path = Path(path)
    if not path.exists():
        raise SourceError(
            path,
            "file not found; check that the metadata path is relative to the photos folder "
            "and that the file was copied",
        )
    if not path.is_file():
        raise SourceError(path, "not a regular file (a folder?); point the metadata at the image")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SourceError(path, f"cannot read the file ({exc.strerror or exc})") from None
    if not data:
        raise SourceError(path, "empty file (0 bytes); the copy or download did not finish: fetch the photo again")
    sha256 = hashlib.sha256(data).hexdigest()
    damaged = "the file is incomplete or damaged: download or export it again"

    with warnings.catch_warnings():
        # We apply our own pixel budget from the header; PIL's bomb warning would only repeat it.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data))
        except Image.DecompressionBombError as exc:
            raise SourceError(
                path,
                f"image too large to decode safely ({exc}); downscale the photo to at most {max_pixels:,} pixels",
            ) from None
        except UnidentifiedImageError:
            raise SourceError(
                path,
                f"not an image PIL can read (the file starts with {data[:16]!r}); it may be a "
                "text or HTML page saved under an image name: download the image itself",
            ) from None
        except Exception as exc:  # noqa: BLE001 - any header failure is this file's problem
            raise SourceError(path, f"unreadable image header ({type(exc).__name__}: {exc}); {damaged}") from None

        with image:
            width, height = image.size
            if width * height > max_pixels:
                raise SourceError(
                    path,
                    f"image is {width}x{height} = {width * height:,} pixels, over the limit of "
                    f"{max_pixels:,} (max_pixels); downscale the photo or raise max_pixels",
                )
            if min(width, height) < min_side_px:
                raise SourceError(
                    path,
                    f"image is {width}x{height}; both sides must be at least {min_side_px} px: use a larger photo",
                )
            mode, fmt = image.mode, image.format
            try:
                image.load()
            except Exception as exc:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ...
                raise SourceError(
                    path,
                    f"truncated or corrupt image data ({type(exc).__name__}: {exc}); {damaged}",
                ) from None
            notes: list[str] = []
            frames = getattr(image, "n_frames", 1)
            if frames > 1:
                notes.append(f"first of {frames} frames used")
            try:
                upright = _exif_upright(image, notes)
                rgb = _to_rgb(upright, notes)
            except _UnsupportedPixels as exc:
                raise SourceError(path, str(exc)) from None
            except Exception as exc:  # noqa: BLE001
                raise SourceError(
                    path,
                    f"cannot convert the pixels to RGB ({type(exc).__name__}: {exc}); "
                    "re-export the photo as 8-bit RGB JPEG or PNG",
                ) from None
            if image.info.get("icc_profile"):
                notes.append("embedded ICC profile not applied (pixel values used as stored)")

    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    rgb.setflags(write=False)
    return LoadedImage(
        pixels=rgb,
        sha256=sha256,
        original_mode=mode,
        original_size=(width, height),
        format=fmt,
        notes=tuple(notes),
    )


def _exif_upright(image: Image.Image, notes: list[str]) -> Image.Image:
    try:
        orientation = image.getexif().get(ExifTags.Base.Orientation, 1)
    except Exception:  # noqa: BLE001 - a broken EXIF block is not a broken photo
        notes.append("unreadable EXIF block ignored")
        return image
    if orientation in _ORIENTATION_NAMES:
        stored = _ORIENTATION_NAMES[orientation]
        notes.append(f"EXIF orientation {orientation} applied (stored image {stored})")
        return ImageOps.exif_transpose(image)
    if orientation not in (1, None):
        notes.append(f"invalid EXIF orientation {orientation!r} ignored")
    return image


class _UnsupportedPixels(ValueError):
    """A pixel format with no safe mapping to 8-bit RGB."""


def scale_16bit_to_8bit(values: np.ndarray) -> np.ndarray:
    """Map 16-bit values 0..65535 onto 0..255 linearly: ``round(v * 255 / 65535)`` (no ties occur).

    Args:
        values: integer array of any shape with values in 0..65535.

    Returns:
        ``uint8`` array of the same shape (0 -> 0, 257 -> 1, 32896 -> 128, 65535 -> 255).
    """
    return np.rint(values.astype(np.float64) / 257.0).astype(np.uint8)


def _to_rgb(image: Image.Image, notes: list[str]) -> np.ndarray:
    mode = image.mode
    has_alpha = mode in _ALPHA_MODES or "transparency" in image.info
    if mode == "RGB" and not has_alpha:
        return np.asarray(image)
    if mode in _SIXTEEN_BIT:
        values = np.asarray(image)
        if mode == "I" and values.size and (values.min() < 0 or values.max() > 65535):
            raise _UnsupportedPixels(
                f"32-bit integer pixels outside 0..65535 (range {values.min()}..{values.max()}) "
                "cannot be scaled to 8 bits safely; export the photo as 8- or 16-bit"
            )
        notes.append(f"16-bit greyscale ({mode}) scaled to 8 bits as round(v * 255 / 65535)")
        grey = scale_16bit_to_8bit(values)
        return np.repeat(grey[..., None], 3, axis=2)
    if mode == "F":
        raise _UnsupportedPixels(
            "floating-point pixels have no fixed range to map to 8 bits; export the photo as 8- or 16-bit"
        )
    if has_alpha:
        rgba = np.asarray(image.convert("RGBA"))
        alpha = rgba[..., 3:4].astype(np.float64) / 255.0
        opaque = float(np.mean(rgba[..., 3] == 255))
        if opaque == 1.0:
            notes.append(f"alpha channel ({mode}) dropped: every pixel fully opaque")
            return rgba[..., :3]
        notes.append(f"alpha channel ({mode}) composited onto white ({1 - opaque:.1%} of pixels not fully opaque)")
        out = rgba[..., :3].astype(np.float64) * alpha + 255.0 * (1.0 - alpha)
        return np.rint(out).astype(np.uint8)
    if mode in ("L", "1"):
        notes.append(f"greyscale ({mode}) replicated into R, G and B")
        grey = np.asarray(image.convert("L"))
        return np.repeat(grey[..., None], 3, axis=2)
    if mode == "P":
        notes.append("palette image expanded to RGB")
    elif mode == "CMYK":
        notes.append("CMYK converted to RGB with PIL's formula (no colour management)")
    else:
        notes.append(f"mode {mode} converted to RGB by PIL")
    return np.asarray(image.convert("RGB"))


# --------------------------------------------------------------------------- sources


@dataclass(frozen=True, eq=False)
class Source:
    """A usable source: its record and its decoded photo (read-only).

    Attributes:
        record: the metadata record.
        path: absolute path of the photo.
        sha256: hex sha256 of the photo file's bytes.
        pixels: ``(H, W, 3)`` ``uint8`` RGB, upright, ``writeable=False``.
        notes: what loading normalised (see :func:`load_image`) and cross-source remarks.
    """

    record: SourceRecord
    path: Path
    sha256: str
    pixels: np.ndarray
    notes: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def shape(self) -> tuple[int, int]:
        """``(H, W)`` of the upright photo in pixels."""
        return int(self.pixels.shape[0]), int(self.pixels.shape[1])


@dataclass(frozen=True)
class FailedSource:
    """A source that cannot be used, kept as a value so it shows up in reports.

    Attributes:
        id: the record's id.
        path: absolute path of the photo the record points at.
        reason: why it failed and how to fix it.
        record: the record itself.
    """

    id: str
    path: Path
    reason: str
    record: SourceRecord | None = None


def load_sources(
    photos_dir: str | Path,
    metadata_path: str | Path,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> list[Source | FailedSource]:
    """Read the metadata and decode every photo it names.

    Photos are decoded eagerly (demo sets are a handful of photos, a few MB each). For a large
    set, call :func:`load_metadata` here and :func:`load_image` inside each batch instead;
    ``Source`` holds nothing that cannot be rebuilt from its record and path.

    A record with a ``limb_mask`` also has its mask read and checked against the photo's size
    (:func:`counterfactory.generation.masks.mask_from_record`); a mask that cannot be read, does not fit or is
    empty fails the source. A record whose photo bytes equal an earlier record's gets a note
    naming that record (several masks on one photo are legitimate; a copied photo is not).

    Args:
        photos_dir: the folder that record paths are relative to.
        metadata_path: a ``.yaml``/``.yml``/``.csv``/``.jsonl`` metadata file.
        max_pixels: passed to :func:`load_image`.

    Returns:
        One item per record, in metadata order: :class:`Source` or :class:`FailedSource`.

    Raises:
        MetadataError: the metadata file is broken (nothing is loaded then).
        NotADirectoryError: ``photos_dir`` is not a folder.
    """
    from counterfactory.generation.masks import MaskError, mask_from_record

    photos_dir = Path(photos_dir).resolve()
    records = load_metadata(metadata_path)
    if not photos_dir.is_dir():
        raise NotADirectoryError(
            f"{photos_dir}: photos folder not found; pass the folder the metadata paths are relative to"
        )
    out: list[Source | FailedSource] = []
    first_by_hash: dict[str, str] = {}
    for record in records:
        path = photos_dir / record.path
        try:
            loaded = load_image(path, max_pixels=max_pixels)
        except SourceError as exc:
            out.append(FailedSource(record.id, path, exc.reason, record))
            continue
        if record.limb_mask is not None:
            try:
                mask = mask_from_record(record, photos_dir, loaded.pixels.shape[:2])
            except MaskError as exc:
                out.append(FailedSource(record.id, path, f"limb mask: {exc}", record))
                continue
            if mask is not None and not mask.any():
                out.append(
                    FailedSource(
                        record.id,
                        path,
                        "limb mask: the mask is empty inside the photo; redraw it over the limb",
                        record,
                    )
                )
                continue
        notes = loaded.notes
        if loaded.sha256 in first_by_hash:
            notes += (f"same file bytes as source {first_by_hash[loaded.sha256]!r}",)
        else:
            first_by_hash[loaded.sha256] = record.id
        out.append(Source(record=record, path=path, sha256=loaded.sha256, pixels=loaded.pixels, notes=notes))
    return out


__all__ = [
    "DEFAULT_MAX_PIXELS",
    "FailedSource",
    "FileMask",
    "LimbMask",
    "LoadedImage",
    "MIN_SIDE_PX",
    "MetadataError",
    "MetadataProblem",
    "PolygonMask",
    "RLE",
    "RLEMask",
    "Source",
    "SourceError",
    "SourceRecord",
    "load_image",
    "load_metadata",
    "load_sources",
    "scale_16bit_to_8bit",
]
