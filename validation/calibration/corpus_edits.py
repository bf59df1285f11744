"""The edits the failure corpus is made of (:mod:`counterfactory.validation.calibration.failures`
builds the cases from them): the building blocks (CIELAB shifts, smooth warps, placing a patch
away from the face), a good face-only edit in the corpus's edit region, each failure class put
on top of one, and the jitter and re-encoding a diffusion editor adds to whatever it returns.
Each takes an RGB image, the photo's face and face oval and a seeded generator, and returns the
edited image and the parameters it drew.
"""

from __future__ import annotations

import math
from typing import Any

import cv2
import numpy as np

from counterfactory.generation.masks import dilate, feather
from counterfactory.validation.faces import (
    LEFT_BROW,
    LIPS,
    MOUTH_LEFT_CORNER,
    MOUTH_RIGHT_CORNER,
    RIGHT_BROW,
    FaceObservation,
)
from counterfactory.validation.metrics.body_skin import body_skin_reference
from counterfactory.validation.metrics.pixels import to_lab
from counterfactory.validation.segment import get_person_segmenter

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
