"""The failure-mode corpus and the thresholds it calibrates (issue 9).

The corpus is seeded (the same seed gives the same bytes), labels every case, keeps a
held-out split (by person for the London set), and the shipped calibration reports on that
split: good edits accepted at least 95 % of the time and every failure class caught (rejected
or sent to review) at least 95 % of the time (every case re-rendered, judged above its photo's
noise floor and against its floor output).
"""

from __future__ import annotations

import numpy as np
import pytest

from counterfactory.assets import PHOTOS_DIR
from counterfactory.validation.calibration.corpus_fit import CORPUS_THRESHOLDS, run_failure_corpus
from counterfactory.validation.calibration.failures import CLASSES, GOOD, build_corpus, split_of
from counterfactory.validation.thresholds import calibrated_gates, load_calibration
from tests.conftest import REPO

TWO = [PHOTOS_DIR / "grace_hopper.jpg", PHOTOS_DIR / "astronaut.png"]


@pytest.mark.slow
def test_corpus_is_seeded_labelled_and_split():
    # one variant of each failure and four good edits per photo: both splits, three classes
    kw = dict(per_class=1, max_side=256, classes=(GOOD, "text_added", "global_colour"))
    a = list(build_corpus(TWO, seed=3, **kw))
    b = list(build_corpus(TWO, seed=3, **kw))
    c = list(build_corpus(TWO, seed=4, **kw))
    assert [x.case_id for x in a] == [x.case_id for x in b]
    assert all(np.array_equal(x.output, y.output) for x, y in zip(a, b))
    assert any(not np.array_equal(x.output, y.output) for x, y in zip(a, c))
    assert {x.label for x in a} == {GOOD, "text_added", "global_colour"}
    assert {x.split for x in a} == {"train", "heldout"}
    assert all(x.split == split_of(int(x.case_id.rsplit(":", 1)[1])) for x in a)
    for x in a:
        # every case was re-rendered through the autoencoder, as a real editor's decoder does
        assert x.params["rerendered"] == "taef2"
        # and went through editor jitter: another size than the source, re-encoded
        assert x.output.shape[:2] != x.source.shape[:2]
        assert x.output.shape[0] % 16 == 0 and x.output.shape[1] % 16 == 0
        assert 1.0 <= np.hypot(*x.params["jitter"]["shift_px"]) <= 3.0
        assert 1.005 <= x.params["jitter"]["zoom"] <= 1.02


def test_good_edits_change_only_the_face():
    from counterfactory.validation.calibration.corpus_edits import good_edit
    from counterfactory.validation.calibration.failures import _load_photos

    photo = _load_photos([PHOTOS_DIR / "grace_hopper.jpg"], 512)[0]
    rng = np.random.default_rng(0)
    for _ in range(3):
        edited, params = good_edit(photo.image, photo.face, photo.oval, rng, photo.face_lab)
        changed = np.any(edited != photo.image, axis=2)
        assert changed.any()
        assert not changed[photo.oval == 0].any(), params


@pytest.mark.slow
def test_every_class_is_made_from_bundled_photos():
    cases = list(build_corpus(TWO, per_class=1, max_side=256, splits=("train",)))
    # every class but the real expression pairs, which need the same person's other photo
    # (the London set: tests/validation/calibration/test_photo_sets.py)
    assert {c.label for c in cases} == set(CLASSES) - {"expression_real"}


def test_shipped_calibration_meets_the_issue_on_its_held_out_split():
    cal = load_calibration()
    corpus = cal["failures"]
    held = corpus["heldout"]
    # the shipped run is the bundled photos' (held out by variant) and the London set's (82
    # people, held out by person, with their real smiles as a class of its own)
    assert set(held) == set(CLASSES)
    assert set(corpus["heldout_by_set"]) == {"bundled", "london"}
    assert corpus["config"]["photo_sets"]["london"]["split_by"] == "person"
    london = [r for r in corpus["cases"] if r.get("photo_set") == "london"]
    people = {split: {r["person"] for r in london if r["split"] == split} for split in ("train", "heldout")}
    assert len(people["train"]) >= 40 and len(people["heldout"]) >= 40
    assert not people["train"] & people["heldout"]  # no held-out person set a threshold
    # every case re-rendered through TAEF2 and judged above its photo's noise floor and against
    # the floor output pixel by pixel: good edits accepted >= 95 % and every failure class
    # (real expression pairs among them) caught >= 95 % (issue 19)
    assert held[GOOD]["acceptance"] >= 0.95
    assert held["expression_real"]["n"] >= 40
    # the three local failures are caught by the per-pixel comparison with the floor output,
    # smiles and frowns by the mouth corners' shift in the pixels, copies by their face change
    # above the floor's
    for label in ("object_added", "text_added", "object_removed"):
        assert "locality_excess_share_above_max" in held[label]["reasons"], held[label]
    for label in ("expression", "expression_real"):
        assert "expression_mouth_corner_shift_above_max" in held[label]["reasons"], held[label]
    assert "locality_face_unchanged" in held["noop_copy"]["reasons"]
    # every photo's floor case measured but at most one in fifty: London 172, a bald head whose
    # region (the forehead up to where hair would be, the neck to the collar) leaves a plain wall
    # too little texture to register a re-rendered copy on (its cases are judged without a floor)
    floors = corpus["noise_floors"]
    assert floors and sum(f is None for f in floors.values()) <= len(floors) / 50
    assert corpus["good_acceptance_heldout"] == held[GOOD]["acceptance"]
    # the shipped defaults are the corpus's thresholds, and held-out cases never set them
    face = calibrated_gates("face")
    for gate, name, _, _ in CORPUS_THRESHOLDS:
        assert face[gate][name] == corpus["thresholds"][gate][name]
    assert face["identity"].get("max_cosine") is None
    assert {r["split"] for r in corpus["cases"]} == {"train", "heldout"}


@pytest.mark.parametrize("path", ["request", "cohort", "none"])
def test_shipped_calibration_accepts_good_edits_alike_for_every_group_and_direction(path):
    """Issue 34: held out by person, on each judging path (floor request, cohort floor, none),
    good edits accepted >= 95 % in every group (stated ethnicity, skin-tone tertile where none is
    stated) and in each direction of the edit (lighter, darker)."""
    fig = load_calibration()["failures"]["heldout_by_path"][path]
    assert set(fig["good_by_direction"]) == {"lighter", "darker"}
    for direction, rate in fig["good_by_direction"].items():
        assert rate["n"] >= 40 and rate["acceptance"] >= 0.95, (direction, rate)
    assert len(fig["good_by_group"]) >= 6
    for group, rate in fig["good_by_group"].items():
        assert rate["n"] >= 4 and rate["acceptance"] >= 0.95, (group, rate)


@pytest.mark.parametrize("path", ["request", "cohort", "none"])
def test_shipped_calibration_catches_swaps_and_smiles_by_their_own_gates(path):
    """Issue 34: identity swaps (donors of similar skin lightness) caught by the identity gate
    itself >= 95 %; real smiles (pasted into the neutral photo, so registration cannot tell)
    caught by the expression gate itself >= 90 %; the identity floor fitted, with the vendor's
    operating point as its lower bound, and each path judged by its own shipped limits."""
    corpus = load_calibration()["failures"]
    fig = corpus["heldout_by_path"][path]
    assert fig["identity_swaps_caught_by_identity"] >= 0.95
    assert fig["real_smiles_caught_by_expression"] >= 0.90
    face = calibrated_gates("face")
    assert face["identity"]["min_cosine"] == corpus["thresholds"]["identity"]["min_cosine"] >= 0.363
    if path != "request":
        key = {"cohort": "cohort", "none": "no_floor"}[path]
        assert face["locality"][key] == corpus["thresholds"]["paths"][path]


def test_shipped_calibration_catches_every_failure_class_on_every_path():
    """Issues 19 and 34: every failure class caught >= 95 % of its held-out cases, on each path,
    each class with at least 10 held-out cases (erased patches are the fewest: a studio photo
    has little to erase outside the edit region, 12 in the run of 2026-12-05)."""
    paths = load_calibration()["failures"]["heldout_by_path"]
    assert set(paths) == {"request", "cohort", "none"}
    for path, fig in paths.items():
        assert set(fig["classes"]) == set(CLASSES), path
        for label, rates in fig["classes"].items():
            if label != GOOD:
                assert rates["n"] >= 10 and rates["caught"] >= 0.95, (path, label, rates)


def test_each_photo_set_keeps_its_own_good_edits_inside_the_thresholds():
    """A threshold is fitted on each photo set's good edits alone and the loosest kept: pooled,
    the 164 London good edits that all score an excess_share of 0 outvote the bundled set's few
    that do not (the London run of 2026-12-04 set 0.00069 and rejected 3 of 36 bundled good
    edits held out)."""
    from counterfactory.validation.calibration.corpus_fit import corpus_thresholds

    rng = np.random.default_rng(0)

    def good(photo_set, excess):
        metrics = {metric: float(rng.uniform(0.01, 0.02)) for _, _, metric, _ in CORPUS_THRESHOLDS}
        metrics["identity.cosine"] = float(rng.uniform(0.8, 0.95))
        metrics["locality.excess_share"] = excess
        record = {"label": GOOD, "metrics": metrics}
        return record if photo_set == "bundled" else {**record, "photo_set": photo_set}

    bundled = [good("bundled", 0.0) for _ in range(37)] + [good("bundled", 0.0024)]
    london = [good("london", 0.0) for _ in range(164)]
    fitted = corpus_thresholds(bundled + london, target=0.95)["locality"]["max_excess_share"]
    assert fitted > 0.0024  # every bundled good edit passes
    assert fitted == corpus_thresholds(bundled, target=0.95)["locality"]["max_excess_share"]
    pooled = [{**r, "photo_set": "one"} for r in bundled + london]
    assert corpus_thresholds(pooled, target=0.95)["locality"]["max_excess_share"] < 0.0024  # the old rule
    # a lower bound takes the lowest set's: its smallest good face change still passes
    low = min(r["metrics"]["locality.face_change_above_floor"] for r in bundled)
    assert corpus_thresholds(bundled + london, target=0.95)["locality"]["min_face_change"] < low


def test_a_global_shift_bound_is_never_finer_than_two_grey_levels():
    """A global shift is the largest of twelve medians of a difference between two 8-bit
    images, each rounded to a grey level: a bound under two levels rejects rounding and the
    decoder's answer to a darker face (London 137's darker good edits moved a frame's darkest
    third by up to 0.0076 against the floor output), not a colour cast (the corpus's smallest,
    0.0098). Good edits that all shift by a tenth of a level still get two levels on every path."""
    from counterfactory.validation.calibration.corpus_fit import PATH_LOCALITY, corpus_thresholds

    rng = np.random.default_rng(1)
    records = []
    for _ in range(40):
        metrics = {m: float(rng.uniform(0.01, 0.02)) for _, _, m, _ in CORPUS_THRESHOLDS}
        metrics.update({"identity.cosine": 0.9, "locality.global_shift_above_floor": 0.0004})
        metrics.update({"locality.global_shift": 0.0004, "locality.changed_share": 0.01, "locality.face_change": 0.1})
        metrics.update(
            {"locality.global_gain_change": 0.01, "locality.body_skin_delta_e": 0.5, "locality.hair_delta_e": 1.0}
        )
        metrics["locality.largest_change_share"] = 0.0
        records.append({"label": GOOD, "metrics": metrics, "paths": {p: {"metrics": metrics} for p in PATH_LOCALITY}})
    two_levels = 2 / 255
    assert corpus_thresholds(records, target=0.95)["locality"]["max_global_shift"] == pytest.approx(0.0079)
    for path, rows in PATH_LOCALITY.items():
        fitted = corpus_thresholds(records, target=0.95, rows=rows, path=path)["locality"]["max_global_shift"]
        assert two_levels <= fitted < 0.0098, path


@pytest.mark.slow
def test_corpus_calibration_is_reproducible():
    base = calibrated_gates("face")
    kw = dict(per_class=2, max_side=256, classes=(GOOD, "expression", "object_added", "global_colour"), progress=False)
    a = run_failure_corpus(TWO, base, **kw)
    b = run_failure_corpus(TWO, base, **kw)
    assert a["thresholds"] == b["thresholds"]
    assert a["heldout"] == b["heldout"]
    assert [r["verdict"] for r in a["cases"]] == [r["verdict"] for r in b["cases"]]
    assert set(a["thresholds"]) == {"face", "identity", "expression", "locality", "paths"}
    assert set(a["thresholds"]["paths"]) == {"cohort", "none"}


def test_local_failures_are_made_only_where_a_person_would_see_them():
    """An added object, text or an erased patch changes its own pixels by at least
    MIN_VISIBLE_DELTA_E (CIE76); on a plain backdrop with nothing to erase, and with only
    patches like the wall to paste, the photo gets none of those cases (issue 19: 91 % of the
    London set's erased patches had been plain wall, mean change 2 ΔE)."""
    from counterfactory.validation.calibration.corpus_edits import (
        MIN_VISIBLE_DELTA_E,
        _object_added,
        _object_removed,
        _text_added,
        visible_delta_e,
    )
    from counterfactory.validation.calibration.failures import _load_photos

    photo = _load_photos([PHOTOS_DIR / "grace_hopper.jpg"], 384)[0]
    image, face, oval = photo.image, photo.face, photo.oval
    donor = _load_photos([PHOTOS_DIR / "astronaut.png"], 384)[0].image
    for seed in range(3):
        for make, args in ((_object_added, (donor,)), (_text_added, ()), (_object_removed, ())):
            out, params = make(image, face, oval, np.random.default_rng(seed), *args)
            assert out is not None, (make.__name__, seed)
            assert params["delta_e"] >= MIN_VISIBLE_DELTA_E
            # the recorded figure is the change a person sees: measured here from the pixels
            x, y, w, h = params["box"]
            box = np.zeros(image.shape[:2], bool)
            box[y : y + h, x : x + w] = True
            assert visible_delta_e(image, out, box & np.any(out != image, axis=2)) > 0.5 * MIN_VISIBLE_DELTA_E
    # the same person in front of a plain wall, in a plain jacket: nothing there to erase, and
    # a donor that is the same wall pastes nothing a person would see
    plain = np.where(oval[..., None] > 0, image, np.uint8(128)).astype(np.uint8)
    rng = np.random.default_rng(0)
    assert _object_removed(plain, face, oval, rng) == (None, {})
    assert _object_added(plain, face, oval, rng, np.full_like(donor, 130)) == (None, {})
    # grey text on the grey wall is unseen; the colours drawn are random, so some line shows
    shown = [_text_added(plain, face, oval, np.random.default_rng(s))[1] for s in range(4)]
    assert all(p == {} or p["delta_e"] >= MIN_VISIBLE_DELTA_E for p in shown)


@pytest.mark.slow
def test_body_skin_and_hair_failures_change_only_what_lies_outside_the_region():
    """Body skin is the skin the locality gate measures (one definition: a looser test here once
    recoloured London 022's spiky hair tips and called them body skin, and the gate, rightly,
    saw no body skin there); a sitter whose only visible skin below the face is the neck, which
    belongs to the region, gets no body-skin case. Hair is recoloured outside the region (the
    forehead up to the hairline is the face's) and only in a way a person sees."""
    from counterfactory.validation.calibration.corpus_edits import (
        MIN_VISIBLE_DELTA_E,
        _body_skin,
        _body_skin_region,
        _hair,
        visible_delta_e,
    )
    from counterfactory.validation.calibration.failures import _load_photos
    from counterfactory.validation.metrics.body_skin import body_skin_reference
    from counterfactory.validation.segment import get_person_segmenter

    london = REPO.parent / "shared" / "photos" / "london" / "neutral"
    tshirt = _load_photos([london / "022.jpg"], 384)[0]
    params = {"lab_delta": [12.0, 0.0, 0.0]}
    assert _body_skin(tshirt.image, tshirt.face, tshirt.oval, None, params, tshirt.region, tshirt.image) == (None, {})

    photo = _load_photos([PHOTOS_DIR / "obama_podium.jpg"], 512)[0]
    image, face, oval, region = photo.image, photo.face, photo.oval, photo.region
    person = get_person_segmenter().person_mask(image)
    body = body_skin_reference(image, oval, person, face.size_px, np.maximum(region, oval))
    gate_body = np.zeros(image.shape[:2], bool)
    gate_body[body.rows, body.cols] = True
    assert np.array_equal(_body_skin_region(image, face, oval, region) > 0, gate_body)
    out, made = _body_skin(image, face, oval, None, params, region, image)
    assert out is not None and made["body_skin_share"] >= 0.004
    assert visible_delta_e(image, out, gate_body) >= MIN_VISIBLE_DELTA_E
    assert visible_delta_e(image, out, region > 0) < 0.5

    kinds = []
    for seed in range(4):
        out, made = _hair(image, face, oval, np.random.default_rng(seed), region)
        if out is None:
            continue
        kinds.append(made["hair"])
        assert made["delta_e"] >= MIN_VISIBLE_DELTA_E
        changed = np.any(out != image, axis=2)
        assert changed.any() and not (changed & (region > 0)).any(), seed
    assert kinds, "no hair case was made on a photo with hair"


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %".replace("100.0 %", "100 %")


def test_the_docs_held_out_tables_are_the_shipped_calibrations():
    """docs/calibration.md's and assets/calibration/README.md's held-out rows per judging path are read
    from the shipped calibration.json: a recalibration that moves a figure breaks this until the
    tables say it."""
    from tests.conftest import REPO

    by_path = load_calibration()["failures"]["heldout_by_path"]
    paths = ("request", "cohort", "none")

    def rates(label: str) -> str:
        key = "acceptance" if label == GOOD else "caught"
        return " | ".join(_pct(by_path[p]["classes"][label][key]) for p in paths)

    rows = [f"| good (accepted) | {rates(GOOD)} |"]
    for label in (
        "expression_real",
        "object_added",
        "text_added",
        "object_removed",
        "global_colour",
        "hair",
        "body_skin",
    ):
        rows.append(f"| {label} ({by_path['request']['classes'][label]['n']}) | {rates(label)} |")
    readme = (REPO / "docs" / "calibration.md").read_text()
    assets = (REPO / "assets" / "calibration" / "README.md").read_text()
    for row in rows:
        assert row in readme, row
        assert row.replace("| good (accepted) |", "| good (accepted; 200: 36 bundled, 164 London) |") in assets, row


@pytest.mark.slow
def test_local_failures_lie_outside_the_region_the_gate_leaves_to_the_editor():
    """An object added, text written or a patch erased is a locality failure only where the
    locality gate judges: outside the edit region (face and visible neck down to the clothing
    line) grown by the gate's own margin. London 105 and 140 wear V-necks: the most textured
    place below the face was the neckline, and the "erased object" was the collar's edge inside
    the neck region (issue 34: counted as the gate's miss on every path)."""
    from counterfactory.validation.calibration.corpus_edits import _object_added, _object_removed, _text_added
    from counterfactory.validation.calibration.failures import _load_photos
    from counterfactory.validation.metrics.pixels import grow_face

    london = REPO.parent / "shared" / "photos" / "london" / "neutral"
    if not london.is_dir():
        pytest.skip(f"{london} (the London set) is not on this machine")
    photos = _load_photos([london / "140.jpg", london / "105.jpg"], 384)
    donor = _load_photos([PHOTOS_DIR / "astronaut.png"], 384)[0].image
    made = 0
    for photo in photos:
        image, face, oval = photo.image, photo.face, photo.oval
        judged_by_the_gate = grow_face(photo.region, face.size_px) == 0
        for seed in range(3):
            for make, args in ((_object_added, (donor,)), (_text_added, ()), (_object_removed, ())):
                out, _ = make(image, face, oval, np.random.default_rng(seed), *args, photo.region)
                if out is None:
                    continue
                made += 1
                changed = np.any(out != image, axis=2)
                assert changed.any()
                assert not (changed & ~judged_by_the_gate).any(), (photo.name, make.__name__, seed)
    assert made >= 6
