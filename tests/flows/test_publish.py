"""Publishing as its own step, through the real command line, models and photos: from the
ledger with zero editor calls, refusing incomplete grids, empty releases and taken versions,
and what a release holds (schemas, parquet, trials, derived items), verify and diff."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from counterfactory.manifests.release import ReleaseStage, read_jsonl, write_json, write_jsonl
from counterfactory.manifests.release_verify import verify_release
from counterfactory.manifests.store import sha256_file
from tests.conftest import REPO

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "counterfactory.flows.cli"]
PHOTOS = REPO / "assets/photos"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), cwd=REPO, capture_output=True, text=True, timeout=900)


def _write_spec(folder: Path, name: str, races: list[str], sources: list[str], version: str = "0.1.0") -> Path:
    """A small face study on the bundled photos; every trial protocol a face design can use."""
    meta = {s["id"]: s for s in yaml.safe_load((PHOTOS / "metadata.yaml").read_text())["sources"]}
    (folder / f"{name}-meta.yaml").write_text(yaml.safe_dump({"sources": [meta[s] for s in sources]}))
    spec = {
        "name": "small",
        "sources": {"photos": str(PHOTOS), "metadata": f"{name}-meta.yaml"},
        "design": {
            "kind": "face",
            "axes": {"race": races, "gender": ["female"]},
            "strata": ["occupation"],
            "templates_per_stratum": 1,
        },
        "editor": {"backend": "classical", "max_attempts": 1},
        # the classical editor tints the face only: near the source identity, and a face that no
        # longer matches the body's skin is what it does, not a failure this test is about
        "gates": {"face": {"identity": {"max_cosine": 0.995}, "skin": None}},
        "trials": {
            "protocols": ["2afc", "mcq", "salary", "disability_context", "person_irrelevant"],
            "biographies": str(REPO / "assets/trials/biographies_example_v1.yaml"),
        },
        "robustness": {"mirror": True, "crops": True},
        "release": {"name": "small", "version": version},
    }
    path = folder / f"{name}.yaml"
    path.write_text("# written by hand\n" + yaml.safe_dump(spec, sort_keys=False))
    return path


def _calls(out: Path) -> int:
    with sqlite3.connect(out / "ledger.sqlite") as db:
        return db.execute("select coalesce(sum(calls), 0) from attempts").fetchone()[0]


def _tree(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    folder = tmp_path_factory.mktemp("study")
    sources = ["grace_hopper", "astronaut", "two_people"]  # the two-person photo fails as a source
    spec_a = _write_spec(folder, "a", ["Black", "White"], sources)
    out = folder / "out"
    ran = _cli("run", str(spec_a), "--out", str(out), "--no-progress")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "not published" in ran.stdout
    return {"folder": folder, "out": out, "a": spec_a, "sources": sources}


def test_run_alone_seals_nothing_and_publish_refuses_the_incomplete_grid(study):
    out = study["out"]
    assert not (out / "releases" / "small").exists()
    calls = _calls(out)
    refused = _cli("publish", str(out))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "incomplete" in refused.stderr and "--allow-incomplete" in refused.stderr
    assert "source two_people: failed: source_face_count" in refused.stderr
    assert "race=Black|gender=female: 2 cells" in refused.stderr
    assert "Traceback" not in refused.stderr
    folder = out / "releases" / "small"
    assert not folder.exists() or not list(folder.iterdir())  # no release, no staging folder
    assert _calls(out) == calls


def test_publish_with_allow_incomplete_from_the_ledger_with_zero_editor_calls(study):
    out = study["out"]
    calls = _calls(out)
    done = _cli("publish", str(out), "--allow-incomplete")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "editor calls: 0" in done.stdout and _calls(out) == calls
    release = out / "releases/small/0.1.0"
    assert verify_release(release) == []
    left_out = read_jsonl(release / "left_out.jsonl")
    assert {"what": "source", "id": "two_people"}.items() <= left_out[-1].items() or any(
        r["what"] == "source" and r["id"] == "two_people" and "2 faces" in r["reason"] for r in left_out
    )
    info = json.loads((release / "release.json").read_text())
    assert info["complete"] is False
    # spec.yaml is the file as written (comment and all), and its hash is recorded
    assert (release / "spec.yaml").read_bytes() == study["a"].read_bytes()
    assert info["spec_sha256"] == hashlib.sha256(study["a"].read_bytes()).hexdigest()
    shipped = sorted(p.name for p in (REPO / "manifests/schemas").glob("*.schema.json"))
    assert sorted(p.name for p in (release / "schemas").iterdir()) == shipped
    manifest = read_jsonl(release / "manifest.jsonl")
    assert manifest, "the demo photos give at least one accepted cell"
    table = pq.read_table(release / "manifest.parquet")
    assert table.column("item_id").to_pylist() == [r["item_id"] for r in manifest]
    for column in (
        "template_id",
        "condition.race",
        "gender_match",
        "image_path",
        "image_sha256",
        "source_sha256",
        "source_licence",
        "editor_model",
        "editor_revision",
        "editor_prompt",
        "editor_seed",
        "alignment",
        "gate.identity.cosine",
        "gate.locality.threshold.max_changed_share",
        "review",
    ):
        assert column in table.column_names, column
    # the release owns its bytes: no image is another name of a store file
    assert all((release / r["image"]["path"]).stat().st_nlink == 1 for r in manifest)
    # trials name only images of this release
    known = {r["item_id"] for r in manifest} | {f"source:{r['source']['sha256']}" for r in manifest}
    known |= {d["item_id"] for d in read_jsonl(release / "derived.jsonl")}  # MCQ re-runs on robustness variants
    trials = read_jsonl(release / "trials.jsonl")
    assert trials and {i for t in trials for i in t["images"]} <= known
    assert {t["protocol"] for t in trials} == {"2afc", "mcq", "salary", "disability_context", "person_irrelevant"}
    derived = read_jsonl(release / "derived.jsonl")
    assert len(derived) == 4 * len(manifest)  # mirror + original, medium, close
    assert {d["parent_item_id"] for d in derived} == {r["item_id"] for r in manifest}
    stats = json.loads((release / "stats.json").read_text())
    assert stats["expression"]["overall"]["n"] == sum(1 for r in read_jsonl(release / "items.jsonl") if r["expression"])
    assert "drift" in (release / "report.html").read_text().lower()


def test_verify_fails_on_every_kind_of_damage(study, tmp_path):
    release = study["out"] / "releases/small/0.1.0"
    manifest = read_jsonl(release / "manifest.jsonl")

    def damaged(name, change):
        copy = tmp_path / name
        shutil.copytree(release, copy)
        change(copy)
        return "\n".join(verify_release(copy))

    def flip(copy):
        image = copy / manifest[0]["image"]["path"]
        data = bytearray(image.read_bytes())
        data[len(data) // 2] ^= 0x01
        image.write_bytes(bytes(data))

    assert "checksum mismatch" in damaged("flip", flip)
    assert "listed but missing" in damaged("missing", lambda c: (c / "stats.json").unlink())
    assert "not listed" in damaged("extra", lambda c: (c / "notes.txt").write_text("x"))

    def edit_row(copy):
        rows = read_jsonl(copy / "manifest.jsonl")
        rows[0]["condition"]["race"] = "Latino"
        write_jsonl(copy / "manifest.jsonl", rows)

    assert "manifest.jsonl: checksum mismatch" in damaged("row", edit_row)

    def break_schema(copy):
        rows = read_jsonl(copy / "trials.jsonl")
        rows[0]["protocol"] = "3afc"
        write_jsonl(copy / "trials.jsonl", rows)
        listing = copy / "checksums.sha256"
        old = sha256_file(release / "trials.jsonl")
        listing.write_text(listing.read_text().replace(old, sha256_file(copy / "trials.jsonl")))

    problems = damaged("schema", break_schema)
    assert "checksum" not in problems and "trials.jsonl line 1: protocol" in problems


def test_same_version_again_is_a_no_op_and_other_content_is_refused(study):
    out, folder = study["out"], study["folder"]
    release = out / "releases/small/0.1.0"
    before = _tree(release)
    again = _cli("publish", str(out), "--allow-incomplete")
    assert again.returncode == 0 and "unchanged" in again.stdout
    spec_b = _write_spec(folder, "b", ["Black"], study["sources"])
    other = _cli("publish", str(out), "--spec", str(spec_b), "--allow-incomplete")
    assert other.returncode == 2 and "already exists" in other.stderr and "raise release.version" in other.stderr
    assert _tree(release) == before


def test_a_taken_version_stops_run_before_any_editing(study):
    out, folder = study["out"], study["folder"]
    calls = _calls(out)
    spec_c = _write_spec(folder, "c", ["Black", "White", "East Asian"], study["sources"])
    refused = _cli("run", str(spec_c), "--out", str(out), "--publish", "--allow-incomplete", "--no-progress")
    assert refused.returncode == 2 and "already exists" in refused.stderr
    assert _calls(out) == calls  # the East Asian cells were never edited


def test_diff_lists_exactly_the_condition_that_changed(study, tmp_path):
    out, folder = study["out"], study["folder"]
    spec_b = _write_spec(folder, "b", ["Black"], study["sources"])
    made = _cli("publish", str(out), "--spec", str(spec_b), "--version", "0.2.0", "--allow-incomplete")
    assert made.returncode == 0, made.stderr[-3000:]
    a, b = out / "releases/small/0.1.0", out / "releases/small/0.2.0"
    same = _cli("release", "diff", str(a), str(a))
    assert same.returncode == 0 and same.stdout.strip().endswith("identical")
    changed = _cli("release", "diff", str(a), str(b), "--json")
    assert changed.returncode == 1, changed.stderr
    result = json.loads(changed.stdout)
    assert result["added"] == [] and result["changed"] == []
    assert [r["condition"] for r in result["removed"]] == [{"race": "White", "gender": "female"}] * 2
    assert {s["group"] for s in result["pass_rates"]} >= {"race=White"}
    # a release of another study is refused, and nothing is written
    stage = ReleaseStage(tmp_path / "releases", "other", "1.0.0")
    write_jsonl(stage.dir / "manifest.jsonl", [])
    write_jsonl(stage.dir / "items.jsonl", [])
    write_json(stage.dir / "release.json", {"name": "other", "spec_name": "other", "version": "1.0.0"})
    other = stage.seal().path
    before = _tree(a)
    refused = _cli("release", "diff", str(a), str(other))
    assert refused.returncode == 2 and "different studies" in refused.stderr
    assert _tree(a) == before


def test_an_edited_store_image_stops_the_next_publish_and_the_old_release_keeps_its_bytes(study):
    """Issue 8: with hard links, editing one file changed every release that shared it and a new
    release built from the damaged store verified. Now the publish refuses, naming the file."""
    out = study["out"]
    release = out / "releases/small/0.1.0"
    before = _tree(release)
    row = read_jsonl(release / "manifest.jsonl")[0]
    blob = out / "store" / row["image"]["sha256"][:2] / f"{row['image']['sha256']}.png"
    original = blob.read_bytes()
    try:
        with open(blob, "r+b") as f:
            f.seek(len(original) // 2)
            f.write(b"\x00\x01\x02")
        refused = _cli("publish", str(out), "--version", "0.3.0", "--allow-incomplete")
        assert refused.returncode == 2
        # the store's verified read names the blob and how to rebuild it
        assert row["image"]["sha256"][:12] in refused.stderr and "re-run" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert not (out / "releases/small/0.3.0").exists()
        assert _tree(release) == before and verify_release(release) == []
    finally:
        blob.write_bytes(original)


def test_an_empty_release_is_not_sealed(tmp_path):
    """Issue 8: a run whose every source failed sealed an empty release with rc 0."""
    spec = _write_spec(tmp_path, "empty", ["Black"], ["two_people"])
    out = tmp_path / "out"
    result = _cli("run", str(spec), "--out", str(out), "--publish", "--allow-incomplete", "--no-progress")
    assert result.returncode == 2
    assert "nothing to publish" in result.stderr and "version is still free" in result.stderr
    assert not (out / "releases/small/0.1.0").exists()
