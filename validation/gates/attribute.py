"""Target-attribute gate: does the candidate show the group the cell asked for?

A classifier reads the candidate's perceived race and gender (``fairface``), or gender only
(``insightface`` genderage); its classes are mapped to the spec's condition labels by
``label_map``, written in the spec. Where the mapped label differs from the requested one,
the candidate goes to people with ``attribute_mismatch``: classifiers are biased too (FairFace
reports its own per-group accuracy gaps), so a disagreement is a doubt, never a rejection and
never a silent accept. A class the map does not cover is ``attribute_label_unmapped``, a face
the classifier cannot read ``attribute_no_face``; both are review. Metrics per checked axis:
``requested_<axis>``, ``perceived_<axis>`` (spec label or None), ``model_<axis>`` (the
model's class), ``probability_<axis>``, ``match_<axis>``; the release stats turn ``match_*``
into label consistency per condition with Wilson intervals (as FOCUS reported, 97.9 % race and
100 % gender agreement of its VLM check).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from counterfactory.validation.backends.attributes import (
    FAIRFACE_HEADS,
    GENDERAGE_GENDERS,
    FairFaceClassifier,
    GenderAgeClassifier,
    Perceived,
)
from counterfactory.validation.gates.base import GateResult, PairContext

BACKEND_THRESHOLDS: tuple[str, ...] = ()
ATTRIBUTE_BACKENDS = ("fairface", "insightface")
#: What each backend can read.
BACKEND_HEADS: dict[str, dict[str, tuple[str, ...]]] = {
    "fairface": {"race": FAIRFACE_HEADS["race"], "gender": FAIRFACE_HEADS["gender"]},
    "insightface": {"gender": GENDERAGE_GENDERS},
}


class AttributeGateConfig(BaseModel):
    """``gates.face.attribute`` in the spec.

    Attributes:
        backend: ``fairface`` (race, gender) or ``insightface`` (gender).
        label_map: condition axis -> {model class -> spec label}, e.g. ``{"race": {"White":
            "White", "Middle Eastern": "White", "Black": "Black", ...}, "gender": {"Male":
            "male", "Female": "female"}}``. Only these axes are checked.
        weights: the FairFace ONNX file (``fairface`` only).
        sha256: its hex sha256 (required with ``weights``).
        insightface_pack: the buffalo_l folder (``insightface`` only; default as the other
            InsightFace backends).
    """

    model_config = ConfigDict(extra="forbid")

    backend: Literal["fairface", "insightface"]
    label_map: dict[str, dict[str, str]]
    weights: Path | None = None
    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$")
    insightface_pack: Path | None = None

    @model_validator(mode="after")
    def _consistent(self) -> AttributeGateConfig:
        heads = BACKEND_HEADS[self.backend]
        for axis, mapping in self.label_map.items():
            if axis not in heads:
                raise ValueError(
                    f"label_map axis {axis!r}: backend {self.backend!r} reads only {sorted(heads)}; "
                    "remove it or choose a backend that reads it"
                )
            unknown = sorted(set(mapping) - set(heads[axis]))
            if unknown:
                raise ValueError(
                    f"label_map.{axis} maps {unknown}, which {self.backend!r} does not output; "
                    f"its {axis} classes are {list(heads[axis])}"
                )
        if self.backend == "fairface" and (self.weights is None or self.sha256 is None):
            raise ValueError("backend 'fairface' needs weights (an ONNX file) and its sha256")
        return self


def check_label_map(config: AttributeGateConfig, axes: Mapping[str, Sequence[str]]) -> None:
    """Raise ``ValueError`` naming every condition label ``config.label_map`` cannot produce.

    Args:
        axes: the design's axes, ``{"race": ["White", "Black", ...], "gender": [...]}``.
    """
    problems = []
    for axis, mapping in config.label_map.items():
        if axis not in axes:
            problems.append(f"label_map axis {axis!r} is not an axis of the design ({sorted(axes)})")
            continue
        missing = sorted(set(axes[axis]) - set(mapping.values()))
        if missing:
            problems.append(
                f"label_map.{axis} maps no {config.backend} class to {missing}; add "
                f"'<class>: <label>' entries for them (classes: {list(BACKEND_HEADS[config.backend][axis])})"
            )
    if problems:
        raise ValueError("gates.face.attribute: " + "; ".join(problems))


class AttributeGate:
    """The configured target-attribute gate; the classifier is loaded once."""

    name = "attribute"

    def __init__(self, config: AttributeGateConfig, classifier: Any = None) -> None:
        self.config = config
        if classifier is not None:
            self.classifier = classifier
        elif config.backend == "fairface":
            self.classifier = FairFaceClassifier(config.weights, config.sha256)  # type: ignore[arg-type]
        else:
            self.classifier = GenderAgeClassifier(config.insightface_pack)

    def _read(self, pair: PairContext) -> Perceived | None:
        face = pair.candidate_face
        if face is None:
            return None
        if self.config.backend == "fairface":
            return self.classifier.classify(pair.candidate, face.keypoints5())
        return self.classifier.classify(pair.candidate, face.box)

    def __call__(self, pair: PairContext) -> GateResult:
        condition = pair.extras.get("condition") or {}
        axes = [a for a in self.config.label_map if a in condition]
        metrics: dict[str, Any] = {"backend": self.config.backend}
        if not axes:
            return GateResult(self.name, True, metrics)
        perceived = self._read(pair)
        if perceived is None:
            return GateResult(self.name, True, metrics, review=("attribute_no_face",))
        review: list[str] = []
        for axis in axes:
            model_label = perceived.labels.get(axis)
            label = self.config.label_map[axis].get(model_label) if model_label is not None else None
            match = None if label is None else label == str(condition[axis])
            metrics[f"requested_{axis}"] = str(condition[axis])
            metrics[f"model_{axis}"] = model_label
            metrics[f"perceived_{axis}"] = label
            metrics[f"probability_{axis}"] = perceived.probabilities.get(axis)
            metrics[f"match_{axis}"] = match
            if label is None and "attribute_label_unmapped" not in review:
                review.append("attribute_label_unmapped")
            elif match is False and "attribute_mismatch" not in review:
                review.append("attribute_mismatch")
        if perceived.age_years is not None:
            metrics["age_years"] = perceived.age_years
        return GateResult(self.name, True, metrics, review=tuple(review))
