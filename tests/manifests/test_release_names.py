"""A release name or version is matched whole (issue 44): one ending in a newline, or in any
trailing junk, is refused by the spec, by ``publish --version``, by the stage that seals a
release, and by ``verify`` on a release whose ``release.json`` was edited to hold one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from counterfactory.flows.cli import main
from counterfactory.manifests.release import ReleaseIntegrityError, ReleaseStage
from counterfactory.manifests.release_verify import verify_release
from tests.conftest import REPO
from tests.manifests.hub_release import make_release
from tests.manifests.test_verify_meaning import _rechecksum, _writable

PHOTOS = REPO / "assets/photos"


def _spec(tmp_path: Path, **release) -> Path:
    spec = yaml.safe_load((REPO / "assets/specs/demo-face.yaml").read_text())
    spec["sources"] = {"photos": str(PHOTOS), "metadata": str(PHOTOS / "metadata.yaml")}
    spec["release"].update(release)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _one_error(*args: str) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return result.stderr


@pytest.mark.parametrize(
    ("field", "value"),
    [("version", "1.0.0\n"), ("version", "1.0.0\nx"), ("name", "study\n"), ("name", "study\n../x")],
)
def test_a_spec_whose_release_name_or_version_ends_in_a_newline_is_refused_at_load(tmp_path, field, value):
    spec = _spec(tmp_path, **{field: value})
    out = tmp_path / "out"
    said = _one_error("run", spec, "--out", out, "--no-progress")
    assert f"release.{field}" in said and "the spec is not valid" in said
    assert not out.exists()


@pytest.mark.parametrize(("name", "version"), [("study", "1.0.0\n"), ("study\n", "1.0.0"), ("study", "1.0.0 ")])
def test_the_stage_refuses_a_name_or_version_with_trailing_junk(tmp_path, name, version):
    with pytest.raises(ReleaseIntegrityError, match="matched whole"):
        ReleaseStage(tmp_path / "releases", name, version)
    assert not (tmp_path / "releases").exists() or not any((tmp_path / "releases").rglob("*"))


@pytest.fixture(scope="module")
def sealed(tmp_path_factory) -> Path:
    return make_release(tmp_path_factory.mktemp("names"))


@pytest.mark.parametrize(("field", "value"), [("version", "1.0.0\n"), ("name", "study\n")])
def test_verify_refuses_a_release_json_whose_name_or_version_ends_in_a_newline(sealed, tmp_path, field, value):
    # a folder named with the newline, as the old code made one, and its checksums regenerated
    name, version = ("study\n", "1.0.0") if field == "name" else ("study", "1.0.0\n")
    release = tmp_path / "releases" / name / version
    shutil.copytree(sealed, release)
    _writable(release)
    info = json.loads((release / "release.json").read_text())
    info[field] = value
    (release / "release.json").write_text(json.dumps(info))
    _rechecksum(release)
    problems = verify_release(release)
    assert any(f"release.json: {field} {value!r} is not a" in p for p in problems), problems
