"""What the cells came to: every cell's outcome read from the ledger, and the grid's completeness.

:func:`collect_outcomes` is the publishing policy over
:func:`~counterfactory.manifests.lifecycle.fill_cells` (zero editor calls); :func:`completeness`
says which cells, sources and strata a release would leave out. :class:`RunSummary` is what a
run reports. Plain functions, no Prefect.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from counterfactory.flows.engine.execute import judge_key
from counterfactory.flows.engine.run_folder import Workspace
from counterfactory.flows.engine.sources import editor_runs
from counterfactory.flows.engine.spec import Spec
from counterfactory.generation.attempts import (
    PlannedAttempt,
    plan_attempts,
)
from counterfactory.generation.editors import make_editor
from counterfactory.generation.sampling import Grid
from counterfactory.generation.sources import FailedSource, PreparedSource
from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.lifecycle import (
    FINISHED_ATTEMPT,
    CellOutcome,
    Settled,
    TemplateOutcome,
    fill_cells,
)
from counterfactory.manifests.review import apply_reviews
from counterfactory.manifests.vocabulary import ACCEPTED, FAILED
from counterfactory.validation.gates.base import VERDICTS
from counterfactory.validation.release_derived import completeness_report


@dataclass(frozen=True)
class RunSummary:
    #: None when the run did not publish (``publish=False``)
    release_path: Path | None
    release_created: bool
    counts: dict[str, int]
    failed_sources: int
    templates: int
    complete_templates: int
    editor_calls: int
    #: of ``editor_calls``, the noise-floor requests (one per template the first time it runs)
    floor_calls: int = 0
    #: finished attempts whose output image was gone from the store when the run started
    missing_outputs: int = 0
    #: True when the ledger already held every cell's outcome and Prefect was not started
    settled: bool = False


STATUSES = VERDICTS


class PublishError(CounterfactoryError, RuntimeError):
    """A release that must not be sealed; the message says why and how to go on."""


def collect_outcomes(
    spec: Spec, ws: Workspace, prepared: Sequence[PreparedSource], grid: Grid
) -> list[TemplateOutcome]:
    """Every cell's attempts and final verdict, read from the ledger; no editor is called (the
    publishing policy over :func:`~counterfactory.manifests.lifecycle.fill_cells`).

    Attempt ids are planned exactly as the run plans them (seed ``editor.seed + n - 1`` for
    attempt ``n``), so a cell's outcome is the one the run reached. A cell with no attempt in
    the ledger is ``failed`` with reason ``not_run``.

    Raises:
        PublishError: a stored verdict was judged with other alignment or gate settings.
    """
    jkey = judge_key(spec)
    by_id = {p.id: p for p in prepared}

    def settle(plans: Sequence[PlannedAttempt]) -> dict[str, Settled | None]:
        settled: dict[str, Settled | None] = {}
        for planned in plans:
            aid = planned.attempt_id
            attempt = ws.ledger.attempt(aid)
            if attempt is None:
                settled[aid] = None  # the run never got this far: the cell stays as it is
                continue
            if attempt.status not in FINISHED_ATTEMPT:
                settled[aid] = Settled(FAILED, [attempt.reason or f"editor_{attempt.status}"])
                continue
            candidate = ws.ledger.candidate(aid)
            if candidate is None or candidate.judge_key != jkey:
                raise PublishError(
                    f"cell {planned.cell.cell_id}: attempt {aid[:12]} was not judged with this spec's alignment "
                    "and gate settings; run the spec again (`counterfactory run`, zero editor calls) to "
                    "re-judge, then publish"
                )
            settled[aid] = Settled(candidate.verdict, candidate.reasons)
        return settled

    def not_run(cell) -> CellOutcome:
        return CellOutcome(cell=cell, verdict=FAILED, reasons=["not_run: no attempt in the ledger; run the spec"])

    outcomes = []
    for view, view_cells in editor_runs(spec, grid):  # one pass per editor the spec names
        editor = make_editor(view.editor.backend, view.editor.options())
        lineage = editor.lineage()
        cells_by_template: dict[str, list] = {}
        for cell in view_cells:
            cells_by_template.setdefault(cell.source_id, []).append(cell)
        for template_id, cells in sorted(cells_by_template.items()):
            source = by_id[template_id]

            def plan(open_cells, attempt_no, source=source, view=view, editor=editor, lineage=lineage):
                return plan_attempts(view, source, open_cells, editor, lineage, attempt_no)

            results = fill_cells(cells, view.editor.max_attempts, plan, settle, initial=not_run)
            outcomes.append(TemplateOutcome(template_id=template_id, cells=list(results.values()), editor_calls=0))
    return sorted(outcomes, key=outcome_order(spec))


def outcome_order(spec: Spec) -> Callable[[TemplateOutcome], tuple[str, int]]:
    """The sort key of a release's template outcomes: template id, then the spec's editor order
    (a one-editor spec's outcomes by template id, as before editors could be compared)."""
    names = [view.editor_name for view in spec.editor_views()]
    return lambda o: (o.template_id, names.index(o.editor))


def editor_label(spec: Spec, cell: Any) -> str:
    """The editor a cell's row names (``editor_name``): its label in a spec with ``editors``,
    else the one editor's backend."""
    return cell.editor if cell.editor is not None else spec.editor.backend


def cell_rows(ws: Workspace, spec: Spec, outcomes: Sequence[TemplateOutcome]) -> list[dict[str, Any]]:
    """Each cell's status after people's resolved reviews (no files touched): what decides
    completeness before anything is staged."""
    rows = [
        {
            "item_id": c.final_attempt,
            "cell_id": c.cell.cell_id,
            "template_id": o.template_id,
            "condition": dict(c.cell.condition),
            "status": c.verdict,
            "reasons": list(c.reasons),
        }
        for o in outcomes
        for c in o.cells
    ]
    apply_reviews(ws.ledger, spec.review, rows)
    return rows


def completeness(
    rows: Sequence[dict[str, Any]], failed: Sequence[FailedSource], grid: Grid
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(report, left_out rows)``: per condition group the cells planned, accepted, undecided
    (``needs_review``) and unfilled (``rejected``/``failed``), and everything left out with why.

    Args:
        rows: one per cell (:func:`cell_rows`): ``cell_id``, ``template_id``, ``condition``,
            ``status`` and ``reasons``.

    The grid is complete when every cell is accepted, no source failed and no stratum is short.
    """
    left_out: list[dict[str, Any]] = []
    for row in rows:
        if row["status"] != ACCEPTED:
            left_out.append(
                {
                    "what": "cell",
                    "id": row["cell_id"],
                    "status": row["status"],
                    "reason": "; ".join(row["reasons"]) or row["status"],
                    "group": {"template_id": row["template_id"], **row["condition"]},
                }
            )
    for f in failed:
        left_out.append({"what": "source", "id": f.id, "status": "failed", "reason": f.reason, "group": {}})
    for s in grid.shortfalls:
        left_out.append(
            {
                "what": "stratum",
                "id": "|".join(f"{k}={v}" for k, v in s.stratum.items()),
                "status": "short",
                "reason": f"{s.available} eligible source(s) for {s.requested} requested template(s)",
                "group": {k: v for k, v in s.stratum.items()},
            }
        )
    for e in grid.excluded:
        left_out.append({"what": "source", "id": e.source_id, "status": "excluded", "reason": e.reason, "group": {}})
    report = completeness_report(rows, failed_sources=bool(failed), short_strata=bool(grid.shortfalls))
    return report, left_out


def format_completeness(report: dict[str, Any], left_out: Sequence[dict[str, Any]], *, limit: int = 12) -> str:
    """Human-readable lines: one per group, then what was left out (first ``limit``)."""
    lines = ["per group: cells, accepted, undecided (needs_review), unfilled (rejected/failed)"]
    for g in report["per_group"]:
        lines.append(f"  {g['group']}: {g['cells']} cells, {g['accepted']} accepted, "
                     f"{g['undecided']} undecided, {g['unfilled']} unfilled")  # fmt: skip
    counted = [r for r in left_out if r["status"] != "excluded"]
    if counted:
        lines.append(f"left out ({len(counted)}):")
        for r in counted[:limit]:
            lines.append(f"  {r['what']} {r['id']}: {r['status']}: {r['reason'][:160]}")
        if len(counted) > limit:
            lines.append(f"  ... and {len(counted) - limit} more (listed in the release's left_out.jsonl)")
    return "\n".join(lines)
