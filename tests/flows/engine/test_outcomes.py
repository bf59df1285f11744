"""What a run left out and why (``flows/engine/outcomes.py``): every cell not accepted, every
failed or excluded source and every short stratum is a row of ``left_out``, and the grid is
complete only when none is."""

from __future__ import annotations

from types import SimpleNamespace

from counterfactory.flows.engine.outcomes import completeness, format_completeness


def _row(cell, status, reasons=(), race="Black"):
    return {
        "cell_id": cell,
        "template_id": "t1",
        "condition": {"race": race, "gender": "female"},
        "status": status,
        "reasons": list(reasons),
    }


def test_every_cell_not_accepted_and_every_lost_source_is_left_out_with_why():
    rows = [
        _row("c1", "accepted"),
        _row("c2", "needs_review", ["attribute_mismatch"]),
        _row("c3", "rejected", ["face_drift_above_max", "skin_outside_edit"]),
        _row("c4", "accepted", race="White"),
    ]
    failed = [SimpleNamespace(id="s9", reason="no face found")]
    grid = SimpleNamespace(
        shortfalls=[SimpleNamespace(stratum={"gender": "male"}, available=1, requested=3)],
        excluded=[SimpleNamespace(source_id="s7", reason="under 18")],
    )
    report, left_out = completeness(rows, failed, grid)

    assert report["complete"] is False
    counts = {g["cells"]: (g["accepted"], g["undecided"], g["unfilled"]) for g in report["per_group"]}
    assert counts == {3: (1, 1, 1), 1: (1, 0, 0)}  # the Black / female group, then White / female
    assert [(r["what"], r["id"], r["status"]) for r in left_out] == [
        ("cell", "c2", "needs_review"),
        ("cell", "c3", "rejected"),
        ("source", "s9", "failed"),
        ("stratum", "gender=male", "short"),
        ("source", "s7", "excluded"),
    ]
    assert left_out[1]["reason"] == "face_drift_above_max; skin_outside_edit"
    assert left_out[1]["group"] == {"template_id": "t1", "race": "Black", "gender": "female"}
    assert left_out[3]["reason"] == "1 eligible source(s) for 3 requested template(s)"

    text = format_completeness(report, left_out, limit=2)
    # an excluded source is not counted as left out of the grid: four rows, two shown
    assert "left out (4):" in text and "  cell c2: needs_review: attribute_mismatch" in text
    assert "... and 2 more" in text and "s7" not in text


def test_a_grid_is_complete_only_when_every_cell_is_accepted_and_nothing_is_lost():
    nothing = SimpleNamespace(shortfalls=[], excluded=[])
    assert completeness([_row("c1", "accepted")], [], nothing)[0]["complete"] is True
    assert completeness([], [], nothing)[0]["complete"] is False  # no cell is not a complete grid
    assert (
        completeness([_row("c1", "accepted")], [SimpleNamespace(id="s", reason="r")], nothing)[0]["complete"] is False
    )
