"""The global shift's medians, taken by selection (:func:`global_change_at`), equal
:func:`numpy.median`'s to the digit on real photos: the reference below is the measure as it
was written before (a median of every sampled value per channel, and of each lightness third)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from counterfactory.validation.calibration.base import bundled_photo_paths, load_rgb
from counterfactory.validation.metrics.pixels import (
    MIN_STRATUM_SAMPLES,
    _channel_std,
    away_from_face,
    global_change_at,
    lowpass,
    sample_region,
)


def _reference(sample, candidate):
    src = sample.source
    cand = candidate[sample.rows, sample.cols].astype(np.float32)
    diff = np.ascontiguousarray((cand - src).T)
    shift = float(np.max(np.abs(np.median(diff, axis=1)))) / 255.0
    far = sample.far if sample.far is not None else np.ones(diff.shape[1], bool)
    if np.count_nonzero(far) >= 3 * MIN_STRATUM_SAMPLES:
        far_diff = diff[:, far]
        lightness = (cand[far] + src[far]).sum(axis=1)
        low, high = np.quantile(lightness, [1 / 3, 2 / 3])
        for part in (lightness <= low, (lightness > low) & (lightness <= high), lightness > high):
            if np.count_nonzero(part) >= MIN_STRATUM_SAMPLES:
                shift = max(shift, float(np.max(np.abs(np.median(far_diff[:, part], axis=1)))) / 255.0)
    s_std, c_std = _channel_std(src), _channel_std(cand)
    ok = s_std > 1.0
    return shift, float(np.max(np.abs(c_std[ok] / s_std[ok] - 1.0))) if ok.any() else None


def _variants(image: np.ndarray):
    """Candidates a gate sees: JPEG re-encodes, a cast, a contrast change, one odd pixel out."""
    for quality in (60, 90):
        ok, buf = cv2.imencode(".jpg", image[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, quality])
        yield np.ascontiguousarray(cv2.imdecode(buf, cv2.IMREAD_COLOR)[:, :, ::-1])
    yield np.clip(image.astype(np.int16) + (6, -3, 0), 0, 255).astype(np.uint8)
    yield np.clip((image.astype(np.float32) - 128) * 1.1 + 128, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("path", bundled_photo_paths()[:3], ids=lambda p: p.stem)
def test_the_selected_medians_are_numpys_on_real_photos(path):
    image = load_rgb(path)
    h, w = image.shape[:2]
    face = np.zeros((h, w), np.uint8)
    cv2.ellipse(face, (w // 2, h // 2), (w // 6, h // 4), 0, 0, 360, 255, -1)
    region = away_from_face(face, (h, w), min(h, w) / 3)
    far = away_from_face(face, (h, w), min(h, w) / 2)
    source_low = lowpass(image)
    # odd and even sample counts, with and without the lightness thirds' "far" part
    samples = [sample_region(source_low, region, far), sample_region(source_low, region)]
    covered = np.ones((h, w), bool)
    covered[samples[0].rows[0], samples[0].cols[0]] = False  # one sample fewer: the other parity
    samples.append(samples[0].covered_by(covered))
    assert {s.rows.size % 2 for s in samples} >= {0, 1} and min(s.rows.size for s in samples) > 1000
    for candidate in _variants(image):
        cand_low = lowpass(candidate)
        for sample in samples:
            assert global_change_at(sample, cand_low) == _reference(sample, cand_low)
        # uint8 values as well (whole grey levels: many ties at the middle)
        assert global_change_at(samples[1], candidate) == _reference(samples[1], candidate)
