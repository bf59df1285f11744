"""Build the gate stack from the spec and judge one aligned pair.

``GateStack.evaluate`` checks the inputs, runs the face analysis once per image, hands every
gate the same :class:`~counterfactory.validation.gates.base.PairContext`, and combines the results into a
verdict. Bad input (another size, no face, a blank image, NaNs) comes back as a rejection
with reason codes; only a backend that cannot load raises, when the stack is built.

Thresholds a spec leaves out come from the shipped calibration
(:mod:`counterfactory.validation.thresholds`), per edit kind and for the backend they were measured with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from counterfactory.validation.backends import BackendUnavailable
from counterfactory.validation.faces import FaceLandmarker, MaskMode, face_mask, get_face_landmarker
from counterfactory.validation.gates import expression as _expression
from counterfactory.validation.gates import face as _face
from counterfactory.validation.gates import identity as _identity
from counterfactory.validation.gates.attribute import AttributeGate, AttributeGateConfig
from counterfactory.validation.gates.base import Gate, GateResult, Judgement, PairContext, combine, not_finite_metrics
from counterfactory.validation.gates.expression import ExpressionGate, ExpressionGateConfig
from counterfactory.validation.gates.face import FaceGate, FaceGateConfig
from counterfactory.validation.gates.identity import IdentityGate, IdentityGateConfig
from counterfactory.validation.gates.inputs import input_gate
from counterfactory.validation.gates.locality import LocalityGate, LocalityGateConfig
from counterfactory.validation.gates.skin import SkinGate, SkinGateConfig
from counterfactory.validation.segment import PersonSegmenter, get_person_segmenter
from counterfactory.validation.thresholds import RECALIBRATE, calibrated_gates

Kind = Literal["face", "limb"]
#: Gate name -> (config class, thresholds whose calibration belongs to one backend).
GATE_CONFIGS: dict[str, tuple[type[BaseModel], tuple[str, ...]]] = {
    "face": (FaceGateConfig, _face.BACKEND_THRESHOLDS),
    "identity": (IdentityGateConfig, _identity.BACKEND_THRESHOLDS),
    "expression": (ExpressionGateConfig, _expression.BACKEND_THRESHOLDS),
    "locality": (LocalityGateConfig, ()),
    "skin": (SkinGateConfig, ()),
    "attribute": (AttributeGateConfig, ()),
}
#: Gates that stay off unless the spec configures them (they need files the user supplies).
OPT_IN_GATES = frozenset({"attribute"})


def _with_calibrated_defaults(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with every gate's missing settings taken from the calibration for ``kind``.

    A gate set to None stays disabled. A gate whose chosen backend differs from the one
    calibrated keeps only its backend-free defaults (a cosine of one model is not a cosine
    of another); a required threshold then missing is an error that names the fix.
    """
    calibrated = calibrated_gates(kind)
    out = dict(data)
    for gate, (config_cls, backend_keys) in GATE_CONFIGS.items():
        if gate in data and data[gate] is None:
            continue
        if gate in OPT_IN_GATES and gate not in data:
            continue
        given = data.get(gate, {})
        if isinstance(given, BaseModel):
            continue  # an already-built sub-config is taken as it is
        given = dict(given)
        defaults = dict(calibrated.get(gate, {}))
        cal_backend = defaults.get("backend")
        backend = given.get("backend", cal_backend)
        if cal_backend is not None and backend != cal_backend:
            for key in backend_keys:
                defaults.pop(key, None)
        merged = {**defaults, **given}
        missing = [
            name for name, field in config_cls.model_fields.items() if field.is_required() and name not in merged
        ]
        if missing:
            raise ValueError(
                f"gates.{kind}.{gate}: backend {backend!r} has no calibrated "
                f"{', '.join(missing)} (the shipped calibration measured {cal_backend!r}); "
                f"set {', '.join(missing)} in the spec, or re-run `{RECALIBRATE}` with that backend"
            )
        out[gate] = merged
    return out


class KindGatesConfig(BaseModel):
    """Gate choices and thresholds for one edit kind (``gates.face`` / ``gates.limb``).

    Every gate is on by default with the calibrated thresholds for ``kind``; set a gate to
    ``null`` to switch it off, or give any of its fields to override them. The ``attribute``
    gate is the exception: it reads a classifier the user supplies, so it is on only when
    configured.
    """

    model_config = ConfigDict(extra="forbid")

    kind: Kind = "face"
    face: FaceGateConfig | None = None
    identity: IdentityGateConfig | None = None
    expression: ExpressionGateConfig | None = None
    locality: LocalityGateConfig | None = None
    skin: SkinGateConfig | None = None
    attribute: AttributeGateConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _fill_calibrated(cls, data: Any) -> Any:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            return data
        return _with_calibrated_defaults(data.get("kind", "face"), data)


class GatesConfig(BaseModel):
    """``gates`` in the spec: one set per edit kind, and how the face mask is drawn."""

    model_config = ConfigDict(extra="forbid")

    face_mask: MaskMode = "oval"
    face: KindGatesConfig = Field(default_factory=lambda: KindGatesConfig(kind="face"))
    limb: KindGatesConfig = Field(default_factory=lambda: KindGatesConfig(kind="limb"))

    @model_validator(mode="before")
    @classmethod
    def _kinds(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for kind in ("face", "limb"):
            sub = data.get(kind)
            if isinstance(sub, dict):
                if sub.get("kind", kind) != kind:
                    raise ValueError(f"gates.{kind}.kind must be {kind!r}, got {sub['kind']!r}")
                data[kind] = {**sub, "kind": kind}
            elif isinstance(sub, KindGatesConfig) and sub.kind != kind:
                raise ValueError(f"gates.{kind} holds thresholds for kind {sub.kind!r}")
            elif sub is None and kind in data:
                raise ValueError(f"gates.{kind} must be a mapping of gates (set single gates to null)")
        return data

    def for_kind(self, kind: Kind) -> KindGatesConfig:
        if kind not in ("face", "limb"):
            raise ValueError(f"edit kind must be 'face' or 'limb', got {kind!r}")
        return self.face if kind == "face" else self.limb


class GateStack:
    """The configured gates for one edit kind, with the models they share loaded once."""

    def __init__(
        self,
        gates: list[Gate],
        *,
        kind: Kind,
        face_mask_mode: MaskMode = "oval",
        landmarker: FaceLandmarker | None = None,
        segmenter: PersonSegmenter | None = None,
    ) -> None:
        self.gates = gates
        self.kind = kind
        self.face_mask_mode = face_mask_mode
        self.landmarker = landmarker or get_face_landmarker()
        self._segmenter = segmenter

    @property
    def segmenter(self) -> PersonSegmenter:
        """The person segmenter (loaded on first use: only face edits measure body skin)."""
        if self._segmenter is None:
            self._segmenter = get_person_segmenter()
        return self._segmenter

    def wants_person_mask(self) -> bool:
        """Whether :meth:`context` segments the source's person (the locality gate judges body skin)."""
        config = getattr(next((g for g in self.gates if g.name == "locality"), None), "config", None)
        return getattr(config, "max_body_skin_delta_e", None) is not None

    @classmethod
    def from_config(cls, config: GatesConfig, kind: Kind) -> GateStack:
        """Build the gates for ``kind``, loading each backend (once per process).

        Raises :class:`~counterfactory.validation.backends.BackendUnavailable` when a chosen backend cannot
        run here (missing optional dependency or weights), before any pair is judged.
        """
        chosen = config.for_kind(kind)
        gates: list[Gate] = []
        if chosen.face is not None:
            gates.append(FaceGate(chosen.face))
        if chosen.identity is not None:
            gates.append(IdentityGate(chosen.identity))
        if chosen.expression is not None:
            gates.append(ExpressionGate(chosen.expression))
        if chosen.locality is not None:
            gates.append(LocalityGate(chosen.locality))
        if chosen.skin is not None:
            gates.append(SkinGate(chosen.skin))
        if chosen.attribute is not None:
            gates.append(AttributeGate(chosen.attribute))
        return cls(gates, kind=kind, face_mask_mode=config.face_mask)

    def without(self, *names: str) -> GateStack:
        """The same stack minus the gates called ``names`` (models stay shared)."""
        kept = [g for g in self.gates if g.name not in names]
        return GateStack(
            kept,
            kind=self.kind,
            face_mask_mode=self.face_mask_mode,
            landmarker=self.landmarker,
            segmenter=self._segmenter,
        )

    def has(self, name: str) -> bool:
        """Whether a gate called ``name`` is in the stack."""
        return any(g.name == name for g in self.gates)

    def context(
        self,
        source: np.ndarray,
        candidate: np.ndarray,
        *,
        edit_mask: np.ndarray | None = None,
        extras: Mapping[str, Any] | None = None,
        covered: np.ndarray | None = None,
        raw_candidate: np.ndarray | None = None,
        unregistered: np.ndarray | None = None,
    ) -> PairContext:
        """Analyse both images once and draw the source's face mask (and, when the locality
        gate judges body skin, the source's person mask).

        ``source`` and ``candidate`` are ``(H, W, 3)`` uint8 RGB of the same shape (raises
        ``ValueError`` otherwise; :meth:`evaluate` turns that into a rejection first).
        ``raw_candidate`` and ``unregistered`` are passed on for reporting (see
        :class:`~counterfactory.validation.gates.base.PairContext`).
        """
        if source.shape != candidate.shape:
            raise ValueError(f"candidate {candidate.shape} is not aligned to source {source.shape}")
        src_faces = self.landmarker.detect(source)
        cand_faces = self.landmarker.detect(candidate)
        fmask = face_mask(src_faces[0].landmarks, source.shape[:2], mode=self.face_mask_mode) if src_faces else None
        return PairContext(
            source=source,
            candidate=candidate,
            kind=self.kind,
            face_mask=fmask,
            edit_mask=edit_mask,
            source_faces=src_faces,
            candidate_faces=cand_faces,
            face_mask_mode=self.face_mask_mode,
            extras=dict(extras or {}),
            covered=None if covered is None or covered.all() else covered,
            person_mask=self.segmenter.person_mask(source) if src_faces and self.wants_person_mask() else None,
            raw_candidate=raw_candidate,
            unregistered=unregistered,
        )

    def evaluate(
        self,
        source: np.ndarray,
        candidate: np.ndarray,
        *,
        edit_mask: np.ndarray | None = None,
        extras: Mapping[str, Any] | None = None,
        covered: np.ndarray | None = None,
        raw_candidate: np.ndarray | None = None,
        unregistered: np.ndarray | None = None,
    ) -> Judgement:
        """Judge one aligned pair: ``accepted``, ``rejected`` (with reasons),
        ``needs_review`` or ``failed`` (a gate could not measure; the error is recorded).

        Args:
            source: ``(H, W, 3)`` uint8 RGB (float in [0, 1] is accepted and converted).
            candidate: the aligned candidate, same shape as ``source``.
            edit_mask: ``(H, W)`` limb mask (nonzero inside) for limb cells.
            extras: what the cell knows beyond the pixels, for gates that judge against it:
                ``condition`` (axis -> requested value) and ``source`` (the source's metadata
                record); the skin gate uses them to tell same-group controls from edits.
            covered: ``(H, W)`` bool, where the editor's output covers the source frame
                (:attr:`~counterfactory.generation.align.Alignment.covered`); None for all.
            raw_candidate: the registered output before compositing, same shape (reported as
                ``locality.raw_*``); None when there was no composite.
            unregistered: the editor's output as returned, uint8 RGB of any size (reported
                as ``locality.focus_*``, FOCUS's figures without registration).
        """
        checked, src, cand = input_gate(source, candidate, edit_mask=edit_mask)
        if src is None or cand is None:
            return combine([checked])
        try:
            pair = self.context(
                src,
                cand,
                edit_mask=edit_mask,
                extras=extras,
                covered=covered,
                raw_candidate=raw_candidate,
                unregistered=unregistered,
            )
        except Exception as exc:  # a per-item analysis error is a value, not a crash
            failed = GateResult("input", False, dict(checked.metrics), ("input_analysis_error",), error=_describe(exc))
            return combine([failed])
        results: list[GateResult] = [checked]
        for gate in self.gates:
            try:
                result = gate(pair)
            except BackendUnavailable:
                raise
            except Exception as exc:
                result = GateResult(gate.name, False, reasons=(f"{gate.name}_error",), error=_describe(exc))
            results.append(_guard_finite(result))
        return combine(results)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _guard_finite(result: GateResult) -> GateResult:
    """Replace NaN / infinite metrics by None and reject with ``<gate>_metric_not_finite``."""
    bad = not_finite_metrics(result.metrics)
    if not bad:
        return result
    metrics = {k: (None if k in bad else v) for k, v in result.metrics.items()}
    code = f"{result.gate}_metric_not_finite"
    reasons = result.reasons if code in result.reasons else result.reasons + (code,)
    return GateResult(result.gate, False, metrics, reasons, result.review, result.thresholds, result.error)
