"""Limb masks: the region a limb-difference edit may change, from a source's annotation.

A limb edit inpaints only inside its mask and keeps every pixel outside it (DESIGN.md,
"Alignment comes before any measurement"). Masks come from the metadata record as polygons,
an image file or an uncompressed COCO RLE (:class:`counterfactory.generation.sources.SourceRecord`); model-made
masks (SAM) live in ``counterfactory.generation.masks_sam``.

Conventions shared by every function here:
    - a binary mask is ``(H, W)`` ``uint8`` with 255 inside and 0 outside;
    - a soft mask (alpha) is ``(H, W)`` ``float32`` in [0, 1];
    - shapes are ``(H, W)`` (rows, columns), sizes in messages are ``width x height``;
    - polygon coordinates are continuous pixel units, x right and y down, where pixel
      ``(col, row)`` covers ``[col, col + 1) x [row, row + 1)``; a pixel is inside when its
      centre ``(col + 0.5, row + 0.5)`` is (so a polygon's pixel count approximates its area).

Reference for RLE: Lin et al., "Microsoft COCO: Common Objects in Context" (ECCV 2014) and the
``pycocotools`` mask API (uncompressed ``{"size": [h, w], "counts": [...]}``, column-major runs
starting with the background).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError
from pydantic import BaseModel, ConfigDict, Field

from counterfactory.generation.images import scale_16bit_to_8bit
from counterfactory.generation.records import RLE, FileMask, PolygonMask, RLEMask, SamMask, sam_mask_file
from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.safefiles import InputFileError, decoder_problem, read_regular


class MaskError(CounterfactoryError, ValueError):
    """A mask cannot be built: unreadable file, wrong size, malformed polygons or RLE."""


class MaskOptions(BaseModel):
    """How a limb mask is grown before an edit uses it (``masks`` in the spec).

    Attributes:
        dilate_px: grow the mask by this many pixels (elliptical kernel) so the edit covers
            the limb's edge; the grown mask is the region that may change. The composite's
            soft edge is ``align.feather_px``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    dilate_px: int = Field(0, ge=0)


def _check_shape(shape: Sequence[int]) -> tuple[int, int]:
    if len(shape) < 2 or int(shape[0]) < 1 or int(shape[1]) < 1:
        raise MaskError(f"shape must be (H, W) with both at least 1, got {tuple(shape)}")
    return int(shape[0]), int(shape[1])


def _binary(mask: np.ndarray) -> np.ndarray:
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise MaskError(f"expected an (H, W) mask, got shape {mask.shape}")
    return np.where(mask > 0, np.uint8(255), np.uint8(0))


def polygon_mask(polygons: Sequence[Sequence[Sequence[float]]], shape: Sequence[int]) -> np.ndarray:
    """Rasterise polygons into a binary mask (their union; each polygon filled even-odd).

    A pixel is inside when its centre ``(col + 0.5, row + 0.5)`` lies inside the polygon; a
    centre exactly on a left/top edge counts as inside, on a right/bottom edge as outside, so
    an axis-aligned rectangle with integer corners covers exactly ``width * height`` pixels.
    Parts of a polygon outside the image are clipped.

    Args:
        polygons: sequence of polygons, each a sequence of at least 3 ``(x, y)`` points in
            pixels (floats allowed).
        shape: ``(H, W)`` of the mask in pixels.

    Returns:
        ``(H, W)`` ``uint8``, 255 inside and 0 outside.
    """
    h, w = _check_shape(shape)
    covered = np.zeros((h, w), dtype=bool)
    rows_c = np.arange(h, dtype=np.float64) + 0.5
    for i, poly in enumerate(polygons):
        pts = np.asarray(poly, dtype=np.float64)
        if pts.ndim != 2 or pts.shape[1] != 2 or len(pts) < 3:
            raise MaskError(f"polygon {i}: expected at least 3 (x, y) points, got array of shape {pts.shape}")
        if not np.isfinite(pts).all():
            raise MaskError(f"polygon {i}: coordinates must be finite")
        x0, y0 = pts[:, 0], pts[:, 1]
        x1, y1 = np.roll(x0, -1), np.roll(y0, -1)
        # Half-open rule: an edge crosses the scanline at yc when min(y0, y1) <= yc < max(y0, y1).
        lo, hi = np.minimum(y0, y1), np.maximum(y0, y1)
        crosses = (rows_c[:, None] >= lo[None, :]) & (rows_c[:, None] < hi[None, :])
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (rows_c[:, None] - y0[None, :]) / (y1 - y0)[None, :]
        xs = np.where(crosses, x0[None, :] + t * (x1 - x0)[None, :], np.inf)
        xs.sort(axis=1)
        n_cross = crosses.sum(axis=1)
        # Pairs (x_in, x_out) of sorted crossings span the inside; pixel col is inside when
        # x_in <= col + 0.5 < x_out, i.e. ceil(x_in - 0.5) <= col < ceil(x_out - 0.5).
        diff = np.zeros((h, w + 1), dtype=np.int32)
        for k in range(0, xs.shape[1] - 1, 2):
            valid = n_cross > k + 1
            if not valid.any():
                break
            rows = np.nonzero(valid)[0]
            start = np.clip(np.ceil(xs[rows, k] - 0.5), 0, w).astype(np.int64)
            stop = np.clip(np.ceil(xs[rows, k + 1] - 0.5), 0, w).astype(np.int64)
            keep = stop > start
            np.add.at(diff, (rows[keep], start[keep]), 1)
            np.add.at(diff, (rows[keep], stop[keep]), -1)
        covered |= np.cumsum(diff, axis=1)[:, :w] > 0
    return np.where(covered, np.uint8(255), np.uint8(0))


def rle_encode(mask: np.ndarray) -> dict[str, Any]:
    """Encode a mask as an uncompressed COCO RLE.

    Args:
        mask: ``(H, W)``, any dtype; nonzero is inside.

    Returns:
        ``{"size": [H, W], "counts": [...]}``: run lengths over the pixels in column-major
        order, alternating outside/inside, starting with an outside run (0 when the first
        pixel is inside). ``sum(counts) == H * W``.
    """
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise MaskError(f"expected an (H, W) mask, got shape {mask.shape}")
    h, w = mask.shape
    flat = (mask != 0).ravel(order="F")
    changes = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    bounds = np.concatenate(([0], changes, [flat.size]))
    counts = np.diff(bounds).tolist()
    if flat.size and flat[0]:
        counts = [0] + counts
    return {"size": [int(h), int(w)], "counts": [int(c) for c in counts]}


def rle_decode(rle: Mapping[str, Any] | RLE | RLEMask) -> np.ndarray:
    """Decode an uncompressed COCO RLE (see :func:`rle_encode`) into a binary mask.

    Args:
        rle: ``{"size": [H, W], "counts": [...]}``, an :class:`RLE`, or an :class:`RLEMask`.

    Returns:
        ``(H, W)`` ``uint8``, 255 inside and 0 outside.

    Raises:
        MaskError: malformed size or counts, compressed (string) counts, or counts that do not
            sum to ``H * W``.
    """
    if isinstance(rle, RLEMask):
        rle = rle.rle
    if not isinstance(rle, RLE):
        try:
            rle = RLE.model_validate(dict(rle))
        except Exception as exc:  # noqa: BLE001 - pydantic or a non-mapping
            raise MaskError(f"invalid RLE: {exc}") from None
    h, w = rle.size
    counts = np.asarray(rle.counts, dtype=np.int64)
    values = np.zeros(len(counts), dtype=np.uint8)
    values[1::2] = 255
    flat = np.repeat(values, counts)
    return np.ascontiguousarray(flat.reshape((h, w), order="F"))


def load_mask_file(path: str | Path, shape: Sequence[int]) -> np.ndarray:
    """Read a mask image; a pixel is inside when its grey value is above 127.

    Colour images are reduced to grey with PIL's ``L`` conversion (ITU-R 601-2 luma) and alpha
    is ignored; 16-bit images are scaled to 8 bits first (``round(v * 255 / 65535)``). EXIF
    orientation is applied, as for photos.

    Args:
        path: any image file PIL reads.
        shape: ``(H, W)`` the mask must have (the upright photo's).

    Returns:
        ``(H, W)`` ``uint8``, 255 inside and 0 outside.

    Raises:
        MaskError: the file is missing or unreadable, or its size differs from ``shape``
            (the message names the file and both sizes).
    """
    h, w = _check_shape(shape)
    path = Path(path)
    if not path.is_file():
        raise MaskError(f"{path}: mask file not found; the path is relative to the photos folder")
    # a regular file of a size a mask of this photo can have, read once: a FIFO never blocks, a
    # device is never read, and a decoder's message is checked against the bytes it quotes
    max_bytes = h * w * 8 + (16 << 20)
    try:
        data = read_regular(path.resolve(), max_bytes, limit_field="a larger photo")
    except InputFileError as exc:
        raise MaskError(f"{path}: {exc}") from None
    except OSError as exc:
        raise MaskError(f"{path}: cannot read the mask file ({exc.strerror or exc})") from None
    try:
        with Image.open(io.BytesIO(data)) as image:
            # the header's size, either way up (EXIF may rotate it), before any pixel is decoded
            if sorted(image.size) != sorted((w, h)):
                raise MaskError(
                    f"{path}: mask is {image.size[0]}x{image.size[1]} (width x height) but the photo is "
                    f"{w}x{h}; draw the mask on the upright photo at its full size"
                )
            image.load()
            image = ImageOps.exif_transpose(image)
            if image.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
                grey = scale_16bit_to_8bit(np.clip(np.asarray(image), 0, 65535))
            else:
                if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
                    image = image.convert("RGB")
                grey = np.asarray(image.convert("L"))
    except MaskError:
        raise
    except UnidentifiedImageError:
        raise MaskError(
            f"{path}: cannot read the mask image (not an image PIL can read); save it as a PNG image"
        ) from None
    except Exception as exc:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError...
        raise MaskError(f"{path}: cannot read the mask image ({decoder_problem(exc, data)})") from None
    if grey.shape != (h, w):
        raise MaskError(
            f"{path}: mask is {grey.shape[1]}x{grey.shape[0]} (width x height) but the photo is "
            f"{w}x{h}; draw the mask on the upright photo at its full size"
        )
    return np.where(grey > 127, np.uint8(255), np.uint8(0))


def mask_from_record(record: Any, photos_dir: str | Path, shape: Sequence[int]) -> np.ndarray | None:
    """The binary limb mask a record (or a :class:`~counterfactory.generation.sources.Source`) annotates.

    Args:
        record: a :class:`~counterfactory.generation.sources.SourceRecord`, or anything with ``.record``
            holding one.
        photos_dir: the folder mask file paths are relative to.
        shape: ``(H, W)`` of the upright photo.

    Returns:
        ``(H, W)`` ``uint8`` (255 inside), or ``None`` when the record has no limb mask.

    Raises:
        MaskError: the mask cannot be built or does not match ``shape``.
    """
    h, w = _check_shape(shape)
    record = getattr(record, "record", record)
    spec = getattr(record, "limb_mask", None)
    if spec is None:
        return None
    if isinstance(spec, PolygonMask):
        return polygon_mask(spec.polygons, (h, w))
    if isinstance(spec, FileMask):
        return load_mask_file(_inside(photos_dir, spec.file), (h, w))
    if isinstance(spec, SamMask):
        # the mask SAM drew once and `counterfactory masks` stored: the run depends on its pixels
        target = _inside(photos_dir, sam_mask_file(record.id, spec.sam))
        if not target.is_file():
            raise MaskError(
                f"{target}: no stored SAM mask for source {record.id!r} with this prompt; make it with "
                "`counterfactory masks SPEC --sam CHECKPOINT` (or draw it and save it under that name)"
            )
        return load_mask_file(target, (h, w))
    if isinstance(spec, RLEMask):
        # compare the declared size before decoding: a 50000 x 50000 RLE is 2.5 GB decoded
        rh, rw = spec.rle.size
        if (rh, rw) != (h, w):
            source_id = getattr(record, "id", "?")
            raise MaskError(
                f"RLE mask of source {source_id!r} is {rw}x{rh} (width x height) but the photo is "
                f"{w}x{h}; encode the mask of the upright photo at its full size"
            )
        return rle_decode(spec.rle)
    raise MaskError(f"unknown limb_mask kind {type(spec).__name__}")


def _inside(photos_dir: str | Path, relative: str) -> Path:
    """``photos_dir / relative``, refused when it leads outside the photos folder."""
    folder = Path(photos_dir).resolve()
    target = (folder / relative).resolve()
    if not target.is_relative_to(folder):
        # where it leads is not said: the message reaches the release's stats as the source's reason
        raise MaskError(
            f"{relative}: leads outside the photos folder (through a symbolic link); copy the mask "
            "into the folder instead of linking to it"
        )
    return target


def dilate(mask: np.ndarray, px: int) -> np.ndarray:
    """Grow a mask by ``px`` pixels: every pixel within Euclidean distance ``px`` of it.

    Args:
        mask: ``(H, W)``, nonzero inside.
        px: growth in pixels, >= 0 (0 returns the binarised mask).

    Returns:
        ``(H, W)`` ``uint8``, 255 inside and 0 outside.
    """
    if px < 0:
        raise MaskError(f"dilate px must be >= 0, got {px}")
    binary = _binary(mask)
    if px == 0:
        return binary
    # Euclidean distance to the mask, thresholded: the same disc as an elliptical kernel of
    # radius px, but linear in the image size (a 280 px kernel on a 2 MP photo took 1.2 s).
    distance = cv2.distanceTransform((binary == 0).astype(np.uint8), cv2.DIST_L2, cv2.DIST_MASK_PRECISE)
    return np.where(distance <= px, 255, 0).astype(np.uint8)


def feather(mask: np.ndarray, px: float) -> np.ndarray:
    """Soft mask that stays inside ``mask``: 0 outside, rising to 1 over ``px`` pixels inward.

    ``alpha = smoothstep(clip(d / px, 0, 1))`` where ``d`` is each inside pixel's Euclidean
    distance (in pixels) to the nearest outside pixel. Unlike a Gaussian blur, which spreads
    alpha *outside* the mask, compositing with this alpha leaves every pixel outside the mask exactly as the
    source had it, which the limb locality gate requires. The image border is not an edge.

    Args:
        mask: ``(H, W)``, nonzero inside.
        px: feather width in pixels, >= 0; 0 returns the hard mask as 0.0/1.0.

    Returns:
        ``(H, W)`` ``float32`` in [0, 1]; exactly 0 outside the mask, 1 at ``px`` or deeper.
    """
    if px < 0:
        raise MaskError(f"feather px must be >= 0, got {px}")
    binary = _binary(mask)
    if px == 0 or not binary.any():
        return (binary > 0).astype(np.float32)
    if binary.all():
        return np.ones(binary.shape, np.float32)
    distance = cv2.distanceTransform(binary, cv2.DIST_L2, cv2.DIST_MASK_PRECISE)
    t = np.clip(distance / float(px), 0.0, 1.0)
    alpha = t * t * (3.0 - 2.0 * t)
    alpha[binary == 0] = 0.0
    return alpha.astype(np.float32)


def apply_mask_options(mask: np.ndarray, options: MaskOptions) -> np.ndarray:
    """The edit region for ``options``: the mask grown by ``dilate_px``.

    Args:
        mask: ``(H, W)``, nonzero inside (the annotated limb).
        options: how much to grow it.

    Returns:
        ``(H, W)`` ``uint8`` {0, 255}: the pixels the edit may change (and what the locality
        gate must hold fixed outside).
    """
    return dilate(mask, options.dilate_px)


__all__ = [
    "MaskError",
    "MaskOptions",
    "apply_mask_options",
    "dilate",
    "feather",
    "load_mask_file",
    "mask_from_record",
    "polygon_mask",
    "rle_decode",
    "rle_encode",
]
