"""Auditing a set without source photos (PAIRS-shaped: one scene, several generated people).

The set is real photos: per scene, people of the London set (their self-reported ethnic group
and gender are the rows' condition labels) and, in one scene, a candidate showing two people
side by side, which the face gate must reject whatever else it measures. Nothing here knows a
gate's threshold: the expectations come from what the photos show.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from counterfactory.assets import PHOTOS_DIR
from counterfactory.validation.gate_stack import GatesConfig, GateStack
from counterfactory.validation.judging import SOURCE_FREE_GATES, SOURCE_GATES_SKIPPED, judge_alone
from tests.flows.import_set import LONDON
from tests.flows.review_setup import cli

AXES = {"race": ["Black", "East Asian", "Middle Eastern", "White"], "gender": ["female", "male"]}
#: london_info.csv's ethnic groups as the spec's race labels
RACE = {"black": "Black", "east_asian": "East Asian", "west_asian": "Middle Eastern", "white": "White"}
SIDE = 320
#: the gates a default face stack runs that compare a candidate with its source
COMPARING = ("expression", "identity", "locality", "skin")


def _people() -> dict[tuple[str, str], Path]:
    """One London neutral photo per (race, gender) the set's info file gives."""
    chosen: dict[tuple[str, str], Path] = {}
    with (LONDON / "london_info.csv").open() as f:
        for row in csv.DictReader(f):
            key = (RACE[row["face_eth"]], row["face_gender"])
            photo = LONDON / "neutral" / f"{row['face_id']}.jpg"
            if key not in chosen and photo.is_file():
                chosen[key] = photo
    return chosen


def _small(path: Path) -> Image.Image:
    image = Image.open(path).convert("RGB")
    image.thumbnail((SIDE, SIDE))
    return image


def write_scene_set(folder: Path, *, accept: bool) -> tuple[Path, list[dict[str, str]]]:
    """Two scenes of four people each, plus a two-person candidate in the second; the metadata
    lists each scene with its first candidate as the image standing for it. Returns the spec
    and the table's rows (with ``expect``: what the photo shows)."""
    people = sorted(_people().items())
    assert len(people) >= 8, people
    (folder / "images").mkdir(parents=True)
    rows: list[dict[str, str]] = []
    for n, ((race, gender), photo) in enumerate(people[:8]):
        scene = "office" if n % 2 == 0 else "kitchen"
        name = f"images/{scene}_{photo.stem}.png"
        _small(photo).save(folder / name)
        rows.append({"id": f"{scene}-{photo.stem}", "scene": scene, "candidate": name, "race": race,
                     "gender": gender, "expect": "one_face"})  # fmt: skip
    # two people side by side in one frame: a generated "person" that is two
    taken = {(r["race"], r["gender"]) for r in rows if r["scene"] == "kitchen"}
    (race, gender) = next(k for k in _people() if k not in taken)
    left, right = _small(PHOTOS_DIR / "obama_portrait.jpg"), _small(PHOTOS_DIR / "grace_hopper.jpg")
    pair = Image.new("RGB", (left.width + right.width, max(left.height, right.height)), (128, 128, 128))
    pair.paste(left, (0, 0))
    pair.paste(right, (left.width, 0))
    pair.save(folder / "images/kitchen_two_people.png")
    rows.append({"id": "kitchen-two", "scene": "kitchen", "candidate": "images/kitchen_two_people.png",
                 "race": race, "gender": gender, "expect": "two_faces"})  # fmt: skip
    scenes = {}
    for r in rows:
        scenes.setdefault(r["scene"], r["candidate"])
    metadata = [
        {"id": s, "path": p, "licence": "CC BY 4.0 (Face Research Lab London Set)", "occupation": s}
        for s, p in scenes.items()
    ]
    (folder / "metadata.yaml").write_text(yaml.safe_dump({"sources": metadata}, sort_keys=False))
    columns = ["id", "scene", "candidate", "race", "gender"]
    (folder / "scenes.csv").write_text(
        "\n".join([",".join(columns), *(",".join(r[c] for c in columns) for r in rows)]) + "\n"
    )
    spec = {
        "name": "scenes-test",
        "sources": {"photos": ".", "metadata": "metadata.yaml"},
        "design": {"kind": "face", "axes": AXES, "strata": [], "templates_per_stratum": 1},
        "prompts": {"face": "face_only_v1"},
        "editor": {
            "backend": "import",
            "import": {
                "table": "scenes.csv",
                "no_source": True,
                "source_column": "scene",
                "accept_on_remaining": accept,
                "editor_name": "scene-set",
                "editor_version": "1",
            },
        },
        "release": {"name": "scenes-test", "version": "0.1.0"},
        "trials": {"protocols": []},
    }
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder / "spec.yaml", rows


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    if not LONDON.is_dir():
        pytest.skip(f"{LONDON} (the Face Research Lab London Set) is not on this machine")
    folder = tmp_path_factory.mktemp("scenes")
    spec, rows = write_scene_set(folder / "set", accept=True)
    out = folder / "out"
    cli("run", str(spec), "--out", str(out), "--publish", "--allow-incomplete", "--no-progress")
    release = out / "releases" / "scenes-test" / "0.1.0"
    return spec, rows, release


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_a_set_without_sources_is_judged_on_the_gates_that_need_none(released):
    spec, rows, release = released
    cli("verify", str(release))
    items = _jsonl(release / "items.jsonl")
    by_row = {i["editor"]["output"]["id"]: i for i in items}
    assert sorted(by_row) == sorted(r["id"] for r in rows)
    for row in rows:
        item = by_row[row["id"]]
        assert item["template_id"] == row["scene"]
        assert item["condition"] == {"race": row["race"], "gender": row["gender"]}
        # every comparing gate skipped, listed on the item; only the candidate-alone gates ran
        assert set(item["skipped_gates"]) == set(COMPARING)
        assert set(item["gates"]) - {"input"} <= set(SOURCE_FREE_GATES) and "face" in item["gates"]
        assert item["alignment"]["no_source"] is True
        face = item["gates"]["face"]["metrics"]
        assert face["pose_change_deg"] is None and face["source_faces"] is None
        if row["expect"] == "two_faces":
            assert face["faces"] == 2
            assert item["status"] == "rejected" and "face_count_mismatch" in item["reasons"]
        else:
            assert face["faces"] == 1 and face["yaw_deg"] is not None
            assert item["status"] == "accepted", (row, item["reasons"])
    # the manifest holds the accepted ones, each with its skipped gates
    manifest = _jsonl(release / "manifest.jsonl")
    assert len(manifest) == sum(r["expect"] == "one_face" for r in rows)
    assert all(set(m["skipped_gates"]) == set(COMPARING) for m in manifest)
    # the stored image is the candidate file's pixels as given (nothing registered)
    one = next(m for m in manifest if m["editor"]["output"]["id"] == rows[0]["id"])
    stored = np.asarray(Image.open(release / one["image"]["path"]).convert("RGB"))
    given = np.asarray(Image.open(spec.parent / rows[0]["candidate"]).convert("RGB"))
    assert np.array_equal(stored, given)

    stats = json.loads((release / "stats.json").read_text())
    assert stats["audit"]["skipped"] == {g: len(rows) for g in COMPARING}
    assert stats["audit"]["no_source"] is True and "noise_floor" not in json.dumps(stats["audit"])
    report = (release / "report.html").read_text()
    assert "Gates skipped" in report and "no source photo" in report
    for gate in COMPARING:
        assert f"<code>{gate}</code></td><td>{len(rows)}</td>" in report


@pytest.mark.slow
def test_without_accept_on_remaining_a_pass_goes_to_review():
    """The default: a candidate that passes every gate that could run is not accepted as if
    fully judged; one the face gate rejects stays rejected."""
    if not LONDON.is_dir():
        pytest.skip(f"{LONDON} is not on this machine")
    stack = GateStack.from_config(GatesConfig(), "face")
    person = np.asarray(_small(sorted(_people().values())[0]))
    judged = judge_alone(person, kind="face", stack=stack, extras={"condition": {"race": "White"}})
    assert judged.verdict == "needs_review" and judged.reasons == [SOURCE_GATES_SKIPPED]
    assert set(judged.alignment["skipped_gates"]) == set(COMPARING)
    accepted = judge_alone(person, kind="face", stack=stack, accept=True)
    assert accepted.verdict == "accepted" and accepted.gates["face"]["metrics"]["faces"] == 1
    backdrop = np.ascontiguousarray(person[:40, :40])  # the grey backdrop above the head: no face
    empty = judge_alone(np.kron(backdrop, np.ones((8, 8, 1), np.uint8)), kind="face", stack=stack)
    assert empty.verdict == "rejected" and "face_count_mismatch" in empty.reasons
