"""The shipped, calibrated default thresholds (``assets/calibration/calibration.json``).

The file is written by :func:`counterfactory.validation.calibration.calibrate.run_calibration`; re-create it with::

    counterfactory calibrate --out assets/calibration [--spec SPEC]

Its ``suggested`` section holds, per edit kind and gate, the backend it was measured with
and the thresholds; :class:`counterfactory.validation.gate_stack.KindGatesConfig` fills any threshold a spec
leaves out from there.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

from counterfactory.assets import ASSETS_DIR
from counterfactory.manifests.errors import SetupError

CALIBRATION_DIR = ASSETS_DIR / "calibration"
CALIBRATION_FILE = CALIBRATION_DIR / "calibration.json"
RECALIBRATE = "counterfactory calibrate --out assets/calibration [--spec SPEC]"


@functools.lru_cache(maxsize=8)
def _load(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise SetupError(f"calibration file {p} not found; the package ships one. Re-create it with: {RECALIBRATE}")
    return json.loads(p.read_text())


def load_calibration(path: str | Path | None = None) -> dict[str, Any]:
    """The parsed calibration file (the shipped one by default), as a fresh copy."""
    return copy.deepcopy(_load(str(Path(path or CALIBRATION_FILE).resolve())))


def calibrated_gates(kind: str, path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """``{gate: {"backend": ..., threshold: value, ...}}`` suggested for ``kind``."""
    suggested = _load(str(Path(path or CALIBRATION_FILE).resolve())).get("suggested", {})
    if kind not in suggested:
        raise KeyError(f"calibration has no thresholds for edit kind {kind!r}; re-run {RECALIBRATE}")
    return copy.deepcopy(suggested[kind])
