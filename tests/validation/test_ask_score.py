"""``ask`` against an OpenAI-compatible stand-in model on 127.0.0.1, then ``score`` (issue 37).

The release is FOCUS-shaped (``tests/validation/focus_ask.yaml``: FOCUS's design, trials and
robustness variants on the classical editor, 2 templates x the 6 groups whose images that editor
tells apart; 2AFC + MCQ with its variants + salary x 50 biographies + the NP/DP description
pairs), and the limb-pairs demo with InclusiveCF's bank (``limb_ask.yaml``), each made once by
the real command line. The stand-in (:mod:`tests.validation.standin_vlm`) answers with injected effects
("biased") or none ("null"); every injected effect is recovered with an interval covering the
injected value, and the null model shows none beyond its intervals. ``ask`` SIGKILLed half-way
and run again sends only the missing requests; a third run sends none; the server never sees
more requests in flight than the bound.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from counterfactory.manifests.release import read_jsonl
from counterfactory.validation.scoring.answers import AnswersError
from counterfactory.validation.scoring.ask import ask
from counterfactory.validation.scoring.judge import judge_npdp
from counterfactory.validation.scoring.score import score
from tests.conftest import REPO
from tests.flows.unchanged import cli_env, run_cli
from tests.validation.standin_vlm import (
    DISABILITY_SUFFIX,
    FEMALE_PREFERENCE,
    FIRST_BIAS,
    RATING_REMOVED,
    SALARY_MULTIPLIER,
    StandIn,
    pixel_index,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

BOUND = 4
SPEC = Path(__file__).with_name("focus_ask.yaml")


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("focus-ask")
    run_cli(SPEC, out)
    release = out / "releases" / "focus-ask" / "0.1.0"
    # every image of a template tells its group: the stand-in model knows an image by its bytes
    manifest = read_jsonl(release / "manifest.jsonl")
    assert len({r["image"]["sha256"] for r in manifest}) == len(manifest)
    return release


def _images(release: Path) -> dict[str, dict]:
    """What the stand-in knows of each image of the release, by the sha256 of its bytes: its
    condition (a limb image: its variant, original / removed / same_cue_control)."""
    images = {}
    for t in read_jsonl(release / "trials.jsonl"):
        g = t["group"]
        if t["protocol"] == "2afc":
            conds = [g["condition_a"], g["condition_b"]]
        elif t["protocol"] == "limb_pair":
            conds = [{"variant": t["variant"]}]
        else:
            conds = [g.get("condition") or {}]  # a no-image trial has neither
        for path, cond in zip(t["image_paths"], conds):
            images[hashlib.sha256((release / path).read_bytes()).hexdigest()] = cond
    return images


@pytest.fixture(scope="module")
def standin(release):
    # lmms-eval re-encodes each image: the stand-in knows it by its pixels too
    paths = {release / p for t in read_jsonl(release / "trials.jsonl") for p in t["image_paths"]}
    server = StandIn(_images(release), latency_s=0.005, pixels=pixel_index(sorted(paths))).start()
    yield server
    server.stop()


def _env() -> dict[str, str]:
    env = cli_env()
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        env.pop(k, None)
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


def _ask_cmd(release: Path, model: str, base_url: str, ledger: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "counterfactory",
        "ask",
        str(release),
        "--model",
        model,
        "--base-url",
        base_url,
        "--ledger",
        str(ledger),
        "--concurrency",
        str(BOUND),
    ]


def _answers(ledger: Path) -> int:
    if not ledger.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True) as db:
            return db.execute("select count(*) from answers").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


@pytest.fixture(scope="module")
def biased(release, standin, tmp_path_factory) -> dict:
    """The biased model asked by the command line: killed half-way, run again, run a third time."""
    ledger = tmp_path_factory.mktemp("answers") / "biased.answers.sqlite"
    total = len(read_jsonl(release / "trials.jsonl"))
    cmd = _ask_cmd(release, "biased", standin.base_url, ledger)
    standin.reset_counts()
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while _answers(ledger) < total // 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    first = {"requests": standin.requests, "errors": standin.errors_sent, "max_in_flight": standin.max_in_flight}
    kept = _answers(ledger)
    standin.reset_counts()
    second = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    after_second = {"requests": standin.requests, "errors": standin.errors_sent, "max_in_flight": standin.max_in_flight}
    standin.reset_counts()
    third = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=900)
    assert third.returncode == 0, third.stderr[-3000:]
    return {
        "ledger": ledger,
        "total": total,
        "kept": kept,
        "first": first,
        "second": after_second,
        "second_out": second.stdout,
        "third_requests": standin.requests,
        "third_out": third.stdout,
    }


@pytest.fixture(scope="module")
def scores(release, standin, biased, tmp_path_factory) -> dict:
    null_ledger = tmp_path_factory.mktemp("answers") / "null.answers.sqlite"
    summary = ask(
        release,
        backend="openai",
        options={"model": "null", "base_url": standin.base_url},
        concurrency=BOUND,
        ledger=null_ledger,
    )
    assert summary.failed == 0 and summary.asked == biased["total"]
    # the LLM judge (NP/DP C.5) over each model's disability-context answers, into the same ledgers
    for model, ledger in (("biased", biased["ledger"]), ("null", null_ledger)):
        judged = judge_npdp(
            release,
            backend="openai",
            options={"model": "judge", "base_url": standin.base_url},
            of_model=model,
            ledger=ledger,
        )
        assert judged.failed == 0 and judged.asked == judged.wanted > 0
        again = judge_npdp(
            release,
            backend="openai",
            options={"model": "judge", "base_url": standin.base_url},
            of_model=model,
            ledger=ledger,
        )
        assert again.asked == 0 and again.already == judged.wanted
    out = tmp_path_factory.mktemp("scores")
    return score(release, [biased["ledger"], null_ledger], out, resamples=199) | {"_out": out}


def test_sigkill_loses_only_what_was_in_flight_and_a_rerun_asks_only_the_missing(biased):
    total, kept, first, second = biased["total"], biased["kept"], biased["first"], biased["second"]
    assert 0 < kept < total
    # the server answered at most BOUND requests the killed run had not committed
    assert first["requests"] - first["errors"] - kept <= BOUND
    # the second run sends exactly the missing ones (and the retries of the 503s it got)
    assert second["requests"] - second["errors"] == total - kept
    assert f"{total - kept} asked, {kept} already answered, 0 failed" in biased["second_out"]
    # a third run sends none
    assert biased["third_requests"] == 0
    assert f"0 asked, {total} already answered" in biased["third_out"]
    # bounded concurrency, and transport errors (503) retried
    assert 1 < max(first["max_in_flight"], second["max_in_flight"]) <= BOUND
    assert first["errors"] + second["errors"] > 0
    assert _answers(biased["ledger"]) == total


def _covers(ci, value, tol=1e-9):
    return ci is not None and ci[0] - tol <= value <= ci[1] + tol


def test_score_recovers_each_injected_effect_within_its_interval(scores):
    b = scores["models"]["biased"]
    safety = b["focus_2afc"]["perceived_safety"]
    # a per-group 2AFC preference: female preferred in FEMALE_PREFERENCE of mixed-gender pairs
    female = safety["win_rate_by_axis"]["gender"]["female"]
    assert _covers(female["ci"], FEMALE_PREFERENCE), female
    # a first-position bias: "A" in FIRST_BIAS of trials, else the preferred image (first in half)
    for q, s in b["focus_2afc"].items():
        assert _covers(s["p_first"]["ci"], FIRST_BIAS + (1 - FIRST_BIAS) / 2), (q, s["p_first"])
        # retained only when the order with the preferred image second was not overridden
        assert _covers(s["retention"]["ci"], 1 - FIRST_BIAS), (q, s["retention"])
        assert set(s["discarded"]) == {"inconsistent"}
    # an MCQ gender gap of one bracket (male D = 4, female C = 3)
    gender = b["focus_mcq"]["salary"]["gender"]
    assert gender["groups"]["male"]["mean"] == 4 and gender["groups"]["female"]["mean"] == 3
    assert _covers(gender["gap_ci"], 1.0)
    # a salary multiplier per group: Gap% = (multiplier - 1) x 100 against White
    groups = b["focus_salary"]["by_occupation"]["all"]["race"]["groups"]
    for race, mult in SALARY_MULTIPLIER.items():
        for how in ("mean", "median"):
            assert groups[race][f"gap_{how}"] == pytest.approx((mult - 1) * 100)
            assert _covers(groups[race][f"gap_{how}_ci"], (mult - 1) * 100, 1e-6)
    # refusals for one group: MCQ education declined for Black images, for no one else
    refusals = b["refusals"]["mcq.education"]["by_group"]
    for g, r in refusals.items():
        assert _covers(r["ci"], 1.0 if "Black" in g.split() else 0.0), (g, r)
    assert b["refusals"]["mcq.education"]["tvd_score"] > 0


def test_a_null_model_shows_no_effect_beyond_its_intervals(scores):
    n = scores["models"]["null"]
    for q, s in n["focus_2afc"].items():
        assert _covers(s["p_first"]["ci"], 0.5), (q, s["p_first"])
        assert s["retention"]["rate"] == 1.0
        for v, r in s["win_rate_by_axis"]["gender"].items():
            assert _covers(r["ci"], 0.5), (q, v, r)
    for q in ("salary", "education"):
        assert _covers(n["focus_mcq"][q]["gender"]["gap_ci"], 0.0)
    for race, r in n["focus_salary"]["by_occupation"]["all"]["race"]["groups"].items():
        assert r["gap_mean"] == pytest.approx(0.0), race
    assert all(r["overall"]["k"] == 0 for r in n["refusals"].values())


def test_score_writes_the_report_files(scores):
    out = scores["_out"]
    assert json.loads((out / "scores.json").read_text())["models"].keys() == {"biased", "null"}
    rows = read_jsonl(out / "per_trial.jsonl")
    assert {"strict", "lenient", "why_invalid", "lenient_why_invalid", "refusal"} <= set(rows[0])
    refused = [r for r in rows if r["model"] == "biased" and r["question"] == "education" and r["refusal"]]
    assert refused and all(r["why_invalid"] == "refusal" for r in refused)
    for name in ("focus_table1_polarisation", "focus_table2_mcq_jsd", "focus_4_3_salary_gap", "focus_table5_spearman"):
        assert (out / "tables" / f"{name}.csv").is_file() and (out / "tables" / f"{name}.md").is_file()
    assert (out / "plots" / "win_rates_biased_perceived_safety.png").is_file()
    assert (out / "plots" / "salary_gap_biased.png").is_file()
    assert "focus_table1_polarisation" in (out / "report.html").read_text()


def test_the_docs_score_report_is_what_score_writes(scores):
    # docs/ask-score.md: its two tables are this release's, asked of the same stand-in
    # (Wilson intervals and ANOVA: neither the resamples nor --min-n move them)
    import re

    readme = (REPO / "docs" / "ask-score.md").read_text()
    for name in ("focus_4_1_2afc_retention", "npdp_table8_anova"):
        shown = re.search(rf"`scores/tables/{name}\.md`.*?\n\n(\|.*?)\n\n", readme, re.S).group(1)
        assert shown == (scores["_out"] / "tables" / f"{name}.md").read_text().strip(), name
    for image in ("score-example-salary-gap.png", "score-example-win-rates.png"):
        assert f"]({image})" in readme and (REPO / "docs" / image).is_file()


def test_score_refuses_answers_that_are_not_the_releases(release, tmp_path):
    trial = read_jsonl(release / "trials.jsonl")[0]
    foreign = tmp_path / "foreign.jsonl"
    row = {"trial_id": "0" * 24, "prompt_sha256": trial["prompt_sha256"], "model": "m", "reply": "A"}
    foreign.write_text(json.dumps(row) + "\n")
    with pytest.raises(AnswersError, match="not in this release's trials.jsonl"):
        score(release, [foreign], tmp_path / "out")
    other_bank = tmp_path / "other.jsonl"
    other_bank.write_text(json.dumps(row | {"trial_id": trial["trial_id"], "prompt_sha256": "f" * 64}) + "\n")
    with pytest.raises(AnswersError, match="prompt file sha256"):
        score(release, [other_bank], tmp_path / "out")
    done = subprocess.run(
        [sys.executable, "-m", "counterfactory", "score", str(release), str(other_bank), "--out", str(tmp_path / "o")],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and done.stderr.startswith("error: 1 answers are not this release's")


def test_npdp_sentiment_drop_and_verbosity_rise_under_disability_context(scores, standin, release):
    from counterfactory.validation.scoring.metrics import vader_compound

    # the injected shift per image: its neutral description, then the same with the suffix
    shas = {r["item_id"]: r["image"]["sha256"] for r in read_jsonl(release / "manifest.jsonl")}
    neutral = [standin.describe(sha, False) for sha in shas.values()]
    vader = sum(vader_compound(f"{n} {DISABILITY_SUFFIX}") - vader_compound(n) for n in neutral) / len(neutral)
    b = scores["models"]["biased"]["npdp"]["context"]
    assert b["vader"]["all"]["delta"] == pytest.approx(vader)
    assert _covers(b["vader"]["all"]["delta_ci"], vader, 1e-9) and vader < 0
    assert b["vader"]["all"]["p_value"] < 0.05 and b["vader"]["all"]["cohens_d"] < 0
    words = len(DISABILITY_SUFFIX.split())
    assert b["verbosity"]["all"]["delta"] == pytest.approx(words)
    assert _covers(b["verbosity"]["all"]["delta_ci"], words)
    n = scores["models"]["null"]["npdp"]["context"]
    for metric in ("vader", "verbosity"):
        assert n[metric]["all"]["delta"] == 0 and _covers(n[metric]["all"]["delta_ci"], 0.0)
    # Regard needs a model that is not here: reported absent, with why
    assert scores["models"]["null"]["npdp"]["regard"]["available"] is False


def test_npdp_judge_rates_with_the_rubric_sha256(scores):
    import hashlib as _hashlib

    import yaml

    from counterfactory.manifests.trials import TRIALS_DIR

    # NP/DP C.5 judged each (neutral, context) pair; its sha256 is on every judgement
    rubric = yaml.safe_load((TRIALS_DIR / "trial_prompts_v3.yaml").read_text())["disability_context"]["judge_rubric"]
    sha = _hashlib.sha256(rubric.encode()).hexdigest()
    b = scores["models"]["biased"]["npdp_judge"]
    n = scores["models"]["null"]["npdp_judge"]
    assert b["rubric_sha256"] == n["rubric_sha256"] == [sha]
    for d in ("interpret", "stereotype", "framing"):
        assert _covers(b["groups"]["context:all"][d]["ci"], 1.0) and b["groups"]["context:all"][d]["rate"] == 1.0
        assert n["groups"]["context:all"][d]["rate"] == 0.0 and _covers(n["groups"]["context:all"][d]["ci"], 0.0)
    assert b["groups"]["context:all"]["n"] == 12 * 9 and b["groups"]["context:all"]["unparsed"] == 0
    assert (scores["_out"] / "tables" / "npdp_table1_judge.md").is_file()


# ---------------------------------------------------------------- harnesses


def lmms_eval_python() -> str:
    """The Python that runs lmms-eval: this one when it has lmms_eval, else ``$LMMS_EVAL_PYTHON``, else
    the repository's ``.venv-harness`` (lmms-eval lives in its own environment: its pins replace
    protobuf and put opencv-python-headless over opencv-contrib-python's cv2; README, Testing)."""
    import importlib.util

    if importlib.util.find_spec("lmms_eval") is not None:
        return sys.executable
    for candidate in (os.environ.get("LMMS_EVAL_PYTHON"), str(REPO / ".venv-harness" / "bin" / "python")):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.fail(
        "lmms-eval is not installed: python3 -m venv .venv-harness && .venv-harness/bin/pip install "
        "torch==2.14.1 torchvision==0.29.1 'lmms-eval==0.7.3' 'filelock<4' (as .ci/run does; or set LMMS_EVAL_PYTHON)"
    )


@pytest.fixture(scope="module")
def lmms_logs(release, standin, biased, tmp_path_factory) -> Path:
    """The release exported by the command line for lmms-eval, run by lmms-eval end to end through
    its own OpenAI-compatible model class against the stand-in, with its sample logs."""
    tmp = tmp_path_factory.mktemp("lmms")
    tasks = tmp / "tasks"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "counterfactory",
            "release",
            "export",
            str(release),
            str(tasks),
            "--harness",
            "lmms-eval",
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    names = [p.stem for p in sorted(tasks.glob("cf_*.yaml"))]
    assert names == ["cf_focus_ask_2afc", "cf_focus_ask_disability_context", "cf_focus_ask_mcq", "cf_focus_ask_salary"]
    env = _env() | {
        "OPENAI_API_KEY": "not-needed",
        "HF_HOME": str(tmp / "hf"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "WANDB_MODE": "disabled",
    }
    logs = tmp / "logs"
    standin.reset_counts()
    run = subprocess.run(
        [
            lmms_eval_python(),
            "-m",
            "lmms_eval",
            "--model",
            "openai",
            "--model_args",
            f"model=biased,base_url={standin.base_url},num_concurrent={BOUND},retry_backoff_s=0.05",
            "--tasks",
            ",".join(names),
            "--include_path",
            str(tasks),
            "--log_samples",
            "--output_path",
            str(logs),
        ],
        env=env,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-6000:])
    # every trial reached the model once (and the 503s it got were retried)
    total = len(read_jsonl(release / "trials.jsonl"))
    assert standin.requests - standin.errors_sent == total, (standin.requests, standin.errors_sent, total)
    return logs


def _comparable(scores: dict) -> dict:
    entry = dict(scores["models"]["biased"])
    entry.pop("npdp_judge", None)  # the ledger also holds the judge's verdicts; lmms-eval's logs do not
    return entry


def test_lmms_eval_runs_the_exported_task_and_its_logs_score_as_ask_does(release, biased, lmms_logs, tmp_path):
    from_ask = score(release, [biased["ledger"]], tmp_path / "ask", resamples=199)
    done = subprocess.run(
        [sys.executable, "-m", "counterfactory", "score", str(release), str(lmms_logs), "--from", "lmms-eval"]
        + ["--out", str(tmp_path / "lmms"), "--resamples", "199"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    from_lmms = json.loads((tmp_path / "lmms" / "scores.json").read_text())
    assert from_lmms["answers"] == biased["total"] == from_ask["answers"]
    assert list(from_lmms["models"]) == ["biased"]
    assert _comparable(from_lmms) == json.loads(json.dumps(_comparable(from_ask)))
    # the same reading of every reply, trial by trial
    ask_rows = {r["trial_id"]: r for r in read_jsonl(tmp_path / "ask" / "per_trial.jsonl")}
    lmms_rows = {r["trial_id"]: r for r in read_jsonl(tmp_path / "lmms" / "per_trial.jsonl")}
    assert ask_rows.keys() == lmms_rows.keys()
    for tid, row in lmms_rows.items():
        assert (row["reply"], row["strict"]) == (ask_rows[tid]["reply"], ask_rows[tid]["strict"]), tid


def test_score_from_lmms_eval_refuses_another_releases_logs_and_failed_requests(release, lmms_logs, tmp_path):
    from counterfactory.validation.scoring.harness import read_lmms_eval

    trials = {t["trial_id"]: t for t in read_jsonl(release / "trials.jsonl")}
    sample_file = next(lmms_logs.rglob("*_samples_cf_focus_ask_salary.jsonl"))
    copy = tmp_path / sample_file.parent.name
    copy.mkdir()
    results = next(sample_file.parent.glob(sample_file.name.split("_samples_")[0] + "_results.json"))
    (copy / results.name).write_text(results.read_text())
    lines = sample_file.read_text().splitlines()
    first = json.loads(lines[0])
    bad = copy / sample_file.name
    bad.write_text(json.dumps(first | {"target": "0" * 24}) + "\n")
    with pytest.raises(AnswersError, match="not in this release's trials.jsonl"):
        read_lmms_eval([copy], trials)
    bad.write_text(json.dumps(first | {"input": first["input"] + " Answer briefly."}) + "\n")
    with pytest.raises(AnswersError, match="another prompt than the bank's"):
        read_lmms_eval([copy], trials)
    failed = "[LMMS_EVAL_REQUEST_FAILED after 5 retries] Connection error."
    bad.write_text(json.dumps({k: v for k, v in first.items() if k != "resps"} | {"filtered_resps": failed}) + "\n")
    with pytest.raises(AnswersError, match="1 requests failed in lmms-eval"):
        read_lmms_eval([copy], trials)


def _vlmevalkit_predictions(tasks: Path, base_url: str, work_dir: Path) -> list[Path]:
    """Run the exported datasets as VLMEvalKit's inference does (it is not on PyPI): each TSV row's
    messages as the shipped dataset class builds them (images from ``image_path``, a list literal
    for a pair, then the question), answered by an OpenAI-compatible API model that sends the
    image files as data URLs, and the prediction file ``<model>_<dataset>.tsv`` written as
    ``vlmeval.inference.infer_data_job`` and ``vlmeval.smp.dump`` write it (the dataset's columns
    but ``image``, plus ``prediction``; ``to_csv(sep="\\t", quoting=csv.QUOTE_ALL)``)."""
    import ast
    import csv

    import openai
    import pandas as pd

    from counterfactory.validation.scoring.backends import data_url

    client = openai.OpenAI(api_key="not-needed", base_url=base_url, max_retries=5)
    work_dir.mkdir(parents=True)
    out = []
    for tsv in sorted(tasks.glob("cf_*.tsv")):
        data = pd.read_csv(tsv, sep="\t")
        predictions = []
        for _, line in data.iterrows():
            paths = []
            if int(line["n_images"]):
                cell = str(line["image_path"])
                paths = ast.literal_eval(cell) if cell.startswith("[") else [cell]
            content = [{"type": "text", "text": line["question"]}]
            content += [
                {"type": "image_url", "image_url": {"url": data_url((tasks / p).read_bytes(), Path(p).suffix)}}
                for p in paths
            ]
            resp = client.chat.completions.create(model="biased", messages=[{"role": "user", "content": content}])
            predictions.append(resp.choices[0].message.content)
        data["prediction"] = predictions
        path = work_dir / f"biased_{tsv.stem}.tsv"
        data.to_csv(path, sep="\t", index=False, encoding="utf-8", quoting=csv.QUOTE_ALL)
        out.append(path)
    client.close()
    return out


def test_vlmevalkit_export_and_its_prediction_files_score_as_ask_does(release, standin, biased, tmp_path):
    tasks = tmp_path / "vlmevalkit"
    done = subprocess.run(
        [sys.executable, "-m", "counterfactory", "release", "export", str(release), str(tasks)]
        + ["--harness", "vlmevalkit"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    dataset = (tasks / "counterfactory_dataset.py").read_text()
    assert "class CounterfactoryDataset(ImageBaseDataset)" in dataset and "cf_focus_ask_2afc" in dataset
    preds = _vlmevalkit_predictions(tasks, standin.base_url, tmp_path / "outputs" / "biased" / "T20261205")
    assert len(preds) == 4
    from_ask = score(release, [biased["ledger"]], tmp_path / "ask", resamples=199)
    done = subprocess.run(
        [sys.executable, "-m", "counterfactory", "score", str(release), str(tmp_path / "outputs"), "--from"]
        + ["vlmevalkit", "--out", str(tmp_path / "vlm"), "--resamples", "199"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    from_vlm = json.loads((tmp_path / "vlm" / "scores.json").read_text())
    assert from_vlm["answers"] == from_ask["answers"] and list(from_vlm["models"]) == ["biased"]
    assert _comparable(from_vlm) == json.loads(json.dumps(_comparable(from_ask)))
    # a failed request is not an answer
    import csv

    import pandas as pd

    from counterfactory.validation.scoring.harness import read_vlmevalkit

    trials = {t["trial_id"]: t for t in read_jsonl(release / "trials.jsonl")}
    bad = pd.read_csv(preds[0], sep="\t", dtype=str, keep_default_na=False)
    bad.loc[0, "prediction"] = "Failed to obtain answer via API."
    (tmp_path / "failed").mkdir()
    bad.to_csv(tmp_path / "failed" / preds[0].name, sep="\t", index=False, quoting=csv.QUOTE_ALL)
    with pytest.raises(AnswersError, match="1 requests failed in VLMEvalKit"):
        read_vlmevalkit([tmp_path / "failed"], trials)


@pytest.fixture(scope="module")
def limb_scores(limb_ask_release, tmp_path_factory) -> dict:
    release = limb_ask_release  # the session's: answers and scores go to a folder of this module's
    out = tmp_path_factory.mktemp("limb-ask-scores")
    server = StandIn(_images(release)).start()
    try:
        ledgers = []
        for model in ("biased", "null"):
            ledgers.append(out / f"{model}.answers.sqlite")
            # the null model answers every limb trial twice (ask --samples 2): the repeated queries
            # of InclusiveCF's noise baseline
            summary = ask(
                release,
                backend="openai",
                options={"model": model, "base_url": server.base_url},
                concurrency=BOUND,
                ledger=ledgers[-1],
                samples=2 if model == "null" else 1,
            )
            assert summary.failed == 0
    finally:
        server.stop()
    trials = read_jsonl(release / "trials.jsonl")
    return score(release, ledgers, out / "scores", resamples=199) | {"_trials": trials}


def test_inclusivecf_rating_shift_for_the_removed_cue(limb_scores):
    # the classical editor's limb edits have the same pixels for both cues, so the stand-in shifts
    # every edited image: the removed cue and the same-cue control carry the same injected shift
    b = limb_scores["models"]["biased"]["inclusivecf"]
    for variant in ("removed", "same_cue_control"):
        shift = b[variant]
        # Delta = Counterfactual - Original: the injected rating shift, with its interval and sign test
        assert shift["delta_rating"] == pytest.approx(RATING_REMOVED - 4)
        assert _covers(shift["delta_rating_ci"], RATING_REMOVED - 4)
        assert shift["sign_test"]["negative"] == shift["ratings"] and shift["sign_test"]["p_value"] < 0.001
        # every decision moves from Yes to Uncertain: Delta Yes -100 pp, Delta Unc. +100 pp, TVD 100 pp
        assert shift["delta_yes_pp"] == -100 and shift["delta_uncertain_pp"] == 100
        assert shift["decision_tvd_pp"] == 100
        assert shift["control_consistency"]["rate"] == 1.0
    # the repeated-query noise baseline shows nothing (a deterministic model)
    assert b["noise_baseline"]["delta_rating"] == 0 and b["noise_baseline"]["decision_tvd_pp"] == 0
    # the bank's repeat rows are the biased model's repeated queries; the null model's are those and
    # sample 1 of every original and repeat row (ask --samples 2), all answered alike by a
    # deterministic model: no noise
    originals = [t for t in limb_scores["_trials"] if t["protocol"] == "limb_pair" and t["variant"] == "original"]
    bank_repeats = sum(t.get("repeat") is not None for t in originals)
    assert bank_repeats > 0 and b["noise_baseline"]["repeats"] == bank_repeats
    null_noise = limb_scores["models"]["null"]["inclusivecf"]["noise_baseline"]
    assert null_noise["repeats"] == bank_repeats + len(originals)
    assert null_noise["delta_rating"] == 0 and null_noise["decision_tvd_pp"] == 0
    null = limb_scores["models"]["null"]["inclusivecf"]
    for entry in null.values():
        assert entry["delta_rating"] == 0 and _covers(entry["delta_rating_ci"], 0.0)
        assert entry["delta_yes_pp"] == 0 and entry["decision_tvd_pp"] == 0


def test_a_server_that_honours_seed_gives_noise_repeats_their_own_replies(limb_ask_release, tmp_path):
    limb_release = limb_ask_release  # the session's; the answers and scores go to tmp_path
    # issue 44: ask sent seed = sample, so an original and its noise-repeat row (the same prompt
    # and image under another trial id) were one request, and the noise baseline was zero by
    # construction on a server that honours seed. Seeded from the answer id, they are two samples.
    server = StandIn(_images(limb_release), seeded=True).start()
    ledger = tmp_path / "null.answers.sqlite"
    try:
        summary = ask(
            limb_release,
            backend="openai",
            options={"model": "null", "base_url": server.base_url},
            concurrency=BOUND,
            ledger=ledger,
        )
        assert summary.failed == 0 and summary.invalid == 0
    finally:
        server.stop()
    trials = {t["trial_id"]: t for t in read_jsonl(limb_release / "trials.jsonl")}
    with sqlite3.connect(ledger) as db:
        replies = dict(db.execute("select trial_id, reply from answers"))
    originals = {
        (t["pair_id"], t["prompt"]): tid
        for tid, t in trials.items()
        if t["protocol"] == "limb_pair" and t["variant"] == "original" and t.get("repeat") is None
    }
    repeats = [
        (originals[(t["pair_id"], t["prompt"])], tid)
        for tid, t in trials.items()
        if t["protocol"] == "limb_pair" and t["variant"] == "original" and t.get("repeat") is not None
    ]
    assert repeats and sum(replies[a] != replies[b] for a, b in repeats) > 0
    noise = score(limb_release, [ledger], tmp_path / "scores", resamples=99)["models"]["null"]["inclusivecf"]
    baseline = noise["noise_baseline"]
    assert baseline["repeats"] == len(repeats)
    assert baseline["decision_tvd_pp"] > 0 or abs(baseline["delta_rating"]) > 0
