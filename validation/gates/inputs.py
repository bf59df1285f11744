"""Input check: are source and candidate images a gate can measure at all?

Runs before the models. A candidate of another size or aspect (not aligned), a wrong layout
or dtype, or non-finite values reject the pair with an ``input_*`` reason instead of raising;
a flat candidate (one grey level everywhere: a blank, grey or black output) is measured by
the other gates too but rejected here as ``input_candidate_flat``.
"""

from __future__ import annotations

import cv2
import numpy as np

from counterfactory.validation.gates.base import GateResult

#: A candidate whose per-channel standard deviation is below this (grey levels) is flat.
FLAT_STD = 1.0


def _shape(a: object) -> str:
    shape = getattr(a, "shape", None)
    return "x".join(str(int(s)) for s in shape) if shape is not None else type(a).__name__


def coerce_image(image: object, role: str) -> tuple[np.ndarray | None, str | None]:
    """``(H, W, 3)`` uint8 RGB from ``image``, or ``(None, reason)``.

    Accepts uint8 RGB, and float RGB in [0, 1] (scaled to 0-255 and rounded). Reasons:
    ``input_<role>_missing``, ``input_<role>_not_rgb``, ``input_<role>_not_finite``,
    ``input_<role>_dtype_unsupported`` (float outside [0, 1], other dtypes), ``input_<role>_empty``.
    """
    if image is None:
        return None, f"input_{role}_missing"
    a = np.asarray(image)
    if a.ndim != 3 or a.shape[2] != 3:
        return None, f"input_{role}_not_rgb"
    if a.shape[0] == 0 or a.shape[1] == 0:
        return None, f"input_{role}_empty"
    if a.dtype == np.uint8:
        return a, None
    if np.issubdtype(a.dtype, np.floating):
        if not np.isfinite(a).all():
            return None, f"input_{role}_not_finite"
        lo, hi = float(a.min()), float(a.max())
        if lo < 0.0 or hi > 1.0:
            return None, f"input_{role}_dtype_unsupported"
        return np.round(a * 255.0).astype(np.uint8), None
    return None, f"input_{role}_dtype_unsupported"


def input_gate(
    source: object, candidate: object, *, edit_mask: object = None
) -> tuple[GateResult, np.ndarray | None, np.ndarray | None]:
    """Check and coerce one pair.

    Returns ``(result, source, candidate)``; the images are uint8 RGB when ``result`` allows
    measuring (no structural reason), else None. Metrics: ``source_shape``,
    ``candidate_shape`` (``"HxWxC"``), ``candidate_std`` (grey levels, mean over channels).
    """
    src, src_reason = coerce_image(source, "source")
    cand, cand_reason = coerce_image(candidate, "candidate")
    reasons = [r for r in (src_reason, cand_reason) if r]
    metrics: dict = {
        "source_shape": _shape(source),
        "candidate_shape": _shape(candidate),
        "candidate_std": None,
    }
    if src is not None and cand is not None and src.shape != cand.shape:
        reasons.append("input_shape_mismatch")
    if edit_mask is not None:
        mask = np.asarray(edit_mask)
        if src is not None and mask.shape[:2] != src.shape[:2]:
            reasons.append("input_edit_mask_shape_mismatch")
    measurable = not reasons
    if cand is not None:
        step = max(cand.shape[0] * cand.shape[1] // 65536, 1)
        # every step-th pixel, copied as 3-byte items (numpy copies 3-wide rows slowly)
        sample = np.ascontiguousarray(cand).reshape(-1).view("V3")[::step].copy().view(np.uint8).reshape(-1, 3)
        # population std per channel (numpy's std over a 3-wide last axis is slow)
        std = float(np.mean(cv2.meanStdDev(sample.reshape(-1, 1, 3))[1]))
        metrics["candidate_std"] = std
        if std < FLAT_STD:
            reasons.append("input_candidate_flat")
    result = GateResult("input", not reasons, metrics, tuple(reasons), thresholds={"flat_std": FLAT_STD})
    return result, (src if measurable else None), (cand if measurable else None)
