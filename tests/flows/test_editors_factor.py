"""Editors as a factor: the demo grid once per editor, one ledger, one release, compared.

The demo spec (``assets/specs/demo-face.yaml``) with two CPU editors: the classical one as the
demo runs it, and the classical one at a faint strength (5 % of the way to the donor's tone),
whose faces barely change, so the locality gate sends most of its cells to review
(``locality_face_unchanged``). Every figure the release states about the editors is recomputed
here from its own rows (``items.jsonl``, ``manifest.jsonl``) with the textbook formulas.
"""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from statistics import NormalDist

import pytest
import yaml

from counterfactory.manifests.release_verify import verify_release
from counterfactory.manifests.spec import SpecError, load_spec
from tests.conftest import REPO

CLI = [sys.executable, "-m", "counterfactory.flows.cli"]
PUBLISH = ["--publish", "--allow-incomplete"]
NAMES = ("classical", "classical-faint")
Z = NormalDist().inv_cdf(0.975)


def _spec(tmp_path: Path, **change) -> Path:
    """The demo spec with absolute photo paths and two named editors (``change`` edits the YAML)."""
    spec = yaml.safe_load((REPO / "assets/specs/demo-face.yaml").read_text())
    spec["sources"] = {k: str((REPO / "assets/specs" / v).resolve()) for k, v in spec["sources"].items()}
    editor = spec.pop("editor")
    spec["editors"] = [
        {"name": NAMES[0], **editor},
        {"name": NAMES[1], **editor, "classical": {"strength": 0.05}},
    ]
    spec["trials"] = {"protocols": ["2afc"], "per_editor": True}
    spec.update(change)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))  # axis order decides cell ids
    return path


def _run(args) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + args, cwd=REPO, capture_output=True, text=True, timeout=1200)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    folder = tmp_path_factory.mktemp("editors")
    spec = _spec(folder)
    out = folder / "out"
    first = _run(["run", str(spec), "--out", str(out), "--no-progress", *PUBLISH])
    assert first.returncode == 0, first.stderr[-3000:]
    return spec, out, out / "releases" / "demo-face" / "0.1.0", first


def _group(row: dict) -> str:
    # in the design's axis order (a row's JSON has its keys sorted)
    return f"race={row['condition']['race']}|gender={row['condition']['gender']}"


def _measured(rows: list[dict], gate: str, metric: str) -> list:
    values = [((r["gates"].get(gate) or {}).get("metrics") or {}).get(metric) for r in rows]
    return [v for v in values if v is not None]


def _wilson(k: int, n: int) -> tuple[float, float]:
    # Wilson (1927): (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    p = k / n
    centre = p + Z * Z / (2 * n)
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n))
    return max(0.0, (centre - half) / (1 + Z * Z / n)), min(1.0, (centre + half) / (1 + Z * Z / n))


@pytest.mark.slow
def test_each_editor_fills_its_own_cells_in_one_ledger_and_one_release(compared):
    _, out, release, first = compared
    assert verify_release(release) == []
    items = _rows(release / "items.jsonl")
    by_editor = Counter(r["editor_name"] for r in items)
    # 3 usable templates x 6 conditions, once per editor
    assert by_editor == {NAMES[0]: 18, NAMES[1]: 18}
    for row in items:
        assert row["cell_id"].endswith(f"|editor={row['editor_name']}")
        strength = row["editor"]["lineage"]["strength"]
        assert strength == (0.85 if row["editor_name"] == NAMES[0] else 0.05)
    manifest = _rows(release / "manifest.jsonl")
    # the faint editor's near-copies wait in review (locality_face_unchanged): the manifest
    # holds the accepted cells, each under its editor's name
    assert {r["editor_name"] for r in manifest} <= set(NAMES) and NAMES[0] in {r["editor_name"] for r in manifest}
    # one floor per template and editor, each its own attempt
    stats = json.loads((release / "stats.json").read_text())
    floors = stats["noise_floor"]
    assert len(floors) == 6 and len({f["attempt_id"] for f in floors.values()}) == 6
    assert {key.rsplit("=", 1)[1] for key in floors} == set(NAMES)
    with sqlite3.connect(f"file:{out / 'ledger.sqlite'}?mode=ro", uri=True) as db:
        attempts = db.execute("select count(*) from attempts").fetchone()[0]
    assert attempts == sum(r["attempts"] for r in items) + len(floors)
    # the per-editor trial bank pairs a template's variants of one editor only
    editor_of = {r["item_id"]: r["editor_name"] for r in manifest}
    trials = _rows(release / "trials.jsonl")
    assert trials and all(len({editor_of[i] for i in t["images"]}) == 1 for t in trials)


@pytest.mark.slow
def test_stats_compare_the_editors_per_group_as_the_rows_say(compared):
    _, _, release, _ = compared
    items = _rows(release / "items.jsonl")
    manifest = _rows(release / "manifest.jsonl")
    section = json.loads((release / "stats.json").read_text())["editors"]
    assert section["names"] == list(NAMES)
    groups = {_group(r) for r in items}
    assert set(section["groups"]) == groups | {"all"} and len(groups) == 6
    for name in NAMES:
        for group in section["groups"]:
            mine = [r for r in items if r["editor_name"] == name and group in ("all", _group(r))]
            accepted = [r for r in manifest if r["editor_name"] == name and group in ("all", _group(r))]
            got = section["by_editor"][name]["groups"][group]
            assert (got["n"], got["accepted"]) == (len(mine), len(accepted))
            rate = got["pass_rate"]
            assert rate["ci_low"] <= rate["rate"] <= rate["ci_high"]
            assert (rate["ci_low"], rate["ci_high"]) == pytest.approx(_wilson(len(accepted), len(mine)), abs=1e-12)
            failed = Counter(c.split(":")[0] for r in mine if r["status"] != "accepted" for c in r["reasons"])
            assert got["reasons"] == dict(failed)
            lightened = _measured(mine, "skin", "lightened")
            assert (got["lightened"]["k"], got["lightened"]["n"]) == (sum(lightened), len(lightened))
            cosines = _measured(mine, "identity", "cosine")
            assert got["identity_cosine_mean"] == pytest.approx(sum(cosines) / len(cosines))
            changes = _measured(mine, "skin", "face_ita_change_deg")
            assert got["face_ita_change_deg_mean"] == pytest.approx(sum(changes) / len(changes))
            drifted = [not r["expression"]["consistent"] for r in mine if r["expression"]]
            assert (got["expression_drift"]["k"], got["expression_drift"]["n"]) == (sum(drifted), len(drifted))
    everyone = {name: section["by_editor"][name]["groups"]["all"] for name in NAMES}
    # the faint editor's faces barely change: the gates hold most of them for review
    assert everyone[NAMES[0]]["pass_rate"]["rate"] > everyone[NAMES[1]]["pass_rate"]["rate"]
    assert everyone[NAMES[1]]["reasons"].get("locality_face_unchanged", 0) > 0
    assert everyone[NAMES[1]]["face_ita_change_deg_mean"] > everyone[NAMES[0]]["face_ita_change_deg_mean"]
    tests = {c["group"]: c for c in section["comparisons"]}
    assert set(tests) == groups | {"all"}
    for group, c in tests.items():
        a, b = (section["by_editor"][n]["groups"][group] for n in NAMES)
        assert c["diff"] == pytest.approx(a["accepted"] / a["n"] - b["accepted"] / b["n"])
        assert 0.0 <= c["p_value"] <= 1.0
    # all: 36 cells, every expected count >= 5, so the pooled z test
    a, b = everyone[NAMES[0]], everyone[NAMES[1]]
    pooled = (a["accepted"] + b["accepted"]) / (a["n"] + b["n"])
    z = (a["accepted"] / a["n"] - b["accepted"] / b["n"]) / math.sqrt(pooled * (1 - pooled) * (1 / a["n"] + 1 / b["n"]))
    assert tests["all"]["test"] == "z"
    assert tests["all"]["p_value"] == pytest.approx(2 * (1 - NormalDist().cdf(abs(z))), rel=1e-9)
    assert tests["all"]["p_value"] < 0.001
    # three cells a side: Fisher's exact test
    assert {tests[g]["test"] for g in groups} == {"fisher"}
    for name in NAMES:
        floor = section["by_editor"][name]["noise_floor"]
        assert floor["templates"] == 3 and floor["means"]["diff_face"] > 0


@pytest.mark.slow
def test_report_shows_the_comparison_table(compared):
    _, _, release, _ = compared
    page = (release / "report.html").read_text()
    assert "<h2>Editors compared</h2>" in page
    table = page.split('<table id="editors-compared">', 1)[1].split("</table>", 1)[0]
    # one row per group and editor, with the Wilson interval of each pass rate
    assert table.count("<tr>") == 1 + 7 * 2
    for name in NAMES:
        assert f"<td>{name}</td>" in table
    tests = page.split('<table id="editors-tests">', 1)[1].split("</table>", 1)[0]
    assert tests.count("<tr>") == 1 + 7 and "fisher" in tests and "<td>z</td>" in tests


@pytest.mark.slow
def test_a_rerun_makes_zero_editor_calls(compared):
    spec, out, release, _ = compared
    before = (release / "stats.json").read_bytes()
    again = _run(["run", str(spec), "--out", str(out), "--no-progress", *PUBLISH])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "editor calls: 0" in again.stdout
    assert "every cell was already settled in the ledger" in again.stdout
    assert "unchanged" in again.stdout
    assert (release / "stats.json").read_bytes() == before


def test_spec_refuses_both_editor_and_editors(tmp_path):
    path = _spec(tmp_path, editor={"backend": "classical"})
    with pytest.raises(SpecError, match=r"field `editors`: expected either `editor` .* not both"):
        load_spec(path)


def test_spec_refuses_a_repeated_editor_name(tmp_path):
    spec = yaml.safe_load(_spec(tmp_path).read_text())
    spec["editors"][1]["name"] = NAMES[0]
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(SpecError, match=r"field `editors`: .*editors\[1\] repeats 'classical'"):
        load_spec(tmp_path / "spec.yaml")


def test_spec_refuses_two_editors_that_make_the_same_attempts(tmp_path):
    spec = yaml.safe_load(_spec(tmp_path).read_text())
    del spec["editors"][1]["classical"]
    spec["editors"][1]["max_attempts"] = 3  # the retry budget does not change an attempt
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(SpecError, match=r"editors\[1\] \('classical-faint'\) has the backend, options and seed"):
        load_spec(tmp_path / "spec.yaml")


def test_each_editor_is_a_view_and_one_editor_specs_hash_as_before(tmp_path):
    spec = load_spec(_spec(tmp_path))
    views = spec.editor_views()
    assert [v.editor_name for v in views] == list(NAMES)
    assert [v.editor.options().strength for v in views] == [0.85, 0.05]
    assert [e["name"] for e in spec.canonical()["editors"]] == list(NAMES) and "editor" not in spec.canonical()
    one = load_spec(REPO / "assets/specs/demo-face.yaml")
    assert one.editor_views() == [one] and "editors" not in one.canonical()
    assert "per_editor" not in one.canonical()["trials"]
    # the demo spec's hash, of the same form as before editors could be compared (its releases
    # name it); the shipped thresholds are part of the study, so a new calibration changes it
    # (2026-12-05: issue 34's calibration on three judging paths, with locality.cohort and
    # locality.no_floor; a spec that leaves those unset hashes as it did before they existed;
    # the default trial bank is trial_prompts_v3, so a spec naming none asks v3's wording;
    # the second round: the hair measure's limits and a global shift resolved to two levels;
    # the third: the largest area of change, max_largest_change_share on every path; the fourth:
    # local failures placed outside the edit region, which moved two cohort limits; then the demo
    # published FOCUS's 2AFC and MCQ, a trials section of its own)
    assert one.spec_hash() == "dcc5d58b8be0d1627f291aaaa617aca367642f611a5242f9aba448f1f7b49c5c"


def test_editors_are_refused_on_ray_before_anything_runs(tmp_path):
    from counterfactory.flows.resume import run_spec

    out = tmp_path / "out"
    with pytest.raises(SpecError, match=r"field `editors`: comparing editors runs on this machine only"):
        run_spec(_spec(tmp_path), out, ray="local")
    assert not out.exists()


@pytest.mark.slow
def test_publish_from_the_ledger_reads_every_editor(compared):
    _, out, release, _ = compared
    again = _run(["publish", str(out), "--version", "0.2.0", "--allow-incomplete"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "editor calls: 0" in again.stdout
    second = out / "releases" / "demo-face" / "0.2.0"
    assert verify_release(second) == []
    assert _rows(second / "items.jsonl") == _rows(release / "items.jsonl")
    stats = [json.loads((r / "stats.json").read_text()) for r in (release, second)]
    assert stats[0]["editors"] == stats[1]["editors"]
