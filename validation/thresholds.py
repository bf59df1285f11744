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
from counterfactory.manifests.spec import MAX_CALIBRATION_BYTES

CALIBRATION_DIR = ASSETS_DIR / "calibration"
CALIBRATION_FILE = CALIBRATION_DIR / "calibration.json"
RECALIBRATE = "counterfactory calibrate --out assets/calibration [--spec SPEC]"


@functools.lru_cache(maxsize=8)
def _load_stamped(path: str, _mtime_ns: int, _size: int) -> dict[str, Any]:
    from counterfactory.manifests.safefiles import read_regular

    try:
        data = json.loads(read_regular(Path(path), MAX_CALIBRATION_BYTES, limit_field="a calibration file"))
    except (OSError, ValueError) as exc:
        raise SetupError(f"calibration file {path} cannot be read: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("suggested"), dict):
        raise SetupError(
            f"calibration file {path} has no `suggested` thresholds; write it with `counterfactory calibrate`"
        )
    return data


def _load(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise SetupError(f"calibration file {p} not found; the package ships one. Re-create it with: {RECALIBRATE}")
    st = p.stat()
    # keyed by the file's modification time and size too: a calibration written again at the
    # same path (a new --from-review fit) is read again
    return _load_stamped(path, st.st_mtime_ns, st.st_size)


def load_calibration(path: str | Path | None = None) -> dict[str, Any]:
    """The parsed calibration file (the shipped one by default), as a fresh copy."""
    return copy.deepcopy(_load(str(Path(path or CALIBRATION_FILE).resolve())))


def calibrated_gates(kind: str, path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """``{gate: {"backend": ..., threshold: value, ...}}`` suggested for ``kind`` (by the
    shipped calibration, or the file ``path``: a spec's ``gates.calibration``)."""
    suggested = _load(str(Path(path or CALIBRATION_FILE).resolve())).get("suggested", {})
    if kind not in suggested:
        raise KeyError(f"calibration has no thresholds for edit kind {kind!r}; re-run {RECALIBRATE}")
    return copy.deepcopy(suggested[kind])
