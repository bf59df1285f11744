"""Limb masks: polygons, COCO RLE, mask files, growth and soft edges.

Known answers come from outside ``masks.py``: the shoelace formula, matplotlib's point-in-polygon
test on pixel centres, an RLE worked out by hand, and pixel distances computed with numpy.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from matplotlib.path import Path as MplPath
from PIL import Image
from pydantic import ValidationError

from counterfactory.assets import PHOTOS_DIR
from counterfactory.generation.masks import (
    MaskError,
    MaskOptions,
    apply_mask_options,
    dilate,
    feather,
    load_mask_file,
    mask_from_record,
    polygon_mask,
    rle_decode,
    rle_encode,
)
from counterfactory.generation.sources import SourceRecord, load_image
from tests.generation import badinputs


def _shoelace(points) -> float:
    x, y = np.asarray(points, dtype=np.float64).T
    return 0.5 * abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))


def _perimeter(points) -> float:
    p = np.asarray(points, dtype=np.float64)
    return float(np.linalg.norm(p - np.roll(p, -1, axis=0), axis=1).sum())


def _star(cx, cy, r_out, r_in, n=7, phase=0.123):
    angles = phase + np.arange(2 * n) * np.pi / n
    radii = np.where(np.arange(2 * n) % 2 == 0, r_out, r_in)
    return np.stack([cx + radii * np.cos(angles), cy + radii * np.sin(angles)], axis=1).tolist()


# --------------------------------------------------------------------------- polygons


def test_integer_rectangle_covers_exactly_its_area():
    rect = [(10, 10), (50, 10), (50, 30), (10, 30)]
    mask = polygon_mask([rect], (64, 64))
    assert mask.dtype == np.uint8 and set(np.unique(mask)) == {0, 255}
    assert int((mask > 0).sum()) == _shoelace(rect) == 800
    assert mask[10, 10] and mask[29, 49] and not mask[30, 49] and not mask[29, 50]


@pytest.mark.parametrize(
    "polygon",
    [
        [(3.3, 4.7), (120.2, 10.1), (60.6, 90.9)],
        _star(64.2, 60.7, 55.3, 22.1),
        [(5.5, 5.1), (110.3, 7.7), (115.9, 100.2), (70.4, 40.6), (8.2, 95.3)],  # concave
    ],
)
def test_polygon_area_matches_shoelace_and_a_second_rasteriser(polygon):
    mask = polygon_mask([polygon], (128, 128)) > 0
    area = _shoelace(polygon)
    # Centre sampling errs only along the boundary: at most about one pixel per unit of length.
    assert abs(int(mask.sum()) - area) <= 0.5 * _perimeter(polygon)
    assert abs(int(mask.sum()) - area) / area < 0.02
    # matplotlib's even-odd point-in-polygon on pixel centres (col + 0.5, row + 0.5)
    rows, cols = np.mgrid[0:128, 0:128]
    centres = np.stack([cols.ravel() + 0.5, rows.ravel() + 0.5], axis=1)
    expected = MplPath(np.asarray(polygon)).contains_points(centres).reshape(128, 128)
    np.testing.assert_array_equal(mask, expected)


def test_polygons_are_unioned_and_clipped_to_the_image():
    a = [(0, 0), (40, 0), (40, 40), (0, 40)]
    b = [(20, 20), (80, 20), (80, 80), (20, 80)]  # overlaps a, runs past a 64 x 64 image
    both = polygon_mask([a, b], (64, 64))
    np.testing.assert_array_equal(both, np.maximum(polygon_mask([a], (64, 64)), polygon_mask([b], (64, 64))))
    assert int((both > 0).sum()) == 40 * 40 + 44 * 44 - 20 * 20


def test_polygon_outside_the_image_is_empty():
    assert not polygon_mask([[(-30, -30), (-5, -30), (-5, -5)]], (32, 32)).any()


def test_bad_polygons_raise():
    with pytest.raises(MaskError, match="at least 3"):
        polygon_mask([[(0, 0), (1, 1)]], (8, 8))
    with pytest.raises(MaskError, match="finite"):
        polygon_mask([[(0, 0), (1, np.nan), (2, 2)]], (8, 8))


# --------------------------------------------------------------------------- RLE


def test_hand_computed_rle():
    mask = np.array(
        [
            [0, 1, 0, 0],
            [0, 1, 1, 0],
            [0, 0, 1, 0],
        ],
        np.uint8,
    )
    # column-major: col0 0,0,0 | col1 1,1,0 | col2 0,1,1 | col3 0,0,0 -> runs 3,2,2,2,3
    assert rle_encode(mask) == {"size": [3, 4], "counts": [3, 2, 2, 2, 3]}
    np.testing.assert_array_equal(rle_decode({"size": [3, 4], "counts": [3, 2, 2, 2, 3]}), mask * 255)


def test_rle_starting_inside_begins_with_a_zero_run():
    mask = np.array([[1, 0], [1, 1]], np.uint8)  # column-major 1,1,0,1
    assert rle_encode(mask)["counts"] == [0, 2, 1, 1]
    assert rle_encode(np.zeros((2, 3)))["counts"] == [6]
    assert rle_encode(np.ones((2, 3)))["counts"] == [0, 6]


def test_rle_round_trip_on_random_and_real_masks():
    rng = np.random.default_rng(0)
    for shape in [(1, 1), (7, 13), (64, 48)]:
        mask = np.where(rng.random(shape) > 0.6, 255, 0).astype(np.uint8)
        np.testing.assert_array_equal(rle_decode(rle_encode(mask)), mask)
    arm = polygon_mask([_star(200.5, 300.5, 120, 40)], (512, 512))
    encoded = rle_encode(arm)
    assert sum(encoded["counts"]) == 512 * 512
    np.testing.assert_array_equal(rle_decode(encoded), arm)


@pytest.mark.parametrize(
    ("rle", "message"),
    [
        ({"size": [2, 2], "counts": [1, 2]}, "sum to 3"),
        ({"size": [2, 2], "counts": "PPYo0"}, "compressed"),
        ({"size": [2, 2], "counts": [5, -1]}, "non-negative"),
        ({"counts": [4]}, "size"),
    ],
)
def test_bad_rle_raises(rle, message):
    with pytest.raises(MaskError, match=message):
        rle_decode(rle)


# --------------------------------------------------------------------------- mask files


def test_mask_file_threshold_is_above_127(tmp_path):
    grey = np.zeros((64, 80), np.uint8)
    grey[:, 20:] = 127
    grey[:, 40:] = 128
    grey[:, 60:] = 255
    path = tmp_path / "mask.png"
    Image.fromarray(grey).save(path)
    mask = load_mask_file(path, (64, 80))
    np.testing.assert_array_equal(mask, np.where(grey > 127, 255, 0))


def test_colour_and_16bit_mask_files(tmp_path):
    inside = np.zeros((64, 64), bool)
    inside[10:30, 5:50] = True
    rgb = np.where(inside[..., None], np.uint8(255), np.uint8(0)).repeat(3, axis=2)
    Image.fromarray(rgb).save(tmp_path / "rgb.png")
    Image.fromarray(np.where(inside, 65535, 0).astype(np.uint16)).save(tmp_path / "sixteen.png")
    for name in ("rgb.png", "sixteen.png"):
        np.testing.assert_array_equal(load_mask_file(tmp_path / name, (64, 64)) > 0, inside)


def test_mask_file_size_mismatch_names_the_file_and_both_sizes(tmp_path):
    path = tmp_path / "arm.png"
    Image.new("L", (100, 50)).save(path)
    with pytest.raises(MaskError) as info:
        load_mask_file(path, (600, 512))
    message = str(info.value)
    assert str(path) in message
    assert "100x50" in message and "512x600" in message


def test_missing_and_unreadable_mask_files(tmp_path):
    with pytest.raises(MaskError, match="not found"):
        load_mask_file(tmp_path / "none.png", (8, 8))
    (tmp_path / "text.png").write_text("not a png")
    with pytest.raises(MaskError, match="cannot read"):
        load_mask_file(tmp_path / "text.png", (8, 8))


def test_mask_from_record_dispatches_on_each_kind(tmp_path):
    shape = load_image(PHOTOS_DIR / "grace_hopper.jpg").pixels.shape[:2]  # (600, 512)
    polygon = [[100, 400], [300, 400], [300, 550], [100, 550]]
    expected = polygon_mask([polygon], shape)
    Image.fromarray(expected).save(tmp_path / "arm.png")
    common = {"id": "hopper", "path": "grace_hopper.jpg", "licence": "PD"}
    by_polygon = SourceRecord(**common, limb_mask={"polygons": [polygon]})
    by_file = SourceRecord(**common, limb_mask={"file": "arm.png"})
    by_rle = SourceRecord(**common, limb_mask={"rle": rle_encode(expected)})
    for record in (by_polygon, by_file, by_rle):
        np.testing.assert_array_equal(mask_from_record(record, tmp_path, shape), expected)
    assert int((expected > 0).sum()) == 200 * 150
    assert mask_from_record(SourceRecord(**common), tmp_path, shape) is None
    with pytest.raises(MaskError, match="512x600"):
        mask_from_record(by_rle, tmp_path, (512, 512))


def test_an_oversized_rle_or_mask_file_is_refused_before_decoding(tmp_path):
    common = {"id": "hopper", "path": "grace_hopper.jpg", "licence": "PD"}
    record = SourceRecord(**common, limb_mask={"rle": {"size": [50_000, 50_000], "counts": [2_500_000_000]}})
    # reproduction: the RLE was decoded (2.5 GB, then MemoryError) before its size was compared
    tracemalloc.start()
    try:
        with pytest.raises(MaskError, match="50000x50000") as info:
            mask_from_record(record, tmp_path, (600, 512))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20 and "512x600" in str(info.value)
    # a mask file is compared from its header too (a 10000 x 10000 PNG header, no pixel data)
    huge = badinputs.write_huge_png(tmp_path, "arm.png", side=10_000, header_only=True)
    with pytest.raises(MaskError, match="10000x10000"):
        load_mask_file(huge, (600, 512))


# --------------------------------------------------------------------------- dilate, feather


def _square(size=64, lo=24, hi=40) -> np.ndarray:
    mask = np.zeros((size, size), np.uint8)
    mask[lo:hi, lo:hi] = 255
    return mask


def test_dilate_grows_by_px_and_no_further():
    mask = _square()
    grown = dilate(mask, 3)
    assert grown.dtype == np.uint8 and set(np.unique(grown)) == {0, 255}
    assert (grown[mask > 0] == 255).all()
    rows, cols = np.nonzero(grown)
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (21, 42, 21, 42)
    # every added pixel lies within px (plus the kernel's rounding) of the original square
    inside = np.argwhere(mask > 0)
    for r, c in np.argwhere((grown > 0) & (mask == 0)):
        assert np.min(np.hypot(inside[:, 0] - r, inside[:, 1] - c)) <= 3 * np.sqrt(2)
    np.testing.assert_array_equal(dilate(mask, 0), mask)
    with pytest.raises(MaskError):
        dilate(mask, -1)


def test_feather_stays_inside_and_ramps_to_one():
    mask = _square(64, 12, 52)  # 40 x 40
    alpha = feather(mask, 6)
    assert alpha.dtype == np.float32 and alpha.shape == mask.shape
    assert alpha.min() >= 0 and alpha.max() <= 1
    assert (alpha[mask == 0] == 0).all()
    assert (alpha[18:46, 18:46] == 1).all()  # 6 px or more inside
    row = alpha[32, 12:33]  # edge to centre
    assert (np.diff(row) >= 0).all() and 0 < row[0] < 0.1
    np.testing.assert_array_equal(feather(mask, 0), (mask > 0).astype(np.float32))


def test_feathered_composite_keeps_every_pixel_outside_the_mask():
    source = load_image(PHOTOS_DIR / "astronaut.png").pixels.astype(np.float32)
    edit = 255 - source
    mask = polygon_mask([_star(250.5, 260.5, 150, 60)], source.shape[:2])
    region = apply_mask_options(mask, MaskOptions(dilate_px=4))
    alpha = feather(region, 8)
    out = alpha[..., None] * edit + (1 - alpha[..., None]) * source
    np.testing.assert_array_equal(out[region == 0], source[region == 0])
    assert (region[mask > 0] == 255).all() and region.sum() > mask.sum()
    assert np.abs(out[mask > 0] - source[mask > 0]).mean() > 50  # the inside did change


def test_mask_options_validation():
    assert MaskOptions() == MaskOptions(dilate_px=0)
    # feather_px did nothing in a run (the composite's edge is align.feather_px): refused now
    for bad in ({"dilate_px": -1}, {"feather_px": 4}, {"blur": 2}):
        with pytest.raises(ValidationError):
            MaskOptions(**bad)
