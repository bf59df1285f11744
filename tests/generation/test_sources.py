"""Source loading: metadata files, photo normalisation, and per-photo failures as values.

Expected pixel values come from outside ``load_image``: hand-computed formulas, files written
by OpenCV, PIL's own conversion of the same file, and numpy rotations of the original pixels.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import time
import tracemalloc
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from PIL import Image

from counterfactory.assets import PHOTOS_DIR
from counterfactory.generation.sources import (
    DEFAULT_MAX_PIXELS,
    FailedSource,
    FileMask,
    MetadataError,
    PolygonMask,
    RLEMask,
    Source,
    SourceError,
    SourceRecord,
    iter_sources,
    load_image,
    load_metadata,
    load_sources,
)
from tests.generation import badinputs

HOPPER = PHOTOS_DIR / "grace_hopper.jpg"
ASTRONAUT = PHOTOS_DIR / "astronaut.png"
OBAMA_RGBA = PHOTOS_DIR / "obama_rgba.png"


def _pil_rgb(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


# --------------------------------------------------------------------------- real photos


def test_real_jpeg_loads_as_uint8_rgb_with_file_sha256():
    loaded = load_image(HOPPER)
    assert loaded.pixels.shape == (600, 512, 3)
    assert loaded.pixels.dtype == np.uint8
    assert loaded.sha256 == hashlib.sha256(HOPPER.read_bytes()).hexdigest()
    assert loaded.original_mode == "RGB" and loaded.original_size == (512, 600)
    assert loaded.format == "JPEG"
    assert loaded.notes == ()
    np.testing.assert_array_equal(loaded.pixels, _pil_rgb(HOPPER))


def test_pixels_are_read_only():
    loaded = load_image(ASTRONAUT)
    with pytest.raises(ValueError):
        loaded.pixels[0, 0, 0] = 1


def test_png_with_icc_profile_keeps_stored_values_and_says_so():
    loaded = load_image(ASTRONAUT)
    np.testing.assert_array_equal(loaded.pixels, _pil_rgb(ASTRONAUT))
    assert any("ICC" in note for note in loaded.notes)


def test_opaque_rgba_photo_drops_alpha():
    loaded = load_image(OBAMA_RGBA)
    with Image.open(OBAMA_RGBA) as image:
        rgba = np.asarray(image)
    assert loaded.original_mode == "RGBA"
    np.testing.assert_array_equal(loaded.pixels, rgba[..., :3])
    assert any("opaque" in note for note in loaded.notes)


# --------------------------------------------------------------------------- normalisation


def test_alpha_is_composited_onto_white_with_hand_computed_values(tmp_path):
    # out = rgb * a + 255 * (1 - a), a = alpha / 255, rounded (computed by hand below)
    rgba = np.zeros((64, 64, 4), np.uint8)
    rgba[:32, :32] = (0, 0, 0, 0)  # -> white
    rgba[:32, 32:] = (0, 0, 0, 255)  # -> black
    rgba[32:, :32] = (100, 50, 200, 128)  # 100*128/255 + 127 = 177.2; 50 -> 152.1; 200 -> 227.4
    rgba[32:, 32:] = (
        10,
        20,
        30,
        64,
    )  # 2.51 + 191 = 193.5 -> 194; 5.02 + 191 -> 196; 7.53 + 191 -> 199
    path = tmp_path / "rgba.png"
    Image.fromarray(rgba, "RGBA").save(path)
    loaded = load_image(path)
    assert tuple(loaded.pixels[0, 0]) == (255, 255, 255)
    assert tuple(loaded.pixels[0, 63]) == (0, 0, 0)
    assert tuple(loaded.pixels[63, 0]) == (177, 152, 227)
    assert tuple(loaded.pixels[63, 63]) == (194, 196, 199)
    assert any("composited onto white" in note for note in loaded.notes)


def test_real_photo_with_alpha_gradient_matches_formula(tmp_path):
    rgb = _pil_rgb(ASTRONAUT)
    alpha = np.tile(np.linspace(0, 255, rgb.shape[1]).round().astype(np.uint8), (rgb.shape[0], 1))
    path = tmp_path / "astronaut_fade.png"
    Image.fromarray(np.dstack([rgb, alpha]), "RGBA").save(path)
    a = alpha[..., None] / 255.0
    expected = np.rint(rgb * a + 255 * (1 - a)).astype(np.uint8)
    np.testing.assert_array_equal(load_image(path).pixels, expected)


def test_greyscale_with_alpha(tmp_path):
    la = np.zeros((64, 64, 2), np.uint8)
    la[..., 0], la[..., 1] = 100, 128  # 100 * 128 / 255 + 127 = 177.2
    path = tmp_path / "la.png"
    Image.fromarray(la, "LA").save(path)
    loaded = load_image(path)
    assert loaded.original_mode == "LA"
    assert (loaded.pixels == 177).all()


def test_palette_with_transparent_index_becomes_white(tmp_path):
    image = Image.new("P", (64, 64), 0)
    image.putpalette([0, 0, 0, 255, 0, 0] + [0, 0, 0] * 254)
    image.paste(1, (0, 0, 64, 32))  # top half red, bottom half index 0
    path = tmp_path / "palette.png"
    image.save(path, transparency=0)
    loaded = load_image(path)
    assert loaded.original_mode == "P"
    assert tuple(loaded.pixels[0, 0]) == (255, 0, 0)
    assert tuple(loaded.pixels[63, 0]) == (255, 255, 255)


def test_palette_without_transparency_matches_pil(tmp_path):
    path = tmp_path / "hopper.gif"
    with Image.open(HOPPER) as image:
        image.convert("P", palette=Image.Palette.ADAPTIVE, colors=64).save(path)
    loaded = load_image(path)
    assert loaded.original_mode == "P"
    np.testing.assert_array_equal(loaded.pixels, _pil_rgb(path))
    assert any("palette" in note for note in loaded.notes)


def test_greyscale_is_replicated(tmp_path):
    grey = cv2.cvtColor(cv2.imread(str(HOPPER)), cv2.COLOR_BGR2GRAY)  # written by OpenCV
    path = tmp_path / "grey.png"
    cv2.imwrite(str(path), grey)
    loaded = load_image(path)
    assert loaded.original_mode == "L"
    for c in range(3):
        np.testing.assert_array_equal(loaded.pixels[..., c], grey)


def test_one_bit_becomes_0_and_255(tmp_path):
    bits = (np.indices((64, 64)).sum(axis=0) % 2).astype(bool)
    path = tmp_path / "bits.png"
    Image.fromarray(bits).save(path)
    loaded = load_image(path)
    assert loaded.original_mode == "1"
    np.testing.assert_array_equal(loaded.pixels[..., 1], np.where(bits, 255, 0))


# round(v * 255 / 65535) = round(v / 257), by hand: 128/257 = 0.498 -> 0, 129/257 = 0.502 -> 1
SIXTEEN = np.array([0, 128, 129, 257, 32896, 65535, 65278, 1000], dtype=np.uint16)
EIGHT = np.array([0, 0, 1, 1, 128, 255, 254, 4], dtype=np.uint8)


def _ramp16(dtype=np.uint16) -> np.ndarray:
    return np.tile(SIXTEEN.astype(dtype), (64, 8))  # 64 x 64


def test_16bit_png_written_by_opencv_is_scaled_not_clipped(tmp_path):
    path = tmp_path / "sixteen.png"
    cv2.imwrite(str(path), _ramp16())
    loaded = load_image(path)
    assert loaded.original_mode.startswith("I;16")
    np.testing.assert_array_equal(loaded.pixels[0, :8, 0], EIGHT)
    np.testing.assert_array_equal(loaded.pixels[..., 0], loaded.pixels[..., 2])
    assert any("16-bit" in note for note in loaded.notes)


def test_16bit_big_endian_tiff(tmp_path):
    path = tmp_path / "sixteen_be.tif"
    Image.fromarray(_ramp16(">u2")).save(path)
    loaded = load_image(path)
    assert loaded.original_mode == "I;16B"
    np.testing.assert_array_equal(loaded.pixels[0, :8, 1], EIGHT)


def test_32bit_integer_tiff_in_16bit_range(tmp_path):
    path = tmp_path / "int32.tif"
    Image.fromarray(_ramp16(np.int32)).save(path)
    loaded = load_image(path)
    assert loaded.original_mode == "I"
    np.testing.assert_array_equal(loaded.pixels[0, :8, 0], EIGHT)


def test_32bit_integer_outside_16bit_range_is_refused(tmp_path):
    path = tmp_path / "int32_big.tif"
    Image.fromarray(np.full((64, 64), 70000, np.int32)).save(path)
    with pytest.raises(SourceError, match="outside 0..65535"):
        load_image(path)


def test_cmyk_jpeg_matches_pils_own_conversion(tmp_path):
    path = tmp_path / "cmyk.jpg"
    with Image.open(HOPPER) as image:
        image.convert("CMYK").save(path, quality=95)
    loaded = load_image(path)
    assert loaded.original_mode == "CMYK"
    np.testing.assert_array_equal(loaded.pixels, _pil_rgb(path))
    assert any("CMYK" in note for note in loaded.notes)


def _with_orientation(jpeg: bytes, orientation: int) -> bytes:
    """The same JPEG with an EXIF APP1 segment carrying ``orientation`` (no re-encoding)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    payload = exif.tobytes()  # starts with b"Exif\0\0"
    assert jpeg[:2] == b"\xff\xd8"
    segment = b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload
    return jpeg[:2] + segment + jpeg[2:]


@pytest.mark.parametrize(
    ("orientation", "upright"),
    [
        (3, lambda a: np.rot90(a, 2)),
        (6, lambda a: np.rot90(a, -1)),  # stored rotated: display turns it 90 degrees clockwise
        (8, lambda a: np.rot90(a, 1)),
        (2, lambda a: a[:, ::-1]),
    ],
)
def test_exif_orientation_rotates_a_real_photo(tmp_path, orientation, upright):
    original = load_image(HOPPER).pixels
    path = tmp_path / f"hopper_o{orientation}.jpg"
    path.write_bytes(_with_orientation(HOPPER.read_bytes(), orientation))
    loaded = load_image(path)
    np.testing.assert_array_equal(loaded.pixels, upright(original))
    assert loaded.original_size == (512, 600)
    assert loaded.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() != load_image(HOPPER).sha256
    assert any(f"orientation {orientation}" in note for note in loaded.notes)


# --------------------------------------------------------------------------- bad inputs


def test_missing_file(tmp_path):
    with pytest.raises(SourceError, match="file not found") as info:
        load_image(tmp_path / "nope.jpg")
    assert str(info.value).startswith(f"{tmp_path / 'nope.jpg'}: ")


def test_zero_byte_file(tmp_path):
    path = badinputs.write_zero_byte(tmp_path)
    with pytest.raises(SourceError, match=r"empty file \(0 bytes\)"):
        load_image(path)


def test_text_file_named_jpg(tmp_path):
    path = badinputs.write_text_as_jpg(tmp_path)
    with pytest.raises(SourceError, match="not an image") as info:
        load_image(path)
    # what it looks like, never its bytes (issue 36: the message reaches items.jsonl)
    assert "looks like HTML" in str(info.value) and "DOCTYPE" not in str(info.value)


def test_truncated_jpeg(tmp_path):
    path = badinputs.write_truncated_jpeg(tmp_path)
    with pytest.raises(SourceError, match="truncated or corrupt"):
        load_image(path)


def test_corrupt_png(tmp_path):
    path = badinputs.write_corrupt_png(tmp_path)
    with pytest.raises(SourceError, match="truncated or corrupt"):
        load_image(path)


def test_huge_image_is_refused_from_its_header_quickly(tmp_path):
    path = badinputs.write_huge_png(tmp_path)
    assert path.stat().st_size < 100_000
    start = time.perf_counter()
    with pytest.raises(SourceError, match="10000x10000") as info:
        load_image(path)
    assert time.perf_counter() - start < 1.0
    assert "max_pixels" in str(info.value)


def test_pil_decompression_bomb_becomes_source_error(tmp_path):
    path = badinputs.write_huge_png(tmp_path, "bomb.png", side=20_000, header_only=True)
    with pytest.raises(SourceError, match="too large"):
        load_image(path, max_pixels=10**12, max_side_px=10**6)


def test_a_side_past_32767_px_is_refused_before_native_code(tmp_path):
    path = badinputs.write_long_png(tmp_path)
    # reproduction: within the pixel budget, so only a side limit stops it before MediaPipe,
    # which aborts the whole process on it (rc 134, every re-run the same)
    assert 33_000 * 900 < DEFAULT_MAX_PIXELS
    with pytest.raises(SourceError, match="33000x900") as info:
        load_image(path)
    assert "crop or downscale" in str(info.value)


def test_a_4gb_junk_file_is_refused_without_reading_it(tmp_path):
    path = badinputs.write_sparse_junk(tmp_path)
    # reproduction: the whole file used to be read before its header was checked (4.5 GB RSS)
    tracemalloc.start()
    try:
        with pytest.raises(SourceError, match="4,294,967,296 bytes") as info:
            load_image(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20 and "not a photo of a usable size" in str(info.value)
    # the same junk within the byte budget is read only as far as its header
    small = badinputs.write_sparse_junk(tmp_path, "small.jpg", size=256 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(SourceError, match="not an image PIL can read"):
            load_image(small, max_pixels=64 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_max_pixels_applies_to_real_photos():
    with pytest.raises(SourceError, match="512x600"):
        load_image(HOPPER, max_pixels=512 * 600 - 1)
    assert load_image(HOPPER, max_pixels=512 * 600).pixels.shape == (600, 512, 3)


def test_too_small_image(tmp_path):
    path = badinputs.write_tiny_png(tmp_path)
    with pytest.raises(SourceError, match="at least 64 px"):
        load_image(path)


def test_source_error_pickles_with_its_message(tmp_path):
    error = SourceError(tmp_path / "x.jpg", "empty file")
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) == f"{tmp_path / 'x.jpg'}: empty file"
    assert copy.reason == "empty file"


def test_write_all_writes_every_bad_input(tmp_path):
    paths = badinputs.write_all(tmp_path / "bad")
    assert set(paths) == set(badinputs.BAD_INPUTS)
    for path in paths.values():
        with pytest.raises(SourceError):
            load_image(path)


# --------------------------------------------------------------------------- metadata

ENTRIES = [
    {
        "id": "hopper",
        "path": "grace_hopper.jpg",
        "licence": "public domain (U.S. Navy)",
        "occupation": "engineer",
        "presented_gender": "female",
    },
    {
        "id": "collins",
        "path": "astronaut.png",
        "licence": "public domain (NASA)",
        "occupation": "astronaut",
        "presented_gender": "female",
        "context": "studio",
        "limb_mask": {"polygons": [[[10, 10], [60, 10], [60, 60]]]},
        "extra": {"decade": "1990s"},
    },
    {
        "id": "obama",
        "path": "obama_portrait.jpg",
        "licence": "public domain (White House)",
        "limb_mask": {"rle": {"size": [2, 2], "counts": [1, 2, 1]}},
        "notes": "official portrait",
    },
]


def _write_yaml(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_yaml_list_and_sources_mapping_and_jsonl_and_csv_agree(tmp_path):
    as_list = load_metadata(_write_yaml(tmp_path / "a.yaml", ENTRIES))
    as_map = load_metadata(_write_yaml(tmp_path / "b.yml", {"sources": ENTRIES}))
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("\n".join(json.dumps(e) for e in ENTRIES) + "\n\n", encoding="utf-8")
    csv_path = tmp_path / "d.csv"
    csv_path.write_text(
        "id,path,licence,occupation,presented_gender,context,limb_mask,notes,extra.decade\n"
        "hopper,grace_hopper.jpg,public domain (U.S. Navy),engineer,female,,,,\n"
        "collins,astronaut.png,public domain (NASA),astronaut,female,studio,"
        '"{""polygons"": [[[10, 10], [60, 10], [60, 60]]]}",,1990s\n'
        "obama,obama_portrait.jpg,public domain (White House),,,,"
        '"{""rle"": {""size"": [2, 2], ""counts"": [1, 2, 1]}}",official portrait,\n',
        encoding="utf-8",
    )
    from_csv = load_metadata(csv_path)
    assert as_list == as_map == load_metadata(jsonl) == from_csv
    assert [r.id for r in as_list] == ["hopper", "collins", "obama"]
    assert isinstance(as_list[1].limb_mask, PolygonMask)
    assert isinstance(as_list[2].limb_mask, RLEMask)
    assert as_list[1].extra == {"decade": "1990s"}
    assert as_list[0].context is None


def test_csv_mask_path_shorthand(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("id,path,licence,limb_mask\nx,x.jpg,CC0,masks/x.png\n", encoding="utf-8")
    (record,) = load_metadata(path)
    assert record.limb_mask == FileMask(file="masks/x.png")


def test_missing_licence_names_file_entry_id_field_expected_and_received(tmp_path):
    entries = [dict(ENTRIES[0]), {k: v for k, v in ENTRIES[1].items() if k != "licence"}]
    path = _write_yaml(tmp_path / "meta.yaml", entries)
    with pytest.raises(MetadataError) as info:
        load_metadata(path)
    message = str(info.value)
    assert str(path) in message
    assert "entry 1" in message and "'collins'" in message
    assert "field 'licence'" in message
    assert "expected a value (this field is required), received nothing" in message
    (problem,) = info.value.problems
    assert (problem.index, problem.id, problem.field) == (1, "collins", "licence")
    assert problem.line is not None


def test_wrong_type_is_reported_with_the_value(tmp_path):
    path = _write_yaml(tmp_path / "meta.yaml", [{**ENTRIES[0], "id": 12}])
    with pytest.raises(MetadataError, match=r"field 'id': expected a valid string, received 12"):
        load_metadata(path)


def test_every_bad_entry_is_listed_in_one_message(tmp_path):
    entries = [
        {**ENTRIES[0], "licence": "  "},
        {**ENTRIES[1], "path": "../outside.jpg"},
        {**ENTRIES[2], "limb_mask": {"rle": {"size": [2, 2], "counts": [1, 2]}}},
        {**ENTRIES[0], "id": "fine", "colour": "red"},
    ]
    path = _write_yaml(tmp_path / "meta.yaml", entries)
    with pytest.raises(MetadataError) as info:
        load_metadata(path)
    fields = [(p.index, p.field) for p in info.value.problems]
    assert fields == [(0, "licence"), (1, "path"), (2, "limb_mask.rle"), (3, "colour")]
    message = str(info.value)
    assert "4 problems" in message
    assert "run lengths summing to height x width = 4 (they sum to 3)" in message
    assert "'extra'" in message  # the unknown field's message says where free-form data goes


def test_duplicate_ids_are_an_error(tmp_path):
    path = _write_yaml(tmp_path / "meta.yaml", [ENTRIES[0], ENTRIES[1], {**ENTRIES[2], "id": "hopper"}])
    with pytest.raises(MetadataError) as info:
        load_metadata(path)
    (problem,) = info.value.problems
    assert (problem.index, problem.field, problem.received) == (2, "id", "'hopper'")
    assert "entry 0 has it too" in str(info.value)


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("bad.yaml", "- id: a\n  path: [unclosed\n", "valid YAML"),
        ("scalar.yaml", "just text\n", "a list of sources"),
        ("keys.yaml", "photos: []\n", "with keys ['photos']"),
        ("bad.jsonl", '{"id": "a", "path": "a.jpg", "licence": "x"}\n{"id": \n', "line 2"),
        ("list.jsonl", "[1, 2]\n", "a mapping of field names"),
        ("wide.csv", "id,path,licence\na,a.jpg,x,extra-cell\n", "at most 3 cells"),
        ("meta.txt", "id: a\n", "ending in .yaml"),
    ],
)
def test_broken_files(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(MetadataError, match=expected.replace("[", r"\[").replace("(", r"\(")) as info:
        load_metadata(path)
    assert str(path) in str(info.value)


def test_missing_metadata_file(tmp_path):
    with pytest.raises(MetadataError, match="no such file"):
        load_metadata(tmp_path / "meta.yaml")


def test_record_rejects_unsafe_ids_and_paths():
    for bad in (
        {"id": "a|b"},
        {"id": ""},
        {"path": "/abs.jpg"},
        {"path": "C:\\x.jpg"},
        {"path": "a/../../b.jpg"},
    ):
        with pytest.raises(ValueError):
            SourceRecord(**{"id": "a", "path": "a.jpg", "licence": "CC0", **bad})


# --------------------------------------------------------------------------- load_sources


def _photo_set(tmp_path: Path) -> Path:
    photos = tmp_path / "photos"
    (photos / "masks").mkdir(parents=True)
    for name in ("grace_hopper.jpg", "astronaut.png", "obama_rgba.png"):
        shutil.copy(PHOTOS_DIR / name, photos / name)
    badinputs.write_truncated_jpeg(photos)
    badinputs.write_zero_byte(photos)
    badinputs.write_text_as_jpg(photos)
    Image.new("L", (100, 100), 255).save(photos / "masks" / "wrong_size.png")
    return photos


def test_load_sources_continues_past_bad_files(tmp_path):
    photos = _photo_set(tmp_path)
    entries = [
        {"id": "hopper", "path": "grace_hopper.jpg", "licence": "PD", "presented_gender": "female"},
        {"id": "cut", "path": "truncated.jpg", "licence": "PD"},
        {"id": "rgba", "path": "obama_rgba.png", "licence": "PD"},
        {"id": "empty", "path": "empty.jpg", "licence": "PD"},
        {"id": "html", "path": "not_an_image.jpg", "licence": "PD"},
        {"id": "gone", "path": "missing.jpg", "licence": "PD"},
        {
            "id": "collins",
            "path": "astronaut.png",
            "licence": "PD",
            "limb_mask": {"polygons": [[[100, 300], [200, 300], [200, 400]]]},
        },
        {
            "id": "badmask",
            "path": "astronaut.png",
            "licence": "PD",
            "limb_mask": {"file": "masks/wrong_size.png"},
        },
        {
            "id": "offmask",
            "path": "astronaut.png",
            "licence": "PD",
            "limb_mask": {"polygons": [[[-50, -50], [-10, -50], [-10, -10]]]},
        },
    ]
    meta = _write_yaml(tmp_path / "sources.yaml", entries)
    items = load_sources(photos, meta)
    assert [i.id for i in items] == [e["id"] for e in entries]
    kinds = {i.id: type(i).__name__ for i in items}
    assert kinds == {
        "hopper": "Source",
        "cut": "FailedSource",
        "rgba": "Source",
        "empty": "FailedSource",
        "html": "FailedSource",
        "gone": "FailedSource",
        "collins": "Source",
        "badmask": "FailedSource",
        "offmask": "FailedSource",
    }
    by_id = {i.id: i for i in items}
    assert "truncated" in by_id["cut"].reason
    assert "0 bytes" in by_id["empty"].reason
    assert "not an image" in by_id["html"].reason
    assert "not found" in by_id["gone"].reason
    assert "100x100" in by_id["badmask"].reason and "512x512" in by_id["badmask"].reason
    assert "empty" in by_id["offmask"].reason
    hopper = by_id["hopper"]
    assert isinstance(hopper, Source) and hopper.path == (photos / "grace_hopper.jpg").resolve()
    assert hopper.sha256 == hashlib.sha256(HOPPER.read_bytes()).hexdigest()
    assert hopper.shape == (600, 512) and not hopper.pixels.flags.writeable
    assert isinstance(by_id["gone"], FailedSource) and by_id["gone"].record.id == "gone"


def test_load_sources_notes_repeated_photo_bytes(tmp_path):
    photos = _photo_set(tmp_path)
    meta = _write_yaml(
        tmp_path / "s.yaml",
        [
            {"id": "a", "path": "grace_hopper.jpg", "licence": "PD"},
            {"id": "b", "path": "grace_hopper.jpg", "licence": "PD"},
        ],
    )
    first, second = load_sources(photos, meta)
    assert first.notes == ()
    assert second.notes == ("same file bytes as source 'a'",)


def test_symlinks_are_followed_and_must_stay_inside_the_photos_folder(tmp_path):
    photos = _photo_set(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(HOPPER, outside / "secret.jpg")
    # reproduction: a link to a file outside the folder was accepted, and the release shipped
    # the link itself (an absolute target) instead of the photo's bytes
    (photos / "leak.jpg").symlink_to(outside / "secret.jpg")
    (photos / "alias.jpg").symlink_to(photos / "grace_hopper.jpg")
    (photos / "arm.png").symlink_to(outside / "secret.jpg")
    meta = _write_yaml(
        tmp_path / "s.yaml",
        [
            {"id": "leak", "path": "leak.jpg", "licence": "PD"},
            {"id": "alias", "path": "alias.jpg", "licence": "PD"},
            {"id": "masklink", "path": "grace_hopper.jpg", "licence": "PD", "limb_mask": {"file": "arm.png"}},
        ],
    )
    leak, alias, masklink = load_sources(photos, meta)
    assert isinstance(leak, FailedSource) and "source_outside_folder" in leak.reason
    # the reason reaches the release's stats: it names the metadata's path, not where it leads
    # (issue 36)
    assert "leak.jpg" in leak.reason and "secret.jpg" not in leak.reason
    # a link inside the folder is fine, and the source is its target: a regular file
    assert isinstance(alias, Source) and alias.path == (photos / "grace_hopper.jpg").resolve()
    assert not alias.path.is_symlink()
    assert isinstance(masklink, FailedSource) and "outside the photos folder" in masklink.reason
    assert "secret.jpg" not in masklink.reason


def test_load_sources_raises_for_broken_metadata(tmp_path):
    photos = _photo_set(tmp_path)
    meta = _write_yaml(tmp_path / "s.yaml", [{"id": "a", "path": "grace_hopper.jpg"}])
    with pytest.raises(MetadataError, match="licence"):
        load_sources(photos, meta)


def test_load_sources_needs_the_photos_folder(tmp_path):
    meta = _write_yaml(tmp_path / "s.yaml", [{"id": "a", "path": "grace_hopper.jpg", "licence": "PD"}])
    with pytest.raises(NotADirectoryError, match="photos folder"):
        load_sources(tmp_path / "nowhere", meta)


def test_csv_with_byte_order_mark(tmp_path):
    # A CSV with a BOM (as Excel writes it) parses like one without.
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufeffid,path,licence\na,a.jpg,CC0\n".encode("utf-8"))
    (record,) = load_metadata(path)
    assert record.id == "a"


def test_a_released_source_holds_no_pixels_and_decodes_the_same_ones_when_asked(tmp_path):
    photos = _photo_set(tmp_path)
    meta = _write_yaml(tmp_path / "s.yaml", [{"id": "a", "path": "grace_hopper.jpg", "licence": "PD"}])
    (held,) = load_sources(photos, meta)
    light = held.released()
    assert held.holds_pixels and not light.holds_pixels
    assert light.shape == held.shape == (600, 512)  # known without decoding
    assert np.array_equal(light.pixels, held.pixels) and not light.pixels.flags.writeable
    # a Ray task's arguments carry the pixels, so a node without the photos folder can use it
    carried = pickle.loads(pickle.dumps(light))
    assert carried.holds_pixels and np.array_equal(carried.pixels, held.pixels)
    with pytest.raises(AttributeError, match="read-only"):
        light.sha256 = "0" * 64


def test_a_photo_changed_under_a_released_source_is_refused_not_used(tmp_path):
    photos = _photo_set(tmp_path)
    meta = _write_yaml(tmp_path / "s.yaml", [{"id": "a", "path": "grace_hopper.jpg", "licence": "PD"}])
    (held,) = load_sources(photos, meta)
    light = held.released()
    # another photo of the same size put in its place after the run checked it
    swapped = np.ascontiguousarray(held.pixels[:, ::-1])
    Image.fromarray(swapped).save(photos / "grace_hopper.jpg", quality=95)
    with pytest.raises(SourceError, match="source_changed: the photo changed during the run"):
        _ = light.pixels


def test_iter_sources_refuses_broken_metadata_before_decoding_anything(tmp_path):
    photos = _photo_set(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {id: a, path: grace_hopper.jpg}\n")  # no licence
    with pytest.raises(MetadataError):
        iter_sources(photos, bad)  # raised on the call, not at the first item
