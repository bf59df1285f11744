"""Expression gate: the change in facial action units between source and candidate.

FOCUS fixes the expression in its edit prompt and audits expression drift; a smile that
appears only for some target groups would confound the study. AUs (Ekman & Friesen's Facial
Action Coding System) are estimated on both images and compared AU by AU, on a common [0, 1]
intensity scale: MediaPipe blendshapes mapped to AUs by default
(:data:`counterfactory.validation.backends.mediapipe.BLENDSHAPE_AUS` documents the mapping), or LibreFace's
DISFA intensities divided by their 0-5 range.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from counterfactory.validation.backends import AUEstimator, load_au_model
from counterfactory.validation.gates.base import GateResult, PairContext

BACKEND_THRESHOLDS = ("max_au_change", "max_mean_au_change")


class ExpressionGateConfig(BaseModel):
    """Expression gate settings (``gates.<kind>.expression`` in the spec)."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["mediapipe", "libreface"] = "mediapipe"
    max_au_change: float = Field(
        ..., gt=0.0, le=1.0, description="largest |change| of any one AU, fraction of full intensity"
    )
    max_mean_au_change: float | None = Field(
        None, gt=0.0, le=1.0, description="mean |change| over the AUs, fraction of full intensity"
    )
    libreface_weights: str | None = Field(None, description="LibreFace resnet.pt for backend libreface")

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
) -> GateResult:
    """AU change from the source's largest face to the candidate's face at its place.

    Args:
        pair: the aligned pair with both images' MediaPipe observations.
        au_model: an AU estimator returning intensities in [0, 1].
        max_au_change: bound on ``au_change_max`` (the largest absolute change of one AU).
        max_mean_au_change: bound on ``au_change_mean``; None: not judged.

    Metrics: ``au_change_max``, ``au_change_mean``, ``au_change_argmax`` (which AU), and
    ``delta_<AU>`` (signed, candidate minus source) for every AU of the backend.
    Reasons: ``expression_source_no_face``, ``expression_candidate_no_face``,
    ``expression_aus_not_finite``, ``expression_au_change_above_max``,
    ``expression_mean_au_change_above_max``.
    """
    thresholds = {
        "max_au_change": max_au_change,
        "max_mean_au_change": max_mean_au_change,
        "backend": au_model.name,
    }
    metrics: dict = {"au_change_max": None, "au_change_mean": None, "au_change_argmax": None}
    metrics.update({f"delta_{au}": None for au in au_model.aus})
    reasons: list[str] = []
    if not pair.source_faces:
        reasons.append("expression_source_no_face")
    if not pair.candidate_faces:
        reasons.append("expression_candidate_no_face")
    if reasons:
        return GateResult("expression", False, metrics, tuple(reasons), thresholds=thresholds)

    src = dict(au_model.estimate(pair.source, pair.source_face))
    cand = dict(au_model.estimate(pair.candidate, pair.candidate_face))
    deltas = au_changes(src, cand)
    for au, d in deltas.items():
        metrics[f"delta_{au}"] = d
    if not deltas:
        reasons.append("expression_aus_not_finite")
    else:
        argmax = max(deltas, key=lambda au: abs(deltas[au]))
        metrics["au_change_max"] = abs(deltas[argmax])
        metrics["au_change_mean"] = sum(abs(d) for d in deltas.values()) / len(deltas)
        metrics["au_change_argmax"] = argmax if deltas[argmax] != 0 else None
        if metrics["au_change_max"] > max_au_change:
            reasons.append("expression_au_change_above_max")
        if max_mean_au_change is not None and metrics["au_change_mean"] > max_mean_au_change:
            reasons.append("expression_mean_au_change_above_max")
    return GateResult("expression", not reasons, metrics, tuple(reasons), thresholds=thresholds)


class ExpressionGate:
    """:func:`expression_gate` with its configuration and AU model bound."""

    name = "expression"

    def __init__(self, config: ExpressionGateConfig, au_model: AUEstimator | None = None) -> None:
        self.config = config
        self.au_model = au_model if au_model is not None else config.load()

    def __call__(self, pair: PairContext) -> GateResult:
        return expression_gate(
            pair,
            au_model=self.au_model,
            max_au_change=self.config.max_au_change,
            max_mean_au_change=self.config.max_mean_au_change,
        )
