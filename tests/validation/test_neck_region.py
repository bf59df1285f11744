"""The region a face prompt names, as a person sees it: the neck runs down to the clothing line.

Issue 34: a tone change over the whole visible neck (what an open collar or a V-neck shows) is
inside the region FOCUS's prompt names (face, neck, ears, facial hair); the same change that
also reaches the chest or shoulders is skin changed outside it. The edits here are drawn by the
test itself, from its own skin mask and the face mesh's chin (not from the region code), on
London Set photos of people in a V-neck (140) and a scoop neck that shows the collarbones (113),
and the hair above the eyes recoloured (outside the region, judged by the hair measure),
then re-rendered through TAEF2 and jittered as an editor returns them, and judged as a run
judges them: registered, against the photo's own floor output ("return this photo unchanged",
re-rendered and jittered with another seed).
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from counterfactory.generation.align import align_candidate
from counterfactory.generation.rerender import rerender_like
from counterfactory.validation.calibration.base import load_rgb
from counterfactory.validation.calibration.corpus_edits import editor_jitter
from counterfactory.validation.faces import CHIN, FOREHEAD_TOP, get_face_landmarker, region_mask
from counterfactory.validation.gate_stack import GatesConfig, GateStack
from counterfactory.validation.gates.locality import FLOOR_IMAGE, FLOOR_RELATIVE
from counterfactory.validation.metrics.pixels import to_lab
from counterfactory.validation.segment import get_person_segmenter, work_stride
from tests.conftest import REPO

LONDON = REPO.parent / "shared" / "photos" / "london" / "neutral"

pytestmark = pytest.mark.slow


def _photo(name: str) -> np.ndarray:
    if not LONDON.is_dir():
        pytest.skip(f"{LONDON} is not on this machine")
    image = load_rgb(LONDON / f"{name}.jpg")
    return cv2.resize(image, (512, 512), interpolation=cv2.INTER_AREA)


def _skin(image: np.ndarray, face) -> np.ndarray:
    """The test's own skin mask: person pixels within 14 a*b* and 35 L* of the face's median."""
    k = work_stride(image.shape)
    person = get_person_segmenter().segment(np.ascontiguousarray(image[::k, ::k]))
    person = cv2.resize(person.astype(np.float32), image.shape[1::-1]) >= 0.5
    lab = to_lab(image)
    lm = face.landmarks[:, :2]
    cx, cy = lm[:, 0].mean(), lm[:, 1].mean()
    r = 0.15 * float(np.ptp(lm[:, 1]))
    centre = (np.abs(np.arange(image.shape[1])[None, :] - cx) < r) & (
        np.abs(np.arange(image.shape[0])[:, None] - cy) < r
    )
    ref = np.median(lab[centre], axis=0)
    return person & (np.linalg.norm(lab[..., 1:] - ref[1:], axis=2) <= 14) & (np.abs(lab[..., 0] - ref[0]) <= 35)


def _lighten(image: np.ndarray, where: np.ndarray, dl: float) -> np.ndarray:
    lab = to_lab(image)
    alpha = cv2.GaussianBlur(where.astype(np.float32), (0, 0), 2.0)[..., None]
    lab[..., 0] = np.clip(lab[..., 0] + dl * alpha[..., 0], 0, 100)
    rgb = cv2.cvtColor(lab, cv2.COLOR_Lab2RGB)
    return np.clip(np.rint(rgb * 255), 0, 255).astype(np.uint8)


def _edits(name: str):
    """``(source, face, neck edit, chest edit)``: the face and its neck lightened by 12 L*; the
    same and every other skin pixel of the person below the face (chest, shoulders)."""
    source = _photo(name)
    (face,) = get_face_landmarker().detect(source)
    lm = face.landmarks[:, :2]
    chin = lm[CHIN]
    height = float(np.linalg.norm(lm[CHIN] - lm[FOREHEAD_TOP]))
    width = float(np.ptp(lm[:, 0]))
    skin = _skin(source, face)
    ys, xs = np.mgrid[: source.shape[0], : source.shape[1]]
    # the face from the top of the forehead (the mesh's point 10, at the hairline) to the chin:
    # 140's grey hair lies within the skin mask's tolerance, and lightening it is a hair change
    face_part = skin & (ys <= chin[1]) & (ys >= lm[FOREHEAD_TOP][1])
    # the neck as a person sees it here: below the chin, no wider than the face, down to the
    # clothing line (the skin mask stops there) but not past the notch between the collarbones
    neck = (
        skin & (ys > chin[1] - 0.1 * height) & (ys <= chin[1] + 0.55 * height) & (np.abs(xs - chin[0]) <= 0.45 * width)
    )
    chest = skin & (ys > chin[1])
    return source, face, _lighten(source, face_part | neck, 12.0), _lighten(source, face_part | neck | chest, 12.0)


def _as_editor_returns(image: np.ndarray, seed: int) -> np.ndarray:
    out, _ = editor_jitter(rerender_like(image, image.shape), np.random.default_rng(seed))
    return out


def _judge(source, face, edited, floor_out):
    stack = GateStack.from_config(GatesConfig(), "face", region="face_neck_ears")
    region = region_mask(
        face.landmarks,
        source.shape[:2],
        "face_neck_ears",
        person=get_person_segmenter().segment(
            np.ascontiguousarray(source[:: work_stride(source.shape), :: work_stride(source.shape)])
        ),
        image=source,
    )

    def aligned(output):
        a = align_candidate(source, output, mask=region, kind="face", face_size_px=face.size_px)
        assert a.ok, a.reason
        return a

    floor = aligned(floor_out)
    floor_judged = stack.evaluate(source, floor.image, covered=floor.covered)
    measures = {k: floor_judged.metrics.get(f"locality.{k}") for k in FLOOR_RELATIVE}
    cand = aligned(edited)
    return stack.evaluate(
        source,
        cand.image,
        covered=cand.covered,
        extras={"noise_floor": {k: v for k, v in measures.items() if v is not None}, FLOOR_IMAGE: floor.image},
    )


@pytest.mark.parametrize("name", ["140", "113"])
def test_face_and_neck_lightened_by_12_lstar_is_accepted(name):
    """A V-neck (140) and a scoop neck (113): lightening the face and the whole visible neck,
    what a request for a lighter-skinned group asks for, is inside the region."""
    source, face, neck_edit, _ = _edits(name)
    floor_out = _as_editor_returns(source, 1)
    judged = _judge(source, face, _as_editor_returns(neck_edit, 2), floor_out)
    assert not any(r.startswith("locality_body_skin") for r in judged.reasons), judged.reasons
    assert judged.verdict == "accepted", (judged.reasons, judged.metrics.get("locality.body_skin_delta_e_above_floor"))
    # the hair around the head was left as it was: far under what a visible recolour measures
    assert judged.metrics["locality.hair_delta_e_above_floor"] < 1.5


def _hair(image: np.ndarray, face) -> np.ndarray:
    """The test's own hair mask: the person's pixels above the eyes within half a face height of
    the face mesh's bounding box, outside it and not skin."""
    k = work_stride(image.shape)
    person = get_person_segmenter().segment(np.ascontiguousarray(image[::k, ::k]))
    person = cv2.resize(person.astype(np.float32), image.shape[1::-1]) >= 0.5
    lm = face.landmarks[:, :2]
    x0, y0 = lm.min(axis=0)
    x1, y1 = lm.max(axis=0)
    reach = 0.5 * float(y1 - y0)
    ys, xs = np.mgrid[: image.shape[0], : image.shape[1]]
    eyes = float(lm[[33, 263], 1].mean())  # the face mesh's outer eye corners
    near = (xs > x0 - reach) & (xs < x1 + reach) & (ys > y0 - reach) & (ys < eyes)
    inside = (xs >= x0) & (xs <= x1) & (ys >= y0)
    return person & near & ~inside & ~_skin(image, face)


@pytest.mark.parametrize("name", ["140", "113"])
def test_hair_recoloured_around_the_head_is_rejected_for_hair(name):
    """The hair above the eyes made 20 L* lighter, drawn from the test's own hair mask (not the
    gate's), re-rendered and jittered: rejected as a change outside the region the prompt names,
    by the hair measure (a face-only request leaves the hair as it was)."""
    source = _photo(name)
    (face,) = get_face_landmarker().detect(source)
    hair = _hair(source, face)
    assert hair.sum() > 0.01 * hair.size
    edited = _lighten(source, hair, 20.0)
    judged = _judge(source, face, _as_editor_returns(edited, 2), _as_editor_returns(source, 1))
    assert judged.verdict == "rejected"
    assert "locality_hair_above_max" in judged.reasons, (judged.reasons, judged.metrics.get("locality.hair_delta_e"))


def test_the_same_lightening_reaching_the_chest_is_rejected_for_body_skin():
    """113 shows her collarbones and upper chest: the same lightening carried onto them is skin
    changed outside the region."""
    source, face, _, chest_edit = _edits("113")
    judged = _judge(source, face, _as_editor_returns(chest_edit, 2), _as_editor_returns(source, 1))
    assert judged.verdict == "rejected"
    assert "locality_body_skin_above_max" in judged.reasons, judged.reasons


def test_the_neck_reaches_the_clothing_line_and_stops_at_the_chest():
    """The region (with the photo) covers the V of 140's collar that the plain neck shape leaves
    out, and none of 113's chest below the collarbones."""
    for name, inside_rows, outside_rows in (("140", (0.6, 0.7), None), ("113", None, (0.8, 0.9))):
        source = _photo(name)
        (face,) = get_face_landmarker().detect(source)
        k = work_stride(source.shape)
        person = get_person_segmenter().segment(np.ascontiguousarray(source[::k, ::k]))
        plain = region_mask(face.landmarks, source.shape[:2], "face_neck_ears", person=person)
        seen = region_mask(face.landmarks, source.shape[:2], "face_neck_ears", person=person, image=source)
        assert np.all(seen[plain > 0] > 0)  # only ever adds to the shape
        lm = face.landmarks[:, :2]
        chin, height = lm[CHIN], float(np.linalg.norm(lm[CHIN] - lm[FOREHEAD_TOP]))
        skin = _skin(source, face)
        ys, xs = np.mgrid[: source.shape[0], : source.shape[1]]
        centre = np.abs(xs - chin[0]) <= 0.15 * float(np.ptp(lm[:, 0]))
        if inside_rows:
            band = skin & centre & (ys > chin[1] + inside_rows[0] * height) & (ys <= chin[1] + inside_rows[1] * height)
            assert band.sum() > 50
            assert (seen[band] > 0).mean() > 0.9 and (plain[band] > 0).mean() < 0.5
        if outside_rows:
            band = skin & (ys > chin[1] + outside_rows[0] * height) & (ys <= chin[1] + outside_rows[1] * height)
            assert band.sum() > 50
            assert (seen[band] > 0).mean() < 0.05


def test_hands_lightened_with_the_face_are_rejected_for_body_skin_with_and_without_a_floor():
    """Issue 43: hands lightened by 6.6 L* together with the face. obama_portrait.jpg (arms
    crossed, both hands showing): the face region and the test's own skin mask more than 1.2
    face heights below the chin (the hands) lightened by 6.6 L*, re-rendered and jittered;
    judged against the photo's floor output and as a lone pair, both reject it for body skin.
    (A guard: today's measure already does, body skin Delta E 5.9 against 1.4 above the floor
    and 3.4 without one; the held-out case the issue saw accepted is not reproduced here.)"""
    from counterfactory.assets import PHOTOS_DIR
    from counterfactory.validation.skin import source_edit_region

    image = load_rgb(PHOTOS_DIR / "obama_portrait.jpg")
    h, w = image.shape[:2]
    s = 512 / max(h, w)
    source = cv2.resize(image, (round(w * s) // 8 * 8, round(h * s) // 8 * 8), interpolation=cv2.INTER_AREA)
    (face,) = get_face_landmarker().detect(source)
    region, _ = source_edit_region(source, face.landmarks, "face_neck_ears")
    lm = face.landmarks[:, :2]
    height = float(np.linalg.norm(lm[CHIN] - lm[FOREHEAD_TOP]))
    ys = np.mgrid[: source.shape[0], : source.shape[1]][0]
    hands = _skin(source, face) & (ys > lm[CHIN][1] + 1.2 * height)
    assert hands.sum() > 0.01 * hands.size
    edited = _as_editor_returns(_lighten(source, (region > 0) | hands, 6.6), 2)
    with_floor = _judge(source, face, edited, _as_editor_returns(source, 1))
    assert "locality_body_skin_above_max" in with_floor.reasons, with_floor.reasons
    stack = GateStack.from_config(GatesConfig(), "face", region="face_neck_ears")
    alone = align_candidate(source, edited, mask=region, kind="face", face_size_px=face.size_px)
    assert alone.ok, alone.reason
    lone = stack.evaluate(source, alone.image, covered=alone.covered)
    assert lone.metrics["locality.floor_path"] == "none"
    assert "locality_body_skin_above_max" in lone.reasons, lone.reasons
