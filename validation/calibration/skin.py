"""Calibrate the skin-tone gate: the no-op ceiling of ITA change and the natural face-to-body gap.

Part of ``counterfactory calibrate`` (:func:`counterfactory.validation.calibration.calibrate.run_calibration`
adds these distributions, thresholds and rules to ``calibration.json``). On every photo with a
face:

- ``noop`` / ``skin.ita_change_deg``: |ITA change| of the face skin and of the body skin
  between the photo and each pixel-aligned no-op copy (re-encodes, editor resolution round
  trip, shift and rotate-zoom aligned back): how far ITA moves when nothing was edited;
- ``source`` / ``skin.face_body_gap_deg``: |face ITA - body ITA| of the unedited photo: how
  far apart one person's face and neck/hands already are in real photographs (lighting,
  make-up, sun exposure, and what the body mask lets through).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from counterfactory.validation.faces import get_face_landmarker, nearest_face
from counterfactory.validation.segment import get_person_segmenter
from counterfactory.validation.skin import measure_pair

RULES: dict[str, str] = {
    "skin.max_ita_shift_deg": (
        "no-op ceiling: largest |face or body ITA change| of any pixel-aligned no-op copy, "
        "times 1.25, rounded up to 0.5 degree (a control or limb edit moving skin more is rejected)"
    ),
    "skin.max_face_body_gap_growth_deg": (
        "median |face - body ITA| of the unedited photos, rounded up to 1 degree (a face edit "
        "may set face and body further apart than the source's own gap by at most the gap a "
        "typical real photo already shows, else review)"
    ),
    "skin.max_inpaint_gap_deg": (
        "as skin.max_face_body_gap_growth_deg: two skin regions of one person in a real photo "
        "differ by that much; inpainted skin whose gap to the person's face grows by more is rejected"
    ),
}


def measure_skin(
    images: Iterable[tuple[str, np.ndarray]],
    noops: dict[str, tuple[Callable[[np.ndarray], np.ndarray], bool]],
) -> dict[str, dict[str, dict[str, list]]]:
    """``{group: {metric: {"values": [...], "labels": [...]}}}`` for the groups above.

    Args:
        images: ``(label, (H, W, 3) uint8 RGB)`` pairs.
        noops: name -> (transform, pixel-aligned), as :data:`counterfactory.validation.calibration.calibrate.NOOPS`;
            only the pixel-aligned ones are used.
    """
    landmarker = get_face_landmarker()
    segmenter = get_person_segmenter()
    out: dict[str, dict[str, dict[str, list]]] = {}

    def add(group: str, metric: str, value: float | None, label: str) -> None:
        if value is None or not np.isfinite(value):
            return
        slot = out.setdefault(group, {}).setdefault(metric, {"values": [], "labels": []})
        slot["values"].append(round(float(value), 6))
        slot["labels"].append(label)

    for name, image in images:
        faces = landmarker.detect(image)
        if not faces:
            continue
        subject = faces[0]
        others = [f.landmarks for f in faces[1:]]
        src, _ = measure_pair(
            image, image, segmenter, source_landmarks=subject.landmarks, candidate_landmarks=None, other_faces=others
        )
        if src.face_ita_deg is not None and src.body_ita_deg is not None:
            add("source", "skin.face_body_gap_deg", abs(src.face_ita_deg - src.body_ita_deg), name)
        for noop, (transform, aligned) in noops.items():
            if not aligned:
                continue
            copy = transform(image)
            cand = nearest_face(subject, landmarker.detect(copy))
            s, c = measure_pair(
                image,
                copy,
                segmenter,
                source_landmarks=subject.landmarks,
                candidate_landmarks=cand.landmarks if cand is not None else None,
                other_faces=others,
            )
            for a, b in ((s.face_ita_deg, c.face_ita_deg), (s.body_ita_deg, c.body_ita_deg)):
                if a is not None and b is not None:
                    add(
                        "noop",
                        "skin.ita_change_deg",
                        abs(b - a),
                        f"{name}:{noop}:{'face' if a is s.face_ita_deg else 'body'}",
                    )
    return out


def _step_up(x: float, step: float) -> float:
    return round(float(np.ceil(x / step - 1e-9)) * step, 10)


def suggest_skin(distributions: dict[str, dict[str, dict[str, Any]]]) -> dict[str, float]:
    """The skin gate's thresholds from :func:`measure_skin`'s distributions, by :data:`RULES`."""

    def values(group: str, metric: str) -> np.ndarray:
        v = np.asarray(distributions.get(group, {}).get(metric, {}).get("values", []), dtype=np.float64)
        if v.size == 0:
            raise ValueError(
                f"calibration has no {group} samples of {metric}: give photos showing a face "
                "and some skin outside it (neck, hands)"
            )
        return v

    ceiling = _step_up(1.25 * float(values("noop", "skin.ita_change_deg").max()), 0.5)
    gap = _step_up(float(np.median(values("source", "skin.face_body_gap_deg"))), 1.0)
    return {"max_ita_shift_deg": ceiling, "max_face_body_gap_growth_deg": gap, "max_inpaint_gap_deg": gap}


def calibrate_skin_paths(
    paths: list[Path],
    noops: dict[str, tuple[Callable[[np.ndarray], np.ndarray], bool]],
    load: Callable[[Path], np.ndarray],
) -> tuple[dict[str, dict[str, dict[str, list]]], dict[str, float]]:
    """:func:`measure_skin` over ``paths`` read with ``load``, and :func:`suggest_skin`."""
    dist = measure_skin(((Path(p).name, load(Path(p))) for p in paths), noops)
    return dist, suggest_skin(dist)
