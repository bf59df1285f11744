"""The cohort floor (issue 34): several outputs of one source judged against each other.

Known answers are arithmetic: a per-pixel median of constant images is the middle constant,
and a patch in one image never reaches its own floor nor, with enough others, anyone else's.
"""

from __future__ import annotations

import numpy as np
import pytest

from counterfactory.validation.cohort import COHORT_MIN_OTHERS, cohort_floors, median_image
from counterfactory.validation.gates.base import PairContext
from counterfactory.validation.gates.locality import PATH_THRESHOLDS, LocalityGateConfig, locality_gate


def _flat(value: int, shape=(8, 10, 3)) -> np.ndarray:
    return np.full(shape, value, np.uint8)


def test_median_of_an_odd_and_an_even_count():
    assert np.all(median_image([_flat(10), _flat(200), _flat(20)]) == 20)
    # even count: the mean of the two middle values, rounded half to even (20, 31 -> 25.5 -> 26)
    assert np.all(median_image([_flat(10), _flat(200), _flat(20), _flat(31)]) == 26)
    with pytest.raises(ValueError, match="differ in shape"):
        median_image([_flat(1), _flat(1, (4, 4, 3))])


def test_leave_one_out_floors_hide_a_change_one_output_alone_made():
    images = [_flat(100 + i) for i in range(6)]
    images[2] = images[2].copy()
    images[2][2:5, 3:7] = 255  # an object added to one output
    floors = cohort_floors(images)
    assert all(f is not None and f.members == 5 for f in floors)
    # the object is in no floor, its own least of all: against it, it stands out
    for f in floors:
        assert f.image[3, 4, 0] < 120
    # each floor is the median of the *others*: output 0's is the median of 101..105 (with the
    # object's pixel replaced by 255 at that spot, still the median of five)
    assert floors[0].image[0, 0, 0] == 103


def test_too_few_others_and_unregistered_outputs_get_no_floor():
    images = [_flat(10), None, _flat(30), _flat(40)]
    floors = cohort_floors(images)
    assert COHORT_MIN_OTHERS == 3
    assert floors == [None, None, None, None]  # two registered others each: not a floor
    floors = cohort_floors(images, members=[_flat(50)])
    assert floors[1] is None and [f.members for f in floors if f] == [3, 3, 3]
    assert floors[0].image[0, 0, 0] == 40  # median of 30, 40, 50


def test_leave_one_out_floors_are_the_median_of_the_others_exactly():
    """cohort_floors sorts once and drops each candidate's own value: every floor equals
    median_image of the others (ties, odd and even counts, unregistered outputs, members)."""
    rng = np.random.default_rng(45)
    for trial in range(150):
        shape = (int(rng.integers(1, 7)), int(rng.integers(1, 7)), 3)
        spread = int(rng.choice([2, 5, 256]))  # 2: ties everywhere
        images = [rng.integers(0, spread, shape, dtype=np.uint8) for _ in range(int(rng.integers(1, 9)))]
        if len(images) > 2 and trial % 3 == 0:
            images[1] = None
        members = [rng.integers(0, spread, shape, dtype=np.uint8) for _ in range(int(rng.integers(0, 4)))]
        min_others = int(rng.integers(1, 5))
        present = [i for i, im in enumerate(images) if im is not None]
        for i, floor in enumerate(cohort_floors(images, members, min_others=min_others)):
            others = [images[j] for j in present if j != i] + members
            if i not in present or len(others) < min_others:
                assert floor is None
            else:
                assert floor.members == len(others)
                assert np.array_equal(floor.image, median_image(others)), trial


def _pair(extras=None):
    source = _flat(120, (32, 32, 3))
    mask = np.zeros((32, 32), np.uint8)
    mask[8:24, 8:24] = 255
    return PairContext(
        source=source,
        candidate=source.copy(),
        kind="face",
        face_mask=mask,
        edit_mask=None,
        source_faces=(),
        candidate_faces=(),
        face_mask_mode="oval",
        extras=extras or {},
    )


@pytest.mark.parametrize(
    "extras, path",
    [
        (None, "none"),
        ({"noise_floor": {"changed_share": 0.0}}, "request"),
        ({"noise_floor": {"path": "cohort", "members": 9}}, "cohort"),
    ],
)
def test_each_path_is_judged_by_its_own_thresholds_and_says_so(extras, path):
    config = LocalityGateConfig(
        max_changed_share=0.01,
        max_global_shift=0.004,
        cohort={"max_changed_share": 0.02, "max_global_shift": 0.005},
        no_floor={"max_changed_share": 0.03, "max_global_shift": 0.006, "min_face_change": 0.04},
    )
    result = locality_gate(_pair(extras), **config.model_dump())
    assert result.metrics["floor_path"] == path
    expected = {"request": 0.01, "cohort": 0.02, "none": 0.03}[path]
    assert result.thresholds["max_changed_share"] == expected
    # a path's own set replaces every path threshold: what it leaves out is not judged there
    if path == "cohort":
        assert result.thresholds["min_face_change"] is None
    if path == "none":
        assert result.thresholds["min_face_change"] == 0.04
    assert set(PATH_THRESHOLDS) <= set(result.thresholds)


def test_without_path_sets_the_top_level_thresholds_hold_everywhere():
    config = LocalityGateConfig(max_changed_share=0.01)
    for extras in (None, {"noise_floor": {"path": "cohort", "members": 9}}):
        assert locality_gate(_pair(extras), **config.model_dump()).thresholds["max_changed_share"] == 0.01
