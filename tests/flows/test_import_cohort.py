"""Auditing a set with no floor: the cohort floor (issue 34).

A set shaped like FOCUS's (:func:`tests.flows.import_set.write_focus_set`: eight London Set
people of four stated groups, ten good face-and-neck edits each, lighter and darker, every one
re-rendered through TAEF2 and jittered as an editor returns it, plus an added object, a colour
cast and an identity swap) is imported with no ``floor`` column, as every set published so far
is. Each candidate is judged against the median of its source's other candidates; the corpus
labels say what each verdict should be. The same table through ``measure --batch`` must give
the same verdicts, each naming the floor that judged it, and one pair through ``measure`` alone
is judged as a lone pair.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.flows.import_set import LONDON, write_focus_set
from tests.flows.review_setup import cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def focus_import(tmp_path_factory):
    if not LONDON.is_dir():
        pytest.skip(f"{LONDON} (the Face Research Lab London Set) is not on this machine")
    folder = tmp_path_factory.mktemp("focus")
    made = write_focus_set(folder / "set")
    out = folder / "out"
    cli("run", str(made.spec), "--out", str(out), "--publish", "--allow-incomplete", "--no-progress")
    release = out / "releases" / "import-test" / "0.1.0"
    items = [json.loads(line) for line in (release / "items.jsonl").read_text().splitlines()]
    by_row = {(i["editor"] or {}).get("output", {}).get("id"): i for i in items}
    return made, release, {row["id"]: by_row[row["id"]] for row in made.rows}


def test_good_edits_pass_and_failures_are_caught_with_no_floor(focus_import):
    made, release, by_row = focus_import
    good = [r for r in made.rows if r["label"] == "good"]
    failures = [r for r in made.rows if r["label"] != "good"]
    assert len(good) == 80 and sorted(r["label"] for r in failures) == [
        "global_colour",
        "identity_swap",
        "object_added",
    ]
    accepted = [r for r in good if by_row[r["id"]]["status"] == "accepted"]
    refused = {r["id"]: by_row[r["id"]]["reasons"] for r in good if by_row[r["id"]]["status"] != "accepted"}
    assert len(accepted) >= 0.9 * len(good), refused
    for r in failures:
        assert by_row[r["id"]]["status"] in ("rejected", "needs_review"), (r["label"], by_row[r["id"]]["reasons"])
    # every verdict says it was judged against its source's other candidates
    registered = [i for i in by_row.values() if (i["alignment"] or {}).get("ok")]
    assert registered and {i["floor_path"] for i in registered} == {"cohort"}
    assert all(i["gates"]["locality"]["metrics"]["floor_members"] >= 9 for i in registered)
    stats = json.loads((release / "stats.json").read_text())
    assert stats["floor_paths"].get("cohort") == len(registered)
    manifest = [json.loads(line) for line in (release / "manifest.jsonl").read_text().splitlines()]
    assert manifest and {m["floor_path"] for m in manifest} == {"cohort"}
    assert "What each verdict was judged against" in (release / "report.html").read_text()


def test_good_edit_acceptance_does_not_depend_on_the_group_or_direction(focus_import):
    """Attrition that differs by group biases the benchmark the set is built for."""
    made, _, by_row = focus_import
    from tests.flows.import_set import LONDON as london

    groups = {}
    for line in (london / "london_info.csv").read_text().splitlines()[1:]:
        face_id, _, _, eth = line.split(",")
        groups[face_id] = eth
    rates: dict[str, list[int]] = {}
    for r in made.rows:
        if r["label"] != "good":
            continue
        group = groups[r["source"].split("/")[-1].split(".")[0]]
        rates.setdefault(group, []).append(by_row[r["id"]]["status"] == "accepted")
    shares = {g: sum(v) / len(v) for g, v in rates.items()}
    assert len(shares) == 4 and min(shares.values()) >= 0.8, shares


def test_measure_batch_agrees_with_the_import(focus_import, tmp_path):
    """``measure --batch`` of the same table, grouped by source, gives each pair the import's
    verdict and floor; ``measure`` of one pair alone says it had none."""
    made, _, by_row = focus_import
    # four of the sources, every row of each (a cohort is all of a source's candidates)
    sources = sorted({r["source"] for r in made.rows})[:4]
    rows = [r for r in made.rows if r["source"] in sources]
    lines = made.table.read_text().splitlines()
    table = made.folder / "four_sources.csv"
    table.write_text("\n".join([lines[0]] + [line for line in lines[1:] if line.split(",")[1] in sources]) + "\n")
    done = cli("measure", "--batch", str(table), "--spec", str(made.spec), "--json")
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    by_id = {r["id"]: r for r in reports if "id" in r}
    assert len(by_id) == len(rows)
    agree = Counter()
    for row in rows:
        report, item = by_id[row["id"]], by_row[row["id"]]
        assert report["floor_path"] == item["floor_path"] == "cohort"
        agree[report["verdict"] == item["status"]] += 1
    assert agree[False] == 0, agree
    row = made.rows[0]
    lone = cli(
        "measure",
        str(made.folder / row["source"]),
        str(made.folder / row["candidate"]),
        "--spec",
        str(made.spec),
        "--json",
    )
    report = json.loads(lone.stdout)
    assert report["floor_path"] == "none"
