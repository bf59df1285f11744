"""Decode one photo into the canonical form: ``(H, W, 3)`` ``uint8`` RGB, upright, no alpha.

EXIF orientation, alpha, greyscale, 16-bit and CMYK are normalised and each step is noted; a
photo that cannot be used raises :class:`~counterfactory.generation.errors.SourceError`.
"""

from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from counterfactory.generation.errors import SourceError

#: Default pixel budget of one photo (width x height); larger photos are refused unread.
DEFAULT_MAX_PIXELS = 40_000_000
#: The shortest side a usable photo may have, in pixels (face detectors need some room).
MIN_SIDE_PX = 64
#: The longest side a usable photo may have, in pixels: MediaPipe and OpenCV abort the
#: process (not raise) on sides of 32767 px or more; 16384 leaves room for resizing.
MAX_SIDE_PX = 16_384
#: A file larger than ``max_pixels * MAX_BYTES_PER_PIXEL`` (+16 MiB of metadata) cannot be a
#: photo within the pixel budget: 16-bit RGBA uncompressed is 8 bytes a pixel.
MAX_BYTES_PER_PIXEL = 8


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


def _too_long(width: int, height: int, max_side_px: int) -> str:
    return (
        f"image is {width}x{height}; a side over {max_side_px:,} px is refused (face detection and "
        "OpenCV abort the whole process on sides of 32767 px or more): crop or downscale the photo"
    )


def _check_size(path: Path, width: int, height: int, *, max_pixels: int, max_side_px: int) -> None:
    """Refuse a ``width`` x ``height`` image over the side or pixel limit, naming ``path``."""
    if max(width, height) > max_side_px:
        raise SourceError(path, _too_long(width, height, max_side_px))
    if width * height > max_pixels:
        raise SourceError(
            path,
            f"image is {width}x{height} = {width * height:,} pixels, over the limit of "
            f"{max_pixels:,} (max_pixels); downscale the photo or raise max_pixels",
        )


def _check_header(path: Path, *, max_pixels: int, max_side_px: int) -> None:
    """Refuse an oversized image from its header alone (PIL reads only the first bytes here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            with Image.open(path) as image:
                width, height = image.size
        except UnidentifiedImageError:
            with open(path, "rb") as f:
                start = f.read(16)
            raise SourceError(
                path,
                f"not an image PIL can read (the file starts with {start!r}); it may be a "
                "text or HTML page saved under an image name: download the image itself",
            ) from None
        except Exception:  # noqa: BLE001 - other header failures get their own message from load_image
            return
    _check_size(path, width, height, max_pixels=max_pixels, max_side_px=max_side_px)


def load_image(
    path: str | Path,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    min_side_px: int = MIN_SIDE_PX,
    max_side_px: int = MAX_SIDE_PX,
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
        max_side_px: refuse images whose longer side is above this, in pixels (native face
            detection and OpenCV cannot take sides of 32767 px or more).

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
    # sizes are checked before the file is read: a 4 GB junk ".jpg" costs a stat and a header
    size = path.stat().st_size
    if size == 0:
        raise SourceError(path, "empty file (0 bytes); the copy or download did not finish: fetch the photo again")
    max_bytes = max_pixels * MAX_BYTES_PER_PIXEL + (16 << 20)
    if size > max_bytes:
        raise SourceError(
            path,
            f"file is {size:,} bytes, more than any image within max_pixels ({max_pixels:,}) needs "
            f"({max_bytes:,}); it is not a photo of a usable size: downscale or replace it",
        )
    _check_header(path, max_pixels=max_pixels, max_side_px=max_side_px)
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
            _check_size(path, width, height, max_pixels=max_pixels, max_side_px=max_side_px)
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
