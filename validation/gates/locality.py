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

- ``excess_share`` (with the editor's noise-floor output, ``pair.extras[FLOOR_IMAGE]``): the
  share of pixels away from the face, in connected areas, where the candidate differs from
  the source by :data:`EXCESS_LEVEL` more than the same editor's "return this photo
  unchanged" output does nearby (:func:`excess_change`). The floor output carries the
  editor's own re-rendering of this very photo, so what remains is what the candidate alone
  changed: thin text and small objects the band limit spreads too thin, a patch pasted on a
  plain wall, an erased one.

When the caller hands the registered output before compositing (``raw_candidate``) and the
editor's output as returned (``unregistered``), the same figures are reported for the raw
edit (``raw_*``) and FOCUS-comparable ones (``focus_diff_face``, ``focus_diff_nonface``,
``focus_ratio``: the unregistered output resized to the source's size, no registration), so a
release can be set beside FOCUS's 0.141 / 0.022 / 8.16.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from counterfactory.generation.masks import dilate
from counterfactory.manifests.registry import GATES
from counterfactory.validation.faces import face_mask as draw_face_mask
from counterfactory.validation.gates.base import GateResult, PairContext, SourceAnalysis, finite_or_none
from counterfactory.validation.segment import PERSON_THRESHOLD, work_stride

#: Denominator floor of ``ratio``: 1e-4 is a fortieth of one grey level (1/255) on average,
#: so a composite that leaves every non-face pixel untouched still has a finite ratio.
RATIO_FLOOR = 1e-4
#: A pixel is "changed" when its smoothed mean absolute difference exceeds this, in [0, 1]
#: (20 grey levels): far above JPEG and resampling noise once smoothed, below a pasted object.
LOCAL_CHANGE_LEVEL = 20.0 / 255.0
#: Gaussian smoothing of the difference, sigma as a fraction of sqrt(H * W) (5 px at 1 MP;
#: on a working grid of every k-th pixel, the same width in grid pixels).
SMOOTH_FRAC = 0.005
#: Band limit of the judged differences: the *signed* difference is Gaussian-smoothed with
#: sigma this fraction of sqrt(H * W) before its magnitude is taken (4.7 px on a 512 x 440
#: working grid). A latent autoencoder's re-synthesised texture and grain is faint and
#: zero-mean at that scale and cancels; an object, text, a cast or a moved head is coherent
#: over many such widths and stays.
BAND_FRAC = 0.01
#: A coherent change counts only as a connected region of at least this share of the
#: measured region (a 1.5 % object is 15 times larger): the scattered specks where a
#: re-render moves a sharp edge are smaller.
MIN_CHANGE_AREA_FRAC = 0.001
#: ``excess_share`` (judged against the editor's own "unchanged" output of the photo): each
#: per-pixel difference is smoothed with this sigma in working-grid pixels (a pixel's
#: neighbours, not a band limit: text strokes and small objects keep their contrast) ...
EXCESS_SMOOTH_PX = 1.0
#: ... after each output is matched to the source within this many working-grid pixels (an
#: edge registered a pixel apart is not a change) ...
EXCESS_SHIFT_PX = 1
#: ... the floor's difference is grown by this radius (a max filter of 2r + 1 pixels), as a
#: re-render moves an edge by a pixel or two between requests ...
EXCESS_GROW_PX = 3
#: ... and a pixel is changed beyond the floor where the candidate's difference exceeds the
#: grown floor's by this, in [0, 1] (14 grey levels), in connected areas of at least
#: :data:`MIN_CHANGE_AREA_FRAC` of the region.
EXCESS_LEVEL = 14.0 / 255.0
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
        None,
        ge=0.0,
        le=1.0,
        description="face edits: below this the face is unchanged (sent to review); judged only without a noise floor",
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
    min_face_change: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description=(
            "face edits: band-limited face change (above the noise floor's, with one) below this: unchanged "
            "(sent to review)"
        ),
    )
    min_band_ratio: float | None = Field(
        None, ge=0.0, description="face edits: band-limited face change / band-limited change away from the face"
    )
    max_excess_share: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description=(
            "face edits: share of pixels away from the face changed beyond the editor's own 'unchanged' output "
            "(judged only with a noise floor image)"
        ),
    )
    cohort: LocalityPathConfig | None = Field(
        None, description="face edits: the thresholds judged above a cohort floor (the same source's other candidates)"
    )
    no_floor: LocalityPathConfig | None = Field(
        None, description="face edits: the thresholds of a lone pair with no floor (measures as measured)"
    )


#: The locality thresholds that depend on what the editor alone did, and so on the judging
#: path: judged above a floor (``request``, ``cohort``) or as measured (``none``).
PATH_THRESHOLDS = (
    "min_diff_face",
    "max_changed_share",
    "max_global_shift",
    "max_global_gain_change",
    "max_body_skin_delta_e",
    "min_face_change",
    "max_excess_share",
)
#: The three ways a verdict knows what the editor alone did (``floor_path`` on every item):
#: the run's "return this photo unchanged" request, the other candidates of the same source
#: (:func:`~counterfactory.validation.cohort.cohort_floors`), or nothing (a lone pair).
FLOOR_PATHS = ("request", "cohort", "none")


class LocalityPathConfig(BaseModel):
    """The path-dependent locality thresholds (:data:`PATH_THRESHOLDS`) of one judging path
    other than the floor request (``gates.face.locality.cohort`` / ``.no_floor``). When a path's
    set is given it replaces the top-level values of those thresholds for that path (None: not
    judged); when it is absent the top-level values hold.

    ``cohort``: judged above the other candidates of the same source (their median, leave one
    out); ``face_change`` is then judged as measured (the others' faces are edited too).
    ``no_floor``: a lone pair, every measure as measured, limits fitted on re-rendered cases
    without a floor."""

    model_config = ConfigDict(extra="forbid")

    min_diff_face: float | None = Field(None, ge=0.0, le=1.0)
    max_changed_share: float | None = Field(None, ge=0.0, le=1.0)
    max_global_shift: float | None = Field(None, ge=0.0, le=1.0)
    max_global_gain_change: float | None = Field(None, ge=0.0)
    max_body_skin_delta_e: float | None = Field(None, ge=0.0)
    min_face_change: float | None = Field(None, ge=0.0, le=1.0)
    max_excess_share: float | None = Field(None, ge=0.0, le=1.0)


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


def _region_sum(diff: np.ndarray, mask: np.ndarray | None) -> tuple[float, int]:
    """``(sum of all channels, pixel count)`` of ``(H, W, 3)`` uint8 ``diff`` over ``mask``
    ({0, 255}, None: everywhere), read inside the mask's bounding box."""
    if mask is None:
        return float(round(sum(cv2.sumElems(diff)[:3]))), diff.shape[0] * diff.shape[1]
    x, y, w, h = cv2.boundingRect(mask)
    if w == 0 or h == 0:
        return 0.0, 0
    crop = mask[y : y + h, x : x + w]
    count = cv2.countNonZero(crop)
    means = cv2.mean(diff[y : y + h, x : x + w], mask=crop)[:3]
    # the sum is an integer: round away the division cv2.mean did
    return float(round(sum(m * count for m in means))), count


def _mean_of(total: float, count: int) -> float:
    """FOCUS's mean absolute difference in [0, 1] from a channel sum; NaN for no pixels."""
    return total / (3.0 * 255.0 * count) if count > 0 else float("nan")


def resize_to(image: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """``image`` resized to ``shape`` ``(H, W)`` as FOCUS compared outputs with sources (area
    averaging when shrinking, bicubic when enlarging); unchanged when already that size."""
    h, w = shape
    if image.shape[:2] == (h, w):
        return image
    shrinking = image.shape[0] * image.shape[1] > h * w
    return cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_CUBIC)


def grow_face(face_mask: np.ndarray, face_size_px: float) -> np.ndarray:
    """``(H, W)`` uint8 {0, 255}: ``face_mask`` grown by :data:`FACE_MARGIN_FRAC` of
    ``face_size_px`` (Euclidean, :func:`~counterfactory.generation.masks.dilate`), computed
    inside the mask's bounding box grown by the margin (nothing further can join)."""
    px = int(round(FACE_MARGIN_FRAC * face_size_px))
    x, y, w, h = cv2.boundingRect(face_mask)
    if px <= 0 or w == 0 or h == 0:
        return binary_mask(face_mask)
    rows, cols = face_mask.shape[:2]
    y0, y1 = max(y - px - 1, 0), min(y + h + px + 1, rows)
    x0, x1 = max(x - px - 1, 0), min(x + w + px + 1, cols)
    out = np.zeros((rows, cols), np.uint8)
    out[y0:y1, x0:x1] = dilate(np.ascontiguousarray(face_mask[y0:y1, x0:x1]), px)
    return out


def away_from_face(face_mask: np.ndarray | None, shape: tuple[int, int], face_size_px: float) -> np.ndarray:
    """``(H, W)`` uint8 {0, 255}: outside the face grown by :data:`FACE_MARGIN_FRAC` of
    ``face_size_px`` and at least :data:`BORDER_FRAC` of the shorter side from the image edge."""
    h, w = shape
    region = np.full((h, w), 255, np.uint8)
    if face_mask is not None:
        region[grow_face(face_mask, face_size_px) > 0] = 0
    b = int(math.ceil(BORDER_FRAC * min(h, w)))
    if b > 0:
        region[:b] = 0
        region[-b:] = 0
        region[:, :b] = 0
        region[:, -b:] = 0
    return region


def smoothed_diff(source: np.ndarray, candidate: np.ndarray, stride: int = 1) -> np.ndarray:
    """Mean absolute difference over channels in [0, 1], Gaussian-smoothed with sigma
    ``SMOOTH_FRAC * sqrt(h * w)`` pixels of the ``(h, w)`` grid it is measured on.

    With ``stride`` k > 1 that grid is every k-th pixel of each row and column (shape
    ``(ceil(H / k), ceil(W / k))``): the same physical smoothing width, averaging fewer
    samples, for a fraction of the cost. Returns float32 of the grid's shape.
    """
    if stride > 1:
        source = np.ascontiguousarray(source[::stride, ::stride])
        candidate = np.ascontiguousarray(candidate[::stride, ::stride])
    h, w = source.shape[:2]
    # the channel mean as a 1 x 3 matrix product: numpy's mean over a 3-wide last axis is slow
    grey = cv2.transform(cv2.absdiff(source, candidate).astype(np.float32), _CHANNEL_MEAN)
    return cv2.GaussianBlur(grey, (0, 0), sigmaX=max(SMOOTH_FRAC * math.sqrt(h * w), 0.5))


_CHANNEL_MEAN = np.full((1, 3), 1.0 / (3.0 * 255.0), np.float32)


def band_sigma(shape: tuple[int, ...]) -> float:
    """Sigma in pixels of :data:`BAND_FRAC` on a grid of ``shape`` ``(h, w, ...)``."""
    return max(BAND_FRAC * math.sqrt(shape[0] * shape[1]), 0.5)


@functools.lru_cache(maxsize=64)
def _gaussian_kernel(sigma: float) -> np.ndarray:
    """OpenCV's own Gaussian kernel for a float image at ``sigma`` (4 sigma each side, the size
    ``GaussianBlur`` picks)."""
    return cv2.getGaussianKernel(int(round(sigma * 8 + 1)) | 1, sigma, cv2.CV_32F)


def lowpass(image: np.ndarray) -> np.ndarray:
    """``image`` as float32 Gaussian-smoothed at :func:`band_sigma` (per channel): the kernel
    ``GaussianBlur`` uses on float32, applied straight from uint8 (no float copy of the image
    first; the result differs from ``GaussianBlur`` of the float copy by at most 5e-5 grey
    levels, floating-point order)."""
    k = _gaussian_kernel(band_sigma(image.shape))
    return cv2.sepFilter2D(image, cv2.CV_32F, k, k, borderType=cv2.BORDER_REFLECT_101)


def band_diff(source: np.ndarray, candidate: np.ndarray, *, source_low: np.ndarray | None = None) -> np.ndarray:
    """``(h, w)`` float32 in [0, 1]: the magnitude of the band-limited signed difference, the
    channel mean of ``|G(candidate) - G(source)|`` with ``G`` :func:`lowpass`.

    Zero-mean re-synthesis (texture, grain, a sharp edge moved by a pixel) cancels inside the
    kernel; a coherent change of ``d`` grey levels over an area several sigmas wide gives
    ``d / 255`` there. ``source_low`` is ``lowpass(source)`` when the caller has it.
    """
    s = lowpass(source) if source_low is None else source_low
    d = cv2.absdiff(lowpass(candidate), s)
    return cv2.transform(d, _CHANNEL_MEAN)


def coherent_share(change: np.ndarray, region: np.ndarray, level: float | None = None) -> float | None:
    """Share in [0, 1] of ``region``'s pixels inside connected areas where ``change``
    (:func:`band_diff`) exceeds ``level`` (default :data:`LOCAL_CHANGE_LEVEL`) and that cover
    at least :data:`MIN_CHANGE_AREA_FRAC` of the region; None for an empty region."""
    n = cv2.countNonZero(region)
    if n == 0:
        return None
    level = LOCAL_CHANGE_LEVEL if level is None else level
    changed = ((change > level) & (region > 0)).astype(np.uint8)
    if not changed.any():
        return 0.0
    count, _, stats, _ = cv2.connectedComponentsWithStats(changed, connectivity=8)
    areas = stats[1:count, cv2.CC_STAT_AREA]
    kept = areas[areas >= MIN_CHANGE_AREA_FRAC * n]
    return float(kept.sum() / n)


def _padded(work_source: np.ndarray) -> np.ndarray:
    """float32 ``work_source`` padded by :data:`EXCESS_SHIFT_PX` (edge replicated)."""
    r = EXCESS_SHIFT_PX
    return cv2.copyMakeBorder(work_source.astype(np.float32), r, r, r, r, cv2.BORDER_REPLICATE)


def _diff_to(padded: np.ndarray, image: np.ndarray) -> np.ndarray:
    """``(h, w)`` float32 in [0, 1]: at each pixel of ``image`` (uint8 ``(h, w, 3)``), the
    smallest channel mean of ``|image - source|`` over the source's pixels within
    :data:`EXCESS_SHIFT_PX` of it (``padded``: :func:`_padded` source, same grid), smoothed
    with sigma :data:`EXCESS_SMOOTH_PX`.

    The shift tolerance makes a sharp edge registered a pixel apart (on a working grid of
    every k-th pixel, k pixels: an output resized up from an editor's smaller frame, a fraction
    of a percent of scale, or a sampled pixel landing on the edge's other side) differ by
    little; a colour that is nowhere near (text, a pasted or erased patch) differs fully.
    """
    b = image.astype(np.float32)
    h, w = b.shape[:2]
    best = None
    for dy in range(2 * EXCESS_SHIFT_PX + 1):
        for dx in range(2 * EXCESS_SHIFT_PX + 1):
            d = cv2.transform(cv2.absdiff(b, padded[dy : dy + h, dx : dx + w]), _CHANNEL_MEAN)
            best = d if best is None else np.minimum(best, d, out=best)
    return cv2.GaussianBlur(best, (0, 0), sigmaX=EXCESS_SMOOTH_PX)


class _FloorSide:
    """What :func:`excess_change` needs of a source and its floor output, made once per pair
    of arrays (every cell of a template is compared with the same two): the padded source and
    the floor's grown difference on the source's grid. Kept while both arrays live (weak
    references), a handful of templates at a time."""

    _cache: dict[tuple[int, int, int], tuple[Any, Any, np.ndarray, np.ndarray]] = {}

    @classmethod
    def of(cls, source: np.ndarray, floor: np.ndarray, stride: int) -> tuple[np.ndarray, np.ndarray]:
        key = (id(source), id(floor), stride)
        hit = cls._cache.get(key)
        if hit is not None and hit[0]() is source and hit[1]() is floor:
            return hit[2], hit[3]
        padded = _padded(source)
        on_grid = floor if stride == 1 else np.ascontiguousarray(floor[::stride, ::stride])
        grown = cv2.dilate(_diff_to(padded, on_grid), _square(EXCESS_GROW_PX))
        # dead entries, then the oldest, go first
        for old in [k for k, v in cls._cache.items() if v[0]() is None or v[1]() is None]:
            del cls._cache[old]
        while len(cls._cache) >= 8:
            del cls._cache[next(iter(cls._cache))]
        cls._cache[key] = (weakref.ref(source), weakref.ref(floor), padded, grown)
        return padded, grown


def excess_change(source: np.ndarray, candidate: np.ndarray, floor: np.ndarray, stride: int = 1) -> np.ndarray:
    """``(h, w)`` float32: how much more ``candidate`` differs from ``source`` at each pixel
    than the editor's floor output ``floor`` does within :data:`EXCESS_GROW_PX` (both
    differences :func:`_diff_to`). ``source`` and ``candidate`` are uint8 on one grid;
    ``floor`` is the full-size output registered to the source, of which every ``stride``-th
    pixel is that grid (``stride`` 1: it is on the grid already).

    The floor is the same editor re-rendering the same photo with nothing asked: its own
    texture, grain and edge shifts are where it differs, and a candidate differing as much
    there is re-rendering too. What the candidate alone changes, an object pasted on a plain
    wall, text, an erased patch, stays at full per-pixel contrast, which the band limit of
    :func:`band_diff` would spread below its level when the change is thin or small. Where
    the floor output did not cover the frame its pixels are black, its difference large, and
    nothing there counts. The padded source and the floor's grown difference are made once
    per template (:class:`_FloorSide`).
    """
    padded, grown = _FloorSide.of(source, floor, stride)
    return _diff_to(padded, candidate) - grown


def excess_share(
    source: np.ndarray, candidate: np.ndarray, floor: np.ndarray, region: np.ndarray, stride: int = 1
) -> float | None:
    """Share in [0, 1] of ``region``'s pixels in connected areas where :func:`excess_change`
    exceeds :data:`EXCESS_LEVEL` (at least :data:`MIN_CHANGE_AREA_FRAC` of the region each,
    :func:`coherent_share`); None for an empty region. ``source``, ``candidate`` and ``region``
    on one grid, ``floor`` full size with that grid its every ``stride``-th pixel."""
    return coherent_share(excess_change(source, candidate, floor, stride), region, EXCESS_LEVEL)


def _square(radius: int) -> np.ndarray:
    return np.ones((2 * radius + 1, 2 * radius + 1), np.uint8)


def _work_region(region: np.ndarray, stride: int) -> np.ndarray:
    """``region`` on the grid :func:`smoothed_diff` measures for ``stride``."""
    return region if stride <= 1 else np.ascontiguousarray(region[::stride, ::stride])


def changed_share(
    source: np.ndarray, candidate: np.ndarray, region: np.ndarray, *, stride: int | None = None
) -> float | None:
    """Share in [0, 1] of ``region``'s pixels in coherent changed areas: where the
    band-limited difference (:func:`band_diff`) exceeds :data:`LOCAL_CHANGE_LEVEL`, in
    connected areas of at least :data:`MIN_CHANGE_AREA_FRAC` of the region
    (:func:`coherent_share`); None when the region is empty.

    Measured at the working resolution (``stride`` k, by default
    :func:`~counterfactory.validation.segment.work_stride`: long side at most 512 pixels), which
    keeps areas: a pasted square of side ``a`` (well above the smoothing sigma) whose difference
    is twice the level crosses it at its own edge, so the share is ``a**2 / area(region)``.
    """
    k = work_stride(source.shape) if stride is None else stride
    if k > 1:
        source = np.ascontiguousarray(source[::k, ::k])
        candidate = np.ascontiguousarray(candidate[::k, ::k])
    return coherent_share(band_diff(source, candidate), _work_region(region, k))


def _changed_share_at(smoothed: np.ndarray, region: np.ndarray) -> float | None:
    n = cv2.countNonZero(region)
    if n == 0:
        return None
    changed = (smoothed > LOCAL_CHANGE_LEVEL) & (region > 0)
    return float(np.count_nonzero(changed) / n)


@dataclass(frozen=True)
class RegionSample:
    """An even sample of a region's pixels and the source's values there.

    Attributes:
        rows, cols: ``(N,)`` intp full-resolution coordinates (every ``step``-th row and column).
        source: ``(N, 3)`` float32 source values there.
        far: ``(N,)`` bool, the samples at least :data:`STRATA_MARGIN_FRAC` face sizes from the
            edit region (what the lightness thirds of :func:`global_change` read), or None: all.
    """

    rows: np.ndarray
    cols: np.ndarray
    source: np.ndarray
    far: np.ndarray | None = None

    def covered_by(self, covered: np.ndarray | None) -> RegionSample:
        """The samples where ``covered`` (``(H, W)`` bool) is True; self for None."""
        if covered is None:
            return self
        keep = covered[self.rows, self.cols]
        far = None if self.far is None else self.far[keep]
        return RegionSample(self.rows[keep], self.cols[keep], self.source[keep], far)


#: :func:`global_change` reads about this many pixels of its region (an even stride).
GLOBAL_SAMPLES = 40_000
#: ... and takes the median shift of each third of them by lightness when each has this many.
MIN_STRATUM_SAMPLES = 200
#: The thirds are read this many face sizes or more from the edit region: an edit's feathered
#: edge (a tone change blended over a tenth of a face or more) reaches past the face margin,
#: and next to a dark-skinned face it lands in the darkest third with the hair and clothes
#: (London 137, a good edit: 0.0068 there). A cast or contrast change covers the whole frame.
STRATA_MARGIN_FRAC = 0.3


def sample_region(source: np.ndarray, region: np.ndarray, far: np.ndarray | None = None) -> RegionSample:
    """The :class:`RegionSample` :func:`global_change` reads: every ``step``-th pixel of each row
    and column inside ``region``, ``step`` bringing the count to about :data:`GLOBAL_SAMPLES`;
    ``far`` (same grid, {0, 255}): the part of it the lightness thirds read (None: all)."""
    keep = region > 0
    step = max(1, int(math.ceil(math.sqrt(np.count_nonzero(keep) / GLOBAL_SAMPLES))))
    rows, cols = np.nonzero(keep[::step, ::step])
    rows, cols = rows * step, cols * step
    far_flags = None if far is None else far[rows, cols] > 0
    return RegionSample(rows, cols, source[rows, cols].astype(np.float32), far_flags)


def global_change(source: np.ndarray, candidate: np.ndarray, region: np.ndarray) -> tuple[float | None, float | None]:
    """``(shift, gain_change)`` over ``region``: the largest |median signed difference| of one
    channel in [0, 1], over the whole region and over each third of it by lightness (a
    contrast change shifts the dark and light thirds oppositely), and the largest
    ``|std(candidate) / std(source) - 1|`` of one channel.

    A constant offset of ``d`` grey levels in one channel gives ``shift == d / 255``; scaling
    a channel's contrast by ``g`` about its mean gives ``gain_change == |g - 1|``. Read on an
    even sample of the region (:func:`sample_region`); the statistics are global.
    """
    return _global_change_at(sample_region(source, region), candidate)


def _global_change_at(sample: RegionSample, candidate: np.ndarray) -> tuple[float | None, float | None]:
    if sample.rows.size == 0:
        return None, None
    src = sample.source
    cand = candidate[sample.rows, sample.cols].astype(np.float32)
    # per channel on contiguous rows: numpy reduces a 3-wide last axis slowly
    diff = np.ascontiguousarray((cand - src).T)
    shift = float(np.max(np.abs(np.median(diff, axis=1)))) / 255.0
    # a contrast or tone-curve change moves the dark and the light parts oppositely, and where
    # the image's mean is a plain wall's (a studio portrait) the whole-region median stays put:
    # the medians of each third by lightness too. Thirds of the mean of both images' lightness,
    # not of one's: choosing pixels by one image's noise biases the other's difference there.
    far = sample.far if sample.far is not None else np.ones(diff.shape[1], bool)
    if np.count_nonzero(far) >= 3 * MIN_STRATUM_SAMPLES:
        far_diff = diff[:, far]
        lightness = (cand[far] + src[far]).sum(axis=1)
        low, high = np.quantile(lightness, [1 / 3, 2 / 3])
        for part in (lightness <= low, (lightness > low) & (lightness <= high), lightness > high):
            if np.count_nonzero(part) >= MIN_STRATUM_SAMPLES:
                stratum = float(np.max(np.abs(np.median(far_diff[:, part], axis=1)))) / 255.0
                shift = max(shift, stratum)
    s_std = _channel_std(src)
    c_std = _channel_std(cand)
    ok = s_std > 1.0
    gain = float(np.max(np.abs(c_std[ok] / s_std[ok] - 1.0))) if ok.any() else None
    return shift, gain


def _channel_std(values: np.ndarray) -> np.ndarray:
    """``(3,)`` float64 population standard deviation of ``(N, 3)`` values, per channel."""
    _, std = cv2.meanStdDev(np.ascontiguousarray(values).reshape(-1, 1, 3))
    return std.reshape(3)


def to_lab(image: np.ndarray) -> np.ndarray:
    """``(H, W, 3)`` float32 CIELAB (L* in [0, 100], a* b* signed) of uint8 sRGB (D65)."""
    return cv2.cvtColor(image.astype(np.float32) / 255.0, cv2.COLOR_RGB2Lab)


@dataclass(frozen=True)
class BodySkin:
    """The source side of :func:`body_skin_drift`: where the person's skin outside the head is.

    Attributes:
        rows, cols: ``(N,)`` coordinates of the body-skin pixels in the image they were
            found in (the working grid, in a gate stack).
        source_lab: ``(N, 3)`` float32 CIELAB of the source there.
        grid_pixels: pixels of that image (the denominator of ``area_frac``).
    """

    rows: np.ndarray
    cols: np.ndarray
    source_lab: np.ndarray
    grid_pixels: int


def _person_binary(person: np.ndarray) -> np.ndarray:
    """bool from a {0, 255} uint8 person mask or a [0, 1] float probability."""
    if person.dtype == np.uint8:
        return person > 127
    return person >= PERSON_THRESHOLD


def body_skin_reference(
    source: np.ndarray,
    face_mask: np.ndarray,
    person: np.ndarray,
    face_size_px: float,
    region: np.ndarray | None = None,
) -> BodySkin:
    """Find the person's skin outside the head in ``source`` (see :func:`body_skin_drift`).

    Args:
        source: ``(H, W, 3)`` uint8 RGB.
        face_mask: ``(H, W)`` {0, 255} face oval.
        person: ``(H, W)`` uint8 {0, 255} person mask or float person probability in [0, 1].
        face_size_px: face size in pixels of ``source``.
        region: ``(H, W)`` {0, 255} the edit region the prompt names (face, neck, ears...),
            or None: the oval. Body skin is the skin outside it (grown by the face margin).
    """
    core = cv2.erode(face_mask, _DISC3, iterations=max(1, int(face_size_px * 0.05)))
    if cv2.countNonZero(core) == 0:
        core = face_mask
    ref = np.median(_lab_at(source, core > 0), axis=0)
    grown = grow_face(face_mask if region is None else region, face_size_px)
    rows, cols = np.nonzero(_person_binary(person) & (grown == 0))
    # only the person's pixels are converted: CIELAB of a whole photo costs more than the rest
    src_lab = _lab_of(source[rows, cols])
    ab = np.linalg.norm(src_lab[:, 1:] - ref[1:], axis=1)
    skin = (ab <= SKIN_AB_DISTANCE) & (np.abs(src_lab[:, 0] - ref[0]) <= SKIN_L_RANGE)
    return BodySkin(rows[skin], cols[skin], src_lab[skin], int(source.shape[0] * source.shape[1]))


def body_skin_change(
    body: BodySkin, candidate: np.ndarray, covered: np.ndarray | None = None
) -> tuple[float | None, float]:
    """``(delta_e, area_frac)`` of ``candidate`` (same grid as the source ``body`` was found
    in) over the body-skin pixels where ``covered`` (bool, same grid; None: all) holds; see
    :func:`body_skin_drift`."""
    rows, cols, lab = body.rows, body.cols, body.source_lab
    if covered is not None:
        keep = covered[rows, cols]
        rows, cols, lab = rows[keep], cols[keep], lab[keep]
    frac = float(rows.size / body.grid_pixels)
    if frac < MIN_BODY_SKIN_FRAC:
        return None, frac
    change = (_lab_of(candidate[rows, cols]) - lab).mean(axis=0)
    return float(np.linalg.norm(change)), frac


def body_skin_drift(
    source: np.ndarray,
    candidate: np.ndarray,
    face_mask: np.ndarray,
    person_mask: np.ndarray,
    face_size_px: float,
    *,
    covered: np.ndarray | None = None,
) -> tuple[float | None, float]:
    """``(delta_e, area_frac)``: CIELAB change of the person's skin outside the head.

    Skin reference: the median L*a*b* of the source inside ``face_mask`` (eroded by a
    twentieth of the face to keep off hair and background). Body skin: pixels of
    ``person_mask`` outside the face grown by :data:`FACE_MARGIN_FRAC` whose source a*b* lie
    within :data:`SKIN_AB_DISTANCE` of the reference and L* within :data:`SKIN_L_RANGE`.
    ``delta_e`` is the Euclidean norm of the mean ``candidate - source`` L*a*b* over them
    (CIE76 of the average change); None when they cover less than :data:`MIN_BODY_SKIN_FRAC`
    of the image. Measured on the working grid (every k-th pixel of each row and column,
    :func:`~counterfactory.validation.segment.work_stride`): a mean over thousands of skin
    pixels does not need every one of them.

    Args:
        source, candidate: ``(H, W, 3)`` uint8 RGB, aligned.
        face_mask: ``(H, W)`` {0, 255} face oval of the source.
        person_mask: ``(H, W)`` uint8 {0, 255} person mask or float probability in [0, 1].
        face_size_px: face size in pixels.
        covered: ``(H, W)`` bool, where the candidate is the editor's (None: everywhere).
    """
    k = work_stride(source.shape)

    def grid(a: np.ndarray | None) -> np.ndarray | None:
        return a if a is None or k == 1 else np.ascontiguousarray(a[::k, ::k])

    body = body_skin_reference(grid(source), grid(face_mask), grid(person_mask), face_size_px / k)
    return body_skin_change(body, grid(candidate), grid(covered))


_DISC3 = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (3, 3))


def _lab_of(pixels: np.ndarray) -> np.ndarray:
    """``(N, 3)`` float32 CIELAB of ``(N, 3)`` uint8 RGB pixels."""
    if pixels.shape[0] == 0:
        return np.zeros((0, 3), np.float32)
    return to_lab(np.ascontiguousarray(pixels).reshape(-1, 1, 3)).reshape(-1, 3)


def _lab_at(image: np.ndarray, where: np.ndarray) -> np.ndarray:
    """``(N, 3)`` float32 CIELAB of ``image``'s pixels where ``where`` is True."""
    return _lab_of(image[where])


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

    # sums over regions, each read inside its bounding box: the face is a small part of the
    # image, and non-face = all minus the oval (exact: sums of whole grey levels)
    total, n_total = _region_sum(diff, cov)
    out: dict[str, float | None] = {
        "diff_all": finite_or_none(_mean_of(total, n_total)),
        "covered_share": 1.0 if cov is None else n_total / n,
    }
    if face_mask is not None:
        face_mask = within(face_mask)
        face_sum, n_face = _region_sum(diff, face_mask)
        if oval_mask is None:
            oval_sum, n_oval = face_sum, n_face
        else:
            oval_sum, n_oval = _region_sum(diff, within(oval_mask))
        d_face = _mean_of(face_sum, n_face)
        d_non = _mean_of(total - oval_sum, n_total - n_oval)
        out["diff_face"] = finite_or_none(d_face)
        out["diff_nonface"] = finite_or_none(d_non)
        out["ratio"] = (
            finite_or_none(d_face / max(d_non, RATIO_FLOOR)) if math.isfinite(d_face) and math.isfinite(d_non) else None
        )
        out["face_area_frac"] = n_face / n
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


@dataclass(frozen=True)
class LocalitySource:
    """The source side of a face pair's locality measures, computed once per source.

    Attributes:
        oval: ``(H, W)`` {0, 255} the full face oval (FOCUS's face / non-face split).
        stride: the working grid's k (:func:`~counterfactory.validation.segment.work_stride`).
        work_region: :func:`away_from_face` on the working grid.
        sample: the :func:`global_change` sample of ``work_region`` (working-grid
            coordinates), of the band-limited source (:func:`lowpass`).
        body: the person's skin outside the head on the working grid, or None without a
            person segmentation.
        work_oval: the oval on the working grid.
        source_low: :func:`lowpass` of the working-grid source.
    """

    oval: np.ndarray
    stride: int
    work_region: np.ndarray
    sample: RegionSample
    body: BodySkin | None
    work_oval: np.ndarray | None = None
    source_low: np.ndarray | None = None


def prepare_locality_source(
    work_source: np.ndarray,
    oval: np.ndarray,
    face_size_px: float,
    stride: int,
    person: np.ndarray | None,
    region: np.ndarray | None = None,
) -> LocalitySource:
    """:class:`LocalitySource` of a source.

    Args:
        work_source: the source on the working grid, ``source[::stride, ::stride]``, uint8.
        oval: ``(H, W)`` {0, 255} the full-size face oval.
        face_size_px: face size in full-size pixels.
        stride: the working grid's k.
        person: person mask or probability on the working grid, or None.
        region: ``(H, W)`` {0, 255} the full-size edit region the prompt names
            (:func:`~counterfactory.validation.faces.region_mask`), or None: the oval. What
            is "away from the face" and "body skin" is measured outside it.
    """
    work_oval = oval if stride == 1 else np.ascontiguousarray(oval[::stride, ::stride])
    if region is None:
        work_edit = work_oval
    else:
        work_edit = region if stride == 1 else np.ascontiguousarray(region[::stride, ::stride])
        work_edit = cv2.bitwise_or(work_edit, work_oval)
    size = face_size_px / stride
    away = away_from_face(work_edit, work_source.shape[:2], size)
    body = body_skin_reference(work_source, work_oval, person, size, work_edit) if person is not None else None
    low = lowpass(work_source)
    far = away_from_face(work_edit, work_source.shape[:2], size * STRATA_MARGIN_FRAC / FACE_MARGIN_FRAC)
    return LocalitySource(oval, stride, away, sample_region(low, away, far), body, work_oval, low)


def _face_measures(
    prepared: LocalitySource,
    work_source: np.ndarray,
    work_candidate: np.ndarray,
    prefix: str = "",
    work_covered: np.ndarray | None = None,
) -> dict[str, float | None]:
    region = prepared.work_region
    oval = prepared.work_oval
    if work_covered is not None:
        region = np.where(work_covered, region, np.uint8(0))
        oval = None if oval is None else np.where(work_covered, oval, np.uint8(0))
    source_low = prepared.source_low if prepared.source_low is not None else lowpass(work_source)
    cand_low = lowpass(work_candidate)
    band = cv2.transform(cv2.absdiff(cand_low, source_low), _CHANNEL_MEAN)
    shift, gain = _global_change_at(prepared.sample.covered_by(work_covered), cand_low)
    share = coherent_share(band, region)
    face_change = cv2.mean(band, mask=oval)[0] if oval is not None and cv2.countNonZero(oval) else None
    away_change = cv2.mean(band, mask=region)[0] if cv2.countNonZero(region) else None
    band_ratio = (
        face_change / max(away_change, RATIO_FLOOR) if face_change is not None and away_change is not None else None
    )
    out: dict[str, float | None] = {
        f"{prefix}changed_share": finite_or_none(share),
        f"{prefix}global_shift": finite_or_none(shift),
        f"{prefix}global_gain_change": finite_or_none(gain),
        f"{prefix}face_change": finite_or_none(face_change),
        f"{prefix}nonface_change": finite_or_none(away_change),
        f"{prefix}band_ratio": finite_or_none(band_ratio),
    }
    skin, frac = (None, 0.0)
    if prepared.body is not None:
        skin, frac = body_skin_change(prepared.body, work_candidate, work_covered)
    out[f"{prefix}body_skin_delta_e"] = finite_or_none(skin)
    if not prefix:
        out["body_skin_area_frac"] = frac
    return out


def _against_floor(
    prepared: LocalitySource,
    work_floor: np.ndarray,
    work_candidate: np.ndarray,
    work_covered: np.ndarray | None = None,
) -> dict[str, float | None]:
    """The :data:`AGAINST_FLOOR` measures of ``work_candidate`` against the floor output itself
    (``work_floor``, the editor's rendition of the unchanged photo on the working grid), not
    against the source: what the candidate changed beyond the editor's own re-rendering.

    Subtracting two shifts measured against the source (``|c - s| - |f - s|``) loses their
    signs: a cast opposite to the decoder's own colour bias came out below the floor
    (London 022's cast, -0.0039). Here ``global_shift`` is the medians of ``c - f`` over the
    region away from the face (:func:`global_change`)."""
    sample = prepared.sample.covered_by(work_covered)
    floor_low = lowpass(work_floor)
    floor_values = floor_low[sample.rows, sample.cols].astype(np.float32)
    floor_sample = RegionSample(sample.rows, sample.cols, floor_values, sample.far)
    shift, _ = _global_change_at(floor_sample, lowpass(work_candidate))
    return {"global_shift": finite_or_none(shift)}


#: The measures taken against the floor output itself when the pair has it
#: (:func:`_against_floor`); the others are judged as their measure minus the floor's (a
#: spread ratio or a body-skin mean against another re-rendering adds that rendering's own
#: misregistration at every edge: on the corpus both moved good edits more than failures).
AGAINST_FLOOR = ("global_shift",)


#: The measures judged relative to the editor's noise floor (:func:`noise_floor_of`): the
#: four upper bounds, and the face change a copy would show (``min_face_change``).
FLOOR_RELATIVE = ("changed_share", "global_shift", "global_gain_change", "body_skin_delta_e", "face_change")


def noise_floor_of(pair: PairContext) -> dict | None:
    """The editor's noise floor for this pair's source, when the caller has one: the locality
    metrics of the editor's output for the request "return this photo unchanged"
    (``pair.extras["noise_floor"]``, a ``{metric: value}`` mapping), else None.

    Every editor that decodes through a latent autoencoder re-synthesises the whole image, and
    how much that moves each measure depends on the photo (fine fabric, text and flags move
    ``changed_share``; a colour bias of the decoder moves ``global_shift``). With a floor, the
    :data:`FLOOR_RELATIVE` measures are judged as their excess over it (``<metric>_above_floor``,
    recorded beside ``floor_<metric>``), so the limits hold for a new editor without
    recalibration; without one they are judged as measured. That holds for ``face_change`` too:
    the decoder alone moves a copy's band-limited face change by about 0.016 on a
    finely textured face (``obama_partial_face.jpg`` through TAEF2), more than a small good
    edit of a smooth face shows in all, so a copy is told from an edit by how far its face
    changed beyond the editor's own copy of the photo.
    """
    floor = (pair.extras or {}).get("noise_floor")
    return dict(floor) if floor else None


#: ``pair.extras`` key of the editor's floor output itself: ``(H, W, 3)`` uint8, registered to
#: the source like the candidate (the floor candidate's aligned image)
FLOOR_IMAGE = "noise_floor_image"


#: ``pair.extras`` key of a cohort floor (:mod:`counterfactory.validation.cohort`): its image
#: on the pair's working grid, ``(h, w, 3)`` uint8 (``source[::stride, ::stride]``'s shape)
FLOOR_WORK_IMAGE = "noise_floor_work_image"


def floor_work_image_of(pair: PairContext) -> np.ndarray | None:
    """The floor output on the working grid (``pair.extras[FLOOR_WORK_IMAGE]``), or None when
    the caller has none or it is not the working grid's shape."""
    image = (pair.extras or {}).get(FLOOR_WORK_IMAGE)
    if image is None or getattr(image, "shape", None) != pair.work_source.shape:
        return None
    return image


def floor_image_of(pair: PairContext) -> np.ndarray | None:
    """The floor output (``pair.extras[FLOOR_IMAGE]``), or None when the caller has none or it
    is not the source's shape."""
    image = (pair.extras or {}).get(FLOOR_IMAGE)
    if image is None or getattr(image, "shape", None) != pair.source.shape:
        return None
    return image


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
    min_face_change: float | None = None,
    min_band_ratio: float | None = None,
    max_excess_share: float | None = None,
    cohort: Mapping[str, Any] | None = None,
    no_floor: Mapping[str, Any] | None = None,
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
    (judged only without a noise floor) or whose band-limited change stays under
    ``min_face_change`` (above the floor's, with one) goes to review as
    ``locality_face_unchanged`` (its ratio is noise and is not judged).
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
    ``focus_ratio``.
    Judged figures are those of ``pair.candidate`` (what is released).

    The judging path (``floor_path``, :data:`FLOOR_PATHS`) is ``request`` with a floor request's
    measures (``pair.extras["noise_floor"]``), ``cohort`` with a cohort floor (its image on the
    working grid, ``pair.extras[FLOOR_WORK_IMAGE]``, whose measures are taken here as a floor
    request's are), else ``none``. ``cohort`` / ``no_floor`` (:class:`LocalityPathConfig`) replace
    the :data:`PATH_THRESHOLDS` on their path when given.
    """
    floor = noise_floor_of(pair)
    path = "none" if floor is None else str(floor.get("path", "request"))
    chosen = {"cohort": cohort, "none": no_floor}.get(path)
    if chosen is not None:
        values = {k: chosen.get(k) for k in PATH_THRESHOLDS}
        min_diff_face, max_changed_share = values["min_diff_face"], values["max_changed_share"]
        max_global_shift, max_global_gain_change = values["max_global_shift"], values["max_global_gain_change"]
        max_body_skin_delta_e, min_face_change = values["max_body_skin_delta_e"], values["min_face_change"]
        max_excess_share = values["max_excess_share"]
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
        "min_face_change": min_face_change,
        "min_band_ratio": min_band_ratio,
        "max_excess_share": max_excess_share,
        "ratio_floor": RATIO_FLOOR,
        "local_change_level": LOCAL_CHANGE_LEVEL,
        "band_frac": BAND_FRAC,
        "min_change_area_frac": MIN_CHANGE_AREA_FRAC,
        "excess_level": EXCESS_LEVEL,
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
    prepared = pair.source_data("locality")
    if prepared is None and face is not None and pair.face_mask is not None:
        prepared = _prepare(
            pair.work_source, face, pair.face_mask, pair.face_mask_mode, pair.stride, None, pair.edit_region_mask
        )
    oval = prepared.oval if prepared is not None else pair.face_mask
    # the stack draws face masks as {0, 255} already; only caller-given edit masks are coerced
    m = locality_metrics(pair.source, pair.candidate, pair.face_mask, edit_mask, pair.covered, oval_mask=oval)
    metrics: dict = {"mask_mode": pair.face_mask_mode, **({"floor_path": path} if pair.kind == "face" else {}), **m}
    against: dict[str, float | None] | None = None
    if prepared is not None:
        metrics.update(_face_measures(prepared, pair.work_source, pair.work_candidate, work_covered=pair.work_covered))
        floor_image, stride = floor_image_of(pair), pair.stride
        work_floor = floor_work_image_of(pair)
        if floor_image is None and work_floor is not None:
            floor_image, stride = work_floor, 1
        if path == "cohort" and work_floor is not None:
            # the cohort's floor is measured here as a floor request's output is when it is
            # judged, except its face: the other candidates' faces are edited too
            measured = _face_measures(prepared, pair.work_source, work_floor, work_covered=pair.work_covered)
            floor = {**floor, **{k: measured[k] for k in FLOOR_RELATIVE if k != "face_change"}}
            metrics["floor_members"] = floor.get("members")
        if floor_image is not None:
            k = stride
            work_floor_image = floor_image if k == 1 else np.ascontiguousarray(floor_image[::k, ::k])
            against = _against_floor(prepared, work_floor_image, pair.work_candidate, pair.work_covered)
            region = prepared.work_region
            if pair.work_covered is not None:
                region = np.where(pair.work_covered, region, np.uint8(0))
            metrics["excess_share"] = finite_or_none(
                excess_share(pair.work_source, pair.work_candidate, floor_image, region, stride)
            )
    raw = pair.raw_candidate
    if raw is not None and raw.shape == pair.source.shape:
        r = locality_metrics(pair.source, raw, pair.face_mask, edit_mask, pair.covered, oval_mask=oval)
        metrics.update({f"raw_{k}": r.get(k) for k in ("diff_face", "diff_nonface", "ratio", "diff_outside_edit")})
        if prepared is not None:
            k = prepared.stride
            work_raw = raw if k == 1 else np.ascontiguousarray(raw[::k, ::k])
            metrics.update(
                _face_measures(prepared, pair.work_source, work_raw, prefix="raw_", work_covered=pair.work_covered)
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
            min_face_change,
            min_band_ratio,
            max_excess_share,
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
                base = None if floor is None else finite_or_none(floor.get(key))
                if value is not None and base is not None:
                    # judged above the editor's own re-rendering of this photo: against its
                    # output itself where the pair has it, else as the measures' difference
                    metrics[f"floor_{key}"] = base
                    direct = against.get(key) if key in AGAINST_FLOOR and against is not None else None
                    value = metrics[f"{key}_above_floor"] = direct if direct is not None else value - base
                if bound is not None and value is not None and value > bound:
                    reasons.append(code)
            excess = metrics.get("excess_share")
            if max_excess_share is not None and excess is not None and excess > max_excess_share:
                reasons.append("locality_excess_share_above_max")
            face_change = metrics.get("face_change")
            floor_face = None if floor is None else finite_or_none(floor.get("face_change"))
            if face_change is not None and floor_face is not None:
                metrics["floor_face_change"] = floor_face
                face_change = metrics["face_change_above_floor"] = face_change - floor_face
            # FOCUS's raw diff_face tells a copy only where nothing re-renders the pixels: with
            # the editor's floor, the face change above it does (a subtle good edit's re-rendered
            # face differs by less than 0.02 on its own, a copy's by up to 0.026)
            raw_copy = min_diff_face is not None and floor_face is None and m["diff_face"] < min_diff_face
            unchanged = raw_copy or (
                min_face_change is not None and face_change is not None and face_change < min_face_change
            )
            if unchanged:
                review.append("locality_face_unchanged")
            elif min_ratio is not None and (m["ratio"] is None or m["ratio"] < min_ratio):
                reasons.append("locality_ratio_below_min")
            elif min_band_ratio is not None and (
                metrics.get("band_ratio") is None or metrics["band_ratio"] < min_band_ratio
            ):
                reasons.append("locality_band_ratio_below_min")

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


def _prepare(
    work_source: np.ndarray,
    face,
    face_mask: np.ndarray,
    mode: str,
    stride: int,
    person: np.ndarray | None,
    region: np.ndarray | None = None,
) -> LocalitySource:
    shape = (face_mask.shape[0], face_mask.shape[1])
    oval = draw_face_mask(face.landmarks, shape, mode="oval") if mode != "oval" else face_mask
    return prepare_locality_source(work_source, oval, face.size_px, stride, person, region)


class LocalityGate:
    """:func:`locality_gate` with its thresholds bound (no model: masks come with the pair)."""

    name = "locality"

    def __init__(self, config: LocalityGateConfig) -> None:
        self.config = config

    @property
    def needs_person(self) -> bool:
        """Whether body skin is judged, which needs the source's person segmentation."""
        return self.config.max_body_skin_delta_e is not None

    def prepare(self, source: np.ndarray, analysis: SourceAnalysis) -> LocalitySource | None:
        """The source's :class:`LocalitySource` (None without a face), once per source."""
        if not analysis.faces or analysis.face_mask is None:
            return None
        person = analysis.person if self.needs_person else None
        k = analysis.stride
        work = analysis.work_image if analysis.work_image is not None else np.ascontiguousarray(source[::k, ::k])
        return _prepare(
            work, analysis.faces[0], analysis.face_mask, analysis.face_mask_mode, k, person, analysis.region_mask
        )

    def __call__(self, pair: PairContext) -> GateResult:
        return locality_gate(pair, **self.config.model_dump())


GATES.register("locality", LocalityGateConfig, LocalityGate, order=40)
