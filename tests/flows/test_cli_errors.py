"""The command line's one error path: a counterfactory error is `error: <message>` and exit 2,
raised before any work when the spec names a missing file, and `publish` blames --version only
for a version that does not parse."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from counterfactory.manifests.ledger import Ledger
from counterfactory.manifests.trials import TRIALS_DIR
from tests.conftest import REPO

CLI = [sys.executable, "-m", "counterfactory"]
PHOTOS = REPO / "assets/photos"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), cwd=REPO, capture_output=True, text=True, timeout=600)


def _demo(tmp_path: Path, **changes) -> Path:
    """demo-face.yaml with absolute sources and ``changes`` set at the top level."""
    spec = yaml.safe_load((REPO / "assets/specs/demo-face.yaml").read_text())
    spec["sources"] = {"photos": str(PHOTOS), "metadata": str(PHOTOS / "metadata.yaml")}
    spec.update(changes)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


@pytest.mark.slow
def test_a_missing_trial_prompt_bank_stops_run_before_any_edit(tmp_path):
    spec = _demo(tmp_path, trials={"protocols": ["2afc", "mcq"], "prompts": "no_such_file"})
    out = tmp_path / "out"
    result = _cli("run", str(spec), "--out", str(out), "--publish", "--allow-incomplete", "--no-progress")
    line = _one_error_line(result)
    assert "field `trials.prompts`" in line and str(TRIALS_DIR / "no_such_file.yaml") in line
    assert "set trials.prompts to one of" in line
    # stopped at load: no run folder, so no ledger, no attempt and no editor call
    assert not out.exists()
    assert "editor calls" not in result.stdout


@pytest.mark.slow
def test_publish_reports_a_version_that_does_not_parse_as_the_version(tmp_path):
    spec = _demo(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    line = _one_error_line(_cli("publish", str(out), "--spec", str(spec), "--version", "not-a-version"))
    assert line == "error: --version 'not-a-version': expected a semantic version such as 1.0.0"


@pytest.mark.slow
def test_publish_does_not_blame_the_version_for_another_value_error(tmp_path):
    # a metadata file that cannot be used is a ValueError too (MetadataError); with a valid
    # --version the message is the metadata's, not a bad version's
    (tmp_path / "meta.yaml").write_text(yaml.safe_dump({"sources": [{"id": "hopper", "path": "grace_hopper.jpg"}]}))
    spec = _demo(tmp_path)
    data = yaml.safe_load(spec.read_text())
    data["sources"]["metadata"] = str(tmp_path / "meta.yaml")
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "out"
    out.mkdir()
    Ledger(f"sqlite:///{out / 'ledger.sqlite'}").close()
    result = _cli("publish", str(out), "--spec", str(spec), "--version", "0.2.0", "--allow-incomplete")
    line = _one_error_line(result)
    assert "--version" not in result.stderr
    assert str(tmp_path / "meta.yaml") in line


def test_review_of_a_folder_that_records_no_spec_is_one_error_line(tmp_path):
    """A folder with no run in it (no ledger, no recorded spec, no release): one error line saying
    so and which folder to pass, exit 2 (issue 44: it pointed at --spec, as if a spec were missing)."""
    from click.testing import CliRunner

    from counterfactory.flows.cli import main

    done = CliRunner().invoke(main, ["review", "add-reviewer", "ana", "--out", str(tmp_path)])
    assert done.exit_code == 2, done.output
    assert isinstance(done.exception, SystemExit) and "Traceback" not in done.output
    assert f"error: {tmp_path}: no run here" in done.output
    assert "counterfactory run SPEC --out DIR" in done.output
