"""Locality gate: did the pixels change only where the study varies them?

FOCUS's measure: the mean absolute pixel difference, with pixels in [0, 1] and averaged over
the three channels, inside the face mask (``diff_face``) and outside it (``diff_nonface``),
and their ratio. Over FOCUS's 480 edits: mean diff_face 0.141, mean diff_nonface 0.022,
median ratio 8.16. Limb cells (InclusiveCFImageBias) keep every pixel outside the limb mask:
``diff_outside_edit`` is 0 after compositing, and the face (outside the limb mask) must not
drift (``diff_face_drift``).

The face mask is the source's MediaPipe face mesh, drawn as the full oval or as skin without
hair, eyes, brows and lips (``gates.face_mask``); the choice is recorded as ``mask_mode``.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from counterfactory.validation.gates.base import GateResult, PairContext, finite_or_none

#: Denominator floor of ``ratio``: 1e-4 is a fortieth of one grey level (1/255) on average,
#: so a composite that leaves every non-face pixel untouched still has a finite ratio.
RATIO_FLOOR = 1e-4


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


def locality_metrics(
    source: np.ndarray,
    candidate: np.ndarray,
    face_mask: np.ndarray | None,
    edit_mask: np.ndarray | None = None,
    covered: np.ndarray | None = None,
) -> dict[str, float | None]:
    """The locality measurements of one aligned pair.

    Args:
        source, candidate: ``(H, W, 3)`` uint8, same shape.
        face_mask: ``(H, W)`` {0, 255} face region of the source, or None.
        edit_mask: ``(H, W)`` {0, 255} limb region, or None.
        covered: ``(H, W)`` bool, the part of the frame the editor's output covers; every
            region is cut to it (pixels outside are not the editor's). None: all of it.

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
        nonface = outside(face_mask)
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


def locality_gate(
    pair: PairContext,
    *,
    max_diff_nonface: float | None = None,
    min_diff_face: float | None = None,
    min_ratio: float | None = None,
    max_diff_outside_edit: float | None = None,
    max_diff_face_drift: float | None = None,
    min_diff_inside_edit: float | None = None,
) -> GateResult:
    """Judge where ``pair.candidate`` differs from ``pair.source``.

    Face edits (thresholds ``max_diff_nonface``, ``min_diff_face``, ``min_ratio``): reject
    ``locality_nonface_diff_above_max``, ``locality_ratio_below_min`` (the change is not
    concentrated in the face), ``locality_no_face_mask``; a face that did not change beyond
    ``min_diff_face`` goes to review as ``locality_face_unchanged`` (its ratio is noise and is
    not judged). Limb edits (``max_diff_outside_edit``, ``max_diff_face_drift``): reject
    ``locality_no_edit_mask``, ``locality_edit_mask_shape_mismatch``,
    ``locality_outside_edit_diff_above_max``, ``locality_face_drift_above_max`` (judged only
    when the source shows a face), and ``locality_limb_unchanged`` when the limb region changed
    less than ``min_diff_inside_edit`` (a candidate that copies its source there is not an edit,
    whichever cue it was asked for). Metrics: :func:`locality_metrics` plus ``mask_mode``.
    """
    thresholds = {
        "max_diff_nonface": max_diff_nonface,
        "min_diff_face": min_diff_face,
        "min_ratio": min_ratio,
        "max_diff_outside_edit": max_diff_outside_edit,
        "max_diff_face_drift": max_diff_face_drift,
        "min_diff_inside_edit": min_diff_inside_edit,
        "ratio_floor": RATIO_FLOOR,
    }
    reasons: list[str] = []
    review: list[str] = []
    edit_mask = pair.edit_mask
    if edit_mask is not None and edit_mask.shape[:2] != pair.source.shape[:2]:
        reasons.append("locality_edit_mask_shape_mismatch")
        edit_mask = None
    elif edit_mask is not None:
        edit_mask = binary_mask(edit_mask)
    # the stack draws face masks as {0, 255} already; only caller-given edit masks are coerced
    m = locality_metrics(pair.source, pair.candidate, pair.face_mask, edit_mask, pair.covered)
    metrics: dict = {"mask_mode": pair.face_mask_mode, **m}

    face_judged = any(t is not None for t in (max_diff_nonface, min_diff_face, min_ratio))
    if face_judged:
        if m["diff_face"] is None or m["diff_nonface"] is None:
            reasons.append("locality_no_face_mask")
        else:
            if max_diff_nonface is not None and m["diff_nonface"] > max_diff_nonface:
                reasons.append("locality_nonface_diff_above_max")
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
