"""Answers from the harnesses' own output: ``counterfactory score RELEASE LOGS --from lmms-eval``
and ``--from vlmevalkit``, for tasks written by ``release export --harness``
(:mod:`counterfactory.manifests.harness`).

- lmms-eval (``--log_samples --output_path LOGS``): ``LOGS/<model>/<date>_samples_<task>.jsonl``
  holds one line per document, its ``target`` the trial id (the export sets ``doc_to_target``),
  ``input`` the prompt that was sent and ``resps`` / ``filtered_resps`` the raw replies (several
  with ``repeats``: samples 0, 1, ...); ``<date>_results.json`` beside it names the model
  (``config.model_args``) and each task's ``generation_kwargs``.
- VLMEvalKit: ``<work_dir>/<model>_<dataset>.{tsv,xlsx,json}``, the dataset's TSV without its
  image column plus ``prediction`` (``vlmeval.inference.infer_data_job``).

Each reply becomes an answer row as ``ask`` writes them (``answer_id`` hashing the trial, the
harness and model, the decoding and the sample), so ``score`` reads both alike. A request the
harness gave up on (lmms-eval's ``[LMMS_EVAL_REQUEST_FAILED ...]``, VLMEvalKit's
``Failed to obtain answer``) is no answer: the reader refuses the logs, naming the trials, so
that they are asked again rather than scored as invalid replies.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from counterfactory.manifests.safefiles import InputFileError, read_regular
from counterfactory.validation.scoring.answers import MAX_ANSWERS_BYTES, AnswersError, answer_id

HARNESS_SOURCES = ("lmms-eval", "vlmevalkit")
LMMS_FAILED = "[LMMS_EVAL_REQUEST_FAILED"
VLMEVAL_FAILED = "Failed to obtain answer"


def _model_args(text: Any) -> dict[str, str]:
    if isinstance(text, dict):
        return {str(k): str(v) for k, v in text.items()}
    out = {}
    for part in str(text or "").split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def _replies(sample: dict[str, Any]) -> list[Any]:
    """The raw replies of one logged document: ``resps`` when lmms-eval kept it (it drops it when
    the filters changed nothing), else ``filtered_resps``; nested lists flattened in order."""
    value = sample["resps"] if "resps" in sample else sample.get("filtered_resps")
    flat: list[Any] = []

    def walk(v: Any) -> None:
        if isinstance(v, list):
            for x in v:
                walk(x)
        else:
            flat.append(v)

    walk(value)
    return flat


def _failed(ids: Sequence[str], harness: str) -> None:
    if ids:
        raise AnswersError(
            f"{len(ids)} requests failed in {harness} (no reply), e.g. trial {', '.join(ids[:5])}: run "
            f"{harness} again for them; a failed request is not scored as an answer"
        )


def _answer(
    trial: dict[str, Any],
    model: str,
    lineage: dict[str, Any],
    decoding: dict[str, Any],
    sample: int,
    reply: Any,
    where: str,
) -> dict[str, Any]:
    return {
        "_where": where,
        "answer_id": answer_id(trial, lineage, decoding, sample),
        "trial_id": trial["trial_id"],
        "prompt_sha256": trial["prompt_sha256"],
        "protocol": trial["protocol"],
        "model": model,
        "backend": lineage["backend"],
        "lineage": lineage,
        "decoding": decoding,
        "sample": sample,
        "reply": None if reply is None else str(reply),
    }


def _check_trial(trials: dict[str, dict[str, Any]], trial_id: str, where: str) -> dict[str, Any]:
    trial = trials.get(trial_id)
    if trial is None:
        raise AnswersError(
            f"{where}: trial {trial_id} is not in this release's trials.jsonl (exported from another release?)"
        )
    return trial


def read_lmms_eval(paths: Iterable[Path], trials: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Answers from lmms-eval sample logs: files ``*_samples_*.jsonl``, or folders searched for them.

    Raises:
        AnswersError: no sample logs; a log without its ``_results.json``; a trial id that is not
            the release's; a logged prompt that is not the trial's; failed requests.
    """
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files += sorted(path.rglob("*_samples_*.jsonl"))
        elif path.is_file():
            files.append(path)
        else:
            raise AnswersError(f"{path}: no such lmms-eval log (a folder given to --output_path or a samples file)")
    if not files:
        raise AnswersError("no lmms-eval sample logs (*_samples_*.jsonl) in " + ", ".join(map(str, paths)))
    out: list[dict[str, Any]] = []
    failed: list[str] = []
    for f in files:
        m = re.fullmatch(r"(.+)_samples_(.+)\.jsonl", f.name)
        if m is None:
            raise AnswersError(f"{f}: not an lmms-eval samples log (<date>_samples_<task>.jsonl)")
        date_id, task = m.groups()
        results_path = f.with_name(f"{date_id}_results.json")
        if not results_path.is_file():
            raise AnswersError(f"{f}: its results file {results_path.name} is missing (it names the model)")
        results = _json_object(_text(results_path), str(results_path))
        config = results.get("config") or {}
        configs = results.get("configs") or {}
        if not isinstance(config, dict) or not isinstance(configs, dict):
            raise AnswersError(f"{results_path}: config and configs are not objects (not lmms-eval's results file)")
        args = _model_args(config.get("model_args"))
        model = args.get("model") or args.get("model_version") or args.get("pretrained") or str(config.get("model"))
        task_config = configs.get(task) or {}
        decoding = task_config.get("generation_kwargs") if isinstance(task_config, dict) else None
        if not isinstance(decoding or {}, dict):
            raise AnswersError(f"{results_path}: configs.{task}.generation_kwargs is not an object")
        decoding = dict(decoding or {})
        lineage = {
            "backend": f"lmms-eval:{config.get('model')}",
            "model": model,
            "endpoint": args.get("base_url"),
            "harness": "lmms-eval",
            "harness_version": results.get("lmms_eval_version"),
        }
        for n, line in enumerate(_text(f).splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{f}:{n}"
            try:
                sample = json.loads(line)
            except ValueError as exc:
                raise AnswersError(f"{where}: not JSON ({exc})") from None
            if not isinstance(sample, dict) or not isinstance(sample.get("doc") or {}, dict):
                raise AnswersError(f"{where}: not an lmms-eval sample (a JSON object with target and resps)")
            trial_id = str(sample.get("target") or (sample.get("doc") or {}).get("trial_id"))
            trial = _check_trial(trials, trial_id, where)
            sent = sample.get("input")
            if isinstance(sent, str) and sent != trial["prompt"]:
                raise AnswersError(f"{where}: lmms-eval sent trial {trial_id} another prompt than the bank's: {sent!r}")
            for s, reply in enumerate(_replies(sample)):
                if isinstance(reply, str) and reply.startswith(LMMS_FAILED):
                    failed.append(trial_id)
                    continue
                out.append(_answer(trial, model, lineage, decoding, s, reply, where))
    _failed(failed, "lmms-eval")
    return out


def _text(path: Path) -> str:
    """A log file's text: a regular file, bounded, UTF-8.

    Raises:
        AnswersError: naming the file.
    """
    try:
        return read_regular(path, MAX_ANSWERS_BYTES, limit_field="a smaller log file").decode("utf-8")
    except (InputFileError, OSError, UnicodeDecodeError) as exc:
        raise AnswersError(f"{path}: not a readable log file ({exc})") from None


def _json_object(text: str, where: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise AnswersError(f"{where}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise AnswersError(f"{where}: not a JSON object")
    return value


def _missing(value: Any) -> bool:
    """A cell pandas read as missing (NaN) rather than a reply."""
    return value is None or (isinstance(value, float) and value != value)


def _read_table(path: Path) -> list[dict[str, Any]]:
    """Rows of a VLMEvalKit prediction file.

    Raises:
        AnswersError: a file of another type, or one pandas cannot read, naming it.
    """
    try:
        rows = _read_frame(path)
    except AnswersError:
        raise
    except Exception as exc:  # noqa: BLE001 - pandas' parsers raise many types; any is "not readable"
        raise AnswersError(f"{path}: not a readable VLMEvalKit prediction file ({type(exc).__name__})") from None
    if not all(isinstance(r, dict) for r in rows):
        raise AnswersError(f"{path}: not a table of prediction rows")
    return rows


def _read_frame(path: Path) -> list[dict[str, Any]]:
    import pandas as pd

    read_regular(path, MAX_ANSWERS_BYTES, limit_field="a smaller prediction file")  # a regular, bounded file
    suffix = path.suffix.lower()
    if suffix == ".tsv":
        frame = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False)
    elif suffix == ".json":
        frame = pd.read_json(path, dtype=False)
    elif suffix == ".xlsx":
        try:
            frame = pd.read_excel(path, dtype=str, keep_default_na=False)
        except ImportError:
            raise AnswersError(
                f"{path}: reading VLMEvalKit's .xlsx needs openpyxl (pip install openpyxl), or run it with "
                "PRED_FORMAT=tsv"
            ) from None
    else:
        raise AnswersError(f"{path}: not a VLMEvalKit prediction file (.tsv, .xlsx or .json)")
    return frame.to_dict("records")


def read_vlmevalkit(paths: Iterable[Path], trials: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Answers from VLMEvalKit prediction files ``<model>_<dataset>.{tsv,xlsx,json}`` of datasets
    exported by ``--harness vlmevalkit`` (their ``trial_id`` column keys each row), or folders
    searched for them.

    Raises:
        AnswersError: no prediction files; a file without ``trial_id`` and ``prediction``; a trial
            id or question that is not the release's; failed requests.
    """
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files += sorted(p for p in path.rglob("*_cf_*") if p.suffix.lower() in (".tsv", ".xlsx", ".json"))
        elif path.is_file():
            files.append(path)
        else:
            raise AnswersError(f"{path}: no such VLMEvalKit prediction file or folder")
    if not files:
        raise AnswersError(
            "no VLMEvalKit prediction files (<model>_cf_<release>_<protocol>.tsv) in " + ", ".join(map(str, paths))
        )
    out: list[dict[str, Any]] = []
    failed: list[str] = []
    for f in files:
        m = re.fullmatch(r"(.+?)_(cf_[a-z0-9_]+)", f.stem)
        if m is None:
            raise AnswersError(f"{f}: not a prediction file of an exported dataset (<model>_cf_<release>_<protocol>)")
        model, dataset = m.groups()
        lineage = {"backend": "vlmevalkit", "model": model, "harness": "vlmevalkit", "dataset": dataset}
        rows = _read_table(f)
        if rows and not {"trial_id", "prediction"} <= set(rows[0]):
            raise AnswersError(
                f"{f}: no trial_id and prediction columns (not a prediction file of an exported dataset)"
            )
        for n, row in enumerate(rows, start=2):
            where = f"{f}:{n}"
            trial = _check_trial(trials, str(row["trial_id"]), where)
            if "question" in row and str(row["question"]) != trial["prompt"]:
                raise AnswersError(f"{where}: trial {trial['trial_id']}'s question is not the bank's prompt")
            reply = row["prediction"]
            if isinstance(reply, str) and reply.startswith(VLMEVAL_FAILED):
                failed.append(trial["trial_id"])
                continue
            # VLMEvalKit decodes with each model class's own settings: none recorded here
            out.append(_answer(trial, model, lineage, {}, 0, None if _missing(reply) else reply, where))
    _failed(failed, "VLMEvalKit")
    return out


def read_harness(source: str, paths: Iterable[Path], trials: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Answers from ``source``'s output (one of :data:`HARNESS_SOURCES`)."""
    if source == "lmms-eval":
        return read_lmms_eval(paths, trials)
    if source == "vlmevalkit":
        return read_vlmevalkit(paths, trials)
    raise AnswersError(f"--from {source}: one of answers, {', '.join(HARNESS_SOURCES)}")
