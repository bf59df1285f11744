"""Decoding what editors return: damaged PNG ancillary chunks, WebP, AVIF, 16-bit RGB, CMYK, EXIF.

Every file here is built from a bundled photo; the expected pixels come from the undamaged file
(decoded the ordinary way) or from arithmetic on the 16-bit values written, never from the code
under test alone.
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from counterfactory.assets import PHOTOS_DIR
from counterfactory.generation.errors import SourceError
from counterfactory.generation.images import AVIF_SUPPORTED, DECODER_WARNING, decoder_warnings, load_image

HOPPER = PHOTOS_DIR / "grace_hopper.jpg"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _png_with_text(pixels: np.ndarray, *, after_idat: bool = False) -> bytes:
    """A real PNG of ``pixels`` with a ComfyUI-style ``tEXt`` workflow chunk (valid CRC)."""
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    data = buf.getvalue()
    text = _chunk(b"tEXt", b'workflow\x00{"nodes": [1, 2, 3], "note": "ComfyUI"}')
    at = data.index(b"IEND") - 4 if after_idat else data.index(b"IDAT") - 4
    return data[:at] + text + data[at:]


def _damage_text_crc(data: bytes) -> bytes:
    """``data`` with the last byte of its ``tEXt`` chunk's CRC flipped."""
    start = data.index(b"tEXt") - 4
    (length,) = struct.unpack(">I", data[start : start + 4])
    crc_end = start + 12 + length
    damaged = bytearray(data)
    damaged[crc_end - 1] ^= 0xFF
    return bytes(damaged)


@pytest.mark.parametrize("after_idat", [False, True])
def test_png_with_a_bad_text_chunk_crc_reads_the_same_pixels_with_a_warning(tmp_path, after_idat):
    pixels = np.asarray(Image.open(HOPPER).convert("RGB"))
    good = tmp_path / "good.png"
    good.write_bytes(_png_with_text(pixels, after_idat=after_idat))
    bad = tmp_path / "comfy.png"
    bad.write_bytes(_damage_text_crc(good.read_bytes()))
    if not after_idat:  # Pillow alone refuses the damaged file (the case the issue reports)
        with pytest.raises((SyntaxError, OSError)), Image.open(bad) as im:
            im.load()
    clean = load_image(good)
    loaded = load_image(bad)
    np.testing.assert_array_equal(loaded.pixels, pixels)
    np.testing.assert_array_equal(loaded.pixels, clean.pixels)
    assert decoder_warnings(clean.notes) == []
    warned = decoder_warnings(loaded.notes)
    assert len(warned) == 1 and "tEXt" in warned[0] and "bad CRC" in warned[0]
    assert warned[0].startswith(DECODER_WARNING)
    assert loaded.sha256 != clean.sha256  # the file's bytes, as stored, stay its address


def test_a_damaged_critical_chunk_is_still_an_error_naming_the_file(tmp_path):
    data = bytearray(_png_with_text(np.asarray(Image.open(HOPPER).convert("RGB"))))
    start = data.index(b"IHDR")
    data[start + 17 + 3] ^= 0xFF  # IHDR's CRC
    path = tmp_path / "broken_ihdr.png"
    path.write_bytes(bytes(data))
    with pytest.raises(SourceError) as info:
        load_image(path)
    assert "broken_ihdr.png" in str(info.value)


def test_webp_lossless_reads_the_exact_pixels(tmp_path):
    pixels = np.asarray(Image.open(HOPPER).convert("RGB"))
    path = tmp_path / "out.webp"
    Image.fromarray(pixels).save(path, format="WEBP", lossless=True)
    loaded = load_image(path)
    assert loaded.format == "WEBP"
    np.testing.assert_array_equal(loaded.pixels, pixels)


def test_webp_lossy_is_close_to_the_source(tmp_path):
    pixels = np.asarray(Image.open(HOPPER).convert("RGB"))
    path = tmp_path / "out.webp"
    Image.fromarray(pixels).save(path, format="WEBP", quality=90)
    loaded = load_image(path)
    assert loaded.pixels.shape == pixels.shape
    assert np.abs(loaded.pixels.astype(int) - pixels).mean() < 4.0


@pytest.mark.skipif(not AVIF_SUPPORTED, reason="this Pillow has no AVIF support")
def test_avif_is_read_where_pillow_has_it(tmp_path):
    pixels = np.asarray(Image.open(HOPPER).convert("RGB"))
    path = tmp_path / "out.avif"
    Image.fromarray(pixels).save(path, format="AVIF", quality=90)
    loaded = load_image(path)
    assert loaded.format == "AVIF" and loaded.pixels.shape == pixels.shape
    assert np.abs(loaded.pixels.astype(int) - pixels).mean() < 6.0


def test_16bit_rgb_png_is_scaled_from_all_16_bits(tmp_path):
    rng = np.random.default_rng(0)
    rgb16 = rng.integers(0, 65536, size=(70, 90, 3), dtype=np.uint16)
    rgb16[0, 0] = (65535, 32896, 257)
    path = tmp_path / "deep.png"
    assert cv2.imwrite(str(path), rgb16[..., ::-1])
    loaded = load_image(path)
    expected = np.rint(rgb16 / 257.0).astype(np.uint8)  # round(v * 255 / 65535)
    np.testing.assert_array_equal(loaded.pixels, expected)
    assert tuple(loaded.pixels[0, 0]) == (255, 128, 1)
    # Pillow alone keeps only the high byte, which differs wherever the low byte rounds up
    assert not np.array_equal(np.asarray(Image.open(path).convert("RGB")), expected)


def test_16bit_rgba_png_composites_onto_white(tmp_path):
    rgba16 = np.zeros((64, 64, 4), np.uint16)
    rgba16[..., 0] = 65535  # red
    rgba16[..., 3] = 32768  # about half opaque
    path = tmp_path / "deep_alpha.png"
    assert cv2.imwrite(str(path), rgba16[..., [2, 1, 0, 3]])
    loaded = load_image(path)
    a = 32768 / 65535
    expected_gb = round((65535 * (1 - a)) / 257)
    assert tuple(loaded.pixels[5, 5]) == (255, expected_gb, expected_gb)


def test_cmyk_jpeg_is_rgb(tmp_path):
    path = tmp_path / "cmyk.jpg"
    Image.open(HOPPER).convert("CMYK").save(path, quality=95)
    loaded = load_image(path)
    assert loaded.original_mode == "CMYK" and loaded.pixels.shape[2] == 3
    assert any("CMYK" in note for note in loaded.notes)


def test_exif_orientation_of_a_webp(tmp_path):
    pixels = np.asarray(Image.open(HOPPER).convert("RGB"))
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "rot.webp"
    Image.fromarray(pixels).save(path, format="WEBP", lossless=True, exif=exif.tobytes())
    loaded = load_image(path)
    np.testing.assert_array_equal(loaded.pixels, np.rot90(pixels, -1))


def test_a_garbage_file_is_an_error_naming_it(tmp_path):
    path = tmp_path / "candidate_07.png"
    path.write_bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(SourceError) as info:
        load_image(path)
    assert "candidate_07.png" in str(info.value) and "not an image" in str(info.value)


def test_a_missing_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(SourceError, match="not found") as info:
        load_image(Path(tmp_path) / "gone.webp")
    assert "gone.webp" in str(info.value)
