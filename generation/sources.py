"""Source photos paired with their metadata: the read-only inputs every study starts from.

A *source* is a real photo plus a metadata record (id, licence, occupation, presented gender,
an optional limb mask). The jobs live one per module, each importing only those below it:
:mod:`~counterfactory.generation.errors` (exception types), :mod:`~counterfactory.generation.records`
(the record and mask schemas), :mod:`~counterfactory.generation.metadata` (reading YAML/CSV/JSONL),
:mod:`~counterfactory.generation.images` (decoding a photo into ``(H, W, 3)`` ``uint8`` RGB,
upright, no alpha), :mod:`~counterfactory.generation.masks` (mask records into pixels). This
module pairs them (:func:`load_sources`) and re-exports their public names.

Problems come in two sizes. A broken *metadata file* makes the whole study impossible, so it
raises :class:`MetadataError` naming the file, the entry, the field, what was expected and what
was found. A broken *photo* is one item's problem: :func:`load_image` raises
:class:`SourceError`, and :func:`load_sources` turns that into a :class:`FailedSource` value
with its reason, so one bad file never stops a batch and is never dropped silently.

Everything returned is read-only: pixel arrays have ``writeable=False``; copy before editing.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from counterfactory.generation.errors import MetadataError, MetadataProblem, SourceError
from counterfactory.generation.images import (
    DEFAULT_MAX_PIXELS,
    MAX_SIDE_PX,
    MIN_SIDE_PX,
    LoadedImage,
    load_image,
    scale_16bit_to_8bit,
)
from counterfactory.generation.masks import MaskError, mask_from_record
from counterfactory.generation.metadata import load_metadata
from counterfactory.generation.records import RLE, FileMask, LimbMask, PolygonMask, RLEMask, SourceRecord


class SourcesConfig(BaseModel):
    """``sources`` in the spec: a photo folder and its metadata file (paths relative to the spec file)."""

    model_config = ConfigDict(extra="forbid")

    photos: Path
    metadata: Path
    #: photos with more pixels are refused before decoding (see :func:`load_image`); at most
    #: MAX_SIDE_PX squared (16384 x 16384), the largest image any side limit lets through
    max_pixels: int = Field(DEFAULT_MAX_PIXELS, gt=0, le=MAX_SIDE_PX * MAX_SIDE_PX)


class Source:
    """A usable source: its record and its decoded photo (read-only).

    Attributes:
        record: the metadata record.
        path: absolute path of the photo.
        sha256: hex sha256 of the photo file's bytes.
        pixels: ``(H, W, 3)`` ``uint8`` RGB, upright, ``writeable=False``.
        notes: what loading normalised (see :func:`load_image`) and cross-source remarks.

    A run holds every source of a study for its whole length but works on a few at a time, so
    :meth:`released` gives a copy that does not hold the pixels: they are decoded again from
    ``path`` when asked for (the file's bytes checked against ``sha256``; a photo that changed
    since is a :class:`SourceError`), and the last few decoded are kept
    (:data:`PIXEL_CACHE_ITEMS`; while cached, the pixels the run checked are used as they are). The run's memory then does not grow with the number of photos.
    Pickling (a Ray task's arguments) always carries the pixels.
    """

    __slots__ = ("record", "path", "sha256", "notes", "_pixels", "_shape", "_max_pixels")

    def __init__(
        self,
        record: SourceRecord,
        path: Path,
        sha256: str,
        pixels: np.ndarray,
        notes: tuple[str, ...] = (),
        *,
        max_pixels: int = DEFAULT_MAX_PIXELS,
    ) -> None:
        for name, value in (("record", record), ("path", path), ("sha256", sha256), ("notes", tuple(notes))):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_pixels", pixels)
        object.__setattr__(self, "_shape", (int(pixels.shape[0]), int(pixels.shape[1])))
        object.__setattr__(self, "_max_pixels", max_pixels)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Source is read-only (tried to set {name!r})")

    def __repr__(self) -> str:
        held = "held" if self._pixels is not None else "released"
        return f"Source(id={self.id!r}, path={str(self.path)!r}, sha256={self.sha256[:12]}..., pixels {held})"

    def __getstate__(self) -> dict:
        return {
            "record": self.record,
            "path": self.path,
            "sha256": self.sha256,
            "notes": self.notes,
            "pixels": self.pixels,
            "max_pixels": self._max_pixels,
        }

    def __setstate__(self, state: dict) -> None:
        Source.__init__(
            self,
            state["record"],
            state["path"],
            state["sha256"],
            state["pixels"],
            state["notes"],
            max_pixels=state["max_pixels"],
        )

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def shape(self) -> tuple[int, int]:
        """``(H, W)`` of the upright photo in pixels."""
        return self._shape

    @property
    def pixels(self) -> np.ndarray:
        if self._pixels is not None:
            return self._pixels
        return _decoded(self)

    @property
    def holds_pixels(self) -> bool:
        """False for a :meth:`released` source (its pixels are decoded when asked for)."""
        return self._pixels is not None

    def released(self) -> Source:
        """This source without its pixels in memory (see the class docstring)."""
        return self if self._pixels is None else self._copy(None)

    def held(self) -> Source:
        """This source with its pixels in memory (decoded now if it was released)."""
        return self if self._pixels is not None else self._copy(self.pixels)

    def _copy(self, pixels: np.ndarray | None) -> Source:
        copy = Source.__new__(Source)
        for name in ("record", "path", "sha256", "notes", "_shape", "_max_pixels"):
            object.__setattr__(copy, name, getattr(self, name))
        object.__setattr__(copy, "_pixels", pixels)
        return copy


#: released sources' pixels kept decoded (a run works on a few templates at a time; each
#: template asks for its source's pixels many times)
PIXEL_CACHE_ITEMS = 8


def _decoded(source: Source) -> np.ndarray:
    return _decode_checked(source.path, source.sha256, source._max_pixels)


@functools.lru_cache(maxsize=PIXEL_CACHE_ITEMS)
def _decode_checked(path: Path, sha256: str, max_pixels: int) -> np.ndarray:
    """The photo at ``path`` decoded, if its bytes still have ``sha256`` (a refusal is not cached)."""
    loaded = load_image(path, max_pixels=max_pixels)
    if loaded.sha256 != sha256:
        raise SourceError(
            path,
            f"source_changed: the photo changed during the run (sha256 {loaded.sha256[:12]}, was "
            f"{sha256[:12]}); leave the photos alone while a run uses them, then run again",
        )
    return loaded.pixels


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
    """Read the metadata and decode every photo it names: ``list(iter_sources(...))``, every
    photo held in memory (see :func:`iter_sources`)."""
    return list(iter_sources(photos_dir, metadata_path, max_pixels=max_pixels))


def iter_sources(
    photos_dir: str | Path,
    metadata_path: str | Path,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> Iterator[Source | FailedSource]:
    """Read the metadata, then decode the photos it names one at a time, in metadata order.

    The metadata is read (and refused) before the first photo is decoded. A caller that keeps
    :meth:`Source.released` copies holds one decoded photo at a time, however many there are.

    A record with a ``limb_mask`` also has its mask read and checked against the photo's size
    (:func:`counterfactory.generation.masks.mask_from_record`); a mask that cannot be read, does not fit or is
    empty fails the source. A record whose photo bytes equal an earlier record's gets a note
    naming that record (several masks on one photo are legitimate; a copied photo is not).

    Args:
        photos_dir: the folder that record paths are relative to.
        metadata_path: a ``.yaml``/``.yml``/``.csv``/``.jsonl`` metadata file.
        max_pixels: passed to :func:`load_image`.

    Returns:
        An iterator of one item per record: :class:`Source` or :class:`FailedSource`.

    Raises:
        MetadataError: the metadata file is broken (nothing is loaded then).
        NotADirectoryError: ``photos_dir`` is not a folder.
    """
    photos_dir = Path(photos_dir).resolve()
    records = load_metadata(metadata_path)
    if not photos_dir.is_dir():
        raise NotADirectoryError(
            f"{photos_dir}: photos folder not found; pass the folder the metadata paths are relative to"
        )
    return _decode_each(photos_dir, records, max_pixels)


def _decode_each(photos_dir: Path, records: list[SourceRecord], max_pixels: int) -> Iterator[Source | FailedSource]:
    first_by_hash: dict[str, str] = {}
    for record in records:
        path = photos_dir / record.path
        # a symlink is followed, and its target must be inside the folder too: the release
        # copies the target's bytes, never a link that points elsewhere
        resolved = path.resolve()
        if not resolved.is_relative_to(photos_dir):
            # where it leads is not said: the reason reaches the release's stats
            reason = (
                f"source_outside_folder: {record.path} leads outside the photos folder (through a "
                "symbolic link); copy the photo into the folder instead of linking to it"
            )
            yield FailedSource(record.id, path, reason, record)
            continue
        path = resolved
        try:
            loaded = load_image(path, max_pixels=max_pixels)
        except SourceError as exc:
            yield FailedSource(record.id, path, exc.reason, record)
            continue
        if record.limb_mask is not None:
            try:
                mask = mask_from_record(record, photos_dir, loaded.pixels.shape[:2])
            except MaskError as exc:
                yield FailedSource(record.id, path, f"limb mask: {exc}", record)
                continue
            if mask is not None and not mask.any():
                yield FailedSource(
                    record.id, path, "limb mask: the mask is empty inside the photo; redraw it over the limb", record
                )
                continue
        notes = loaded.notes
        if loaded.sha256 in first_by_hash:
            notes += (f"same file bytes as source {first_by_hash[loaded.sha256]!r}",)
        else:
            first_by_hash[loaded.sha256] = record.id
        yield Source(record, path, loaded.sha256, loaded.pixels, notes, max_pixels=max_pixels)


__all__ = [
    "DEFAULT_MAX_PIXELS",
    "SourcesConfig",
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
    "iter_sources",
    "load_sources",
    "scale_16bit_to_8bit",
]


class PreparedSource:
    """A usable source with what every cell of its template needs.

    Attributes:
        source: the :class:`~counterfactory.generation.sources.Source`.
        region: ``(H, W)`` uint8 {0, 255}: face mask (face designs) or limb mask (limb designs).
        face_size_px: the face's size, or None.
        meta: the source's metadata record as JSON.

    A run keeps every template's source for its whole length, so it keeps them
    :meth:`released`: the photo's pixels are not held (decoded again when asked for) and the
    region is packed to one bit a pixel. :func:`process_template` works on a :meth:`held`
    copy for as long as the template runs.
    """

    __slots__ = ("source", "face_size_px", "meta", "_region", "_bits", "_shape")

    def __init__(self, source: Source, region: np.ndarray, face_size_px: float | None, meta: dict[str, Any]) -> None:
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "face_size_px", face_size_px)
        object.__setattr__(self, "meta", meta)
        object.__setattr__(self, "_region", region)
        object.__setattr__(self, "_bits", None)
        object.__setattr__(self, "_shape", tuple(region.shape))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"PreparedSource is read-only (tried to set {name!r})")

    def __repr__(self) -> str:
        return f"PreparedSource(id={self.id!r}, face_size_px={self.face_size_px!r}, {self.source!r})"

    def __getstate__(self) -> dict:
        return {"source": self.source, "region": self.region, "face_size_px": self.face_size_px, "meta": self.meta}

    def __setstate__(self, state: dict) -> None:
        PreparedSource.__init__(self, state["source"], state["region"], state["face_size_px"], state["meta"])

    @property
    def id(self) -> str:
        return self.source.record.id

    @property
    def region(self) -> np.ndarray:
        if self._region is not None:
            return self._region
        flat = np.unpackbits(self._bits, count=int(np.prod(self._shape)))
        return (flat.reshape(self._shape) * np.uint8(255)).astype(np.uint8, copy=False)

    def released(self) -> PreparedSource:
        """A copy holding neither the photo's pixels nor the unpacked region (see the class
        docstring); a region that is not exactly {0, 255} stays unpacked."""
        region, bits = self._region, self._bits
        if region is not None and region.dtype == np.uint8 and not np.any((region != 0) & (region != 255)):
            region, bits = None, np.packbits(region.reshape(-1) == 255)
        copy = PreparedSource.__new__(PreparedSource)
        for name, value in (
            ("source", self.source.released()),
            ("face_size_px", self.face_size_px),
            ("meta", self.meta),
            ("_region", region),
            ("_bits", bits),
            ("_shape", self._shape),
        ):
            object.__setattr__(copy, name, value)
        return copy

    def held(self) -> PreparedSource:
        """A copy with the photo's pixels decoded and the region unpacked."""
        if self._region is not None and self.source.holds_pixels:
            return self
        return PreparedSource(self.source.held(), self.region, self.face_size_px, self.meta)
