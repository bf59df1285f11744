"""Writers of bad input files, shared by the source tests and the flow tests.

Each ``write_*`` function writes one kind of broken photo into ``folder`` and returns its path.
They are cheap (milliseconds, kilobytes): the 10000 x 10000 image is a valid 1-bit PNG of a
constant image, about 12 KB on disk, crafted by hand so nothing ever holds its pixels.

Import as ``from tests.generation import badinputs`` (run pytest from the repository root,
``python -m pytest``, so the root is on ``sys.path``).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from counterfactory.assets import PHOTOS_DIR

#: The real photo the truncated and corrupt files are cut from.
REAL_JPEG = PHOTOS_DIR / "grace_hopper.jpg"
REAL_PNG = PHOTOS_DIR / "astronaut.png"


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def write_truncated_jpeg(
    folder: str | Path,
    name: str = "truncated.jpg",
    *,
    photo: Path = REAL_JPEG,
    keep_fraction: float = 0.5,
) -> Path:
    """The first ``keep_fraction`` of a real JPEG's bytes (a download cut short)."""
    data = Path(photo).read_bytes()
    path = Path(folder) / name
    path.write_bytes(data[: int(len(data) * keep_fraction)])
    return path


def write_corrupt_png(folder: str | Path, name: str = "corrupt.png", *, photo: Path = REAL_PNG) -> Path:
    """A real PNG of full length with its compressed pixel data overwritten in the middle."""
    data = bytearray(Path(photo).read_bytes())
    start = data.index(b"IDAT") + 4
    middle = start + (len(data) - start) // 2
    data[middle : middle + 64] = bytes(range(64))
    path = Path(folder) / name
    path.write_bytes(bytes(data))
    return path


def write_zero_byte(folder: str | Path, name: str = "empty.jpg") -> Path:
    """An empty file with an image name (a copy that never happened)."""
    path = Path(folder) / name
    path.write_bytes(b"")
    return path


def write_text_as_jpg(folder: str | Path, name: str = "not_an_image.jpg") -> Path:
    """An HTML error page saved under a ``.jpg`` name (a failed download)."""
    path = Path(folder) / name
    path.write_text(
        "<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>\n"
        "<body><h1>Not Found</h1><p>The requested image was not found.</p></body></html>\n",
        encoding="utf-8",
    )
    return path


def write_huge_png(
    folder: str | Path, name: str = "huge.png", *, side: int = 10_000, header_only: bool = False
) -> Path:
    """A ``side`` x ``side`` black 1-bit PNG (about 12 KB for 10000).

    With ``header_only`` the file has a valid signature and IHDR but no pixel data: enough for
    anything that checks the size before decoding, and instant for any ``side``.
    """
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)  # 1-bit greyscale
    chunks = [_png_chunk(b"IHDR", ihdr)]
    if not header_only:
        row = b"\x00" + bytes((side + 7) // 8)  # filter byte "none", then zero bits
        compressor = zlib.compressobj(9)
        body = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
        chunks.append(_png_chunk(b"IDAT", body))
    chunks.append(_png_chunk(b"IEND", b""))
    path = Path(folder) / name
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"".join(chunks))
    return path


def write_long_png(folder: str | Path, name: str = "long.png", *, width: int = 33_000, height: int = 900) -> Path:
    """A valid black 1-bit PNG with one side past 32767 px (about 30 KB), within the pixel budget.

    Its 29.7 million pixels pass a pixel-count limit; MediaPipe and OpenCV abort the whole
    process (SIGABRT, rc 134) on a side this long.
    """
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    row = b"\x00" + bytes((width + 7) // 8)
    compressor = zlib.compressobj(9)
    body = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    chunks = [_png_chunk(b"IHDR", ihdr), _png_chunk(b"IDAT", body), _png_chunk(b"IEND", b"")]
    path = Path(folder) / name
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"".join(chunks))
    return path


def write_sparse_junk(folder: str | Path, name: str = "junk.jpg", *, size: int = 4 << 30) -> Path:
    """A ``size``-byte file of zeros named like a photo; sparse, so it costs no disk space."""
    path = Path(folder) / name
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def write_tiny_png(folder: str | Path, name: str = "tiny.png", *, side: int = 32) -> Path:
    """A valid ``side`` x ``side`` RGB PNG cut from a real photo (too small to use)."""
    with Image.open(REAL_PNG) as image:
        crop = np.asarray(image.convert("RGB"))[:side, :side]
    path = Path(folder) / name
    Image.fromarray(crop).save(path)
    return path


#: file name -> writer, for tests that want every bad input at once.
BAD_INPUTS: dict[str, Callable[..., Path]] = {
    "truncated.jpg": write_truncated_jpeg,
    "corrupt.png": write_corrupt_png,
    "empty.jpg": write_zero_byte,
    "not_an_image.jpg": write_text_as_jpg,
    "huge.png": write_huge_png,
    "tiny.png": write_tiny_png,
    "long.png": write_long_png,
}


def write_all(folder: str | Path) -> dict[str, Path]:
    """Write every bad input into ``folder``; returns file name -> path."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    return {name: writer(folder, name) for name, writer in BAD_INPUTS.items()}
