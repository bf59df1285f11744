"""``verify`` checks what a release's files mean, not only their bytes.

Each damage below is made on a copy of a sealed release and ``checksums.sha256`` is then
regenerated (as someone covering an edit would), so the checksums pass and only the meaning
checks can see it; each must fail with a message that names the file and the row.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from counterfactory.flows.engine.verify import verify_release
from counterfactory.manifests.release import read_jsonl, record_files, write_jsonl
from counterfactory.manifests.release_folder import CHECKSUMS
from counterfactory.manifests.release_verify import table_record
from counterfactory.manifests.store import sha256_file
from tests.manifests.hub_release import make_release


def _rechecksum(release: Path) -> None:
    """What someone covering an edit does: release.json's record of every file's sha256 and
    checksums.sha256 written again to match."""
    info = json.loads((release / "release.json").read_text())
    record_files(release, info["name"], info["version"])
    lines = [
        f"{sha256_file(p)}  {p.relative_to(release).as_posix()}\n"
        for p in sorted(release.rglob("*"))
        if p.is_file() and p.name != CHECKSUMS
    ]
    (release / CHECKSUMS).write_text("".join(lines))


def _writable(folder: Path) -> None:
    for p in [folder, *folder.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


@pytest.fixture(scope="module")
def sealed(tmp_path_factory) -> Path:
    """A sealed release with a manifest.parquet written by the publisher's own table code."""
    from counterfactory.flows.engine.release import manifest_table

    root = tmp_path_factory.mktemp("meaning")
    release = make_release(root)
    _writable(release)
    rows = read_jsonl(release / "manifest.jsonl")
    pq.write_table(manifest_table(rows, ["race", "gender"]), release / "manifest.parquet")
    _rechecksum(release)
    assert verify_release(release) == []
    return release


@pytest.fixture
def copy(sealed, tmp_path) -> Path:
    target = tmp_path / "releases" / "study" / "1.0.0"
    shutil.copytree(sealed, target)
    _writable(target)
    return target


def _damaged(release: Path) -> str:
    _rechecksum(release)
    problems = verify_release(release)
    text = "\n".join(problems)
    assert problems and "checksum mismatch" not in text and "not listed" not in text, text
    return text


def _edit(path: Path, change) -> None:
    rows = read_jsonl(path)
    change(rows)
    write_jsonl(path, rows)


def test_the_undamaged_copy_verifies(copy):
    assert verify_release(copy) == []


def test_a_duplicated_manifest_row(copy):
    _edit(copy / "manifest.jsonl", lambda rows: rows.append(rows[0]))
    text = _damaged(copy)
    first = read_jsonl(copy / "manifest.jsonl")[0]["item_id"]
    assert f"manifest.jsonl line 3: item_id {first} repeats line 1" in text


def test_a_duplicated_trial_row(copy):
    _edit(copy / "trials.jsonl", lambda rows: rows.insert(1, rows[0]))
    assert "trials.jsonl line 2: trial_id" in _damaged(copy) and "repeats line 1" in _damaged(copy)


def test_a_trial_pointing_to_another_image(copy):
    other = read_jsonl(copy / "manifest.jsonl")[1]

    def point(rows):
        rows[0]["images"] = [other["item_id"]]

    _edit(copy / "trials.jsonl", point)
    text = _damaged(copy)
    assert "trials.jsonl line 1: image_paths" in text and "are not the paths of its images" in text
    assert "trials.jsonl line 1: trial_id" in text


def test_a_trial_pointing_to_a_missing_image(copy):
    def point(rows):
        rows[0]["images"] = ["0" * 16]

    _edit(copy / "trials.jsonl", point)
    assert f"trials.jsonl line 1: image {'0' * 16} is not an item of manifest.jsonl or derived.jsonl" in _damaged(copy)


def test_a_deleted_trial(copy):
    n = len(read_jsonl(copy / "trials.jsonl"))
    _edit(copy / "trials.jsonl", lambda rows: rows.pop())
    assert f"release.json: tables.trials.jsonl.rows is {n} but trials.jsonl has {n - 1} rows" in _damaged(copy)


def test_an_edited_trial(copy):
    def reword(rows):
        rows[2]["prompt"] = rows[2]["prompt"] + " Explain."

    _edit(copy / "trials.jsonl", reword)
    text = _damaged(copy)
    assert "trials.jsonl line 3: trial_id" in text and "is not the hash of the row's query" in text


def test_an_edited_trial_field_outside_the_key(copy):
    def reformat(rows):
        rows[0]["parser_hint"] = "anything"

    _edit(copy / "trials.jsonl", reformat)
    assert "release.json: tables.trials.jsonl.sha256 is not trials.jsonl's sha256" in _damaged(copy)


def test_release_json_disagreeing_with_its_folder(copy):
    info = json.loads((copy / "release.json").read_text())
    info["version"] = "9.9.9"
    info["files"] = {"missing.jsonl": "a file it does not hold"}
    (copy / "release.json").write_text(json.dumps(info))
    text = _damaged(copy)
    assert "release.json: version '9.9.9' but the folder is 1.0.0" in text
    assert "release.json: files lists missing.jsonl, which the release does not hold" in text


def test_release_json_disagreeing_with_spec_yaml(copy):
    (copy / "spec.yaml").write_text((copy / "spec.yaml").read_text() + "# edited\n")
    assert "release.json: spec_sha256" in _damaged(copy) and "is not spec.yaml's sha256" in _damaged(copy)


def test_parquet_disagreeing_with_jsonl(copy):
    table = pq.read_table(copy / "manifest.parquet")
    status = table.column("status").to_pylist()
    status[1] = "rejected"
    table = table.set_column(table.column_names.index("status"), "status", [status])
    pq.write_table(table, copy / "manifest.parquet")
    assert "manifest.parquet row 2: status is 'rejected', manifest.jsonl line 2 has 'accepted'" in _damaged(copy)


def test_a_content_addressed_file_not_named_by_its_sha256(copy):
    row = read_jsonl(copy / "manifest.jsonl")[0]
    old = row["image"]["path"]
    wrong = "f" * 64
    (copy / old).rename(copy / f"images/{wrong}.png")
    for name in ("manifest.jsonl", "items.jsonl"):

        def rename(rows):
            for r in rows:
                if (r.get("image") or {}).get("path") == old:
                    r["image"] = {"sha256": wrong, "path": f"images/{wrong}.png"}

        _edit(copy / name, rename)
    text = _damaged(copy)
    assert f"images/{wrong}.png: named by sha256 ffffffffffff... but its content hashes to another" in text


def test_a_stray_file(copy):
    (copy / "notes.txt").write_text("x")
    data = b"a stray image"
    stray = f"images/{hashlib.sha256(data).hexdigest()}.png"
    (copy / stray).write_bytes(data)
    text = _damaged(copy)
    assert "notes.txt: not accounted for" in text and f"{stray}: not accounted for" in text


def test_table_record_counts_rows_and_hashes_bytes(tmp_path):
    (tmp_path / "t.jsonl").write_bytes(b'{"a":1}\n{"a":2}\n')
    assert table_record(tmp_path, "t.jsonl") == {
        "rows": 2,
        "sha256": hashlib.sha256(b'{"a":1}\n{"a":2}\n').hexdigest(),
    }


def test_a_release_sealed_before_content_hashed_trial_ids_keeps_the_other_checks(copy):
    info = json.loads((copy / "release.json").read_text())
    del info["tables"]
    (copy / "release.json").write_text(json.dumps(info))

    def legacy(rows):
        for i, row in enumerate(rows):
            row["trial_id"] = f"legacy-{i}"
        rows[1]["images"] = ["0" * 16]

    _edit(copy / "trials.jsonl", legacy)
    text = _damaged(copy)
    assert "is not the hash" not in text
    assert f"trials.jsonl line 2: image {'0' * 16} is not an item" in text
