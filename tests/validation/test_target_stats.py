"""Release stats of the intended change: label consistency (FOCUS's published shares as the
known answer), ITA change per condition, lightened share per source group, the chart."""

from __future__ import annotations

import math

import pytest

from counterfactory.validation.target_stats import label_consistency, plot_skin_tone, skin_tone_stats, target_html


def _wilson_by_hand(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, min(centre + half, 1.0)


def _attr_row(condition, race_ok, gender_ok):
    metrics = {"match_race": race_ok, "match_gender": gender_ok}
    return {"condition": condition, "gates": {"attribute": {"metrics": metrics}}}


def test_label_consistency_reproduces_focus_shares():
    # FOCUS: 48 edits checked, race 97.9 % (47/48), gender 100 %, joint 97.9 %, coverage 1.0
    cond = {"race": "Black", "gender": "female"}
    rows = [_attr_row(cond, i != 0, True) for i in range(48)]
    out = label_consistency(rows)["by_condition"][0]
    assert out["axes"]["race"]["share"] == pytest.approx(0.979, abs=5e-4)
    assert out["axes"]["gender"]["share"] == 1.0 and out["axes"]["gender"]["ci_high"] == 1.0
    assert out["joint"]["share"] == pytest.approx(0.979, abs=5e-4)
    assert out["coverage"]["share"] == 1.0
    low, high = _wilson_by_hand(47, 48)
    assert out["axes"]["race"]["ci_low"] == pytest.approx(low, abs=1e-9)
    assert out["axes"]["race"]["ci_high"] == pytest.approx(high, abs=1e-9)


def test_unanswered_items_lower_coverage_not_consistency():
    cond = {"race": "White"}
    rows = [_attr_row(cond, True, True) for _ in range(3)] + [
        {"condition": cond, "gates": {"attribute": {"metrics": {"vlm_status": "refused"}}}}
    ]
    out = label_consistency(rows)["by_condition"][0]
    assert out["coverage"]["share"] == pytest.approx(0.75) and out["joint"]["share"] == 1.0
    assert label_consistency([{"condition": cond, "gates": {}}]) == {"by_condition": []}


def _skin_row(source_id, condition, change, lightened):
    metrics = {"face_ita_change_deg": change, "lightened": lightened}
    return {"source": {"id": source_id}, "condition": condition, "gates": {"skin": {"metrics": metrics}}}


def test_skin_stats_per_condition_and_source_group(tmp_path):
    white, black = {"race": "White"}, {"race": "Black"}
    rows = [
        _skin_row("a", white, 12.0, True),
        _skin_row("a", black, -20.0, False),
        _skin_row("b", white, 25.0, True),
        _skin_row("b", black, 1.0, False),
        _skin_row("c", white, 8.0, True),
        {"source": {"id": "c"}, "condition": black, "gates": {"skin": {"metrics": {"face_ita_change_deg": None}}}},
    ]
    stats = skin_tone_stats(rows, {"a": "Black", "b": "Black", "c": None})
    by = {c["label"]: c for c in stats["by_condition"]}
    assert by["race=White"]["median"] == 12.0 and by["race=White"]["n"] == 3
    assert by["race=Black"]["median"] == pytest.approx(-9.5)
    groups = {g["group"]: g for g in stats["lightened_by_source_group"]}
    assert groups["Black"]["k"] == 2 and groups["Black"]["n"] == 4 and groups["Black"]["share"] == 0.5
    assert groups["unknown"]["share"] == 1.0
    assert stats["lightened_all"]["share"] == pytest.approx(3 / 5)
    assert stats["unmeasured"] == 1
    png = plot_skin_tone(stats, tmp_path / "skin_tone.png")
    assert png.stat().st_size > 1000
    page = target_html(stats, label_consistency([_attr_row(white, True, False)]))
    assert 'id="skin-lightened"' in page and 'id="label-consistency"' in page and "skin_tone.png" in page


def test_face_body_congruence_is_reported_per_condition_from_the_items_with_body_skin():
    def row(condition, face, body, growth, incongruent):
        metrics = {
            "face_ita_change_deg": 1.0,
            "face_ita_deg": face,
            "body_ita_deg": body,
            "face_body_gap_deg": None if body is None else face - body,
            "face_body_gap_growth_deg": growth,
            "face_body_incongruent": incongruent,
        }
        return {"source": {"id": "s"}, "condition": condition, "gates": {"skin": {"metrics": metrics}}}

    black = {"race": "Black"}
    rows = [
        row(black, 10.0, 40.0, 25.0, True),
        row(black, 20.0, 35.0, 11.0, True),
        row(black, 30.0, 32.0, 1.0, False),
        row(black, 12.0, None, None, None),  # no body skin shown: not in the congruence figures
    ]
    stats = skin_tone_stats(rows, {"s": "White"})
    (c,) = stats["congruence_by_condition"]
    assert c["label"] == "race=Black" and c["n"] == 3
    assert c["face_ita_median"] == 20.0 and c["body_ita_median"] == 35.0
    assert c["gap_median"] == -15.0 and c["gap_growth_median"] == 11.0
    assert c["incongruent"]["k"] == 2 and c["incongruent"]["n"] == 3
    assert (c["incongruent"]["ci_low"], c["incongruent"]["ci_high"]) == pytest.approx(_wilson_by_hand(2, 3))
    assert 'id="skin-congruence"' in target_html(stats, None)
