"""What every gate returns, what every gate sees, and how gate results make a verdict.

A gate is a pure function of one :class:`PairContext` (source, aligned candidate, masks and
the face analyses computed once per image) plus keyword-only thresholds bound at build time.
It returns a :class:`GateResult`: metrics, pass/fail and stable reason codes prefixed by the
gate's name (``face_count_mismatch``, ``identity_below_band``, ...). Per-item problems are
values, never exceptions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

# the verdicts (every verdict, in report order; those that fill a cell): the bottom layer's words
from counterfactory.manifests.vocabulary import (  # noqa: F401  (gates and reports import them from here)
    ACCEPTED,
    FAILED,
    FILLING_VERDICTS,
    NEEDS_REVIEW,
    REJECTED,
    VERDICTS,
    Verdict,
)
from counterfactory.validation.accessories import glasses_change as _glasses_change
from counterfactory.validation.faces import FaceObservation, nearest_face
from counterfactory.validation.metrics.pixels import finite_or_none  # noqa: F401  (gates import it from here)
from counterfactory.validation.segment import work_stride

Metric = float | int | str | bool | None


@dataclass(frozen=True)
class GateResult:
    """One gate's measurement of one pair.

    Attributes:
        gate: the gate's name (``face``, ``identity``, ``expression``, ``locality``).
        passed: False rejects the candidate.
        metrics: named numbers; names carry their unit where one applies (``pose_change_deg``).
        reasons: stable codes, each prefixed by ``gate + "_"``, why it did not pass.
        review: codes of soft doubts that send an otherwise passing candidate to people.
        thresholds: the thresholds this result was judged against, for the record.
        error: set when the gate could not measure at all (an unexpected per-item error);
            the candidate's verdict is then ``failed`` with this text.
    """

    gate: str
    passed: bool
    metrics: dict[str, Metric] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()
    review: tuple[str, ...] = ()
    thresholds: dict[str, Metric] = field(default_factory=dict)
    error: str | None = None

    def __post_init__(self) -> None:
        for code in self.reasons + self.review:
            if not code.startswith(self.gate + "_"):
                raise ValueError(f"reason code {code!r} must start with {self.gate + '_'!r}")


@dataclass(frozen=True)
class SourceAnalysis:
    """What the gates measure on a source alone, computed once and shared by every candidate.

    In a run every cell of a template is judged against the same source photo, so the
    source's landmarks, face mask, person segmentation and each gate's source-side work
    (detector faces, identity embedding, AUs, locality regions, skin tones) are computed once
    (:meth:`~counterfactory.validation.gate_stack.GateStack.analyse_source`) and reused.

    Attributes:
        key: what names the source's pixels (the sha256 of shape, dtype and bytes, or a key
            the caller vouches for, such as the image store's sha256).
        shape: ``(H, W, 3)`` of the source.
        faces: landmarker observations of the source, largest first.
        face_mask: ``(H, W)`` uint8 {0, 255} face region drawn in ``face_mask_mode``, or None.
        face_mask_mode: ``oval`` or ``skin``.
        stride: the working resolution's stride k (every k-th pixel of each row and column,
            :func:`~counterfactory.validation.segment.work_stride`).
        work_image: ``source[::k, ::k]``, contiguous ``(ceil(H / k), ceil(W / k), 3)`` uint8.
        person: ``(ceil(H / k), ceil(W / k))`` float32 person probability in [0, 1] of
            ``work_image`` (the selfie segmenter), or None when no gate needs it.
        gate_data: gate name -> what that gate's ``prepare`` computed (read-only by contract).
        region: the edit region's name (:data:`~counterfactory.generation.regions.REGIONS`):
            what the prompt asks the editor to change.
        region_mask: ``(H, W)`` uint8 {0, 255} that region drawn for the subject
            (:func:`~counterfactory.validation.faces.region_mask`), or None (no face). Body
            skin is measured outside it.
    """

    key: str
    shape: tuple[int, ...]
    faces: tuple[FaceObservation, ...]
    face_mask: np.ndarray | None
    face_mask_mode: str
    stride: int = 1
    work_image: np.ndarray | None = None
    person: np.ndarray | None = None
    gate_data: dict[str, Any] = field(default_factory=dict)
    region: str = "face"
    region_mask: np.ndarray | None = None


@dataclass(frozen=True)
class PairContext:
    """Everything a gate may look at for one source/candidate pair.

    Attributes:
        source: ``(H, W, 3)`` uint8 RGB.
        candidate: ``(H, W, 3)`` uint8 RGB, already aligned to ``source``.
        kind: ``"face"`` or ``"limb"``.
        face_mask: ``(H, W)`` uint8 {0, 255} face region of the source, or None (no face).
        edit_mask: ``(H, W)`` uint8 {0, 255} limb region for limb cells, else None.
        source_faces / candidate_faces: landmarker observations, largest first.
        face_mask_mode: how ``face_mask`` was drawn (``oval`` or ``skin``), for the record.
        extras: what the cell knows beyond the pixels: ``condition`` (axis -> requested value)
            and ``source`` (the source's metadata record), for gates that judge against them.
        covered: ``(H, W)`` bool, where the editor's output covers the source frame (an output
            of another aspect ratio, cropped); None when it covers all of it. Pixel
            measurements read only the covered part.
        analysis: the source's :class:`SourceAnalysis` (shared by every candidate of that
            source), or None: a gate then measures the source itself, where it can.
        raw_candidate: ``(H, W, 3)`` uint8 the registered editor output *before* any composite
            (None when the caller has none, or it equals ``candidate``); locality reports it.
        unregistered: the editor output as returned (any size, uint8 RGB), or None; locality
            reports FOCUS-comparable figures on it, resized to the source size.
        region_mask: ``(H, W)`` uint8 {0, 255} the edit region the prompt names, when the
            caller has no ``analysis`` holding it; None: the analysis's, else the face oval.
    """

    source: np.ndarray
    candidate: np.ndarray
    kind: Literal["face", "limb"]
    face_mask: np.ndarray | None
    edit_mask: np.ndarray | None
    source_faces: Sequence[FaceObservation]
    candidate_faces: Sequence[FaceObservation]
    face_mask_mode: str = "oval"
    extras: dict[str, Any] = field(default_factory=dict)
    covered: np.ndarray | None = None
    analysis: SourceAnalysis | None = None
    raw_candidate: np.ndarray | None = None
    unregistered: np.ndarray | None = None
    region_mask: np.ndarray | None = None

    @property
    def edit_region_mask(self) -> np.ndarray | None:
        """The edit region (:attr:`region_mask`, else the analysis's), or None: the face oval."""
        if self.region_mask is not None:
            return self.region_mask
        return self.analysis.region_mask if self.analysis is not None else None

    @property
    def source_face(self) -> FaceObservation | None:
        """The source's subject: its largest face."""
        return self.source_faces[0] if self.source_faces else None

    @property
    def candidate_face(self) -> FaceObservation | None:
        """The candidate's face at the subject's place (:func:`~counterfactory.validation.faces.nearest_face`)."""
        src = self.source_face
        if src is None:
            return self.candidate_faces[0] if self.candidate_faces else None
        return nearest_face(src, self.candidate_faces)

    @property
    def stride(self) -> int:
        """The working grid's stride k (:func:`~counterfactory.validation.segment.work_stride`)."""
        return self.analysis.stride if self.analysis is not None else work_stride(self.source.shape)

    @cached_property
    def work_source(self) -> np.ndarray:
        """``source[::k, ::k]`` contiguous: the working grid the summarising measures read."""
        if self.analysis is not None and self.analysis.work_image is not None:
            return self.analysis.work_image
        k = self.stride
        return self.source if k == 1 else np.ascontiguousarray(self.source[::k, ::k])

    @cached_property
    def work_candidate(self) -> np.ndarray:
        """``candidate[::k, ::k]`` contiguous (computed once per pair, shared by the gates)."""
        k = self.stride
        return self.candidate if k == 1 else np.ascontiguousarray(self.candidate[::k, ::k])

    @cached_property
    def work_covered(self) -> np.ndarray | None:
        """``covered[::k, ::k]`` (bool), or None when the output covers the whole frame."""
        if self.covered is None:
            return None
        k = self.stride
        return np.ascontiguousarray(np.asarray(self.covered, dtype=bool)[::k, ::k])

    @cached_property
    def glasses_change(self) -> float | None:
        """:func:`~counterfactory.validation.accessories.glasses_change` of the pair on the
        source face's mesh (None without a source face), taken once per pair: the face gate
        judges it and the expression gate reads it (a brow under a frame is not judged)."""
        face = self.source_face
        return None if face is None else _glasses_change(self.source, self.candidate, face.landmarks)

    def source_data(self, gate: str) -> Any:
        """What ``gate``'s ``prepare`` computed on this pair's source, or None."""
        return None if self.analysis is None else self.analysis.gate_data.get(gate)


class Gate(Protocol):
    """A configured gate: thresholds and model handles bound, pure in the pair."""

    name: str

    def __call__(self, pair: PairContext) -> GateResult: ...


@runtime_checkable
class PreparingGate(Protocol):
    """A gate with source-side work worth doing once per source.

    ``prepare`` sees only the source (never a candidate, ``covered`` or an edit mask) and
    returns what its ``__call__`` later reads back with ``pair.source_data(name)``; a gate
    called on a pair without an analysis does that work itself.
    """

    name: str

    def prepare(self, source: np.ndarray, analysis: SourceAnalysis) -> Any: ...

    def __call__(self, pair: PairContext) -> GateResult: ...


#: ``PairContext.extras`` key set when the candidate could not be registered to its source
#: (:func:`~counterfactory.validation.judging.judge_aligned`): a gate then measures what it
#: can read on each image's own landmarks, nothing that compares pixels at the same place
REGISTRATION_FAILED = "registration_failed"


@dataclass(frozen=True)
class Judgement:
    """The verdict over all gates for one candidate."""

    verdict: Verdict
    reasons: tuple[str, ...]
    results: tuple[GateResult, ...]

    @property
    def metrics(self) -> dict[str, Metric]:
        """Every gate's metrics, flattened as ``gate.metric``."""
        return {f"{r.gate}.{k}": v for r in self.results for k, v in r.metrics.items()}

    @property
    def thresholds(self) -> dict[str, Metric]:
        return {f"{r.gate}.{k}": v for r in self.results for k, v in r.thresholds.items()}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: verdict, reasons, and per gate its outcome, metrics and thresholds."""
        return {
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "gates": {
                r.gate: {
                    "passed": r.passed,
                    "metrics": dict(r.metrics),
                    "reasons": list(r.reasons),
                    "review": list(r.review),
                    "thresholds": dict(r.thresholds),
                    **({"error": r.error} if r.error is not None else {}),
                }
                for r in self.results
            },
        }


def combine(results: Sequence[GateResult]) -> Judgement:
    """Failed if a gate could not measure; rejected if any gate failed; else needs_review if
    any gate doubts; else accepted."""
    errors = tuple(code for r in results if r.error is not None for code in r.reasons)
    if errors:
        return Judgement(FAILED, errors, tuple(results))
    reasons = tuple(code for r in results for code in r.reasons)
    if any(not r.passed for r in results):
        return Judgement(REJECTED, reasons, tuple(results))
    review = tuple(code for r in results for code in r.review)
    if review:
        return Judgement(NEEDS_REVIEW, review, tuple(results))
    return Judgement(ACCEPTED, (), tuple(results))


def not_finite_metrics(metrics: dict[str, Metric]) -> list[str]:
    """Names of float metrics that are NaN or infinite."""
    return [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
