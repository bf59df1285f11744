"""Every reader of a release trusts nothing it reads (issue 44, part B).

``ask``, ``score`` and ``release export`` open a release through one confined reader
(``manifests/release_folder.py::ReleaseFolder``): one edited line of ``trials.jsonl`` naming
``/etc/passwd``, a path out of the folder, a symbolic link or hard link out, or a FIFO is refused
with one ``error:`` line naming the file and the row, before anything is sent or copied (the FIFO
must not hang). ``score`` counts each answer once, takes the release's recorded bootstrap
resamples, ends malformed input in one ``error:`` line naming file and line, and never writes
inside a sealed release. Each test goes through the command line (in-process) on a copy of a
small sealed release.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from counterfactory.flows.cli import main
from tests.manifests.hub_release import make_release


@pytest.fixture(scope="module")
def sealed(tmp_path_factory) -> Path:
    return make_release(tmp_path_factory.mktemp("readers"))


def _copy(sealed: Path, tmp_path: Path) -> Path:
    """A writable copy of the sealed release (``releases/study/1.0.0`` under ``tmp_path``)."""
    target = tmp_path / "releases" / "study" / "1.0.0"
    shutil.copytree(sealed, target)
    for p in [target, *target.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return target


def _trials(release: Path) -> list[dict]:
    return [json.loads(line) for line in (release / "trials.jsonl").read_text().splitlines() if line.strip()]


def _write_trials(release: Path, rows: list[dict]) -> None:
    (release / "trials.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def _cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a traceback where one error line belongs
    return result.exit_code, result.stdout, result.stderr


def _one_error(*args: str) -> str:
    code, out, err = _cli(*args)
    assert code == 2, (code, out, err)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------ the paths a trial names


def _outside(tmp_path: Path) -> Path:
    secret = tmp_path / "outside" / "secret.png"
    secret.parent.mkdir()
    secret.write_bytes(b"root:x:0:0:secret")
    return secret


def _break_first_trial(release: Path, tmp_path: Path, kind: str) -> int:
    """Point the first trial with an image at a file it must not read; returns its line."""
    rows = _trials(release)
    n = next(i for i, r in enumerate(rows) if r["image_paths"])
    rel = rows[n]["image_paths"][0]
    if kind == "absolute":
        rows[n]["image_paths"][0] = "/etc/passwd"
    elif kind == "dotdot":
        rows[n]["image_paths"][0] = os.path.relpath(_outside(tmp_path), release)
    elif kind == "symlink":
        (release / "images" / "link.png").symlink_to(_outside(tmp_path))
        rows[n]["image_paths"][0] = "images/link.png"
    elif kind == "hardlink":
        os.link(_outside(tmp_path), release / "images" / "hard.png")
        rows[n]["image_paths"][0] = "images/hard.png"
    elif kind == "fifo":
        os.mkfifo(release / "images" / "fifo.png")
        rows[n]["image_paths"][0] = "images/fifo.png"
    elif kind == "folder":
        rows[n]["image_paths"][0] = "images"
    else:  # pragma: no cover
        raise AssertionError(kind)
    assert rel != rows[n]["image_paths"][0]
    _write_trials(release, rows)
    return n + 1


KINDS = ["absolute", "dotdot", "symlink", "hardlink", "fifo", "folder"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", KINDS)
def test_ask_refuses_a_trial_naming_a_file_outside_the_release_before_any_request(sealed, tmp_path, kind):
    release = _copy(sealed, tmp_path)
    line = _break_first_trial(release, tmp_path, kind)
    # no server listens on port 9: the refusal comes before any request is made
    error = _one_error(
        "ask", release, "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--ledger", tmp_path / "a.sqlite"
    )
    assert f"trials.jsonl line {line} (trial " in error, error
    assert "root:x" not in error


@pytest.mark.timeout(120)
@pytest.mark.parametrize("harness", ["lmms-eval", "vlmevalkit"])
@pytest.mark.parametrize("kind", KINDS)
def test_export_refuses_a_trial_naming_a_file_outside_the_release_and_copies_nothing(sealed, tmp_path, kind, harness):
    release = _copy(sealed, tmp_path)
    line = _break_first_trial(release, tmp_path, kind)
    out = tmp_path / "export"
    error = _one_error("release", "export", release, out, "--harness", harness)
    assert f"trials.jsonl line {line} (trial " in error, error
    assert not out.exists() or not any(out.rglob("*.png"))


def test_hub_tables_read_images_through_the_confined_reader(sealed, tmp_path):
    from counterfactory.manifests.hub_tables import _cell
    from counterfactory.manifests.release_folder import ReleaseFileError

    datasets = pytest.importorskip("datasets")
    release = _copy(sealed, tmp_path)
    (release / "images" / "link.png").symlink_to(_outside(tmp_path))
    with pytest.raises(ReleaseFileError, match="symbolic link"):
        _cell({"__image__": "images/link.png"}, datasets.Image(), release)
    with pytest.raises(ReleaseFileError, match="leads outside"):
        _cell({"__images__": ["images/../../../../outside/secret.png"]}, datasets.List(datasets.Image()), release)


def test_export_of_a_release_without_trials_is_one_error(tmp_path):
    release = make_release(tmp_path / "none", trials=False)
    error = _one_error("release", "export", release, tmp_path / "out", "--harness", "lmms-eval")
    assert "no trials" in error and "trials.jsonl" in error


# ------------------------------------------------------------ nothing writes inside a release


def test_score_and_export_refuse_an_out_folder_inside_a_sealed_release(sealed, tmp_path):
    release = _copy(sealed, tmp_path)
    answers = _answers_file(release, tmp_path / "answers.jsonl")
    before = sorted(p.relative_to(release) for p in release.rglob("*"))
    error = _one_error("score", release, answers, "--out", release / "scores")
    assert "inside the sealed release" in error and "--out" in error
    for harness in ("lmms-eval", "vlmevalkit", "hub"):
        error = _one_error("release", "export", release, release / "export", "--harness", harness)
        assert "inside the sealed release" in error
    assert sorted(p.relative_to(release) for p in release.rglob("*")) == before


# ------------------------------------------------------------ score: each answer once


def _answers(release: Path, *, model: str = "m", reply: str = "A") -> list[dict]:
    return [
        {
            "answer_id": f"{t['trial_id']}-{model}",
            "trial_id": t["trial_id"],
            "prompt_sha256": t["prompt_sha256"],
            "model": model,
            "reply": reply,
            "sample": 0,
        }
        for t in _trials(release)
    ]


def _answers_file(release: Path, path: Path, rows: list[dict] | None = None) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in (rows if rows is not None else _answers(release))))
    return path


def test_score_counts_a_duplicated_answer_once_and_says_how_many_it_dropped(sealed, tmp_path):
    answers = _answers_file(sealed, tmp_path / "answers.jsonl")
    n = len(_trials(sealed))
    code, out, err = _cli("score", sealed, answers, answers, "--out", tmp_path / "scores")
    assert code == 0, err
    scores = json.loads((tmp_path / "scores" / "scores.json").read_text())
    assert scores["answers"] == n and scores["duplicates_dropped"] == n
    assert f"{n} duplicate answer row(s) dropped" in out


def test_score_refuses_two_rows_of_one_answer_with_different_replies_naming_both(sealed, tmp_path):
    first = _answers_file(sealed, tmp_path / "a.jsonl")
    second = _answers_file(sealed, tmp_path / "b.jsonl", _answers(sealed, reply="B"))
    error = _one_error("score", sealed, first, second, "--out", tmp_path / "scores")
    assert f"{second}:1" in error and f"{first}:1" in error and "different replies" in error


def _lmms_logs(release: Path, folder: Path, date: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    task = "cf_study_mcq"
    (folder / f"{date}_results.json").write_text(
        json.dumps({"config": {"model": "openai", "model_args": "model=m"}, "configs": {task: {}}})
    )
    lines = [json.dumps({"target": t["trial_id"], "input": t["prompt"], "resps": [["A"]]}) for t in _trials(release)]
    (folder / f"{date}_samples_{task}.jsonl").write_text("\n".join(lines) + "\n")


def test_score_counts_a_duplicated_harness_answer_once(sealed, tmp_path):
    n = len(_trials(sealed))
    _lmms_logs(sealed, tmp_path / "logs" / "run1", "20261201")
    _lmms_logs(sealed, tmp_path / "logs" / "run2", "20261202")  # the same run's log, copied
    code, _, err = _cli("score", sealed, tmp_path / "logs", "--from", "lmms-eval", "--out", tmp_path / "s1")
    assert code == 0, err
    scores = json.loads((tmp_path / "s1" / "scores.json").read_text())
    assert (scores["answers"], scores["duplicates_dropped"]) == (n, n)
    tsv = tmp_path / "m_cf_study_mcq.tsv"
    tsv.write_text(
        "trial_id\tprediction\n" + "".join(f"{t['trial_id']}\tA\n" for t in _trials(sealed)), encoding="utf-8"
    )
    code, _, err = _cli("score", sealed, tsv, tsv, "--from", "vlmevalkit", "--out", tmp_path / "s2")
    assert code == 0, err
    scores = json.loads((tmp_path / "s2" / "scores.json").read_text())
    assert (scores["answers"], scores["duplicates_dropped"]) == (n, n)


def test_score_takes_the_releases_recorded_bootstrap_resamples(sealed, tmp_path):
    release = _copy(sealed, tmp_path)
    info = json.loads((release / "release.json").read_text())
    info["analysis"] = {"bootstrap": {"unit": "template_id", "strata": ["occupation"], "resamples": 37}}
    (release / "release.json").write_text(json.dumps(info))
    answers = _answers_file(release, tmp_path / "answers.jsonl")
    code, out, err = _cli("score", release, answers, "--out", tmp_path / "scores")
    assert code == 0, err
    assert json.loads((tmp_path / "scores" / "scores.json").read_text())["bootstrap"]["resamples"] == 37
    assert "37 resamples" in out
    code, _, err = _cli("score", release, answers, "--out", tmp_path / "s2", "--resamples", "50")
    assert code == 0, err
    assert json.loads((tmp_path / "s2" / "scores.json").read_text())["bootstrap"]["resamples"] == 50


# ------------------------------------------------------------ score: malformed input, one line


def _malformed(release: Path, tmp_path: Path, case: str) -> tuple[list[str], str]:
    """``(score arguments after RELEASE, what the error names)`` for one broken input."""
    good = _answers(release)
    path = tmp_path / "answers.jsonl"
    if case == "not_json":
        path.write_text(json.dumps(good[0]) + "\n{not json\n")
        return [str(path)], f"{path}:2"
    if case == "not_an_object":
        path.write_text(json.dumps(list(good[0])) + "\n")
        return [str(path)], f"{path}:1"
    if case in ("trial_id_int", "reply_int", "sample_negative", "sample_text", "missing_model", "answer_id_list"):
        row = dict(good[0])
        field, value = {
            "trial_id_int": ("trial_id", 7),
            "reply_int": ("reply", 3),
            "sample_negative": ("sample", -1),
            "sample_text": ("sample", "0"),
            "missing_model": ("model", None),
            "answer_id_list": ("answer_id", ["x"]),
        }[case]
        if value is None:
            del row[field]
        else:
            row[field] = value
        path.write_text(json.dumps(good[1]) + "\n" + json.dumps(row) + "\n")
        return [str(path)], f"{path}:2"
    if case == "unknown_trial":
        row = dict(good[0], trial_id="f" * 64, answer_id="x")
        path.write_text(json.dumps(row) + "\n")
        return [str(path)], f"{path}:1"
    if case == "not_a_ledger":
        db = tmp_path / "answers.sqlite"
        db.write_bytes(b"not a database at all" * 100)
        return [str(db)], str(db)
    if case == "ledger_wrong_tables":
        db = tmp_path / "answers.sqlite"
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE answers (x TEXT)")
        con.execute("INSERT INTO answers VALUES ('y')")
        con.commit()
        con.close()
        return [str(db)], str(db)
    if case == "fifo":
        os.mkfifo(path)
        return [str(path)], str(path)
    logs = tmp_path / "logs"
    _lmms_logs(release, logs, "20261201")
    samples = logs / "20261201_samples_cf_study_mcq.jsonl"
    if case == "lmms_not_json":
        samples.write_text(samples.read_text() + "{broken\n")
        return ["--from", "lmms-eval", str(logs)], f"{samples}:{len(good) + 1}"
    if case == "lmms_not_an_object":
        samples.write_text("[1, 2]\n")
        return ["--from", "lmms-eval", str(logs)], f"{samples}:1"
    if case == "lmms_results_not_an_object":
        (logs / "20261201_results.json").write_text("[]")
        return ["--from", "lmms-eval", str(logs)], "20261201_results.json"
    if case == "lmms_results_config_list":
        (logs / "20261201_results.json").write_text(json.dumps({"config": "openai", "configs": {}}))
        return ["--from", "lmms-eval", str(logs)], "20261201_results.json"
    if case == "lmms_unknown_trial":
        samples.write_text(json.dumps({"target": "nope", "resps": [["A"]]}) + "\n")
        return ["--from", "lmms-eval", str(logs)], f"{samples}:1"
    tsv = tmp_path / "m_cf_study_mcq.json"
    if case == "vlmevalkit_not_json":
        tsv.write_text("{not json")
        return ["--from", "vlmevalkit", str(tsv)], str(tsv)
    if case == "vlmevalkit_unknown_trial":
        tsv = tmp_path / "m_cf_study_mcq.tsv"
        tsv.write_text("trial_id\tprediction\nnope\tA\n")
        return ["--from", "vlmevalkit", str(tsv)], f"{tsv}:2"
    raise AssertionError(case)  # pragma: no cover


MALFORMED = [
    "not_json",
    "not_an_object",
    "trial_id_int",
    "reply_int",
    "sample_negative",
    "sample_text",
    "missing_model",
    "answer_id_list",
    "unknown_trial",
    "not_a_ledger",
    "ledger_wrong_tables",
    "fifo",
    "lmms_not_json",
    "lmms_not_an_object",
    "lmms_results_not_an_object",
    "lmms_results_config_list",
    "lmms_unknown_trial",
    "vlmevalkit_not_json",
    "vlmevalkit_unknown_trial",
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", MALFORMED)
def test_score_ends_malformed_input_in_one_error_line_naming_file_and_line(sealed, tmp_path, case):
    args, names = _malformed(sealed, tmp_path, case)
    source = [a for a in args if a.startswith("--") or a in ("lmms-eval", "vlmevalkit")]
    paths = [a for a in args if a not in source]
    error = _one_error("score", sealed, *paths, *source, "--out", tmp_path / "scores")
    assert names in error, error


def test_score_refuses_a_release_whose_trials_are_not_rows(sealed, tmp_path):
    release = _copy(sealed, tmp_path)
    (release / "trials.jsonl").write_text((release / "trials.jsonl").read_text() + "[1]\n")
    answers = _answers_file(sealed, tmp_path / "answers.jsonl")
    error = _one_error("score", release, answers, "--out", tmp_path / "scores")
    assert f"trials.jsonl line {len(_trials(sealed)) + 1}: not a JSON object" in error
