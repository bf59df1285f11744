"""A third-party gate, written the way a plug-in is: this one module, whose last line registers
it. Nothing in the package names it; a spec turns it on with ``gates.face.tint: {...}``.

It measures how much the face changed: the mean absolute difference between source and
candidate over the source's face mask, in grey levels (0-255), over the three channels.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from counterfactory.validation.gates.base import GateResult, PairContext
from counterfactory.validation.gates.registry import GATES


class TintGateConfig(BaseModel):
    """``gates.<kind>.tint`` in a spec."""

    model_config = ConfigDict(extra="forbid")

    max_face_change: float = Field(..., ge=0.0, le=255.0)


class TintGate:
    name = "tint"

    def __init__(self, config: TintGateConfig) -> None:
        self.config = config

    def __call__(self, pair: PairContext) -> GateResult:
        if pair.face_mask is None:
            return GateResult(self.name, False, reasons=("tint_no_face",))
        inside = pair.face_mask > 0
        diff = np.abs(pair.candidate.astype(np.int16) - pair.source.astype(np.int16))[inside]
        change = float(diff.mean())
        reasons = ("tint_face_change_above_max",) if change > self.config.max_face_change else ()
        thresholds = {"max_face_change": self.config.max_face_change}
        return GateResult(self.name, not reasons, {"face_change": change}, reasons, thresholds=thresholds)


GATES.register("tint", TintGateConfig, TintGate, opt_in=True, order=70)
