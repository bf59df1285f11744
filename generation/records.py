"""The schema of one source's metadata: :class:`SourceRecord` and the limb-mask forms it may carry.

Pure pydantic models; reading files is :mod:`counterfactory.generation.metadata`'s job and
turning a mask record into pixels is :mod:`counterfactory.generation.masks`'s.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import PurePosixPath, PureWindowsPath
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


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


class SamPrompt(_Strict):
    """What SAM is shown to segment a limb: a box and/or clicks, in pixels of the upright photo.

    ``box`` is ``[x0, y0, x1, y1]`` (x right, y down, ``x0 < x1``, ``y0 < y1``); ``points`` are
    ``[x, y]`` clicks and ``point_labels`` their labels (1 on the limb, 0 on the background;
    all 1 when left out).
    """

    box: tuple[float, float, float, float] | None = None
    points: list[tuple[float, float]] | None = None
    point_labels: list[int] | None = None

    @model_validator(mode="after")
    def _check(self) -> SamPrompt:
        if self.box is None and not self.points:
            raise ValueError("a box [x0, y0, x1, y1], points [[x, y], ...], or both")
        values = list(self.box or ()) + [v for point in self.points or () for v in point]
        if not all(math.isfinite(v) for v in values):
            raise ValueError("finite coordinates (the prompt has NaN or infinity)")
        if self.box is not None and not (self.box[0] < self.box[2] and self.box[1] < self.box[3]):
            raise ValueError(f"a box [x0, y0, x1, y1] with x0 < x1 and y0 < y1 (got {list(self.box)})")
        if self.point_labels is not None:
            if self.points is None or len(self.point_labels) != len(self.points):
                raise ValueError("one point label per point")
            if any(label not in (0, 1) for label in self.point_labels):
                raise ValueError("point labels of 1 (on the limb) or 0 (background)")
        return self

    def key(self) -> str:
        """12 hex digits of the prompt's sha256: a changed box or click names another mask file."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:12]


class SamMask(_Strict):
    """Limb mask drawn by SAM from a prompt (``limb_mask: {sam: {box: [x0, y0, x1, y1]}}``).

    ``counterfactory masks SPEC --sam CHECKPOINT`` runs SAM once per such record and stores the
    mask as a PNG in the photos folder (:func:`sam_mask_file`); a run reads that file, so the
    edits depend on the stored pixels (which a person may correct by hand), never on a SAM call.
    """

    sam: SamPrompt


#: where :class:`SamMask` files live, relative to the photos folder
SAM_MASK_DIR = "sam_masks"


def sam_mask_file(source_id: str, prompt: SamPrompt) -> str:
    """The stored SAM mask of ``source_id`` for ``prompt``, relative to the photos folder."""
    return f"{SAM_MASK_DIR}/{source_id}-{prompt.key()}.png"


_MASK_KINDS = ((PolygonMask, "polygons"), (FileMask, "file"), (RLEMask, "rle"), (SamMask, "sam"))


def _limb_mask_kind(value: Any) -> str | None:
    if isinstance(value, dict):
        keys = [tag for _, tag in _MASK_KINDS if tag in value]
        return keys[0] if len(keys) == 1 else None
    for cls, tag in _MASK_KINDS:
        if isinstance(value, cls):
            return tag
    return None


LimbMask = Annotated[
    Annotated[PolygonMask, Tag("polygons")]
    | Annotated[FileMask, Tag("file")]
    | Annotated[RLEMask, Tag("rle")]
    | Annotated[SamMask, Tag("sam")],
    Discriminator(
        _limb_mask_kind,
        custom_error_type="limb_mask_kind",
        custom_error_message=(
            "a mapping with exactly one of 'polygons', 'file', 'rle' or 'sam' (or, as a shorthand, the mask "
            "file's path)"
        ),
    ),
]


def _check_relative_path(value: str) -> str:
    text = value.strip()
    if not text:
        raise ValueError("a non-empty relative path")
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ValueError("a path without NUL or other control characters (the file's name as it is on disk)")
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
        limb_mask: optional limb region: :class:`PolygonMask`, :class:`FileMask`,
            :class:`RLEMask` or :class:`SamMask`. A bare string is read as a mask file path, and a string starting
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
        if not _ID_PATTERN.fullmatch(value):
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
