"""Decode one photo into the canonical form: ``(H, W, 3)`` ``uint8`` RGB, upright, no alpha.

EXIF orientation, alpha, greyscale, 16-bit and CMYK are normalised and each step is noted; a
photo that cannot be used raises :class:`~counterfactory.generation.errors.SourceError`.

Editors' outputs and imported sets arrive in worse shape than photos: PNGs whose ancillary
chunks (a ComfyUI workflow in ``tEXt``) carry a bad CRC, WebP, AVIF. A PNG ancillary chunk with
a bad CRC is dropped before decoding (libpng's own default: warn and skip), so its pixels are
read exactly; that and any warning the decoder raises are kept in ``notes`` as
``decoder warning: ...`` lines (:data:`DECODER_WARNING`), so they reach the item's record.
"""

from __future__ import annotations

import hashlib
import io
import struct
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError, features

from counterfactory.generation.errors import SourceError
from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.safefiles import InputFileError, decoder_problem, read_regular

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
#: The prefix of a note that says the file decoded only with a warning (a damaged ancillary
#: chunk skipped, a decoder's own warning); :func:`decoder_warnings` lists them.
DECODER_WARNING = "decoder warning: "
#: Whether this Pillow reads AVIF (Pillow 11.2+ built with libavif); AVIF files fail otherwise.
AVIF_SUPPORTED = bool(features.check("avif"))
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


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


def _what_it_looks_like(start: bytes) -> str:
    """A hint about a file PIL cannot read, from its first bytes, that never quotes them (the
    file may be anything a table named: a message must not carry its contents)."""
    if not start:
        return "; the file is empty"
    text = start.lstrip()
    if text[:1] == b"<":
        return " (it looks like HTML or XML); it may be a web page saved under an image name: download the image itself"
    printable = sum(32 <= b < 127 or b in (9, 10, 13) for b in start)
    if printable >= 0.95 * len(start):
        return " (it looks like text); it may be a text file saved under an image name: name the image itself"
    return " (no known image signature); it may be damaged or another kind of file: export it again as PNG or JPEG"


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
    with open(path, "rb") as f:
        start = f.read(24)
    if start.startswith(_PNG_SIGNATURE) and start[12:16] == b"IHDR":
        # read from IHDR directly: Pillow refuses a PNG whose ancillary chunk before the pixels
        # has a bad CRC, which load_image reads (the chunk dropped)
        width, height = struct.unpack(">II", start[16:24])
        _check_size(path, width, height, max_pixels=max_pixels, max_side_px=max_side_px)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            with Image.open(path) as image:
                width, height = image.size
        except UnidentifiedImageError:
            with open(path, "rb") as f:
                start = f.read(512)
            raise SourceError(path, f"not an image PIL can read{_what_it_looks_like(start)}") from None
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

        - 16-bit RGB(A) PNG: read at full depth (OpenCV) and scaled as 16-bit greyscale is.

    What it reads despite damage (each adds a ``decoder warning: ...`` note, see
    :func:`decoder_warnings`): a PNG ancillary chunk (``tEXt``, ``iTXt``, ``eXIf``, ...) with a
    bad CRC is dropped before decoding (its pixels are exactly the undamaged file's); a warning
    the decoder raises while reading is recorded. WebP and AVIF (where Pillow has it,
    :data:`AVIF_SUPPORTED`) are read as any other format.

    The size is checked from the header before any pixel is decoded, so an oversized file
    costs only its header. The whole image is then decoded (truncated files and damaged
    critical chunks are errors; ``ImageFile.LOAD_TRUNCATED_IMAGES`` is left alone: it is
    process-wide and would show a half-downloaded photo as grey).

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
        # opened as a regular file of at most max_bytes, checked on the descriptor: a FIFO or a
        # device swapped in after the checks above is refused, never read
        data = read_regular(path.resolve(), max_bytes, limit_field="sources.max_pixels")
    except InputFileError as exc:
        raise SourceError(path, str(exc)) from None
    except OSError as exc:
        raise SourceError(path, f"cannot read the file ({exc.strerror or exc})") from None
    if not data:
        raise SourceError(path, "empty file (0 bytes); the copy or download did not finish: fetch the photo again")
    sha256 = hashlib.sha256(data).hexdigest()
    damaged = "the file is incomplete or damaged: download or export it again"
    notes: list[str] = []
    data = _repair_png(data, notes)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
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
            hint = (
                "; this Pillow has no AVIF support: pip install 'pillow>=11.2' built with libavif"
                if _looks_avif(data) and not AVIF_SUPPORTED
                else _what_it_looks_like(data[:512])
            )
            raise SourceError(path, f"not an image PIL can read{hint}") from None
        except Exception as exc:  # noqa: BLE001 - any header failure is this file's problem
            raise SourceError(path, f"unreadable image header ({decoder_problem(exc, data)}); {damaged}") from None

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
                    f"truncated or corrupt image data ({decoder_problem(exc, data)}); {damaged}",
                ) from None
            frames = getattr(image, "n_frames", 1)
            if frames > 1:
                notes.append(f"first of {frames} frames used")
            try:
                deep = _png_16bit_rgb(data, notes)
                if deep is not None:
                    rgb = _exif_upright_array(image, deep, notes)
                else:
                    upright = _exif_upright(image, notes)
                    rgb = _to_rgb(upright, notes)
            except _UnsupportedPixels as exc:
                raise SourceError(path, str(exc)) from None
            except Exception as exc:  # noqa: BLE001
                raise SourceError(
                    path,
                    f"cannot convert the pixels to RGB ({decoder_problem(exc, data)}); "
                    "re-export the photo as 8-bit RGB JPEG or PNG",
                ) from None
            if image.info.get("icc_profile"):
                notes.append("embedded ICC profile not applied (pixel values used as stored)")
    for warning in caught:
        # catch_warnings is process-wide: keep only what Pillow itself warned while decoding
        if "PIL" in Path(warning.filename).parts and not issubclass(warning.category, Image.DecompressionBombWarning):
            notes.append(f"{DECODER_WARNING}{decoder_problem(warning.message, data)}")

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


class _UnsupportedPixels(CounterfactoryError, ValueError):
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


def decoder_warnings(notes: tuple[str, ...] | list[str]) -> list[str]:
    """The notes of :func:`load_image` that say the file decoded only with a warning."""
    return [note for note in notes if note.startswith(DECODER_WARNING)]


def _looks_avif(data: bytes) -> bool:
    return data[4:8] == b"ftyp" and data[8:12] in (b"avif", b"avis")


def _repair_png(data: bytes, notes: list[str]) -> bytes:
    """``data`` without its PNG ancillary chunks whose CRC is wrong (others left as they are).

    PNG (ISO/IEC 15948, section 5.4) marks a chunk ancillary by a lower-case first letter: a
    decoder may skip it, and libpng by default warns and skips one with a bad CRC, while Pillow
    refuses the whole file. A damaged *critical* chunk (IHDR, IDAT, ...) is kept, so the decoder
    still reports the damage. Anything that does not parse as chunks is returned unchanged.
    """
    if not data.startswith(_PNG_SIGNATURE):
        return data
    out = [data[:8]]
    pos, dropped = 8, []
    while pos + 12 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        end = pos + 12 + length
        if end > len(data):
            break
        kind = data[pos + 4 : pos + 8]
        (crc,) = struct.unpack(">I", data[end - 4 : end])
        ancillary = bool(kind[0] & 0x20)
        if ancillary and zlib.crc32(data[pos + 4 : end - 4]) & 0xFFFFFFFF != crc:
            dropped.append(f"{kind.decode('latin-1')} at byte {pos}")
        else:
            out.append(data[pos:end])
        pos = end
        if kind == b"IEND":
            break
    if not dropped:
        return data
    out.append(data[pos:])
    notes.append(
        f"{DECODER_WARNING}PNG ancillary chunk{'s' if len(dropped) > 1 else ''} with a bad CRC skipped "
        f"({', '.join(dropped)}); the pixels are unaffected"
    )
    return b"".join(out)


def _png_16bit_rgb(data: bytes, notes: list[str]) -> np.ndarray | None:
    """A 16-bit RGB or RGBA PNG at full depth as ``(H, W, 3)`` ``uint8`` (alpha onto white), else None.

    Pillow reduces these to 8 bits by keeping the high byte; OpenCV reads all 16 bits, which
    are scaled as 16-bit greyscale is (:func:`scale_16bit_to_8bit`).
    """
    if not data.startswith(_PNG_SIGNATURE) or data[12:16] != b"IHDR" or len(data) < 26:
        return None
    depth, colour = data[24], data[25]
    if depth != 16 or colour not in (2, 6):
        return None
    import cv2

    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED | cv2.IMREAD_IGNORE_ORIENTATION)
    if decoded is None or decoded.dtype != np.uint16 or decoded.ndim != 3:
        return None
    rgb = decoded[..., 2::-1].astype(np.float64)
    if decoded.shape[2] == 4:
        alpha = decoded[..., 3:4].astype(np.float64) / 65535.0
        rgb = rgb * alpha + 65535.0 * (1.0 - alpha)
        notes.append("16-bit alpha channel composited onto white")
    notes.append("16-bit RGB scaled to 8 bits as round(v * 255 / 65535)")
    return scale_16bit_to_8bit(np.rint(rgb))


_TRANSPOSE = {
    2: (Image.Transpose.FLIP_LEFT_RIGHT,),
    3: (Image.Transpose.ROTATE_180,),
    4: (Image.Transpose.FLIP_TOP_BOTTOM,),
    5: (Image.Transpose.TRANSPOSE,),
    6: (Image.Transpose.ROTATE_270,),
    7: (Image.Transpose.TRANSVERSE,),
    8: (Image.Transpose.ROTATE_90,),
}


def _exif_upright_array(image: Image.Image, rgb: np.ndarray, notes: list[str]) -> np.ndarray:
    """``rgb`` (decoded outside PIL from ``image``'s file) turned upright by ``image``'s EXIF orientation."""
    try:
        orientation = image.getexif().get(ExifTags.Base.Orientation, 1)
    except Exception:  # noqa: BLE001 - a broken EXIF block is not a broken photo
        notes.append("unreadable EXIF block ignored")
        return rgb
    if orientation not in _TRANSPOSE:
        return rgb
    notes.append(f"EXIF orientation {orientation} applied (stored image {_ORIENTATION_NAMES[orientation]})")
    upright = Image.fromarray(np.ascontiguousarray(rgb))
    for method in _TRANSPOSE[orientation]:
        upright = upright.transpose(method)
    return np.asarray(upright)
