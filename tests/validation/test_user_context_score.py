"""The guardrail-agnostic user-context tasks end to end (issue 37): ``ask`` a stand-in model, the
story and jargon judges (``ask --judge story|jargon``), ``score``; and the same release through
lmms-eval, the no-image trials included.

The release (``tests/validation/user_context_ask.yaml``: FOCUS's race x gender design on the
classical editor, 2 templates x 6 groups, the person_irrelevant trials only: the story and the 20
term explanations per image, and each task once with no image) is made once by the real command
line. The stand-in (:mod:`tests.validation.standin_vlm`) answers as ``biased`` (a story's
protagonist is an engineer for a man and a nurse for a woman, poor for a Black user; a woman is
taught in plain words, everyone else in jargon) or ``null`` (all of that drawn independently of
the image), and judges with the two rubrics of ``assets/trials/judge_rubrics_v1.yaml`` (a
position-biased judge: "A" on a tie). ``score`` recovers each injected effect exactly, as the
paper's Table 2 (Story Generation / Term Explanation, Gender / Race) with its interval covering
it, and shows none for the null model beyond its intervals (its permutation p-values large, its
win shares' intervals covering 1/2).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from counterfactory.manifests.release import read_jsonl
from counterfactory.manifests.trials import user_context_rubric
from counterfactory.validation.scoring.answers import AnswersLedger
from counterfactory.validation.scoring.ask import ask
from counterfactory.validation.scoring.judge import judge_jargon, judge_story
from counterfactory.validation.scoring.score import score
from tests.flows.unchanged import run_cli
from tests.validation.standin_vlm import StandIn, pixel_index
from tests.validation.test_ask_score import BOUND, _covers, _env, _images, lmms_eval_python

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

SPEC = Path(__file__).with_name("user_context_ask.yaml")


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("user-context-ask")
    run_cli(SPEC, out)
    return out / "releases" / "user-context-ask" / "0.1.0"


@pytest.fixture(scope="module")
def standin(release):
    paths = {release / p for t in read_jsonl(release / "trials.jsonl") for p in t["image_paths"]}
    server = StandIn(_images(release), latency_s=0.002, pixels=pixel_index(sorted(paths))).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def answered(release, standin, tmp_path_factory) -> dict[str, Path]:
    """Each model's answers (no judgements): the ledgers ``ask`` wrote."""
    folder = tmp_path_factory.mktemp("answers")
    ledgers = {}
    for model in ("biased", "null"):
        ledgers[model] = folder / f"{model}.answers.sqlite"
        summary = ask(
            release,
            backend="openai",
            options={"model": model, "base_url": standin.base_url},
            concurrency=BOUND,
            ledger=ledgers[model],
        )
        assert summary.failed == 0 and summary.asked == len(read_jsonl(release / "trials.jsonl"))
    return ledgers


@pytest.fixture(scope="module")
def judged(release, standin, answered, tmp_path_factory) -> dict:
    """Copies of the ledgers judged by the story and jargon judges (the judge by the command line
    for ``biased``, by the function for ``null``); a second run judges nothing again."""
    folder = tmp_path_factory.mktemp("judged")
    ledgers, summaries = {}, {}
    for model, src in answered.items():
        ledgers[model] = folder / src.name
        shutil.copy(src, ledgers[model])
        for name, judge in (("story", judge_story), ("jargon", judge_jargon)):
            if model == "biased":
                done = subprocess.run(
                    [sys.executable, "-m", "counterfactory", "ask", str(release), "--model", "judge"]
                    + ["--base-url", standin.base_url, "--ledger", str(ledgers[model]), "--judge", name]
                    + ["--of", model, "--concurrency", str(BOUND)],
                    env=_env(),
                    capture_output=True,
                    text=True,
                    timeout=900,
                )
                assert done.returncode == 0, done.stderr[-3000:]
                summaries[(model, name)] = done.stdout
            else:
                first = judge(
                    release,
                    backend="openai",
                    options={"model": "judge", "base_url": standin.base_url},
                    of_model=model,
                    ledger=ledgers[model],
                    concurrency=BOUND,
                )
                assert first.failed == 0 and first.asked == first.wanted > 0
                summaries[(model, name)] = first
            again = judge(
                release,
                backend="openai",
                options={"model": "judge", "base_url": standin.base_url},
                of_model=model,
                ledger=ledgers[model],
            )
            assert again.asked == 0 and again.already == again.wanted > 0
    out = tmp_path_factory.mktemp("scores")
    scores = score(release, [ledgers["biased"], ledgers["null"]], out, resamples=199)
    return {"ledgers": ledgers, "summaries": summaries, "scores": scores, "out": out}


def test_the_judges_judge_every_story_and_both_orders_of_every_one_axis_pair(release, judged):
    trials = {t["trial_id"]: t for t in read_jsonl(release / "trials.jsonl")}
    stories = [t for t in trials.values() if t["question"] == "story"]
    assert len(stories) == 13  # 12 images and the no-image baseline
    text, sha, _ = user_context_rubric("story_attributes")
    jtext, jsha, _ = user_context_rubric("jargon_pairwise")
    ledger = AnswersLedger(judged["ledgers"]["biased"])
    rows, answers = ledger.judgements(), {a["answer_id"]: a for a in ledger.rows()}
    ledger.close()
    story = [j for j in rows if j["rubric"] == "story_attributes"]
    jargon = [j for j in rows if j["rubric"] == "jargon_pairwise"]
    # the rubric's sha256 on every judgement
    assert {j["rubric_sha256"] for j in story} == {sha} == {hashlib.sha256(text.encode()).hexdigest()}
    assert {j["rubric_sha256"] for j in jargon} == {jsha}
    assert len(story) == 13
    # per template and concept: 3 gender pairs (one per race) and 6 race pairs (3 per gender), both orders
    assert len(jargon) == 2 * 20 * 9 * 2
    seen = {(j["answer_a"], j["answer_b"]) for j in jargon}
    assert all((b, a) in seen for a, b in seen)
    for j in jargon:
        ta, tb = trials[answers[j["answer_a"]]["trial_id"]], trials[answers[j["answer_b"]]["trial_id"]]
        assert ta["group"]["template_id"] == tb["group"]["template_id"] and ta["category"] == tb["category"]
        ca, cb = ta["group"]["condition"], tb["group"]["condition"]
        assert sum(ca[k] != cb[k] for k in ca) == 1
    assert "0 already answered" in judged["summaries"][("biased", "story")]


def test_table2_recovers_the_injected_story_stereotypes_and_plainer_explanations(judged):
    uc = judged["scores"]["models"]["biased"]["user_context"]
    assert uc["measure"] == {"story_generation": "judge", "term_explanation": "judge"}
    story = uc["story_judge"]["axes"]
    # an engineer for every man, a nurse for every woman: TVD 1/2 per gender, x 100
    occ = story["gender"]["attributes"]["occupation"]
    assert occ["score"] == pytest.approx(50.0) and _covers(occ["ci"], 50.0) and occ["p_value"] < 0.05
    assert occ["by_group"]["male"]["distribution"]["stem"] == 1.0
    assert occ["by_group"]["female"]["distribution"]["healthcare"] == 1.0
    # poor for a Black user, middle class otherwise: pooled low 1/3; TVD 2/3, 1/3, 1/3 -> 400/9
    ses = story["race"]["attributes"]["socioeconomic_status"]
    assert ses["score"] == pytest.approx(400 / 9) and _covers(ses["ci"], 400 / 9) and ses["p_value"] < 0.05
    # what was not injected is not there: occupation by race, means by gender, schooling
    assert story["race"]["attributes"]["occupation"]["score"] == 0.0
    assert story["gender"]["attributes"]["socioeconomic_status"]["score"] == 0.0
    assert story["gender"]["attributes"]["academic_level"]["score"] == 0.0
    t2 = uc["table2"]
    assert t2["story_generation"]["gender"]["score"] == pytest.approx(50 / 3)
    assert t2["story_generation"]["race"]["score"] == pytest.approx(400 / 27)
    # the no-image stories are judged too, and kept apart as the baseline
    assert uc["story_judge"]["no_image"]["stories"] == 1
    # jargon: a woman's explanation loses to a man's of the same race in both orders: shares 0 and 1
    jargon = uc["jargon_judge"]
    gender = jargon["axes"]["gender"]
    assert gender["win_share"]["female"]["share"] == 0.0 and gender["win_share"]["male"]["share"] == 1.0
    assert gender["score"] == pytest.approx(50.0) and _covers(gender["ci"], 50.0)
    # the race pairs are alike; the judge says "A" on every tie, and both orders cancel it
    race = jargon["axes"]["race"]
    assert race["score"] == 0.0 and all(w["share"] == 0.5 for w in race["win_share"].values())
    assert jargon["first_position"]["rate"] > 0.5
    assert t2["term_explanation"]["gender"]["score"] == pytest.approx(50.0)
    assert jargon["rubric_sha256"] == [user_context_rubric("jargon_pairwise")[1]]


def test_a_null_model_shows_no_user_context_effect_beyond_its_intervals(judged):
    uc = judged["scores"]["models"]["null"]["user_context"]
    assert uc["measure"] == {"story_generation": "judge", "term_explanation": "judge"}
    for axis, entry in uc["story_judge"]["axes"].items():
        for attr, r in entry["attributes"].items():
            # a finite sample's TVD is above 0 with no bias: chance, by the permutation test, read
            # over the family of axis x attribute tests (Holm). The draws are one fixed realization
            # (hashes of the release's images: new image bytes draw anew), so the family-wise level
            # is 1 %, not 5 %: six raw p-values of a null model hold one under 0.05 a quarter of the
            # time, and one realization did (race x academic_level: p 0.005, Holm 0.03, stop 48).
            # The biased model's effects above stay under 0.05 raw.
            assert r["p_holm"] > 0.01, (axis, attr, r["score"], r["p_value"], r["p_holm"])
            assert r["p_holm"] >= r["p_value"]
    # (on 12 stories that chance is large: the score alone would read as bias)
    assert uc["table2"]["story_generation"]["gender"]["score"] > 10
    for axis, entry in uc["jargon_judge"]["axes"].items():
        for g, w in entry["win_share"].items():
            assert _covers(w["ci"], 0.5), (axis, g, w)


def test_table2_is_written_named_after_the_papers_table(judged):
    md = (judged["out"] / "tables" / "guardrail_table2_user_context.md").read_text()
    assert "Story Generation (Gender)" in md and "Term Explanation (Race)" in md and "judge" in md
    assert (judged["out"] / "tables" / "guardrail_table2_story_attributes.csv").is_file()
    assert (judged["out"] / "tables" / "guardrail_table2_jargon_wins.csv").is_file()
    # every judgement, read strictly, with why it has no value (none here: the stand-in judge is tidy)
    rows = read_jsonl(judged["out"] / "judgements.jsonl")
    assert {r["rubric"] for r in rows} == {"story_attributes", "jargon_pairwise"}
    assert all(r["strict"] is not None and r["why_invalid"] is None for r in rows)
    story = next(r for r in rows if r["rubric"] == "story_attributes" and r["judged_model"] == "biased")
    assert set(story["strict"]) == {"occupation", "academic_level", "socioeconomic_status"}


def test_without_judgements_score_says_it_fell_back_to_reply_length(release, answered, tmp_path):
    scores = score(release, [answered["biased"]], tmp_path, resamples=99)
    uc = scores["models"]["biased"]["user_context"]
    assert uc["measure"] == {"story_generation": "length", "term_explanation": "length"}
    assert "story_judge" not in uc and "jargon_judge" not in uc


# ---------------------------------------------------------------- lmms-eval, no image included


@pytest.fixture(scope="module")
def lmms_logs(release, standin, answered, tmp_path_factory) -> Path:
    """The release exported for lmms-eval and run by it end to end against the stand-in."""
    tmp = tmp_path_factory.mktemp("lmms")
    tasks = tmp / "tasks"
    done = subprocess.run(
        [sys.executable, "-m", "counterfactory", "release", "export", str(release), str(tasks)]
        + ["--harness", "lmms-eval"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    names = [p.stem for p in sorted(tasks.glob("cf_*.yaml"))]
    assert names == ["cf_user_context_ask_person_irrelevant"]
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
    standin.user_context_images.clear()
    run = subprocess.run(
        [lmms_eval_python(), "-m", "lmms_eval", "--model", "openai", "--model_args"]
        + [f"model=biased,base_url={standin.base_url},num_concurrent={BOUND},retry_backoff_s=0.05"]
        + ["--tasks", ",".join(names), "--include_path", str(tasks), "--log_samples", "--output_path", str(logs)],
        env=env,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-6000:])
    total = len(read_jsonl(release / "trials.jsonl"))
    assert standin.requests - standin.errors_sent == total, (standin.requests, standin.errors_sent, total)
    # lmms-eval sent the no-image trials with no image at all (doc_to_visual returned []), the others with one
    no_image = sum(1 for t in read_jsonl(release / "trials.jsonl") if not t["image_paths"])
    assert no_image == 21
    sent = sorted(standin.user_context_images)
    assert sent.count(0) >= no_image and set(sent) == {0, 1}
    return logs


def test_lmms_eval_runs_the_no_image_trials_and_its_logs_score_as_ask_does(release, answered, lmms_logs, tmp_path):
    from_ask = score(release, [answered["biased"]], tmp_path / "ask", resamples=199)
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
    assert from_lmms["answers"] == from_ask["answers"] == len(read_jsonl(release / "trials.jsonl"))
    assert from_lmms["models"] == json.loads(json.dumps(from_ask["models"]))
    assert from_lmms["models"]["biased"]["user_context"]["no_image"] == 21
    ask_rows = {r["trial_id"]: r for r in read_jsonl(tmp_path / "ask" / "per_trial.jsonl")}
    lmms_rows = {r["trial_id"]: r for r in read_jsonl(tmp_path / "lmms" / "per_trial.jsonl")}
    assert ask_rows.keys() == lmms_rows.keys()
    for tid, row in lmms_rows.items():
        assert (row["reply"], row["strict"]) == (ask_rows[tid]["reply"], ask_rows[tid]["strict"]), tid
