"""Pixel metrics of an aligned pair: pure functions, arrays in and numbers out.

What the locality gate (:mod:`counterfactory.validation.gates.locality`) judges is measured
here: mean absolute differences over regions, the band-limited difference (:func:`band_diff`)
and the share of coherent change away from the face (:func:`coherent_share`,
:func:`changed_share`), the excess over an editor's own "return this photo unchanged" output
(:func:`excess_change`), the largest connected area of per-pixel change of a lone pair
(:func:`largest_change_share`), and the global shift and spread change of a region (:func:`global_change`).
No thresholds and no verdicts: the constants below say how a measure is taken, not what passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import cv2
import numpy as np

from counterfactory.generation.masks import dilate
from counterfactory.validation.segment import work_stride

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
#: ``largest_change_share`` (a lone pair: nothing to compare with but the source): a pixel is
#: changed where its per-pixel difference from the source (:func:`matched_diff`: matched within
#: :data:`EXCESS_SHIFT_PX`, smoothed over a pixel's neighbours) exceeds this, in [0, 1] (20 grey
#: levels): a re-rendering decoder moves texture by less at nearly every pixel, and where it
#: moves more (a sharp edge) the changed pixels are specks and thin lines ...
LARGEST_CHANGE_LEVEL = 20.0 / 255.0
#: ... changed pixels within this many working-grid pixels of each other are one area (the
#: letters of a word, a pasted patch broken by a plain stretch of it) ...
LARGEST_CHANGE_JOIN_PX = 2
#: ... and a band this fraction of the shorter side along the image edge is left out: an
#: editor's 0.5-2 % zoom about the centre and its shift move the frame's rim by up to 1 % of the
#: side, and registration fills what the output does not cover with reflected pixels (the
#: largest areas of the corpus's good edits lay there, one to three pixels thin).
LARGEST_CHANGE_BORDER_FRAC = 0.04
#: The face region grown by this fraction of the face size before measuring outside it:
#: face edits are feathered across the oval's edge.
FACE_MARGIN_FRAC = 0.10
#: Band along the image edge left out of ``changed_share`` and the global measures, as a
#: fraction of the shorter side: registration replicates border pixels there.
BORDER_FRAC = 0.02


def read_only(array: np.ndarray) -> np.ndarray:
    """``array``, marked read-only: how a module here keeps a constant array (nothing under
    ``validation/metrics/`` holds state between calls; ``tests/validation/metrics/test_stateless.py``)."""
    array.flags.writeable = False
    return array


def finite_or_none(value: float | None) -> float | None:
    """``float(value)`` when finite, else None (metrics must survive JSON and Parquet)."""
    if value is None:
        return None
    v = float(value)
    return v if math.isfinite(v) else None


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


def region_sum(diff: np.ndarray, mask: np.ndarray | None) -> tuple[float, int]:
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


def mean_of(total: float, count: int) -> float:
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
    grey = cv2.transform(cv2.absdiff(source, candidate).astype(np.float32), CHANNEL_MEAN)
    return cv2.GaussianBlur(grey, (0, 0), sigmaX=max(SMOOTH_FRAC * math.sqrt(h * w), 0.5))


CHANNEL_MEAN = read_only(np.full((1, 3), 1.0 / (3.0 * 255.0), np.float32))


def band_sigma(shape: tuple[int, ...]) -> float:
    """Sigma in pixels of :data:`BAND_FRAC` on a grid of ``shape`` ``(h, w, ...)``."""
    return max(BAND_FRAC * math.sqrt(shape[0] * shape[1]), 0.5)


def _gaussian_kernel(sigma: float) -> np.ndarray:
    """OpenCV's own Gaussian kernel for a float image at ``sigma`` (4 sigma each side, the size
    ``GaussianBlur`` picks); a few microseconds, made per call (no module-level cache here)."""
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
    return cv2.transform(d, CHANNEL_MEAN)


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


def pad_source(work_source: np.ndarray) -> np.ndarray:
    """float32 ``work_source`` padded by :data:`EXCESS_SHIFT_PX` (edge replicated): the source
    side of :func:`matched_diff`, made once per source
    (:attr:`~counterfactory.validation.metrics.floor.LocalitySource.padded`)."""
    r = EXCESS_SHIFT_PX
    return cv2.copyMakeBorder(work_source.astype(np.float32), r, r, r, r, cv2.BORDER_REPLICATE)


def matched_diff(padded: np.ndarray, image: np.ndarray) -> np.ndarray:
    """``(h, w)`` float32 in [0, 1], read-only: at each pixel of ``image`` (uint8 ``(h, w, 3)``),
    the smallest channel mean of ``|image - source|`` over the source's pixels within
    :data:`EXCESS_SHIFT_PX` of it (``padded``: :func:`pad_source` of the source, same grid),
    smoothed with sigma :data:`EXCESS_SMOOTH_PX`.

    The shift tolerance makes a sharp edge registered a pixel apart (on a working grid of
    every k-th pixel, k pixels: an output resized up from an editor's smaller frame, a fraction
    of a percent of scale, or a sampled pixel landing on the edge's other side) differ by
    little; a colour that is nowhere near (text, a pasted or erased patch) differs fully.

    A candidate's difference serves both :func:`largest_change_share` and
    :func:`excess_change`: the caller takes it once per pair and hands it to both (``diff=`` /
    ``candidate_diff=``); nothing is kept here between calls.
    """
    b = image.astype(np.float32)
    h, w = b.shape[:2]
    best = None
    for dy in range(2 * EXCESS_SHIFT_PX + 1):
        for dx in range(2 * EXCESS_SHIFT_PX + 1):
            d = cv2.transform(cv2.absdiff(b, padded[dy : dy + h, dx : dx + w]), CHANNEL_MEAN)
            best = d if best is None else np.minimum(best, d, out=best)
    out = cv2.GaussianBlur(best, (0, 0), sigmaX=EXCESS_SMOOTH_PX)
    out.flags.writeable = False
    return out


@dataclass(frozen=True)
class FloorSide:
    """What :func:`excess_change` needs of a source and its floor output, the same for every
    cell of a template: made once per template by the caller (:func:`floor_side`) and handed
    to each cell's measure.

    Attributes:
        padded: :func:`pad_source` of the source on the working grid.
        grown: the floor's :func:`matched_diff` from the source, grown by
            :data:`EXCESS_GROW_PX` (a max filter), on that grid.
    """

    padded: np.ndarray
    grown: np.ndarray


def floor_side(
    source: np.ndarray,
    floor: np.ndarray,
    stride: int = 1,
    padded: np.ndarray | None = None,
    *,
    floor_diff: np.ndarray | None = None,
) -> FloorSide:
    """The :class:`FloorSide` of ``source`` (uint8 on the working grid) and ``floor`` (full size,
    every ``stride``-th pixel that grid; ``stride`` 1: on the grid already); ``padded``:
    :func:`pad_source` of ``source`` when the caller has it, ``floor_diff``: the floor's
    :func:`matched_diff` from it when the caller took it already."""
    padded = pad_source(source) if padded is None else padded
    if floor_diff is None:
        on_grid = floor if stride == 1 else np.ascontiguousarray(floor[::stride, ::stride])
        floor_diff = matched_diff(padded, on_grid)
    grown = cv2.dilate(floor_diff, _square(EXCESS_GROW_PX))
    grown.flags.writeable = False
    return FloorSide(padded, grown)


def excess_change(
    source: np.ndarray,
    candidate: np.ndarray,
    floor: np.ndarray | None,
    stride: int = 1,
    *,
    padded: np.ndarray | None = None,
    side: FloorSide | None = None,
    candidate_diff: np.ndarray | None = None,
) -> np.ndarray:
    """``(h, w)`` float32: how much more ``candidate`` differs from ``source`` at each pixel
    than the editor's floor output ``floor`` does within :data:`EXCESS_GROW_PX` (both
    differences :func:`matched_diff`). ``source`` and ``candidate`` are uint8 on one grid;
    ``floor`` is the full-size output registered to the source, of which every ``stride``-th
    pixel is that grid (``stride`` 1: it is on the grid already).

    The floor is the same editor re-rendering the same photo with nothing asked: its own
    texture, grain and edge shifts are where it differs, and a candidate differing as much
    there is re-rendering too. What the candidate alone changes, an object pasted on a plain
    wall, text, an erased patch, stays at full per-pixel contrast, which the band limit of
    :func:`band_diff` would spread below its level when the change is thin or small. Where
    the floor output did not cover the frame its pixels are black, its difference large, and
    nothing there counts.

    ``side``: :func:`floor_side` of the source and floor, which the caller makes once per
    template (``floor`` may then be None); ``padded``: :func:`pad_source` of ``source`` when the
    caller has it; ``candidate_diff``: ``matched_diff(padded, candidate)`` when the caller took
    it already (for :func:`largest_change_share`).
    """
    if side is None:
        if floor is None:
            raise ValueError("excess_change needs the floor output or its FloorSide")
        side = floor_side(source, floor, stride, padded)
    diff = matched_diff(side.padded, candidate) if candidate_diff is None else candidate_diff
    return diff - side.grown


def excess_share(
    source: np.ndarray,
    candidate: np.ndarray,
    floor: np.ndarray | None,
    region: np.ndarray,
    stride: int = 1,
    *,
    padded: np.ndarray | None = None,
    side: FloorSide | None = None,
    candidate_diff: np.ndarray | None = None,
) -> float | None:
    """Share in [0, 1] of ``region``'s pixels in connected areas where :func:`excess_change`
    exceeds :data:`EXCESS_LEVEL` (at least :data:`MIN_CHANGE_AREA_FRAC` of the region each,
    :func:`coherent_share`); None for an empty region. ``source``, ``candidate`` and ``region``
    on one grid, ``floor`` full size with that grid its every ``stride``-th pixel; ``padded``,
    ``side`` and ``candidate_diff`` as :func:`excess_change` takes them."""
    change = excess_change(source, candidate, floor, stride, padded=padded, side=side, candidate_diff=candidate_diff)
    return coherent_share(change, region, EXCESS_LEVEL)


def inset(region: np.ndarray, frac: float) -> np.ndarray:
    """``region`` ({0, 255}) without a band ``frac`` of the shorter side along the image edge."""
    h, w = region.shape[:2]
    b = int(math.ceil(frac * min(h, w)))
    out = region.copy()
    if b > 0:
        out[:b] = 0
        out[-b:] = 0
        out[:, :b] = 0
        out[:, -b:] = 0
    return out


def largest_change_share(
    source: np.ndarray,
    candidate: np.ndarray,
    region: np.ndarray,
    *,
    padded: np.ndarray | None = None,
    diff: np.ndarray | None = None,
) -> float | None:
    """Share in [0, 1] of ``region``'s pixels changed in the largest connected area of change:
    where ``candidate`` differs from ``source`` at each pixel (:func:`matched_diff`) by more than
    :data:`LARGEST_CHANGE_LEVEL`, areas within :data:`LARGEST_CHANGE_JOIN_PX` of each other
    joined, the changed pixels of the largest counted (not the gaps); None for an empty region.

    ``source`` and ``candidate`` uint8 on one grid, ``region`` ({0, 255}, same grid) what is
    judged (the caller leaves out the image's rim, :data:`LARGEST_CHANGE_BORDER_FRAC`);
    ``padded``: :func:`pad_source` of ``source`` when the caller has it; ``diff``:
    ``matched_diff(padded, candidate)`` when the caller took it already (for :func:`excess_change`).

    A lone pair has no floor output to tell the editor's re-rendering from what it changed.
    The total share of band-limited change (:func:`coherent_share`) overlaps there: a
    re-rendered patterned shirt or plant spreads as much as a small object or thin text. At
    full per-pixel contrast, re-rendering changes little and diffusely (specks, edges moved a
    pixel), while a pasted object, text or an erased patch changes one compact place by far
    more than the level: the largest such area tells them apart where the sum does not.
    """
    n = cv2.countNonZero(region)
    if n == 0:
        return None
    if diff is None:
        diff = matched_diff(pad_source(source) if padded is None else padded, candidate)
    changed = ((diff > LARGEST_CHANGE_LEVEL) & (region > 0)).astype(np.uint8)
    if not changed.any():
        return 0.0
    joined = cv2.dilate(changed, _square(LARGEST_CHANGE_JOIN_PX)) if LARGEST_CHANGE_JOIN_PX > 0 else changed
    count, labels, _, _ = cv2.connectedComponentsWithStats(joined, connectivity=8)
    sizes = np.bincount(labels[changed > 0], minlength=count)[1:]
    return float(sizes.max() / n)


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
        source_channels, far_index, source_std: made with the sample (a source's, once for
            all its candidates): ``source.T`` contiguous, ``far``'s indices (None: all), and
            the source's per-channel standard deviation.
    """

    rows: np.ndarray
    cols: np.ndarray
    source: np.ndarray
    far: np.ndarray | None = None
    source_channels: np.ndarray = field(init=False, repr=False, compare=False)
    far_index: np.ndarray | None = field(init=False, repr=False, compare=False)
    source_std: np.ndarray = field(init=False, repr=False, compare=False)

    def covered_by(self, covered: np.ndarray | None) -> RegionSample:
        """The samples where ``covered`` (``(H, W)`` bool) is True; self for None."""
        if covered is None:
            return self
        keep = covered[self.rows, self.cols]
        far = None if self.far is None else self.far[keep]
        return RegionSample(self.rows[keep], self.cols[keep], self.source[keep], far)

    def __post_init__(self) -> None:
        # the source side every candidate's global_change_at reads (frozen: set here only)
        object.__setattr__(self, "source_channels", np.ascontiguousarray(self.source.T))
        object.__setattr__(self, "far_index", None if self.far is None else np.flatnonzero(self.far))
        object.__setattr__(self, "source_std", _channel_std(self.source) if self.source.size else np.zeros(3))


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
    return global_change_at(sample_region(source, region), candidate)


def global_change_at(sample: RegionSample, candidate: np.ndarray) -> tuple[float | None, float | None]:
    """:func:`global_change` on a prepared sample (``candidate`` on the sample's grid). The
    medians are :func:`numpy.median`'s to the digit (float32 low-pass values, no histogram holds
    them), each a selection in place (:func:`numpy.partition`), not a sort of a copy
    (``tests/validation/metrics/test_global_change.py`` compares both on real photos)."""
    if sample.rows.size == 0:
        return None, None
    flat = sample.rows * candidate.shape[1] + sample.cols
    cand = np.take(candidate.reshape(-1, candidate.shape[2]), flat, axis=0).astype(np.float32, copy=False)
    # per channel on contiguous rows: numpy reduces a 3-wide last axis slowly; the source's
    # rows are the sample's own (made once per source)
    cand_rows = np.ascontiguousarray(cand.T)
    src_rows = sample.source_channels
    diff = cand_rows - src_rows
    # a contrast or tone-curve change moves the dark and the light parts oppositely, and where
    # the image's mean is a plain wall's (a studio portrait) the whole-region median stays put:
    # the medians of each third by lightness too. Thirds of the mean of both images' lightness,
    # not of one's: choosing pixels by one image's noise biases the other's difference there.
    far = sample.far_index
    n_far = diff.shape[1] if far is None else far.size
    far_diff = lightness = None
    if n_far >= 3 * MIN_STRATUM_SAMPLES:
        if far is None:
            far_diff, both = diff.copy(), cand_rows + src_rows
        else:
            far_diff = np.take(diff, far, axis=1)
            both = np.take(cand_rows, far, axis=1) + np.take(src_rows, far, axis=1)
        lightness = both[0] + both[1]  # the channels summed in order, as a sum over them is
        lightness += both[2]
    shift = _largest_median(diff)  # partitions diff in place: the thirds read their copy
    if far_diff is not None and lightness is not None:
        low, high = np.quantile(lightness, [1 / 3, 2 / 3])
        for part in (lightness <= low, (lightness > low) & (lightness <= high), lightness > high):
            if np.count_nonzero(part) >= MIN_STRATUM_SAMPLES:
                shift = max(shift, _largest_median(far_diff[:, part]))
    s_std = sample.source_std
    c_std = _channel_std(cand)
    ok = s_std > 1.0
    gain = float(np.max(np.abs(c_std[ok] / s_std[ok] - 1.0))) if ok.any() else None
    return shift, gain


def _largest_median(rows: np.ndarray) -> float:
    """The largest |median| of the rows of ``rows`` (``(C, N)`` float32, reordered in place)
    over 255: :func:`numpy.median`'s (even ``N``: the two middle values' float32 mean)."""
    n = rows.shape[1]
    mid = n // 2
    if n % 2:
        rows.partition(mid, axis=1)
        medians = rows[:, mid]
    else:
        rows.partition([mid - 1, mid], axis=1)
        medians = (rows[:, mid - 1] + rows[:, mid]) / rows.dtype.type(2)
    return float(np.max(np.abs(medians))) / 255.0


def _channel_std(values: np.ndarray) -> np.ndarray:
    """``(3,)`` float64 population standard deviation of ``(N, 3)`` values, per channel."""
    _, std = cv2.meanStdDev(np.ascontiguousarray(values).reshape(-1, 1, 3))
    return std.reshape(3)


def to_lab(image: np.ndarray) -> np.ndarray:
    """``(H, W, 3)`` float32 CIELAB (L* in [0, 100], a* b* signed) of uint8 sRGB (D65)."""
    return cv2.cvtColor(image.astype(np.float32) / 255.0, cv2.COLOR_RGB2Lab)
