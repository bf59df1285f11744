"""A seeded, labelled corpus of what image editors get wrong, made from real photos.

Each case is a source photo and an "editor output" made from it: a *good* face-only edit, or
a good edit with one failure on top, re-rendered through a real latent autoencoder (TAEF2,
as a diffusion editor's decoder re-synthesises every pixel), then editor jitter and
re-encoding, as a diffusion editor returns it (a 1-3 px shift, a 0.5-2 % zoom about the centre, a resize to about 1 MP in
multiples of 16, JPEG at quality 85-95). The gates must accept the good edits and catch
(reject, or send to review) every failure class.

Good edits change only the edit region FOCUS's prompt names (:data:`CORPUS_REGION`: face, neck
to the clothing line, ears, forehead to the hairline), as a study asks for them (issue 34):

- ``skin_tone``: the region's skin lighter or darker by 8-15 L* (:data:`GOOD_L_RANGE`), a*b*
  moved by up to 5;
- ``colour_transfer``: the region's CIELAB hue and spread moved to another person's face
  (Reinhard et al., "Color Transfer between Images", 2001), its lightness by 8-15 L* either way;
- half of them also a ``feature_morph``: nose width, lip fullness and jaw width moved part of
  the way toward the proportions of a person of another group (:func:`face_proportions`), each
  factor within 0.85-1.15, with smooth local warps inside the face.

Failure classes, each on top of a good edit (``CLASSES`` describes them):

- ``expression``: mouth corners lifted (smile) or lowered (frown) by 0.07-0.14 inter-ocular
  distances, or brows raised by 0.08-0.15;
- ``expression_real``: the same person photographed smiling in the same session (a photo set's
  ``pairs``: the London set), placed in the source's frame on the head outline, ears and neck
  (:func:`~counterfactory.validation.calibration.photo_sets.register_pair`), its edit region pasted into the
  source (everything outside it stays the source's, so registration is not what tells it), then
  a good edit: a real expression change, which no synthetic warp reproduces exactly; made only
  where a pair exists;
- ``identity_swap``: another person's face of similar skin lightness (never the same person), aligned on the
  five face-recognition keypoints, colour-matched and blended into the oval;
- ``noop_copy``: the source with jitter and re-encoding only: the editor did nothing;
- ``object_added``: a patch of another photo, 2-5 % of the image, pasted away from the face;
- ``text_added``: a line of text, 1-3 % of the image, written away from the face;
- ``object_removed``: the most textured region away from the face (2-5 % of the image)
  painted over by inpainting (Telea, 2004), as an editor erasing an object does;
- the three local failures are made only where they are visible (a mean CIELAB change of at
  least :data:`MIN_VISIBLE_DELTA_E` over their own pixels, a few placements tried); a photo
  with nothing visible to erase, or only patches like its wall, gets none of that class;
- "away from the face" means outside the edit region too (the visible neck down to the
  clothing line, grown by :data:`LOCAL_FAILURE_REGION_MARGIN` face sizes): a change inside it
  is one the prompt allows, not a locality failure;
- ``body_skin``: the good edit's skin change applied to the person's skin outside the edit
  region too (chest, shoulders, hands, arms): the body skin the locality gate measures, found
  on the unedited photo; photos with less than 0.4 % of it (a portrait in a T-shirt, whose
  visible neck belongs to the region) get none of that class;
- ``global_colour``: a colour cast, a white-balance shift, or a contrast change of the whole
  image (8-20 grey levels, or contrast x0.85-0.9 / x1.12-1.2);
- ``head_pose``: the head (face oval grown by half the face size) rotated in the image plane
  by 9-16 degrees about the chin;
- ``head_position``: the head moved by 0.2-0.35 face sizes, the background behind inpainted;
- ``hair``: the hair around the head (the person outside the grown face oval and the edit
  region, above the eyes) made lighter, darker or another hue, whichever of them is visible
  first (black hair made darker is not). The design does NOT allow hair changes: like FOCUS's prompt, which asks
  the editor to keep hairstyle and everything but the face's demographic cues, it varies
  only the face; hair lies outside the face mask and is measured as non-face.

Every class is made ``per_class`` times per photo (good edits :data:`GOOD_MULTIPLIER` times
as often) with its own seed. The held-out split, which
:mod:`counterfactory.validation.calibration.corpus_fit` never uses to pick thresholds, is either the odd
variant indices (held-out cases share photos with the training split, never parameters or
jitter) or, for a :class:`~counterfactory.validation.calibration.photo_sets.PhotoSet` split by person,
every case of half the people (balanced per group). Only photos with exactly one face are used: a face design refuses other sources. Sources are scaled to at most ``max_side`` pixels first (the gates' cost grows with
the pixel count; the measures are size-free).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from counterfactory.generation.masks import dilate, feather
from counterfactory.validation.calibration.base import load_rgb
from counterfactory.validation.calibration.photo_sets import (
    MESH_RIGID,
    TEM_RIGID,
    PhotoSet,
    person_splits,
    read_tem,
    register_pair,
)
from counterfactory.validation.faces import (
    LEFT_BROW,
    LIPS,
    MOUTH_LEFT_CORNER,
    MOUTH_RIGHT_CORNER,
    RIGHT_BROW,
    FaceObservation,
    face_mask,
    get_face_landmarker,
    region_mask,
)
from counterfactory.validation.metrics.body_skin import body_skin_reference
from counterfactory.validation.metrics.pixels import to_lab
from counterfactory.validation.segment import get_person_segmenter, work_stride

GOOD = "good"
#: Every class of the corpus and what it is.
CLASSES: dict[str, str] = {
    GOOD: "face-only edit: the skin of face, neck and ears lighter or darker by 8-15 L*, by a tone shift or a colour transfer, half with a morph toward another group",
    "expression": "good edit + smile, frown or raised brows",
    "expression_real": "good edit of the same person's own smiling photo, same session, registered",
    "identity_swap": "good edit + another person's face pasted in",
    "noop_copy": "the source unchanged (jitter and re-encoding only)",
    "object_added": "good edit + a pasted object away from the face",
    "text_added": "good edit + text written away from the face",
    "object_removed": "good edit + a textured region painted over",
    "body_skin": "good edit + the same skin change on skin outside the region (chest, shoulders, hands, arms)",
    "global_colour": "good edit + colour cast, white balance or contrast change",
    "head_pose": "good edit + head rotated in the image plane",
    "head_position": "good edit + head moved",
    "hair": "good edit + hair recoloured (not allowed by the design)",
}
FAILURE_CLASSES = tuple(c for c in CLASSES if c != GOOD)
#: Good edits are made this many times more often than each failure: every gate's threshold
#: rests on their spread, and acceptance is judged on them.
GOOD_MULTIPLIER = 4


@dataclass(frozen=True)
class Case:
    """One labelled corpus pair.

    Attributes:
        case_id: ``photo:class:index``, unique and stable.
        photo: the source file's name.
        label: a key of :data:`CLASSES`.
        split: ``train`` (threshold rules see it) or ``heldout`` (they never do).
        source: ``(H, W, 3)`` uint8 RGB, the source as the factory would hold it.
        output: ``(h, w, 3)`` uint8 RGB as an editor returns it (other size, jittered, re-encoded).
        face_mask: ``(H, W)`` uint8 {0, 255} face oval of ``source``.
        face_size_px: the source face's size, pixels.
        params: what was done, for the record (JSON-ready).
    """

    case_id: str
    photo: str
    label: str
    split: str
    source: np.ndarray
    output: np.ndarray
    face_mask: np.ndarray
    face_size_px: float
    params: dict[str, Any] = field(default_factory=dict)
    #: the :class:`~counterfactory.validation.calibration.photo_sets.PhotoSet` the photo comes from
    photo_set: str = "bundled"
    person: str = ""
    group: str = ""
    #: ``(H, W)`` uint8 {0, 255}: the edit region the good edit changes (:data:`CORPUS_REGION`:
    #: face, neck, ears and facial hair, as FOCUS's prompt names them); None: the oval
    region: np.ndarray | None = None
    #: the good edit's direction of skin lightness: ``lighter``, ``darker`` or ``""``
    direction: str = ""


def _seed(*parts: object) -> int:
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def split_of(index: int) -> str:
    """``train`` for even variant indices, ``heldout`` for odd ones."""
    return "heldout" if index % 2 else "train"


# ---------------------------------------------------------------------------------------
# building blocks


def _from_lab(lab: np.ndarray) -> np.ndarray:
    rgb = cv2.cvtColor(lab.astype(np.float32), cv2.COLOR_Lab2RGB)
    return np.clip(np.rint(rgb * 255.0), 0, 255).astype(np.uint8)


def _blend(base: np.ndarray, top: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    a = alpha[..., None].astype(np.float32)
    return np.clip(np.rint(a * top.astype(np.float32) + (1 - a) * base.astype(np.float32)), 0, 255).astype(np.uint8)


def _lab_shift(image: np.ndarray, alpha: np.ndarray, delta: np.ndarray) -> np.ndarray:
    lab = to_lab(image)
    lab = lab + delta.reshape(1, 1, 3).astype(np.float32)
    lab[..., 0] = np.clip(lab[..., 0], 0, 100)
    return _blend(image, _from_lab(lab), alpha)


def _warp_field(image: np.ndarray, dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """``out(p) = image(p - d(p))``: content moves by ``d`` (valid for smooth, small ``d``)."""
    h, w = image.shape[:2]
    gx, gy = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    return cv2.remap(image, gx - dx, gy - dy, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)


def _bump(shape: tuple[int, int], centre: np.ndarray, radius: float) -> np.ndarray:
    h, w = shape
    gx, gy = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    r2 = (gx - centre[0]) ** 2 + (gy - centre[1]) ** 2
    return np.exp(-r2 / (2.0 * radius**2)).astype(np.float32)


def _scale_about(shape, centre: np.ndarray, radius: float, factor_x: float, factor_y: float):
    """Displacement field scaling content about ``centre`` by the factors, fading out at ``radius``."""
    h, w = shape
    gx, gy = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    weight = _bump(shape, centre, radius)
    return (factor_x - 1.0) * (gx - centre[0]) * weight, (factor_y - 1.0) * (gy - centre[1]) * weight


def _iod(face: FaceObservation) -> float:
    k = face.keypoints5()
    return float(np.hypot(*(k[1] - k[0])))


def _region_away_from_face(oval: np.ndarray, size: float, edit_region: np.ndarray | None = None) -> np.ndarray:
    """Where a local failure may be placed: away from the face (the oval grown by 0.35 face
    sizes), outside the edit region grown by :data:`LOCAL_FAILURE_REGION_MARGIN` face sizes and
    off the image's edge band. The edit region is where the prompt allows change (the face and
    the visible neck down to the clothing line): an object erased there is inside what the
    locality gate leaves to the editor, so it could not be a failure the gate is asked to catch
    (London 105 and 140's "erased" V-neck lines were, and were counted as misses)."""
    away = dilate(oval, int(round(0.35 * size))) == 0
    if edit_region is not None:
        away &= dilate(edit_region, int(round(LOCAL_FAILURE_REGION_MARGIN * size))) == 0
    h, w = oval.shape
    b = max(4, int(0.05 * min(h, w)))
    away[:b] = away[-b:] = False
    away[:, :b] = away[:, -b:] = False
    return away


#: How far (face sizes) a local failure keeps from the edit region: past the locality gate's
#: own margin (:data:`~counterfactory.validation.metrics.pixels.FACE_MARGIN_FRAC`, 0.10) with
#: room for the editor's jitter and the failure's feathered edge.
LOCAL_FAILURE_REGION_MARGIN = 0.15


def _place_box(rng: np.random.Generator, allowed: np.ndarray, bw: int, bh: int, tries: int = 200):
    """Top-left of a ``bw x bh`` box lying entirely in ``allowed``, or None."""
    h, w = allowed.shape
    if bw >= w or bh >= h:
        return None
    integral = cv2.integral((~allowed).astype(np.uint8))
    for _ in range(tries):
        x, y = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
        bad = integral[y + bh, x + bw] - integral[y, x + bw] - integral[y + bh, x] + integral[y, x]
        if bad == 0:
            return x, y
    return None


# ---------------------------------------------------------------------------------------
# good edits


def _face_crop(oval: np.ndarray, size: float) -> tuple[slice, slice]:
    """The face oval's bounding box grown by half the face size: every face edit's support."""
    ys, xs = np.nonzero(oval)
    g = int(0.5 * size)
    h, w = oval.shape
    return slice(max(0, ys.min() - g), min(h, ys.max() + g + 1)), slice(max(0, xs.min() - g), min(w, xs.max() + g + 1))


def _in_crop(edit, image: np.ndarray, face: FaceObservation, oval: np.ndarray, *args):
    """Run ``edit(crop, face_in_crop, oval_crop, *args)`` on the face's crop and paste it back
    (the edits change nothing outside the oval, so the result is the same, only cheaper)."""
    sy, sx = _face_crop(oval, face.size_px)
    shifted = FaceObservation(
        landmarks=face.landmarks - np.float32([sx.start, sy.start, 0]),
        blendshapes=face.blendshapes,
        transform=face.transform,
    )
    out_crop, params = edit(np.ascontiguousarray(image[sy, sx]), shifted, np.ascontiguousarray(oval[sy, sx]), *args)
    out = image.copy()
    out[sy, sx] = out_crop
    return out, params


#: The edit region of the corpus's face edits: what FOCUS's prompt (``face_only_v1``) names.
CORPUS_REGION = "face_neck_ears"
#: Good edits change the skin lightness of the whole region by this many L* (CIELAB), either
#: way: a request for another group changes skin tone, lighter or darker.
GOOD_L_RANGE = (8.0, 15.0)


def good_edit(
    image: np.ndarray,
    face: FaceObservation,
    oval: np.ndarray,
    rng: np.random.Generator,
    donor_lab: np.ndarray | None,
    region: np.ndarray | None = None,
    donor_shape: np.ndarray | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """A face-only edit as a study asks for one: the skin of the whole edit region (``region``:
    face, neck, ears, :data:`CORPUS_REGION`; None: the oval) lightened or darkened by
    :data:`GOOD_L_RANGE` L*, by a tone shift or a colour transfer from a donor's face, plus, half
    the time, the face's features morphed part of the way toward a donor's proportions
    (``donor_shape``: :func:`face_proportions` of a person of another group; None: drawn).

    ``image`` ``(H, W, 3)`` uint8 RGB, ``oval`` its ``(H, W)`` {0, 255} face oval; returns the
    edited image (identical outside the region) and the parameters drawn (``direction``:
    ``lighter`` or ``darker``)."""
    if region is None:
        return _in_crop(_good_edit, image, face, oval, rng, donor_lab, None, donor_shape)
    return _good_edit(image, face, oval, rng, donor_lab, region, donor_shape)


def face_proportions(face: FaceObservation) -> np.ndarray:
    """``(3,)`` float: nose width, lip height and jaw width over the inter-ocular distance."""
    lm = face.landmarks[:, :2].astype(np.float64)
    iod = max(_iod(face), 1e-6)
    nose = np.linalg.norm(lm[98] - lm[327])
    lips = np.linalg.norm(lm[0] - lm[17])
    jaw = np.linalg.norm(lm[172] - lm[397])
    return np.array([nose, lips, jaw]) / iod


def _good_edit(image, face, oval, rng, donor_lab, region=None, donor_shape=None):
    size = face.size_px
    where = oval if region is None else region
    alpha = feather(where, max(2.0, 0.08 * size))
    inside = where > 0
    kind = str(rng.choice(["skin_tone", "colour_transfer"] if donor_lab is not None else ["skin_tone"]))
    sign = float(rng.choice([-1, 1]))
    dl = float(rng.uniform(*GOOD_L_RANGE)) * sign
    params: dict[str, Any] = {"good": kind, "direction": "lighter" if sign > 0 else "darker"}
    if kind == "skin_tone":
        da, db = (float(x) for x in rng.uniform(-5, 5, size=2))
        delta = np.array([dl, da, db])
        out = _lab_shift(image, alpha, delta)
        params["lab_delta"] = [round(float(x), 2) for x in delta]
    else:
        # the donor's hue and spread, the lightness moved by dl: a colour transfer toward a
        # person of another group (Reinhard et al. 2001), lighter or darker by what was drawn
        lab = to_lab(image)
        mean, std = lab[inside].mean(axis=0), lab[inside].std(axis=0) + 1e-3
        t_mean, t_std = np.array(donor_lab[0], np.float64), np.array(donor_lab[1], np.float64)
        t_mean = np.array([mean[0] + dl, t_mean[1], t_mean[2]])
        t_std = np.array([std[0], t_std[1], t_std[2]])
        moved = (lab - mean) / std * t_std + t_mean
        moved[..., 0] = np.clip(moved[..., 0], 0, 100)
        out = _blend(image, _from_lab(moved), alpha)
        delta = t_mean - mean
        params["lab_delta"] = [round(float(x), 2) for x in delta]
    if rng.random() < 0.5:
        lm = face.landmarks[:, :2].astype(np.float32)
        if donor_shape is not None:
            # part of the way toward the donor's proportions, each factor within 0.85-1.15
            t = float(rng.uniform(0.5, 1.0))
            ratio = np.asarray(donor_shape, np.float64) / np.maximum(face_proportions(face), 1e-6)
            fx = [float(np.clip(1.0 + t * (r - 1.0), 0.85, 1.15)) for r in ratio]
        else:
            fx = [float(x) for x in rng.uniform(0.88, 1.12, size=3)]
        dx = np.zeros(image.shape[:2], np.float32)
        dy = np.zeros(image.shape[:2], np.float32)
        # nose width, lip fullness, jaw width: each a smooth scaling about the feature
        for centre, radius, sx, sy in (
            (lm[[1, 2, 98, 327]].mean(axis=0), 0.12 * size, fx[0], 1.0),
            (lm[list(LIPS)].mean(axis=0), 0.12 * size, 1.0, fx[1]),
            (lm[[152, 172, 397]].mean(axis=0), 0.25 * size, fx[2], 1.0),
        ):
            ddx, ddy = _scale_about(image.shape[:2], centre, radius, sx, sy)
            dx += ddx
            dy += ddy
        morphed = _warp_field(out, dx, dy)
        out = _blend(out, morphed, feather(oval, max(2.0, 0.08 * size)))
        params["morph"] = [round(x, 3) for x in fx]
    return out, params


# ---------------------------------------------------------------------------------------
# failures


def _expression(image, face, oval, rng) -> tuple[np.ndarray, dict]:
    return _in_crop(_expression_crop, image, face, oval, rng)


def _expression_crop(image, face, oval, rng) -> tuple[np.ndarray, dict]:
    iod = _iod(face)
    lm = face.landmarks[:, :2].astype(np.float32)
    # the face frame's "up" (perpendicular to the eye line), in image coordinates
    k = face.keypoints5()
    ex = (k[1] - k[0]) / max(iod, 1e-6)
    up = np.array([ex[1], -ex[0]], np.float32)
    kind = str(rng.choice(["smile", "frown", "brows_up"]))
    dx = np.zeros(image.shape[:2], np.float32)
    dy = np.zeros(image.shape[:2], np.float32)
    if kind in ("smile", "frown"):
        amount = float(rng.uniform(0.07, 0.14)) * iod * (1 if kind == "smile" else -1)
        points = [lm[MOUTH_RIGHT_CORNER], lm[MOUTH_LEFT_CORNER]]
        radius = 0.18 * iod
    else:
        amount = float(rng.uniform(0.08, 0.15)) * iod
        points = [lm[list(RIGHT_BROW)].mean(axis=0), lm[list(LEFT_BROW)].mean(axis=0)]
        radius = 0.3 * iod
    for p in points:
        b = _bump(image.shape[:2], p, radius)
        dx += up[0] * amount * b
        dy += up[1] * amount * b
    return _warp_field(image, dx, dy), {"expression": kind, "amount_iod": round(amount / iod, 4)}


def _identity_swap(image, face, oval, rng, donor) -> tuple[np.ndarray, dict]:
    donor_image, donor_face, donor_name = donor
    m, _ = cv2.estimateAffinePartial2D(donor_face.keypoints5(), face.keypoints5())
    h, w = image.shape[:2]
    warped = cv2.warpAffine(donor_image, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    inside = oval > 0
    lab_w, lab_s = to_lab(warped), to_lab(image)
    matched = (lab_w - lab_w[inside].mean(axis=0)) / (lab_w[inside].std(axis=0) + 1e-3)
    matched = matched * lab_s[inside].std(axis=0) + lab_s[inside].mean(axis=0)
    matched[..., 0] = np.clip(matched[..., 0], 0, 100)
    alpha = feather(oval, max(2.0, 0.1 * face.size_px))
    return _blend(image, _from_lab(matched), alpha), {"donor": donor_name}


#: A local failure (an object added or removed, text written) is made only where a person
#: would see it: the mean CIELAB colour difference (CIE76) it makes over its own pixels is at
#: least this. Below it the "failure" is a wall pasted on a wall or an erased patch of plain
#: shirt, which no gate should catch and no reviewer would call a change (5 is about twice a
#: just-noticeable difference of uniform patches).
MIN_VISIBLE_DELTA_E = 5.0
#: Placements (and donor patches) tried before a local failure is skipped on a photo.
VISIBLE_TRIES = 8


def visible_delta_e(before: np.ndarray, after: np.ndarray, where: np.ndarray) -> float:
    """Mean CIE76 colour difference of ``after`` against ``before`` (uint8 RGB) over the
    pixels where ``where`` (bool or {0, 255}) holds; 0 for no pixels."""
    keep = np.asarray(where) > 0
    if not keep.any():
        return 0.0
    a = to_lab(np.ascontiguousarray(before[keep]).reshape(-1, 1, 3))
    b = to_lab(np.ascontiguousarray(after[keep]).reshape(-1, 1, 3))
    return float(np.linalg.norm((b - a).reshape(-1, 3), axis=1).mean())


def _object_added(image, face, oval, rng, donor_image, edit_region=None) -> tuple[np.ndarray, dict]:
    h, w = image.shape[:2]
    share = float(rng.uniform(0.02, 0.05))
    aspect = float(rng.uniform(0.6, 1.6))
    bw = int(math.sqrt(share * h * w * aspect))
    bh = int(share * h * w / max(bw, 1))
    allowed = _region_away_from_face(oval, face.size_px, edit_region)
    dh, dw = donor_image.shape[:2]
    for _ in range(VISIBLE_TRIES):
        at = _place_box(rng, allowed, bw, bh)
        if at is None:
            return None, {}
        x, y = at
        sx, sy = int(rng.integers(0, max(1, dw - bw))), int(rng.integers(0, max(1, dh - bh)))
        patch = cv2.resize(donor_image[sy : sy + bh, sx : sx + bw], (bw, bh))
        seen = visible_delta_e(image[y : y + bh, x : x + bw], patch, np.ones((bh, bw), bool))
        if seen >= MIN_VISIBLE_DELTA_E:
            break
    else:
        # every patch tried looks like what it covers (a donor's wall on this wall)
        return None, {}
    out = image.copy()
    box = np.zeros((h, w), np.uint8)
    box[y : y + bh, x : x + bw] = 255
    placed = out.copy()
    placed[y : y + bh, x : x + bw] = patch
    params = {"box": [x, y, bw, bh], "share": round(bw * bh / (h * w), 4), "delta_e": round(seen, 2)}
    return _blend(out, placed, feather(box, 2.0)), params


_WORDS = ("SALE", "OPEN", "HELLO", "CAFE", "EXIT", "NEWS", "2026", "VOTE", "TAXI", "HOTEL")


def _text_added(image, face, oval, rng, edit_region=None) -> tuple[np.ndarray, dict]:
    h, w = image.shape[:2]
    text = " ".join(str(rng.choice(_WORDS)) for _ in range(int(rng.integers(1, 3))))
    share = float(rng.uniform(0.01, 0.03))
    (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_DUPLEX, 1.0, 2)
    scale = math.sqrt(share * h * w / max(tw * (th + base), 1))
    thick = max(1, int(round(2 * scale)))
    (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_DUPLEX, scale, thick)
    allowed = _region_away_from_face(oval, face.size_px, edit_region)
    for _ in range(VISIBLE_TRIES):
        at = _place_box(rng, allowed, tw, th + base)
        if at is None:
            return None, {}
        x, y = at
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        out = image.copy()
        cv2.putText(out, text, (x, y + th), cv2.FONT_HERSHEY_DUPLEX, scale, colour, thick, cv2.LINE_AA)
        strokes = np.any(out != image, axis=2)
        # the strokes' own colour against what they cover: grey text on a grey wall is unseen
        seen = visible_delta_e(image, out, strokes)
        if seen >= MIN_VISIBLE_DELTA_E:
            return out, {"text": text, "box": [x, y, tw, th + base], "delta_e": round(seen, 2)}
    return None, {}


def _object_removed(image, face, oval, rng, edit_region=None) -> tuple[np.ndarray, dict]:
    h, w = image.shape[:2]
    share = float(rng.uniform(0.02, 0.05))
    side = int(math.sqrt(share * h * w))
    allowed = _region_away_from_face(oval, face.size_px, edit_region)
    grey = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY).astype(np.float32)
    energy = np.abs(cv2.Laplacian(cv2.GaussianBlur(grey, (0, 0), 1.5), cv2.CV_32F))
    boxes: list[tuple[float, tuple[int, int]]] = []
    for _ in range(40):
        at = _place_box(rng, allowed, side, side, tries=20)
        if at is None:
            continue
        x, y = at
        boxes.append((float(energy[y : y + side, x : x + side].mean()), at))
    # the most textured places first; one whose erasure a person would see is kept
    boxes.sort(key=lambda b: -b[0])
    # inpaint at reduced size: Telea's cost grows with the hole's area
    f = min(1.0, 256.0 / side)
    small = cv2.resize(image, None, fx=f, fy=f, interpolation=cv2.INTER_AREA)
    for _, (x, y) in boxes[:VISIBLE_TRIES]:
        hole = np.zeros((h, w), np.uint8)
        cv2.ellipse(hole, (x + side // 2, y + side // 2), (side // 2, side // 2), 0, 0, 360, 255, -1)
        small_hole = cv2.resize(hole, (small.shape[1], small.shape[0]), interpolation=cv2.INTER_NEAREST)
        filled = cv2.inpaint(small, small_hole, 5, cv2.INPAINT_TELEA)
        filled = cv2.resize(filled, (w, h), interpolation=cv2.INTER_CUBIC)
        out = _blend(image, filled, feather(dilate(hole, 2), 3.0))
        seen = visible_delta_e(image, out, hole)
        if seen >= MIN_VISIBLE_DELTA_E:
            params = {"box": [x, y, side, side], "share": round(math.pi * side * side / 4 / (h * w), 4)}
            return out, {**params, "delta_e": round(seen, 2)}
    # nothing textured enough to erase visibly away from the face (a plain wall and shirt)
    return None, {}


def _body_skin_region(source, face, oval, region=None) -> np.ndarray:
    """``(H, W)`` uint8 {0, 255}: the body skin the locality gate measures
    (:func:`~counterfactory.validation.metrics.body_skin.body_skin_reference`: the person's pixels
    outside the edit region grown by the face margin whose colour is the source face's), found
    on the unedited ``source``. One definition for the failure and the gate: a looser skin test
    here once recoloured spiky hair tips and called it body skin (London 022)."""
    person = get_person_segmenter().person_mask(source)
    edit = oval if region is None else cv2.bitwise_or(region, oval)
    body = body_skin_reference(source, oval, person, face.size_px, edit)
    out = np.zeros(source.shape[:2], np.uint8)
    out[body.rows, body.cols] = 255
    return out


def _body_skin(image, face, oval, rng, params, edit_region=None, source=None) -> tuple[np.ndarray, dict]:
    """The good edit's skin change (``params["lab_delta"]``, at least 8 L* strong) applied to
    the body skin too (:func:`_body_skin_region` of ``source``, the unedited photo; ``image``
    when None); skipped where less than 0.4 % of the photo is body skin."""
    region = _body_skin_region(image if source is None else source, face, oval, edit_region)
    if cv2.countNonZero(region) < 0.004 * region.size:
        return None, {}
    delta = np.asarray(params.get("lab_delta", [15.0, 0.0, 0.0]), np.float32)
    if float(np.linalg.norm(delta)) < 8.0:
        delta = delta * (8.0 / max(float(np.linalg.norm(delta)), 1e-6))
    alpha = cv2.GaussianBlur(region.astype(np.float32) / 255.0, (0, 0), 2.0)
    return _lab_shift(image, alpha, delta), {"body_skin_share": round(cv2.countNonZero(region) / region.size, 4)}


def _global_colour(image, face, oval, rng) -> tuple[np.ndarray, dict]:
    kind = str(rng.choice(["cast", "white_balance", "contrast"]))
    x = image.astype(np.float32)
    if kind == "cast":
        ch = int(rng.integers(0, 3))
        d = float(rng.uniform(8, 20)) * float(rng.choice([-1, 1]))
        x[..., ch] += d
        p: dict[str, Any] = {"channel": ch, "levels": round(d, 2)}
    elif kind == "white_balance":
        t = float(rng.uniform(0.05, 0.1)) * float(rng.choice([-1, 1]))
        x[..., 0] *= 1 + t
        x[..., 2] *= 1 - t
        p = {"warmth": round(t, 3)}
    else:
        g = float(rng.choice([rng.uniform(0.85, 0.9), rng.uniform(1.12, 1.2)]))
        mean = x.reshape(-1, 3).mean(axis=0)
        x = (x - mean) * g + mean
        p = {"contrast": round(g, 3)}
    return np.clip(np.rint(x), 0, 255).astype(np.uint8), {"global": kind, **p}


def _head_mask(face: FaceObservation, oval: np.ndarray) -> np.ndarray:
    return dilate(oval, int(round(0.5 * face.size_px)))


def _head_pose(image, face, oval, rng) -> tuple[np.ndarray, dict]:
    angle = float(rng.uniform(9, 16)) * float(rng.choice([-1, 1]))
    chin = tuple(float(v) for v in face.landmarks[152, :2])
    h, w = image.shape[:2]
    m = cv2.getRotationMatrix2D(chin, angle, 1.0)
    rotated = cv2.warpAffine(image, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    head = cv2.warpAffine(_head_mask(face, oval), m, (w, h), flags=cv2.INTER_NEAREST)
    return _blend(image, rotated, feather(head, 0.1 * face.size_px)), {"roll_deg": round(angle, 2)}


def _head_position(image, face, oval, rng) -> tuple[np.ndarray, dict]:
    frac = float(rng.uniform(0.2, 0.35))
    theta = float(rng.uniform(0, 2 * math.pi))
    dx, dy = frac * face.size_px * math.cos(theta), frac * face.size_px * math.sin(theta)
    h, w = image.shape[:2]
    head = _head_mask(face, oval)
    f = min(1.0, 320.0 / max(h, w))
    small = cv2.resize(image, None, fx=f, fy=f, interpolation=cv2.INTER_AREA)
    small_hole = cv2.resize(head, (small.shape[1], small.shape[0]), interpolation=cv2.INTER_NEAREST)
    background = cv2.resize(cv2.inpaint(small, small_hole, 5, cv2.INPAINT_TELEA), (w, h), interpolation=cv2.INTER_CUBIC)
    base = _blend(image, background, feather(head, 0.05 * face.size_px))
    m = np.float32([[1, 0, dx], [0, 1, dy]])
    moved = cv2.warpAffine(image, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    moved_head = cv2.warpAffine(head, m, (w, h), flags=cv2.INTER_NEAREST)
    return _blend(base, moved, feather(moved_head, 0.1 * face.size_px)), {"shift_face_sizes": round(frac, 3)}


def _hair(image, face, oval, rng, edit_region=None) -> tuple[np.ndarray, dict]:
    """The hair around the head recoloured: the person's pixels in a ring around the face
    oval above the eyes, outside the edit region (the forehead up to the hairline belongs to
    the face); lighter, darker or another hue, the first of those (in a random order) that a
    person would see (:data:`MIN_VISIBLE_DELTA_E`: black hair made darker is not a change)."""
    person = get_person_segmenter().person_mask(image) > 0
    size = face.size_px
    around = (dilate(oval, int(round(0.6 * size))) > 0) & ~(dilate(oval, int(round(0.03 * size))) > 0)
    if edit_region is not None:
        around &= ~(dilate(edit_region, int(round(0.03 * size))) > 0)
    eyes_y = float(face.keypoints5()[:2, 1].mean())
    rows = np.arange(image.shape[0])[:, None] < eyes_y
    region = (person & around & rows).astype(np.uint8) * 255
    if cv2.countNonZero(region) < 0.003 * region.size:
        return None, {}
    alpha = cv2.GaussianBlur(region.astype(np.float32) / 255.0, (0, 0), 3.0)
    if edit_region is not None:
        alpha[edit_region > 0] = 0.0  # the feathered edge stays off the region too
    for kind in rng.permutation(["lighter", "darker", "hue"]):
        kind = str(kind)
        if kind == "hue":
            delta = np.array([0.0, *rng.uniform(-30, 30, size=2)])
        else:
            delta = np.array([float(rng.uniform(25, 45)) * (1 if kind == "lighter" else -1), 0.0, 0.0])
        out = _lab_shift(image, alpha, delta)
        seen = visible_delta_e(image, out, region)
        if seen >= MIN_VISIBLE_DELTA_E:
            params = {"hair": kind, "lab_delta": [round(float(x), 2) for x in delta], "delta_e": round(seen, 2)}
            return out, params
    return None, {}


# ---------------------------------------------------------------------------------------
# editor jitter


def editor_jitter(image: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, Any]]:
    """What a diffusion editor does to every output: a 1-3 px shift, a 0.5-2 % zoom about
    the centre, a resize to about 1 MP in multiples of 16, and JPEG at quality 85-95."""
    h, w = image.shape[:2]
    shift = rng.uniform(1.0, 3.0) * np.array([math.cos(a := rng.uniform(0, 2 * math.pi)), math.sin(a)])
    zoom = 1.0 + float(rng.uniform(0.005, 0.02))
    m = cv2.getRotationMatrix2D((w / 2, h / 2), 0.0, zoom)
    m[:, 2] += shift
    moved = cv2.warpAffine(image, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    s = math.sqrt(1024 * 1024 / (h * w))
    nh, nw = max(16, round(h * s / 16) * 16), max(16, round(w * s / 16) * 16)
    work = cv2.resize(moved, (nw, nh), interpolation=cv2.INTER_AREA if s < 1 else cv2.INTER_CUBIC)
    quality = int(rng.integers(85, 96))
    ok, buf = cv2.imencode(".jpg", work[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    out = cv2.imdecode(buf, cv2.IMREAD_COLOR)[:, :, ::-1].copy()
    params = {
        "shift_px": [round(float(v), 3) for v in shift],
        "zoom": round(zoom, 4),
        "size": [nw, nh],
        "jpeg": quality,
    }
    return out, params


# ---------------------------------------------------------------------------------------
# the corpus


@dataclass
class _Photo:
    name: str
    person: str
    image: np.ndarray
    face: FaceObservation
    oval: np.ndarray
    face_lab: np.ndarray  # (2, 3): mean and std of the face's CIELAB
    group: str = ""
    #: the same person in another expression, in this photo's frame: (image, face, oval, registration)
    pair: tuple[np.ndarray, FaceObservation, np.ndarray, dict[str, float]] | None = None
    #: the edit region (:data:`CORPUS_REGION`), drawn with the person and the photo
    region: np.ndarray | None = None
    #: :func:`face_proportions`
    shape: np.ndarray | None = None


def _scaled(image: np.ndarray, max_side: int) -> tuple[np.ndarray, float]:
    h, w = image.shape[:2]
    s = min(1.0, max_side / max(h, w))
    if s < 1.0:
        image = cv2.resize(image, (round(w * s), round(h * s)), interpolation=cv2.INTER_AREA)
    return image, s


def _paired(photo_set: PhotoSet, path: Path, image: np.ndarray, face: FaceObservation, s: float):
    """The set's other-expression photo of ``path``, registered into ``image``'s frame, or None."""
    other_path = photo_set.pairs.get(path)
    if other_path is None:
        return None
    other, s_other = _scaled(load_rgb(other_path), photo_set.max_side)
    landmarker = get_face_landmarker()
    tem, tem_other = photo_set.landmarks.get(path), photo_set.landmarks.get(other_path)
    if tem is not None and tem_other is not None:
        points = read_tem(tem)[list(TEM_RIGID)] * s
        points_other = read_tem(tem_other)[list(TEM_RIGID)] * s_other
    else:
        found = landmarker.detect(other)
        if len(found) != 1:
            return None
        points = face.landmarks[list(MESH_RIGID), :2]
        points_other = found[0].landmarks[list(MESH_RIGID), :2]
    warped, registration = register_pair(image, other, points, points_other)
    faces = landmarker.detect(warped)
    if len(faces) != 1:
        return None
    return warped, faces[0], face_mask(faces[0].landmarks, warped.shape[:2], mode="oval"), registration


def _load_photos(paths: list[Path], max_side: int, photo_set: PhotoSet | None = None) -> list[_Photo]:
    landmarker = get_face_landmarker()
    photos = []
    for path in paths:
        image, s = _scaled(load_rgb(path), max_side)
        faces = landmarker.detect(image)
        if len(faces) != 1:
            # a face design takes sources with exactly one face (others fail as sources)
            continue
        face = faces[0]
        oval = face_mask(face.landmarks, image.shape[:2], mode="oval")
        person = (photo_set or PhotoSet("", (), 1)).person_of(Path(path))
        lab = to_lab(image)[oval > 0]
        k = work_stride(image.shape)
        segmented = get_person_segmenter().segment(np.ascontiguousarray(image[::k, ::k]))
        region = region_mask(face.landmarks, image.shape[:2], CORPUS_REGION, person=segmented, image=image)
        photos.append(
            _Photo(
                Path(path).name,
                person,
                image,
                face,
                oval,
                np.stack([lab.mean(0), lab.std(0)]),
                group=(photo_set.groups.get(person, "") if photo_set is not None else ""),
                pair=_paired(photo_set, Path(path), image, face, s) if photo_set is not None else None,
                region=region,
                shape=face_proportions(face),
            )
        )
    _tone_groups(photos)
    return photos


def _tone_groups(photos: list[_Photo]) -> None:
    """Photos whose set states no group get their face's skin-lightness tertile within the
    set (``tone_1`` darkest .. ``tone_3``), so figures per group cover every photo."""
    unstated = [p for p in photos if not p.group]
    if len(unstated) < 3:
        for p in unstated:
            p.group = "tone_unknown"
        return
    lightness = np.array([p.face_lab[0, 0] for p in unstated])
    cuts = np.quantile(lightness, [1 / 3, 2 / 3])
    for p, value in zip(unstated, lightness, strict=True):
        p.group = f"tone_{1 + int(np.searchsorted(cuts, value, side='right'))}"


def build_corpus(
    paths: list[Path],
    *,
    per_class: int = 4,
    seed: int = 0,
    max_side: int = 512,
    splits: tuple[str, ...] = ("train", "heldout"),
    classes: tuple[str, ...] | None = None,
    rerender: bool = True,
) -> Iterator[Case]:
    """Yield the corpus cases photo by photo, class by class (see the module docstring),
    held out by variant (:func:`build_set_corpus` for a photo set split by person).

    Args:
        paths: source photos; each needs exactly one face, as a face design's sources do
            (others, such as ``two_people.jpg``, are skipped). Identity
            swaps take their donor from another photo of another person, so at least two
            people must be present for that class.
        per_class: variants per class and photo (good edits: :data:`GOOD_MULTIPLIER` times as
            many); odd indices are held out.
        seed: the corpus seed; the same seed gives byte-identical cases.
        max_side: sources larger than this are scaled down first, pixels.
        splits: which splits to yield.
        classes: which classes to make (all of :data:`CLASSES` by default).
        rerender: pass every case (the no-op copies too) through the TAEF2 latent autoencoder
            (:mod:`counterfactory.generation.rerender`) at its own size before the jitter, as
            a diffusion editor's decoder re-synthesises every pixel it returns.

    A failure that cannot be made on a photo (no room away from the face for an object, no
    skin visible outside the head, no photo of the person's other expression) is skipped for
    that photo.
    """
    photo_set = PhotoSet("bundled", tuple(Path(p) for p in paths), per_class, max_side)
    yield from build_set_corpus(photo_set, seed=seed, splits=splits, classes=classes, rerender=rerender)


def build_set_corpus(
    photo_set: PhotoSet,
    *,
    seed: int = 0,
    splits: tuple[str, ...] = ("train", "heldout"),
    classes: tuple[str, ...] | None = None,
    rerender: bool = True,
) -> Iterator[Case]:
    """:func:`build_corpus` over one :class:`~counterfactory.validation.calibration.photo_sets.PhotoSet`:
    its photos, variants per class, size cap, split (by variant or by person) and pairs.
    Donors (identity swaps, colour transfers, pasted objects) are other people of the set."""
    photos = _load_photos(list(photo_set.paths), photo_set.max_side, photo_set)
    by_person = (
        person_splits([p.person for p in photos], {p.person: p.group for p in photos}, seed)
        if photo_set.split_by == "person"
        else None
    )
    wanted = classes or tuple(CLASSES)
    for photo in photos:
        others = [p for p in photos if p.person != photo.person]
        for label in wanted:
            for index in range(photo_set.per_class * (GOOD_MULTIPLIER if label == GOOD else 1)):
                split = by_person[photo.person] if by_person is not None else split_of(index)
                if split not in splits:
                    continue
                rng = np.random.default_rng(_seed(seed, photo.name, label, index))
                donor = others[int(rng.integers(0, len(others)))] if others else None
                if label == "identity_swap" and others:
                    # a donor of similar skin lightness: the identity gate, not the tone, decides
                    near = sorted(others, key=lambda p: abs(p.face_lab[0, 0] - photo.face_lab[0, 0]))[:3]
                    donor = near[int(rng.integers(0, len(near)))]
                case = _make_case(
                    photo, label, index, split, rng, donor, seed, rerender, _shape_donor(photo, others, rng)
                )
                if case is not None:
                    yield dataclasses.replace(
                        case,
                        photo_set=photo_set.name,
                        person=photo.person,
                        group=photo.group,
                        region=photo.region,
                        direction=case.params.get("direction", ""),
                    )


def _shape_donor(photo: _Photo, others: list[_Photo], rng: np.random.Generator) -> np.ndarray | None:
    """The face proportions a good edit's morph moves toward: a person of another group
    (stated, or another skin-tone tertile) when the set has one, else another person."""
    pool = [p for p in others if p.group != photo.group] or others
    if not pool:
        return None
    return pool[int(rng.integers(0, len(pool)))].shape


#: the label of a photo's noise-floor case (:func:`build_floors`): not a corpus class
FLOOR = "floor"


def build_floors(
    paths: list[Path], *, seed: int = 0, max_side: int = 512, rerender: bool = True, photo_set: PhotoSet | None = None
) -> Iterator[Case]:
    """One noise-floor case per one-face photo: the source unchanged, re-rendered and jittered
    with its own seed, as an editor answers the request "return this photo unchanged".

    The corpus judges every case of a photo relative to it, as a run judges every cell of a
    template relative to the editor's floor request for that template. With ``photo_set``,
    its photos and size cap replace ``paths`` and ``max_side``.
    """
    if photo_set is not None:
        paths, max_side = list(photo_set.paths), photo_set.max_side
    name = photo_set.name if photo_set is not None else "bundled"
    for photo in _load_photos([Path(p) for p in paths], max_side):
        rng = np.random.default_rng(_seed(seed, photo.name, FLOOR, 0))
        case = _make_case(photo, "noop_copy", 0, FLOOR, rng, None, seed, rerender)
        yield dataclasses.replace(
            case, case_id=f"{photo.name}:{FLOOR}", label=FLOOR, photo_set=name, region=photo.region
        )


def _make_case(
    photo: _Photo,
    label: str,
    index: int,
    split: str,
    rng,
    donor: _Photo | None,
    seed: int,
    rerender: bool = True,
    shape_donor: np.ndarray | None = None,
) -> Case | None:
    image, face, oval = photo.image, photo.face, photo.oval
    params: dict[str, Any] = {}
    if label == "noop_copy":
        edited = image
    elif label == "expression_real":
        if photo.pair is None:
            return None
        pair_image, pair_face, pair_oval, registration = photo.pair
        # the smiling face, registered on the rigid points, in the neutral photo: everything
        # outside the edit region stays the neutral photo's (the sitter's shoulders and the
        # lighting move between two shots), so the expression, not the registration, decides
        where = photo.region if photo.region is not None else oval
        composite = _blend(image, pair_image, feather(where, max(2.0, 0.05 * face.size_px)))
        edited, params = good_edit(
            composite, face, oval, rng, donor.face_lab if donor is not None else None, photo.region, shape_donor
        )
        params["registration"] = registration
    else:
        donor_lab = donor.face_lab if donor is not None else None
        edited, params = good_edit(image, face, oval, rng, donor_lab, photo.region, shape_donor)
        failure = None
        if label == "expression":
            failure = _expression(edited, face, oval, rng)
        elif label == "identity_swap":
            if donor is None:
                return None
            failure = _identity_swap(edited, face, oval, rng, (donor.image, donor.face, donor.name))
        elif label == "object_added":
            pool = donor.image if donor is not None else image[::-1, ::-1]
            failure = _object_added(edited, face, oval, rng, pool, photo.region)
        elif label == "text_added":
            failure = _text_added(edited, face, oval, rng, photo.region)
        elif label == "object_removed":
            failure = _object_removed(edited, face, oval, rng, photo.region)
        elif label == "body_skin":
            failure = _body_skin(edited, face, oval, rng, params, photo.region, image)
        elif label == "global_colour":
            failure = _global_colour(edited, face, oval, rng)
        elif label == "head_pose":
            failure = _head_pose(edited, face, oval, rng)
        elif label == "head_position":
            failure = _head_position(edited, face, oval, rng)
        elif label == "hair":
            failure = _hair(edited, face, oval, rng, photo.region)
        elif label != GOOD:
            raise ValueError(f"unknown corpus class {label!r}; known: {', '.join(CLASSES)}")
        if failure is not None:
            edited, extra = failure
            if edited is None:
                return None
            params.update(extra)
    if rerender:
        from counterfactory.generation.rerender import rerender_like

        edited = rerender_like(edited, edited.shape)
        params["rerendered"] = "taef2"
    output, jitter = editor_jitter(edited, rng)
    params["jitter"] = jitter
    return Case(
        case_id=f"{photo.name}:{label}:{index}",
        photo=photo.name,
        label=label,
        split=split,
        source=image,
        output=output,
        face_mask=oval,
        face_size_px=face.size_px,
        params=params,
    )
