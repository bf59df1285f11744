"""Expression gate: the change in facial action units between source and candidate.

FOCUS fixes the expression in its edit prompt and audits expression drift; a smile that
appears only for some target groups would confound the study. AUs (Ekman & Friesen's Facial
Action Coding System) are estimated on both images and compared AU by AU, on a common [0, 1]
intensity scale: MediaPipe blendshapes mapped to AUs by default
(:data:`counterfactory.validation.backends.mediapipe.BLENDSHAPE_AUS` documents the mapping), or LibreFace's
DISFA intensities divided by their 0-5 range.

Blendshapes react to texture as well as to expression (a recoloured face moves them by up to
~0.4 with no change of expression), so the gate also measures expression geometry from the
MediaPipe mesh, in inter-ocular units (the distance between the iris centres) in the face's
own upright frame (x along the eye line, y down): the height of each mouth corner above the
lip midline and the mouth opening. A smile lifts the corners, a frown lowers them;
recolouring and plausible feature morphs move neither by much.

Brows are measured in the pixels, not on the mesh: the mesh's brow points follow the shape of
the whole face (another person's features blended into the face move them by up to 0.08
iod with the brows' pixels untouched), while brows raised in the pixels by 0.15 iod move
them by 0.02 at most. :func:`brow_shifts` finds how far each brow's patch moved along the
face's vertical axis between the aligned images (normalised cross-correlation, Lewis 1995):
brows raised or lowered move their patch; a recoloured face, another person's skin or
changed features around unmoved brows do not. Mouth corners are measured both ways: on the mesh
(``mouth_corner_change_iod``, which sees a smile swapped for speech between two photos) and in
the pixels (``mouth_corner_shift_iod``, :func:`mouth_corner_shifts`, which sees a corner lifted
or lowered in place by less than the mesh can tell from another person's mouth).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

import cv2
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from counterfactory.validation.accessories import GLASSES_LEVEL
from counterfactory.validation.backends import AUEstimator, load_au_model
from counterfactory.validation.faces import (
    LEFT_BROW,
    LEFT_IRIS_CENTER,
    MOUTH_LEFT_CORNER,
    MOUTH_RIGHT_CORNER,
    RIGHT_BROW,
    RIGHT_IRIS_CENTER,
)
from counterfactory.validation.gates.base import REGISTRATION_FAILED, GateResult, PairContext, SourceAnalysis
from counterfactory.validation.gates.registry import GATES
from counterfactory.validation.gates.rules import Rule, evaluate

BACKEND_THRESHOLDS = ("max_au_change", "max_mean_au_change")

#: Mesh points: inner upper and lower lip at the midline.
UPPER_LIP, LOWER_LIP = 13, 14


def face_frame(landmarks: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, np.ndarray, np.ndarray]:
    """The upright face frame of one MediaPipe mesh (``(478, >=2)``, pixels).

    Returns ``(lm, origin, iod, ex, ey)``: the mesh's ``(478, 2)`` float64 points, the midpoint
    of the iris centres, their distance (the inter-ocular distance, pixels), and the frame's
    unit axes: ``ex`` from the subject's right iris to the left, ``ey`` "down" in the face
    (image y points down). Raises ValueError when the iris centres coincide.
    """
    lm = np.asarray(landmarks, dtype=np.float64)[:, :2]
    eye_r, eye_l = lm[RIGHT_IRIS_CENTER], lm[LEFT_IRIS_CENTER]
    axis = eye_l - eye_r
    iod = float(np.hypot(*axis))
    if iod <= 1e-6:
        raise ValueError("eye centres coincide: no inter-ocular distance")
    ex = axis / iod
    ey = np.array([-ex[1], ex[0]])
    return lm, (eye_r + eye_l) / 2.0, iod, ex, ey


def expression_geometry(landmarks: np.ndarray) -> dict[str, float]:
    """Expression geometry of one face in inter-ocular units (iod), upright face frame.

    Args:
        landmarks: ``(478, >=2)`` MediaPipe mesh, pixels.

    Returns: ``mouth_corner_right`` / ``mouth_corner_left`` (height of the subject's right /
    left mouth corner above the midpoint of the inner lips; up is positive) and
    ``mouth_open`` (inner-lip gap), divided by the iris-centre distance. Lifting a
    corner by ``k`` pixels in an upright face raises its value by ``k / iod``.
    """
    lm, origin, iod, _ex, ey = face_frame(landmarks)

    def up(point: np.ndarray) -> float:
        return -float((point - origin) @ ey) / iod

    mid = (lm[UPPER_LIP] + lm[LOWER_LIP]) / 2.0
    return {
        "mouth_corner_right": up(lm[MOUTH_RIGHT_CORNER]) - up(mid),
        "mouth_corner_left": up(lm[MOUTH_LEFT_CORNER]) - up(mid),
        "mouth_open": up(lm[UPPER_LIP]) - up(lm[LOWER_LIP]),
    }


def geometry_changes(source: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """``mouth_corner_change_iod`` (largest |change| of either side) and
    ``mouth_open_change_iod`` (|change|) between two meshes, inter-ocular units."""
    s, c = expression_geometry(source), expression_geometry(candidate)
    d = {k: c[k] - s[k] for k in s}
    return {
        "mouth_corner_change_iod": max(abs(d["mouth_corner_right"]), abs(d["mouth_corner_left"])),
        "mouth_open_change_iod": abs(d["mouth_open"]),
    }


#: The brow patch, in inter-ocular units of the face frame: this wide and tall, centred on the
#: brow's mesh points (it holds the brow and the skin around it, not the eye's iris).
BROW_PATCH_IOD = (0.9, 0.75)
#: The mouth-corner patch, centred on the corner's mesh point: the corner, the lips beside it
#: and the cheek below and above (a smile lifts all three; a lip made fuller does not move the
#: corner).
MOUTH_PATCH_IOD = (0.5, 0.4)
#: Patches are resampled to this many pixels across (the measure is in iod, not pixels).
BROW_PATCH_PX = 64


def _patches(
    image: np.ndarray, landmarks: np.ndarray, centres: list[np.ndarray], size_iod: tuple[float, float]
) -> list[np.ndarray]:
    """Grey float32 patches of ``size_iod`` (width, height, iod) about each of ``centres``
    (pixels) in the upright face frame of ``landmarks``, :data:`BROW_PATCH_PX` across.
    ``image``: RGB, or already grey (``(H, W)``).

    Only the pixels a patch reads are turned grey (its footprint and 2 pixels around), not the
    whole image: bilinear sampling reads nothing further and the crop's offset is a whole
    number of pixels, so the shifts agree with the whole image's to 2.3e-6 iod on the bundled
    photos (OpenCV's fixed-point sampling positions can round the other way)."""
    _lm, _origin, iod, ex, ey = face_frame(landmarks)
    width, height = size_iod
    scale = BROW_PATCH_PX / (width * iod)
    w_px, h_px = BROW_PATCH_PX, int(round(BROW_PATCH_PX * height / width))
    ih, iw = image.shape[:2]
    patches = []
    for centre in centres:
        # patch pixel (u, v) -> image point centre + ((u - w/2) ex + (v - h/2) ey) / scale
        m = np.column_stack([ex / scale, ey / scale, centre - (ex * w_px / 2 + ey * h_px / 2) / scale])
        corners = m @ np.array([[0, w_px, 0, w_px], [0, 0, h_px, h_px], [1, 1, 1, 1]], np.float64)
        x0 = min(max(math.floor(float(corners[0].min())) - 2, 0), iw - 1)
        y0 = min(max(math.floor(float(corners[1].min())) - 2, 0), ih - 1)
        x1 = min(max(math.ceil(float(corners[0].max())) + 3, x0 + 1), iw)
        y1 = min(max(math.ceil(float(corners[1].max())) + 3, y0 + 1), ih)
        crop = image[y0:y1, x0:x1]
        grey = crop if crop.ndim == 2 else cv2.cvtColor(np.ascontiguousarray(crop), cv2.COLOR_RGB2GRAY)
        m[:, 2] -= (x0, y0)
        patch = cv2.warpAffine(
            grey,
            m.astype(np.float64),
            (w_px, h_px),
            flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
            borderMode=cv2.BORDER_REPLICATE,
        )
        patches.append(patch.astype(np.float32))
    return patches


#: How far, in patch pixels, :func:`brow_shifts` searches each way (0.17 iod for a brow, 0.094
#: for a mouth corner); a feature moved further reads as this far, still far beyond any threshold.
BROW_SEARCH_PX = 12


def _brow_centres(landmarks: np.ndarray) -> list[np.ndarray]:
    lm = np.asarray(landmarks, dtype=np.float64)[:, :2]
    return [lm[list(brow)].mean(axis=0) for brow in (RIGHT_BROW, LEFT_BROW)]


def _mouth_centres(landmarks: np.ndarray) -> list[np.ndarray]:
    lm = np.asarray(landmarks, dtype=np.float64)[:, :2]
    return [lm[MOUTH_RIGHT_CORNER], lm[MOUTH_LEFT_CORNER]]


def brow_shifts(
    source: np.ndarray,
    candidate: np.ndarray,
    landmarks: np.ndarray,
    source_patches: list[np.ndarray] | None = None,
) -> tuple[float, float]:
    """How far each brow moved UP from ``source`` to ``candidate``, inter-ocular units.

    Args:
        source, candidate: ``(H, W, 3)`` uint8 RGB (or their ``(H, W)`` grey), aligned (the
            same frame).
        landmarks: ``(478, >=2)`` the source's mesh, pixels (the patches sit on its brows,
            in both images).
        source_patches: the source's patches when already cut (:class:`ExpressionSource`).

    Returns: ``(right, left)`` (the subject's right brow is image-left): where the inner part
    of each source brow patch matches the candidate's patch best (normalised
    cross-correlation, sub-pixel by a parabola through the peak), the vertical offset in the
    upright face frame, positive up. Moving a brow region up by ``k`` pixels gives
    ``k / iod``; offsets beyond :data:`BROW_SEARCH_PX` read as that bound.
    """
    centres = _brow_centres(landmarks)
    right, left = _vertical_shifts(source, candidate, landmarks, centres, BROW_PATCH_IOD, source_patches)
    return right, left


def mouth_corner_shifts(
    source: np.ndarray,
    candidate: np.ndarray,
    landmarks: np.ndarray,
    source_patches: list[np.ndarray] | None = None,
) -> tuple[float, float]:
    """How far each mouth corner moved UP from ``source`` to ``candidate`` in the pixels,
    inter-ocular units (:func:`brow_shifts`, on a :data:`MOUTH_PATCH_IOD` patch about each
    corner's mesh point): ``(right, left)``, the subject's right corner first.

    The mesh's corner points follow the face's shape prior: in the failure corpus, a frown
    warped into ``obama_podium.jpg`` by 0.07 iod (re-rendered and jittered) moved them by 0.031,
    less than some good edits do (up to 0.037), while the corner's patch moved with the pixels
    (0.052, against at most 0.015 across the shipped calibration's 400 good edits)."""
    centres = _mouth_centres(landmarks)
    right, left = _vertical_shifts(source, candidate, landmarks, centres, MOUTH_PATCH_IOD, source_patches)
    return right, left


def _vertical_shifts(
    source: np.ndarray,
    candidate: np.ndarray,
    landmarks: np.ndarray,
    centres: list[np.ndarray],
    size_iod: tuple[float, float],
    source_patches: list[np.ndarray] | None = None,
) -> list[float]:
    m = BROW_SEARCH_PX
    out = []
    if source_patches is None:
        source_patches = _patches(source, landmarks, centres, size_iod)
    for a, b in zip(source_patches, _patches(candidate, landmarks, centres, size_iod)):
        score = cv2.matchTemplate(b, np.ascontiguousarray(a[m:-m, m:-m]), cv2.TM_CCOEFF_NORMED)
        score = np.nan_to_num(score, nan=-1.0)
        py, px = np.unravel_index(int(np.argmax(score)), score.shape)
        dy = float(py - m)
        if 0 < py < score.shape[0] - 1:
            lo, mid, hi = score[py - 1, px], score[py, px], score[py + 1, px]
            curve = lo - 2.0 * mid + hi
            if curve < 0:
                dy += float(0.5 * (lo - hi) / curve)
        # dy > 0: the brow sits lower in the candidate (face-frame y points down); a patch is
        # BROW_PATCH_PX pixels across BROW_PATCH_IOD[0] inter-ocular distances
        out.append(-dy * size_iod[0] / BROW_PATCH_PX)
    return out


class ExpressionGateConfig(BaseModel):
    """Expression gate settings (``gates.<kind>.expression`` in the spec)."""

    model_config = ConfigDict(extra="forbid")
    #: settings added after specs were first hashed: left out of a spec's canonical form while
    #: unset, so a spec hashes as before they existed (``Spec.canonical``)
    canonical_unset: ClassVar[tuple[str, ...]] = ("max_mouth_corner_shift_iod",)

    backend: Literal["mediapipe", "libreface"] = "mediapipe"
    max_au_change: float = Field(
        ..., gt=0.0, le=1.0, description="largest |change| of any one AU, fraction of full intensity"
    )
    max_mean_au_change: float | None = Field(
        None, gt=0.0, le=1.0, description="mean |change| over the AUs, fraction of full intensity"
    )
    libreface_weights: str | None = Field(None, description="LibreFace resnet.pt for backend libreface")
    max_mouth_corner_change_iod: float | None = Field(
        None, gt=0.0, description="largest change of a mouth corner's height, inter-ocular units"
    )
    max_brow_change_iod: float | None = Field(
        None, gt=0.0, description="largest |shift| of a brow up or down in the pixels (brow_shifts), iod"
    )
    max_mouth_corner_shift_iod: float | None = Field(
        None,
        gt=0.0,
        description="largest |shift| of a mouth corner up or down in the pixels (mouth_corner_shifts), iod",
    )
    max_mouth_open_change_iod: float | None = Field(None, gt=0.0, description="change of the mouth opening, iod")

    def load(self) -> AUEstimator:
        return load_au_model(self.backend, libreface_weights=self.libreface_weights)


def au_changes(source: dict[str, float], candidate: dict[str, float]) -> dict[str, float]:
    """Signed ``candidate - source`` per AU present and finite on both sides."""
    out = {}
    for au, s in source.items():
        c = candidate.get(au)
        if c is not None and math.isfinite(s) and math.isfinite(c):
            out[au] = float(c - s)
    return out


def expression_gate(
    pair: PairContext,
    *,
    au_model: AUEstimator,
    max_au_change: float,
    max_mean_au_change: float | None = None,
    max_mouth_corner_change_iod: float | None = None,
    max_brow_change_iod: float | None = None,
    max_mouth_open_change_iod: float | None = None,
    max_mouth_corner_shift_iod: float | None = None,
    source_aus: Mapping[str, float] | None = None,
    source_prepared: ExpressionSource | None = None,
) -> GateResult:
    """AU change from the source's largest face to the candidate's face at its place.

    Args:
        pair: the aligned pair with both images' MediaPipe observations.
        au_model: an AU estimator returning intensities in [0, 1].
        max_au_change: bound on ``au_change_max`` (the largest absolute change of one AU).
        max_mean_au_change: bound on ``au_change_mean``; None: not judged.
        max_mouth_corner_change_iod, max_brow_change_iod, max_mouth_open_change_iod,
            max_mouth_corner_shift_iod: bounds on :func:`geometry_changes` (the mesh),
            :func:`brow_shifts` and :func:`mouth_corner_shifts` (the pixels), inter-ocular
            units; None: not judged.
        source_aus: ``au_model``'s AUs of the source's subject when already known (the
            source is shared by all its candidates); None: estimated here.
        source_prepared: the source's :class:`ExpressionSource`; its patches are used when
            they were cut on this pair's source face.

    Metrics: ``au_change_max``, ``au_change_mean``, ``au_change_argmax`` (which AU), and
    ``delta_<AU>`` (signed, candidate minus source) for every AU of the backend.
    Reasons: ``expression_source_no_face``, ``expression_candidate_no_face``,
    ``expression_aus_not_finite``, ``expression_au_change_above_max``,
    ``expression_mean_au_change_above_max``, ``expression_mouth_corner_change_above_max``,
    ``expression_brow_change_above_max``, ``expression_mouth_open_change_above_max``,
    ``expression_mouth_corner_shift_above_max``.
    Geometry metrics: ``mouth_corner_change_iod``, ``brow_change_iod``, ``mouth_open_change_iod``,
    ``mouth_corner_shift_iod`` (and each side's ``brow_shift_*_iod``, ``mouth_corner_shift_*_iod``).
    With ``pair.extras[REGISTRATION_FAILED]`` (a candidate that could not be registered) the
    pixel shifts are not measured (None): the AUs and the mesh judge alone. Where a glasses
    frame was added or removed (:func:`~counterfactory.validation.accessories.glasses_change`
    beyond :data:`~counterfactory.validation.accessories.GLASSES_LEVEL`; ``brow_under_frame``)
    the brow shift is recorded but not judged: a frame across the brow's patch moves its match
    (0.15 iod on ``biden_portrait.jpg``) and the face gate names the accessory instead.
    """
    thresholds = {
        "max_au_change": max_au_change,
        "max_mean_au_change": max_mean_au_change,
        "max_mouth_corner_change_iod": max_mouth_corner_change_iod,
        "max_brow_change_iod": max_brow_change_iod,
        "max_mouth_open_change_iod": max_mouth_open_change_iod,
        "max_mouth_corner_shift_iod": max_mouth_corner_shift_iod,
        "backend": au_model.name,
    }
    metrics, facts = expression_measures(pair, au_model, source_aus, source_prepared)
    reasons, _ = evaluate(EXPRESSION_RULES, {**metrics, **facts}, thresholds)
    return GateResult("expression", not reasons, metrics, reasons, thresholds=thresholds)


_NO_FACE = ("expression_source_no_face", "expression_candidate_no_face")

#: The expression gate's decision, in order (``source_has_face`` / ``candidate_has_face``: a
#: mesh on each side, without which nothing else is measured; ``aus_finite``: some AU change
#: could be taken; ``brow_clear``: no glasses frame added or removed across the brow, which
#: moves its match: the face gate names the accessory and the brow is not judged under it).
EXPRESSION_RULES: tuple[Rule, ...] = (
    Rule("source_has_face", "false", None, "expression_source_no_face"),
    Rule("candidate_has_face", "false", None, "expression_candidate_no_face"),
    Rule("aus_finite", "false", None, "expression_aus_not_finite", unless=_NO_FACE),
    Rule("au_change_max", "above", "max_au_change", "expression_au_change_above_max", unless=_NO_FACE),
    Rule("au_change_mean", "above", "max_mean_au_change", "expression_mean_au_change_above_max", unless=_NO_FACE),
    Rule(
        "mouth_corner_change_iod",
        "above",
        "max_mouth_corner_change_iod",
        "expression_mouth_corner_change_above_max",
        unless=_NO_FACE,
    ),
    Rule(
        "brow_change_iod",
        "above",
        "max_brow_change_iod",
        "expression_brow_change_above_max",
        when="brow_clear",
        unless=_NO_FACE,
    ),
    Rule(
        "mouth_open_change_iod",
        "above",
        "max_mouth_open_change_iod",
        "expression_mouth_open_change_above_max",
        unless=_NO_FACE,
    ),
    Rule(
        "mouth_corner_shift_iod",
        "above",
        "max_mouth_corner_shift_iod",
        "expression_mouth_corner_shift_above_max",
        unless=_NO_FACE,
    ),
)


def expression_measures(
    pair: PairContext,
    au_model: AUEstimator,
    source_aus: Mapping[str, float] | None,
    source_prepared: ExpressionSource | None,
) -> tuple[dict, dict]:
    """The expression gate's measures of ``pair`` (see :func:`expression_gate`) and the facts
    :data:`EXPRESSION_RULES` read; no decision. Without a face on either side nothing is
    measured."""
    metrics: dict = {
        "au_change_max": None,
        "au_change_mean": None,
        "au_change_argmax": None,
        "mouth_corner_change_iod": None,
        "brow_change_iod": None,
        "mouth_open_change_iod": None,
        "mouth_corner_shift_iod": None,
    }
    metrics.update({f"delta_{au}": None for au in au_model.aus})
    facts = {"source_has_face": bool(pair.source_faces), "candidate_has_face": bool(pair.candidate_faces)}
    if not (pair.source_faces and pair.candidate_faces):
        return metrics, facts

    src = dict(au_model.estimate(pair.source, pair.source_face) if source_aus is None else source_aus)
    cand = dict(au_model.estimate(pair.candidate, pair.candidate_face))
    deltas = au_changes(src, cand)
    for au, d in deltas.items():
        metrics[f"delta_{au}"] = d
    facts["aus_finite"] = bool(deltas)
    if deltas:
        argmax = max(deltas, key=lambda au: abs(deltas[au]))
        metrics["au_change_max"] = abs(deltas[argmax])
        metrics["au_change_mean"] = sum(abs(d) for d in deltas.values()) / len(deltas)
        metrics["au_change_argmax"] = argmax if deltas[argmax] != 0 else None
    src_face, cand_face = pair.source_face, pair.candidate_face
    if src_face.landmarks.shape[0] > LEFT_IRIS_CENTER and cand_face.landmarks.shape[0] > LEFT_IRIS_CENTER:
        metrics.update(geometry_changes(src_face.landmarks, cand_face.landmarks))
        cut = source_prepared is not None and source_prepared.landmarks is src_face.landmarks
        # the pixel shifts match patches at the source's places: without registration they
        # would measure the misregistration, so only the mesh and the AUs judge
        in_place = not pair.extras.get(REGISTRATION_FAILED)
        if in_place:
            right, left = brow_shifts(
                pair.source, pair.candidate, src_face.landmarks, source_prepared.brows if cut else None
            )
            metrics.update(
                brow_shift_right_iod=right, brow_shift_left_iod=left, brow_change_iod=max(abs(right), abs(left))
            )
            right, left = mouth_corner_shifts(
                pair.source, pair.candidate, src_face.landmarks, source_prepared.mouths if cut else None
            )
            metrics.update(
                mouth_corner_shift_right_iod=right,
                mouth_corner_shift_left_iod=left,
                mouth_corner_shift_iod=max(abs(right), abs(left)),
            )
        # a glasses frame added or removed across the brow's patch moves its match
        glasses = pair.glasses_change if in_place else None  # the face gate's figure, taken once
        metrics["brow_under_frame"] = glasses is not None and abs(glasses) > GLASSES_LEVEL
    facts["brow_clear"] = not metrics.get("brow_under_frame")
    return metrics, facts


@dataclass(frozen=True)
class ExpressionSource:
    """What the expression gate reads of a source once (:meth:`ExpressionGate.prepare`): its
    subject's AUs, and the brow and mouth-corner patches every candidate is matched against,
    cut on the mesh ``landmarks`` of that face."""

    aus: dict[str, float]
    landmarks: np.ndarray
    brows: list[np.ndarray]
    mouths: list[np.ndarray]


class ExpressionGate:
    """:func:`expression_gate` with its configuration and AU model bound."""

    name = "expression"

    def __init__(self, config: ExpressionGateConfig, au_model: AUEstimator | None = None) -> None:
        self.config = config
        self.au_model = au_model if au_model is not None else config.load()

    def prepare(self, source: np.ndarray, analysis: SourceAnalysis) -> ExpressionSource | None:
        """The AUs and feature patches of the source's subject (its largest face), once per source."""
        if not analysis.faces:
            return None
        face = analysis.faces[0]
        aus = dict(self.au_model.estimate(source, face))
        if face.landmarks.shape[0] <= LEFT_IRIS_CENTER:
            return ExpressionSource(aus, face.landmarks, [], [])
        lm = face.landmarks
        brows = _patches(source, lm, _brow_centres(lm), BROW_PATCH_IOD)
        mouths = _patches(source, lm, _mouth_centres(lm), MOUTH_PATCH_IOD)
        return ExpressionSource(aus, lm, brows, mouths)

    def __call__(self, pair: PairContext) -> GateResult:
        prepared = pair.source_data(self.name)
        return expression_gate(
            pair,
            au_model=self.au_model,
            source_aus=prepared.aus if prepared is not None else None,
            source_prepared=prepared,
            max_au_change=self.config.max_au_change,
            max_mean_au_change=self.config.max_mean_au_change,
            max_mouth_corner_change_iod=self.config.max_mouth_corner_change_iod,
            max_brow_change_iod=self.config.max_brow_change_iod,
            max_mouth_open_change_iod=self.config.max_mouth_open_change_iod,
            max_mouth_corner_shift_iod=self.config.max_mouth_corner_shift_iod,
        )


GATES.register("expression", ExpressionGateConfig, ExpressionGate, backend_keys=BACKEND_THRESHOLDS, order=30)
