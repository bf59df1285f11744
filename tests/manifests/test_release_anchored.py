"""A real demo release proves its derived files: each tamper below is made on a copy of the
release ``counterfactory run assets/specs/demo-face.yaml --out OUT --publish --allow-incomplete``
seals, and then covered as well as it can be (``release.json``'s table records and its record of
every file's sha256 rewritten, ``checksums.sha256`` regenerated), so only re-deriving what is
derived, the schemas the package ships, the file-type checks and the digest can catch it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from counterfactory.flows.engine.verify import verify_release
from counterfactory.manifests.release import read_jsonl, write_jsonl
from counterfactory.manifests.release_folder import CHECKSUMS
from counterfactory.manifests.release_verify import _written_spec, table_record
from counterfactory.manifests.store import sha256_file
from counterfactory.manifests.trials import trial_summary
from counterfactory.validation.release_derived import as_read_back, derived_stats, floors_by_editor
from counterfactory.validation.report import ReportHeader, report_html
from tests.conftest import REPO

# the session's demo run takes about a minute
pytestmark = pytest.mark.slow


def _copy(release: Path, tmp_path: Path) -> Path:
    target = tmp_path / "releases" / release.parent.name / release.name
    shutil.copytree(release, target)
    for p in [target, *target.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return target


def _reseal(release: Path) -> None:
    """Cover an edit: release.json's tables, trial summary and file record rewritten to match,
    then checksums.sha256 regenerated (what someone with write access to the folder can do)."""
    info = json.loads((release / "release.json").read_text())
    for name in info.get("tables") or {}:
        info["tables"][name] = table_record(release, name)
    info["trials"] = trial_summary(read_jsonl(release / "trials.jsonl"))
    files = sorted(p for p in release.rglob("*") if p.is_file() and not p.is_symlink())
    if "file_sha256" in info:
        info["file_sha256"] = {
            p.relative_to(release).as_posix(): sha256_file(p)
            for p in files
            if p.relative_to(release).as_posix() not in ("release.json", CHECKSUMS)
        }
    (release / "release.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    lines = [f"{sha256_file(p)}  {p.relative_to(release).as_posix()}\n" for p in files if p.name != CHECKSUMS]
    (release / CHECKSUMS).write_text("".join(lines))


def _rederive(release: Path) -> None:
    """Cover an edit of ``items.jsonl`` further: ``stats.json``'s counts and ``report.html`` made
    again from it with this package's own functions (what ``verify`` re-derives them with)."""
    info = json.loads((release / "release.json").read_text())
    header = ReportHeader.of_release(_written_spec(release, []), info)
    stats = json.loads((release / "stats.json").read_text())
    left_out = read_jsonl(release / "left_out.jsonl")
    items = read_jsonl(release / "items.jsonl")
    derived = derived_stats(
        as_read_back(items, header.axes),
        failed_sources=any(r.get("what") == "source" and r.get("status") == "failed" for r in left_out),
        short_strata=any(r.get("what") == "stratum" for r in left_out),
        floors=floors_by_editor(header.editor_names, header.backend, stats.get("noise_floor") or {}),
    )
    stats.update(json.loads(json.dumps(derived, default=str)))
    (release / "stats.json").write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n")
    (release / "report.html").write_text(report_html(header, items, stats))


def _problems(release: Path) -> str:
    _reseal(release)
    problems = verify_release(release)
    text = "\n".join(problems)
    assert problems, "the tampered release verified"
    assert "checksum mismatch" not in text and "not listed" not in text, text
    return text


def _edit(path: Path, change) -> None:
    rows = read_jsonl(path)
    change(rows)
    write_jsonl(path, rows)


def test_the_demo_releases_verify_and_publishing_printed_their_digest(demo_run):
    for release, printed in ((demo_run.release, demo_run.run_stdout), (demo_run.republished, demo_run.publish_stdout)):
        assert verify_release(release) == []
        digest = hashlib.sha256((release / "release.json").read_bytes()).hexdigest()
        assert f"digest: {digest}" in printed
        info = json.loads((release / "release.json").read_text())
        # every file but release.json and checksums.sha256, derived ones included
        files = {p.relative_to(release).as_posix() for p in release.rglob("*") if p.is_file()}
        assert set(info["file_sha256"]) == files - {"release.json", CHECKSUMS}
        assert {"stats.json", "report.html", "items.jsonl", "left_out.jsonl", "trials.jsonl"} <= set(
            info["file_sha256"]
        )
        assert any(name.startswith("schemas/") for name in info["file_sha256"])
        # the demo spec publishes FOCUS's 2AFC and MCQ over its grid
        assert {r["protocol"] for r in read_jsonl(release / "trials.jsonl")} == {"2afc", "mcq"}


def test_stats_json_edited_accepted_18_to_0(demo_run, tmp_path):
    release = _copy(demo_run.release, tmp_path)
    stats = json.loads((release / "stats.json").read_text())
    accepted = stats["items"]["accepted"]
    assert accepted > 0
    stats["items"]["accepted"] = 0
    (release / "stats.json").write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n")
    expected = f"stats.json: items is not what items.jsonl gives (accepted is 0, items.jsonl has {accepted})"
    assert expected in _problems(release)


def test_report_html_edited(demo_run, tmp_path):
    release = _copy(demo_run.release, tmp_path)
    report = release / "report.html"
    text = report.read_text()
    assert "<h2>Items by status</h2>" in text
    report.write_text(text.replace("<h2>Items by status</h2>", "<h2>Items by status (all accepted)</h2>"))
    assert "report.html: not the report this package derives" in _problems(release)


def test_report_html_given_a_script(demo_run, tmp_path):
    release = _copy(demo_run.release, tmp_path)
    report = release / "report.html"
    report.write_text(report.read_text().replace("</body>", "<script>fetch('https://example.invalid')</script></body>"))
    assert "report.html: not the report this package derives" in _problems(release)


def test_a_loosened_trial_schema(demo_run, tmp_path):
    release = _copy(demo_run.release, tmp_path)
    schema_file = release / "schemas" / "trial.schema.json"
    schema = json.loads(schema_file.read_text())
    schema.pop("required", None)
    schema["additionalProperties"] = True
    schema_file.write_text(json.dumps(schema, indent=2) + "\n")
    assert "schemas/trial.schema.json: not the schema counterfactory" in _problems(release)


def test_an_accepted_row_dropped_from_items_jsonl(demo_run, tmp_path):
    release = _copy(demo_run.release, tmp_path)
    dropped = read_jsonl(release / "items.jsonl")[0]
    assert dropped["status"] == "accepted"
    _edit(release / "items.jsonl", lambda rows: rows.pop(0))
    text = _problems(release)
    assert f"items.jsonl: no accepted row for manifest item {dropped['item_id']}" in text
    assert "stats.json: items is not what items.jsonl gives" in text


def test_a_row_waiting_for_review_dropped_with_its_image_and_stats_rederived(demo_run, tmp_path):
    release = _copy(demo_run.release, tmp_path)
    rows = read_jsonl(release / "items.jsonl")
    dropped = next(r for r in rows if r["status"] == "needs_review")
    (release / dropped["image"]["path"]).unlink()
    write_jsonl(release / "items.jsonl", [r for r in rows if r is not dropped])
    _rederive(release)
    text = _problems(release)
    assert "stats.json" not in text and "report.html" not in text, text
    assert f"left_out.jsonl: cell {dropped['cell_id']} (needs_review) is not an unaccepted row of items.jsonl" in text


def test_a_status_edited_against_its_review_record_and_stats_rederived(demo_run, tmp_path):
    release = _copy(demo_run.release, tmp_path)
    rows = read_jsonl(release / "items.jsonl")
    n, edited = next((n, r) for n, r in enumerate(rows, start=1) if r["status"] == "needs_review")
    edited["status"] = "rejected"  # an item waiting for a person, passed off as refused
    write_jsonl(release / "items.jsonl", rows)
    _rederive(release)
    text = _problems(release)
    assert (
        f"items.jsonl row {n} ({edited['cell_id']}): status is 'rejected', but its review record gives 'needs_review'"
        in text
    )


def test_a_trial_dropped(demo_run, tmp_path):
    release = _copy(demo_run.release, tmp_path)
    _edit(release / "trials.jsonl", lambda rows: rows.pop(3))
    assert "trials.jsonl: 1 trial(s) the manifest gives are missing" in _problems(release)


def test_a_whole_2afc_group_dropped(demo_run, tmp_path):
    release = _copy(demo_run.release, tmp_path)
    rows = read_jsonl(release / "trials.jsonl")
    template = next(r["group"]["template_id"] for r in rows if r["protocol"] == "2afc")
    group = [r for r in rows if r["protocol"] == "2afc" and r["group"]["template_id"] == template]
    assert len(group) >= 2
    write_jsonl(release / "trials.jsonl", [r for r in rows if r not in group])
    assert f"trials.jsonl: {len(group)} trial(s) the manifest gives are missing" in _problems(release)


def test_a_hard_link_to_a_file_outside_the_release(demo_run, tmp_path):
    release = _copy(demo_run.release, tmp_path)
    inside = next((release / "images").iterdir())
    outside = tmp_path / "outside.png"
    shutil.copyfile(inside, outside)
    inside.unlink()
    os.link(outside, inside)  # the same bytes, but whoever owns outside.png can change them
    name = inside.relative_to(release).as_posix()
    assert f"{name}: hard-linked (2 links)" in _problems(release)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    # AF_UNIX paths are short: bind by a relative name from inside the folder
    here = os.getcwd()
    os.chdir(path.parent)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path.name)
        sock.close()
    finally:
        os.chdir(here)


def _folder(path: Path) -> None:
    path.mkdir()


@pytest.mark.parametrize(
    ("make", "said"),
    [(_fifo, "a FIFO, not a regular file"), (_socket, "a socket, not a regular file"), (_folder, "an empty folder")],
    ids=["fifo", "socket", "empty-folder"],
)
def test_a_special_file_or_empty_folder_under_images(demo_run, tmp_path, make, said):
    release = _copy(demo_run.release, tmp_path)
    make(release / "images" / "extra")
    # verify must answer (a FIFO never blocks it) and name the entry
    assert f"images/extra: {said}" in _problems(release)


def _verify(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "counterfactory", "verify", *args], capture_output=True, text=True, cwd=REPO, timeout=300
    )


def test_verify_expect_checks_the_digest_recorded_elsewhere(demo_run, tmp_path):
    digest = hashlib.sha256((demo_run.release / "release.json").read_bytes()).hexdigest()
    ok = _verify(str(demo_run.release), "--expect", digest)
    assert ok.returncode == 0 and f"digest: {digest} (as expected)" in ok.stdout, ok.stderr
    # a copy made consistent after an edit no longer has the recorded digest
    release = _copy(demo_run.release, tmp_path)
    _edit(release / "left_out.jsonl", lambda rows: rows.clear())
    _reseal(release)
    bad = _verify(str(release), "--expect", digest)
    assert bad.returncode == 1
    assert "release.json: the release's digest (sha256 of release.json) is " in bad.stderr
    assert f"not the expected {digest}" in bad.stderr
    wrong = _verify(str(demo_run.release), "--expect", "not-a-digest")
    assert wrong.returncode == 2 and wrong.stderr.strip().splitlines() == [
        "error: --expect 'not-a-digest': not a sha256 (64 hex digits); give the digest publish printed"
    ]


def test_derived_files_deleted_and_unrecorded(demo_run, tmp_path):
    release = _copy(demo_run.release, tmp_path)
    (release / "stats.json").unlink()
    (release / "report.html").unlink()
    text = _problems(release)
    assert "stats.json: missing; every published release holds it" in text
    assert "report.html: missing; every published release holds it" in text


def test_a_contact_sheet_edited(demo_run, tmp_path):
    release = _copy(demo_run.release, tmp_path)
    sheet = sorted((release / "contact_sheets").glob("*.jpg"))[0]
    from PIL import Image

    with Image.open(sheet) as im:
        edited = im.convert("RGB")
    edited.paste((46, 160, 67), (0, 0, 60, 60))  # a frame repainted the accepted green
    edited.save(sheet, quality=88)
    relative = f"contact_sheets/{sheet.name}"
    assert any(
        p.startswith(f"{relative}: not the contact sheet this package derives") for p in _problems(release).splitlines()
    )


def test_stats_json_given_a_key_its_schema_does_not_know(demo_run, tmp_path):
    release = _copy(demo_run.release, tmp_path)
    stats = json.loads((release / "stats.json").read_text())
    stats["certified"] = "bias-free"
    (release / "stats.json").write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n")
    assert any(
        "('certified' was unexpected)" in p and p.startswith("stats.json") for p in _problems(release).splitlines()
    )
