"""What decides a verdict in a run (``flows/engine/execute.py``): the judge key hashes the gates,
the alignment and the floors a spec judges against, and nothing else (a new version of the same
spec judges the same stored outputs the same); which designs judge against a noise floor or the
cohort floor."""

from __future__ import annotations

import pytest

from counterfactory.flows.engine.execute import judge_key, uses_cohort_floor, uses_noise_floor
from counterfactory.flows.engine.release import with_version
from counterfactory.flows.engine.spec import load_spec


@pytest.fixture(scope="module")
def specs(specs_dir):
    return load_spec(specs_dir / "demo-face.yaml"), load_spec(specs_dir / "demo-limb.yaml")


def _gates(spec, **changes):
    return spec.model_copy(update={"gates": spec.gates.model_copy(update=changes)})


def test_the_floors_a_design_is_judged_against(specs):
    face, limb = specs
    assert uses_noise_floor(face) is True and uses_noise_floor(limb) is False
    assert uses_noise_floor(_gates(face, noise_floor=False)) is False
    # the cohort floor stands in only when the template has no floor output
    assert uses_cohort_floor(face, None) is True
    assert uses_cohort_floor(face, {"changed_share": 0.01}) is False
    assert uses_cohort_floor(_gates(face, cohort_floor=False), None) is False
    assert uses_cohort_floor(limb, None) is False


def test_the_judge_key_moves_with_what_decides_a_verdict_only(specs):
    face, limb = specs
    key = judge_key(face)
    assert len(key) == 64 and judge_key(face) == key
    assert judge_key(with_version(face, "9.9.9")) == key  # the release's version decides no verdict
    assert judge_key(_gates(face, noise_floor=False)) != key
    assert judge_key(_gates(face, cohort_floor=False)) != key
    assert judge_key(_gates(face, face_mask="skin" if face.gates.face_mask != "skin" else "oval")) != key
    assert judge_key(limb) != key
    # the raw_* diagnostics recorded: a key of its own when asked, every other key as it was
    assert judge_key(_gates(face, diagnostics=False)) == key
    assert judge_key(_gates(face, diagnostics=True)) != key
