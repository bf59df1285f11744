"""The golden comparison (tests.flows.unchanged.differences) tells a change of behaviour from the
last-bit differences between CPUs: a verdict, a reason, an id, a moved metric, a changed image or a
changed sentence is reported; a metric, a thumbnail or a printed figure that moved as little as an
AMD and an Intel machine's kernels move them is not. Runs on the recorded demo-limb fingerprint."""

from __future__ import annotations

import copy

import pytest

from tests.flows.unchanged import SCENARIOS, THUMB_TOLERANCE, differences, load_record


@pytest.fixture(scope="module")
def recorded():
    return load_record(SCENARIOS["demo-limb"])["fingerprint"]


def _item(fp):
    return fp["release"]["items.jsonl"][0]


def test_a_fingerprint_agrees_with_itself(recorded):
    assert differences(copy.deepcopy(recorded), recorded) == []


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda fp: fp["candidates"][0].update(verdict="needs_review"), "candidates"),
        (lambda fp: fp["candidates"][0].update(reasons=["locality_changed_share_above_max"]), "candidates"),
        (lambda fp: fp["attempts"][0].update(seed=fp["attempts"][0]["seed"] + 1), "attempts"),
        (lambda fp: fp["attempts"].pop(), "attempts"),
        (lambda fp: _item(fp)["gates"]["locality"]["metrics"].update(changed_share=0.0094), "changed_share"),
        (lambda fp: _item(fp).update(verdict="rejected"), "verdict"),
        (lambda fp: _item(fp)["image"]["path"]["thumb"].__setitem__(0, _item(fp)["image"]["path"]["thumb"][0] + 9), "thumbnail"),
        (lambda fp: fp["release"]["report.html"].update(text_sha256="0" * 64), "text differs"),
        (lambda fp: fp["release"]["report.html"]["numbers"].__setitem__(3, "240"), "number 3"),
        (lambda fp: fp["release"]["files named by content hash"].update({"images/<sha256>.png": 3}), "content hash"),
    ],
)  # fmt: skip
def test_a_change_of_behaviour_is_reported(recorded, change, expected):
    live = copy.deepcopy(recorded)
    change(live)
    shown = "\n".join(differences(live, recorded))
    assert expected in shown, shown


def test_cpu_level_noise_is_not_reported(recorded):
    live = copy.deepcopy(recorded)
    metrics = _item(live)["gates"]["locality"]["metrics"]
    metrics["changed_share"] *= 1 + 1e-7  # a last-bit difference, as between two CPUs' kernels
    metrics["diff_nonface"] += 3e-5
    thumb = _item(live)["image"]["path"]["thumb"]
    thumb[0] += THUMB_TOLERANCE  # a few pixels' rounding flipped by one grey level
    _item(live)["alignment"]["matches"] += 3  # SIFT keypoints found on the edge of a threshold
    numbers = live["release"]["report.html"]["numbers"]
    i = next(i for i, n in enumerate(numbers) if "." in n)
    last = len(numbers[i].split(".")[1])
    numbers[i] = f"{float(numbers[i]) + 10**-last:.{last}f}"  # a printed figure's last digit
    assert differences(live, recorded) == []
