"""The pilot pinned: a spec's ``gates.calibration`` names the calibration its gates judge with;
its hash enters the judge key (a new calibration re-judges, with no editor call) and the
release names it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from counterfactory.flows.engine.execute import judge_key
from counterfactory.manifests.ledger import Ledger
from counterfactory.manifests.release_verify import verify_release
from counterfactory.manifests.spec import SpecError, load_spec
from counterfactory.manifests.store import sha256_file
from counterfactory.validation.thresholds import load_calibration
from tests.flows.review_setup import run_and_publish


def _pinned_calibration(path: Path, pose: float) -> Path:
    """The shipped calibration with the pose bound moved, as ``calibrate --from-review`` writes one."""
    data = copy.deepcopy(load_calibration())
    data["suggested"]["face"]["face"]["max_pose_change_deg"] = pose
    data["from_review"] = {
        "rule": "test",
        "thresholds": {"face.max_pose_change_deg": {"from": "review", "run_value": 4.8, "value": pose}},
        "provenance": {"run": {"spec_name": "review-test"}, "reviewers": {"ann": 4}, "labels": {"labelled": 4}},
    }
    path.write_text(json.dumps(data))
    return path


def _pin(spec_path: Path, calibration: str, version: str) -> Path:
    spec = yaml.safe_load(spec_path.read_text())
    spec.setdefault("gates", {})["calibration"] = calibration
    spec["release"]["version"] = version
    out = spec_path.with_name(f"spec-{version}.yaml")
    out.write_text(yaml.safe_dump(spec))
    return out


@pytest.mark.slow
def test_a_pinned_calibration_is_checked_at_load_and_enters_the_judge_key(tmp_path):
    from tests.flows.review_setup import write_spec

    spec_path = write_spec(tmp_path)
    plain = load_spec(spec_path)
    cal = _pinned_calibration(tmp_path / "cal.json", 9.5)
    pinned = load_spec(_pin(spec_path, "cal.json", "0.2.0"))
    assert pinned.gates.calibration == cal.resolve()
    assert pinned.gates.face.face.max_pose_change_deg == 9.5  # the pinned file's value
    assert pinned.gates.face.identity.max_cosine == 0.96  # the spec's own value still wins
    assert plain.gates.face.face.max_pose_change_deg == 4.8
    assert pinned.canonical()["gates"]["calibration"] == "cal.json"  # as written, no machine path
    assert judge_key(pinned) != judge_key(plain)
    # the same thresholds in a file of other bytes (another provenance) still re-judge
    data = json.loads(cal.read_text())
    data["from_review"]["provenance"]["reviewers"] = {"bob": 4}
    cal.write_text(json.dumps(data))
    assert judge_key(load_spec(tmp_path / "spec-0.2.0.yaml")) != judge_key(pinned)

    for written, content, phrase in (
        ("missing.json", None, "does not exist"),
        ("bad.json", "{not json", "is not a calibration file"),
        ("empty.json", "{}", "has no `suggested` thresholds"),
        ("limb.json", json.dumps({"suggested": {"limb": {}}}), "no thresholds for face edits"),
    ):
        if content is not None:
            (tmp_path / written).write_text(content)
        with pytest.raises(SpecError, match="gates.calibration") as err:
            load_spec(_pin(spec_path, written, "0.3.0"))
        assert phrase in str(err.value)


@pytest.mark.slow
def test_rejudging_a_finished_run_with_a_new_calibration_makes_no_editor_call_and_the_release_names_it(run_copy):
    spec_path, out = run_copy
    cal = _pinned_calibration(spec_path.parent / "cal.json", 9.5)
    pinned = _pin(spec_path, "cal.json", "0.2.0")
    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    before = {c.attempt_id: c.judge_key for c in ledger.candidates()}
    ledger.close()
    sealed, calls = run_and_publish(pinned, out)
    assert calls == 0
    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    after = ledger.candidates()
    ledger.close()
    key = judge_key(load_spec(pinned))
    assert {c.attempt_id for c in after} == set(before)
    judged = [c for c in after if c.verdict != "floor"]
    assert judged and all(c.judge_key == key != before[c.attempt_id] for c in judged)
    assert all(c.gates["face"]["thresholds"]["max_pose_change_deg"] == 9.5 for c in judged)
    info = json.loads((sealed.path / "release.json").read_text())
    assert info["calibration"]["sha256"] == sha256_file(cal)
    assert info["calibration"]["path"] == "cal.json"
    assert info["calibration"]["provenance"]["reviewers"] == {"ann": 4}
    assert info["calibration"]["thresholds_from_review"] == 1
    assert verify_release(sealed.path) == []
    first = json.loads((out / "releases" / "review-test" / "0.1.0" / "release.json").read_text())
    assert "calibration" not in first  # the shipped calibration: named by counterfactory_version
