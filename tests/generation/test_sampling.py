"""The stratified, seeded sampler and the template x condition grid."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from counterfactory.generation.sampling import DesignConfig, cell_id, conditions, expand_grid, grid_summary
from counterfactory.generation.sources import FailedSource, Source, SourceRecord

RACES = ["White", "Black", "East Asian", "South Asian", "Latino"]
FACE_AXES = {"race": RACES, "gender": ["male", "female"]}
OCCUPATIONS = ["nurse", "engineer", "teacher", "pilot", "chef", "lawyer"]


def _records(per_occupation: int = 10, occupations=OCCUPATIONS) -> list[SourceRecord]:
    """``per_occupation`` sources per occupation, alternating female / male."""
    out = []
    for occupation in occupations:
        for i in range(per_occupation):
            out.append(
                SourceRecord(
                    id=f"{occupation}_{i:02d}",
                    path=f"{occupation}/{i}.jpg",
                    licence="CC0",
                    occupation=occupation,
                    presented_gender="female" if i % 2 == 0 else "male",
                )
            )
    return out


def _face(**overrides) -> DesignConfig:
    return DesignConfig(**{"kind": "face", "axes": FACE_AXES, "templates_per_stratum": 2, **overrides})


def _fingerprint(grid) -> tuple:
    return tuple(t.source_id for t in grid.templates), tuple(c.cell_id for c in grid.cells)


def test_conditions_are_the_cross_product_in_axis_order():
    design = DesignConfig(kind="face", axes={"race": ["A", "B"], "gender": ["m", "f"]}, templates_per_stratum=1)
    assert conditions(design) == [
        {"race": "A", "gender": "m"},
        {"race": "A", "gender": "f"},
        {"race": "B", "gender": "m"},
        {"race": "B", "gender": "f"},
    ]
    assert len(conditions(_face())) == 10


def test_focus_sized_grid_has_480_distinct_cells():
    # FOCUS: 6 occupations x 8 source photos x 10 race-gender groups = 480 edits.
    design = _face(strata=["occupation"], templates_per_stratum=8, seed=7)
    grid = expand_grid(_records(10), design)
    assert len(grid.templates) == 48
    assert len(grid.cells) == 480
    assert len({c.cell_id for c in grid.cells}) == 480
    assert Counter(t.stratum["occupation"] for t in grid.templates) == {o: 8 for o in OCCUPATIONS}
    for template in grid.templates:
        cells = grid.cells_of(template.source_id)
        assert [c.condition for c in cells] == conditions(design)
    assert not grid.shortfalls and not grid.excluded


def test_cell_ids_are_stable_strings():
    grid = expand_grid(_records(1, ["nurse"]), _face(strata=[], templates_per_stratum=1))
    ids = [c.cell_id for c in grid.cells]
    assert ids[0] == "nurse_00|race=White|gender=male"
    assert "nurse_00|race=East Asian|gender=female" in ids
    assert cell_id("x", {"cue": "removed"}) == "x|cue=removed"


def test_same_seed_same_grid_whatever_the_input_order():
    records = _records(10)
    design = _face(seed=3, conditions_per_template=4)
    first = expand_grid(records, design)
    shuffled = list(records)
    random.Random(99).shuffle(shuffled)
    assert _fingerprint(expand_grid(shuffled, design)) == _fingerprint(first)
    assert _fingerprint(expand_grid(list(reversed(records)), design)) == _fingerprint(first)


def test_different_seed_different_grid():
    records = _records(10)
    a = expand_grid(records, _face(seed=0))
    b = expand_grid(records, _face(seed=1))
    assert [t.source_id for t in a.templates] != [t.source_id for t in b.templates]


def test_default_strata_are_balanced():
    # default strata: occupation x presented_gender -> 12 strata of 5 sources each
    grid = expand_grid(_records(10), _face(templates_per_stratum=3))
    assert len(grid.strata) == 12
    per_stratum = Counter((t.stratum["occupation"], t.stratum["presented_gender"]) for t in grid.templates)
    assert set(per_stratum.values()) == {3}
    assert all(s.available == 5 and len(s.source_ids) == 3 for s in grid.strata)
    for template in grid.templates:  # a template really belongs to its stratum
        occupation, _ = template.source_id.split("_")
        assert template.stratum["occupation"] == occupation
    indices = Counter(t.index for t in grid.templates)
    assert indices == {0: 12, 1: 12, 2: 12}


def test_short_stratum_takes_all_and_records_a_shortfall():
    records = _records(10, ["nurse"]) + _records(2, ["pilot"])
    grid = expand_grid(records, _face(strata=["occupation"], templates_per_stratum=4))
    assert Counter(t.stratum["occupation"] for t in grid.templates) == {"nurse": 4, "pilot": 2}
    (short,) = grid.shortfalls
    assert dict(short.stratum) == {"occupation": "pilot"}
    assert (short.available, short.requested, short.missing) == (2, 4, 2)
    assert grid_summary(grid)["shortfalls"] == [
        {"stratum": {"occupation": "pilot"}, "available": 2, "requested": 4, "missing": 2}
    ]


def test_short_stratum_can_be_an_error():
    records = _records(10, ["nurse"]) + _records(2, ["pilot"])
    design = _face(strata=["occupation"], templates_per_stratum=4, on_short_stratum="error")
    with pytest.raises(ValueError, match=r"'pilot'\}: 2 of 4"):
        expand_grid(records, design)


def test_missing_stratum_value_is_its_own_stratum():
    records = _records(3, ["nurse"]) + [SourceRecord(id="anon", path="a.jpg", licence="CC0")]
    grid = expand_grid(records, _face(strata=["occupation"], templates_per_stratum=1))
    assert [dict(s.stratum) for s in grid.strata] == [{"occupation": None}, {"occupation": "nurse"}]


def test_extra_fields_can_stratify():
    records = [
        SourceRecord(
            id=f"s{i}",
            path=f"{i}.jpg",
            licence="CC0",
            extra={"region": "north" if i < 3 else "south"},
        )
        for i in range(6)
    ]
    grid = expand_grid(records, _face(strata=["extra.region"], templates_per_stratum=2))
    assert Counter(t.stratum["extra.region"] for t in grid.templates) == {"north": 2, "south": 2}


def test_gender_match_keeps_only_same_gender_conditions():
    grid = expand_grid(_records(4), _face(gender_balance="match"))
    assert grid.cells and all(c.gender_match is True for c in grid.cells)
    for template in grid.templates:
        cells = grid.cells_of(template.source_id)
        assert len(cells) == len(RACES)
        assert {c.condition["gender"] for c in cells} == {template.stratum["presented_gender"]}


def test_gender_mismatch_keeps_only_other_gender_conditions():
    grid = expand_grid(_records(4), _face(gender_balance="mismatch", conditions_per_template=3))
    assert all(c.gender_match is False for c in grid.cells)
    assert all(len(grid.cells_of(t.source_id)) == 3 for t in grid.templates)


def test_gender_balanced_gives_equal_matched_and_mismatched_per_template():
    grid = expand_grid(_records(4), _face(gender_balance="balanced", conditions_per_template=4))
    for template in grid.templates:
        matches = Counter(c.gender_match for c in grid.cells_of(template.source_id))
        assert matches == {True: 2, False: 2}
    full = expand_grid(_records(4), _face(gender_balance="balanced"))
    assert all(len(full.cells_of(t.source_id)) == 10 for t in full.templates)


def test_gender_modes_exclude_unknown_gender_visibly():
    records = _records(2, ["nurse"]) + [
        SourceRecord(id="unknown", path="u.jpg", licence="CC0", occupation="nurse"),
        SourceRecord(id="nb", path="n.jpg", licence="CC0", occupation="nurse", presented_gender="nonbinary"),
    ]
    grid = expand_grid(records, _face(strata=["occupation"], templates_per_stratum=9, gender_balance="match"))
    assert {e.source_id for e in grid.excluded} == {"unknown", "nb"}
    assert "presented_gender unknown" in next(e.reason for e in grid.excluded if e.source_id == "unknown")
    mismatch = expand_grid(records, _face(strata=["occupation"], templates_per_stratum=9, gender_balance="mismatch"))
    assert [e.source_id for e in mismatch.excluded] == ["unknown"]
    assert all(c.gender_match is False for c in mismatch.cells_of("nb"))
    anything = expand_grid(records, _face(strata=["occupation"], templates_per_stratum=9))
    assert not anything.excluded
    assert {c.gender_match for c in anything.cells_of("unknown")} == {None}


def test_partial_conditions_are_spread_evenly_over_the_grid():
    # 10 templates x 2 conditions over 10 conditions: each condition exactly twice
    grid = expand_grid(
        _records(10, ["nurse"]),
        _face(strata=[], templates_per_stratum=10, conditions_per_template=2),
    )
    assert set(grid_summary(grid)["cells_per_condition"].values()) == {2}
    assert len({c.cell_id for c in grid.cells}) == 20


def test_limb_design_with_cue_axis():
    records = [
        SourceRecord(id=f"arm{i}", path=f"{i}.jpg", licence="CC0", limb_mask={"file": f"masks/{i}.png"})
        for i in range(3)
    ]
    design = DesignConfig(kind="limb", axes={"cue": ["removed", "kept"]}, strata=[], templates_per_stratum=5)
    grid = expand_grid(records, design)
    assert [c.cell_id for c in grid.cells] == [
        "arm0|cue=removed",
        "arm0|cue=kept",
        "arm1|cue=removed",
        "arm1|cue=kept",
        "arm2|cue=removed",
        "arm2|cue=kept",
    ]
    assert all(c.gender_match is None for c in grid.cells)
    assert grid.shortfalls[0].missing == 2


def test_sources_and_failed_sources_are_accepted():
    records = _records(3, ["nurse"])
    pixels = np.zeros((64, 64, 3), np.uint8)
    items = [Source(r, Path(r.path), "0" * 64, pixels) for r in records]
    items.append(FailedSource("broken", Path("broken.jpg"), "empty file (0 bytes)"))
    grid = expand_grid(items, _face(strata=["occupation"], templates_per_stratum=3))
    assert [t.source_id for t in grid.templates] == [r.id for r in records]
    assert [(e.source_id, e.reason) for e in grid.excluded] == [("broken", "failed to load: empty file (0 bytes)")]


def test_duplicate_source_ids_are_refused():
    records = _records(2, ["nurse"])
    with pytest.raises(ValueError, match="more than once"):
        expand_grid(records + records[:1], _face())


def test_grid_summary_is_json_ready_and_adds_up():
    grid = expand_grid(_records(10), _face(strata=["occupation"], templates_per_stratum=8))
    summary = json.loads(json.dumps(grid_summary(grid)))
    assert summary["n_templates"] == 48 and summary["n_cells"] == 480 and summary["n_conditions"] == 10
    assert sum(summary["cells_per_condition"].values()) == 480
    assert set(summary["cells_per_condition"].values()) == {48}
    assert summary["gender_match"]["matched"] + summary["gender_match"]["mismatched"] == 480
    assert summary["gender_match"]["matched"] == 240  # each template matches 5 of 10 groups
    assert sum(s["selected"] for s in summary["strata"]) == 48


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"axes": {}}, "at least one axis"),
        ({"axes": {"race": []}}, "at least one value"),
        ({"axes": {"race": ["Black", "black"]}}, "unique"),
        ({"axes": {"race": ["a|b"]}}, "'\\|'"),
        ({"axes": {"race group": ["a"]}}, "identifiers"),
        ({"strata": ["occuption"]}, "strata among"),
        ({"templates_per_stratum": 0}, "greater than or equal to 1"),
        ({"seed": -1}, "greater than or equal to 0"),
        ({"conditions_per_template": 11}, "<= the 10 conditions"),
        ({"gender_balance": "match", "conditions_per_template": 6}, "<= 5"),
        ({"gender_balance": "balanced", "conditions_per_template": 3}, "even"),
        ({"gender_balance": "match", "axes": {"race": RACES}}, "'gender' axis"),
        ({"gender_balance": "mismatch", "axes": {"gender": ["female"]}}, "more than one value"),
        ({"colour": "red"}, "Extra inputs"),
    ],
)
def test_design_validation(overrides, message):
    with pytest.raises(ValidationError, match=message):
        _face(**overrides)


@pytest.mark.parametrize("occupation", ["chef", "nurse"])
def test_removing_one_source_changes_only_its_own_stratum(occupation):
    # a photo newly failing its face check must not re-buy edits in unrelated strata
    design = _face(strata=["occupation"], templates_per_stratum=3, conditions_per_template=4, seed=11)
    records = _records(per_occupation=6)
    before = expand_grid(records, design)
    dropped = next(t.source_id for t in before.templates if t.stratum["occupation"] == occupation)
    after = expand_grid([r for r in records if r.id != dropped], design)

    def by_stratum(grid):
        out: dict[str, tuple] = {}
        for t in grid.templates:
            cells = tuple(c.cell_id for c in grid.cells_of(t.source_id))
            out[t.stratum["occupation"]] = out.get(t.stratum["occupation"], ()) + ((t.source_id, cells),)
        return out

    old, new = by_stratum(before), by_stratum(after)
    assert old[occupation] != new[occupation] and dropped not in {sid for sid, _ in new[occupation]}
    for other in set(OCCUPATIONS) - {occupation}:
        assert old[other] == new[other], other
    # partial condition sets (4 of 10) are the hard case: their balancing must stay per stratum
    assert all(len(cells) == 4 for stratum in new.values() for _, cells in stratum)
