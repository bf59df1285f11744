"""Audit one existing counterfactual pair: align it and run every gate (``counterfactory measure``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from counterfactory.flows.steps import judge_output
from counterfactory.generation.align import AlignConfig
from counterfactory.generation.masks import load_mask_file
from counterfactory.generation.sources import SourceError, load_image
from counterfactory.validation.faces import face_mask, get_face_landmarker
from counterfactory.validation.judge import GatesConfig, GateStack


def measure_pair(
    source_path: Path,
    candidate_path: Path,
    *,
    mask_path: Path | None = None,
    kind: str | None = None,
    spec_path: Path | None = None,
) -> dict[str, Any]:
    """Align ``candidate_path`` to ``source_path`` and judge it.

    Judges through :func:`counterfactory.flows.steps.judge_output`, the run's own path.
    Returns a JSON-ready dict: ``verdict``, ``reasons``, ``alignment`` and per-gate
    ``gates`` (metrics, thresholds, reasons). When registration fails, face, identity and
    expression are still measured on the unregistered candidate and ``locality`` is marked
    ``measurable: false``. Unreadable files raise ``ValueError`` naming the file.
    """
    align_config, gates_config = AlignConfig(), GatesConfig()
    if spec_path is not None:
        from counterfactory.manifests.spec import load_spec

        spec = load_spec(spec_path)
        align_config, gates_config = spec.align, spec.gates
    kind = kind or ("limb" if mask_path is not None else "face")
    try:
        source = load_image(source_path).pixels
        candidate = load_image(candidate_path).pixels
    except SourceError as exc:
        raise ValueError(str(exc)) from None

    region: np.ndarray | None
    face_size = None
    if kind == "limb":
        if mask_path is None:
            raise ValueError("limb pairs need --mask FILE (the limb region, white inside)")
        region = load_mask_file(mask_path, source.shape[:2])
    else:
        faces = get_face_landmarker().detect(source)
        region = face_mask(faces[0].landmarks, source.shape[:2], mode=gates_config.face_mask) if faces else None
        face_size = faces[0].size_px if faces else None

    stack = GateStack.from_config(gates_config, kind)
    judged = judge_output(
        source,
        candidate,
        kind=kind,
        region=region,
        face_size_px=face_size,
        align=align_config,
        stack=stack,
    )
    return {
        "source": str(source_path),
        "candidate": str(candidate_path),
        "kind": kind,
        "alignment": judged.alignment,
        "verdict": judged.verdict,
        "reasons": judged.reasons,
        "gates": judged.gates,
    }
