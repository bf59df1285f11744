"""Start a run: settle a finished spec from the ledger alone, or hand the work to Prefect.

A re-run of a spec whose every cell is settled (each planned attempt finished, judged with
today's alignment and gate settings, its images in the store, and no cell left with a seed to
try) is a resume with nothing to do. It must cost what loading the spec and the ledger costs,
so it is answered here without importing or starting Prefect (its API server and imports are
seconds of every run) and, with ``--publish``, without rebuilding an unchanged release
(:func:`~counterfactory.flows.publish.publish_release` compares the inputs' hash first). Any
other run goes to the Prefect flow in :mod:`counterfactory.flows.run`.

Plain functions, no Prefect import.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from counterfactory.flows import steps
from counterfactory.flows.publish import publish_release, remember_spec
from counterfactory.generation.editors import Editor, make_editor
from counterfactory.generation.sampling import Grid
from counterfactory.manifests.release import ReleaseExistsError, existing_release_conflict
from counterfactory.manifests.runlock import RunFolderLock
from counterfactory.manifests.spec import Spec, load_spec


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
    #: finished attempts whose output image was gone from the store when the run started
    missing_outputs: int = 0
    #: True when the ledger already held every cell's outcome and Prefect was not started
    settled: bool = False


def settled_outcomes(
    spec: Spec, ws: steps.Workspace, prepared: Sequence[steps.PreparedSource], grid: Grid, editor: Editor
) -> list[steps.TemplateOutcome] | None:
    """Every template's outcome as :func:`~counterfactory.flows.steps.process_template` would
    return it with zero editor calls, or None when a run has work to do.

    Work to do: a planned attempt that is not in the ledger or not finished (``ok``/``refused``),
    an output or aligned image missing from the store, a candidate judged with other settings
    (or not judged), or a cell that is not filled while it has attempts left. Attempts are
    planned exactly as the run plans them and read a round at a time in a few queries.
    """
    lineage = editor.lineage()
    jkey = steps.judge_key(spec)
    by_id = {p.id: p for p in prepared}
    results: dict[str, dict[str, steps.CellOutcome]] = {}
    open_cells: dict[str, list] = {}
    for cell in grid.cells:
        results.setdefault(cell.source_id, {})[cell.cell_id] = steps.CellOutcome(cell=cell)
        open_cells.setdefault(cell.source_id, []).append(cell)
    for attempt_no in range(1, spec.editor.max_attempts + 1):
        plans = [
            plan
            for tid, cells in open_cells.items()
            if cells
            for plan in steps.plan_attempts(spec, by_id[tid], cells, editor, lineage, attempt_no)
        ]
        if not plans:
            break
        ids = [plan.attempt_id for plan in plans]
        attempts = ws.ledger.attempts_by_id(ids)
        candidates = ws.ledger.candidates_by_id(ids)
        open_cells = {tid: [] for tid in open_cells}
        for plan in plans:
            attempt, candidate = attempts.get(plan.attempt_id), candidates.get(plan.attempt_id)
            if attempt is None or not steps.attempt_finished(attempt):
                return None
            out = results[plan.cell.source_id][plan.cell.cell_id]
            if attempt.status == "failed":  # final: its backend said running it again cannot change it
                if plan.attempt_id not in out.attempt_ids:
                    out.attempt_ids.append(plan.attempt_id)
                out.final_attempt, out.verdict, out.reasons = (
                    plan.attempt_id,
                    "failed",
                    [attempt.reason or "editor_failed"],
                )
                open_cells[plan.cell.source_id].append(plan.cell)
                continue
            if attempt.status == "ok" and not ws.store.has(attempt.output_sha256):
                return None
            if candidate is None or candidate.judge_key != jkey:
                return None
            if candidate.image_sha256 and not ws.store.has(candidate.image_sha256):
                return None
            if plan.attempt_id not in out.attempt_ids:  # a seedless editor repeats its id
                out.attempt_ids.append(plan.attempt_id)
            out.final_attempt, out.verdict, out.reasons = plan.attempt_id, candidate.verdict, list(candidate.reasons)
            if candidate.verdict not in steps.FILLED:
                open_cells[plan.cell.source_id].append(plan.cell)
    return [
        steps.TemplateOutcome(template_id=tid, cells=list(cells.values()), editor_calls=0)
        for tid, cells in sorted(results.items())
    ]


def run_settled(
    spec: Spec, ws: steps.Workspace, *, publish: bool = False, allow_incomplete: bool = False
) -> RunSummary | None:
    """Finish a run whose every cell is settled in the ledger, without Prefect (None: there is
    work to do, and nothing was written but the sources' rows, as any run writes them).

    The run is recorded in the ledger's ``runs`` table with zero editor calls; with
    ``publish`` the release is sealed, or left as it is when it was built from the same inputs.
    """
    if not ws.ledger.has_attempts():
        return None  # a first run: there is nothing to settle, so nothing is read twice
    prepared, failed = steps.prepare_sources(spec, ws.ledger, ws.store)
    grid = steps.plan_grid(spec, prepared)
    # the lineage alone decides attempt ids: the backend is not prepared (no model is loaded)
    editor = make_editor(spec.editor.backend, spec.editor.options())
    outcomes = settled_outcomes(spec, ws, prepared, grid, editor)
    if outcomes is None:
        return None
    run_id = os.urandom(8).hex()
    ws.ledger.start_run(run_id, spec_name=spec.name, spec_hash=spec.spec_hash())
    sealed = (
        publish_release(spec, ws, prepared, failed, outcomes, grid, editor_calls=0, allow_incomplete=allow_incomplete)
        if publish
        else None
    )
    ws.ledger.finish_run(run_id, editor_calls=0)
    counts: dict[str, int] = {}
    for o in outcomes:
        for c in o.cells:
            counts[c.verdict] = counts.get(c.verdict, 0) + 1
    return RunSummary(
        release_path=sealed.path if sealed else None,
        release_created=bool(sealed and sealed.created),
        counts=counts,
        failed_sources=len(failed),
        templates=len(outcomes),
        complete_templates=sum(o.complete for o in outcomes),
        editor_calls=0,
        settled=True,
    )


def run_spec(
    spec_path: str | Path,
    out: str | Path,
    *,
    workers: int = 2,
    progress: bool = True,
    publish: bool = False,
    allow_incomplete: bool = False,
    ray: str | None = None,
    check_setup: Callable[[Spec], None] | None = None,
) -> RunSummary:
    """Run ``spec_path`` into ``out`` with ``workers`` templates at a time; with ``publish``,
    seal the release at the end (refused up front when its version is taken by another spec).

    The run holds ``out``'s lock throughout, so a second run on the same folder is refused
    (:class:`~counterfactory.manifests.runlock.RunFolderError`) before it pays for anything; the
    ledger is opened once before anything else, so a damaged one is refused with one message
    (:class:`~counterfactory.manifests.ledger.LedgerError`). A spec whose cells are all settled
    in the ledger finishes here (:func:`run_settled`); otherwise ``check_setup(spec)`` (the
    command line's check of the editor and gate models, which a settled re-run does not need)
    and the Prefect flow (:func:`counterfactory.flows.run.run_locked`). A run on Ray (``ray``
    or the spec's ``run.ray``) goes to :func:`counterfactory.flows.run.run_spec`, which checks
    the cluster before the folder is touched.
    """
    spec = load_spec(spec_path)
    if ray is not None or spec.run.ray is not None:
        from counterfactory.flows.run import run_spec as run_on_ray

        return run_on_ray(
            spec_path,
            out,
            workers=workers,
            progress=progress,
            publish=publish,
            allow_incomplete=allow_incomplete,
            ray=ray,
            check_setup=check_setup,
        )
    with RunFolderLock(out):
        spec = load_spec(spec_path)
        if publish:
            conflict = existing_release_conflict(
                Path(out) / "releases", spec.release.name, spec.release.version, spec.as_written()[1]
            )
            if conflict:
                raise ReleaseExistsError(conflict)
        ws = steps.open_workspace(spec, out)
        try:
            missing = steps.count_missing_outputs(ws)
            settled = None if missing else run_settled(spec, ws, publish=publish, allow_incomplete=allow_incomplete)
        finally:
            ws.ledger.close()
        if settled is not None:
            remember_spec(ws.out, spec_path)
            return settled
        from counterfactory.flows.run import run_locked

        return run_locked(
            spec_path,
            out,
            workers=workers,
            progress=progress,
            publish=publish,
            allow_incomplete=allow_incomplete,
            check_setup=check_setup,
        )
