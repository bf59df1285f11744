"""Releases are sealed whole, own their bytes, are readable by others, and verify catches damage."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys

import pytest

from counterfactory.manifests.release import (
    ReleaseExistsError,
    ReleaseIntegrityError,
    ReleaseStage,
    existing_release_conflict,
    write_json,
    write_jsonl,
)
from counterfactory.manifests.release_folder import CHECKSUMS
from counterfactory.manifests.release_verify import verify_release
from counterfactory.manifests.store import sha256_file

PNG = b"\x89PNG fake image bytes"
SHA = hashlib.sha256(PNG).hexdigest()


def _row(sha: str = SHA, item: str = "1" * 64) -> dict:
    return {"item_id": item, "image": {"sha256": sha, "path": f"images/{sha}.png"}}


def _stage(tmp_path, rows=None, version="1.0.0", blob=None):
    """A stage with one image copied from a 'store' file, like the publisher does."""
    store = tmp_path / "store"
    store.mkdir(exist_ok=True)
    blob = blob or store / f"{SHA}.png"
    if not blob.exists():
        blob.write_bytes(PNG)
    stage = ReleaseStage(tmp_path / "releases", "study", version)
    try:
        stage.add_file(f"images/{SHA}.png", blob, sha256=SHA)
    except BaseException:
        stage.discard()
        raise
    write_jsonl(stage.dir / "manifest.jsonl", rows if rows is not None else [_row()])
    return stage


def _sealed(tmp_path, **kwargs):
    return _stage(tmp_path, **kwargs).seal().path


def _problems(path, **kwargs) -> str:
    return "\n".join(verify_release(path, check_schemas=False, **kwargs))


def test_seal_moves_whole_folder_and_checksums_verify(tmp_path):
    sealed = _stage(tmp_path).seal()
    assert sealed.created and sealed.path == tmp_path / "releases" / "study" / "1.0.0"
    assert verify_release(sealed.path, check_schemas=False) == []
    assert not [p for p in sealed.path.parent.iterdir() if p.name.startswith(".")]


def test_same_manifest_again_is_a_no_op_and_a_different_one_is_refused(tmp_path):
    _stage(tmp_path).seal()
    again = _stage(tmp_path).seal()
    assert not again.created
    with pytest.raises(ReleaseExistsError, match="raise release.version"):
        _stage(tmp_path, rows=[_row(item="2" * 64)]).seal()
    assert "1" * 64 in (tmp_path / "releases/study/1.0.0/manifest.jsonl").read_text()


def test_release_owns_its_bytes_an_edited_store_blob_cannot_reach_it(tmp_path):
    """Issue 8: images were hard links into the store; editing the store changed the release,
    and a later release built from the damaged store still verified."""
    path = _sealed(tmp_path)
    image = path / "images" / f"{SHA}.png"
    assert os.stat(image).st_nlink == 1  # a copy (or reflink), never a second name of the store file
    blob = tmp_path / "store" / f"{SHA}.png"
    with open(blob, "r+b") as f:  # edit in place, as a user's tool would
        f.write(b"X")
    assert image.read_bytes() == PNG
    with pytest.raises(ReleaseIntegrityError, match=f"{blob}.*changed after it was stored"):
        _stage(tmp_path, version="1.0.1")
    assert not (tmp_path / "releases/study/1.0.1").exists()
    assert not [p for p in (tmp_path / "releases/study").iterdir() if p.name.startswith(".")]
    assert verify_release(path, check_schemas=False) == []


def test_sealed_files_are_readable_by_another_user(tmp_path):
    """Issue 8: release files were 0600 in a 0700 folder (mkstemp/mkdtemp modes)."""
    old = os.umask(0o077)
    try:
        stage = _stage(tmp_path)
        write_json(stage.dir / "stats.json", {"n": 1})
        path = stage.seal().path
    finally:
        os.umask(old)
    for p in [path, *path.rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o755 if p.is_dir() else 0o644), (p, oct(mode))


def test_a_staging_folder_left_by_a_killed_process_is_removed(tmp_path):
    """Issue 8: a kill during publish left `.1.0.0.staging-*` folders behind for good."""
    code = (
        "import os, signal, sys; from pathlib import Path\n"
        "from counterfactory.manifests.release import ReleaseStage\n"
        f"s = ReleaseStage(Path({str(tmp_path / 'releases')!r}), 'study', '1.0.0')\n"
        "(s.dir / 'half-written').write_bytes(b'x' * 1000)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", code], timeout=120)
    assert killed.returncode == -9
    leftovers = [p for p in (tmp_path / "releases/study").iterdir() if ".staging-" in p.name]
    assert len(leftovers) == 1
    _stage(tmp_path).seal()
    assert not leftovers[0].exists()
    assert [p.name for p in (tmp_path / "releases/study").iterdir()] == ["1.0.0"]


def test_a_live_writers_staging_folder_is_left_alone(tmp_path):
    first = ReleaseStage(tmp_path / "releases", "study", "1.0.0")
    ReleaseStage(tmp_path / "releases", "study", "1.0.1").discard()
    assert first.dir.is_dir()
    first.discard()


def test_version_conflict_names_the_fix(tmp_path):
    stage = _stage(tmp_path)
    write_json(stage.dir / "release.json", {"spec_sha256": "a" * 64})
    stage.seal()
    releases = tmp_path / "releases"
    assert existing_release_conflict(releases, "study", "1.0.0", "a" * 64) is None
    assert existing_release_conflict(releases, "study", "2.0.0", "b" * 64) is None
    message = existing_release_conflict(releases, "study", "1.0.0", "b" * 64)
    assert "already exists" in message and "raise release.version" in message


def test_verify_finds_tampered_missing_and_unlisted_files(tmp_path):
    path = _sealed(tmp_path)
    (path / "images" / f"{SHA}.png").write_bytes(b"changed")
    (path / "extra.txt").write_text("x")
    problems = _problems(path)
    assert f"images/{SHA}.png: checksum mismatch" in problems
    assert "extra.txt: not listed" in problems
    assert "does not hash to the sha256 the row names" in problems


def test_verify_fails_when_manifest_and_its_checksum_line_are_deleted(tmp_path):
    """Issue 8: deleting both passed verify."""
    path = _sealed(tmp_path)
    (path / "manifest.jsonl").unlink()
    listing = path / CHECKSUMS
    listing.write_text("".join(line for line in listing.read_text().splitlines(True) if "manifest" not in line))
    assert "manifest.jsonl: not listed" in _problems(path)


def test_verify_fails_on_an_empty_checksum_file(tmp_path):
    path = _sealed(tmp_path)
    (path / CHECKSUMS).write_bytes(b"")
    assert f"{CHECKSUMS}: empty" in _problems(path)


def test_verify_reports_junk_and_non_utf8_lines_without_crashing(tmp_path):
    path = _sealed(tmp_path)
    with open(path / CHECKSUMS, "ab") as f:
        f.write(b"this is not a checksum line\n\xff\xfe\xfa  images/x.png\n")
    problems = _problems(path)
    assert "expected '<sha256>  <path>'" in problems and "not UTF-8" in problems


def test_verify_never_follows_paths_outside_the_release(tmp_path):
    """Issue 8: `../` lines were followed outside the release."""
    path = _sealed(tmp_path)
    outside = tmp_path / "secret.txt"
    outside.write_text("outside")
    digest = sha256_file(outside)
    with open(path / CHECKSUMS, "a") as f:
        f.write(f"{digest}  ../../../secret.txt\n{digest}  {outside}\n")
    problems = _problems(path)
    assert "'../../../secret.txt' is not a path inside the release" in problems
    assert f"{str(outside)!r} is not a path inside the release" in problems


def test_verify_checks_manifest_sha256_against_the_image_even_when_checksums_are_rewritten(tmp_path):
    """Issue 8: verify re-hashed files against checksums.sha256 only, so an image replaced
    together with its checksum line passed although the manifest names other bytes."""
    path = _sealed(tmp_path)
    image = path / "images" / f"{SHA}.png"
    image.write_bytes(b"another image")
    listing = path / CHECKSUMS
    listing.write_text(listing.read_text().replace(SHA + "  ", sha256_file(image) + "  ", 1))
    problems = _problems(path)
    assert "checksum mismatch" not in problems
    assert f"images/{SHA}.png does not hash to the sha256 the row names" in problems


def test_verify_finds_a_schema_violation(tmp_path):
    path = _sealed(tmp_path)
    problems = "\n".join(verify_release(path))
    assert "manifest.jsonl line 1" in problems and "schema manifest.schema.json" in problems
    rows = [json.loads(line) for line in (path / "manifest.jsonl").read_text().splitlines()]
    assert rows[0]["item_id"] == "1" * 64
