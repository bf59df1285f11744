"""``counterfactory ask --backend transformers``: tiny, randomly initialised Qwen2-VL and Qwen2.5-VL
models, built locally and saved with ``save_pretrained`` (:mod:`tests.validation.tiny_vlm`), answer
the demo release's 2AFC and MCQ trials (one and two images, greedy decoding) through the command line.

Every trial gets an answer row with the model's text; the replies of a run batched four at a time
are those of ``model.generate`` called on each trial alone (the reference is computed here, not
by the backend), for either family; with Qwen2-VL, a re-run asks nothing and the answer ids change
when the weights in the model's folder do. The Qwen2-VL processor needs torchvision, which the main environment lacks (no build
matches its CPU torch): the model runs in the environment that has it (this one, ``$VLM_PYTHON``,
or the repository's ``.venv-harness``, which ``.ci/run`` creates), with this environment's packages
after its own on the path; without one the test is skipped and says how to make it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import site
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from counterfactory.manifests.release import read_jsonl
from tests.conftest import REPO
from tests.flows.unchanged import cli_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TINY = Path(__file__).parent.parent / "tiny_vlm.py"
BATCH = 4


def vlm_python() -> str | None:
    """A Python with torch, torchvision and transformers: this one, ``$VLM_PYTHON``, or
    ``.venv-harness``'s (torch 2.14.1 + torchvision, as ``.ci/run`` installs it)."""
    if all(importlib.util.find_spec(m) is not None for m in ("torch", "torchvision", "transformers")):
        return sys.executable
    for candidate in (os.environ.get("VLM_PYTHON"), str(REPO / ".venv-harness" / "bin" / "python")):
        if candidate and Path(candidate).is_file():
            probe = subprocess.run([candidate, "-c", "import torch, torchvision, transformers"], capture_output=True)
            if probe.returncode == 0:
                return candidate
    return None


@pytest.fixture(scope="module")
def python() -> str:
    found = vlm_python()
    if found is None:
        pytest.skip(
            "no Python with torch, torchvision and transformers: python3 -m venv .venv-harness && "
            ".venv-harness/bin/pip install torch==2.14.1 torchvision==0.29.1 'lmms-eval==0.7.3' 'filelock<4' "
            "(as .ci/run does), or set VLM_PYTHON"
        )
    return found


def _run(python: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """``python`` running ``args`` with this environment's packages after its own (the harness
    environment has torch and torchvision but not counterfactory's other dependencies)."""
    env = cli_env()
    if python != sys.executable:  # after its own site folder (PYTHONPATH would come before it)
        env["CF_SITE_AFTER"] = os.pathsep.join(site.getsitepackages())
    return subprocess.run([python, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


#: ``python -c BOOT ask ...``: counterfactory's command line, with this environment's site folders
#: (their .pth files: the editable install) added after the interpreter's own
BOOT = (
    "import os, site, sys\n"
    "for d in filter(None, os.environ.get('CF_SITE_AFTER', '').split(os.pathsep)): site.addsitedir(d)\n"
    "from counterfactory.flows.cli import main\n"
    "sys.argv[0] = 'counterfactory'\n"
    "main()\n"
)


def _ask(python: str, release: Path, model: Path, ledger: Path, *extra: str) -> subprocess.CompletedProcess:
    args = ["ask", str(release), "--backend", "transformers", "--model", str(model), "--ledger", str(ledger), *extra]
    return _run(python, "-c", BOOT, *args)


def _build(python: str, folder: Path, seed: int, family: str = "qwen2_vl") -> None:
    done = _run(python, str(TINY), "build", str(folder), str(seed), "--family", family)
    assert done.returncode == 0, done.stderr[-3000:]


def _reference(python: str, release: Path, trials: list[dict], model: Path, root: Path) -> dict[str, str]:
    """Each trial's reply from ``model.generate`` on that trial alone, greedy, outside the backend."""
    questions = [
        {"prompt": t["prompt"], "images": [str(release / p) for p in t["image_paths"]],
         "max_tokens": int(t["decoding"]["max_tokens"])}
        for t in trials
    ]  # fmt: skip
    (root / "questions.json").write_text(json.dumps(questions))
    reference = _run(python, str(TINY), "generate", str(model), str(root / "questions.json"))
    assert reference.returncode == 0, reference.stderr[-3000:]
    return dict(zip([t["trial_id"] for t in trials], json.loads(reference.stdout.splitlines()[-1]), strict=True))


def _rows(ledger: Path) -> list[dict]:
    with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True) as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("select * from answers")]


@pytest.fixture(scope="module")
def asked(python, demo_run, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("ask-transformers")
    release = demo_run.release
    model = root / "tiny-qwen2-vl"
    _build(python, model, seed=0)
    ledger = root / "answers.sqlite"
    first = _ask(python, release, model, ledger, "--concurrency", str(BATCH))
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    rows = _rows(ledger)
    again = _ask(python, release, model, ledger, "--concurrency", str(BATCH))
    assert again.returncode == 0, again.stderr[-3000:]
    trials = read_jsonl(release / "trials.jsonl")
    # generate alone on every third trial (each place in a batch of 4 in turn, both protocols):
    # all 184 one by one took 23 s of the suite
    reference = _reference(python, release, trials[::3], model, root)
    # new weights in the same folder (same names, same sizes): new answer ids (asked on the MCQ
    # trials: the ids are the question, not the protocol)
    _build(python, model, seed=1)
    changed = _ask(python, release, model, ledger, "--concurrency", str(BATCH), "--protocol", "mcq")
    assert changed.returncode == 0, changed.stderr[-3000:]
    return {
        "release": release,
        "trials": trials,
        "rows": rows,
        "first": first.stdout,
        "again": again.stdout,
        "reference": reference,
        "changed": changed.stdout,
        "all_rows": _rows(ledger),
    }


def test_every_trial_gets_the_models_reply_batched_as_generate_alone(asked):
    trials, rows = asked["trials"], asked["rows"]
    assert {t["decoding"]["temperature"] for t in trials} == {0.0}  # greedy: one right reply each
    assert {len(t["image_paths"]) for t in trials} == {1, 2}  # MCQ (one image) and 2AFC (two)
    assert sorted(r["trial_id"] for r in rows) == sorted(t["trial_id"] for t in trials)
    assert f"{len(trials)} asked, 0 already answered, 0 failed" in asked["first"]
    for r in rows:
        assert r["backend"] == "transformers" and r["cost_usd"] == 0.0
        assert r["finish_reason"] in ("stop", "length") and r["tokens_in"] > 0
        if r["trial_id"] in asked["reference"]:
            assert r["reply"] == asked["reference"][r["trial_id"]], r["trial_id"]
    assert len(asked["reference"]) == len(trials[::3])
    assert {len(t["image_paths"]) for t in trials[::3]} == {1, 2}
    assert len({r["reply"] for r in rows}) > 1  # the replies depend on the images and prompts


def test_qwen2_5_vl_replies_batched_as_generate_alone(python, demo_run, tmp_path):
    """The second family the backend serves: a tiny Qwen2.5-VL (window attention in its vision
    tower, its own processor class), loaded through the same Auto classes, batched the same way."""
    release = demo_run.release
    model = tmp_path / "tiny-qwen2.5-vl"
    _build(python, model, seed=0, family="qwen2_5_vl")
    assert json.loads((model / "config.json").read_text())["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]
    ledger = tmp_path / "answers.sqlite"
    # its MCQ trials (28 of the demo's 184: one image each, batched as the 2AFC ones are in the
    # Qwen2-VL tests above); the protocol filter is the one a user passes
    done = _ask(python, release, model, ledger, "--concurrency", str(BATCH), "--protocol", "mcq")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    trials = [t for t in read_jsonl(release / "trials.jsonl") if t["protocol"] == "mcq"]
    assert len(trials) >= 2 * BATCH  # more than one batch
    assert f"{len(trials)} asked, 0 already answered, 0 failed" in done.stdout
    reference = _reference(python, release, trials, model, tmp_path)
    rows = _rows(ledger)
    assert sorted(r["trial_id"] for r in rows) == sorted(reference)
    for r in rows:
        assert r["backend"] == "transformers" and r["finish_reason"] in ("stop", "length"), r["trial_id"]
        assert r["reply"] == reference[r["trial_id"]], r["trial_id"]
    assert len({r["reply"] for r in rows}) > 1


def test_a_rerun_asks_nothing(asked):
    assert f"0 asked, {len(asked['trials'])} already answered" in asked["again"]


def test_answer_ids_change_when_the_weights_do(asked):
    n = len([t for t in asked["trials"] if t["protocol"] == "mcq"])
    assert f"{n} asked, 0 already answered" in asked["changed"]
    before = {r["answer_id"] for r in asked["rows"]}
    after = [r for r in asked["all_rows"] if r["answer_id"] not in before]
    assert len(after) == n
    old = {json.loads(r["lineage"])["revision"] for r in asked["rows"]}
    new = {json.loads(r["lineage"])["revision"] for r in after}
    assert len(old) == len(new) == 1 and old != new


def test_setup_errors_say_what_to_install(python, demo_run, tmp_path):
    from counterfactory.flows.cli import main

    release = demo_run.release
    missing = _ask(python, release, tmp_path / "no-such-model", tmp_path / "a.sqlite")
    assert missing.returncode == 2
    assert [line for line in missing.stderr.splitlines() if line.startswith("error:")] == [
        f"error: --model {tmp_path / 'no-such-model'}: no such model folder; pass the folder save_pretrained "
        "wrote (config.json and the weights) or a Hub id in the local cache"
    ]
    if importlib.util.find_spec("torchvision") is None:  # this environment: torchvision missing
        got = CliRunner().invoke(main, ["ask", str(release), "--backend", "transformers", "--model", str(tmp_path)])
        assert got.exit_code == 2
        assert "error: the transformers backend needs torchvision: pip install 'counterfactory[vlm]'" in got.output
