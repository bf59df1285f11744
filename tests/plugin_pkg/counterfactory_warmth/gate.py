"""The ``redness`` gate: how much redder the candidate's face is than the source's.

Opt-in: a spec turns it on with ``gates.<kind>.redness: {max_red_shift: ...}``.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from counterfactory.validation.gates.base import GateResult, PairContext
from counterfactory.validation.gates.registry import GATES


class RednessGateConfig(BaseModel):
    """``gates.<kind>.redness`` in a spec."""

    model_config = ConfigDict(extra="forbid")

    max_red_shift: float = Field(..., ge=0.0, le=255.0)


class RednessGate:
    """Mean red-channel change over the source's face mask, in grey levels."""

    name = "redness"

    def __init__(self, config: RednessGateConfig) -> None:
        self.config = config

    def __call__(self, pair: PairContext) -> GateResult:
        if pair.face_mask is None:
            return GateResult(self.name, False, reasons=("redness_no_face",))
        inside = pair.face_mask > 0
        shift = float((pair.candidate[..., 0].astype(np.int16) - pair.source[..., 0].astype(np.int16))[inside].mean())
        reasons = ("redness_shift_above_max",) if shift > self.config.max_red_shift else ()
        thresholds = {"max_red_shift": self.config.max_red_shift}
        return GateResult(self.name, not reasons, {"red_shift": round(shift, 4)}, reasons, thresholds=thresholds)


GATES.register("redness", RednessGateConfig, RednessGate, opt_in=True, order=80)
