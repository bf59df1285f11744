"""A release's trials as the evaluation harnesses researchers run: lmms-eval and VLMEvalKit.

``counterfactory release export RELEASE OUT --harness lmms-eval`` writes a task folder that
lmms-eval runs with ``--include_path OUT``:

- ``data/<task>.parquet``: one row per trial, its image columns ``image_0`` and ``image_1`` (null
  past ``n_images``) naming files under ``images/`` (the release's own bytes, once each, by their
  sha256), the prompt verbatim, ``trial_id`` and ``prompt_sha256``;
- ``<task>.yaml``: one config per protocol (per protocol and decoding where a protocol's
  questions decode differently), its ``generation_kwargs`` the bank's decoding settings, the
  target the trial id (lmms-eval logs the target, not the document);
- ``<group>.yaml``: every task of the release as one group;
- ``utils.py``: ``doc_to_visual`` (0, 1 or 2 images, in presentation order), ``doc_to_text`` (the
  bank's prompt, nothing added) and ``process_results`` (only whether a reply came back: the
  papers' metrics are ``counterfactory score --from lmms-eval``'s). It imports only PIL.

``--harness vlmevalkit`` writes one VLMEvalKit TSV per protocol (``index``, ``image_path``: a file
under ``images/``, or a list of them for a 2AFC pair, ``question``: the prompt verbatim,
``trial_id``, ``prompt_sha256``) and ``counterfactory_dataset.py``, a dataset class whose
``build_prompt`` keeps that prompt as it is (VLMEvalKit's own classes add options and hints) and
whose ``dump_image`` hands over the release's files unchanged.

No I/O beyond reading the release and writing ``out``; no third-party harness is imported.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.release_folder import RELEASE_JSON, TRIALS, ReleaseFolder, refuse_inside_release

HARNESSES = ("lmms-eval", "vlmevalkit")
#: the most images a trial shows (a 2AFC pair)
MAX_IMAGES = 2


class HarnessExportError(CounterfactoryError, ValueError):
    """A release that cannot be exported for a harness; the message says why."""


@dataclass
class HarnessExport:
    """What an export wrote: each task (or TSV) with its trial count."""

    harness: str
    name: str
    version: str
    out: Path
    tasks: dict[str, int] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", str(text).lower()).strip("_")


def _load(release: Path, harness: str) -> tuple[ReleaseFolder, dict[str, Any], list[dict[str, Any]]]:
    """The release opened as untrusted (:class:`ReleaseFolder`): ``release.json`` and its trials,
    every image a trial names checked (inside the release, regular, one link, bounded) before
    anything is written.

    Raises:
        NotAReleaseError: not a release with trials.
        ReleaseFileError: a trial or image that breaks the rules, naming the row.
        HarnessExportError: a release without trials, or a trial with too many images.
    """
    folder = ReleaseFolder(release, need=(RELEASE_JSON, TRIALS))
    trials = folder.trials()
    if not trials:
        raise HarnessExportError(
            f"{folder.file(TRIALS)}: the release has no trials, so there is nothing to export for {harness}; "
            "publish a release whose spec names trials.protocols"
        )
    for t in trials:
        if len(t["images"]) > MAX_IMAGES:
            raise HarnessExportError(
                f"{folder.file(TRIALS)} trial {t['trial_id']}: shows {len(t['images'])} images; at most {MAX_IMAGES}"
            )
    return folder, folder.info, trials


def generation_kwargs(decoding: dict[str, Any] | None) -> dict[str, Any]:
    """lmms-eval's ``generation_kwargs`` for a bank's ``decoding``: ``max_new_tokens``,
    ``temperature`` (``do_sample`` when above 0) and ``top_p``; what the bank leaves unset stays
    lmms-eval's (and the server's) default."""
    decoding = decoding or {}
    out: dict[str, Any] = {}
    if "max_tokens" in decoding:
        out["max_new_tokens"] = int(decoding["max_tokens"])
    if "temperature" in decoding:
        out["temperature"] = float(decoding["temperature"])
        out["do_sample"] = float(decoding["temperature"]) > 0
    if "top_p" in decoding:
        out["top_p"] = float(decoding["top_p"])
    return out


def task_groups(release_name: str, trials: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Trials by task name: ``cf_<release>_<protocol>``, and ``_<question>`` appended where a
    protocol's questions are decoded differently (one config holds one decoding)."""
    by_protocol: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in trials:
        by_protocol[t["protocol"]].append(t)
    out: dict[str, list[dict[str, Any]]] = {}
    base = f"cf_{_slug(release_name)}"
    for protocol, rows in by_protocol.items():
        decodings = {json.dumps(t.get("decoding") or {}, sort_keys=True) for t in rows}
        if len(decodings) == 1:
            out[f"{base}_{_slug(protocol)}"] = rows
            continue
        by_decoding: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for t in rows:
            by_decoding[json.dumps(t.get("decoding") or {}, sort_keys=True)].append(t)
        for i, (_, group) in enumerate(sorted(by_decoding.items())):
            questions = sorted({str(t["question"]) for t in group})
            suffix = _slug("_".join(questions)) if len(questions) <= 2 else str(i)
            out[f"{base}_{_slug(protocol)}_{suffix}"] = group
    return out


# ---------------------------------------------------------------- lmms-eval

LMMS_UTILS = '''"""counterfactory's lmms-eval task functions (written by `counterfactory release export
--harness lmms-eval`). The documents come from this folder's data/*.parquet; the prompt is the
trial bank's, verbatim; the papers' metrics are computed by `counterfactory score --from lmms-eval`
from lmms-eval's sample logs (run lmms-eval with --log_samples)."""

import os

FAILED = "[LMMS_EVAL_REQUEST_FAILED"
HERE = os.path.dirname(os.path.abspath(__file__))


def doc_to_visual(doc):
    """The trial's image files in presentation order (none, one, or a 2AFC pair: person A first).
    Paths, not decoded images: lmms-eval encodes each file once and reuses it across trials."""
    return [os.path.join(HERE, doc[f"image_{i}"]) for i in range(int(doc["n_images"]))]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    """The trial bank's prompt, nothing added (no pre- or post-prompt: the papers fix the wording)."""
    return doc["prompt"]


def process_results(doc, results):
    """Only whether the model replied: 1 for a reply, 0 for an empty or failed request."""
    reply = results[0] if results else ""
    answered = isinstance(reply, str) and bool(reply.strip()) and not reply.startswith(FAILED)
    return {"answered": float(answered)}
'''


def _copy_image(release: ReleaseFolder, rel: str, out: Path, trial_id: str) -> str:
    """The image's path in the task folder: ``images/<sha256><suffix>``, written once (read
    through the release's confined reader)."""
    import hashlib

    data = release.read_image(rel, f"{release.file(TRIALS)} (trial {trial_id})")
    name = f"images/{hashlib.sha256(data).hexdigest()}{Path(rel).suffix.lower()}"
    target = out / name
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return name


def _write_parquet(release: ReleaseFolder, rows: Sequence[dict[str, Any]], out: Path, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("trial_id", pa.string()),
            ("prompt_sha256", pa.string()),
            ("protocol", pa.string()),
            ("question", pa.string()),
            ("prompt", pa.string()),
            ("n_images", pa.int32()),
            *[(f"image_{i}", pa.string()) for i in range(MAX_IMAGES)],
        ]
    )
    columns: dict[str, list[Any]] = {name: [] for name in schema.names}
    for t in rows:
        paths = t.get("image_paths") or []
        columns["trial_id"].append(t["trial_id"])
        columns["prompt_sha256"].append(t["prompt_sha256"])
        columns["protocol"].append(t["protocol"])
        columns["question"].append(str(t["question"]))
        columns["prompt"].append(t["prompt"])
        columns["n_images"].append(len(paths))
        for i in range(MAX_IMAGES):
            columns[f"image_{i}"].append(_copy_image(release, paths[i], out, t["trial_id"]) if i < len(paths) else None)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns, schema=schema), path)


def _yaml_dump(config: dict[str, Any]) -> str:
    import yaml

    text = yaml.safe_dump(config, sort_keys=False, allow_unicode=True, width=1000)
    # lmms-eval resolves `!function utils.name` against utils.py beside the config
    return re.sub(r"'(!function [\w.]+)'", r"\1", text)


def export_lmms_eval(release: Path, out: Path) -> HarnessExport:
    """Write ``release``'s trials into ``out`` as an lmms-eval task folder (see the module)."""
    out = Path(out)
    refuse_inside_release(out, "OUT_DIR")
    folder, info, trials = _load(release, "lmms-eval")
    name, version = str(info.get("name")), str(info.get("version"))
    export = HarnessExport("lmms-eval", name, version, out)
    groups = task_groups(name, trials)
    out.mkdir(parents=True, exist_ok=True)
    for task, rows in groups.items():
        data = out / "data" / f"{task}.parquet"
        _write_parquet(folder, rows, out, data)
        config = {
            "task": task,
            "tag": [f"cf_{_slug(name)}"],
            "dataset_path": "parquet",
            "dataset_kwargs": {"data_files": {"test": f"data/{task}.parquet"}},
            "test_split": "test",
            "output_type": "generate_until",
            "doc_to_visual": "!function utils.doc_to_visual",
            "doc_to_text": "!function utils.doc_to_text",
            "doc_to_target": "trial_id",
            "generation_kwargs": generation_kwargs(rows[0].get("decoding")),
            "process_results": "!function utils.process_results",
            "metric_list": [{"metric": "answered", "aggregation": "mean", "higher_is_better": True}],
            "metadata": {
                "version": 1,
                "release": name,
                "release_version": version,
                "protocol": rows[0]["protocol"],
                "decoding": rows[0].get("decoding") or {},
            },
        }
        (out / f"{task}.yaml").write_text(_yaml_dump(config), encoding="utf-8")
        export.tasks[task] = len(rows)
        export.files += [f"{task}.yaml", f"data/{task}.parquet"]
    (out / "utils.py").write_text(LMMS_UTILS, encoding="utf-8")
    export.files.append("images/")
    (out / "README.md").write_text(
        f"# {name} {version}: lmms-eval tasks\n\n"
        "Written by `counterfactory release export RELEASE OUT --harness lmms-eval`; one task per protocol:\n\n"
        + "".join(f"- `{t}`: {n} trials\n" for t, n in export.tasks.items())
        + "\n```bash\n"
        f"python -m lmms_eval --include_path {out} --tasks {','.join(export.tasks)} "
        "--model openai --model_args model=MODEL,base_url=URL --log_samples --output_path LOGS\n"
        f"counterfactory score RELEASE LOGS --from lmms-eval --out scores/\n```\n",
        encoding="utf-8",
    )
    export.files += ["utils.py", "README.md"]
    return export


# ---------------------------------------------------------------- VLMEvalKit

VLMEVALKIT_DATASET = '''"""counterfactory's trials as a VLMEvalKit dataset (written by `counterfactory release export
--harness vlmevalkit`). Each TSV beside this file is one protocol; `build_prompt` gives the model
the trial's images (person A first) and the trial bank's prompt verbatim, with no options or hints
added, and `dump_image` gives the release's image files under images/ as they are (VLMEvalKit's
default decodes a TSV's base64 images and re-saves them as JPEG, which would change the
stimuli). Score the predictions with `counterfactory score RELEASE PRED_FILES --from vlmevalkit`;
`evaluate` here only counts replies.
"""

import os.path as osp

from vlmeval.dataset.image_base import ImageBaseDataset
from vlmeval.smp import load, toliststr

HERE = osp.dirname(osp.abspath(__file__))
DATASETS = __DATASETS__


class CounterfactoryDataset(ImageBaseDataset):
    TYPE = "VQA"
    MODALITY = "IMAGE"
    DATASET_URL = {name: osp.join(HERE, name + ".tsv") for name in DATASETS}
    DATASET_MD5 = {name: None for name in DATASETS}

    @classmethod
    def supported_datasets(cls):
        return list(DATASETS)

    def load_data(self, dataset):
        return load(osp.join(HERE, dataset + ".tsv"))

    def dump_image(self, line):
        # the release's files as they are (beside this file), never re-encoded
        if not int(line["n_images"]):
            return []
        return [osp.join(HERE, p) for p in toliststr(line["image_path"])]

    def build_prompt(self, line):
        if isinstance(line, int):
            line = self.data.iloc[line]
        msgs = [dict(type="image", value=p) for p in self.dump_image(line)] if int(line["n_images"]) else []
        msgs.append(dict(type="text", value=line["question"]))
        return msgs

    def evaluate(self, eval_file, **judge_kwargs):
        data = load(eval_file)
        replied = sum(1 for p in data["prediction"] if isinstance(p, str) and p.strip())
        return {"replied": replied, "rows": len(data)}
'''


def export_vlmevalkit(release: Path, out: Path) -> HarnessExport:
    """Write ``release``'s trials into ``out`` as VLMEvalKit TSVs, one per task, and the dataset class."""
    import csv

    out = Path(out)
    refuse_inside_release(out, "OUT_DIR")
    folder, info, trials = _load(release, "vlmevalkit")
    name, version = str(info.get("name")), str(info.get("version"))
    export = HarnessExport("vlmevalkit", name, version, out)
    out.mkdir(parents=True, exist_ok=True)
    for task, rows in task_groups(name, trials).items():
        path = out / f"{task}.tsv"
        with path.open("w", encoding="utf-8", newline="") as f:
            w = csv.writer(f, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
            w.writerow(["index", "image_path", "question", "trial_id", "prompt_sha256", "protocol", "n_images"])
            for i, t in enumerate(rows):
                images = [_copy_image(folder, p, out, t["trial_id"]) for p in t["image_paths"] or []]
                # VLMEvalKit's image_path: one path, or several written as a Python list literal
                cell = images[0] if len(images) == 1 else (str(images) if images else "")
                w.writerow([i, cell, t["prompt"], t["trial_id"], t["prompt_sha256"], t["protocol"], len(images)])
        export.tasks[task] = len(rows)
        export.files.append(path.name)
    (out / "counterfactory_dataset.py").write_text(
        VLMEVALKIT_DATASET.replace("__DATASETS__", repr(list(export.tasks))),
        encoding="utf-8",
    )
    export.files.append("counterfactory_dataset.py")
    return export


def export_harness(release: Path, out: Path, harness: str) -> HarnessExport:
    """Export ``release`` for ``harness`` (one of :data:`HARNESSES`)."""
    if harness == "lmms-eval":
        return export_lmms_eval(release, out)
    if harness == "vlmevalkit":
        return export_vlmevalkit(release, out)
    raise HarnessExportError(f"--harness {harness}: one of {', '.join(HARNESSES)}")
