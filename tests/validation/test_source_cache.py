"""The source analysis a gate stack computes once per source and reuses for every candidate.

A judgement made with a cached analysis must be the judgement made from scratch (the cache
changes the cost, never the verdict or a metric); the cache must be keyed by the pixels, so
another source is never judged against a stale analysis; the working-grid measures must keep
their known answers on photo-sized images, where the grid is coarser than the pixels.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from counterfactory.validation.gate_stack import GateStack, SourceCache, pixel_key
from counterfactory.validation.metrics.body_skin import body_skin_drift
from counterfactory.validation.metrics.pixels import LOCAL_CHANGE_LEVEL, changed_share, to_lab
from counterfactory.validation.segment import work_stride


def _lighter_face(source: np.ndarray, landmarker) -> np.ndarray:
    """A face-only edit: the face oval lightened by 30 grey levels."""
    from counterfactory.validation.faces import face_mask

    face = landmarker.detect(source)[0]
    out = source.copy()
    inside = face_mask(face.landmarks, source.shape[:2]) > 0
    out[inside] = np.clip(out[inside].astype(np.int16) + 30, 0, 255).astype(np.uint8)
    return out


def _same(a: dict, b: dict) -> None:
    """The same verdict, reasons and every metric, exactly (the same arithmetic runs)."""
    assert a["verdict"] == b["verdict"] and a["reasons"] == b["reasons"]
    assert a["gates"].keys() == b["gates"].keys()
    for gate, result in a["gates"].items():
        assert result["metrics"] == b["gates"][gate]["metrics"], gate


@pytest.mark.slow
def test_a_cached_analysis_gives_the_judgement_made_from_scratch(face_stack, photo, landmarker):
    source = photo("obama_portrait.jpg")
    candidates = [_lighter_face(source, landmarker), source.copy(), np.ascontiguousarray(source[:, ::-1])]
    stack = GateStack(face_stack.gates, kind="face", landmarker=face_stack.landmarker, sources=SourceCache(2))
    cached = [stack.evaluate(source, c).to_dict() for c in candidates]
    assert (stack.sources.misses, stack.sources.hits) == (1, 2)  # one analysis served three candidates
    for candidate, judged in zip(candidates, cached):
        scratch = stack.evaluate(source, candidate, analysis=stack.analyse_source(source)).to_dict()
        _same(judged, scratch)
    # the body-skin measure and the skin-tone gate read the one shared segmentation
    assert cached[0]["gates"]["locality"]["metrics"]["body_skin_delta_e"] is not None
    assert cached[0]["gates"]["skin"]["metrics"]["body_ita_deg"] is not None


@pytest.mark.slow
def test_the_cache_is_keyed_by_the_pixels(face_stack, photo, landmarker):
    a, b = photo("obama_portrait.jpg"), photo("biden_portrait.jpg")
    stack = GateStack(face_stack.gates, kind="face", landmarker=face_stack.landmarker, sources=SourceCache(1))
    stack.evaluate(a, a.copy())
    edited = a.copy()
    edited[0, 0] ^= 1  # one bit of one pixel: another source
    assert pixel_key(edited) != pixel_key(a) and pixel_key(a.copy()) == pixel_key(a)
    stack.evaluate(edited, edited.copy())
    assert stack.sources.misses == 2
    judged = stack.evaluate(b, b.copy())  # a one-entry cache holding another photo: no confusion
    assert stack.sources.misses == 3 and len(stack.sources) == 1
    assert judged.metrics["face.position_change"] == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="analysis"):
        stack.context(a, a.copy(), analysis=stack.analyse_source(b))


@pytest.mark.slow
def test_a_smaller_stack_shares_the_cache_and_the_full_stack_completes_it(face_stack, photo, landmarker):
    """flows judges an unregistrable output with ``stack.without("locality", "skin")`` first:
    the full stack must still measure body skin for the next candidate of that source."""
    source = photo("obama_portrait.jpg")
    candidate = _lighter_face(source, landmarker)
    stack = GateStack(face_stack.gates, kind="face", landmarker=face_stack.landmarker, sources=SourceCache(2))
    small = stack.without("locality", "skin")
    assert small.sources is stack.sources
    small.evaluate(source, candidate, source_key="photo-sha")
    assert stack.sources.get("photo-sha").person is None  # the small stack needs no segmentation
    full = stack.evaluate(source, candidate, source_key="photo-sha").to_dict()
    _same(full, stack.evaluate(source, candidate, analysis=stack.analyse_source(source)).to_dict())
    assert stack.sources.get("photo-sha").person is not None


def test_source_cache_keeps_the_most_recent():
    from counterfactory.validation.gates.base import SourceAnalysis

    cache = SourceCache(2)
    for key in "abc":
        cache.put(SourceAnalysis(key, (4, 4, 3), (), None, "oval"))
    assert cache.get("a") is None and cache.get("b") is not None and cache.get("c") is not None
    cache.put(SourceAnalysis("d", (4, 4, 3), (), None, "oval"))  # "b" was used before "c"
    assert cache.get("b") is None and cache.get("c") is not None
    with pytest.raises(ValueError, match="max_items"):
        SourceCache(-1)


def test_pasted_square_on_a_coarse_working_grid_keeps_its_area():
    """On a 1600 x 1600 image the measure reads every 4th pixel; areas are kept."""
    rng = np.random.default_rng(1)
    source = rng.integers(60, 150, size=(1600, 1600, 3), dtype=np.uint8)
    assert work_stride(source.shape) == 4
    candidate = source.copy()
    a = 240
    candidate[400 : 400 + a, 800 : 800 + a] += np.uint8(round(2 * LOCAL_CHANGE_LEVEL * 255))
    region = np.full(source.shape[:2], 255, np.uint8)
    assert changed_share(source, candidate, region) == pytest.approx(a * a / region.size, rel=0.04)
    noisy = np.clip(source.astype(np.int16) + rng.integers(-12, 13, size=source.shape), 0, 255).astype(np.uint8)
    assert changed_share(source, noisy, region) == 0.0  # noise has no area after smoothing


def test_body_skin_lightness_shift_on_a_coarse_working_grid():
    h, w = 1500, 1500  # stride 3
    skin_rgb = np.array([200, 150, 120], np.uint8)
    source = np.full((h, w, 3), 40, np.uint8)
    fmask = np.zeros((h, w), np.uint8)
    cv2.circle(fmask, (750, 400), 200, 255, -1)
    source[fmask > 0] = skin_rgb
    source[900:1300, 500:1000] = skin_rgb
    person = np.zeros((h, w), np.uint8)
    person[150:1400, 400:1100] = 255
    lab = to_lab(source)
    lab[900:1300, 500:1000, 0] += 10.0
    rgb = cv2.cvtColor(lab, cv2.COLOR_Lab2RGB)
    candidate = np.clip(np.rint(rgb * 255), 0, 255).astype(np.uint8)
    delta_e, frac = body_skin_drift(source, candidate, fmask, person, face_size_px=400.0)
    assert frac == pytest.approx(400 * 500 / (h * w), rel=0.01)
    assert delta_e == pytest.approx(10.0, abs=0.5)
    covered = np.zeros((h, w), bool)
    covered[:, :750] = True  # half the body skin is the editor's: still measured there
    delta_half, frac_half = body_skin_drift(source, candidate, fmask, person, face_size_px=400.0, covered=covered)
    assert frac_half == pytest.approx(frac / 2, rel=0.02) and delta_half == pytest.approx(10.0, abs=0.5)
