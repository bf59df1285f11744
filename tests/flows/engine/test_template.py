"""A template's noise floor (``flows/engine/template.py``): the measures its output gives the
locality gate are the floor-relative ones its candidate recorded, with the attempt and, when
stored, the output's sha256; none when locality measured nothing."""

from __future__ import annotations

from counterfactory.flows.engine.template import floor_metrics
from counterfactory.validation.gates.locality import FLOOR_RELATIVE


def test_the_floor_is_the_locality_measures_its_output_recorded():
    first, second = FLOOR_RELATIVE[0], FLOOR_RELATIVE[1]
    gates = {
        "locality": {"metrics": {first: 0.012, second: "n/a", "max_diff_outside_edit": 3.0}},
        "face": {"metrics": {first: 99.0}},  # another gate's measure of the same name is not the floor's
    }
    assert floor_metrics(gates, "a1") == {first: 0.012, "attempt_id": "a1"}
    assert floor_metrics(gates, "a1", "f" * 64) == {first: 0.012, "attempt_id": "a1", "image_sha256": "f" * 64}
    assert floor_metrics({"locality": {"metrics": {second: None}}}, "a2") is None
    assert floor_metrics({}, "a3") is None
