"""Turn a finished run's ledger state into a release folder (plain functions, no Prefect)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from counterfactory.flows.steps import PreparedSource, TemplateOutcome, Workspace
from counterfactory.generation.sampling import Grid, grid_summary
from counterfactory.generation.sources import FailedSource
from counterfactory.manifests.release import ITEMS, MANIFEST, ReleaseStage, SealedRelease, write_json, write_jsonl
from counterfactory.manifests.review import apply_reviews
from counterfactory.manifests.spec import Spec
from counterfactory.validation.attrition import attrition_table, plot_attrition
from counterfactory.validation.report import write_report
from counterfactory.validation.review_stats import release_review_stats
from counterfactory.validation.target_stats import label_consistency, plot_skin_tone, skin_tone_stats

STATUSES = ("accepted", "needs_review", "rejected", "failed")


def build_items(
    spec: Spec,
    ws: Workspace,
    prepared: Sequence[PreparedSource],
    outcomes: Sequence[TemplateOutcome],
    stage: ReleaseStage,
) -> list[dict[str, Any]]:
    """One row per cell with its final attempt, candidate and verdict; files staged by sha256."""
    by_id = {p.id: p for p in prepared}
    rows = []
    for outcome in outcomes:
        src = by_id[outcome.template_id]
        src_rel = stage.add_file(f"sources/{src.source.sha256}{src.source.path.suffix.lower()}", src.source.path)
        for cell_outcome in outcome.cells:
            cell = cell_outcome.cell
            attempt = ws.ledger.attempt(cell_outcome.final_attempt) if cell_outcome.final_attempt else None
            candidate = ws.ledger.candidate(cell_outcome.final_attempt) if cell_outcome.final_attempt else None
            image = None
            if candidate is not None and candidate.image_sha256:
                rel = stage.add_file(
                    f"images/{candidate.image_sha256}.png", ws.store.verified_path(candidate.image_sha256)
                )
                image = {"sha256": candidate.image_sha256, "path": rel}
            record = src.meta
            rows.append(
                {
                    "item_id": cell_outcome.final_attempt,
                    "cell_id": cell.cell_id,
                    "template_id": outcome.template_id,
                    "kind": spec.design.kind,
                    "condition": dict(cell.condition),
                    "gender_match": cell.gender_match,
                    "status": cell_outcome.verdict,
                    "reasons": cell_outcome.reasons,
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
                    "editor": None
                    if attempt is None
                    else {
                        "backend": attempt.backend,
                        "lineage": attempt.lineage,
                        "prompt": attempt.prompt,
                        "seed": attempt.seed,
                        "attempt_no": attempt.attempt_no,
                        "cost_usd": attempt.cost_usd,
                    },
                    "alignment": candidate.alignment if candidate else None,
                    "gates": candidate.gates if candidate else {},
                    "review": None,
                }
            )
    # a person's resolved decision is the item's status; the history goes into its row
    apply_reviews(ws.ledger, spec.review, rows)
    return rows


def build_stats(
    spec: Spec,
    items: Sequence[dict[str, Any]],
    failed: Sequence[FailedSource],
    outcomes: Sequence[TemplateOutcome],
    grid: Grid,
    *,
    editor_calls: int,
    total_cost_usd: float,
) -> dict[str, Any]:
    counts = Counter(row["status"] for row in items)
    reasons = Counter(code.split(":")[0] for row in items if row["status"] != "accepted" for code in row["reasons"])
    gate_rows = [
        {
            "condition": row["condition"],
            "verdict": row["status"],
            "gates": {name: bool(g.get("passed")) for name, g in (row["gates"] or {}).items()},
        }
        for row in items
    ]
    return {
        "release": {"name": spec.release.name, "version": spec.release.version},
        "spec_hash": spec.spec_hash(),
        "items": {status: counts.get(status, 0) for status in STATUSES} | {"total": len(items)},
        "failed_sources": [{"source_id": f.id, "path": str(f.path), "reason": f.reason} for f in failed],
        "grid": grid_summary(grid),
        "templates": {
            "total": len(outcomes),
            "complete": sum(o.complete for o in outcomes),
            "incomplete": [o.template_id for o in outcomes if not o.complete],
        },
        "reasons": dict(reasons.most_common()),
        "editor_calls_this_run": editor_calls,
        "cost_usd_total": round(total_cost_usd, 4),
        "attrition": attrition_table(gate_rows),
    }


def _own_group(spec: Spec, meta: dict[str, Any]) -> str | None:
    """The source's own race as its metadata records it (the skin gate's ``source_fields``
    say which field), for the lightened-share-per-source-group table; None if unrecorded."""
    skin = spec.gates.for_kind(spec.design.kind).skin
    field = (skin.source_fields if skin is not None else {}).get("race", "race")
    value = meta.get(field)
    if value is None:
        value = (meta.get("extra") or {}).get(field)
    return None if value is None else str(value)


def publish_release(
    spec: Spec,
    ws: Workspace,
    prepared: Sequence[PreparedSource],
    failed: Sequence[FailedSource],
    outcomes: Sequence[TemplateOutcome],
    grid: Grid,
    *,
    editor_calls: int,
) -> SealedRelease:
    """Stage manifest, items, spec, stats, report and images; seal the version."""
    stage = ReleaseStage(ws.releases, spec.release.name, spec.release.version)
    try:
        items = build_items(spec, ws, prepared, outcomes, stage)
        # this release's attempts only: other specs may share the ledger
        cost = ws.ledger.cost_usd(a for o in outcomes for c in o.cells for a in c.attempt_ids)
        stats = build_stats(spec, items, failed, outcomes, grid, editor_calls=editor_calls, total_cost_usd=cost)
        stats["review"] = release_review_stats(ws.ledger, spec.review, items)
        stats["skin"] = skin_tone_stats(items, {p.id: _own_group(spec, p.meta) for p in prepared})
        stats["labels"] = label_consistency(items)
        if stats["skin"]["by_condition"] or stats["skin"]["lightened_by_source_group"]:
            plot_skin_tone(stats["skin"], stage.dir / "skin_tone.png")
        write_jsonl(stage.dir / MANIFEST, [r for r in items if r["status"] == "accepted"])
        write_jsonl(stage.dir / ITEMS, items)
        (stage.dir / "spec.yaml").write_text(spec.to_yaml(), encoding="utf-8")
        write_json(stage.dir / "stats.json", stats)
        plot_attrition(stats["attrition"], stage.dir / "attrition.png")
        write_json(
            stage.dir / "release.json",
            {
                "name": spec.release.name,
                "version": spec.release.version,
                "description": spec.release.description,
                "created_at": datetime.now(UTC).isoformat(),
                "spec_hash": spec.spec_hash(),
            },
        )
        write_report(stage.dir, spec=spec, items=items, stats=stats)
        return stage.seal()
    except BaseException:
        stage.discard()
        raise
