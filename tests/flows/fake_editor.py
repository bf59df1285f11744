"""A fake editor for step tests: no model, deterministic, counts its calls.

Face cells: the source with its green channel lifted by ``lift`` inside the mask; limb cells:
the source with the mask filled grey. ``script`` maps an attempt id to a forced non-``ok``
status (``"refused"`` or ``"failed"``), so tests can drive every branch of the steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from counterfactory.generation.editors.base import EditJournal, EditRequest, EditResult


class FakeEditor:
    """Implements the :class:`~counterfactory.generation.editors.base.Editor` protocol."""

    name = "fake"

    def __init__(self, *, lift: int = 12, uses_mask: bool = True, script: dict[str, str] | None = None) -> None:
        self.lift = lift
        self.uses_mask = uses_mask
        self.script = dict(script or {})
        self.calls: list[EditRequest] = []

    def lineage(self) -> dict[str, Any]:
        return {"backend": self.name, "lift": self.lift}

    def consumes(self, kind: str) -> frozenset[str]:
        return frozenset({"prompt", "seed", "mask"} if self.uses_mask else {"prompt", "seed"})

    def prepare(self) -> None:
        return None

    def edit(self, request: EditRequest) -> EditResult:
        self.calls.append(request)
        forced = self.script.get(request.attempt_id)
        if forced is not None:
            return EditResult(request.attempt_id, forced, reason=f"fake_{forced}")
        out = np.array(request.image, copy=True)
        inside = request.mask > 0
        if request.kind == "limb":
            out[inside] = 128
        else:
            out[..., 1][inside] = np.clip(out[..., 1][inside].astype(int) + self.lift, 0, 255).astype(np.uint8)
        return EditResult(request.attempt_id, "ok", image=out)

    def edit_many(self, requests: Sequence[EditRequest], journal: EditJournal | None = None) -> list[EditResult]:
        return [self.edit(r) for r in requests]
