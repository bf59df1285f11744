"""Releases are sealed whole, never overwritten, and verifiable."""

from __future__ import annotations

import pytest

from counterfactory.manifests.release import ReleaseExistsError, ReleaseStage, verify_release, write_jsonl


def _stage(tmp_path, rows, version="1.0.0"):
    stage = ReleaseStage(tmp_path / "releases", "study", version)
    write_jsonl(stage.dir / "manifest.jsonl", rows)
    (stage.dir / "images").mkdir()
    (stage.dir / "images" / "a.png").write_bytes(b"\x89PNG fake")
    return stage


def test_seal_moves_whole_folder_and_checksums_verify(tmp_path):
    sealed = _stage(tmp_path, [{"item_id": "1"}]).seal()
    assert sealed.created and sealed.path == tmp_path / "releases" / "study" / "1.0.0"
    assert verify_release(sealed.path) == []
    assert not [p for p in sealed.path.parent.iterdir() if p.name.startswith(".")]


def test_same_manifest_again_is_a_no_op_and_a_different_one_is_refused(tmp_path):
    _stage(tmp_path, [{"item_id": "1"}]).seal()
    again = _stage(tmp_path, [{"item_id": "1"}]).seal()
    assert not again.created
    with pytest.raises(ReleaseExistsError, match="raise release.version"):
        _stage(tmp_path, [{"item_id": "2"}]).seal()
    assert 'item_id":"1' in (tmp_path / "releases/study/1.0.0/manifest.jsonl").read_text()


def test_verify_finds_tampered_missing_and_unlisted_files(tmp_path):
    path = _stage(tmp_path, [{"item_id": "1"}]).seal().path
    (path / "images" / "a.png").write_bytes(b"changed")
    (path / "extra.txt").write_text("x")
    (path / "manifest.jsonl").unlink()
    problems = "\n".join(verify_release(path))
    assert "images/a.png: checksum mismatch" in problems
    assert "manifest.jsonl: listed but missing" in problems
    assert "extra.txt: not listed" in problems
