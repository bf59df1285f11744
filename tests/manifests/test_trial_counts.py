"""The shipped designs' trial banks hold, row for row, what the papers' formulas count.

The designs are the shipped specs (``assets/specs/focus.yaml``, ``limb-pairs.yaml``) with the
classical editor and their sources pointed at copies of the bundled photos; the grid is the
factory's own (``expand_grid``), every cell taken as accepted. Expected counts are the papers'
numbers, quoted beside each.
"""

from __future__ import annotations

import csv
import hashlib
import shutil
from collections import Counter
from itertools import permutations
from pathlib import Path

import pytest
import yaml

from counterfactory.assets import PHOTOS_DIR, SPECS_DIR
from counterfactory.generation.metadata import load_metadata
from counterfactory.generation.sampling import expand_grid
from counterfactory.manifests.release_schema import validate_rows
from counterfactory.manifests.spec import load_spec
from counterfactory.manifests.trials import SOURCE_PREFIX, TRIALS_DIR, build_trials, load_biographies

FOCUS_OCCUPATIONS = ["CEO", "doctor", "cook", "nurse", "teacher", "lawyer"]
#: bundled single-face photos the copies are made from
FACE_PHOTOS = ["grace_hopper.jpg", "biden_portrait.jpg", "obama_portrait.jpg", "astronaut.png"]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _with_classical(spec_name: str, folder: Path, photos: str, metadata: str) -> Path:
    data = yaml.safe_load((SPECS_DIR / spec_name).read_text(encoding="utf-8"))
    data["sources"] = {"photos": photos, "metadata": metadata}
    data["editor"] = {"backend": "classical", "max_attempts": 1}
    if data.get("trials", {}).get("biographies"):
        data["trials"]["biographies"] = str((SPECS_DIR / data["trials"]["biographies"]).resolve())
    path = folder / spec_name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _manifest(spec, records, photos: Path) -> list[dict]:
    """Every cell of the spec's grid as an accepted manifest row."""
    grid = expand_grid(records, spec.design)
    by_id = {r.id: r for r in records}
    rows = []
    for cell in grid.cells:
        record = by_id[cell.source_id]
        item_id = hashlib.sha256(cell.cell_id.encode()).hexdigest()[:16]
        rows.append(
            {
                "item_id": item_id,
                "cell_id": cell.cell_id,
                "template_id": cell.source_id,
                "condition": dict(cell.condition),
                "gender_match": cell.gender_match,
                "image": {"path": f"images/{item_id}.png"},
                "source": {
                    "id": record.id,
                    "sha256": _sha(photos / record.path),
                    "path": f"sources/{record.path}",
                    "occupation": record.occupation,
                    "presented_gender": record.presented_gender,
                    "context": record.context,
                },
            }
        )
    return rows


@pytest.fixture(scope="module")
def focus(tmp_path_factory):
    """FOCUS's 6 occupations x 2 presented genders x 4 photos (48 copies of bundled photos)."""
    root = tmp_path_factory.mktemp("focus")
    photos = root / "photos"
    photos.mkdir()
    rows = []
    n = 0
    for occupation in FOCUS_OCCUPATIONS:
        for gender in ("female", "male"):
            for k in range(4):
                name = FACE_PHOTOS[n % len(FACE_PHOTOS)]
                target = f"{occupation.lower()}_{gender}_{k}{Path(name).suffix}"
                shutil.copyfile(PHOTOS_DIR / name, photos / target)
                rows.append(
                    {
                        "id": Path(target).stem,
                        "path": target,
                        "licence": "public domain (copy of a bundled photo)",
                        "occupation": occupation,
                        "presented_gender": gender,
                    }
                )
                n += 1
    with (root / "metadata.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    spec = load_spec(_with_classical("focus.yaml", root, str(photos), str(root / "metadata.csv")))
    assert spec.editor.backend == "classical"
    items = _manifest(spec, load_metadata(root / "metadata.csv"), photos)
    bios = load_biographies(spec.trials.biographies)
    trials = build_trials(items, spec.trials, biographies=bios, expected_variants=10)
    return spec, items, bios, trials


def test_focus_design_is_the_papers_480_images(focus):
    # FOCUS 3.1: "six occupations ... CEO, doctor, cook, nurse, teacher, and lawyer. We consider five
    # race categories (White, Black, Asian, Latino, Middle Eastern) and two gender presentations";
    # "For each occupation, we manually curate eight high-quality source photos"; "480 ... images"
    spec, items, _, _ = focus
    assert spec.design.axes == {
        "race": ["White", "Black", "Asian", "Latino", "Middle Eastern"],
        "gender": ["male", "female"],
    }
    assert len(items) == 480
    assert Counter(r["source"]["occupation"] for r in items) == dict.fromkeys(FOCUS_OCCUPATIONS, 80)
    assert len({r["template_id"] for r in items}) == 48


def test_focus_2afc_is_45_pairs_per_photo_in_both_orders_row_for_row(focus):
    # FOCUS 3.2 Task 1: "all unordered pairs among the 10 variants, yielding C(10,2)=45 pairs per photo
    # and 6x8x45=2,160 pairs per scenario across occupations"; "each pair is evaluated twice with
    # swapped A/B assignments"; scenarios Income, Education, Perceived Safety
    _, items, _, trials = focus
    rows = [t for t in trials if t["protocol"] == "2afc"]
    assert len({t["pair_id"] for t in rows if t["question"] == "income"}) == 2160
    assert len(rows) == 3 * 2160 * 2
    by_template: dict[str, list[str]] = {}
    for r in items:
        by_template.setdefault(r["template_id"], []).append(r["item_id"])
    expected = {
        (q, pair)
        for q in ("income", "education", "perceived_safety")
        for ids in by_template.values()
        for pair in permutations(ids, 2)
    }
    got = [(t["question"], tuple(t["images"])) for t in rows]
    assert len(got) == len(set(got)) and set(got) == expected
    assert {(t["group"]["variants"], t["group"]["complete"]) for t in rows} == {(10, True)}


def test_focus_mcq_and_salary_match_the_papers_counts_row_for_row(focus):
    # FOCUS Table 4: MCQ Salary and Education, N = 480 each; 3.2 Task 3: "We evaluate the full Cartesian
    # product between portraits and biographies, yielding 4,000 instances per occupation (24,000 total)"
    _, items, bios, trials = focus
    mcq = [(t["question"], t["images"][0]) for t in trials if t["protocol"] == "mcq"]
    assert len(mcq) == 2 * 480 and set(mcq) == {(q, r["item_id"]) for q in ("salary", "education") for r in items}
    salary = [(t["images"][0], t["biography_id"]) for t in trials if t["protocol"] == "salary"]
    assert len(salary) == 24_000
    expected = {(r["item_id"], b["id"]) for r in items for b in bios[r["source"]["occupation"]]}
    assert len(set(salary)) == len(salary) and set(salary) == expected
    per_occupation = Counter(t["group"]["occupation"] for t in trials if t["protocol"] == "salary")
    assert per_occupation == dict.fromkeys(FOCUS_OCCUPATIONS, 4000)
    # the MCQ prompt names the image's occupation (3.2 Task 2: "one image with an occupation")
    occupation_of = {r["item_id"]: r["source"]["occupation"] for r in items}
    assert all(occupation_of[t["images"][0]] in t["prompt"] for t in trials if t["protocol"] == "mcq")


def test_focus_trial_ids_are_unique_and_rows_match_the_schema(focus):
    *_, trials = focus
    assert len({t["trial_id"] for t in trials}) == len(trials) == 12_960 + 960 + 24_000
    # schema check on a spread of rows: every protocol and question, first and last rows
    sample = {(t["protocol"], t["question"]): t for t in trials}
    assert validate_rows("trials.jsonl", [*sample.values(), trials[0], trials[-1]]) == []


@pytest.fixture(scope="module")
def limb(tmp_path_factory):
    """The shipped limb-pairs design on copies of the bundled limb photos (their hand masks)."""
    root = tmp_path_factory.mktemp("limb")
    photos = root / "photos"
    photos.mkdir()
    meta = yaml.safe_load((PHOTOS_DIR / "limb-metadata.yaml").read_text(encoding="utf-8"))
    for source in meta["sources"]:
        shutil.copyfile(PHOTOS_DIR / source["path"], photos / source["path"])
    (root / "metadata.yaml").write_text(yaml.safe_dump(meta), encoding="utf-8")
    spec = load_spec(_with_classical("limb-pairs.yaml", root, str(photos), str(root / "metadata.yaml")))
    records = load_metadata(root / "metadata.yaml")
    items = _manifest(spec, records, photos)
    return spec, items, build_trials(items, spec.trials, expected_variants=2)


def _bank(name: str) -> dict:
    return yaml.safe_load((TRIALS_DIR / f"{name}.yaml").read_text(encoding="utf-8"))


def test_limb_pairs_query_each_original_once_per_prompt_row_for_row(limb):
    # InclusiveCF: "each image (original vs. counterfactual) is queried independently in a separate
    # single-image session under identical prompt phrasing"; the same-cue control is "re-inpainted
    # with cue kept visible"
    spec, items, trials = limb
    bank = _bank(spec.trials.prompts)["limb_pair"]
    prompts = (
        len(bank["prompts"]) if "prompts" in bank else len(bank["control"]) + sum(map(len, bank["domains"].values()))
    )
    repeats = bank.get("noise_repeats", 0)
    rows = [t for t in trials if t["protocol"] == "limb_pair"]
    photos = {r["source"]["sha256"] for r in items}
    assert len(items) == 2 * len(photos)  # removed + same-cue control per photo
    queried = [(t["variant"], t["images"][0], t["question"], t.get("repeat")) for t in rows]
    assert len(queried) == len(set(queried))
    originals = [q for q in queried if q[0] == "original"]
    assert len(originals) == len(photos) * prompts * (1 + repeats)
    assert {q[1] for q in originals} == {SOURCE_PREFIX + s for s in photos}
    assert Counter(q[0] for q in queried if q[0] != "original") == {
        "removed": len(photos) * prompts, "same_cue_control": len(photos) * prompts
    }  # fmt: skip
    assert all(t["group"]["condition"] is None for t in rows if t["variant"] == "original")
    assert len({t["trial_id"] for t in trials}) == len(trials)


def test_disability_context_is_one_np_and_nine_dp_per_image(limb):
    # disability-np-dp-audit 3.3: "each image yields one NP response and nine DP response, resulting in
    # 2,000 captioning instances (200 images x [1 NP + 9 DPs]) and 1800 pairs"
    _, items, trials = limb
    rows = [t for t in trials if t["protocol"] == "disability_context"]
    assert len(rows) == len(items) * (1 + 9)
    per_image = Counter((t["images"][0], t["variant"]) for t in rows)
    assert set(per_image.values()) == {1, 9}
    assert {k for k, v in per_image.items() if v == 1} == {(r["item_id"], "neutral") for r in items}
    assert len({(t["images"][0], t["category"]) for t in rows if t["variant"] == "context"}) == len(items) * 9


def test_example_biographies_are_50_per_focus_occupation_and_the_scripts_output():
    # FOCUS 3.2 Task 3: "We construct 50 biographies per occupation"; "All biographies are normalized to
    # remove demographic leakage by anonymizing names, neutralizing pronouns"
    import runpy

    script = runpy.run_path(str(TRIALS_DIR / "make_biographies.py"))
    target = TRIALS_DIR / "biographies_example_v2.yaml"
    assert target.read_text(encoding="utf-8") == script["render"]()
    bios = load_biographies(target)
    for occupation in FOCUS_OCCUPATIONS:
        assert len(bios[occupation]) == 50 and len({b["text"] for b in bios[occupation]}) == 50
    pronouns = {"he", "she", "his", "her", "him", "hers", "they", "their", "mr", "mrs", "ms"}
    for texts in bios.values():
        for b in texts:
            words = set(b["text"].lower().replace(".", " ").replace(",", " ").split())
            assert not words & pronouns, b
    ids = [b["id"] for texts in bios.values() for b in texts]
    assert len(ids) == len(set(ids))


def _published(spec_name: str, root: Path, photos: Path, metadata: Path, **overrides):
    """Publish the shipped spec with the classical editor (run steps without Prefect); the gates
    are loosened so the demo editor's tints are accepted: this is about the trials, not the gates."""
    from tests.flows.review_setup import run_and_publish

    path = _with_classical(spec_name, root, str(photos), str(metadata))
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["align"] = {"max_residual_px": 50.0}
    data |= overrides
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    sealed, _ = run_and_publish(path, root / "out")
    return load_spec(path), sealed.path


@pytest.mark.slow
def test_a_published_focus_release_holds_the_formulas_trials_row_for_row(tmp_path):
    from counterfactory.manifests.release import read_jsonl
    from counterfactory.manifests.release_verify import verify_release

    photos = tmp_path / "photos"
    photos.mkdir()
    rows = []
    for name, occupation, gender in (("grace_hopper.jpg", "nurse", "female"), ("obama_portrait.jpg", "doctor", "male")):
        shutil.copyfile(PHOTOS_DIR / name, photos / name)
        rows.append({"id": Path(name).stem, "path": name, "licence": "public domain (copy)", "occupation": occupation,
                     "presented_gender": gender})  # fmt: skip
    (tmp_path / "meta.yaml").write_text(yaml.safe_dump({"sources": rows}))
    spec, release = _published(
        "focus.yaml",
        tmp_path,
        photos,
        tmp_path / "meta.yaml",
        gates={"face": {"identity": {"max_cosine": 0.999}, "skin": None, "locality": None}},
        design={**yaml.safe_load((SPECS_DIR / "focus.yaml").read_text())["design"], "templates_per_stratum": 1},
    )
    assert verify_release(release) == []
    manifest = read_jsonl(release / "manifest.jsonl")
    derived = read_jsonl(release / "derived.jsonl")
    trials = read_jsonl(release / "trials.jsonl")
    bios = load_biographies(spec.trials.biographies)
    assert manifest and len({t["trial_id"] for t in trials}) == len(trials)
    by_template: dict[str, list[str]] = {}
    for r in manifest:
        by_template.setdefault(r["template_id"], []).append(r["item_id"])
    # 2AFC: n (n - 1) ordered pairs per template (45 unordered pairs x 2 orders at n = 10), per scenario
    expected_2afc = {
        (q, p)
        for q in ("income", "education", "perceived_safety")
        for ids in by_template.values()
        for p in permutations(ids, 2)
    }
    got_2afc = [(t["question"], tuple(t["images"])) for t in trials if t["protocol"] == "2afc"]
    assert len(got_2afc) == len(expected_2afc) == 3 * sum(len(v) * (len(v) - 1) for v in by_template.values())
    assert set(got_2afc) == expected_2afc

    # MCQ: each item and each robustness variant (mirror, 2 crops) once per question; the crop
    # series' original level is the item's own pixels, asked once as the item (issue 37)
    def identity(d: dict) -> bool:
        return d["transform"]["kind"] == "crop" and d["transform"].get("level") == "original"

    assert sum(map(identity, derived)) == len(manifest)
    images = [r["item_id"] for r in manifest] + [d["item_id"] for d in derived if not identity(d)]
    got_mcq = [(t["question"], t["images"][0]) for t in trials if t["protocol"] == "mcq"]
    assert len(derived) == 4 * len(manifest) and len(got_mcq) == 2 * len(images)
    assert set(got_mcq) == {(q, i) for q in ("salary", "education") for i in images}
    # salary: each item x the 50 biographies of its occupation
    got_salary = [(t["images"][0], t["biography_id"]) for t in trials if t["protocol"] == "salary"]
    assert len(got_salary) == 50 * len(manifest)
    assert set(got_salary) == {(r["item_id"], b["id"]) for r in manifest for b in bios[r["source"]["occupation"]]}
    assert len(trials) == len(got_2afc) + len(got_mcq) + len(got_salary)


@pytest.mark.slow
def test_a_published_limb_release_queries_each_original_once_and_holds_the_np_dp_unit(tmp_path):
    from counterfactory.manifests.release import read_jsonl
    from counterfactory.manifests.release_verify import verify_release

    photos = tmp_path / "photos"
    photos.mkdir()
    meta = yaml.safe_load((PHOTOS_DIR / "limb-metadata.yaml").read_text(encoding="utf-8"))
    for source in meta["sources"]:
        shutil.copyfile(PHOTOS_DIR / source["path"], photos / source["path"])
    (tmp_path / "meta.yaml").write_text(yaml.safe_dump(meta))
    spec, release = _published("limb-pairs.yaml", tmp_path, photos, tmp_path / "meta.yaml")
    assert verify_release(release) == []
    manifest = read_jsonl(release / "manifest.jsonl")
    trials = read_jsonl(release / "trials.jsonl")
    assert manifest and len({t["trial_id"] for t in trials}) == len(trials)
    bank = _bank(spec.trials.prompts)["limb_pair"]
    prompts, repeats = len(bank["prompts"]), bank["noise_repeats"]
    originals = {r["source"]["sha256"] for r in manifest}
    limb = [t for t in trials if t["protocol"] == "limb_pair"]
    assert len(limb) == len(originals) * prompts * (1 + repeats) + len(manifest) * prompts
    assert Counter(t["images"][0] for t in limb if t["variant"] == "original") == {
        SOURCE_PREFIX + s: prompts * (1 + repeats) for s in originals
    }
    npdp = [t for t in trials if t["protocol"] == "disability_context"]
    assert len(npdp) == len(manifest) * (1 + 9)
    assert Counter(t["variant"] for t in npdp) == {"neutral": len(manifest), "context": 9 * len(manifest)}
