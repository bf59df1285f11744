"""One verdict for one edit (issue 34): what a run decided about an editor's output is what
``measure`` and ``measure --batch`` decide about the same files with the same floor.

It starts from the README's demo run (``counterfactory run assets/specs/demo-face.yaml``): the
sources it read, each editor output and each source's noise-floor output from the run's own
store, as a user auditing the run would take them. ``measure --batch`` of that table (with its
``floor`` column) and ``measure SOURCE CANDIDATE --floor FLOOR`` of one pair must give every
candidate the run's verdict, reasons and floor path. (An import of such a table agrees with
``measure --batch``: ``tests/flows/test_import.py::test_measure_batch_on_the_same_table``.)
"""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.flows.unchanged import SCENARIOS, cli_env

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _stored(out: Path, sha: str) -> Path:
    (found,) = (out / "store" / sha[:2]).glob(f"{sha}.*")
    return found


def _judged(out: Path) -> list[dict]:
    """Every judged editor output of the run: its source file, the output and the source's floor
    output as the run stored them, and the run's verdict and reasons (from its ledger)."""
    with sqlite3.connect(f"file:{out / 'ledger.sqlite'}?mode=ro", uri=True) as db:
        sources = dict(db.execute("select source_id, path from sources"))
        floors = {
            cell.split("|", 1)[0]: sha
            for cell, sha in db.execute(
                "select cell_id, output_sha256 from attempts where cell_id like '%|floor' and status = 'ok'"
            )
        }
        rows = db.execute(
            "select c.attempt_id, c.cell_id, c.verdict, c.reasons, a.output_sha256 "
            "from candidates c join attempts a using (attempt_id) where a.output_sha256 is not null"
        ).fetchall()
    return [
        {
            "id": attempt[:16],
            "cell_id": cell,
            "source": Path(sources[cell.split("|", 1)[0]]),
            "candidate": _stored(out, output),
            "floor": _stored(out, floors[cell.split("|", 1)[0]]),
            "verdict": verdict,
            "reasons": sorted(json.loads(reasons)),
        }
        for attempt, cell, verdict, reasons, output in rows
        if not cell.endswith("|floor")
    ]


def _measure(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "counterfactory", "measure", *args],
        cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def test_measure_gives_the_runs_verdict_with_the_runs_floor(demo_run, tmp_path):
    judged = _judged(demo_run.out)
    assert len(judged) >= 18  # 18 cells, each judged at least once
    items = {i["cell_id"]: i for i in map(json.loads, (demo_run.release / "items.jsonl").read_text().splitlines())}
    # the files, copied beside the table as an auditor would (a table reads only its own folder)
    audit = tmp_path / "audit"
    (audit / "files").mkdir(parents=True)
    with (audit / "pairs.csv").open("w", newline="") as f:
        table = csv.DictWriter(f, ["id", "source", "candidate", "floor"])
        table.writeheader()
        for row in judged:
            names = {}
            for column in ("source", "candidate", "floor"):
                name = f"files/{row[column].name}"
                shutil.copyfile(row[column], audit / name)
                names[column] = name
            table.writerow({"id": row["id"], **names})
    spec = str(SCENARIOS["demo-face"].spec)
    done = _measure("--batch", str(audit / "pairs.csv"), "--spec", spec, "--json")
    reports = {r["id"]: r for r in map(json.loads, done.stdout.splitlines()) if "id" in r}
    assert set(reports) == {row["id"] for row in judged}
    for row in judged:
        report = reports[row["id"]]
        said = (report["verdict"], sorted(report["reasons"]), report["floor_path"])
        assert said == (row["verdict"], row["reasons"], "request"), row["cell_id"]
        item = items.get(row["cell_id"])
        if item is not None and item["attempts"] == 1:  # the release holds each cell's last attempt
            assert item["floor_path"] == "request", row["cell_id"]
    # one pair alone, with the same floor file: the same verdict again
    row = next((r for r in judged if r["verdict"] == "needs_review"), judged[0])
    alone = json.loads(
        _measure(
            str(audit / "files" / row["source"].name),
            str(audit / "files" / row["candidate"].name),
            "--floor",
            str(audit / "files" / row["floor"].name),
            "--spec",
            spec,
            "--json",
        ).stdout
    )
    assert (alone["verdict"], sorted(alone["reasons"]), alone["floor_path"]) == (
        row["verdict"],
        row["reasons"],
        "request",
    )
    # without the floor, the same pair is judged on the no-floor path and says so
    bare = json.loads(
        _measure(
            str(audit / "files" / row["source"].name),
            str(audit / "files" / row["candidate"].name),
            "--spec",
            spec,
            "--json",
        ).stdout
    )
    assert bare["floor_path"] == "none" and bare["noise_floor"] is None
