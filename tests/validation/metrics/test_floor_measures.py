"""What a candidate changed beyond the editor's own rendition (issue 34, second round).

- A contrast change about a plain wall's own lightness leaves the whole region's median where
  it was; the thirds by lightness move oppositely (arithmetic known answers).
- A cast judged above a floor output is measured against that output, so a cast opposite to
  the decoder's own colour bias is not hidden by subtracting two unsigned shifts.
"""

from __future__ import annotations

import numpy as np
import pytest

from counterfactory.validation.gates.locality import FLOOR_IMAGE
from counterfactory.validation.metrics.pixels import global_change


def _ramp(shape=(90, 120)) -> np.ndarray:
    """A grey ramp 40..220 along x: its mean and median lightness are both 130."""
    h, w = shape
    row = np.linspace(40, 220, w, dtype=np.float32)
    return np.repeat(np.repeat(row[None, :, None], h, axis=0), 3, axis=2).astype(np.uint8)


def test_a_contrast_change_about_the_regions_mean_is_a_shift_of_its_thirds():
    source = _ramp()
    region = np.full(source.shape[:2], 255, np.uint8)
    g = 0.88
    candidate = np.clip(np.rint((source.astype(np.float32) - 130.0) * g + 130.0), 0, 255).astype(np.uint8)
    whole_median = float(np.median(candidate.astype(np.float32) - source))
    assert abs(whole_median) <= 1.0  # the whole region's median stays put
    shift, gain = global_change(source, candidate, region)
    # the darkest third (40..100, mean 70) moves by (70 - 130) * (g - 1) = +7.2 grey levels
    assert shift == pytest.approx(7.2 / 255, abs=1.5 / 255)
    assert gain == pytest.approx(1 - g, abs=0.02)
    # a plain region (one lightness) has no thirds to tell apart: its shift is its median's
    flat = np.full_like(source, 128)
    assert global_change(flat, flat + 3, region)[0] == pytest.approx(3 / 255)


@pytest.mark.slow
def test_a_cast_is_judged_against_the_floor_output_not_as_a_difference_of_shifts(face_stack, photo):
    """The floor output carries the decoder's own +6 cast in red; the candidate a -6 cast.
    Both differ from the source by 6 levels, so subtracting the two shifts says 0; measured
    against the floor output the candidate moved 12 levels."""
    source = photo("grace_hopper.jpg")

    def cast(image, levels):
        out = image.astype(np.int16)
        out[..., 0] += levels
        return np.clip(out, 0, 255).astype(np.uint8)

    floor_output, candidate = cast(source, 6), cast(source, -6)
    floor_metrics = face_stack.evaluate(source, floor_output).metrics
    floor = {k.split(".", 1)[1]: v for k, v in floor_metrics.items() if k.startswith("locality.")}
    by_measures = face_stack.evaluate(source, candidate, extras={"noise_floor": floor}).metrics
    with_output = face_stack.evaluate(
        source, candidate, extras={"noise_floor": floor, FLOOR_IMAGE: floor_output}
    ).metrics
    assert by_measures["locality.global_shift_above_floor"] == pytest.approx(0.0, abs=1 / 255)
    assert with_output["locality.global_shift_above_floor"] == pytest.approx(12 / 255, abs=1.5 / 255)
    assert by_measures["locality.floor_path"] == with_output["locality.floor_path"] == "request"
