"""Body skin and hair: the person's skin outside the head and the hair around it, and how far
an output moved their colour.

:func:`body_skin_reference` finds, on the source, the pixels of the person (the selfie
segmenter's mask) outside the edit region whose colour is close to the face skin's;
:func:`body_skin_change` is the CIELAB colour difference of the candidate there. Pure
functions; the locality gate judges the figure (:mod:`counterfactory.validation.gates.locality`).
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from counterfactory.generation.masks import dilate
from counterfactory.validation.metrics.pixels import (
    grow_face,
    read_only,
    to_lab,
)
from counterfactory.validation.segment import PERSON_THRESHOLD, work_stride

#: Body skin: a source pixel is skin when its CIELAB a*b* lies within this distance of the
#: face skin's median and its L* within :data:`SKIN_L_RANGE`.
SKIN_AB_DISTANCE = 10.0
SKIN_L_RANGE = 30.0
#: Fewer skin pixels outside the head than this share of the image: body skin not measured.
MIN_BODY_SKIN_FRAC = 0.002
#: Hair: the person's pixels within this many face sizes of the face oval, above the oval's
#: middle (the eyes), outside the edit region grown by the face margin and not body skin.
HAIR_REACH_FRAC = 0.6
#: Fewer such pixels than this share of the image (a bald head, a crop at the brow): not measured.
MIN_HAIR_FRAC = 0.002


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


def hair_reference(
    source: np.ndarray,
    face_mask: np.ndarray,
    person: np.ndarray,
    face_size_px: float,
    region: np.ndarray | None = None,
    body: BodySkin | None = None,
) -> BodySkin:
    """Find the hair around the head in ``source``: the person's pixels within
    :data:`HAIR_REACH_FRAC` face sizes of the oval and above its middle row, outside the edit
    region (or the oval) grown by the face margin, less the body-skin pixels ``body`` names
    (they are judged as body skin). Hair, or a hat or headscarf: what a request to change only
    the face must leave as it was. Arguments as :func:`body_skin_reference`'s."""
    reach = dilate(face_mask, int(round(HAIR_REACH_FRAC * face_size_px))) > 0
    grown = grow_face(face_mask if region is None else region, face_size_px) > 0
    ys = np.nonzero(face_mask.any(axis=1))[0]
    above = np.zeros(face_mask.shape[:2], bool)
    if ys.size:
        above[: int((ys[0] + ys[-1]) // 2)] = True
    where = _person_binary(person) & reach & ~grown & above
    if body is not None and body.rows.size:
        where[body.rows, body.cols] = False
    rows, cols = np.nonzero(where)
    return BodySkin(rows, cols, _lab_of(source[rows, cols]), int(source.shape[0] * source.shape[1]))


def body_skin_change(
    body: BodySkin, candidate: np.ndarray, covered: np.ndarray | None = None, min_frac: float = MIN_BODY_SKIN_FRAC
) -> tuple[float | None, float]:
    """``(delta_e, area_frac)`` of ``candidate`` (same grid as the source ``body`` was found
    in) over the body-skin pixels where ``covered`` (bool, same grid; None: all) holds; see
    :func:`body_skin_drift`. The hair (:func:`hair_reference`) is measured the same way, with
    ``min_frac`` :data:`MIN_HAIR_FRAC`."""
    rows, cols, lab = body.rows, body.cols, body.source_lab
    if covered is not None:
        keep = covered[rows, cols]
        rows, cols, lab = rows[keep], cols[keep], lab[keep]
    frac = float(rows.size / body.grid_pixels)
    if frac < min_frac:
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


_DISC3 = read_only(cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (3, 3)))


def _lab_of(pixels: np.ndarray) -> np.ndarray:
    """``(N, 3)`` float32 CIELAB of ``(N, 3)`` uint8 RGB pixels."""
    if pixels.shape[0] == 0:
        return np.zeros((0, 3), np.float32)
    return to_lab(np.ascontiguousarray(pixels).reshape(-1, 1, 3)).reshape(-1, 3)


def _lab_at(image: np.ndarray, where: np.ndarray) -> np.ndarray:
    """``(N, 3)`` float32 CIELAB of ``image``'s pixels where ``where`` is True."""
    return _lab_of(image[where])
