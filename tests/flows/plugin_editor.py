"""A third-party editor backend, written the way a plug-in is: this one module, whose last line
registers it. Nothing in the package names it; the spec selects it with ``backend: warm``.

It warms the face inside the mask by ``shift`` levels of red (a deterministic CPU edit).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from counterfactory.generation.editors.base import EditJournal, EditRequest, EditResult
from counterfactory.generation.editors.registry import EDITORS


class WarmOptions(BaseModel):
    """``editor.warm`` in a spec."""

    model_config = ConfigDict(extra="forbid")

    shift: int = Field(14, ge=1, le=64)


class WarmEditor:
    name = "warm"

    def __init__(self, options: WarmOptions) -> None:
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
        out[..., 0][inside] = np.clip(out[..., 0][inside].astype(int) + self.options.shift, 0, 255).astype(np.uint8)
        return EditResult(request.attempt_id, "ok", image=out)

    def edit_many(self, requests: Sequence[EditRequest], journal: EditJournal | None = None) -> list[EditResult]:
        return [self.edit(r) for r in requests]


EDITORS.register("warm", WarmOptions, WarmEditor)
