"""Identity gate: cosine similarity of face embeddings, inside a band per edit kind.

- Face edits change the face's demographic cues but keep the head: the cosine must stay at or
  above ``min_cosine`` (the different-person floor: two different people score below it).
  At or above ``max_cosine`` (the no-op ceiling: what re-encoding, mirroring or a small shift
  of the source itself scores) the "edit" is a copy. A copy is sent to review, not rejected:
  the cell whose target group is the source's own group may rightly come back unchanged.
- Limb edits must leave the face alone: ``min_cosine`` is the no-op ceiling, no upper bound.

Embeddings: OpenCV SFace by default (Zhong et al., IEEE TIP 2021), InsightFace ArcFace
(Deng et al., CVPR 2019) from a buffalo_l pack. Both crop the face on the ArcFace five-point
template from MediaPipe mesh points. Cosines of different models are not comparable: the
calibrated band belongs to one backend (``counterfactory calibrate`` records which).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from counterfactory.validation.backends import FaceEmbedder, load_embedder
from counterfactory.validation.gates.base import GateResult, PairContext, SourceAnalysis, finite_or_none
from counterfactory.validation.gates.registry import GATES

BACKEND_THRESHOLDS = ("min_cosine", "max_cosine")


class IdentityGateConfig(BaseModel):
    """Identity gate settings (``gates.<kind>.identity`` in the spec)."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["sface", "insightface"] = "sface"
    min_cosine: float = Field(..., ge=-1.0, le=1.0, description="cosine below this: a different head")
    max_cosine: float | None = Field(
        None, ge=-1.0, le=1.0, description="cosine at or above this: a copy of the source (sent to review)"
    )
    insightface_pack: str | None = Field(None, description="buffalo_l folder for backend insightface")

    @model_validator(mode="after")
    def _band(self) -> IdentityGateConfig:
        if self.max_cosine is not None and self.max_cosine <= self.min_cosine:
            raise ValueError(f"max_cosine ({self.max_cosine}) must be above min_cosine ({self.min_cosine})")
        return self

    def load(self) -> FaceEmbedder:
        return load_embedder(self.backend, insightface_pack=self.insightface_pack)


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two vectors in [-1, 1]; NaN when either is zero or not finite."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if not (np.isfinite(na) and np.isfinite(nb)) or na <= 1e-12 or nb <= 1e-12:
        return float("nan")
    return float(np.clip(a @ b / (na * nb), -1.0, 1.0))


def identity_gate(
    pair: PairContext,
    *,
    embedder: FaceEmbedder,
    min_cosine: float,
    max_cosine: float | None = None,
    source_embedding: np.ndarray | None = None,
) -> GateResult:
    """Cosine of the embeddings of the source's largest face and the candidate's face at its place.

    Args:
        pair: the aligned pair with both images' MediaPipe observations.
        embedder: an identity model (:class:`~counterfactory.validation.backends.FaceEmbedder`).
        min_cosine: reject below this (``identity_below_band``).
        max_cosine: send to review at or above this (``identity_above_band``); None: no bound.
        source_embedding: ``embedder``'s embedding of the source's subject when already known
            (the source is shared by all its candidates); None: computed here.

    Metrics: ``cosine`` in [-1, 1] (None when it cannot be measured), ``embedding_dim``.
    Reasons: ``identity_source_no_face``, ``identity_candidate_no_face``,
    ``identity_embedding_not_finite`` (e.g. a crop with no signal), ``identity_below_band``.
    """
    thresholds = {"min_cosine": min_cosine, "max_cosine": max_cosine, "backend": embedder.name}
    metrics: dict = {"cosine": None, "embedding_dim": int(embedder.dim)}
    reasons: list[str] = []
    if not pair.source_faces:
        reasons.append("identity_source_no_face")
    if not pair.candidate_faces:
        reasons.append("identity_candidate_no_face")
    if reasons:
        return GateResult("identity", False, metrics, tuple(reasons), thresholds=thresholds)

    src = embedder.embed(pair.source, pair.source_face.keypoints5()) if source_embedding is None else source_embedding
    cand = embedder.embed(pair.candidate, pair.candidate_face.keypoints5())
    cosine = finite_or_none(cosine_similarity(src, cand))
    metrics["cosine"] = cosine
    review: tuple[str, ...] = ()
    if cosine is None:
        reasons.append("identity_embedding_not_finite")
    elif cosine < min_cosine:
        reasons.append("identity_below_band")
    elif max_cosine is not None and cosine >= max_cosine:
        review = ("identity_above_band",)
    return GateResult("identity", not reasons, metrics, tuple(reasons), review, thresholds)


class IdentityGate:
    """:func:`identity_gate` with its configuration and embedder bound."""

    name = "identity"

    def __init__(self, config: IdentityGateConfig, embedder: FaceEmbedder | None = None) -> None:
        self.config = config
        self.embedder = embedder if embedder is not None else config.load()

    def prepare(self, source: np.ndarray, analysis: SourceAnalysis) -> np.ndarray | None:
        """The embedding of the source's subject (its largest face), once per source."""
        return self.embedder.embed(source, analysis.faces[0].keypoints5()) if analysis.faces else None

    def __call__(self, pair: PairContext) -> GateResult:
        return identity_gate(
            pair,
            embedder=self.embedder,
            source_embedding=pair.source_data(self.name),
            min_cosine=self.config.min_cosine,
            max_cosine=self.config.max_cosine,
        )


GATES.register("identity", IdentityGateConfig, IdentityGate, backend_keys=BACKEND_THRESHOLDS, order=20)
