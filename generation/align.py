"""Align an editor's output to its source before anything is measured.

Editors do not return pixel-aligned images: the diffusers Qwen-Image-Edit pipelines resize to
about 1 MP in multiples of 16 or 32 and can shift or zoom content slightly (QwenLM/Qwen-Image
issues 160 and 229); Nano Banana returns fixed sizes per aspect ratio. Every candidate goes
through the same four steps:

1. resize back to the source size;
2. register to the source on the region that should not have changed (everything outside a
   dilated edit region): SIFT matches with RANSAC give a robust similarity (or affine)
   estimate, refined to sub-pixel accuracy by ECC image alignment (Evangelidis & Psarakis,
   "Parametric Image Alignment Using Enhanced Correlation Coefficient Maximization",
   IEEE TPAMI 2008) restricted to that region;
3. warp the candidate into the source frame;
4. composite in pixel space where the design asks: outside the edit mask the source pixels
   are copied exactly (limb cells always; face cells when ``composite`` says so).

A registration that fails is a value (``Alignment.ok`` False with a reason code), never an
exception.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import cv2
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from counterfactory.generation.masks import dilate, feather

Kind = Literal["face", "limb"]

#: longest side, in pixels, of the copies keypoints are detected on
FEATURE_MAX_SIDE = 1024


class AlignConfig(BaseModel):
    """``align`` in the spec."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["similarity", "affine", "none"] = "similarity"
    #: ``auto``: composite limb cells inside their mask, leave face cells as warped.
    composite: Literal["auto", "mask", "none"] = "auto"
    #: Grow the edit region by this fraction of the face size (face cells) or these pixels
    #: (limb cells) before keeping it out of registration: edits spill over mask edges.
    exclude_face_frac: float = Field(0.35, ge=0)
    exclude_limb_px: int = Field(12, ge=0)
    #: Face composites: the face mask is grown by this fraction of the face size, then feathered.
    face_composite_grow_frac: float = Field(0.15, ge=0)
    feather_px: float = Field(4.0, ge=0)
    max_residual_px: float = Field(2.0, gt=0)
    max_scale_change: float = Field(0.25, gt=0)
    max_rotation_deg: float = Field(15.0, gt=0)
    max_shift_frac: float = Field(0.15, gt=0)


@dataclass(frozen=True)
class Alignment:
    """The result of aligning one candidate.

    Attributes:
        ok: False when registration failed or fell outside its bounds; ``image`` is then the
            resized, unwarped candidate (or None when even that was impossible).
        image: ``(H, W, 3)`` uint8 RGB in the source frame.
        transform: ``(2, 3)`` float64 map from source pixel coordinates to coordinates of the
            candidate after its resize to the source size (identity when ``method`` is none).
        resize_from: ``(w, h)`` of the candidate as the editor returned it.
        residual_px: RMS distance in pixels between matched keypoints after the final
            transform (None with fewer than 8 matches).
        photometric_residual: mean absolute difference in [0, 1] over the registration region
            after warping.
        composited: whether pixels outside the edit region were copied from the source.
        reason: a stable code (``align_...``) and a detail when not ok.
    """

    ok: bool
    image: np.ndarray | None
    transform: np.ndarray = field(default_factory=lambda: np.eye(2, 3))
    resize_from: tuple[int, int] = (0, 0)
    residual_px: float | None = None
    photometric_residual: float | None = None
    matches: int = 0
    composited: bool = False
    reason: str | None = None

    def record(self) -> dict:
        """JSON-ready summary for the ledger and the manifest."""
        scale, rot = similarity_params(self.transform)
        return {
            "ok": self.ok,
            "transform": np.round(self.transform, 6).tolist(),
            "scale": round(scale, 6),
            "rotation_deg": round(rot, 4),
            "shift_px": [round(float(self.transform[0, 2]), 3), round(float(self.transform[1, 2]), 3)],
            "resize_from": list(self.resize_from),
            "residual_px": None if self.residual_px is None else round(self.residual_px, 4),
            "photometric_residual": None if self.photometric_residual is None else round(self.photometric_residual, 6),
            "matches": self.matches,
            "composited": self.composited,
            "reason": self.reason,
        }


def similarity_params(transform: np.ndarray) -> tuple[float, float]:
    """``(scale, rotation_deg)`` of the linear part of a 2x3 transform."""
    a = np.asarray(transform, dtype=np.float64)[:, :2]
    scale = math.sqrt(abs(np.linalg.det(a)))
    rot = math.degrees(math.atan2(a[1, 0] - a[0, 1], a[0, 0] + a[1, 1]))
    return scale, rot


def resize_to(image: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Resize ``image`` to ``shape`` ``(H, W)``: area filter when shrinking, cubic when growing."""
    h, w = shape
    if image.shape[:2] == (h, w):
        return image
    shrinking = image.shape[0] * image.shape[1] > h * w
    return cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_CUBIC)


def _grey(image: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)


def _closest_similarity(affine: np.ndarray) -> np.ndarray:
    """Project a 2x3 affine onto the nearest similarity (Frobenius norm of the linear part)."""
    a = affine[:, :2]
    # similarity linear part is [[p, -q], [q, p]]; least squares gives:
    p = (a[0, 0] + a[1, 1]) / 2.0
    q = (a[1, 0] - a[0, 1]) / 2.0
    out = affine.copy()
    out[:, :2] = [[p, -q], [q, p]]
    return out


def _feature_estimate(
    src_grey: np.ndarray, cand_grey: np.ndarray, region: np.ndarray, method: str
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """Robust initial transform from SIFT matches inside ``region``.

    Returns ``(transform or None, source points, candidate points)`` of the RANSAC inliers.
    """
    # Keypoints only seed ECC, which refines at full resolution: find them on a copy of at
    # most FEATURE_MAX_SIDE px, where SIFT is several times faster on large photos.
    f = min(1.0, FEATURE_MAX_SIDE / max(src_grey.shape))
    if f < 1.0:
        size = (round(src_grey.shape[1] * f), round(src_grey.shape[0] * f))
        src_grey = cv2.resize(src_grey, size, interpolation=cv2.INTER_AREA)
        cand_grey = cv2.resize(cand_grey, size, interpolation=cv2.INTER_AREA)
        region = cv2.resize(region, size, interpolation=cv2.INTER_NEAREST)
    sift = cv2.SIFT_create(nfeatures=2000)
    kp1, d1 = sift.detectAndCompute(src_grey, region)
    kp2, d2 = sift.detectAndCompute(cand_grey, region)
    empty = np.zeros((0, 2), np.float32)
    if d1 is None or d2 is None or len(kp1) < 8 or len(kp2) < 8:
        return None, empty, empty
    pairs = cv2.BFMatcher(cv2.NORM_L2).knnMatch(d1, d2, k=2)
    good = [m for m, *rest in pairs if rest and m.distance < 0.75 * rest[0].distance]
    if len(good) < 8:
        return None, empty, empty
    p1 = np.float32([kp1[m.queryIdx].pt for m in good]) / f
    p2 = np.float32([kp2[m.trainIdx].pt for m in good]) / f
    estimate = cv2.estimateAffine2D if method == "affine" else cv2.estimateAffinePartial2D
    t, inliers = estimate(p1, p2, method=cv2.RANSAC, ransacReprojThreshold=3.0, maxIters=4000)
    if t is None or inliers is None or int(inliers.sum()) < 8:
        return None, empty, empty
    keep = inliers.ravel().astype(bool)
    return t.astype(np.float64), p1[keep], p2[keep]


def _ecc_refine(src_grey: np.ndarray, cand_grey: np.ndarray, region: np.ndarray, init: np.ndarray) -> np.ndarray | None:
    """Sub-pixel refinement by ECC (affine motion), coarse to fine; None if it diverges."""
    warp = init.astype(np.float32)
    h, w = src_grey.shape
    levels = max(0, int(math.floor(math.log2(max(h, w) / 400.0))))
    for level in range(levels, -1, -1):
        f = 1.0 / (2**level)
        if level:
            s = cv2.resize(src_grey, None, fx=f, fy=f, interpolation=cv2.INTER_AREA)
            c = cv2.resize(cand_grey, None, fx=f, fy=f, interpolation=cv2.INTER_AREA)
            m = cv2.resize(region, (s.shape[1], s.shape[0]), interpolation=cv2.INTER_NEAREST)
        else:
            s, c, m = src_grey, cand_grey, region
        scaled = warp.copy()
        scaled[:, 2] *= f
        iterations = 60 if level == levels else 30
        criteria = (cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, iterations, 1e-6)
        try:
            _, scaled = cv2.findTransformECC(
                s.astype(np.float32), c.astype(np.float32), scaled, cv2.MOTION_AFFINE, criteria, m, 5
            )
        except cv2.error:
            return None
        warp = scaled.copy()
        warp[:, 2] /= f
    return warp.astype(np.float64)


def _rms_reprojection(t: np.ndarray, p_src: np.ndarray, p_cand: np.ndarray) -> float | None:
    if len(p_src) < 8:
        return None
    projected = p_src @ t[:, :2].T + t[:, 2]
    return float(np.sqrt(np.mean(np.sum((projected - p_cand) ** 2, axis=1))))


def _within_bounds(t: np.ndarray, shape: tuple[int, int], config: AlignConfig) -> str | None:
    scale, rot = similarity_params(t)
    h, w = shape
    if abs(scale - 1.0) > config.max_scale_change:
        return f"scale {scale:.3f} is outside 1 ± {config.max_scale_change}"
    if abs(rot) > config.max_rotation_deg:
        return f"rotation {rot:.1f}° exceeds {config.max_rotation_deg}°"
    centre = np.array([w / 2.0, h / 2.0])
    moved = t[:, :2] @ centre + t[:, 2] - centre
    if abs(moved[0]) > config.max_shift_frac * w or abs(moved[1]) > config.max_shift_frac * h:
        return f"shift ({moved[0]:.1f}, {moved[1]:.1f}) px exceeds {config.max_shift_frac:.0%} of the image"
    return None


def exclusion_region(
    shape: tuple[int, int],
    *,
    kind: Kind,
    mask: np.ndarray | None,
    face_size_px: float | None,
    config: AlignConfig,
) -> np.ndarray:
    """``(H, W)`` uint8 {0, 255}: where registration may look (255 = should not have changed)."""
    region = np.full(shape, 255, np.uint8)
    if mask is None or not mask.any():
        return region
    if kind == "face":
        grow = int(round(config.exclude_face_frac * (face_size_px or 0.0)))
    else:
        grow = config.exclude_limb_px
    region[dilate(mask, grow) > 0] = 0
    return region


def composite_alpha(mask: np.ndarray, *, feather_px: float, grow_px: int = 0) -> np.ndarray:
    """Blend weights for a pixel-space composite: ``(H, W)`` float32 in [0, 1].

    The mask is grown by ``grow_px`` and then feathered *inward only*: weights are exactly 0
    everywhere outside the (grown) mask, so the source survives there bit for bit.
    """
    return feather(dilate(mask, grow_px), feather_px)


def composite(source: np.ndarray, candidate: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """``alpha * candidate + (1 - alpha) * source``, with the source copied exactly where alpha is 0."""
    a = alpha[..., None].astype(np.float32)
    out = np.rint(a * candidate.astype(np.float32) + (1.0 - a) * source.astype(np.float32))
    out = out.clip(0, 255).astype(np.uint8)
    outside = alpha <= 0
    out[outside] = source[outside]
    return out


def register(
    source: np.ndarray,
    candidate: np.ndarray,
    region: np.ndarray,
    *,
    method: Literal["similarity", "affine"] = "similarity",
) -> tuple[np.ndarray | None, float | None, int, str | None]:
    """Estimate the map from source to candidate coordinates on ``region``.

    Args:
        source, candidate: ``(H, W, 3)`` uint8 RGB of equal size.
        region: ``(H, W)`` uint8, non-zero where the two should agree.

    Returns:
        ``(transform 2x3 or None, residual_px, matches, failure reason)``.
    """
    s, c = _grey(source), _grey(candidate)
    if float(c.std()) < 1.0:
        return None, None, 0, "align_candidate_blank: the candidate has no texture to register"
    init, p_src, p_cand = _feature_estimate(s, c, region, method)
    start = init if init is not None else np.eye(2, 3)
    refined = _ecc_refine(s, c, region, start)
    if refined is None and init is None:
        return None, None, 0, "align_registration_failed: no keypoint matches and ECC did not converge"
    t = refined if refined is not None else init
    if method == "similarity":
        t = _closest_similarity(t)
    return t, _rms_reprojection(t, p_src, p_cand), len(p_src), None


def align_candidate(
    source: np.ndarray,
    candidate: np.ndarray,
    *,
    mask: np.ndarray | None = None,
    kind: Kind = "face",
    face_size_px: float | None = None,
    config: AlignConfig | None = None,
) -> Alignment:
    """Resize, register, warp and (where configured) composite one candidate.

    Args:
        source: ``(H, W, 3)`` uint8 RGB.
        candidate: ``(h, w, 3)`` uint8 RGB as the editor returned it, any size.
        mask: ``(H, W)`` uint8 {0, 255}: the region the study varies (face mask for face
            cells, limb mask for limb cells). It is kept out of registration and, when
            compositing, is the only place the candidate's pixels survive.
        kind: ``"face"`` or ``"limb"``; limb cells are always composited (``auto``).
        face_size_px: face size used to grow the exclusion and composite masks of face cells
            (defaults to the square root of the mask's area).
        config: alignment options.

    Returns:
        An :class:`Alignment`; ``ok`` False with a reason code instead of raising.
    """
    config = config or AlignConfig()
    if source.ndim != 3 or source.shape[2] != 3 or source.dtype != np.uint8:
        raise ValueError(f"source must be (H, W, 3) uint8, got {source.shape} {source.dtype}")
    if candidate is None or candidate.ndim != 3 or candidate.shape[2] != 3:
        shape = None if candidate is None else candidate.shape
        return Alignment(ok=False, image=None, reason=f"align_bad_candidate: shape {shape}, expected (h, w, 3)")
    if candidate.dtype != np.uint8:
        return Alignment(ok=False, image=None, reason=f"align_bad_candidate: dtype {candidate.dtype}, expected uint8")
    h, w = source.shape[:2]
    resize_from = (int(candidate.shape[1]), int(candidate.shape[0]))
    resized = resize_to(candidate, (h, w))
    if mask is not None and mask.shape != (h, w):
        raise ValueError(f"mask shape {mask.shape} does not match source {(h, w)}")
    if face_size_px is None and mask is not None:
        face_size_px = math.sqrt(float((mask > 0).sum()))

    # where the two should agree: registration looks only there, and the residual is read there
    region = exclusion_region((h, w), kind=kind, mask=mask, face_size_px=face_size_px, config=config)
    if config.method == "none":
        t, residual, matches, failure = np.eye(2, 3), None, 0, None
    else:
        t, residual, matches, failure = register(source, resized, region, method=config.method)
        if failure is None and t is not None:
            out_of_bounds = _within_bounds(t, (h, w), config)
            if out_of_bounds:
                failure = f"align_transform_out_of_bounds: {out_of_bounds}"
        if failure is None and residual is not None and residual > config.max_residual_px:
            failure = f"align_residual_above_max: {residual:.2f} px > {config.max_residual_px} px"
    if failure is not None or t is None:
        return Alignment(
            ok=False,
            image=resized,
            transform=np.eye(2, 3) if t is None else t,
            resize_from=resize_from,
            residual_px=residual,
            matches=matches,
            reason=failure,
        )

    if np.allclose(t, np.eye(2, 3), atol=1e-9):
        warped = resized.copy()
    else:
        warped = cv2.warpAffine(
            resized,
            t,
            (w, h),
            flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
            borderMode=cv2.BORDER_REPLICATE,
        )
    keep = region > 0
    photometric = (
        float(np.abs(warped.astype(np.float32) - source.astype(np.float32))[keep].mean() / 255.0)
        if keep.any()
        else None
    )

    do_composite = config.composite == "mask" or (config.composite == "auto" and kind == "limb")
    if do_composite and mask is None:
        return Alignment(
            ok=False,
            image=warped,
            transform=t,
            resize_from=resize_from,
            residual_px=residual,
            photometric_residual=photometric,
            matches=matches,
            reason="align_no_mask: compositing needs the cell's edit mask",
        )
    if do_composite:
        grow = int(round(config.face_composite_grow_frac * (face_size_px or 0.0))) if kind == "face" else 0
        alpha = composite_alpha(mask, feather_px=config.feather_px, grow_px=grow)
        warped = composite(source, warped, alpha)
    return Alignment(
        ok=True,
        image=warped,
        transform=t,
        resize_from=resize_from,
        residual_px=residual,
        photometric_residual=photometric,
        matches=matches,
        composited=do_composite,
    )
