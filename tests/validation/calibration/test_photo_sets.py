"""Photo sets of the failure corpus: the London set split by person, with real expression pairs
(issue 19's "calibrate on many people").

What the tests check comes from outside the code: the London set's README and info file (82
people: 61 white, 8 black, 6 east_asian, 7 west_asian), a similarity transform the test
applies itself, and the pixels of the photos.
"""

from __future__ import annotations

import collections
import csv

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from counterfactory.assets import PHOTOS_DIR
from counterfactory.validation.calibration.photo_sets import (
    MESH_RIGID,
    PhotoSet,
    london_set,
    person_splits,
    read_tem,
    register_pair,
)
from tests.flows.import_set import LONDON

needs_london = pytest.mark.skipif(not LONDON.is_dir(), reason=f"{LONDON} (the London set) is not on this machine")


def test_person_split_is_balanced_per_group_and_seeded():
    groups = {f"p{i}": ("a" if i < 7 else "b" if i < 10 else "c") for i in range(11)}
    people = list(groups)
    a = person_splits(people, groups, seed=0)
    assert a == person_splits(list(reversed(people)), groups, seed=0)  # order-free
    assert len({tuple(sorted(person_splits(people, groups, seed=s).items())) for s in range(6)}) > 1
    assert set(a) == set(people) and set(a.values()) == {"train", "heldout"}
    for group in "abc":
        n = collections.Counter(s for p, s in a.items() if groups[p] == group)
        assert abs(n["train"] - n["heldout"]) <= 1, (group, n)
    total = collections.Counter(a.values())
    assert abs(total["train"] - total["heldout"]) <= 1
    # one person per group: the alternation carries across groups, so both splits get people
    singles = person_splits(["x", "y", "z", "w"], {"x": "1", "y": "2", "z": "3", "w": "4"}, seed=0)
    assert collections.Counter(singles.values()) == {"train": 2, "heldout": 2}


def test_photo_set_refuses_bad_settings():
    with pytest.raises(ValueError, match="per_class"):
        PhotoSet("x", (), 0)
    with pytest.raises(ValueError, match="split_by"):
        PhotoSet("x", (), 1, split_by="photo")  # type: ignore[arg-type]


@needs_london
def test_london_set_is_every_person_with_its_pair(tmp_path):
    with (LONDON / "london_info.csv").open() as f:
        info = {r["face_id"]: r["face_eth"] for r in csv.DictReader(f)}
    full = london_set(LONDON)
    assert len(full.paths) == 82 and full.split_by == "person"
    assert collections.Counter(full.groups.values()) == {"white": 61, "black": 8, "east_asian": 6, "west_asian": 7}
    assert all(full.groups[full.people[p]] == info[p.stem] for p in full.paths)
    assert all(full.pairs[p] == LONDON / "smiling" / p.name for p in full.paths)
    # the neutral photos' templates are read; the set's smiling .tem files are empty
    assert all(read_tem(full.landmarks[p]).shape == (189, 2) for p in full.paths)
    assert not any(p.parent.name == "smiling" for p in full.landmarks)
    with pytest.raises(ValueError, match="smiling/001.tem"):
        read_tem(LONDON / "smiling" / "001.tem")
    # a smaller set keeps every group, and is the same for the same seed
    eight = london_set(LONDON, people=8, seed=5)
    assert set(eight.groups.values()) == {"white", "black", "east_asian", "west_asian"}
    assert eight.paths == london_set(LONDON, people=8, seed=5).paths
    with pytest.raises(FileNotFoundError, match="london_info.csv"):
        london_set(tmp_path)


@needs_london
def test_register_pair_undoes_a_known_similarity():
    from counterfactory.validation.faces import get_face_landmarker

    image = cv2.resize(
        cv2.imread(str(LONDON / "neutral" / "001.jpg"))[:, :, ::-1], (384, 384), interpolation=cv2.INTER_AREA
    )
    m = cv2.getRotationMatrix2D((180.0, 200.0), 3.0, 1.06)
    m[:, 2] += (7.0, -5.0)
    moved = cv2.warpAffine(image, m, (384, 384), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    landmarker = get_face_landmarker()
    a, b = landmarker.detect(image)[0], landmarker.detect(moved)[0]
    back, fit = register_pair(image, moved, a.landmarks[list(MESH_RIGID), :2], b.landmarks[list(MESH_RIGID), :2])
    assert fit["scale"] == pytest.approx(1 / 1.06, abs=0.01)
    # getRotationMatrix2D(3 deg) has m[1,0] = -sin 3 deg: its inverse has +sin
    assert fit["rotation_deg"] == pytest.approx(3.0, abs=0.5)
    assert fit["residual_px"] < 1.5
    centre = (slice(96, 288), slice(96, 288))
    before = np.abs(moved[centre].astype(int) - image[centre]).mean()
    after = np.abs(back[centre].astype(int) - image[centre]).mean()
    assert after < 0.35 * before, (before, after)


@pytest.mark.slow
@needs_london
def test_london_corpus_is_split_by_person_with_real_expressions():
    from counterfactory.validation.calibration.corpus_fit import run_failure_corpus
    from counterfactory.validation.calibration.failures import build_set_corpus
    from counterfactory.validation.thresholds import calibrated_gates

    photos = london_set(LONDON, people=4, max_side=256)
    # the real smiles alone (each person's split is the same for every class of theirs; the good
    # edits are made, split and judged by run_failure_corpus below)
    cases = list(build_set_corpus(photos, classes=("expression_real",)))
    splits = collections.defaultdict(set)
    for c in cases:
        splits[c.person].add(c.split)
        assert c.photo_set == "london" and c.group == photos.groups[c.person]
    assert all(len(s) == 1 for s in splits.values()) and len(splits) == 4
    assert {next(iter(s)) for s in splits.values()} == {"train", "heldout"}
    real = [c for c in cases if c.label == "expression_real"]
    assert len(real) == 4
    for c in real:
        # the person's own smiling photo, registered: a small similarity, not the source again
        fit = c.params["registration"]
        assert 0.9 < fit["scale"] < 1.1 and abs(fit["rotation_deg"]) < 5 and fit["residual_px"] < 3
        assert c.params["rerendered"] == "taef2"
    result = run_failure_corpus(
        [PHOTOS_DIR / "grace_hopper.jpg", PHOTOS_DIR / "astronaut.png"],
        calibrated_gates("face"),
        per_class=1,
        max_side=256,
        classes=("good", "expression_real", "text_added"),
        progress=False,
        photo_sets=[photos],
    )
    held_people = {r["person"] for r in result["cases"] if r.get("person") and r["split"] == "heldout"}
    train_people = {r["person"] for r in result["cases"] if r.get("person") and r["split"] == "train"}
    assert held_people and train_people and not held_people & train_people
    assert result["heldout_by_set"]["london"]["expression_real"]["n"] == 2
    assert "expression_real" not in result["heldout_by_set"]["bundled"]  # no pairs among the bundled photos
    # the London people by stated group; photos of a set that states none by skin-tone tertile
    assert {g for g in result["heldout_by_group"] if not g.startswith("tone_")} <= {
        "white",
        "black",
        "east_asian",
        "west_asian",
    }
    assert result["config"]["photo_sets"]["london"] == {
        "photos": 4, "people": 4, "per_class": 1, "max_side": 256, "split_by": "person", "pairs": 4,
    }  # fmt: skip
    assert {k.split("/")[0] for k in result["noise_floors"]} == {"bundled", "london"}


def test_calibrate_cli_refuses_london_without_a_corpus(tmp_path):
    from counterfactory.flows.cli import main

    runner = CliRunner()
    done = runner.invoke(main, ["calibrate", "--out", str(tmp_path / "o"), "--london", str(tmp_path)])
    assert done.exit_code != 0 and "--failures" in done.output
    done = runner.invoke(
        main, ["calibrate", "--out", str(tmp_path / "o"), "--failures", "1", "--london", str(tmp_path)]
    )
    assert done.exit_code != 0 and "london_info.csv" in done.output
    assert not (tmp_path / "o").exists()
