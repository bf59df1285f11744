"""Target-attribute gate: does the candidate show the group the cell asked for?

A classifier reads the candidate's perceived race and gender (``fairface``), or gender only
(``insightface`` genderage); its classes are mapped to the spec's condition labels by
``label_map``, written in the spec. Or a vision-language model (``vlm``), reached through an
answer backend of ``ask`` by name (``answer_backend``: ``fal``, ``openai``, ``transformers``,
a plug-in's), is asked for the labels themselves, in strict JSON from the spec's label set (``labels``); its raw answer,
request id and cost are recorded, and an answer that is not valid JSON, names a label
outside the set, or refuses goes to review (``attribute_vlm_malformed``,
``attribute_vlm_label_invalid``, ``attribute_vlm_refused``; ``attribute_vlm_unanswered`` when
the call itself failed). Coverage (the share of valid answers) is ``vlm_status == "ok"``. Where the mapped label differs from the requested one,
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

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from counterfactory.manifests.errors import SetupError
from counterfactory.manifests.paid import MemoryJournal, PaidJournal
from counterfactory.manifests.vocabulary import OK
from counterfactory.validation.backends.attributes import (
    FAIRFACE_HEADS,
    GENDERAGE_GENDERS,
    FairFaceClassifier,
    GenderAgeClassifier,
    Perceived,
)
from counterfactory.validation.gates.base import GateResult, PairContext
from counterfactory.validation.gates.registry import GATES

BACKEND_THRESHOLDS: tuple[str, ...] = ()
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
        labels: axis -> the labels a ``vlm`` may answer with.
        model: the model the answer backend asks (``vlm`` only), e.g. ``google/gemini-2.5-flash``.
        prompt: the versioned prompt in ``assets/prompts/`` (``vlm`` only).
        answer_backend: the answer backend that carries the question (``vlm`` only):
            ``fal`` (the default), ``openai``, ``transformers`` or a plug-in's, as ``ask
            --backend`` takes them.
        temperature, max_tokens: decoding (``vlm`` only; part of every question's id).
        concurrency, spend_cap_usd, max_retries: the backend's paid client (``vlm`` only), as
            ``ask``'s ``--concurrency``, ``--max-spend``, ``--retries``.
        options: the answer backend's own options (``vlm`` only; in the spec written inline
            beside the fields above, e.g. ``base_url`` for ``openai``, ``estimated_usd_per_question``
            or ``poll_interval_s`` for ``fal``), validated by that backend's options model with
            ``model``.
    """

    model_config = ConfigDict(extra="forbid")

    backend: Literal["fairface", "insightface", "vlm"]
    label_map: dict[str, dict[str, str]] = Field(default_factory=dict)
    weights: Path | None = None
    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$")
    insightface_pack: Path | None = None
    labels: dict[str, list[str]] = Field(default_factory=dict)
    model: str | None = None
    prompt: str = "attribute_vlm_v1"
    answer_backend: str = "fal"
    temperature: float = Field(0.0, ge=0, le=2)
    max_tokens: int | None = Field(None, ge=1)
    concurrency: int = Field(4, ge=1)
    spend_cap_usd: float | None = Field(None, ge=0)
    max_retries: int = Field(3, ge=0)
    options: dict[str, Any] = Field(default_factory=dict)
    _answer_options: BaseModel | None = PrivateAttr(None)

    @property
    def answer_options(self) -> BaseModel | None:
        """The answer backend's validated options (``vlm`` only)."""
        return self._answer_options

    @model_validator(mode="before")
    @classmethod
    def _inline_options(cls, data: Any) -> Any:
        """With ``backend: vlm``, keys that are not the gate's own are the answer backend's options."""
        if not isinstance(data, Mapping) or data.get("backend") != "vlm":
            return data
        own = {k: v for k, v in data.items() if k in cls.model_fields}
        extra = {k: v for k, v in data.items() if k not in cls.model_fields}
        if extra:
            own["options"] = {**dict(own.get("options") or {}), **extra}
        return own

    @model_validator(mode="after")
    def _consistent(self) -> AttributeGateConfig:
        if self.backend == "vlm":
            if not self.labels or self.label_map:
                raise ValueError(
                    "backend 'vlm' answers in the spec's labels: give labels (axis -> list of "
                    "labels, e.g. {race: [White, Black], gender: [female, male]}) and no label_map"
                )
            if not self.model:
                raise ValueError(
                    "backend 'vlm' needs model: the model the answer backend sends the question to, "
                    "e.g. google/gemini-2.5-flash"
                )
            self._answer_options = validate_answer_options(self.answer_backend, str(self.model), self.options)
            return self
        if not self.label_map:
            raise ValueError(f"backend {self.backend!r} needs label_map: model class -> spec label per axis")
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


def validate_answer_options(name: str, model: str, options: Mapping[str, Any]) -> BaseModel:
    """The answer backend ``name``'s options model, validated from ``model`` and ``options``.

    Raises:
        ValueError: an unknown backend (naming ``answer_backend`` and the valid names), or
            options that backend does not take (naming each field).
    """
    from counterfactory.validation.scoring.registry import ANSWER_BACKENDS

    try:
        plugin = ANSWER_BACKENDS.get(name)
    except SetupError as exc:
        raise ValueError(f"answer_backend: {exc}") from None
    if "reasoning" in plugin.options.model_fields:  # fal's router: no reasoning unless asked, as before
        options = {"reasoning": False, **options}
    try:
        return plugin.options.model_validate({"model": model, **options})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'options'}: {e['msg']}" for e in exc.errors(include_url=False)
        )
        raise ValueError(f"answer_backend {name!r} options: {problems}") from None


def check_label_map(config: AttributeGateConfig, axes: Mapping[str, Sequence[str]]) -> None:
    """Raise ``ValueError`` naming every condition label ``config.label_map`` cannot produce.

    Args:
        axes: the design's axes, ``{"race": ["White", "Black", ...], "gender": [...]}``.
    """
    problems = []
    if config.backend == "vlm":
        for axis, values in config.labels.items():
            if axis not in axes:
                problems.append(f"labels axis {axis!r} is not an axis of the design ({sorted(axes)})")
            elif set(axes[axis]) - set(values):
                problems.append(f"labels.{axis} lacks {sorted(set(axes[axis]) - set(values))}; add them")
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


def vision_asker(config: AttributeGateConfig) -> Any:
    """The :class:`~counterfactory.validation.backends.vlm.VisionAsker` a ``vlm`` gate asks through."""
    from counterfactory.validation.backends.vlm import VisionAsker
    from counterfactory.validation.scoring.registry import ANSWER_BACKENDS

    backend = ANSWER_BACKENDS.get(config.answer_backend).factory(config.answer_options)
    return VisionAsker(
        backend,
        concurrency=config.concurrency,
        spend_cap_usd=config.spend_cap_usd,
        max_retries=config.max_retries,
        decoding={"temperature": config.temperature, "max_tokens": config.max_tokens},
    )


class AttributeGate:
    """The configured target-attribute gate; the classifier is loaded once."""

    name = "attribute"

    def __init__(
        self, config: AttributeGateConfig, classifier: Any = None, *, journal: PaidJournal | None = None
    ) -> None:
        self.config = config
        #: where paid VLM questions are journaled; the flow binds the ledger's
        self.journal: PaidJournal = journal if journal is not None else MemoryJournal()
        if classifier is not None:
            self.classifier = classifier
        elif config.backend == "vlm":
            self.classifier = vision_asker(config)
        elif config.backend == "fairface":
            self.classifier = FairFaceClassifier(config.weights, config.sha256)  # type: ignore[arg-type]
        else:
            self.classifier = GenderAgeClassifier(config.insightface_pack)

    def _read(self, pair: PairContext) -> Perceived | None:
        face = pair.candidate_face
        if face is None:
            return None
        if self.config.backend == "fairface":
            return self.classifier.classify(pair.candidate, face.dlib_points5())
        return self.classifier.classify(pair.candidate, face.box)

    def _ask(self, pair: PairContext, axes: list[str]) -> GateResult:
        from counterfactory.validation.backends.vlm import ask_labels

        condition = pair.extras.get("condition") or {}
        answer = ask_labels(
            self.classifier,
            [pair.candidate],
            self.config.labels,
            prompt_version=self.config.prompt,
            journal=self.journal,
        )[0]
        metrics: dict[str, Any] = {
            "backend": "vlm",
            "vlm_status": answer.status,
            "vlm_raw": answer.raw,
            "vlm_reason": answer.reason,
            "vlm_request_id": answer.request_id,
            "vlm_cost_usd": answer.cost_usd,
            "vlm_resumed": answer.resumed,
        }
        if answer.status != OK:
            code = {
                "malformed": "attribute_vlm_malformed",
                "invalid_label": "attribute_vlm_label_invalid",
                "refused": "attribute_vlm_refused",
            }.get(answer.status, "attribute_vlm_unanswered")
            return GateResult(self.name, True, metrics, review=(code,))
        mismatch = False
        for axis in axes:
            label = answer.labels.get(axis)
            metrics[f"requested_{axis}"] = str(condition[axis])
            metrics[f"perceived_{axis}"] = label
            metrics[f"match_{axis}"] = label == str(condition[axis])
            mismatch = mismatch or label != str(condition[axis])
        return GateResult(self.name, True, metrics, review=("attribute_mismatch",) if mismatch else ())

    def __call__(self, pair: PairContext) -> GateResult:
        condition = pair.extras.get("condition") or {}
        checked = self.config.labels if self.config.backend == "vlm" else self.config.label_map
        axes = [a for a in checked if a in condition]
        if axes and self.config.backend == "vlm":
            return self._ask(pair, axes)
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


GATES.register("attribute", AttributeGateConfig, AttributeGate, opt_in=True, order=60)
