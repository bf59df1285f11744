"""Locality gate: FOCUS's diff_face / diff_nonface / ratio, and limb-mask locality.

Known answers are analytic: a constant change of k grey levels painted on a region gives a
mean absolute difference of exactly k / 255 there and 0 elsewhere.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from counterfactory.validation.faces import face_mask
from counterfactory.validation.gates.locality import locality_gate
from counterfactory.validation.metrics.floor import locality_metrics
from counterfactory.validation.metrics.pixels import RATIO_FLOOR
from counterfactory.validation.thresholds import calibrated_gates
from tests.validation.pairs import make_pair


def _pair(source, candidate, *, fmask, edit_mask=None, kind="face", mode="oval"):
    return make_pair(source, candidate, fmask=fmask, edit_mask=edit_mask, kind=kind, mode=mode)


@pytest.fixture(scope="module")
def grace_and_mask(photo, landmarker):
    # keep pixel values in [20, 235] so that +/-20 never clips: the answer stays analytic
    source = np.clip(photo("grace_hopper.jpg"), 20, 235).astype(np.uint8)
    faces = landmarker.detect(source)
    assert len(faces) == 1
    return source, face_mask(faces[0].landmarks, source.shape[:2], mode="oval")


def test_identical_images_pass_with_zero_difference(grace_and_mask):
    source, fmask = grace_and_mask
    result = locality_gate(
        _pair(source, source.copy(), fmask=fmask), max_diff_nonface=0.063, min_diff_face=0.02, min_ratio=4.1
    )
    assert result.passed
    assert result.metrics["diff_face"] == 0.0 and result.metrics["diff_nonface"] == 0.0
    assert result.review == ("locality_face_unchanged",)  # a copy: people decide


def test_change_painted_inside_face_mask_gives_analytic_values(grace_and_mask):
    source, fmask = grace_and_mask
    inside = fmask > 0
    candidate = source.astype(np.int16)
    candidate[inside] += 20
    candidate = candidate.astype(np.uint8)
    m = locality_metrics(source, candidate, fmask)
    assert m["diff_face"] == pytest.approx(20 / 255, abs=1e-12)
    assert m["diff_nonface"] == 0.0
    assert m["ratio"] == pytest.approx((20 / 255) / RATIO_FLOOR, rel=1e-12)
    assert m["face_area_frac"] == pytest.approx(inside.mean(), abs=1e-12)
    result = locality_gate(
        _pair(source, candidate, fmask=fmask), max_diff_nonface=0.063, min_diff_face=0.02, min_ratio=4.1
    )
    assert result.passed and not result.review


def test_change_inside_and_outside_gives_analytic_ratio(grace_and_mask):
    source, fmask = grace_and_mask
    inside = fmask > 0
    candidate = source.astype(np.int16)
    candidate[inside] += 20  # 20 grey levels inside the face
    candidate[~inside] -= 4  # 4 grey levels outside
    candidate[..., 1][inside] -= 40  # green: -20 net inside: |.| still 20
    candidate = candidate.astype(np.uint8)
    m = locality_metrics(source, candidate, fmask)
    assert m["diff_face"] == pytest.approx(20 / 255, abs=1e-12)
    assert m["diff_nonface"] == pytest.approx(4 / 255, abs=1e-12)
    assert m["ratio"] == pytest.approx(5.0, rel=1e-9)


def test_channel_average_follows_focus_definition():
    # one channel changed by 30: the channel mean is 10 grey levels
    source = np.full((10, 10, 3), 100, np.uint8)
    candidate = source.copy()
    candidate[..., 0] = 130
    mask = np.zeros((10, 10), np.uint8)
    mask[:5] = 255
    m = locality_metrics(source, candidate, mask)
    assert m["diff_face"] == pytest.approx(10 / 255)
    assert m["diff_nonface"] == pytest.approx(10 / 255)
    assert m["ratio"] == pytest.approx(1.0)


def test_global_change_is_rejected_as_not_local(grace_and_mask):
    source, fmask = grace_and_mask
    candidate = (source.astype(np.int16) + 20).astype(np.uint8)  # the whole image, uniformly
    result = locality_gate(
        _pair(source, candidate, fmask=fmask), max_diff_nonface=0.063, min_diff_face=0.02, min_ratio=4.1
    )
    assert not result.passed
    assert "locality_ratio_below_min" in result.reasons
    assert result.metrics["ratio"] == pytest.approx(1.0)


def test_nonface_change_above_max_is_rejected(grace_and_mask):
    source, fmask = grace_and_mask
    candidate = source.astype(np.int16)
    candidate[fmask > 0] += 20
    candidate[fmask == 0] -= 20
    result = locality_gate(
        _pair(source, candidate.astype(np.uint8), fmask=fmask), max_diff_nonface=0.063, min_ratio=4.1
    )
    assert "locality_nonface_diff_above_max" in result.reasons


def test_mask_mode_is_recorded_and_skin_is_inside_oval(grace_and_mask, landmarker):
    source, oval = grace_and_mask
    skin = face_mask(landmarker.detect(source)[0].landmarks, source.shape[:2], mode="skin")
    assert np.all(oval[skin > 0] > 0)  # skin mask is a subset of the oval
    assert (skin > 0).sum() < (oval > 0).sum()
    result = locality_gate(_pair(source, source, fmask=skin, mode="skin"), min_diff_face=0.02)
    assert result.metrics["mask_mode"] == "skin"


def test_limb_composite_keeps_outside_exactly(grace_and_mask):
    source, fmask = grace_and_mask
    h, w = source.shape[:2]
    limb = np.zeros((h, w), np.uint8)
    limb[int(0.75 * h) :, : w // 3] = 255  # a hand-drawn region over the lower left
    candidate = source.copy()
    candidate[limb > 0] = 255 - candidate[limb > 0]
    result = locality_gate(
        _pair(source, candidate, fmask=fmask, edit_mask=limb, kind="limb"),
        max_diff_outside_edit=0.0,
        max_diff_face_drift=0.02,
    )
    assert result.passed
    assert result.metrics["diff_outside_edit"] == 0.0
    assert result.metrics["diff_face_drift"] == 0.0
    assert result.metrics["diff_inside_edit"] > 0.2
    # one pixel changed outside the mask breaks "every pixel kept"
    candidate[0, -1] = 255 - candidate[0, -1]
    result = locality_gate(
        _pair(source, candidate, fmask=fmask, edit_mask=limb, kind="limb"), max_diff_outside_edit=0.0
    )
    assert result.reasons == ("locality_outside_edit_diff_above_max",)


def test_limb_face_drift_is_measured_outside_the_limb_mask(grace_and_mask):
    source, fmask = grace_and_mask
    limb = np.zeros(source.shape[:2], np.uint8)
    limb[-40:, :40] = 1  # a {0, 1} mask is accepted too
    candidate = source.astype(np.int16)
    candidate[(fmask > 0) & (limb == 0)] += 20
    result = locality_gate(
        _pair(source, candidate.astype(np.uint8), fmask=fmask, edit_mask=limb, kind="limb"),
        max_diff_face_drift=0.02,
    )
    assert result.metrics["diff_face_drift"] == pytest.approx(20 / 255)
    assert result.reasons == ("locality_face_drift_above_max",)


@pytest.mark.parametrize(
    "edit_mask, reason",
    [(None, "locality_no_edit_mask"), (np.zeros((5, 5), np.uint8), "locality_edit_mask_shape_mismatch")],
)
def test_limb_without_a_usable_mask_is_rejected(grace_and_mask, edit_mask, reason):
    source, fmask = grace_and_mask
    result = locality_gate(
        _pair(source, source, fmask=fmask, edit_mask=edit_mask, kind="limb"), max_diff_outside_edit=0.0
    )
    assert result.reasons == (reason,)


def test_no_face_mask_or_empty_masks_give_reasons_not_nan(grace_and_mask):
    source, _ = grace_and_mask
    result = locality_gate(_pair(source, source, fmask=None), max_diff_nonface=0.063, min_ratio=4.1)
    assert result.reasons == ("locality_no_face_mask",)
    empty = np.zeros(source.shape[:2], np.uint8)
    result = locality_gate(_pair(source, source, fmask=empty), max_diff_nonface=0.063, min_ratio=4.1)
    assert result.reasons == ("locality_no_face_mask",)
    assert result.metrics["diff_face"] is None and result.metrics["ratio"] is None
    full = np.full(source.shape[:2], 255, np.uint8)
    result = locality_gate(_pair(source, source, fmask=full), max_diff_nonface=0.063)
    assert result.metrics["diff_nonface"] is None and "locality_no_face_mask" in result.reasons


def test_a_limb_candidate_identical_to_its_source_is_not_an_edit(grace_and_mask):
    source, fmask = grace_and_mask
    h, w = source.shape[:2]
    limb = np.zeros((h, w), np.uint8)
    limb[int(0.75 * h) :, : w // 3] = 255
    calibrated = calibrated_gates("limb")["locality"]
    thresholds = {k: calibrated[k] for k in ("max_diff_outside_edit", "max_diff_face_drift")}
    # reproduction: with the outside/drift thresholds alone, the source itself passes as an edit
    assert locality_gate(_pair(source, source, fmask=fmask, edit_mask=limb, kind="limb"), **thresholds).passed
    thresholds["min_diff_inside_edit"] = calibrated["min_diff_inside_edit"]
    result = locality_gate(_pair(source, source, fmask=fmask, edit_mask=limb, kind="limb"), **thresholds)
    assert result.reasons == ("locality_limb_unchanged",) and result.metrics["diff_inside_edit"] == 0.0
    # a JPEG re-encode of the source (a no-op a remote editor can return) is still a copy ...
    ok, buffer = cv2.imencode(".jpg", source[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 90])
    reencoded = cv2.imdecode(buffer, cv2.IMREAD_COLOR)[:, :, ::-1]
    composite = source.copy()
    composite[limb > 0] = reencoded[limb > 0]
    result = locality_gate(_pair(source, composite, fmask=fmask, edit_mask=limb, kind="limb"), **thresholds)
    assert result.reasons == ("locality_limb_unchanged",)
    # ... while painting the region a flat skin-like colour (what removal looks like) is an edit
    painted = source.copy()
    painted[limb > 0] = (196, 160, 140)
    result = locality_gate(_pair(source, painted, fmask=fmask, edit_mask=limb, kind="limb"), **thresholds)
    assert result.passed, result.metrics


def _pair_asking(source, candidate, *, fmask, edit_mask, condition):
    pair = _pair(source, candidate, fmask=fmask, edit_mask=edit_mask, kind="limb")
    pair.extras["condition"] = condition
    return pair


def test_a_same_cue_control_barely_changed_inside_the_mask_is_not_rejected_as_unchanged(grace_and_mask):
    # InclusiveCFImageBias's control (cue=kept) is the limb region re-synthesised with its cue
    # kept: its interior barely changing is what a control is
    source, fmask = grace_and_mask
    h, w = source.shape[:2]
    limb = np.zeros((h, w), np.uint8)
    limb[int(0.75 * h) :, : w // 3] = 255
    thresholds = {
        k: calibrated_gates("limb")["locality"][k]
        for k in ("max_diff_outside_edit", "max_diff_face_drift", "min_diff_inside_edit")
    }
    # a faithful re-rendering of the region: a faint grain, composited inside the mask only
    rng = np.random.default_rng(0)
    rendered = np.clip(source.astype(int) + rng.integers(-4, 5, size=source.shape), 0, 255).astype(np.uint8)
    control = source.copy()
    control[limb > 0] = rendered[limb > 0]
    assert locality_metrics(source, control, fmask, limb)["diff_inside_edit"] < thresholds["min_diff_inside_edit"]
    result = locality_gate(
        _pair_asking(source, control, fmask=fmask, edit_mask=limb, condition={"cue": "kept"}), **thresholds
    )
    # below the no-op ceiling a faithful re-synthesis and a copy look alike: a person decides
    assert result.passed and result.review == ("locality_limb_unchanged",), result.reasons
    # the same image asked as a treatment, or a treatment that copies its source, is no edit
    for candidate in (control, source):
        result = locality_gate(
            _pair_asking(source, candidate, fmask=fmask, edit_mask=limb, condition={"cue": "removed"}), **thresholds
        )
        assert result.reasons == ("locality_limb_unchanged",)
    # a spec that names no controls judges every cue as a treatment
    result = locality_gate(
        _pair_asking(source, control, fmask=fmask, edit_mask=limb, condition={"cue": "kept"}),
        **thresholds,
        control_conditions=[],
    )
    assert result.reasons == ("locality_limb_unchanged",)
    # a control that changes the region more passes unremarked, as a treatment does
    painted = source.copy()
    painted[limb > 0] = (196, 160, 140)
    result = locality_gate(
        _pair_asking(source, painted, fmask=fmask, edit_mask=limb, condition={"cue": "kept"}), **thresholds
    )
    assert result.passed and not result.review


def _textured_renders(source: np.ndarray, seeds: tuple[int, ...]) -> list[np.ndarray]:
    """Re-renders of ``source`` as a decoder makes them: its own zero-mean grain (+-12 grey
    levels) drawn afresh for every request, and every edge moved by up to a pixel."""
    out = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        moved = np.roll(source, int(rng.integers(-1, 2)), axis=int(rng.integers(0, 2)))
        grain = rng.integers(-12, 13, size=source.shape)
        out.append(np.clip(moved.astype(int) + grain, 0, 255).astype(np.uint8))
    return out


def test_excess_over_the_floor_output_ignores_re_rendering_and_keeps_thin_text():
    from counterfactory.validation.metrics.pixels import band_diff, coherent_share, excess_share

    rng = np.random.default_rng(3)
    # a plain wall with a little structure, as behind the London sitters
    source = np.clip(120 + 10 * np.sin(np.arange(300)[None, :] / 5.0) + rng.normal(0, 4, (300, 300)), 0, 255)
    source = np.repeat(source[..., None], 3, axis=2).astype(np.uint8)
    region = np.full((300, 300), 255, np.uint8)
    floor, again = _textured_renders(source, (1, 2))
    # the same editor re-rendering the same photo a second time: nothing beyond its floor
    assert np.abs(again.astype(int) - source).mean() > 5
    assert excess_share(source, again, floor, region) == 0.0
    # one-pixel text, 50 grey levels darker: its strokes count (less their faint antialiased
    # fringe); the band limit spreads them thinner than its level
    written = again.copy()
    cv2.putText(written, "SALE 2026", (20, 160), cv2.FONT_HERSHEY_SIMPLEX, 1.0, (70, 70, 70), 1, cv2.LINE_AA)
    strokes = np.any(written != again, axis=2)
    share = excess_share(source, written, floor, region)
    assert share == pytest.approx(strokes.mean(), rel=0.5)
    assert coherent_share(band_diff(source, written), region) < 0.75 * share
    # where the floor output did not cover the frame (black), nothing there counts
    cut = floor.copy()
    cut[:, :150] = 0
    assert excess_share(source, written, cut, region) < 0.5 * share


def test_an_edge_registered_a_pixel_apart_is_not_an_excess():
    from counterfactory.validation.metrics.pixels import excess_share

    # a dark suit against a bright wall: a 200-level edge
    source = np.full((300, 300, 3), 230, np.uint8)
    source[:, 150:] = 30
    region = np.full((300, 300), 255, np.uint8)
    floor = source.copy()
    # the candidate's registration lands one pixel off at that edge (at 2 MP, a 0.3 % scale
    # error at the frame's edge), the floor's exactly
    off = source.copy()
    off[:, 149:] = 30
    assert excess_share(source, off, floor, region) == 0.0
    # on a 5-times finer photo, a slip of five pixels, measured on its working grid (every 5th
    # pixel): the sampled pixel lands on the edge's other side, one grid pixel away
    big = cv2.resize(source, (1500, 1500), interpolation=cv2.INTER_NEAREST)
    big_off = big.copy()
    big_off[:, 745:] = 30
    grid = np.s_[::5, ::5]
    assert not np.array_equal(big[grid], big_off[grid])
    assert excess_share(big[grid], big_off[grid], big[grid].copy(), region) == 0.0
    # while a patch of another colour there is
    patched = off.copy()
    patched[100:140, 60:100] = (40, 160, 40)
    assert excess_share(source, patched, floor, region) == pytest.approx(40 * 40 / 300**2, rel=0.3)


def _judged_face_pair(source, candidate, fmask, faces, extras, **thresholds):
    """The locality gate on a face pair whose faces are known, with these ``extras``."""
    return locality_gate(make_pair(source, candidate, fmask=fmask, faces=faces, extras=extras), **thresholds)


def test_excess_share_is_judged_only_with_the_floor_output(grace_and_mask, landmarker):
    from counterfactory.validation.gates.locality import FLOOR_IMAGE

    source, fmask = grace_and_mask
    faces = landmarker.detect(source)
    floor, again = _textured_renders(source, (5, 6))
    h, w = source.shape[:2]
    marked = again.copy()
    cv2.putText(marked, "EXIT", (int(0.03 * w), int(0.95 * h)), cv2.FONT_HERSHEY_SIMPLEX, 1.2, (250, 20, 20), 2)

    def judge(candidate, floor_image):
        extras = {FLOOR_IMAGE: floor_image} if floor_image is not None else {}
        return _judged_face_pair(source, candidate, fmask, faces, extras, max_excess_share=0.001)

    plain = judge(again, floor)
    assert plain.passed and plain.metrics["excess_share"] == 0.0
    written = judge(marked, floor)
    assert written.reasons == ("locality_excess_share_above_max",)
    assert written.metrics["excess_share"] > 0.001
    # without the floor output there is nothing to compare with: not measured, not judged
    alone = judge(marked, None)
    assert "excess_share" not in alone.metrics and alone.passed
    # a floor image of another shape is not this photo's: ignored the same way
    assert "excess_share" not in judge(marked, floor[:-8]).metrics


def _judged_with_floor(source, candidate, fmask, faces, floor, **thresholds):
    """The locality gate on a face pair, with the noise floor's figures when given."""
    return _judged_face_pair(source, candidate, fmask, faces, {"noise_floor": floor} if floor else {}, **thresholds)


def test_a_copy_is_told_from_an_edit_by_its_face_change_above_the_floor(grace_and_mask, landmarker):
    """A decoder that moves the face's tone a little on every request (here 5 grey levels,
    smooth, inside the face: about 0.02 of band-limited face change, more than a small good
    edit of a smooth face shows) makes a copy look edited. Judged against the editor's own copy
    of the photo, the copy is a copy again, and an edit of 10 more levels is an edit."""
    source, fmask = grace_and_mask
    faces = landmarker.detect(source)
    wobble = cv2.GaussianBlur(fmask.astype(np.float32) / 255.0, (0, 0), 6.0)[..., None] * 5.0

    def rendered(extra_levels: float, seed: int) -> np.ndarray:
        (grained,) = _textured_renders(source, (seed,))
        return np.clip(grained + wobble * (1.0 + extra_levels / 5.0), 0, 255).astype(np.uint8)

    def judge(candidate, floor):
        return _judged_with_floor(source, candidate, fmask, faces, floor, min_face_change=0.01)

    floor_image, copy, edit = rendered(0, 7), rendered(0, 8), rendered(10, 9)
    floor = {"face_change": judge(floor_image, None).metrics["face_change"]}
    assert floor["face_change"] > 0.015
    # reproduction: judged as measured, the decoder's own change passes the copy as an edit
    alone = judge(copy, None)
    assert alone.review == () and alone.metrics["face_change"] > 0.01
    # above the floor: a copy
    judged = judge(copy, floor)
    assert judged.review == ("locality_face_unchanged",)
    assert judged.metrics["floor_face_change"] == floor["face_change"]
    assert abs(judged.metrics["face_change_above_floor"]) < 0.003
    # while the edit's 10 levels (0.039) stand above it
    edited = judge(edit, floor)
    assert edited.review == ()
    assert edited.metrics["face_change_above_floor"] == pytest.approx(10 / 255, rel=0.3)


def test_with_a_floor_the_raw_face_difference_does_not_call_a_subtle_edit_a_copy(grace_and_mask, landmarker):
    """FOCUS's raw diff_face under min_diff_face (0.02) sends a face to review as unchanged. A
    subtle good edit (4 grey levels over the face, re-rendered) is under it; with the editor's
    floor its face change above the floor's decides, and it is an edit. Without a floor, the
    raw figure still decides (and still catches a plain copy)."""
    source, fmask = grace_and_mask
    faces = landmarker.detect(source)
    soft = cv2.GaussianBlur(fmask.astype(np.float32) / 255.0, (0, 0), 6.0)[..., None]
    floor_image = np.clip(source + soft * 1.0, 0, 255).astype(np.uint8)
    subtle = np.clip(source + soft * 4.0, 0, 255).astype(np.uint8)

    def judge(candidate, floor):
        return _judged_with_floor(source, candidate, fmask, faces, floor, min_diff_face=0.02, min_face_change=0.0011)

    floor = {"face_change": judge(floor_image, None).metrics["face_change"]}
    alone = judge(subtle, None)
    assert alone.metrics["diff_face"] < 0.02 and alone.review == ("locality_face_unchanged",)
    judged = judge(subtle, floor)
    assert judged.review == (), judged.metrics
    assert judged.metrics["face_change_above_floor"] > 0.005
    # a copy of the floor is still a copy
    assert judge(floor_image.copy(), floor).review == ("locality_face_unchanged",)
