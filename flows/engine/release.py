"""Turn the cells' outcomes into a sealed release folder (plain functions, no Prefect).

Publishing is an explicit step: :func:`~counterfactory.flows.engine.outcomes.collect_outcomes`
reads every cell's attempts and verdicts from the ledger with zero editor calls, and
:func:`publish_release` seals them. A grid with holes (cells not accepted, failed sources,
short strata) is refused unless the caller allows it, and then the release lists what was
left out and why (``left_out.jsonl``). Everything that could refuse (version taken:
:func:`check_release_version`, once per run; nothing to publish; an incomplete grid) is checked
before a byte is staged.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import counterfactory
from counterfactory.flows.engine.outcomes import (
    PublishError,
    cell_rows,
    collect_outcomes,
    completeness,
    editor_label,
    format_completeness,
    outcome_order,
)
from counterfactory.flows.engine.run_folder import RunFolder, Workspace
from counterfactory.flows.engine.spec import Spec
from counterfactory.flows.engine.stats import _own_group, audit_expressions, audit_stats, build_stats, noise_floor_stats
from counterfactory.generation.sampling import Grid, grid_summary, with_editors
from counterfactory.generation.sources import (
    FailedSource,
    PreparedSource,
    load_image,
)
from counterfactory.manifests.derived import apply_transform, crop_series, derived_id
from counterfactory.manifests.lifecycle import (
    TemplateOutcome,
)
from counterfactory.manifests.release import (
    ReleaseExistsError,
    ReleaseStage,
    SealedRelease,
    existing_release_conflict,
    sealed_from,
    write_json,
    write_jsonl,
)
from counterfactory.manifests.release_files import (
    ReleaseContext,
    build_release_files,
    release_file_entries,
)
from counterfactory.manifests.release_folder import ITEMS, MANIFEST, MANIFEST_PARQUET, RELEASE_JSON
from counterfactory.manifests.release_schema import schema_files, validate_rows, write_release_schemas
from counterfactory.manifests.review import apply_reviews
from counterfactory.manifests.store import atomic_write, png_bytes
from counterfactory.manifests.trials import (
    analysis_record,
    bank_record,
    load_biographies,
    needs_biographies,
    release_trials,
    trial_input_files,
    trial_summary,
    trials_left_out,
)
from counterfactory.manifests.vocabulary import ACCEPTED
from counterfactory.validation.attrition import plot_attrition
from counterfactory.validation.judging import (
    floor_path_of,
)
from counterfactory.validation.report import write_report
from counterfactory.validation.review_stats import release_review_stats
from counterfactory.validation.target_stats import (
    plot_skin_tone,
    skin_tone_stats,
)


class EmptyReleaseError(PublishError):
    """No cell is accepted or waiting for review (every source failed, or every cell was rejected)."""


class IncompleteGridError(PublishError):
    """Cells, sources or strata are missing and ``allow_incomplete`` was not given."""


def with_version(spec: Spec, version: str | None) -> Spec:
    """``spec`` publishing as ``version`` (``None``: the spec's own ``release.version``)."""
    if version is None or version == spec.release.version:
        return spec
    from counterfactory.manifests.spec import ReleaseConfig

    release = ReleaseConfig.model_validate({**spec.release.model_dump(), "version": version})
    return spec.model_copy(update={"release": release})


def _editor_record(attempt) -> dict[str, Any] | None:
    if attempt is None:
        return None
    lineage = attempt.lineage or {}
    meta = attempt.meta or {}
    output = meta.get("output") or {}
    return {
        "backend": attempt.backend,
        "model": lineage.get("model_id") or lineage.get("endpoint"),
        # the commit the backend resolved the model to (qwen reports it), else what was asked for
        "revision": meta.get("model_commit") or lineage.get("revision"),
        "lineage": lineage,
        "prompt": attempt.prompt if "prompt" not in output else output["prompt"] or "",
        "seed": attempt.seed,
        "attempt_no": attempt.attempt_no,
        "cost_usd": attempt.cost_usd,
        # what the backend recorded about the file it returned (the import backend: the row,
        # the candidate's sha256, decoder warnings such as a PNG chunk with a bad CRC; its
        # prompt is the table's, "" where the table gives none, not the spec's)
        **({"output": output} if output else {}),
    }


def item_rows(
    spec: Spec,
    ws: Workspace,
    prepared: Sequence[PreparedSource],
    outcomes: Sequence[TemplateOutcome],
) -> list[dict[str, Any]]:
    """One row per cell with its final attempt, candidate, verdict and review (``items.jsonl``
    schema, ``expression`` still None); no file is touched. Image and source paths are the
    ones :func:`stage_item_files` copies them to.
    """
    by_id = {p.id: p for p in prepared}
    final_ids = [c.final_attempt for o in outcomes for c in o.cells if c.final_attempt]
    attempts = ws.ledger.attempts_by_id(final_ids)
    candidates = ws.ledger.candidates_by_id(final_ids)
    rows = []
    for outcome in outcomes:
        src = by_id[outcome.template_id]
        src_rel = _source_path(src)
        for cell_outcome in outcome.cells:
            cell = cell_outcome.cell
            aid = cell_outcome.final_attempt
            attempt = attempts.get(aid) if aid else None
            candidate = candidates.get(aid) if aid else None
            image = None
            if candidate is not None and candidate.image_sha256:
                image = {"sha256": candidate.image_sha256, "path": f"images/{candidate.image_sha256}.png"}
            record = src.meta
            rows.append(
                {
                    "item_id": aid,
                    "cell_id": cell.cell_id,
                    "template_id": outcome.template_id,
                    "editor_name": editor_label(spec, cell),
                    "floor_path": floor_path_of(candidate.gates) if candidate else None,
                    "kind": spec.design.kind,
                    "condition": dict(cell.condition),
                    "gender_match": cell.gender_match,
                    "status": cell_outcome.verdict,
                    "reasons": list(cell_outcome.reasons),
                    "attempts": len(cell_outcome.attempt_ids),
                    "image": image,
                    "source": {
                        "id": src.id,
                        "sha256": src.source.sha256,
                        "path": src_rel,
                        "licence": record.get("licence"),
                        "occupation": record.get("occupation"),
                        "context": record.get("context"),
                        "presented_gender": record.get("presented_gender"),
                    },
                    "editor": _editor_record(attempt),
                    "alignment": candidate.alignment if candidate else None,
                    "gates": candidate.gates if candidate else {},
                    "review": None,
                    "expression": None,
                    # judged without a source photo (validation.judging.judge_alone)
                    **_skipped_gates(candidate),
                }
            )
    # a person's resolved decision is the item's status; the history goes into its row
    apply_reviews(ws.ledger, spec.review, rows)
    return rows


def _skipped_gates(candidate: Any) -> dict[str, Any]:
    """``{"skipped_gates": [...]}`` for a candidate judged without a source, else ``{}``."""
    alignment = (candidate.alignment if candidate is not None else None) or {}
    skipped = alignment.get("skipped_gates")
    return {"skipped_gates": list(skipped)} if isinstance(skipped, list) else {}


def _source_path(src: PreparedSource) -> str:
    return f"sources/{src.source.sha256}{src.source.path.suffix.lower()}"


def stage_item_files(
    ws: Workspace, prepared: Sequence[PreparedSource], outcomes: Sequence[TemplateOutcome], rows, stage: ReleaseStage
) -> None:
    """Copy every row's source photo and image into ``stage``, each checked against the sha256
    it is addressed by (store images and source photos), so a damaged or edited file stops the
    publish with its name."""
    by_id = {p.id: p for p in prepared}
    for outcome in outcomes:
        src = by_id[outcome.template_id]
        stage.add_file(_source_path(src), src.source.path, sha256=src.source.sha256)
    for row in rows:
        if row["image"] is not None:
            sha = row["image"]["sha256"]
            stage.add_file(row["image"]["path"], ws.store.verified_path(sha), sha256=sha)


def build_items(
    spec: Spec,
    ws: Workspace,
    prepared: Sequence[PreparedSource],
    outcomes: Sequence[TemplateOutcome],
    stage: ReleaseStage,
) -> list[dict[str, Any]]:
    """:func:`item_rows`, with their files copied into ``stage`` (:func:`stage_item_files`)."""
    rows = item_rows(spec, ws, prepared, outcomes)
    stage_item_files(ws, prepared, outcomes, rows, stage)
    return rows


#: bump when what a release holds is built differently from the same inputs
RELEASE_FORMAT = 1


def release_inputs_key(
    spec: Spec,
    items: Sequence[dict[str, Any]],
    failed: Sequence[FailedSource],
    grid: Grid,
    *,
    review: dict[str, Any],
    cost_usd: float,
) -> str:
    """sha256 of everything a release is built from, known before a byte is staged.

    The spec as written and its hash, every cell's row (attempt, lineage, image and source
    sha256, alignment, gate metrics, verdict, review history: :func:`item_rows`), the failed
    sources, the grid's shortfalls and exclusions, the review statistics (they read the whole
    ledger: audit and spot-the-edit answers) and this release's cost. The images themselves
    are named by sha256, and the trials, derived variants and expression labels are functions
    of these. Not in it: the time of sealing and the editor calls of the run that sealed it,
    which do not change what the release says about its items.
    """
    import json

    payload = {
        "format": RELEASE_FORMAT,
        "spec_sha256": spec.as_written()[1],
        "spec_hash": spec.spec_hash(),
        "items": items,
        "failed": [{"id": f.id, "path": f.path.name, "reason": f.reason} for f in failed],
        "grid": grid_summary(grid),
        "review": review,
        "cost_usd": round(cost_usd, 6),
        # the files the spec names decide the trials: hashed by content, not by their path
        "inputs": {
            name: hashlib.sha256(p.read_bytes()).hexdigest() for name, p in trial_input_files(spec.trials).items()
        },
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def build_derived(
    spec: Spec, manifest: Sequence[dict[str, Any]], prepared: Sequence[PreparedSource], stage: ReleaseStage
) -> list[dict[str, Any]]:
    """Robustness variants of the manifest's items, written under ``images/`` by sha256.

    The crop boxes come from one face box per template, measured on the source, and are the
    same pixels for every variant of that template.
    """
    config = spec.robustness
    if not (config.mirror or config.crops):
        return []
    boxes: dict[str, dict[str, tuple[int, int, int, int]] | None] = {}
    face_boxes: dict[str, list[int]] = {}
    if config.crops:
        from counterfactory.validation.faces import get_face_landmarker

        landmarker = get_face_landmarker()
        for p in prepared:
            faces = landmarker.detect(p.source.pixels)
            if faces:
                face = faces[0].box
                face_boxes[p.id] = [int(round(v)) for v in face]
                boxes[p.id] = crop_series(face, p.source.pixels.shape[:2], config)
            else:
                boxes[p.id] = None
    rows = []
    for item in manifest:
        pixels = None
        transforms = []
        if config.mirror:
            transforms.append({"kind": "mirror"})
        series = boxes.get(item["template_id"]) if config.crops else None
        if series:
            for level, box in series.items():
                transforms.append(
                    {"kind": "crop", "level": level, "box": list(box), "face_box": face_boxes[item["template_id"]]}
                )
        for transform in transforms:
            if pixels is None:
                pixels = load_image(stage.dir / item["image"]["path"]).pixels
            data = png_bytes(apply_transform(pixels, transform))
            sha = hashlib.sha256(data).hexdigest()
            rel = f"images/{sha}.png"
            if not (stage.dir / rel).exists():
                atomic_write(stage.dir / rel, data)
            rows.append(
                {
                    "item_id": derived_id(item["item_id"], transform),
                    "parent_item_id": item["item_id"],
                    "template_id": item["template_id"],
                    "transform": transform,
                    "image": {"sha256": sha, "path": rel},
                }
            )
    return rows


def build_trial_bank(
    spec: Spec,
    manifest: Sequence[dict[str, Any]],
    grid: Grid,
    *,
    biographies: dict[str, list[dict[str, str]]] | None,
    derived: Sequence[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The release's trials (:func:`~counterfactory.manifests.trials.release_trials`, which
    ``verify`` re-runs on the release's own tables): pooled over the spec's editors, or with
    ``trials.per_editor`` one bank per editor."""
    per_template = len(grid.cells) // len(grid.templates) if grid.templates else None
    names = [view.editor_name or spec.editor.backend for view in spec.editor_views()]
    return release_trials(
        manifest, spec.trials, biographies=biographies, derived=derived, cells_per_template=per_template,
        editor_names=names,
    )  # fmt: skip


def manifest_table(rows: Sequence[dict[str, Any]], axes: Sequence[str]):
    """A ``pyarrow.Table``: the manifest flattened to one column per field (nested values as JSON).

    Columns: ids, template, one ``condition.<axis>`` per axis, gender match, image path and
    sha256, source id/sha256/path/licence/occupation/presented gender, editor name (the label a
    spec comparing ``editors`` gives it, else the backend), backend, model,
    revision, prompt, seed, attempt and lineage (JSON), alignment (JSON), per gate
    ``gate.<name>.passed`` (boolean) and every ``gate.<name>.<metric>`` and
    ``gate.<name>.threshold.<t>`` as float64, all gates (JSON), review (JSON, null when
    unreviewed) and expression labels. Every column has one type whatever its values (a
    column null in every row is still a string), so tables of two versions concatenate.
    """
    import json

    import pyarrow as pa

    def dumps(value: Any) -> str | None:
        return None if value is None else json.dumps(value, sort_keys=True, default=str)

    gate_cols: dict[str, list] = {}
    records = []
    for i, r in enumerate(rows):
        editor = r.get("editor") or {}
        expression = r.get("expression") or {}
        records.append(
            {
                "item_id": r["item_id"],
                "cell_id": r["cell_id"],
                "template_id": r["template_id"],
                "kind": r["kind"],
                **{f"condition.{a}": r["condition"].get(a) for a in axes},
                "gender_match": r["gender_match"],
                "status": r["status"],
                "image_path": r["image"]["path"] if r["image"] else None,
                "image_sha256": r["image"]["sha256"] if r["image"] else None,
                "source_id": r["source"]["id"],
                "source_sha256": r["source"]["sha256"],
                "source_path": r["source"]["path"],
                "source_licence": r["source"]["licence"],
                "source_occupation": r["source"]["occupation"],
                "source_presented_gender": r["source"]["presented_gender"],
                "editor_name": r.get("editor_name"),
                "floor_path": r.get("floor_path"),
                "editor_backend": editor.get("backend"),
                "editor_model": editor.get("model"),
                "editor_revision": editor.get("revision"),
                "editor_prompt": editor.get("prompt"),
                "editor_seed": editor.get("seed"),
                "editor_attempt_no": editor.get("attempt_no"),
                "editor_lineage": dumps(editor.get("lineage")),
                "alignment": dumps(r.get("alignment")),
                "gates": dumps(r.get("gates")),
                "review": dumps(r.get("review")),
                "expression_label": expression.get("label"),
                "expression_template_label": expression.get("template_label"),
                "expression_consistent": expression.get("consistent"),
            }
        )
        for gate, result in (r.get("gates") or {}).items():
            values = {f"gate.{gate}.passed": bool(result.get("passed"))}
            for name, v in (result.get("metrics") or {}).items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    values[f"gate.{gate}.{name}"] = float(v)
            for name, v in (result.get("thresholds") or {}).items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    values[f"gate.{gate}.threshold.{name}"] = float(v)
            for col, v in values.items():
                gate_cols.setdefault(col, [None] * len(rows))[i] = v
    # one type per column in every version: a column that is null in every row (no review yet)
    # is still a string column, a flag a boolean, a seed an integer
    types = {"gender_match": pa.bool_(), "expression_consistent": pa.bool_()}
    types |= {"editor_seed": pa.int64(), "editor_attempt_no": pa.int64()}
    schema = pa.schema([(c, types.get(c, pa.string())) for c in (records[0] if records else {"item_id": None})])
    table = pa.Table.from_pylist(records, schema=schema)
    for col in sorted(gate_cols):
        passed = col.endswith(".passed") and col.count(".") == 2
        table = table.append_column(col, pa.array(gate_cols[col], pa.bool_() if passed else pa.float64()))
    return table


def check_release_version(spec: Spec, releases: Path) -> None:
    """Refuse, before anything is paid for, a run that would publish a version another spec
    file already made (:func:`~counterfactory.manifests.release.existing_release_conflict`).

    The one place a run checks its release version: :func:`~counterfactory.flows.resume.run_spec` with ``publish``, the
    ``publish`` command and a scheduled run's publish each call it once, and
    :func:`publish_release` relies on it (the seal still refuses
    a different manifest under a taken version).

    Raises:
        ReleaseExistsError: the version exists, made from another spec file.
    """
    conflict = existing_release_conflict(releases, spec.release.name, spec.release.version, spec.as_written()[1])
    if conflict:
        raise ReleaseExistsError(conflict)


def calibration_record(spec: Spec) -> dict[str, Any] | None:
    """What ``release.json`` says of the calibration the spec pinned (``gates.calibration``):
    its path as written, sha256, creation time, provenance (``calibrate --from-review``: run,
    editor lineages, reviewers, label counts) and how many thresholds the review set; None
    for the shipped calibration (``counterfactory_version`` names it)."""
    path = spec.gates.calibration
    if path is None:
        return None
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    review = data.get("from_review") or {}
    fitted = [v for v in (review.get("thresholds") or {}).values() if isinstance(v, dict) and v.get("from") == "review"]
    return {
        "path": spec.canonical()["gates"]["calibration"],
        "sha256": spec.calibration_sha256(),
        "created": data.get("created"),
        "provenance": review.get("provenance"),
        "thresholds_from_review": len(fitted) if review else None,
    }


def publish_release(
    spec: Spec,
    ws: Workspace,
    prepared: Sequence[PreparedSource],
    failed: Sequence[FailedSource],
    outcomes: Sequence[TemplateOutcome],
    grid: Grid,
    *,
    allow_incomplete: bool = False,
    before_seal: Callable[[Path], None] | None = None,
) -> SealedRelease:
    """Check, stage and seal one release; see the module docstring for what it holds.

    ``before_seal`` is called with the staging folder once every file is written, to add
    files the checksums then cover (a scheduled run's ``diff.json``).

    The caller has checked the version once (:func:`check_release_version`), before the run.

    Raises:
        EmptyReleaseError: no item is accepted (nothing is staged).
        IncompleteGridError: the grid has holes and ``allow_incomplete`` is False.
        ReleaseIntegrityError: a store image or a source photo does not match its sha256.
    """
    # a spec comparing editors: every cell once per editor, in one order however the run got them
    grid = with_editors(grid, [view.editor_name for view in spec.editor_views()])
    outcomes = sorted(outcomes, key=outcome_order(spec))
    # every cell's row, reviews applied, read once: completeness reads its status (cell_rows
    # would read the same reviews a second time over every cell)
    items = item_rows(spec, ws, prepared, outcomes)
    report, left_out = completeness(items, failed, grid)
    # items waiting for a person still make a release worth sealing (the review queue reports
    # them); no accepted and no undecided cell is an empty release
    kept = sum(g["accepted"] + g["undecided"] for g in report["per_group"])
    summary = format_completeness(report, left_out)
    if kept == 0:
        raise EmptyReleaseError(
            f"nothing to publish for {spec.release.name} {spec.release.version}: no cell is accepted or waiting "
            "for review "
            f"({len(failed)} failed source(s), {sum(len(o.cells) for o in outcomes)} cell(s)); no release was "
            f"written and the version is still free. Fix the sources (see their reasons) and run again.\n{summary}"
        )
    if not report["complete"] and not allow_incomplete:
        raise IncompleteGridError(
            f"the grid of {spec.release.name} {spec.release.version} is incomplete; nothing was published. "
            "Review the undecided cells, add sources, or publish what there is with --allow-incomplete "
            f"(the release then lists what was left out).\n{summary}"
        )
    biographies = load_biographies(spec.trials.biographies) if needs_biographies(spec.trials) else None
    review = release_review_stats(ws.ledger, spec.review, items)
    # this release's attempts only: other specs may share the ledger
    cost = ws.ledger.cost_usd(a for o in outcomes for c in o.cells for a in c.attempt_ids)
    inputs_sha256 = release_inputs_key(spec, items, failed, grid, review=review, cost_usd=cost)
    # an unchanged re-run: the sealed release was built from exactly these inputs, so building
    # it again (contact sheets, plots, copies) would only be thrown away
    unchanged = sealed_from(ws.releases, spec.release.name, spec.release.version, inputs_sha256)
    if unchanged is not None:
        return unchanged
    stage = ReleaseStage(ws.releases, spec.release.name, spec.release.version)
    try:
        stage_item_files(ws, prepared, outcomes, items, stage)
        audit_expressions(spec, items, prepared, stage)
        manifest = [r for r in items if r["status"] == ACCEPTED]
        derived = build_derived(spec, manifest, prepared, stage)
        trials = build_trial_bank(spec, manifest, grid, biographies=biographies, derived=derived)
        left_out = left_out + trials_left_out(manifest, spec.trials, biographies=biographies)
        floors = noise_floor_stats(spec, ws, prepared, grid)
        stats = build_stats(spec, items, failed, grid, total_cost_usd=cost, floors=floors)
        stats["review"] = review
        stats["skin"] = skin_tone_stats(items, {p.id: _own_group(spec, p.meta) for p in prepared})
        if (audit := audit_stats(spec, items, manifest)) is not None:
            stats["audit"] = audit
        if stats["skin"]["by_condition"] or stats["skin"]["lightened_by_source_group"]:
            plot_skin_tone(stats["skin"], stage.dir / "skin_tone.png")
        text, text_sha = spec.as_written()
        release_info = {
            "name": spec.release.name,
            "version": spec.release.version,
            "description": spec.release.description,
            "created_at": datetime.now(UTC).isoformat(),
            "spec_name": spec.name,
            "spec_hash": spec.spec_hash(),
            "spec_sha256": text_sha,
            "complete": report["complete"],
            "inputs_sha256": inputs_sha256,
            "counterfactory_version": counterfactory.__version__,
            "trial_bank": bank_record(spec.trials),
            "trials": trial_summary(trials),
            "analysis": analysis_record(
                {axis: list(values) for axis, values in spec.design.axes.items()}, spec.trials.protocols
            ),
            "inputs": {name: stage.add_input(p) for name, p in trial_input_files(spec.trials).items()},
            "files": {
                MANIFEST: "accepted items, one JSON object a line (schemas/manifest.schema.json)",
                MANIFEST_PARQUET: "the same rows, flattened, for dataframes",
                ITEMS: "every cell of the grid with its final status (schemas/item.schema.json)",
                "left_out.jsonl": "what the grid asked for that is not in the manifest, and why",
                "trials.jsonl": "query units for a scoring harness (schemas/trial.schema.json)",
                "derived.jsonl": "robustness variants of manifest items (schemas/derived.schema.json)",
                "spec.yaml": "the spec as written; its sha256 is spec_sha256",
                "stats.json": "counts, pass rates, completeness and expression drift",
            },
        }
        files = {
            MANIFEST: manifest,
            ITEMS: items,
            "left_out.jsonl": left_out,
            "trials.jsonl": trials,
            "derived.jsonl": derived,
        }
        # files a plug-in adds, when the spec's release.files names them (none: nothing changes)
        extra = build_release_files(ReleaseContext(spec, items, manifest, derived, trials, stats))
        files.update({name: rows for name, (rows, _) in extra.items()})
        release_info["files"].update(release_file_entries(extra))
        if (pinned := calibration_record(spec)) is not None:
            release_info["calibration"] = pinned
        problems = [p for name, rows in files.items() for p in validate_rows(name, rows)]
        problems += validate_rows("stats.json", [stats]) + validate_rows(RELEASE_JSON, [release_info])
        if problems:
            raise PublishError("the release does not match its own schemas (a bug):\n" + "\n".join(problems[:10]))
        release_info["tables"] = {}
        for name, rows in files.items():
            release_info["tables"][name] = {"rows": len(rows), "sha256": write_jsonl(stage.dir / name, rows)}
        import pyarrow.parquet as pq

        pq.write_table(manifest_table(manifest, list(spec.design.axes)), stage.dir / MANIFEST_PARQUET)
        atomic_write(stage.dir / "spec.yaml", text.encode("utf-8"))
        (stage.dir / "schemas").mkdir()
        for schema in schema_files():
            shutil.copyfile(schema, stage.dir / "schemas" / schema.name)
        write_release_schemas(stage.dir / "schemas", spec.trials.protocols, extra)
        write_json(stage.dir / "stats.json", stats)
        plot_attrition(stats["attrition"], stage.dir / "attrition.png")
        write_json(stage.dir / RELEASE_JSON, release_info)
        # the report from stats.json as written: verify derives it again from the file
        written_stats = json.loads((stage.dir / "stats.json").read_text(encoding="utf-8"))
        write_report(stage.dir, spec=spec, items=items, stats=written_stats)
        if before_seal is not None:
            before_seal(stage.dir)
        sealed = stage.seal()
    except BaseException:
        stage.discard()
        raise
    if spec.source_path is not None and spec.source_path.is_file():
        # `publish OUT` and `review serve OUT` find the spec here: the release's spec.yaml is the
        # text as written, whose relative paths mean something only beside the original file
        ws.folder.record_spec(spec.source_path)
    return sealed


@dataclass(frozen=True)
class PublishSummary:
    """What :func:`publish_from_ledger` sealed, and the grid's completeness report."""

    sealed: SealedRelease
    report: dict[str, Any]
    left_out: list[dict[str, Any]]


def publish_from_ledger(spec: Spec, out: Path, *, allow_incomplete: bool = False) -> PublishSummary:
    """Seal ``spec``'s release from the ledger and store in ``out``, with zero editor calls.

    Sources are loaded and checked again (their masks decide the attempt ids), the grid is
    planned again, and every cell's outcome is read from the ledger (:func:`collect_outcomes`).
    """
    # a run still writing the ledger would change what is being sealed
    with RunFolder(out).lock():
        return _publish_locked(spec, out, allow_incomplete=allow_incomplete)


def _publish_locked(spec: Spec, out: Path, *, allow_incomplete: bool) -> PublishSummary:
    from counterfactory.flows.engine.run_folder import open_workspace
    from counterfactory.flows.engine.sources import plan_grid, prepare_sources

    ws = open_workspace(spec, out)
    try:
        check_release_version(spec, ws.releases)
        prepared, failed = prepare_sources(spec, ws.ledger, ws.store)
        grid = plan_grid(spec, prepared)
        outcomes = collect_outcomes(spec, ws, prepared, grid)
        report, left_out = completeness(cell_rows(ws, spec, outcomes), failed, grid)
        sealed = publish_release(spec, ws, prepared, failed, outcomes, grid, allow_incomplete=allow_incomplete)
        return PublishSummary(sealed, report, left_out)
    finally:
        ws.ledger.close()
