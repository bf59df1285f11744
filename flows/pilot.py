"""``counterfactory calibrate --from-review RUN_DIR``: a run folder's review turned into a calibration.

The command opens the run folder as ``review serve`` does (its recorded spec, its ledger),
fits the thresholds with :func:`~counterfactory.validation.calibration.from_review.calibrate_from_review`
and writes ``calibration.json`` (what a spec's ``gates.calibration`` pins) and ``report.json``
beside it. Nothing is edited or measured: every figure comes from the ledger.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from counterfactory.flows.engine.run_folder import RunFolder
from counterfactory.flows.engine.spec import Spec
from counterfactory.manifests.ledger import Ledger
from counterfactory.manifests.runlock import RunFolderError
from counterfactory.manifests.store import atomic_write, sha256_file
from counterfactory.validation.calibration.from_review import calibrate_from_review, report_lines
from counterfactory.validation.thresholds import CALIBRATION_FILE, load_calibration

#: where the command writes when no ``--out`` is given (inside the run folder)
DEFAULT_OUT = "review-calibration"


def run_provenance(folder: RunFolder, spec: Spec, ledger: Ledger) -> dict[str, Any]:
    """What a calibration records about the run it was fitted on: the folder, the spec's name
    and hash, and every editor lineage its attempts carry (with how many attempts each)."""
    lineages: dict[str, dict[str, Any]] = {}
    for attempt in ledger.attempts():
        key = json.dumps(attempt.lineage, sort_keys=True)
        entry = lineages.setdefault(key, {"lineage": attempt.lineage, "attempts": 0})
        entry["attempts"] += 1
    return {
        "run": {"folder": str(folder.path), "spec_name": spec.name, "spec_hash": spec.spec_hash()},
        "editor_lineages": list(lineages.values()),
    }


def calibrate_run(run_dir: Path, out: Path | None = None, spec_path: Path | None = None) -> tuple[Path, list[str]]:
    """Fit and write; returns the folder written and the lines to print.

    Raises:
        RunFolderError: ``run_dir`` holds no run (no ledger).
        ReviewCalibrationError: no reviewed items, too few labels or sources.
    """
    folder = RunFolder(run_dir)
    if not folder.path.is_dir():
        raise RunFolderError(f"{run_dir}: not a folder; give the --out folder of a `counterfactory run`")
    spec = folder.spec_of_run(spec_path)
    if not folder.has_own_ledger(spec) and spec.ledger_url is None:
        raise RunFolderError(
            f"{run_dir}: no ledger ({folder.ledger_file.name} missing); give the --out folder of a `counterfactory run`"
        )
    pinned = spec.gates.calibration
    base_path = Path(pinned) if pinned is not None else CALIBRATION_FILE
    base = load_calibration(base_path)
    base["_sha256"] = sha256_file(base_path)
    ledger = Ledger(folder.ledger_url(spec))
    try:
        provenance = run_provenance(folder, spec, ledger)
        provenance["base_calibration"] = "pinned" if pinned is not None else "shipped"
        calibration, report = calibrate_from_review(
            ledger,
            spec.review,
            base,
            run_face_gates=spec.gates.face.model_dump(mode="json"),
            provenance=provenance,
        )
    finally:
        ledger.close()
    target = Path(out) if out is not None else folder.path / DEFAULT_OUT
    target.mkdir(parents=True, exist_ok=True)
    atomic_write(target / "calibration.json", (json.dumps(calibration, indent=2, sort_keys=True) + "\n").encode())
    atomic_write(target / "report.json", (json.dumps(report, indent=2, sort_keys=True) + "\n").encode())
    lines = report_lines(report)
    lines.append(f"written: {target / 'calibration.json'} (pin it with gates.calibration) and {target / 'report.json'}")
    return target, lines
