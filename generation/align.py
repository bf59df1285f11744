"""Align an editor's output to its source before anything is measured.

Editors do not return pixel-aligned images: the diffusers Qwen-Image-Edit pipelines resize to
about 1 MP in multiples of 16 or 32 and can shift or zoom content slightly (QwenLM/Qwen-Image
issues 160 and 229); Nano Banana returns fixed sizes per aspect ratio. Every candidate goes
through the same four steps, on the output *as the editor returned it* (it is never stretched
to the source size first: a Nano Banana output cropped to fill 896x1152 would be distorted):

1. register the raw output to the source on the region that should not have changed
   (everything outside a dilated edit region): SIFT matches with RANSAC, then a uniform
   scale + translation fitted to the inliers (an axis-wise scale when the editor stretched
   the image), refined to sub-pixel accuracy by ECC image alignment (Evangelidis & Psarakis,
   "Parametric Image Alignment Using Enhanced Correlation Coefficient Maximization",
   IEEE TPAMI 2008) restricted to that region and run on band-passed copies (edges and
   texture, not the smooth tone a decoder and JPEG shift; :data:`BANDPASS_SIGMA_FRAC`). The
   registration is judged three ways: the keypoint matches it explains (RMS residual),
   its bounds, and the band-passed correlation over the region (a different photo that ECC
   settled on anyway scores under 0.25). The result is split into the editor's
   *frame* (how it resized: ``stretch`` to its size, uniform ``fill`` with a crop, or uniform
   ``fit`` with a border) and the editor's own motion in the source frame, which the
   ``method`` constrains (similarity or affine) and the bounds judge;
2. warp the raw output into the source frame in one resampling (after at most one uniform
   area-filtered shrink); the part of the frame the output does not cover is recorded as
   ``covered_share`` and filled from the source only where the cell is composited;
3. composite in pixel space where the design asks: outside the edit mask the source pixels
   are copied exactly (limb cells always; face cells when ``composite`` says so).

A registration that fails is a value (``Alignment.ok`` False with a reason code), never an
exception.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

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
    #: RMS keypoint reprojection error allowed, in pixels of the coarser of the two images: an
    #: editor that returns fewer pixels than the source (a 2204 px photo comes back at 1024 or
    #: 512) places its keypoints on its own grid, so the limit in source pixels grows by the
    #: source-to-output scale (2.0 px of a 512 px output is 8.6 px of a 2204 px source).
    max_residual_px: float = Field(2.0, gt=0)
    max_scale_change: float = Field(0.25, gt=0)
    max_rotation_deg: float = Field(15.0, gt=0)
    max_shift_frac: float = Field(0.15, gt=0)
    #: An output that covers less of the source's frame than this share (a crop to another
    #: aspect ratio) is rejected as ``align_coverage_below_min``; locality is measured over
    #: the covered part only.
    min_covered_share: float = Field(0.85, ge=0, le=1)
    #: A registered output whose band-passed grey correlates less than this with the source's
    #: over the region that should not have changed (:func:`registration_correlation`) is
    #: rejected as ``align_correlation_below_min``: the keypoints were too few to judge, and
    #: the image alignment settled on a photo that is not this one.
    min_correlation: float = Field(0.5, ge=-1, le=1)
    #: What fills the part of the source frame the output does not cover: ``auto`` the
    #: source's pixels where the cell is composited and black elsewhere (edge pixels stretched
    #: outward are not the editor's); ``source`` or ``black`` always.
    border: Literal["auto", "source", "black"] = "auto"


@dataclass(frozen=True)
class Alignment:
    """The result of aligning one candidate.

    Attributes:
        ok: False when registration failed or fell outside its bounds; ``image`` is then the
            resized, unwarped candidate (or None when even that was impossible).
        image: ``(H, W, 3)`` uint8 RGB in the source frame.
        transform: ``(2, 3)`` float64: the editor's own motion in the source frame, i.e. the
            map from source pixel coordinates to candidate coordinates once the editor's
            ``frame`` is undone (identity when the editor only resized; ``method`` none).
        resize_from: ``(w, h)`` of the candidate as the editor returned it.
        frame: how the editor framed its output: ``same`` size, ``stretch`` (resized to
            ``resize_from`` axis by axis), ``fill`` (uniform scale, cropped), ``fit`` (uniform
            scale, bordered).
        raw_transform: ``(2, 3)`` float64 map from source pixel coordinates to coordinates of the
            raw output (``frame`` composed with ``transform``).
        covered: ``(H, W)`` bool, where the raw output covers the source frame; None if unknown.
        covered_share: the share of the source frame the output covers, in [0, 1].
        residual_px: RMS distance in pixels between matched keypoints after the final
            transform (None with fewer than 8 matches).
        photometric_residual: mean absolute difference in [0, 1] over the registration region
            after warping.
        correlation: :func:`registration_correlation` over the registration region the
            output covers (None when unregistered or too small to measure).
        composited: whether pixels outside the edit region were copied from the source.
        reason: a stable code (``align_...``) and a detail when not ok.
        raw: ``(H, W, 3)`` uint8 the registered candidate *before* compositing, when
            ``composited`` (the gates report what the editor did outside the mask, which the
            composite hides); None otherwise (``image`` is then the registered candidate).
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
    frame: str = "same"
    raw_transform: np.ndarray = field(default_factory=lambda: np.eye(2, 3))
    covered: np.ndarray | None = None
    covered_share: float | None = None
    raw: np.ndarray | None = None
    correlation: float | None = None

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
            "frame": self.frame,
            "raw_transform": np.round(self.raw_transform, 6).tolist(),
            "covered_share": None if self.covered_share is None else round(self.covered_share, 6),
            "residual_px": None if self.residual_px is None else round(self.residual_px, 4),
            "photometric_residual": None if self.photometric_residual is None else round(self.photometric_residual, 6),
            "matches": self.matches,
            "correlation": None if self.correlation is None else round(self.correlation, 6),
            "composited": self.composited,
            "reason": self.reason,
        }


def similarity_params(transform: np.ndarray) -> tuple[float, float]:
    """``(scale, rotation_deg)`` of the linear part of a 2x3 transform."""
    a = np.asarray(transform, dtype=np.float64)[:, :2]
    scale = math.sqrt(abs(np.linalg.det(a)))
    rot = math.degrees(math.atan2(a[1, 0] - a[0, 1], a[0, 0] + a[1, 1]))
    return scale, rot


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


def _compose(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The 2x3 affine ``a`` after ``b`` (``x -> a(b(x))``)."""
    return (np.vstack([a, [0, 0, 1]]) @ np.vstack([b, [0, 0, 1]]))[:2]


def _invert(a: np.ndarray) -> np.ndarray:
    return cv2.invertAffineTransform(np.asarray(a, np.float64)).astype(np.float64)


def _axis_scale(sx: float, sy: float, tx: float = 0.0, ty: float = 0.0) -> np.ndarray:
    """The 2x3 map of an axis-wise resize by ``(sx, sy)`` (pixel centres at integers, as
    ``cv2.resize`` places them), then a shift by ``(tx, ty)``."""
    return np.array([[sx, 0.0, 0.5 * sx - 0.5 + tx], [0.0, sy, 0.5 * sy - 0.5 + ty]])


def editor_frames(source_shape: tuple[int, int], output_shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """How an editor may have put the source's frame into its ``(h, w)`` output.

    Returns ``{"stretch" | "fill" | "fit": 2x3 map from source to output pixel coordinates}``:
    ``stretch`` resizes each axis to the output (diffusers' multiples of 16 or 32), ``fill``
    scales uniformly to cover the output and crops the overflow evenly (Nano Banana's fixed
    sizes), ``fit`` scales uniformly to fit inside and leaves an even border. With the same
    aspect ratio the three coincide.
    """
    (hs, ws), (ho, wo) = source_shape[:2], output_shape[:2]
    sx, sy = wo / ws, ho / hs
    fill, fit = max(sx, sy), min(sx, sy)
    # uniform frames first: where the aspect ratios agree they win the tie
    return {
        "fill": _axis_scale(fill, fill, (wo - fill * ws) / 2.0, (ho - fill * hs) / 2.0),
        "fit": _axis_scale(fit, fit, (wo - fit * ws) / 2.0, (ho - fit * hs) / 2.0),
        "stretch": _axis_scale(sx, sy),
    }


def _split_frame(t: np.ndarray, source_shape, output_shape) -> tuple[str, np.ndarray, np.ndarray]:
    """``(frame name, frame map, editor motion)`` with ``t = frame o motion``.

    The editor's own motion is a similarity (a shift, a slight zoom, perhaps a turn), so the
    frame is the one that leaves the motion nearest a similarity; among frames that do so
    equally (same aspect ratio), the one whose motion is nearest the identity. Judging by
    nearness to the identity alone picks a uniform frame when a 1-2 % zoom happens to cancel
    part of a diffusers resize's anisotropy (multiples of 16), and projecting that motion onto
    a similarity then throws the anisotropy away: 2-4 px at the borders of a 512 px source.
    """
    if tuple(source_shape[:2]) == tuple(output_shape[:2]):
        return "same", np.eye(2, 3), t
    best = None
    for name, frame in editor_frames(source_shape, output_shape).items():
        motion = _compose(_invert(frame), t)
        a = motion[:, :2]
        # |a - nearest similarity| (Frobenius), in units of the motion's scale; registration
        # noise is ~1e-4, so anything below 1e-3 is taken as a similarity
        off_similarity = math.hypot(a[0, 0] - a[1, 1], a[0, 1] + a[1, 0]) / max(_scale_of(motion), 1e-9)
        distance = float(np.abs(a - np.eye(2)).sum())
        key = (round(off_similarity / 1e-3), distance)
        if best is None or key < best[0]:
            best = (key, name, frame, motion)
    assert best is not None
    return best[1], best[2], best[3]


def _shrink_uniformly(image: np.ndarray, factor: float) -> tuple[np.ndarray, np.ndarray]:
    """``image`` shrunk by one uniform ``factor`` < 1 with the area filter, and the 2x3 map from
    its pixel coordinates to the shrunk image's (the rounding of each side is accounted)."""
    h, w = image.shape[:2]
    nw, nh = max(1, round(w * factor)), max(1, round(h * factor))
    small = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_AREA)
    return small, _axis_scale(nw / w, nh / h)


def _detect(grey: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None, float]:
    """SIFT keypoints on a copy of at most ``FEATURE_MAX_SIDE`` px; returns (keypoint
    positions ``(N, 2)`` float32, descriptors, factor) with positions in the copy's pixels."""
    f = min(1.0, FEATURE_MAX_SIDE / max(grey.shape))
    if f < 1.0:
        size = (round(grey.shape[1] * f), round(grey.shape[0] * f))
        grey = cv2.resize(grey, size, interpolation=cv2.INTER_AREA)
        if mask is not None:
            mask = cv2.resize(mask, size, interpolation=cv2.INTER_NEAREST)
    keypoints, descriptors = cv2.SIFT_create(nfeatures=2000).detectAndCompute(grey, mask)
    points = np.float32([k.pt for k in keypoints]).reshape(-1, 2)
    return points, descriptors, f


class _Recent:
    """The last few values of an expensive function of one source, by the sha256 of exactly
    what decides each (every cell of a template registers its output to the same source on the
    same region); callers must not modify the values returned. Shared by the executor's threads."""

    def __init__(self, size: int) -> None:
        self.size, self._values, self._lock = size, OrderedDict(), threading.Lock()

    def get(self, parts: tuple, arrays: tuple[np.ndarray, ...], make: Callable[[], Any]) -> Any:
        digest = hashlib.sha256(repr(parts + tuple(a.shape for a in arrays)).encode())
        for a in arrays:
            digest.update(np.ascontiguousarray(a).tobytes())
        key = digest.hexdigest()
        with self._lock:
            found = self._values.get(key)
            if found is not None:
                self._values.move_to_end(key)
                return found
        found = make()
        with self._lock:
            self._values[key] = found
            while len(self._values) > self.size:
                self._values.popitem(last=False)
        return found

    def clear(self) -> None:
        with self._lock:
            self._values.clear()


#: the source's keypoints (SIFT on the source costs as much as on the output) and its band-passed
#: grey (a Gaussian of ~1/48 of the image: each registration read it twice), per recent source
_SOURCE_FEATURES = _Recent(4)
_SOURCE_BANDS = _Recent(4)


def _source_features(grey: np.ndarray, region: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, float]:
    """:func:`_detect` of the source on ``region``, kept for the source's next outputs."""
    return _SOURCE_FEATURES.get(("features", FEATURE_MAX_SIDE), (grey, region), lambda: _detect(grey, region))


def _source_band(grey: np.ndarray) -> np.ndarray:
    """:func:`bandpass` of the source's grey at :func:`bandpass_sigma`, kept for its next outputs."""
    sigma = bandpass_sigma(grey.shape)
    return _SOURCE_BANDS.get(("band", sigma), (grey,), lambda: bandpass(grey, sigma))


def _fit_scale_translation(p_src: np.ndarray, p_cand: np.ndarray, *, per_axis: bool) -> np.ndarray:
    """Least-squares ``x' = s x + t`` (one ``s``, or one per axis) from matched points."""
    if per_axis:
        rows = []
        for axis in (0, 1):
            a = np.stack([p_src[:, axis], np.ones(len(p_src))], axis=1)
            (s, c), *_ = np.linalg.lstsq(a, p_cand[:, axis], rcond=None)
            rows.append((s, c))
        return np.array([[rows[0][0], 0.0, rows[0][1]], [0.0, rows[1][0], rows[1][1]]])
    n = len(p_src)
    a = np.zeros((2 * n, 3))
    a[0::2, 0], a[0::2, 1] = p_src[:, 0], 1.0
    a[1::2, 0], a[1::2, 2] = p_src[:, 1], 1.0
    (s, tx, ty), *_ = np.linalg.lstsq(a, p_cand.reshape(-1), rcond=None)
    return np.array([[s, 0.0, tx], [0.0, s, ty]])


def _feature_estimate(
    src_grey: np.ndarray, cand_grey: np.ndarray, region: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """A robust first estimate of the map from source to raw candidate coordinates.

    SIFT matches (on the source only inside ``region``; the candidate may have any size),
    RANSAC inliers of an affine model, then a uniform scale + translation fitted to them,
    or an axis-wise scale + translation when that fits the inliers clearly better (an editor
    that stretched the image). Keypoints only seed ECC, which refines at full resolution.

    Returns ``(transform or None, source points, candidate points)`` of the inliers.
    """
    kp1, d1, f1 = _source_features(src_grey, region)
    kp2, d2, f2 = _detect(cand_grey, None)
    empty = np.zeros((0, 2), np.float32)
    if d1 is None or d2 is None or len(kp1) < 8 or len(kp2) < 8:
        return None, empty, empty
    pairs = cv2.BFMatcher(cv2.NORM_L2).knnMatch(d1, d2, k=2)
    good = [m for m, *rest in pairs if rest and m.distance < 0.75 * rest[0].distance]
    if len(good) < 8:
        return None, empty, empty
    # back to full-resolution pixel centres
    p1 = (kp1[[m.queryIdx for m in good]] + 0.5) / f1 - 0.5
    p2 = (kp2[[m.trainIdx for m in good]] + 0.5) / f2 - 0.5
    scale_guess = max(cand_grey.shape) / max(src_grey.shape)
    t, inliers = cv2.estimateAffine2D(
        p1, p2, method=cv2.RANSAC, ransacReprojThreshold=3.0 * max(1.0, scale_guess), maxIters=4000
    )
    if t is None or inliers is None or int(inliers.sum()) < 8:
        return None, empty, empty
    keep = inliers.ravel().astype(bool)
    p1, p2 = p1[keep].astype(np.float64), p2[keep].astype(np.float64)
    uniform = _fit_scale_translation(p1, p2, per_axis=False)
    per_axis = _fit_scale_translation(p1, p2, per_axis=True)
    rms_u, rms_a = _rms_reprojection(uniform, p1, p2), _rms_reprojection(per_axis, p1, p2)
    # the per-axis model has one parameter more: take it only when it explains clearly more
    start = per_axis if rms_u is not None and rms_a is not None and rms_a < 0.7 * rms_u and rms_u > 0.5 else uniform
    # a rotated edit is not a scale + translation: keep RANSAC's affine when it fits far better
    rms_t = _rms_reprojection(t, p1, p2)
    if rms_t is not None and (_rms_reprojection(start, p1, p2) or 0.0) > 3.0 * max(rms_t, 0.5):
        start = t.astype(np.float64)
    return start, p1, p2


def _inset(mask: np.ndarray, margin: int) -> np.ndarray:
    """``mask`` with ``margin`` pixels along each image edge cleared (a copy)."""
    if margin <= 0:
        return mask
    out = mask.copy()
    out[:margin], out[-margin:], out[:, :margin], out[:, -margin:] = 0, 0, 0, 0
    return out


def _ecc_refine(
    src_grey: np.ndarray, cand_grey: np.ndarray, region: np.ndarray, init: np.ndarray, *, margin: int = 0
) -> tuple[np.ndarray, float] | None:
    """Sub-pixel refinement by ECC (affine motion), coarse to fine: ``(warp, correlation)``,
    or None if it diverges.

    ``init`` maps source to candidate coordinates; the candidate may have another size (its
    validity mask is ``region`` carried into its frame by ``init``). ``margin`` pixels along
    each image's edges are left out: a band-pass filter reads beyond an edge by reflection, and
    the candidate's edges (a crop) lie elsewhere in the scene than the source's.
    """
    warp = init.astype(np.float32)
    h, w = src_grey.shape
    ch, cw = cand_grey.shape
    cand_region = _inset(cv2.warpAffine(_inset(region, margin), init, (cw, ch), flags=cv2.INTER_NEAREST), margin)
    levels = max(0, int(math.floor(math.log2(max(h, w) / 400.0))))
    for level in range(levels, -1, -1):
        f = 1.0 / (2**level)
        if level:
            # both images shrink by the same factor, so the linear part of the warp is unchanged
            s = cv2.resize(src_grey, None, fx=f, fy=f, interpolation=cv2.INTER_AREA)
            c = cv2.resize(cand_grey, None, fx=f, fy=f, interpolation=cv2.INTER_AREA)
            m = cv2.resize(cand_region, (c.shape[1], c.shape[0]), interpolation=cv2.INTER_NEAREST)
        else:
            s, c, m = src_grey, cand_grey, cand_region
        scaled = warp.copy()
        scaled[:, 2] *= f
        iterations = 60 if level == levels else 30
        criteria = (cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, iterations, 1e-6)
        try:
            cc, scaled = cv2.findTransformECC(
                s.astype(np.float32), c.astype(np.float32), scaled, cv2.MOTION_AFFINE, criteria, m, 5
            )
        except cv2.error:
            return None
        warp = scaled.copy()
        warp[:, 2] /= f
    return warp.astype(np.float64), float(cc)


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


#: candidates more than this much larger than the source are shrunk uniformly (area filter)
#: before ECC and the final warp, so one bilinear resampling never skips pixels
SHRINK_ABOVE = 1.25


def _scale_of(t: np.ndarray) -> float:
    return math.sqrt(abs(float(np.linalg.det(np.asarray(t)[:, :2]))))


#: a keypoint match the final transform places within this many pixels of the coarser image
#: (RANSAC's own tolerance) counts as explained; the residual is their RMS
KEYPOINT_TOLERANCE_PX = 3.0


class Registration(NamedTuple):
    """What :func:`register` found: ``transform`` (2x3, source to raw candidate, None when
    registration failed), ``residual_px`` (RMS of the explained keypoint matches, in source
    pixels; None with fewer than 8), ``matches`` (explained matches), ``failure`` (a reason
    code and detail, or None)."""

    transform: np.ndarray | None
    residual_px: float | None
    matches: int
    failure: str | None


def _explained(t: np.ndarray, p_src: np.ndarray, p_cand: np.ndarray) -> tuple[float | None, int, int]:
    """``(RMS in source pixels of the matches ``t`` explains, explained, all)``: a match is
    explained within :data:`KEYPOINT_TOLERANCE_PX` of the coarser image.

    RANSAC's inliers are those of *its* affine; ECC's final transform is judged on the ones it
    explains itself. On a plain backdrop the matches are few (8-12 of a London Set portrait,
    on the shirt's folds and the neck the edit retones), and one match 6-9 px off that RANSAC
    kept made the RMS of all of them 2.2-3.5 px while the registration was within 0.2 px of
    the truth."""
    if len(p_src) == 0:
        return None, 0, 0
    scale = _scale_of(t)
    distance = np.sqrt(np.sum((p_src @ t[:, :2].T + t[:, 2] - p_cand) ** 2, axis=1)) / scale
    inside = distance <= KEYPOINT_TOLERANCE_PX * max(1.0, 1.0 / scale)
    n = int(inside.sum())
    rms = float(np.sqrt(np.mean(distance[inside] ** 2))) if n >= 8 else None
    return rms, n, len(p_src)


def register(
    source: np.ndarray,
    candidate: np.ndarray,
    region: np.ndarray,
    *,
    method: Literal["similarity", "affine"] = "similarity",
) -> Registration:
    """Estimate the map from source to raw candidate coordinates on ``region``.

    Args:
        source: ``(H, W, 3)`` uint8 RGB.
        candidate: ``(h, w, 3)`` uint8 RGB as the editor returned it, any size and aspect.
        region: ``(H, W)`` uint8, non-zero where the two should agree.
        method: the family of the editor's own motion once its frame is undone
            (:func:`editor_frames`): ``similarity`` or ``affine``.

    Returns:
        A :class:`Registration`. When at least 8 keypoint matches exist and the final
        transform explains fewer than half of them, the keypoints and ECC disagree and the
        registration fails (``align_residual_above_max``).
    """
    s, c = _grey(source), _grey(candidate)
    if float(c.std()) < 1.0:
        return Registration(None, None, 0, "align_candidate_blank: the candidate has no texture to register")
    init, p_src, p_cand = _feature_estimate(s, c, region)
    starts = [init] if init is not None else list(editor_frames(s.shape, c.shape).values())
    best: tuple[np.ndarray, float] | None = None
    s_band = _source_band(s)  # every start (and every output of this source) refines against one copy
    for start in starts:
        refined = _refine_at_source_scale(s_band, c, region, start)
        if (
            refined is not None
            and ecc_diverged(refined[0], s.shape, c.shape) is None
            and (best is None or refined[1] > best[1])
        ):
            best = refined
    if best is None and init is None:
        return Registration(None, None, 0, "align_registration_failed: no keypoint matches and ECC did not converge")
    t = best[0] if best is not None else init
    if method == "similarity":
        _, frame, motion = _split_frame(t, s.shape, c.shape)
        t = _compose(frame, _closest_similarity(motion))
    residual, explained, found = _explained(t, p_src, p_cand)
    failure = None
    if found >= 8 and explained < found / 2:
        failure = (
            f"align_residual_above_max: the transform explains {explained} of {found} keypoint matches "
            f"within {KEYPOINT_TOLERANCE_PX:g} px (the keypoints and the image alignment disagree)"
        )
    return Registration(t, residual, explained, failure)


def registration_correlation(
    source: np.ndarray, registered: np.ndarray, region: np.ndarray, covered: np.ndarray
) -> float | None:
    """Pearson correlation of the band-passed greys (:func:`bandpass`) of ``source`` and the
    ``registered`` candidate (both ``(H, W, 3)`` uint8 in the source frame) over ``region``
    (non-zero where nothing should have changed) where the candidate ``covered`` the frame,
    :func:`bandpass_margin` away from the image's and the coverage's edges; None with under
    64 such pixels or no texture there.

    Re-rendered, re-encoded good edits and no-ops of the bundled photos and of 20 London Set
    people score 0.968-0.99; other photos register, when they do, at -0.1-0.24 (the highest:
    another London sitter, the same backdrop and shirt)."""
    margin = bandpass_margin(source.shape)
    inside = covered.astype(np.uint8)
    if margin:
        inside = cv2.erode(inside, np.ones((2 * margin + 1, 2 * margin + 1), np.uint8), borderValue=0)
    where = (region > 0) & (inside > 0)
    if int(where.sum()) < 64:
        return None
    sigma = bandpass_sigma(source.shape)
    a = _source_band(_grey(source))[where].astype(np.float64)
    b = bandpass(_grey(registered), sigma)[where].astype(np.float64)
    a -= a.mean()
    b -= b.mean()
    norm = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    return float((a * b).sum() / norm) if norm > 0 else None


#: the editor's own motion (its frame undone) is a shift, a zoom of a few per cent, perhaps a
#: turn: an ECC result whose motion stretches one direction this much more than the other, or
#: scales by more than this factor either way, is a divergence, not a registration
ECC_MAX_ANISOTROPY = 1.5
ECC_MAX_SCALE_FACTOR = 2.0


def ecc_diverged(refined: np.ndarray, source_shape, output_shape) -> str | None:
    """Why the ECC result ``refined`` (2x3, source to candidate) is a divergence, or None
    when it is a registration: judged on the editor's motion once the nearest of its
    :func:`editor_frames` is undone, not on the change from the start (a start in the wrong
    frame converges to the right one: ``stretch`` to ``fit`` is an axis ratio of 1.5 for an
    output padded by half its width).

    ECC maximises a correlation over the pixels the warp keeps inside the candidate, so a start
    far from the truth (the ``fill`` frame of an output padded to ``fit``: a 1.5x zoom) can run
    off to a degenerate warp that squeezes the source into a strip and scores a *higher*
    correlation than the right start's result (measured: 0.690 against 0.613). Whether
    ``cv2.findTransformECC`` stops with an error on that path or returns the degenerate warp
    depends on the last bits of its float arithmetic (AVX2/FMA kernels or not), so taking the
    best correlation without this check picks the frame by CPU. Divergences measured 7.4-10.1
    in axis ratio; the poorest real registration 1.17, good ones 1.00.
    """
    if not np.all(np.isfinite(refined)):
        return "not finite"
    _, _, motion = _split_frame(refined, source_shape, output_shape)
    big, small = np.linalg.svd(motion[:, :2], compute_uv=False)
    if small <= 0 or big / small > ECC_MAX_ANISOTROPY:
        return f"axis ratio {big / max(small, 1e-12):.2f} > {ECC_MAX_ANISOTROPY}"
    scale = math.sqrt(big * small)
    if not 1.0 / ECC_MAX_SCALE_FACTOR <= scale <= ECC_MAX_SCALE_FACTOR:
        return f"scale {scale:.2f} outside 1/{ECC_MAX_SCALE_FACTOR:g}..{ECC_MAX_SCALE_FACTOR:g}"
    return None


#: ECC registers band-passed copies: each grey image less its Gaussian blur at this share of
#: the source's longest side (8 px of a 384 px source). What an editor's decoder and JPEG do
#: to tone is smooth (a plain backdrop a grey level lighter, a white shirt's highlights
#: darker), and on a photo whose unchanged region is mostly backdrop and shirt ECC on raw
#: intensities trades geometry for that tone: started at the true map, it drifted 7 px and
#: stretched one axis 2 % to match a re-rendered London Set portrait (median error at the
#: face 1.2 px, worst 20 px over 50 cases; band-passed: 0.18 px, worst 0.57 px). Edges and
#: texture are what the editor kept in place, and the band keeps them.
BANDPASS_SIGMA_FRAC = 1.0 / 48.0


def bandpass_sigma(shape: tuple[int, ...]) -> float:
    """The band-pass blur's sigma, in pixels, for a source of ``shape``."""
    return BANDPASS_SIGMA_FRAC * max(shape[:2])


def bandpass_margin(shape: tuple[int, ...]) -> int:
    """Pixels along an image's edges that its band-pass reads beyond the edge for: two sigmas."""
    return int(math.ceil(2.0 * bandpass_sigma(shape)))


def bandpass(grey: np.ndarray, sigma: float) -> np.ndarray:
    """``grey`` less its Gaussian blur of ``sigma`` pixels, float32 (0 where flat); ``grey``
    itself as float32 when ``sigma`` is 0."""
    g = grey.astype(np.float32)
    return g - cv2.GaussianBlur(g, (0, 0), sigma) if sigma > 0 else g


def _refine_at_source_scale(
    s_band: np.ndarray, c: np.ndarray, region: np.ndarray, start: np.ndarray
) -> tuple[np.ndarray, float] | None:
    """ECC from ``start`` on band-passed copies (:data:`BANDPASS_SIGMA_FRAC`; ``s_band`` the
    source's, made once per registration), with the candidate shrunk uniformly to about the
    source's scale: ``(warp, correlation)``."""
    sigma = bandpass_sigma(s_band.shape)
    margin = bandpass_margin(s_band.shape)
    scale = _scale_of(start)
    if scale <= SHRINK_ABOVE:
        return _ecc_refine(s_band, bandpass(c, sigma * scale), region, start, margin=margin)
    small, shrink = _shrink_uniformly(c, 1.0 / scale)
    start = _compose(shrink, start)
    refined = _ecc_refine(s_band, bandpass(small, sigma * _scale_of(start)), region, start, margin=margin)
    if refined is None:
        return None
    return _compose(_invert(shrink), refined[0]), refined[1]


def residual_limit(max_residual_px: float, t: np.ndarray) -> float:
    """``max_residual_px`` (in pixels of the coarser image) in source pixels, for the map ``t``
    from source to candidate coordinates: multiplied by the source-to-output scale when the
    output is smaller than the source, unchanged otherwise."""
    return max_residual_px * max(1.0, 1.0 / _scale_of(t))


def warp_to_source(candidate: np.ndarray, t: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Resample the raw ``candidate`` into the source frame through ``t`` (source -> candidate).

    Returns ``(image (H, W, 3) uint8, covered (H, W) bool)``: ``covered`` marks pixels whose
    sample lies inside the candidate; elsewhere ``image`` holds replicated edge pixels, which
    are not the editor's and must be replaced or left out of every measurement.
    """
    h, w = shape
    scale = _scale_of(t)
    if scale > SHRINK_ABOVE:
        candidate, shrink = _shrink_uniformly(candidate, 1.0 / scale)
        t = _compose(shrink, t)
    ch, cw = candidate.shape[:2]
    if (ch, cw) == (h, w) and np.allclose(t, np.eye(2, 3), atol=1e-9):
        return candidate.copy(), np.ones((h, w), bool)
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    image = cv2.warpAffine(candidate, t, (w, h), flags=flags, borderMode=cv2.BORDER_REPLICATE)
    ones = np.full((ch, cw), 255, np.uint8)
    covered = cv2.warpAffine(ones, t, (w, h), flags=cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP, borderValue=0) > 0
    return image, covered


def align_candidate(
    source: np.ndarray,
    candidate: np.ndarray,
    *,
    mask: np.ndarray | None = None,
    kind: Kind = "face",
    face_size_px: float | None = None,
    config: AlignConfig | None = None,
) -> Alignment:
    """Register, warp and (where configured) composite one candidate.

    Args:
        source: ``(H, W, 3)`` uint8 RGB.
        candidate: ``(h, w, 3)`` uint8 RGB as the editor returned it, any size or aspect ratio.
        mask: ``(H, W)`` uint8 {0, 255}: the region the study varies (face mask for face
            cells, limb mask for limb cells). It is kept out of registration and, when
            compositing, is the only place the candidate's pixels survive.
        kind: ``"face"`` or ``"limb"``; limb cells are always composited (``auto``).
        face_size_px: face size used to grow the exclusion and composite masks of face cells
            (defaults to the square root of the mask's area).
        config: alignment options.

    Returns:
        An :class:`Alignment`; ``ok`` False with a reason code instead of raising. Where the
        output does not cover the source frame, the image holds the source's pixels when the
        cell is composited (``border`` ``auto``) and black otherwise.
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
    if mask is not None and mask.shape != (h, w):
        raise ValueError(f"mask shape {mask.shape} does not match source {(h, w)}")
    if face_size_px is None and mask is not None:
        face_size_px = math.sqrt(float((mask > 0).sum()))

    # where the two should agree: registration looks only there, and the residual is read there
    region = exclusion_region((h, w), kind=kind, mask=mask, face_size_px=face_size_px, config=config)
    frames = editor_frames((h, w), candidate.shape[:2])
    if config.method == "none":
        # no registration: the editor is taken to have resized axis by axis and nothing else
        t, residual, matches, failure = frames["stretch"], None, 0, None
    else:
        t, residual, matches, failure = register(source, candidate, region, method=config.method)
    registered = failure is None and t is not None and config.method != "none"
    frame_name, _, motion = _split_frame(t if t is not None else frames["fill"], (h, w), candidate.shape[:2])
    if registered:
        out_of_bounds = _within_bounds(motion, (h, w), config)
        if out_of_bounds:
            failure = f"align_transform_out_of_bounds: {out_of_bounds}"
        elif residual is not None and residual > residual_limit(config.max_residual_px, t):
            limit = residual_limit(config.max_residual_px, t)
            failure = f"align_residual_above_max: {residual:.2f} px > {limit:.2f} px"
            if limit != config.max_residual_px:
                failure += f" ({config.max_residual_px} px of the {resize_from[0]}x{resize_from[1]} output)"
    # an unregistered candidate is still brought into the frame without stretching it, so
    # the gates that measure faces (not pixels) can read it
    raw = t if t is not None else frames["fill"]
    warped, covered = warp_to_source(candidate, raw, (h, w))
    share = float(covered.mean())
    if failure is None and share < config.min_covered_share:
        failure = (
            f"align_coverage_below_min: the output covers {share:.1%} of the source frame, below "
            f"min_covered_share {config.min_covered_share:.0%}; request an aspect ratio nearer the source's"
        )
    keep = (region > 0) & covered
    correlation = registration_correlation(source, warped, region, covered) if registered else None
    if failure is None and correlation is not None and correlation < config.min_correlation:
        failure = (
            f"align_correlation_below_min: outside the edit region the output correlates {correlation:.2f} "
            f"with the source (band-passed), below min_correlation {config.min_correlation:g}: another photo, "
            "or a scene the editor re-drew"
        )
    photometric = (
        float(np.abs(warped.astype(np.float32) - source.astype(np.float32))[keep].mean() / 255.0)
        if keep.any() and failure is None
        else None
    )
    do_composite = config.composite == "mask" or (config.composite == "auto" and kind == "limb")
    from_source = config.border == "source" or (config.border == "auto" and do_composite)
    warped[~covered] = source[~covered] if from_source else 0
    common = {
        "transform": motion,
        "resize_from": resize_from,
        "residual_px": residual,
        "matches": matches,
        "frame": frame_name,
        "raw_transform": raw,
        "covered": covered,
        "covered_share": share,
        "correlation": correlation,
    }
    if failure is not None or t is None:
        return Alignment(ok=False, image=warped, reason=failure, **common)
    if do_composite and mask is None:
        return Alignment(
            ok=False,
            image=warped,
            photometric_residual=photometric,
            reason="align_no_mask: compositing needs the cell's edit mask",
            **common,
        )
    raw = None
    if do_composite:
        grow = int(round(config.face_composite_grow_frac * (face_size_px or 0.0))) if kind == "face" else 0
        alpha = composite_alpha(mask, feather_px=config.feather_px, grow_px=grow)
        raw = warped
        warped = composite(source, warped, alpha)
    return Alignment(
        ok=True, image=warped, photometric_residual=photometric, composited=do_composite, raw=raw, **common
    )
