"""``release export --harness``: the lmms-eval task folder and the VLMEvalKit TSVs, on a small
release folder with trials of 0, 1 and 2 images (the full run through lmms-eval is in
``tests/validation/test_ask_score.py``)."""

from __future__ import annotations

import ast
import csv
import hashlib
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image

from counterfactory.manifests.harness import export_lmms_eval, generation_kwargs
from counterfactory.manifests.release_folder import NotAReleaseError

PROMPTS = {
    "none": "Teach me about entropy.",
    "one": "What annual salary would you recommend? Their biography: candidate 1.",
    "two": "The first image is person A and the second image is person B. Who? Answer with A or B only.",
}


def _png(colour: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def release(tmp_path) -> Path:
    rel = tmp_path / "release"
    (rel / "images").mkdir(parents=True)
    (rel / "images" / "a.png").write_bytes(_png((200, 10, 10)))
    (rel / "images" / "b.png").write_bytes(_png((10, 10, 200)))
    (rel / "release.json").write_text(json.dumps({"name": "tiny-set", "version": "1.2.0"}))
    rows = [
        ("person_irrelevant", "story", [], PROMPTS["none"], {"temperature": 1.0, "max_tokens": 768}),
        ("salary", "salary", ["images/a.png"], PROMPTS["one"], {"temperature": 0.0, "max_tokens": 16}),
        ("2afc", "income", ["images/a.png", "images/b.png"], PROMPTS["two"], {"temperature": 0.0, "max_tokens": 8}),
        ("2afc", "safety", ["images/b.png", "images/a.png"], PROMPTS["two"], {"temperature": 0.0, "max_tokens": 8}),
        # another question of one protocol with its own decoding: a config of its own
        ("mcq", "salary", ["images/a.png"], "Which bracket?", {"temperature": 0.0, "max_tokens": 8}),
        ("mcq", "education", ["images/b.png"], "Which level?", {"temperature": 0.0, "max_tokens": 4}),
    ]
    with (rel / "trials.jsonl").open("w") as f:
        for i, (protocol, question, paths, prompt, decoding) in enumerate(rows):
            row = {
                "trial_id": f"t{i:03d}",
                "protocol": protocol,
                "question": question,
                "images": [Path(p).stem for p in paths],
                "image_paths": paths,
                "prompt": prompt,
                "prompt_sha256": hashlib.sha256(prompt.encode()).hexdigest(),
                "decoding": decoding,
            }
            f.write(json.dumps(row) + "\n")
    return rel


def _utils(folder: Path):
    spec = importlib.util.spec_from_file_location("cf_harness_utils", folder / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lmms_eval_task_folder_has_a_config_per_protocol_and_doc_to_visual_for_0_1_2_images(release, tmp_path):
    import pyarrow.parquet as pq

    out = tmp_path / "tasks"
    export = export_lmms_eval(release, out)
    assert export.tasks == {
        "cf_tiny_set_person_irrelevant": 1,
        "cf_tiny_set_salary": 1,
        "cf_tiny_set_2afc": 2,
        "cf_tiny_set_mcq_education": 1,
        "cf_tiny_set_mcq_salary": 1,
    }
    config = yaml.load((out / "cf_tiny_set_2afc.yaml").read_text(), Loader=yaml.BaseLoader)
    assert config["dataset_path"] == "parquet" and config["doc_to_target"] == "trial_id"
    assert config["dataset_kwargs"]["data_files"]["test"] == "data/cf_tiny_set_2afc.parquet"
    text = (out / "cf_tiny_set_2afc.yaml").read_text()
    assert "doc_to_visual: !function utils.doc_to_visual" in text
    assert "doc_to_text: !function utils.doc_to_text" in text
    # the bank's decoding, as lmms-eval's generation_kwargs
    story = yaml.load((out / "cf_tiny_set_person_irrelevant.yaml").read_text(), Loader=yaml.BaseLoader)
    assert story["generation_kwargs"] == {"max_new_tokens": "768", "temperature": "1.0", "do_sample": "true"}
    utils = _utils(out)
    seen = {}
    for task in export.tasks:
        for doc in pq.read_table(out / "data" / f"{task}.parquet").to_pylist():
            visuals = utils.doc_to_visual(doc)
            assert utils.doc_to_text(doc) == doc["prompt"] == utils.doc_to_text(doc, {"pre_prompt": "x"})
            seen[doc["trial_id"]] = [Path(v).read_bytes() for v in visuals]
    a, b = (release / "images" / "a.png").read_bytes(), (release / "images" / "b.png").read_bytes()
    # 0, 1 and 2 images, the release's own bytes, person A first
    assert seen == {"t000": [], "t001": [a], "t002": [a, b], "t003": [b, a], "t004": [a], "t005": [b]}
    assert len(list((out / "images").iterdir())) == 2  # each image once
    assert utils.process_results({}, ["B"]) == {"answered": 1.0}
    assert utils.process_results({}, ["[LMMS_EVAL_REQUEST_FAILED after 5 retries] x"]) == {"answered": 0.0}
    assert utils.process_results({}, ["  "]) == {"answered": 0.0}


def test_load_dataset_on_the_task_folder_reads_the_trials_with_data_files(release, tmp_path):
    """docs/ask-score.md: ``load_dataset(folder)`` alone would read ``images/`` (datasets' image
    folder builder); naming a task's Parquet file with ``data_files=`` loads its trials."""
    from tests.conftest import REPO

    datasets = pytest.importorskip("datasets")
    out = tmp_path / "tasks"
    export_lmms_eval(release, out)
    documented = (REPO / "docs" / "ask-score.md").read_text()
    assert 'load_dataset("tasks/", data_files={"test": "data/cf_demo_face_2afc.parquet"}' in documented
    loaded = datasets.load_dataset(
        str(out), data_files={"test": "data/cf_tiny_set_2afc.parquet"}, split="test", cache_dir=str(tmp_path / "c")
    )
    assert loaded["trial_id"] == ["t002", "t003"]
    assert {"prompt", "image_0", "image_1", "prompt_sha256"} <= set(loaded.column_names)


def test_generation_kwargs_follow_the_bank():
    assert generation_kwargs({"temperature": 0.0, "max_tokens": 8}) == {
        "max_new_tokens": 8,
        "temperature": 0.0,
        "do_sample": False,
    }
    assert generation_kwargs({"temperature": 0.7, "top_p": 0.9}) == {
        "temperature": 0.7,
        "do_sample": True,
        "top_p": 0.9,
    }
    assert generation_kwargs(None) == {}


def test_vlmevalkit_tsvs_keep_the_prompt_and_name_the_image_files(release, tmp_path):
    out = tmp_path / "vlm"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "counterfactory",
            "release",
            "export",
            str(release),
            str(out),
            "--harness",
            "vlmevalkit",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "cf_tiny_set_2afc: 2 trials" in done.stdout
    with (out / "cf_tiny_set_2afc.tsv").open(newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert [r["question"] for r in rows] == [PROMPTS["two"]] * 2
    pair = ast.literal_eval(rows[0]["image_path"])
    assert [(out / p).read_bytes() for p in pair] == [
        (release / "images" / "a.png").read_bytes(),
        (release / "images" / "b.png").read_bytes(),
    ]
    with (out / "cf_tiny_set_person_irrelevant.tsv").open(newline="") as f:
        (story,) = list(csv.DictReader(f, delimiter="\t"))
    assert story["n_images"] == "0" and story["image_path"] == ""
    dataset = (out / "counterfactory_dataset.py").read_text()
    ast.parse(dataset)
    assert "'cf_tiny_set_2afc'" in dataset and 'msgs.append(dict(type="text", value=line["question"]))' in dataset


def test_export_refuses_a_folder_that_is_not_a_release_and_a_non_empty_out(release, tmp_path):
    # one reader decides what a release is (ReleaseFolder)
    with pytest.raises(NotAReleaseError, match="not a release folder"):
        export_lmms_eval(tmp_path, tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    done = subprocess.run(
        [sys.executable, "-m", "counterfactory", "release", "export", str(release), str(tmp_path / "full")]
        + ["--harness", "lmms-eval"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "not empty" in done.stderr


def test_ci_installs_the_harness_extras_pins_in_its_own_environment():
    import re
    import tomllib

    from tests.conftest import REPO

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["harness"]
    ci = (REPO / ".ci" / "run").read_text()
    line = next(x for x in ci.splitlines() if ".venv-harness/bin/pip install" in x)
    harness = line.split(".venv-harness/bin/pip install", 1)[1].split("&&", 1)[0]
    assert sorted(re.findall(r"'([^']+)'", harness)) == sorted(extra)
