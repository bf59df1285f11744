"""Locality gate: did the pixels change only where the study varies them?

FOCUS's measure: the mean absolute pixel difference, with pixels in [0, 1] and averaged over
the three channels, inside the face mask (``diff_face``) and outside it (``diff_nonface``),
and their ratio. Over FOCUS's 480 edits: mean diff_face 0.141, mean diff_nonface 0.022,
median ratio 8.16. Limb cells (InclusiveCFImageBias) keep every pixel outside the limb mask:
``diff_outside_edit`` is 0 after compositing, and the face (outside the limb mask) must not
drift (``diff_face_drift``).

The face mask is the source's MediaPipe face mesh, drawn as the full oval or as skin without
hair, eyes, brows and lips (``gates.face_mask``); the choice is recorded as ``mask_mode``.
What ``skin`` mode cuts out of the face (eyes, brows, lips, upper forehead) is neither face
nor non-face for the ratio: FOCUS's split is the face against everything *outside the oval*,
so ``diff_nonface`` is always measured outside the oval.

Means over a large area hide local and global failures, so face edits are also judged by:

- ``changed_share``: the share of pixels away from the face (outside the oval grown by
  :data:`FACE_MARGIN_FRAC` of the face size, and :data:`BORDER_FRAC` in from the image edge,
  where registration resamples) whose smoothed difference exceeds :data:`LOCAL_CHANGE_LEVEL`.
  An added or removed object or text is local and large; noise is neither after smoothing.
- ``global_shift`` and ``global_gain_change``: the largest per-channel median signed
  difference, and the largest per-channel change of spread (std ratio minus 1), outside the
  face: a colour cast, white balance or contrast change moves these, resampling noise does not.
- ``body_skin_delta_e``: CIELAB colour difference (CIE76, of the mean change) over the
  person's skin outside the head (the selfie segmenter's person minus the grown oval, pixels
  whose source colour is close to the face's skin): skin lightened on neck and hands.

When the caller hands the registered output before compositing (``raw_candidate``) and the
editor's output as returned (``unregistered``), the same figures are reported for the raw
edit (``raw_*``) and FOCUS-comparable ones (``focus_diff_face``, ``focus_diff_nonface``,
``focus_ratio``: the unregistered output resized to the source's size, no registration), so a
release can be set beside FOCUS's 0.141 / 0.022 / 8.16.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from counterfactory.generation.masks import dilate
from counterfactory.manifests.registry import GATES
from counterfactory.validation.faces import face_mask as draw_face_mask
from counterfactory.validation.gates.base import GateResult, PairContext, finite_or_none

#: Denominator floor of ``ratio``: 1e-4 is a fortieth of one grey level (1/255) on average,
#: so a composite that leaves every non-face pixel untouched still has a finite ratio.
RATIO_FLOOR = 1e-4
#: A pixel is "changed" when its smoothed mean absolute difference exceeds this, in [0, 1]
#: (20 grey levels): far above JPEG and resampling noise once smoothed, below a pasted object.
LOCAL_CHANGE_LEVEL = 20.0 / 255.0
#: Gaussian smoothing of the difference, sigma as a fraction of sqrt(H * W) (5 px at 1 MP).
SMOOTH_FRAC = 0.005
#: The face region grown by this fraction of the face size before measuring outside it:
#: face edits are feathered across the oval's edge.
FACE_MARGIN_FRAC = 0.10
#: Band along the image edge left out of ``changed_share`` and the global measures, as a
#: fraction of the shorter side: registration replicates border pixels there.
BORDER_FRAC = 0.02
#: Body skin: a source pixel is skin when its CIELAB a*b* lies within this distance of the
#: face skin's median and its L* within :data:`SKIN_L_RANGE`.
SKIN_AB_DISTANCE = 10.0
SKIN_L_RANGE = 30.0
#: Fewer skin pixels outside the head than this share of the image: body skin not measured.
MIN_BODY_SKIN_FRAC = 0.002


class LocalityGateConfig(BaseModel):
    """Locality thresholds (``gates.<kind>.locality`` in the spec); None: not judged.

    All differences are mean absolute pixel differences in [0, 1] averaged over channels.
    """

    model_config = ConfigDict(extra="forbid")

    max_diff_nonface: float | None = Field(None, ge=0.0, le=1.0, description="face edits: outside the face")
    min_diff_face: float | None = Field(
        None, ge=0.0, le=1.0, description="face edits: below this the face is unchanged (sent to review)"
    )
    min_ratio: float | None = Field(None, ge=0.0, description="face edits: diff_face / diff_nonface")
    max_diff_outside_edit: float | None = Field(
        None, ge=0.0, le=1.0, description="limb edits: outside the limb mask (0 after compositing)"
    )
    max_diff_face_drift: float | None = Field(
        None, ge=0.0, le=1.0, description="limb edits: inside the face, outside the limb mask"
    )
    min_diff_inside_edit: float | None = Field(
        None, ge=0.0, le=1.0, description="limb edits: below this the limb region is unchanged (not an edit)"
    )
    max_changed_share: float | None = Field(
        None, ge=0.0, le=1.0, description="face edits: share of pixels away from the face changed visibly"
    )
    max_global_shift: float | None = Field(
        None, ge=0.0, le=1.0, description="face edits: largest per-channel median signed change outside the face"
    )
    max_global_gain_change: float | None = Field(
        None, ge=0.0, description="face edits: largest per-channel |std ratio - 1| outside the face"
    )
    max_body_skin_delta_e: float | None = Field(
        None, ge=0.0, description="face edits: CIELAB change of the person's skin outside the head"
    )


def binary_mask(mask: np.ndarray) -> np.ndarray:
    """``(H, W)`` uint8 {0, 255} from any ``(H, W)`` mask (bool, {0, 1}, {0, 255}, float)."""
    m = np.asarray(mask)
    if m.dtype == np.uint8:
        return np.where(m > 0, np.uint8(255), np.uint8(0))
    return np.where(np.nan_to_num(m.astype(np.float64)) > 0, np.uint8(255), np.uint8(0))


def mean_abs_diff(diff: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Mean of an ``(H, W, 3)`` uint8 absolute difference over ``mask``'s pixels, in [0, 1].

    Averages the three channels and the masked pixels equally (FOCUS's definition);
    NaN when the mask is empty.
    """
    if mask is not None and cv2.countNonZero(mask) == 0:
        return float("nan")
    means = cv2.mean(diff, mask=mask)[:3]
    return float(sum(means) / 3.0 / 255.0)


def resize_to(image: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """``image`` resized to ``shape`` ``(H, W)`` as FOCUS compared outputs with sources (area
    averaging when shrinking, bicubic when enlarging); unchanged when already that size."""
    h, w = shape
    if image.shape[:2] == (h, w):
        return image
    shrinking = image.shape[0] * image.shape[1] > h * w
    return cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_CUBIC)


def away_from_face(face_mask: np.ndarray | None, shape: tuple[int, int], face_size_px: float) -> np.ndarray:
    """``(H, W)`` uint8 {0, 255}: outside the face grown by :data:`FACE_MARGIN_FRAC` of
    ``face_size_px`` and at least :data:`BORDER_FRAC` of the shorter side from the image edge."""
    h, w = shape
    region = np.full((h, w), 255, np.uint8)
    if face_mask is not None:
        region[dilate(face_mask, int(round(FACE_MARGIN_FRAC * face_size_px))) > 0] = 0
    b = int(math.ceil(BORDER_FRAC * min(h, w)))
    if b > 0:
        region[:b] = 0
        region[-b:] = 0
        region[:, :b] = 0
        region[:, -b:] = 0
    return region


def smoothed_diff(source: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """``(H, W)`` float32: mean absolute difference over channels in [0, 1], Gaussian-smoothed
    with sigma ``SMOOTH_FRAC * sqrt(H * W)`` pixels."""
    diff = cv2.absdiff(source, candidate).astype(np.float32).mean(axis=2) / 255.0
    sigma = SMOOTH_FRAC * math.sqrt(diff.shape[0] * diff.shape[1])
    return cv2.GaussianBlur(diff, (0, 0), sigmaX=max(sigma, 0.5))


def changed_share(source: np.ndarray, candidate: np.ndarray, region: np.ndarray) -> float | None:
    """Share in [0, 1] of ``region``'s pixels whose :func:`smoothed_diff` exceeds
    :data:`LOCAL_CHANGE_LEVEL`; None when the region is empty.

    A pasted square of side ``a`` (well above the smoothing sigma) whose difference is twice
    the level crosses it at its own edge: the share is ``a**2 / area(region)``.
    """
    n = cv2.countNonZero(region)
    if n == 0:
        return None
    changed = (smoothed_diff(source, candidate) > LOCAL_CHANGE_LEVEL) & (region > 0)
    return float(np.count_nonzero(changed) / n)


def global_change(source: np.ndarray, candidate: np.ndarray, region: np.ndarray) -> tuple[float | None, float | None]:
    """``(shift, gain_change)`` over ``region``: the largest |median signed difference| of one
    channel in [0, 1], and the largest ``|std(candidate) / std(source) - 1|`` of one channel.

    A constant offset of ``d`` grey levels in one channel gives ``shift == d / 255``; scaling
    a channel's contrast by ``g`` about its mean gives ``gain_change == |g - 1|``.
    """
    keep = region > 0
    if not keep.any():
        return None, None
    # a fixed stride keeps this linear and cheap on large photos; the statistics are global
    step = max(1, int(math.ceil(math.sqrt(np.count_nonzero(keep) / 40_000))))
    src = source[::step, ::step][keep[::step, ::step]].astype(np.float32)
    cand = candidate[::step, ::step][keep[::step, ::step]].astype(np.float32)
    shift = float(np.max(np.abs(np.median(cand - src, axis=0)))) / 255.0
    s_std = src.std(axis=0)
    c_std = cand.std(axis=0)
    ok = s_std > 1.0
    gain = float(np.max(np.abs(c_std[ok] / s_std[ok] - 1.0))) if ok.any() else None
    return shift, gain


def to_lab(image: np.ndarray) -> np.ndarray:
    """``(H, W, 3)`` float32 CIELAB (L* in [0, 100], a* b* signed) of uint8 sRGB (D65)."""
    return cv2.cvtColor(image.astype(np.float32) / 255.0, cv2.COLOR_RGB2Lab)


def body_skin_drift(
    source: np.ndarray,
    candidate: np.ndarray,
    face_mask: np.ndarray,
    person_mask: np.ndarray,
    face_size_px: float,
) -> tuple[float | None, float]:
    """``(delta_e, area_frac)``: CIELAB change of the person's skin outside the head.

    Skin reference: the median L*a*b* of the source inside ``face_mask`` (eroded by a tenth
    of the face to keep off hair and background). Body skin: pixels of ``person_mask``
    outside the face grown by :data:`FACE_MARGIN_FRAC` whose source a*b* lie within
    :data:`SKIN_AB_DISTANCE` of the reference and L* within :data:`SKIN_L_RANGE`.
    ``delta_e`` is the Euclidean norm of the mean ``candidate - source`` L*a*b* over them
    (CIE76 of the average change); None when they cover less than :data:`MIN_BODY_SKIN_FRAC`.
    """
    h, w = source.shape[:2]
    core = cv2.erode(face_mask, _DISC3, iterations=max(1, int(face_size_px * 0.05)))
    if cv2.countNonZero(core) == 0:
        core = face_mask
    ref = np.median(_lab_at(source, core > 0), axis=0)
    grown = dilate(face_mask, int(round(FACE_MARGIN_FRAC * face_size_px)))
    body = (person_mask > 0) & (grown == 0)
    # only the person's pixels are converted: CIELAB of a whole photo costs more than the rest
    src_lab = _lab_at(source, body)
    ab = np.linalg.norm(src_lab[:, 1:] - ref[1:], axis=1)
    skin = (ab <= SKIN_AB_DISTANCE) & (np.abs(src_lab[:, 0] - ref[0]) <= SKIN_L_RANGE)
    frac = float(np.count_nonzero(skin) / (h * w))
    if frac < MIN_BODY_SKIN_FRAC:
        return None, frac
    change = (_lab_at(candidate, body)[skin] - src_lab[skin]).mean(axis=0)
    return float(np.linalg.norm(change)), frac


_DISC3 = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (3, 3))


def _lab_at(image: np.ndarray, where: np.ndarray) -> np.ndarray:
    """``(N, 3)`` float32 CIELAB of ``image``'s pixels where ``where`` is True."""
    pixels = image[where].reshape(-1, 1, 3)
    if pixels.shape[0] == 0:
        return np.zeros((0, 3), np.float32)
    return to_lab(pixels).reshape(-1, 3)


def locality_metrics(
    source: np.ndarray,
    candidate: np.ndarray,
    face_mask: np.ndarray | None,
    edit_mask: np.ndarray | None = None,
    covered: np.ndarray | None = None,
    *,
    oval_mask: np.ndarray | None = None,
) -> dict[str, float | None]:
    """The locality measurements of one aligned pair.

    Args:
        source, candidate: ``(H, W, 3)`` uint8, same shape.
        face_mask: ``(H, W)`` {0, 255} face region of the source, or None.
        edit_mask: ``(H, W)`` {0, 255} limb region, or None.
        covered: ``(H, W)`` bool, the part of the frame the editor's output covers; every
            region is cut to it (pixels outside are not the editor's). None: all of it.
        oval_mask: the full face oval when ``face_mask`` is a smaller (``skin``) mask:
            ``diff_nonface`` is then measured outside the oval (FOCUS's split), so eyes,
            brows and lips never count as non-face. None: outside ``face_mask``.

    Returns: ``diff_all``, ``diff_face``, ``diff_nonface``, ``ratio`` (``diff_face /
    max(diff_nonface, RATIO_FLOOR)``), ``face_area_frac``, and with an edit mask
    ``diff_outside_edit``, ``diff_inside_edit``, ``diff_face_drift`` (face minus edit mask),
    ``edit_area_frac``, and ``covered_share``. Values that cannot be measured (an empty
    region) are None.
    """
    diff = cv2.absdiff(source, candidate)
    n = source.shape[0] * source.shape[1]
    cov = None if covered is None else covered.astype(np.uint8) * 255

    def within(mask: np.ndarray) -> np.ndarray:
        return mask if cov is None else cv2.bitwise_and(mask, cov)

    def outside(mask: np.ndarray) -> np.ndarray:
        return within(cv2.bitwise_not(mask))

    out: dict[str, float | None] = {
        "diff_all": finite_or_none(mean_abs_diff(diff, cov)),
        "covered_share": 1.0 if cov is None else cv2.countNonZero(cov) / n,
    }
    if face_mask is not None:
        nonface = outside(oval_mask if oval_mask is not None else face_mask)
        face_mask = within(face_mask)
        d_face = mean_abs_diff(diff, face_mask)
        d_non = mean_abs_diff(diff, nonface)
        out["diff_face"] = finite_or_none(d_face)
        out["diff_nonface"] = finite_or_none(d_non)
        out["ratio"] = (
            finite_or_none(d_face / max(d_non, RATIO_FLOOR)) if math.isfinite(d_face) and math.isfinite(d_non) else None
        )
        out["face_area_frac"] = cv2.countNonZero(face_mask) / n
    else:
        out.update(diff_face=None, diff_nonface=None, ratio=None, face_area_frac=0.0)
    if edit_mask is not None:
        out["diff_outside_edit"] = finite_or_none(mean_abs_diff(diff, outside(edit_mask)))
        out["diff_inside_edit"] = finite_or_none(mean_abs_diff(diff, within(edit_mask)))
        out["edit_area_frac"] = cv2.countNonZero(edit_mask) / n
        out["diff_face_drift"] = (
            finite_or_none(mean_abs_diff(diff, cv2.bitwise_and(face_mask, cv2.bitwise_not(edit_mask))))
            if face_mask is not None
            else None
        )
    return out


def _face_measures(
    source: np.ndarray,
    candidate: np.ndarray,
    oval: np.ndarray | None,
    person_mask: np.ndarray | None,
    face_size_px: float,
    prefix: str = "",
    covered: np.ndarray | None = None,
) -> dict[str, float | None]:
    region = away_from_face(oval, source.shape[:2], face_size_px)
    if covered is not None:
        region[~covered] = 0
        if person_mask is not None:
            person_mask = np.where(covered, person_mask, np.uint8(0))
    shift, gain = global_change(source, candidate, region)
    out: dict[str, float | None] = {
        f"{prefix}changed_share": finite_or_none(changed_share(source, candidate, region)),
        f"{prefix}global_shift": finite_or_none(shift),
        f"{prefix}global_gain_change": finite_or_none(gain),
    }
    skin, frac = (None, 0.0)
    if oval is not None and person_mask is not None:
        skin, frac = body_skin_drift(source, candidate, oval, person_mask, face_size_px)
    out[f"{prefix}body_skin_delta_e"] = finite_or_none(skin)
    if not prefix:
        out["body_skin_area_frac"] = frac
    return out


def locality_gate(
    pair: PairContext,
    *,
    max_diff_nonface: float | None = None,
    min_diff_face: float | None = None,
    min_ratio: float | None = None,
    max_diff_outside_edit: float | None = None,
    max_diff_face_drift: float | None = None,
    max_changed_share: float | None = None,
    max_global_shift: float | None = None,
    max_global_gain_change: float | None = None,
    max_body_skin_delta_e: float | None = None,
    min_diff_inside_edit: float | None = None,
) -> GateResult:
    """Judge where ``pair.candidate`` differs from ``pair.source``.

    Face edits (thresholds ``max_diff_nonface``, ``min_diff_face``, ``min_ratio``,
    ``max_changed_share``, ``max_global_shift``, ``max_global_gain_change``,
    ``max_body_skin_delta_e``): reject ``locality_nonface_diff_above_max``,
    ``locality_ratio_below_min`` (the change is not concentrated in the face),
    ``locality_changed_share_above_max`` (something appeared or vanished away from the face),
    ``locality_global_shift_above_max`` / ``locality_global_gain_above_max`` (colour cast,
    white balance, contrast), ``locality_body_skin_above_max`` (skin recoloured outside the
    head), ``locality_no_face_mask``; a face that did not change beyond ``min_diff_face``
    goes to review as ``locality_face_unchanged`` (its ratio is noise and is not judged).
    Limb edits (``max_diff_outside_edit``, ``max_diff_face_drift``): reject
    ``locality_no_edit_mask``, ``locality_edit_mask_shape_mismatch``,
    ``locality_outside_edit_diff_above_max``, ``locality_face_drift_above_max`` (judged only
    when the source shows a face), and ``locality_limb_unchanged`` when the limb region changed
    less than ``min_diff_inside_edit`` (a candidate that copies its source there is not an edit,
    whichever cue it was asked for).

    Metrics: :func:`locality_metrics` plus ``mask_mode``; with a source face also
    ``changed_share``, ``global_shift``, ``global_gain_change``, ``body_skin_delta_e``,
    ``body_skin_area_frac``; with ``pair.raw_candidate`` the ``raw_`` versions of the face
    figures; with ``pair.unregistered`` ``focus_diff_face``, ``focus_diff_nonface``,
    ``focus_ratio``. Judged figures are those of ``pair.candidate`` (what is released).
    """
    thresholds = {
        "max_diff_nonface": max_diff_nonface,
        "min_diff_face": min_diff_face,
        "min_ratio": min_ratio,
        "max_diff_outside_edit": max_diff_outside_edit,
        "max_diff_face_drift": max_diff_face_drift,
        "max_changed_share": max_changed_share,
        "max_global_shift": max_global_shift,
        "max_global_gain_change": max_global_gain_change,
        "max_body_skin_delta_e": max_body_skin_delta_e,
        "min_diff_inside_edit": min_diff_inside_edit,
        "ratio_floor": RATIO_FLOOR,
        "local_change_level": LOCAL_CHANGE_LEVEL,
    }
    reasons: list[str] = []
    review: list[str] = []
    edit_mask = pair.edit_mask
    if edit_mask is not None and edit_mask.shape[:2] != pair.source.shape[:2]:
        reasons.append("locality_edit_mask_shape_mismatch")
        edit_mask = None
    elif edit_mask is not None:
        edit_mask = binary_mask(edit_mask)
    face = pair.source_face
    oval = None
    if pair.face_mask is not None:
        oval = (
            draw_face_mask(face.landmarks, pair.source.shape[:2], mode="oval")
            if pair.face_mask_mode != "oval" and face is not None
            else pair.face_mask
        )
    # the stack draws face masks as {0, 255} already; only caller-given edit masks are coerced
    m = locality_metrics(pair.source, pair.candidate, pair.face_mask, edit_mask, pair.covered, oval_mask=oval)
    metrics: dict = {"mask_mode": pair.face_mask_mode, **m}
    size = face.size_px if face is not None else 0.0
    if face is not None:
        metrics.update(_face_measures(pair.source, pair.candidate, oval, pair.person_mask, size, covered=pair.covered))
    raw = pair.raw_candidate
    if raw is not None and raw.shape == pair.source.shape:
        r = locality_metrics(pair.source, raw, pair.face_mask, edit_mask, pair.covered, oval_mask=oval)
        metrics.update({f"raw_{k}": r.get(k) for k in ("diff_face", "diff_nonface", "ratio", "diff_outside_edit")})
        if face is not None:
            metrics.update(
                _face_measures(pair.source, raw, oval, pair.person_mask, size, prefix="raw_", covered=pair.covered)
            )
    un = pair.unregistered
    if un is not None and pair.face_mask is not None and getattr(un, "ndim", 0) == 3 and un.shape[2] == 3:
        f = locality_metrics(
            pair.source, resize_to(np.asarray(un, np.uint8), pair.source.shape[:2]), pair.face_mask, oval_mask=oval
        )
        metrics.update(focus_diff_face=f["diff_face"], focus_diff_nonface=f["diff_nonface"], focus_ratio=f["ratio"])

    face_judged = any(
        t is not None
        for t in (
            max_diff_nonface,
            min_diff_face,
            min_ratio,
            max_changed_share,
            max_global_shift,
            max_global_gain_change,
            max_body_skin_delta_e,
        )
    )
    if face_judged:
        if m["diff_face"] is None or m["diff_nonface"] is None:
            reasons.append("locality_no_face_mask")
        else:
            if max_diff_nonface is not None and m["diff_nonface"] > max_diff_nonface:
                reasons.append("locality_nonface_diff_above_max")
            for key, bound, code in (
                ("changed_share", max_changed_share, "locality_changed_share_above_max"),
                ("global_shift", max_global_shift, "locality_global_shift_above_max"),
                ("global_gain_change", max_global_gain_change, "locality_global_gain_above_max"),
                ("body_skin_delta_e", max_body_skin_delta_e, "locality_body_skin_above_max"),
            ):
                value = metrics.get(key)
                if bound is not None and value is not None and value > bound:
                    reasons.append(code)
            unchanged = min_diff_face is not None and m["diff_face"] < min_diff_face
            if unchanged:
                review.append("locality_face_unchanged")
            elif min_ratio is not None and (m["ratio"] is None or m["ratio"] < min_ratio):
                reasons.append("locality_ratio_below_min")

    limb_judged = any(t is not None for t in (max_diff_outside_edit, max_diff_face_drift, min_diff_inside_edit))
    if limb_judged:
        if edit_mask is None:
            if "locality_edit_mask_shape_mismatch" not in reasons:
                reasons.append("locality_no_edit_mask")
        else:
            outside = m.get("diff_outside_edit")
            if max_diff_outside_edit is not None and outside is not None and outside > max_diff_outside_edit:
                reasons.append("locality_outside_edit_diff_above_max")
            drift = m.get("diff_face_drift")
            if max_diff_face_drift is not None and drift is not None and drift > max_diff_face_drift:
                reasons.append("locality_face_drift_above_max")
            inside = m.get("diff_inside_edit")
            if min_diff_inside_edit is not None and (inside is None or inside < min_diff_inside_edit):
                reasons.append("locality_limb_unchanged")
    return GateResult("locality", not reasons, metrics, tuple(reasons), tuple(review), thresholds)


class LocalityGate:
    """:func:`locality_gate` with its thresholds bound (no model: masks come with the pair)."""

    name = "locality"

    def __init__(self, config: LocalityGateConfig) -> None:
        self.config = config

    def __call__(self, pair: PairContext) -> GateResult:
        return locality_gate(pair, **self.config.model_dump())


GATES.register("locality", LocalityGateConfig, LocalityGate, order=40)
