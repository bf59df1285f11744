"""One builder of a gate's :class:`PairContext` for the validation tests (the locality, stateless
and attribute tests built their own copies)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from counterfactory.validation.gates.base import PairContext, SourceAnalysis


def make_pair(
    source: np.ndarray,
    candidate: np.ndarray,
    *,
    fmask: np.ndarray | None = None,
    edit_mask: np.ndarray | None = None,
    kind: str = "face",
    faces: Sequence[Any] = (),
    extras: dict[str, Any] | None = None,
    analysis: SourceAnalysis | None = None,
    mode: str = "oval",
) -> PairContext:
    """A source/candidate pair as the stack hands it to a gate: the same ``faces`` found in
    both images (none by default), ``extras`` (a fresh dict) and the source's ``analysis``."""
    return PairContext(
        source=source,
        candidate=candidate,
        kind=kind,  # type: ignore[arg-type]
        face_mask=fmask,
        edit_mask=edit_mask,
        source_faces=faces,
        candidate_faces=faces,
        face_mask_mode=mode,
        extras={} if extras is None else extras,
        analysis=analysis,
    )
