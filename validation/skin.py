"""Skin tone as the Individual Typology Angle (ITA°) over skin pixels, with no model download.

ITA° = arctan((L* - 50) / b*) x 180 / pi, from CIE L*a*b* (D65, sRGB input), computed per pixel
and summarised by the MEDIAN over the pixels of a region (robust to the highlights, shadows,
stubble and stray hair that a colour mask lets through). Higher ITA is lighter skin; the usual
bands are very light > 55 > light > 41 > intermediate > 28 > tan > 10 > brown > -30 > dark.
``atan2`` replaces ``arctan`` so that b* <= 0 (not a skin colour, but possible in a pixel)
gives a finite angle; for b* > 0 the two are identical.

Regions:

- face skin: the face-mesh oval minus the upper forehead, eyes, brows and lips
  (:func:`~counterfactory.validation.faces.face_mask` in ``skin`` mode), eroded so that the
  border with hair and background does not bleed in;
- body skin: exposed skin outside the face (neck, hands, arms): the person from the bundled
  MediaPipe selfie segmentation, minus the head (the face oval grown by a margin and the
  band above the chin), minus clothing and hair by a skin-colour gate in YCrCb whose centre
  and width are estimated from the face's own skin in the same image;
- inside a limb mask: the mask (eroded) limited to the generic skin chroma range of
  Chai & Ngan (1999), which admits every skin tone, so that an inpainted limb of the wrong
  tone is still measured instead of being filtered out.

References: Chardon, Cretois & Hourseau, "Skin colour typology and suntanning pathways",
Int. J. Cosmet. Sci. 13 (1991) (ITA° and its bands); Del Bino & Bernerd, "Variations in skin
colour and the biological consequences of ultraviolet radiation exposure", Br. J. Dermatol.
169 (2013); Chai & Ngan, "Face segmentation using skin-color map in videophone applications",
IEEE TCSVT 9 (1999) (Cr in [133, 173], Cb in [77, 127]); Seo et al. (2026) on editors that
lighten skin.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from counterfactory.validation.faces import FACE_OVAL, face_mask
from counterfactory.validation.segment import PersonSegmenter, work_stride

#: Chai & Ngan (1999) skin chroma box in YCrCb (OpenCV's 8-bit Cr, Cb).
GENERIC_CR = (133, 173)
GENERIC_CB = (77, 127)
#: Fewest pixels a region needs for its median to be reported (else None).
MIN_SKIN_PIXELS = 200
#: Body skin smaller than this share of the face skin is too little to trust (a collar edge,
#: a few pixels of a hand) and is reported as not measured.
MIN_BODY_SHARE = 0.05
#: The edit region is left out of body skin grown by this share of the face size (the editor
#: feathers its change across the region's edge).
REGION_MARGIN = 0.08
#: Body skin within this share of the image's long side from an edge is left out.
BORDER_SHARE = 0.04
#: At most this many pixels of a region are converted to Lab (an even stride over the
#: region); the median of 20k samples differs from the full median by well under 0.1 degree.
MAX_SAMPLES = 20000


def ita_deg(lab: np.ndarray) -> np.ndarray:
    """Per-pixel ITA° in degrees.

    Args:
        lab: ``(..., 3)`` float CIE L*a*b* (L* in [0, 100]).

    Returns:
        ``(...)`` float64 degrees, ``atan2(L* - 50, b*)`` in degrees (in (-90, 90) for b* > 0).
    """
    lab = np.asarray(lab, dtype=np.float64)
    return np.degrees(np.arctan2(lab[..., 0] - 50.0, lab[..., 2]))


def rgb_to_lab(rgb: np.ndarray) -> np.ndarray:
    """sRGB uint8 ``(..., 3)`` -> CIE L*a*b* float32 ``(..., 3)`` (D65), via OpenCV.

    OpenCV's float path rounds a* and b* to 1/64 and differs from the exact CIE formula by up
    to about 0.2 units, about 0.5 degree of ITA at mid lightness: far below the no-op ceiling.
    """
    a = np.ascontiguousarray(np.asarray(rgb, dtype=np.float32).reshape(-1, 1, 3) / 255.0)
    return cv2.cvtColor(a, cv2.COLOR_RGB2Lab).reshape(np.shape(rgb))


def region_ita(image: np.ndarray, mask: np.ndarray | None, *, min_pixels: int = MIN_SKIN_PIXELS) -> float | None:
    """Median ITA° over the pixels of ``image`` where ``mask`` is nonzero.

    Args:
        image: ``(H, W, 3)`` uint8 RGB.
        mask: ``(H, W)`` nonzero inside the region, or None.
        min_pixels: fewer pixels than this give None (too few to call a skin tone).

    Returns:
        The median per-pixel ITA° in degrees over (at most :data:`MAX_SAMPLES` evenly strided
        samples of) the region, or None.
    """
    if mask is None:
        return None
    flat = _mask_index(mask)
    if flat.size < min_pixels:
        return None
    # the strided sample's indices first, then only those pixels (the same pixels as striding
    # the gathered region)
    pixels = _masked_pixels(image, mask, flat[:: max(flat.size // MAX_SAMPLES, 1)])
    return float(np.median(ita_deg(rgb_to_lab(pixels))))


def _mask_index(mask: np.ndarray) -> np.ndarray:
    """Flat raster indices of ``mask``'s nonzero pixels."""
    return np.flatnonzero(np.asarray(mask).reshape(-1))


def _masked_pixels(image: np.ndarray, mask: np.ndarray, index: np.ndarray | None = None) -> np.ndarray:
    """``(N, 3)`` pixels of ``image`` where ``mask`` is nonzero, in raster order (only those at
    ``index``, flat indices of :func:`_mask_index`, when given)."""
    flat = _mask_index(mask) if index is None else index
    return np.ascontiguousarray(image).reshape(-1, image.shape[-1])[flat]


def _erode(mask: np.ndarray, px: int) -> np.ndarray:
    """Keep pixels at least ``px`` (Euclidean) inside ``mask``; a distance transform costs the
    same for any ``px``, where a morphological kernel grows with its area. Computed inside the
    mask's bounding box grown by one pixel (every pixel of that ring is outside the mask, so
    no distance changes)."""
    if px <= 0:
        return mask
    binary = (mask > 0).astype(np.uint8)
    out = np.zeros(mask.shape, np.uint8)
    y0, y1, x0, x1 = _box(binary, 1)
    if y1 <= y0:
        return out
    inside = cv2.distanceTransform(np.ascontiguousarray(binary[y0:y1, x0:x1]), cv2.DIST_L2, 3)
    out[y0:y1, x0:x1] = (inside > px) * np.uint8(255)
    return out


def _dilate(mask: np.ndarray, px: int) -> np.ndarray:
    """Grow ``mask`` by ``px`` pixels (Euclidean), via a distance transform of its outside,
    computed inside the mask's bounding box grown by ``px`` + 1 (nothing further can join)."""
    if px <= 0:
        return mask
    binary = (mask > 0).astype(np.uint8)
    out = np.zeros(mask.shape, np.uint8)
    y0, y1, x0, x1 = _box(binary, px + 1)
    if y1 <= y0:
        return out
    outside = cv2.distanceTransform(np.ascontiguousarray(1 - binary[y0:y1, x0:x1]), cv2.DIST_L2, 3)
    out[y0:y1, x0:x1] = (outside <= px) * np.uint8(255)
    return out


def _box(binary: np.ndarray, margin: int) -> tuple[int, int, int, int]:
    """``(y0, y1, x0, x1)`` of the nonzero pixels' bounding box grown by ``margin``, clipped
    to the image; empty (``y1 <= y0``) when there are none."""
    x, y, w, h = cv2.boundingRect(binary)
    if w == 0 or h == 0:
        return 0, 0, 0, 0
    rows, cols = binary.shape[:2]
    return max(y - margin, 0), min(y + h + margin, rows), max(x - margin, 0), min(x + w + margin, cols)


def _face_size(landmarks: np.ndarray) -> float:
    xy = landmarks[:, :2]
    w, h = np.ptp(xy[:, 0]), np.ptp(xy[:, 1])
    return float(math.sqrt(max(w, 1.0) * max(h, 1.0)))


def face_skin_mask(landmarks: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """``(H, W)`` uint8 {0, 255}: the face's skin (see the module docstring), eroded by 3 %
    of the face size."""
    mask = face_mask(landmarks, shape, mode="skin")
    return _erode(mask, max(int(round(0.03 * _face_size(landmarks))), 1))


@dataclass(frozen=True)
class SkinColourModel:
    """A YCrCb box around one person's skin, estimated from their face skin.

    Attributes:
        cr, cb: inclusive ``(low, high)`` 8-bit chroma bounds.
        y_min: darkest luma kept (deep shadow and hair fall below it).
    """

    cr: tuple[float, float]
    cb: tuple[float, float]
    y_min: float

    def mask(self, ycrcb: np.ndarray) -> np.ndarray:
        """``(H, W)`` bool of the pixels inside the box, from ``(H, W, 3)`` uint8 YCrCb."""
        y, cr, cb = ycrcb[..., 0], ycrcb[..., 1], ycrcb[..., 2]
        return (
            (cr >= self.cr[0])
            & (cr <= self.cr[1])
            & (cb >= self.cb[0])
            & (cb <= self.cb[1])
            & (y >= self.y_min)
            & (y <= 250)
        )


def skin_colour_model(image: np.ndarray, face_skin: np.ndarray, *, k: float = 3.0) -> SkinColourModel | None:
    """The :class:`SkinColourModel` of the face skin in ``image``: median ± ``k`` robust
    standard deviations (1.4826 x MAD, at least 4 levels) in Cr and Cb; luma down to 40 % of
    the face's median. None when the face shows too little skin."""
    pixels = _masked_pixels(image, face_skin)
    if pixels.shape[0] < MIN_SKIN_PIXELS:
        return None
    step = max(pixels.shape[0] // MAX_SAMPLES, 1)
    ycc = cv2.cvtColor(np.ascontiguousarray(pixels[::step].reshape(-1, 1, 3)), cv2.COLOR_RGB2YCrCb)
    ycc = ycc.reshape(-1, 3).astype(np.float64)

    def band(v: np.ndarray) -> tuple[float, float]:
        med = float(np.median(v))
        sd = max(1.4826 * float(np.median(np.abs(v - med))), 4.0)
        return med - k * sd, med + k * sd

    return SkinColourModel(cr=band(ycc[:, 1]), cb=band(ycc[:, 2]), y_min=0.4 * float(np.median(ycc[:, 0])))


def head_exclusion(landmarks: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """``(H, W)`` uint8 {0, 255}: the head, left out of body skin. The face oval grown by 25 %
    of the face size, and above the chin everything within the grown oval's columns (hair,
    ears, the forehead above the mesh)."""
    h, w = shape
    size = _face_size(landmarks)
    grow = max(int(round(0.25 * size)), 1)
    mask = np.zeros((h, w), np.uint8)
    cv2.fillPoly(mask, [np.round(landmarks[list(FACE_OVAL), :2]).astype(np.int32)], 255)
    mask = _dilate(mask, grow)
    xy = landmarks[list(FACE_OVAL), :2]
    x0 = max(int(math.floor(xy[:, 0].min())) - grow, 0)
    x1 = min(int(math.ceil(xy[:, 0].max())) + grow, w)
    chin = min(max(int(math.ceil(xy[:, 1].max())), 0), h)
    mask[:chin, x0:x1] = 255
    return mask


def body_skin_mask(
    image: np.ndarray,
    person: np.ndarray,
    landmarks: np.ndarray,
    *,
    exclude: np.ndarray | None = None,
    other_faces: Sequence[np.ndarray] = (),
    region: np.ndarray | None = None,
) -> np.ndarray:
    """``(H, W)`` uint8 {0, 255}: exposed skin outside the face and outside the edit region.

    Args:
        image: ``(H, W, 3)`` uint8 RGB.
        person: ``(H, W)`` float person probability in [0, 1] (:class:`PersonSegmenter`).
        landmarks: ``(478, >=2)`` face landmarks of the person (pixels).
        exclude: optional ``(H, W)`` region also left out (a limb edit mask), nonzero inside.
        other_faces: landmarks of the other people's faces, whose heads are left out too.
        region: optional ``(H, W)`` edit region the prompt names (face, neck, ears, facial
            hair: :func:`~counterfactory.validation.faces.region_mask`), nonzero inside; it is
            left out grown by :data:`REGION_MARGIN` of the face size, since skin the prompt
            asks to change is not body skin.

    Returns:
        person > 0.5, minus a border of :data:`BORDER_SHARE`, minus :func:`head_exclusion`
        of every face, minus ``exclude`` grown by 1 % of the
        image's long side, inside the face's :class:`SkinColourModel`, opened by a 3 x 3
        ellipse to drop isolated pixels. Empty when the face shows too little skin.
    """
    h, w = image.shape[:2]
    model = skin_colour_model(image, face_skin_mask(landmarks, (h, w)))
    if model is None:
        return np.zeros((h, w), np.uint8)
    keep = (person > 0.5) & (head_exclusion(landmarks, (h, w)) == 0)
    # Image borders hold warp fill, letterbox edges and furniture cut by the frame, which the
    # segmenter often calls person; no skin tone is judged there.
    border = max(int(round(BORDER_SHARE * max(h, w))), 1)
    keep[:border] = keep[-border:] = False
    keep[:, :border] = keep[:, -border:] = False
    for other in other_faces:
        keep &= head_exclusion(other, (h, w)) == 0
    if region is not None:
        grown = _dilate(
            (np.asarray(region) > 0).astype(np.uint8) * 255, int(round(REGION_MARGIN * _face_size(landmarks)))
        )
        keep &= grown == 0
    if exclude is not None:
        keep &= _dilate((np.asarray(exclude) > 0).astype(np.uint8) * 255, max(int(0.01 * max(h, w)), 1)) == 0
    ys, xs = np.nonzero(keep)
    out = np.zeros((h, w), np.uint8)
    if ys.size == 0:
        return out
    y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
    crop = np.ascontiguousarray(image[y0:y1, x0:x1])
    skin = model.mask(cv2.cvtColor(crop, cv2.COLOR_RGB2YCrCb)) & keep[y0:y1, x0:x1]
    out[y0:y1, x0:x1] = skin.astype(np.uint8) * 255
    return cv2.morphologyEx(out, cv2.MORPH_OPEN, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (3, 3)))


def inpaint_skin_mask(image: np.ndarray, edit_mask: np.ndarray) -> np.ndarray:
    """``(H, W)`` uint8 {0, 255}: the skin inside a limb edit mask, any tone.

    The mask is eroded by 1 % of the image's long side (the composite's feathered border
    mixes inside and outside) and limited to the generic chroma box
    (:data:`GENERIC_CR`, :data:`GENERIC_CB`) with luma in [20, 250].
    """
    h, w = image.shape[:2]
    inside = _erode((np.asarray(edit_mask) > 0).astype(np.uint8) * 255, max(int(0.01 * max(h, w)), 1))
    ys, xs = np.nonzero(inside)
    out = np.zeros((h, w), np.uint8)
    if ys.size == 0:
        return out
    y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
    ycc = cv2.cvtColor(np.ascontiguousarray(image[y0:y1, x0:x1]), cv2.COLOR_RGB2YCrCb)
    y, cr, cb = ycc[..., 0], ycc[..., 1], ycc[..., 2]
    skin = (
        (cr >= GENERIC_CR[0])
        & (cr <= GENERIC_CR[1])
        & (cb >= GENERIC_CB[0])
        & (cb <= GENERIC_CB[1])
        & (y >= 20)
        & (y <= 250)
    )
    out[y0:y1, x0:x1] = (skin & (inside[y0:y1, x0:x1] > 0)).astype(np.uint8) * 255
    return out


@dataclass(frozen=True)
class SkinTones:
    """Median ITA° (degrees, None where a region has too few pixels) of one image's regions.

    Attributes:
        face_ita_deg: face skin.
        body_ita_deg: exposed skin outside the face (and outside a limb mask); None when it
            is smaller than :data:`MIN_BODY_SHARE` of the face skin.
        inpaint_ita_deg: skin inside a limb edit mask (limb pairs only).
        face_pixels, body_pixels, inpaint_pixels: region sizes in pixels (full region, before sampling).
    """

    face_ita_deg: float | None
    body_ita_deg: float | None
    inpaint_ita_deg: float | None = None
    face_pixels: int = 0
    body_pixels: int = 0
    inpaint_pixels: int = 0


def measure_tones(
    image: np.ndarray,
    face_landmarks: np.ndarray | None,
    body_mask: np.ndarray | None,
    *,
    edit_mask: np.ndarray | None = None,
) -> SkinTones:
    """ITA° of one image's face skin, body skin (``body_mask``) and skin inside ``edit_mask``.

    Args:
        image: ``(H, W, 3)`` uint8 RGB.
        face_landmarks: ``(478, >=2)`` pixels of the subject's face, or None.
        body_mask: ``(H, W)`` body skin (:func:`body_skin_mask`, usually drawn on the source
            and used for both images of a pair so that both are measured on the same pixels).
        edit_mask: ``(H, W)`` limb edit mask, or None.
    """
    fmask = face_skin_mask(face_landmarks, image.shape[:2]) if face_landmarks is not None else None
    face_pixels = int(np.count_nonzero(fmask)) if fmask is not None else 0
    body_pixels = int(np.count_nonzero(body_mask)) if body_mask is not None else 0
    min_body = max(MIN_SKIN_PIXELS, int(MIN_BODY_SHARE * face_pixels))
    imask = inpaint_skin_mask(image, edit_mask) if edit_mask is not None else None
    return SkinTones(
        face_ita_deg=region_ita(image, fmask),
        body_ita_deg=region_ita(image, body_mask, min_pixels=min_body),
        inpaint_ita_deg=region_ita(image, imask),
        face_pixels=face_pixels,
        body_pixels=body_pixels,
        inpaint_pixels=int(np.count_nonzero(imask)) if imask is not None else 0,
    )


def _scaled(landmarks: np.ndarray | None, stride: int) -> np.ndarray | None:
    if landmarks is None:
        return None
    out = np.array(landmarks, dtype=np.float32, copy=True)
    out[:, :2] /= stride
    return out


@dataclass(frozen=True)
class SourceSkin:
    """The source side of :func:`measure_pair`, measured once per source at the working
    resolution (every ``stride``-th pixel, :func:`~counterfactory.validation.segment.work_stride`).

    Attributes:
        image: the strided source, ``(h, w, 3)`` uint8.
        stride: k.
        landmarks: the subject's landmarks scaled to the strided image, or None.
        body: ``(h, w)`` uint8 {0, 255} body skin (:func:`body_skin_mask`, no edit mask left
            out), or None without a face.
        tones: the source's :class:`SkinTones` over ``body``.
        person: the person probability the body mask was drawn from, or None.
        other_faces: the other faces' landmarks, scaled.
        region: the edit region on the strided grid (left out of body skin), or None.
    """

    image: np.ndarray
    stride: int
    landmarks: np.ndarray | None
    body: np.ndarray | None
    tones: SkinTones
    person: np.ndarray | None = None
    other_faces: tuple[np.ndarray, ...] = ()
    region: np.ndarray | None = None


def prepare_source_skin(
    source: np.ndarray,
    person: np.ndarray | None,
    *,
    source_landmarks: np.ndarray | None,
    other_faces: Sequence[np.ndarray] = (),
    work_source: np.ndarray | None = None,
    region: np.ndarray | None = None,
) -> SourceSkin:
    """Measure the source's skin once, for every candidate of that source.

    Args:
        source: ``(H, W, 3)`` uint8 RGB.
        person: the person probability of the strided source (``PersonSegmenter.segment`` of
            ``source[::k, ::k]``), or None when there is no face (not needed then).
        source_landmarks, other_faces: as in :func:`measure_pair`, full-resolution pixels.
        work_source: ``source[::k, ::k]`` when the caller has it already.
        region: ``(H, W)`` full-size edit region the prompt names, left out of body skin; None:
            only the head is left out.
    """
    k = work_stride(source.shape)
    src = work_source if work_source is not None else np.ascontiguousarray(source[::k, ::k])
    src_lm = _scaled(source_landmarks, k)
    others = tuple(_scaled(o, k) for o in other_faces)
    work_region = None if region is None else np.ascontiguousarray(np.asarray(region)[::k, ::k])
    body = None
    if src_lm is not None and person is not None:
        body = body_skin_mask(src, person, src_lm, other_faces=others, region=work_region)
    return SourceSkin(src, k, src_lm, body, measure_tones(src, src_lm, body), person, others, work_region)


def measure_candidate_skin(
    prepared: SourceSkin,
    candidate: np.ndarray,
    *,
    candidate_landmarks: np.ndarray | None,
    edit_mask: np.ndarray | None = None,
    covered: np.ndarray | None = None,
    work_candidate: np.ndarray | None = None,
) -> tuple[SkinTones, SkinTones]:
    """``(source tones, candidate tones)`` of one candidate against a :class:`SourceSkin`.

    The source's tones are re-measured only where this pair needs it: with an edit mask (left
    out of the body skin, and its own inside measured) or a ``covered`` part (body skin only
    there). Arguments as in :func:`measure_pair`; ``work_candidate`` is ``candidate[::k, ::k]``
    when the caller has it already.
    """
    k = prepared.stride
    src = prepared.image
    cand = work_candidate if work_candidate is not None else np.ascontiguousarray(candidate[::k, ::k])
    emask = np.ascontiguousarray(np.asarray(edit_mask)[::k, ::k]) if edit_mask is not None else None
    cand_lm = _scaled(candidate_landmarks, k) if candidate_landmarks is not None else prepared.landmarks
    body = prepared.body
    src_tones = prepared.tones
    if emask is not None and prepared.landmarks is not None and prepared.person is not None:
        body = body_skin_mask(
            src,
            prepared.person,
            prepared.landmarks,
            exclude=emask,
            other_faces=prepared.other_faces,
            region=prepared.region,
        )
    if body is not None and covered is not None:
        body = body.copy()
        body[~np.ascontiguousarray(np.asarray(covered, dtype=bool)[::k, ::k])] = 0
    if body is not prepared.body or emask is not None:
        src_tones = measure_tones(src, prepared.landmarks, body, edit_mask=emask)
    return src_tones, measure_tones(cand, cand_lm, body, edit_mask=emask)


def measure_pair(
    source: np.ndarray,
    candidate: np.ndarray,
    segmenter: PersonSegmenter,
    *,
    source_landmarks: np.ndarray | None,
    candidate_landmarks: np.ndarray | None,
    other_faces: Sequence[np.ndarray] = (),
    edit_mask: np.ndarray | None = None,
    covered: np.ndarray | None = None,
) -> tuple[SkinTones, SkinTones]:
    """Skin tones of an aligned pair, both measured on the SAME body pixels.

    The body mask is drawn once, on the source (person, head, colour model of the source's
    face), and applied to both images: the body is not what a face edit changes, and
    measuring the candidate on its own (possibly recoloured) face's colour model would move
    the mask with the edit. Each image's face skin comes from its own landmarks.
    (:func:`prepare_source_skin` then :func:`measure_candidate_skin`, which a gate stack
    splits to measure a source once for all its candidates.)

    Args:
        source, candidate: ``(H, W, 3)`` uint8 RGB, aligned.
        segmenter: the person segmenter (:func:`get_person_segmenter`).
        source_landmarks: ``(478, >=2)`` pixels of the subject in the source, or None (no face:
            then only the skin inside ``edit_mask`` is measured).
        candidate_landmarks: the subject in the candidate; the source's are used when None.
        other_faces: landmarks of other people in the source (their heads are not body skin).
        edit_mask: ``(H, W)`` limb edit mask, or None; left out of the body skin.
        covered: ``(H, W)`` bool, where the editor's output covers the frame; body skin is
            measured only there (elsewhere the candidate holds source pixels). None: all.

    Returns:
        ``(source tones, candidate tones)``; pixel counts are at the working resolution
        (every k-th pixel, see :func:`~counterfactory.validation.segment.work_stride`).
    """
    k = work_stride(source.shape)
    person = segmenter.segment(np.ascontiguousarray(source[::k, ::k])) if source_landmarks is not None else None
    prepared = prepare_source_skin(source, person, source_landmarks=source_landmarks, other_faces=other_faces)
    return measure_candidate_skin(
        prepared, candidate, candidate_landmarks=candidate_landmarks, edit_mask=edit_mask, covered=covered
    )


def source_body_skin(
    image: np.ndarray,
    landmarks: np.ndarray,
    region: np.ndarray | None,
    person: np.ndarray,
) -> tuple[bool, int]:
    """``(visible, pixels)``: whether a source shows body skin outside its edit region.

    Body skin is :func:`body_skin_mask` (the person, outside the head and ``region``, in the
    face's own skin colours) on the working grid; it is *visible* when it is large enough for
    :func:`measure_tones` to report its ITA (at least :data:`MIN_SKIN_PIXELS` and
    :data:`MIN_BODY_SHARE` of the face skin). A face-only edit of such a photo leaves face and
    hands in different tones by design: the source check records it
    (``source_body_skin_visible``) so that a study can choose its photos.

    Args:
        image: ``(H, W, 3)`` uint8 RGB.
        landmarks: ``(478, >=2)`` the subject's landmarks, full-size pixels.
        region: ``(H, W)`` the edit region (nonzero inside), or None.
        person: person probability of ``image[::k, ::k]`` (k = :func:`work_stride`).

    Returns: the flag and the body-skin pixel count on the working grid.
    """
    prepared = prepare_source_skin(image, person, source_landmarks=landmarks, region=region)
    pixels = int(np.count_nonzero(prepared.body)) if prepared.body is not None else 0
    return prepared.tones.body_ita_deg is not None, pixels


def source_edit_region(
    image: np.ndarray,
    landmarks: np.ndarray,
    region: str,
    *,
    mode: str = "oval",
    segmenter: PersonSegmenter | None = None,
) -> tuple[np.ndarray, dict[str, object]]:
    """The edit region of a face source and what the source check records about it.

    Returns ``(mask, flags)``: ``mask`` ``(H, W)`` uint8 {0, 255} is the region the prompt
    names (:func:`~counterfactory.validation.faces.region_mask`; for ``face`` the face mask in
    ``mode``, as before regions had names); ``flags`` holds ``edit_region`` (the name),
    ``source_body_skin_visible`` (:func:`source_body_skin`) and ``source_body_skin_px``.
    """
    from counterfactory.validation.faces import region_mask
    from counterfactory.validation.segment import get_person_segmenter

    k = work_stride(image.shape)
    person = (segmenter or get_person_segmenter()).segment(np.ascontiguousarray(image[::k, ::k]))
    if region == "face":
        mask = face_mask(landmarks, image.shape[:2], mode=mode)  # type: ignore[arg-type]
        measured = region_mask(landmarks, image.shape[:2], region)
    else:
        mask = measured = region_mask(landmarks, image.shape[:2], region, person=person, image=image)
    visible, pixels = source_body_skin(image, landmarks, measured, person)
    return mask, {"edit_region": region, "source_body_skin_visible": visible, "source_body_skin_px": pixels}
