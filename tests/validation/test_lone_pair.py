"""A lone pair (no floor output, no cohort: the ``none`` judging path) still tells a local
failure from re-rendering (issue 34): known answers on a real bundled photo.

Every candidate here is drawn by the test itself (a patch of another bundled photo pasted on
the curtain, a word written on the suit, the flag's stripes painted over by inpainting), then comes
back as a diffusion editor returns it: re-rendered through TAEF2, shifted, zoomed, resized to
about 1 MP and JPEG-encoded, and registered to the source as a run registers it. Nothing
compares it with a floor: the largest connected area of per-pixel change away from the face
(``largest_change_share``) rejects the failures, and a re-rendered face-only edit passes.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from counterfactory.assets import PHOTOS_DIR
from counterfactory.generation.align import align_candidate
from counterfactory.generation.editors.classical import donor_tone_shift
from counterfactory.generation.rerender import rerender_like
from counterfactory.validation.calibration.base import load_rgb
from counterfactory.validation.calibration.corpus_edits import editor_jitter
from counterfactory.validation.faces import get_face_landmarker
from counterfactory.validation.gate_stack import GatesConfig, GateStack
from counterfactory.validation.metrics.pixels import largest_change_share
from counterfactory.validation.skin import source_edit_region

pytestmark = pytest.mark.slow

EDIT = {
    "condition": {"race": "East Asian", "gender": "male"},
    "source": {"presented_gender": "male", "extra": {"race": "Black"}},
}
REASON = "locality_largest_change_above_max"


def _load(name: str, side: int = 512) -> np.ndarray:
    image = load_rgb(PHOTOS_DIR / name)
    h, w = image.shape[:2]
    s = side / max(h, w)
    return cv2.resize(image, (round(w * s) // 8 * 8, round(h * s) // 8 * 8), interpolation=cv2.INTER_AREA)


@pytest.fixture(scope="module")
def photo():
    """obama_portrait.jpg at a long side of 512 (flag on the left, a dark suit below the face),
    its face, edit region (face_neck_ears), the shipped face stack and a face-only edit."""
    image = _load("obama_portrait.jpg")
    face = get_face_landmarker().detect(image)[0]
    region, _ = source_edit_region(image, face.landmarks, "face_neck_ears")
    stack = GateStack.from_config(GatesConfig(), "face", region="face_neck_ears")
    good, _ = donor_tone_shift(image, region, EDIT["condition"], 0, strength=0.85, feather_px=6)
    return image, face, region, stack, good


def _judge_lone(photo, edited: np.ndarray, seed: int):
    """``edited`` as an editor returns it, registered and judged with no floor of any kind."""
    image, face, region, stack, _ = photo
    returned, _ = editor_jitter(rerender_like(edited, edited.shape), np.random.default_rng(seed))
    aligned = align_candidate(image, returned, mask=region, kind="face", face_size_px=face.size_px)
    assert aligned.ok, aligned.reason
    judged = stack.evaluate(image, aligned.image, covered=aligned.covered, unregistered=returned, extras=EDIT)
    assert judged.metrics["locality.floor_path"] == "none"
    return judged


def _box(image: np.ndarray, x: float, y: float, w: float, h: float) -> tuple[int, int, int, int]:
    """A box given as fractions of the frame: ``(x0, y0, x1, y1)`` pixels."""
    rows, cols = image.shape[:2]
    return int(x * cols), int(y * rows), int((x + w) * cols), int((y + h) * rows)


def test_a_re_rendered_face_only_edit_is_accepted_without_a_floor(photo):
    judged = _judge_lone(photo, photo[4], 1)
    assert REASON not in judged.reasons
    assert judged.verdict == "accepted", (judged.reasons, judged.metrics.get("locality.largest_change_share"))


def test_a_pasted_patch_is_rejected_without_a_floor(photo):
    """The astronaut's mission patch and sleeve (3 % of the frame) pasted on the curtain at the right."""
    image, *_, good = photo
    donor = _load("astronaut.png")
    dx0, dy0, dx1, dy1 = _box(donor, 0.22, 0.62, 0.22, 0.2)
    x0, y0, x1, y1 = _box(image, 0.72, 0.12, 0.2, 0.15)
    edited = good.copy()
    edited[y0:y1, x0:x1] = cv2.resize(donor[dy0:dy1, dx0:dx1], (x1 - x0, y1 - y0), interpolation=cv2.INTER_AREA)
    judged = _judge_lone(photo, edited, 2)
    assert judged.verdict == "rejected"
    assert REASON in judged.reasons, (judged.reasons, judged.metrics.get("locality.largest_change_share"))


def test_written_text_is_rejected_without_a_floor(photo):
    """ "SALE" in light grey letters on the dark suit (about 1.5 % of the frame)."""
    image, *_, good = photo
    edited = good.copy()
    h, w = image.shape[:2]
    cv2.putText(
        edited, "SALE", (int(0.06 * w), int(0.93 * h)), cv2.FONT_HERSHEY_DUPLEX, 1.6, (210, 210, 210), 3, cv2.LINE_AA
    )
    judged = _judge_lone(photo, edited, 3)
    assert judged.verdict == "rejected"
    assert REASON in judged.reasons, (judged.reasons, judged.metrics.get("locality.largest_change_share"))


def test_an_erased_textured_region_is_rejected_without_a_floor(photo):
    """The flag's stripes and stars on the left (a disc of 2.5 % of the frame) painted over by
    inpainting, as an editor erasing an object does."""
    image, *_, good = photo
    h, w = image.shape[:2]
    hole = np.zeros((h, w), np.uint8)
    radius = int(0.09 * w)
    cv2.circle(hole, (int(0.08 * w), int(0.42 * h)), radius, 255, -1)
    edited = cv2.inpaint(good, hole, 5, cv2.INPAINT_TELEA)
    judged = _judge_lone(photo, edited, 4)
    assert judged.verdict == "rejected"
    assert REASON in judged.reasons, (judged.reasons, judged.metrics.get("locality.largest_change_share"))


def test_the_largest_area_counts_one_place_not_the_sum():
    """Specks spread over the frame (re-rendering) add up to more than one small patch, yet
    their largest area is a speck's; the patch is counted whole, its letters' gaps not."""
    rng = np.random.default_rng(0)
    source = np.full((200, 200, 3), 120, np.uint8)
    region = np.full((200, 200), 255, np.uint8)
    specks = source.copy()
    for y, x in rng.integers(0, 198, size=(120, 2)):
        specks[y : y + 2, x : x + 2] = 200
    assert largest_change_share(source, specks, region) < 0.001
    patch = source.copy()
    patch[80:100, 80:100] = 200
    assert largest_change_share(source, patch, region) == pytest.approx(400 / region.size, rel=0.3)
    # two patches 3 px apart are one area (joined within 2 px on each side), their gap not counted
    pair = patch.copy()
    pair[80:100, 103:113] = 200
    assert largest_change_share(source, pair, region) == pytest.approx(600 / region.size, rel=0.3)
    assert largest_change_share(source, source, np.zeros_like(region)) is None
