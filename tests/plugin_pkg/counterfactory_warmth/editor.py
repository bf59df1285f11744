"""The ``warmth`` editor backend: adds ``shift`` levels of red inside the edit mask.

A deterministic CPU edit, declared free, with its batch size and Ray resources declared at
registration (it has no ``batch_size`` attribute of its own).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from counterfactory.generation.editors.base import EditJournal, EditRequest, EditResult
from counterfactory.generation.editors.registry import EDITORS, EditorCapabilities


class WarmthOptions(BaseModel):
    """``editor.warmth`` in a spec."""

    model_config = ConfigDict(extra="forbid")

    shift: int = Field(12, ge=1, le=64)
    batch_size: int = Field(3, ge=1)


class WarmthEditor:
    """Adds ``shift`` to the red channel inside the mask."""

    name = "warmth"

    def __init__(self, options: WarmthOptions) -> None:
        self.options = options
        self.calls = 0

    def lineage(self) -> dict[str, Any]:
        return {"backend": self.name, "shift": self.options.shift}

    def consumes(self, kind: str) -> frozenset[str]:
        return frozenset({"mask"})

    def prepare(self) -> None:
        return None

    def edit(self, request: EditRequest) -> EditResult:
        self.calls += 1
        out = np.array(request.image, copy=True)
        inside = request.mask > 0
        red = out[..., 0][inside].astype(int) + self.options.shift
        out[..., 0][inside] = np.clip(red, 0, 255).astype(np.uint8)
        return EditResult(request.attempt_id, "ok", image=out)

    def edit_many(self, requests: Sequence[EditRequest], journal: EditJournal | None = None) -> list[EditResult]:
        return [self.edit(r) for r in requests]


EDITORS.register(
    "warmth",
    WarmthOptions,
    WarmthEditor,
    capabilities=EditorCapabilities(
        batch_size=lambda options: options.batch_size,
        paid=False,
        resources=lambda options: {"num_gpus": 0.0},
    ),
)
