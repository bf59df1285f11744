"""Auditing an existing set: the ``import`` editor backend through the real command line.

The set is made by :mod:`tests.flows.import_set` from bundled and London photos with the failure
corpus (good face-only edits and failures, each re-rendered through TAEF2 and jittered as an
editor returns it) and written out as a set arrives: PNG, WebP, re-sized JPEG, re-framed, one
PNG whose text chunk has a bad CRC, one file in two rows, one missing file. The corpus labels
say what each verdict should be; nothing here knows the gates' thresholds.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from counterfactory.assets import PHOTOS_DIR
from counterfactory.manifests.ledger import Ledger
from tests.conftest import REPO
from tests.flows.import_set import LONDON, import_spec, write_import_set
from tests.flows.review_setup import cli

GOOD = "good"


def _editor_calls(stdout: str) -> int:
    return int(re.search(r"^editor calls: (\d+)\b", stdout, re.M).group(1))


def _attempts(out):
    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    try:
        return ledger.attempts()
    finally:
        ledger.close()


@pytest.mark.slow
def test_a_bad_row_stops_the_run_before_any_work(tmp_path):
    """A condition outside the axes and an unknown source: exit 2 naming the row; OUT is never made."""
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "hopper.jpg").write_bytes((PHOTOS_DIR / "grace_hopper.jpg").read_bytes())
    metadata = {"sources": [{"id": "hopper", "path": "hopper.jpg", "licence": "public domain"}]}
    (tmp_path / "photos" / "metadata.yaml").write_text(yaml.safe_dump(metadata))
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(import_spec("pairs.csv"), sort_keys=False))
    for rows, expected in [
        (["p1,hopper,x.png,Black,female", "p2,hopper,y.png,Purple,female"], "row 2 (id 'p2'): condition race='Purple'"),
        (["p1,hopper,x.png,Black,female", "p2,someone,y.png,White,female"], "row 2 (id 'p2'): source 'someone'"),
    ]:
        (tmp_path / "pairs.csv").write_text("\n".join(["id,source,candidate,race,gender", *rows]) + "\n")
        done = subprocess.run(
            [sys.executable, "-m", "counterfactory", "run", str(spec), "--out", str(tmp_path / "out"), "--publish"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
        )
        assert done.returncode == 2, done.stderr
        assert expected in done.stderr and "pairs.csv" in done.stderr
        assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """The set written, then ``counterfactory run SPEC --out OUT --publish --allow-incomplete``."""
    if not LONDON.is_dir():
        pytest.skip(f"{LONDON} (the Face Research Lab London Set) is not on this machine")
    folder = tmp_path_factory.mktemp("import")
    made = write_import_set(folder / "set")
    out = folder / "out"
    done = cli("run", str(made.spec), "--out", str(out), "--publish", "--allow-incomplete", "--no-progress")
    release = out / "releases" / "import-test" / "0.1.0"
    items = [json.loads(line) for line in (release / "items.jsonl").read_text().splitlines()]
    return made, out, release, items, done.stdout


def _by_row(made, items):
    """Each table row's item, found by the row id the backend recorded on it."""
    by_id = {}
    for item in items:
        output = (item["editor"] or {}).get("output") or {}
        by_id[output.get("id")] = item
    return {row["id"]: by_id.get(row["id"]) for row in made.rows}


@pytest.mark.slow
def test_every_row_is_accounted_for_in_the_release(audited):
    made, out, release, items, stdout = audited
    assert len(made.rows) >= 40
    # each row a cell with one attempt, each attempt one editor call: nothing is retried with
    # another seed; each source's noise-floor request is answered with the table's floor file
    attempts = _attempts(out)
    cell_attempts = [a for a in attempts if not a.cell_id.endswith("|floor")]
    floors = [a for a in attempts if a.cell_id.endswith("|floor")]
    assert len(cell_attempts) == len(made.rows) == len(items)
    assert _editor_calls(stdout) == len(attempts) == sum(a.calls for a in attempts)
    sources = {Path(r["source"]).stem for r in made.rows}
    assert len(floors) == len(sources) and all(a.status == "ok" for a in floors)
    # issue 47: the count says how many of its calls were those floor requests, so N rows do not
    # read as N + sources calls with no reason given
    assert f"editor calls: {len(attempts)} ({len(floors)} of them noise-floor requests," in stdout
    stats = json.loads((release / "stats.json").read_text())
    assert sorted(stats["noise_floor"]) == sorted(f"src_{s}" for s in sources)
    judged = [i for i in items if (i.get("gates") or {}).get("locality", {}).get("metrics")]
    assert judged and all("floor_changed_share" in i["gates"]["locality"]["metrics"] for i in judged)
    by_row = _by_row(made, items)
    assert all(item is not None for item in by_row.values()), [k for k, v in by_row.items() if v is None]
    manifest = {json.loads(line)["cell_id"] for line in (release / "manifest.jsonl").read_text().splitlines()}
    left_out = [json.loads(line) for line in (release / "left_out.jsonl").read_text().splitlines()]
    left_cells = {r["id"] for r in left_out if r["what"] == "cell"}
    cells = [by_row[row["id"]]["cell_id"] for row in made.rows]
    assert len(set(cells)) == len(cells)
    assert manifest.isdisjoint(left_cells) and manifest | left_cells == set(cells)
    assert not [r for r in left_out if r["what"] == "source"]  # every source was usable
    for row in made.rows:  # the table's lineage on every item
        editor = by_row[row["id"]]["editor"]
        assert (editor["backend"], editor["model"], editor["revision"]) == ("import", "failure-corpus", "1")
        assert editor["prompt"] == row["prompt"] and editor["cost_usd"] == 0
        assert editor["output"]["file"] == row["candidate"]

    # the missing file: a failed item whose reason names the file
    (missing,) = made.by_form("missing")
    item = by_row[missing["id"]]
    assert item["status"] == "failed" and item["image"] is None
    assert item["reasons"] == [f"import_unreadable: {made.folder / missing['candidate']}: file not found"]

    # the PNG with a damaged text chunk: read, judged, the warning on its item
    (damaged,) = made.by_form("damaged_png")
    item = by_row[damaged["id"]]
    assert item["status"] != "failed" and item["alignment"]["ok"]
    (warning,) = item["editor"]["output"]["warnings"]
    assert "tEXt" in warning and "bad CRC" in warning

    # WebP and re-sized files were decoded as such; re-framed ones registered through their frame
    formats = Counter(by_row[r["id"]]["editor"]["output"]["format"] for r in made.rows if r["form"] != "missing")
    assert formats["WEBP"] == len(made.by_form("webp")) and formats["JPEG"] == len(made.by_form("resized"))
    assert {by_row[r["id"]]["alignment"]["frame"] for r in made.by_form("reframed")} == {"fit"}

    # one file in two rows: one output in the store for both attempts
    (second,) = made.by_form("second_row")
    first = next(r for r in made.rows if r["candidate"] == second["candidate"] and r is not second)
    attempts = {a.attempt_id: a for a in attempts}
    shas = {attempts[by_row[r["id"]]["item_id"]].output_sha256 for r in (first, second)}
    assert len(shas) == 1
    ok = [a for a in attempts.values() if a.status == "ok"]
    assert len({a.output_sha256 for a in ok}) == len(ok) - 1


@pytest.mark.slow
def test_failures_are_not_accepted(audited):
    """Rule: at most one row of a failure class is accepted. Issue 19 asks every failure class
    caught on at least 95 % of its held-out cases, so about 17 failure rows expect at most one
    miss; a second is a gate that lets a failure class through."""
    made, _, _, items, _ = audited
    by_row = _by_row(made, items)
    failures = [r for r in made.rows if r["label"] not in (GOOD, "missing")]
    accepted = [r["case_id"] for r in failures if by_row[r["id"]]["status"] == "accepted"]
    assert len(failures) >= 15 and len(accepted) <= 1, accepted


@pytest.mark.slow
def test_good_edits_are_mostly_accepted(audited):
    """Rule: at least 80 % of the good edits' rows are accepted, whatever file form they came in.
    The shipped calibration accepts 98.6 % of the corpus's held-out good edits; WebP at quality
    95, a 60 % re-size and a padded frame change no pixel the gates judge beyond what the
    aligner undoes, so 80 % leaves room for four of about 22 rows, no more."""
    made, _, _, items, _ = audited
    by_row = _by_row(made, items)
    good = [r for r in made.rows if r["label"] == GOOD]
    verdicts = {r["case_id"] + "/" + r["form"]: (by_row[r["id"]]["status"], by_row[r["id"]]["reasons"]) for r in good}
    accepted = sum(v[0] == "accepted" for v in verdicts.values())
    assert len(good) >= 20 and accepted >= 0.8 * len(good), verdicts


@pytest.mark.slow
def test_trials_export_and_a_second_run_with_no_new_work(audited, tmp_path):
    made, out, release, items, _ = audited
    trials = [json.loads(line) for line in (release / "trials.jsonl").read_text().splitlines()]
    accepted = {i["item_id"] for i in items if i["status"] == "accepted"}
    assert trials and {t["protocol"] for t in trials} <= {"2afc", "mcq"}
    named = {ref for t in trials for ref in t["images"]}
    assert named and named <= accepted
    cli("verify", str(release))
    cli("release", "export", str(release), str(tmp_path / "hub"))
    assert (tmp_path / "hub" / "README.md").is_file()

    before = [(a.attempt_id, a.status) for a in _attempts(out)]
    again = cli("run", str(made.spec), "--out", str(out), "--publish", "--allow-incomplete", "--no-progress")
    assert _editor_calls(again.stdout) == 0 and "nothing to run" in again.stdout
    assert "release unchanged" in again.stdout
    assert [(a.attempt_id, a.status) for a in _attempts(out)] == before


@pytest.mark.slow
def test_measure_batch_on_the_same_table(audited):
    made, *_ = audited
    # the text form on six rows of the table, the missing file among them (every row is measured
    # once, below, as JSON: two passes over the whole table took 83 s of CI)
    (missing,) = made.by_form("missing")
    few = {r["id"] for r in made.rows[:5]} | {missing["id"]}
    header, *body = made.table.read_text().splitlines()
    subset = made.folder / "six_pairs.csv"
    subset.write_text("\n".join([header] + [line for line in body if line.split(",", 1)[0] in few]) + "\n")
    done = cli("measure", "--batch", str(subset), "--spec", str(made.spec))
    lines = done.stdout.splitlines()
    pair_lines = [line for line in lines if re.match(r"^pair\d{3}\t", line)]
    assert [line.split("\t")[0] for line in pair_lines] == [r["id"] for r in made.rows if r["id"] in few]
    assert next(line for line in pair_lines if line.startswith(missing["id"])).split("\t")[1] == "failed"
    summary = next(i for i, line in enumerate(lines) if line.startswith("summary:"))
    assert lines[summary].startswith("summary: 6 pairs:")
    # the prompt column is the import backend's, not a condition
    assert any("race=" in line for line in lines[summary:]) and not any("prompt=" in line for line in lines)
    # with the same floor (the table's floor column: each source's "return this photo
    # unchanged" output) measure gives every pair the import's verdict, and both say so
    _, _, _, items, _ = audited
    by_row = _by_row(made, items)
    as_json = cli("measure", "--batch", str(made.table), "--spec", str(made.spec), "--json")
    reports = {r["id"]: r for r in map(json.loads, as_json.stdout.splitlines())}
    for row in made.rows:
        if row["form"] == "missing":
            continue
        report, item = reports[row["id"]], by_row[row["id"]]
        assert (report["verdict"], report["floor_path"]) == (item["status"], item["floor_path"]), row["id"]
        if item["alignment"]["ok"]:
            assert item["floor_path"] == "request"


def _recompute(rows):
    """FOCUS's figures recomputed here from release rows, as the paper defines them: means of
    diff_face and diff_nonface, median of their ratio, the share of drifted expression labels."""
    import statistics

    measured = [
        r["gates"]["locality"]["metrics"]
        for r in rows
        if "focus_diff_face" in ((r.get("gates") or {}).get("locality") or {}).get("metrics", {})
        and r["gates"]["locality"]["metrics"]["focus_diff_face"] is not None
    ]
    ratios = [m["focus_ratio"] for m in measured if m.get("focus_ratio") is not None]
    labelled = [r for r in rows if r.get("expression")]
    return {
        "n": len(measured),
        "diff_face_mean": statistics.fmean(m["focus_diff_face"] for m in measured),
        "diff_nonface_mean": statistics.fmean(m["focus_diff_nonface"] for m in measured),
        "ratio_median": statistics.median(ratios),
        "drift": sum(not r["expression"]["consistent"] for r in labelled) / len(labelled),
    }


@pytest.mark.slow
def test_the_audit_sets_focus_published_figures_beside_the_sets_own(audited):
    made, out, release, items, _ = audited
    stats = json.loads((release / "stats.json").read_text())
    focus = stats["audit"]["focus"]
    # FOCUS's published QC figures (Dehdashtian et al. 2025)
    assert focus["published"] == {
        "diff_face_mean": 0.141,
        "diff_nonface_mean": 0.022,
        "ratio_median": 8.16,
        "target_label_accuracy": 0.979,
        "expression_drift": 0.121,
    }
    manifest = [json.loads(line) for line in (release / "manifest.jsonl").read_text().splitlines()]
    for rows, figures in ((manifest, focus["accepted"]), (items, focus["set"])):
        want = _recompute(rows)
        assert figures["n"] == want["n"] > 0
        for key in ("diff_face_mean", "diff_nonface_mean", "ratio_median"):
            assert figures[key] == pytest.approx(want[key], rel=1e-12), key
        assert figures["expression_drift"]["share"] == pytest.approx(want["drift"])
        assert figures["target_label_accuracy"] is None  # the spec has no attribute gate
    assert focus["set"]["n"] == sum(1 for i in items if i["status"] != "failed" and i["alignment"].get("ok"))
    report = (release / "report.html").read_text()
    assert "Against FOCUS&#x27;s published figures" in report or "Against FOCUS's published figures" in report
    assert f"<td>{focus['accepted']['diff_face_mean']:.3f}</td><td>0.141</td>" in report
    assert "<td>8.160</td>" in report and "<td>97.9 %</td>" in report and "<td>12.1 %</td>" in report
