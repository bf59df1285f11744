"""Accessories worn on the face: glasses added or removed between source and candidate.

A glasses frame drawn by an editor is a new ring of strong edges around each eye, across the
nose bridge and out to the ears. The expression gate's brow measure matches the brow's patch
between the two images; a frame across that patch moves the match (an added frame read as a
brow raised by 0.15 iod on ``biden_portrait.jpg``, five times the shipped bound), so a frame
must be named for what it is, not as an expression.

:func:`glasses_change` compares the edge energy (mean gradient magnitude of the grey image,
smoothed at one pixel) in the band a frame occupies (:func:`frame_band`) with the same ratio
over the rest of the face skin: a tone change scales the edges of the whole face alike (the
ratio of the two ratios stays near 1), a frame adds edges in its band only. Pure functions on
the source's mesh; the face gate turns the figure into a reason (``face_accessory_changed``)
and the expression gate does not judge brows under a frame.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from counterfactory.validation.faces import (
    EAR_SIDES,
    LEFT_EYE,
    LEFT_IRIS_CENTER,
    RIGHT_EYE,
    RIGHT_IRIS_CENTER,
    face_mask,
)

#: A frame's rim about each iris centre, inter-ocular units: half-width and half-height of the
#: outer ellipse (a frame's outer edge) and the eye itself grown by this much left out (the
#: eyelids move with expression; a frame does not sit on them).
RIM_HALF_IOD = (0.45, 0.34)
EYE_CLEAR_IOD = 0.06
#: The bridge and the temples: a band this many iod tall along the eye line, from one side of
#: the face to the other.
BAND_HALF_HEIGHT_IOD = 0.08
#: The grey image is smoothed at this sigma (pixels of a face this many pixels across the
#: iod, scaled) before its gradient is taken: re-rendering noise is finer than a frame.
SMOOTH_SIGMA_IOD = 0.02
#: ``|glasses_change|`` above this: a frame added or removed. The band's edge energy against the
#: rest of the face's, as a log ratio: log(1.4) (0.34). Re-rendered through TAEF2 and jittered,
#: copies, the region darkened or lightened by 25 L* and 40 % feature morphs toward another
#: person's face moved it by at most 0.08 (``biden_portrait.jpg``, London 113 and 140); a dark
#: frame 0.03-0.06 iod thick added 0.46-1.01.
GLASSES_LEVEL = math.log(1.4)


def frame_band(landmarks: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """``(band, rest)``, ``(H, W)`` bool: where a glasses frame sits on the face of
    ``landmarks`` (``(478, >=2)`` pixels; the rim about each eye, the bridge and the temples
    out to the ear-level points of the oval), and the rest of the face oval (the reference)."""
    h, w = shape
    lm = np.asarray(landmarks, np.float64)[:, :2]
    right, left = lm[RIGHT_IRIS_CENTER], lm[LEFT_IRIS_CENTER]
    axis = left - right
    iod = max(float(np.hypot(*axis)), 1e-6)
    angle = math.degrees(math.atan2(axis[1], axis[0]))
    band = np.zeros((h, w), np.uint8)
    for c in (right, left):
        axes = (max(1, round(RIM_HALF_IOD[0] * iod)), max(1, round(RIM_HALF_IOD[1] * iod)))
        cv2.ellipse(band, (round(c[0]), round(c[1])), axes, angle, 0, 360, 255, -1)
    ends = lm[list(EAR_SIDES)]
    t = max(1, round(2 * BAND_HALF_HEIGHT_IOD * iod))
    cv2.line(band, tuple(int(v) for v in np.round(ends[0])), tuple(int(v) for v in np.round(right)), 255, t)
    cv2.line(band, tuple(int(v) for v in np.round(right)), tuple(int(v) for v in np.round(left)), 255, t)
    cv2.line(band, tuple(int(v) for v in np.round(left)), tuple(int(v) for v in np.round(ends[1])), 255, t)
    eyes = np.zeros((h, w), np.uint8)
    for loop in (RIGHT_EYE, LEFT_EYE):
        cv2.fillPoly(eyes, [np.round(lm[list(loop)]).astype(np.int32)], 255)
    grow = max(1, round(EYE_CLEAR_IOD * iod))
    eyes = cv2.dilate(eyes, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * grow + 1, 2 * grow + 1)))
    oval = face_mask(landmarks, shape, mode="oval") > 0
    on = (band > 0) & (eyes == 0)
    return on, oval & ~(band > 0) & (eyes == 0)


def _edges(image: np.ndarray, sigma: float) -> np.ndarray:
    grey = image if image.ndim == 2 else cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2GRAY)
    grey = cv2.GaussianBlur(grey.astype(np.float32), (0, 0), sigma)
    gx = cv2.Sobel(grey, cv2.CV_32F, 1, 0, ksize=3)
    gy = cv2.Sobel(grey, cv2.CV_32F, 0, 1, ksize=3)
    return cv2.magnitude(gx, gy)


def glasses_change(source: np.ndarray, candidate: np.ndarray, landmarks: np.ndarray) -> float | None:
    """How much a glasses frame was added (positive) or removed (negative) from ``source`` to
    ``candidate`` (``(H, W, 3)`` uint8 RGB, registered to each other) on the face of
    ``landmarks`` (the source's mesh): ``log(E_c(band) / E_s(band)) - log(E_c(rest) /
    E_s(rest))``, ``E`` the mean gradient magnitude (:func:`frame_band`). Only the face's box
    is read. None when a region is empty or has no edges."""
    lm = np.asarray(landmarks, np.float64)[:, :2]
    iod = float(np.hypot(*(lm[LEFT_IRIS_CENTER] - lm[RIGHT_IRIS_CENTER])))
    if iod <= 1e-6:
        return None
    h, w = source.shape[:2]
    pad = 0.2 * iod
    x0, y0 = (max(0, math.floor(float(v) - pad)) for v in lm.min(axis=0))
    x1 = min(w, math.ceil(float(lm[:, 0].max()) + pad))
    y1 = min(h, math.ceil(float(lm[:, 1].max()) + pad))
    if x1 <= x0 or y1 <= y0:
        return None
    band, rest = frame_band(lm - (x0, y0), (y1 - y0, x1 - x0))
    if not band.any() or not rest.any():
        return None
    sigma = max(0.5, SMOOTH_SIGMA_IOD * iod)
    es = _edges(source[y0:y1, x0:x1], sigma)
    ec = _edges(candidate[y0:y1, x0:x1], sigma)
    means = [float(e[m].mean()) for e in (es, ec) for m in (band, rest)]
    if min(means) <= 1e-6:
        return None
    sb, sr, cb, cr = means
    return math.log(cb / sb) - math.log(cr / sr)
