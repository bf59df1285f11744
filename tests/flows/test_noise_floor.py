"""The editor's noise floor (issue 19): one "return this photo unchanged" request per template
and editor, in the ledger and the report, judged against, and never paid twice.

Starts from what a user runs: ``counterfactory run`` on a spec, the ledger and release it wrote.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from counterfactory.generation.prompts import load_template
from counterfactory.manifests.ledger import Ledger
from counterfactory.validation.gates.locality import FLOOR_RELATIVE
from counterfactory.validation.metrics.floor import AGAINST_FLOOR
from tests.flows.review_setup import cli, write_spec

pytestmark = pytest.mark.slow


def test_one_floor_request_per_template_judged_against_reported_and_paid_once(tmp_path):
    spec = write_spec(tmp_path)
    out = tmp_path / "out"
    first = cli("run", str(spec), "--out", str(out))
    assert "editor calls:" in first.stdout
    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    floor_text = load_template("noise_floor_v1")[0].strip()
    with ledger.engine.connect() as c:
        floors = c.execute(
            text("SELECT attempt_id, cell_id, status, prompt FROM attempts WHERE cell_id LIKE '%|floor'")
        ).all()
    # one per template (grace_hopper and biden_blue_room), asking for the photo unchanged
    assert sorted(r.cell_id for r in floors) == ["biden_blue_room|floor", "grace_hopper|floor"]
    assert all(r.status == "ok" and r.prompt == floor_text for r in floors)
    candidates = {c.attempt_id: c for c in ledger.candidates()}
    for r in floors:
        floor = candidates[r.attempt_id]
        assert floor.verdict == "floor"
        measured = floor.gates["locality"]["metrics"]
        # the classical editor re-renders the photo through TAEF2: the floor is not zero
        assert measured["diff_nonface"] > 0.005
    # every cell's locality measures are judged above its template's floor
    cells = [c for c in candidates.values() if not c.cell_id.endswith("|floor") and c.gates.get("locality")]
    assert cells
    for c in cells:
        m = c.gates["locality"]["metrics"]
        floor = candidates[next(r.attempt_id for r in floors if r.cell_id.split("|")[0] == c.cell_id.split("|")[0])]
        fm = floor.gates["locality"]["metrics"]
        # and compared with the floor output itself, read from the run's store
        assert isinstance(m["excess_share"], float) and 0.0 <= m["excess_share"] <= 1.0
        for key in FLOOR_RELATIVE:
            if m.get(key) is None or fm.get(key) is None:
                continue
            assert m[f"floor_{key}"] == pytest.approx(fm[key])
            if key in AGAINST_FLOOR:  # measured against the floor output itself
                assert 0.0 <= m[f"{key}_above_floor"] < 0.05
            else:
                assert m[f"{key}_above_floor"] == pytest.approx(m[key] - fm[key])
    n_attempts = len(floors)
    with ledger.engine.connect() as c:
        n_all = c.execute(text("SELECT count(*) FROM attempts")).scalar_one()
    ledger.close()

    # a re-run pays for it (and for everything else) zero times, and publishes the floor
    again = cli("run", str(spec), "--out", str(out), "--publish", "--allow-incomplete")
    assert "editor calls: 0" in again.stdout
    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    with ledger.engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM attempts")).scalar_one() == n_all
        assert len(c.execute(text("SELECT 1 FROM attempts WHERE cell_id LIKE '%|floor'")).all()) == n_attempts
    ledger.close()
    release = out / "releases" / "review-test" / "0.1.0"
    stats = json.loads((release / "stats.json").read_text())
    assert sorted(stats["noise_floor"]) == ["biden_blue_room", "grace_hopper"]
    assert all(f["metrics"]["changed_share"] is not None for f in stats["noise_floor"].values())
    report = (release / "report.html").read_text()
    assert 'id="noise-floor"' in report and "grace_hopper" in report.split('id="noise-floor"')[1]
    # the floor is never an item: not in the manifest, not in left_out
    floor_images = {candidates[r.attempt_id].image_sha256 for r in floors}
    released = (release / "manifest.jsonl").read_text() + (release / "left_out.jsonl").read_text()
    assert not any(sha in released for sha in floor_images)
    assert not any(r.attempt_id in released for r in floors)


def test_without_the_floor_switch_no_request_is_made(tmp_path):
    import yaml

    spec = write_spec(tmp_path)
    data = yaml.safe_load(spec.read_text())
    data["gates"]["noise_floor"] = False
    data["design"]["axes"] = {"race": ["Black"], "gender": ["female"]}
    spec.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    cli("run", str(spec), "--out", str(out))
    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    with ledger.engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM attempts WHERE cell_id LIKE '%|floor'")).scalar_one() == 0
    cells = [c for c in ledger.candidates() if c.gates.get("locality")]
    ledger.close()
    assert cells and not any("floor_changed_share" in c.gates["locality"]["metrics"] for c in cells)
