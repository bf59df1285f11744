"""Derived files fail ``verify`` when edited, even after the checksums are regenerated (issue 44):
a contact sheet is derived again from ``items.jsonl`` and the images, and ``stats.json`` and
``release.json`` refuse keys their schemas do not know. And what a newcomer meets: ``verify`` on
a run folder names the releases inside it in one line; ``review serve`` on a folder without a
run says so."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

from counterfactory.flows.cli import main
from counterfactory.manifests.release import read_jsonl
from counterfactory.manifests.release_verify import verify_release
from counterfactory.validation.report import contact_sheet_jpeg
from tests.manifests.hub_release import make_release
from tests.manifests.test_verify_meaning import _rechecksum, _writable


@pytest.fixture(scope="module")
def with_sheets(tmp_path_factory) -> Path:
    """A sealed release whose contact sheets were written as publish writes them."""
    root = tmp_path_factory.mktemp("sheets")
    release = make_release(root)
    _writable(release)
    (release / "contact_sheets").mkdir()
    by_template: dict[str, list[dict]] = {}
    for row in read_jsonl(release / "items.jsonl"):
        by_template.setdefault(row["template_id"], []).append(row)
    for template_id, rows in by_template.items():
        jpeg = contact_sheet_jpeg(release, template_id, rows, ["race", "gender"])
        (release / "contact_sheets" / f"{template_id}.jpg").write_bytes(jpeg)
    _rechecksum(release)
    assert verify_release(release) == []
    return release


def _copy(release: Path, tmp_path: Path) -> Path:
    target = tmp_path / "releases" / "study" / "1.0.0"
    shutil.copytree(release, target)
    _writable(target)
    return target


def test_an_edited_contact_sheet_fails_verify_after_the_checksums_are_regenerated(with_sheets, tmp_path):
    release = _copy(with_sheets, tmp_path)
    sheet = release / "contact_sheets" / "astronaut.jpg"
    with Image.open(sheet) as im:
        edited = im.convert("RGB")
    # a rejected tile's red frame painted green, as someone hiding a rejection would
    edited.paste((46, 160, 67), (0, 0, 40, 40))
    buffer = io.BytesIO()
    edited.save(buffer, format="JPEG", quality=88)
    sheet.write_bytes(buffer.getvalue())
    _rechecksum(release)
    problems = verify_release(release)
    assert any(p.startswith("contact_sheets/astronaut.jpg: not the contact sheet") for p in problems), problems


def test_a_missing_contact_sheet_fails_verify(with_sheets, tmp_path):
    release = _copy(with_sheets, tmp_path)
    (release / "contact_sheets" / "grace_hopper.jpg").unlink()
    _rechecksum(release)
    problems = verify_release(release)
    assert (
        "contact_sheets/grace_hopper.jpg: missing; a release holds one contact sheet per template of items.jsonl"
        in (problems)
    ), problems


@pytest.mark.parametrize("name", ["stats.json", "release.json"])
def test_an_extra_key_in_a_json_file_fails_verify_after_the_checksums_are_regenerated(with_sheets, tmp_path, name):
    release = _copy(with_sheets, tmp_path)
    data = json.loads((release / name).read_text())
    data["note"] = "certified bias-free"
    (release / name).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    _rechecksum(release)
    problems = verify_release(release)
    assert any(
        p.startswith(name) and "Additional properties are not allowed ('note' was unexpected)" in p for p in problems
    ), problems


def _one_error(*args) -> tuple[str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0], result.output


def test_verify_on_a_run_folder_names_the_releases_inside_it_in_one_line(with_sheets):
    run_folder = with_sheets.parents[2]
    line, said = _one_error("verify", run_folder)
    assert str(with_sheets) in line and f"counterfactory verify {with_sheets}" in line
    assert len(said.splitlines()) == 1, said
    line, _ = _one_error("verify", run_folder / "releases")
    assert str(with_sheets) in line


def test_review_serve_on_a_folder_without_a_run_says_so(tmp_path):
    line, _ = _one_error("review", "serve", tmp_path)
    assert "no run here" in line and "--spec" not in line
