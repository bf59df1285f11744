"""The locality measures of one aligned pair, raw and against a floor output.

:func:`locality_metrics` takes FOCUS's figures (mean absolute difference inside and outside
the face, their ratio; the limb figures with an edit mask); :func:`prepare_locality_source`
computes the source side of the face measures once per source, :func:`face_measures` the
candidate side (band-limited change away from the face, global shift and spread, body skin,
face change) and :func:`against_floor` the measures taken against an editor's floor output
itself (:data:`AGAINST_FLOOR`). Pure functions; the locality gate turns them into a verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np

from counterfactory.validation.metrics.body_skin import (
    MIN_HAIR_FRAC,
    BodySkin,
    body_skin_change,
    body_skin_reference,
    hair_reference,
)
from counterfactory.validation.metrics.pixels import (
    CHANNEL_MEAN,
    EXCESS_SHIFT_PX,
    FACE_MARGIN_FRAC,
    LARGEST_CHANGE_BORDER_FRAC,
    RATIO_FLOOR,
    STRATA_MARGIN_FRAC,
    FloorSide,
    RegionSample,
    away_from_face,
    coherent_share,
    finite_or_none,
    floor_side,
    global_change_at,
    inset,
    largest_change_share,
    lowpass,
    mean_abs_diff,
    mean_of,
    pad_source,
    region_sum,
    sample_region,
)


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
    total, n_total = region_sum(diff, cov)
    out: dict[str, float | None] = {
        "diff_all": finite_or_none(mean_of(total, n_total)),
        "covered_share": 1.0 if cov is None else n_total / n,
    }
    if face_mask is not None:
        face_mask = within(face_mask)
        face_sum, n_face = region_sum(diff, face_mask)
        if oval_mask is None:
            oval_sum, n_oval = face_sum, n_face
        else:
            oval_sum, n_oval = region_sum(diff, within(oval_mask))
        d_face = mean_of(face_sum, n_face)
        d_non = mean_of(total - oval_sum, n_total - n_oval)
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
        hair: the person's pixels around the head above the eyes, outside the region
            (:func:`~counterfactory.validation.metrics.body_skin.hair_reference`), or None
            without a person segmentation.
        padded: the working-grid source padded for per-pixel matching
            (:func:`~counterfactory.validation.metrics.pixels.largest_change_share`), or None.
        inner_region: ``work_region`` without the image's rim
            (:data:`~counterfactory.validation.metrics.pixels.LARGEST_CHANGE_BORDER_FRAC`): where
            the largest area of change is read; None: not measured.
    """

    oval: np.ndarray
    stride: int
    work_region: np.ndarray
    sample: RegionSample
    body: BodySkin | None
    work_oval: np.ndarray | None = None
    source_low: np.ndarray | None = None
    hair: BodySkin | None = None
    padded: np.ndarray | None = None
    inner_region: np.ndarray | None = None


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
            is "away from the face", "body skin" and "hair" are measured outside it.
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
    hair = hair_reference(work_source, work_oval, person, size, work_edit, body) if person is not None else None
    inner = inset(away, LARGEST_CHANGE_BORDER_FRAC)
    return LocalitySource(
        oval, stride, away, sample_region(low, away, far), body, work_oval, low, hair, pad_source(work_source), inner
    )


def face_measures(
    prepared: LocalitySource,
    work_source: np.ndarray,
    work_candidate: np.ndarray,
    prefix: str = "",
    work_covered: np.ndarray | None = None,
    candidate_low: np.ndarray | None = None,
    candidate_diff: np.ndarray | None = None,
) -> dict[str, float | None]:
    """The face measures of ``work_candidate`` against the source (prefix ``prefix``);
    ``candidate_low``: its :func:`lowpass` when the caller has it (the gate takes it once per
    pair for these and :func:`against_floor`); ``candidate_diff``: its
    :func:`~counterfactory.validation.metrics.pixels.matched_diff` from ``prepared.padded``
    when the caller has it (the gate takes it once per pair for these and the excess share)."""
    region = prepared.work_region
    oval = prepared.work_oval
    if work_covered is not None:
        region = np.where(work_covered, region, np.uint8(0))
        oval = None if oval is None else np.where(work_covered, oval, np.uint8(0))
    source_low = prepared.source_low if prepared.source_low is not None else lowpass(work_source)
    cand_low = lowpass(work_candidate) if candidate_low is None else candidate_low
    band = cv2.transform(cv2.absdiff(cand_low, source_low), CHANNEL_MEAN)
    shift, gain = global_change_at(prepared.sample.covered_by(work_covered), cand_low)
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
    hair = None
    if prepared.hair is not None:
        hair, _ = body_skin_change(prepared.hair, work_candidate, work_covered, MIN_HAIR_FRAC)
    out[f"{prefix}hair_delta_e"] = finite_or_none(hair)
    largest = None
    if prepared.inner_region is not None:
        inner = prepared.inner_region
        if work_covered is not None:
            inner = np.where(work_covered, inner, np.uint8(0))
        largest = largest_change_share(work_source, work_candidate, inner, padded=prepared.padded, diff=candidate_diff)
    out[f"{prefix}largest_change_share"] = finite_or_none(largest)
    if not prefix:
        out["body_skin_area_frac"] = frac
    return out


def against_floor(
    prepared: LocalitySource,
    work_floor: np.ndarray | None,
    work_candidate: np.ndarray,
    work_covered: np.ndarray | None = None,
    *,
    candidate_low: np.ndarray | None = None,
    floor_low: np.ndarray | None = None,
) -> dict[str, float | None]:
    """The :data:`AGAINST_FLOOR` measures of ``work_candidate`` against the floor output itself
    (``work_floor``, the editor's rendition of the unchanged photo on the working grid), not
    against the source: what the candidate changed beyond the editor's own re-rendering.

    Subtracting two shifts measured against the source (``|c - s| - |f - s|``) loses their
    signs: a cast opposite to the decoder's own colour bias came out below the floor
    (London 022's cast, -0.0039). Here ``global_shift`` is the medians of ``c - f`` over the
    region away from the face (:func:`global_change`). ``candidate_low`` and ``floor_low``:
    the two images' :func:`lowpass` when the caller has them (the floor's is the same for
    every cell of a template; ``work_floor`` may then be None)."""
    sample = prepared.sample.covered_by(work_covered)
    floor_low = lowpass(work_floor) if floor_low is None else floor_low
    floor_values = floor_low[sample.rows, sample.cols].astype(np.float32)
    floor_sample = RegionSample(sample.rows, sample.cols, floor_values, sample.far)
    cand_low = lowpass(work_candidate) if candidate_low is None else candidate_low
    shift, _ = global_change_at(floor_sample, cand_low)
    return {"global_shift": finite_or_none(shift)}


@dataclass(frozen=True)
class FloorGrid:
    """The floor output's side of the measures against it on one source's working grid, the
    same for every cell of a template: made once per template (:func:`prepare_floor`) by the
    caller and handed to each cell's :func:`against_floor` and excess share.

    Attributes:
        low: :func:`lowpass` of the floor output on the working grid.
        side: :func:`~counterfactory.validation.metrics.pixels.floor_side` of the source and
            the floor (the excess share's source side and the floor's grown difference).
    """

    low: np.ndarray
    side: FloorSide


def prepare_floor(
    prepared: LocalitySource,
    work_source: np.ndarray,
    floor_image: np.ndarray,
    stride: int,
    *,
    floor_diff: np.ndarray | None = None,
    floor_low: np.ndarray | None = None,
) -> FloorGrid:
    """:class:`FloorGrid` of ``floor_image`` (full size, of which every ``stride``-th pixel is the
    working grid; ``stride`` 1: on the grid already) against the source ``prepared`` describes
    (``work_source``: the source on the working grid). ``floor_diff``: the floor's
    :func:`~counterfactory.validation.metrics.pixels.matched_diff` from ``prepared.padded``
    when the caller took it already; ``floor_low``: its :func:`lowpass` on the grid likewise."""
    if floor_low is None:
        on_grid = floor_image if stride == 1 else np.ascontiguousarray(floor_image[::stride, ::stride])
        floor_low = lowpass(on_grid)
    low = floor_low.view()
    low.flags.writeable = False
    padded = source_padding(prepared, work_source)
    if padded is None:
        floor_diff = None
    return FloorGrid(low, floor_side(work_source, floor_image, stride, padded, floor_diff=floor_diff))


def source_padding(prepared: LocalitySource, work_source: np.ndarray) -> np.ndarray | None:
    """``prepared.padded`` when it is ``work_source``'s padding (its shape fits), else None."""
    padded = prepared.padded
    if padded is not None and padded.shape[:2] != (
        work_source.shape[0] + 2 * EXCESS_SHIFT_PX,
        work_source.shape[1] + 2 * EXCESS_SHIFT_PX,
    ):
        return None
    return padded


#: The measures taken against the floor output itself when the pair has it
#: (:func:`against_floor`); the others are judged as their measure minus the floor's (a
#: spread ratio or a body-skin mean against another re-rendering adds that rendering's own
#: misregistration at every edge: on the corpus both moved good edits more than failures).
AGAINST_FLOOR = ("global_shift",)
