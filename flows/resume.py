"""Start a run: settle a finished spec from the ledger alone, or hand the work to Prefect.

A re-run of a spec whose every cell is settled (each planned attempt finished, judged with
today's alignment and gate settings, its images in the store, and no cell left with a seed to
try) is a resume with nothing to do. It must cost what loading the spec and the ledger costs,
so it is answered here without importing or starting Prefect (its API server and imports are
seconds of every run) and, with ``--publish``, without rebuilding an unchanged release
(:func:`~counterfactory.flows.engine.release.publish_release` compares the inputs' hash first). Any
other run goes to the Prefect flow in :mod:`counterfactory.flows.run`.

Plain functions, no Prefect import.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from counterfactory.flows.engine import execute, run_folder, sources
from counterfactory.flows.engine.outcomes import RunSummary
from counterfactory.flows.engine.release import check_release_version, publish_release
from counterfactory.flows.engine.run_folder import RunFolder
from counterfactory.flows.engine.spec import Spec, SpecError, load_spec
from counterfactory.generation.attempts import PlannedAttempt, plan_attempts
from counterfactory.generation.editors import Editor, make_editor
from counterfactory.generation.sampling import Cell
from counterfactory.generation.sources import PreparedSource
from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.lifecycle import CellOutcome, Settled, TemplateOutcome, attempt_finished, fill_cells
from counterfactory.manifests.vocabulary import FAILED, OK


class _WorkToDo(CounterfactoryError):
    """Raised inside :func:`settled_outcomes`' policy at the first attempt a run must still make."""


def settled_outcomes(
    spec: Spec, ws: run_folder.Workspace, prepared: Sequence[PreparedSource], cells: Sequence[Cell], editor: Editor
) -> list[TemplateOutcome] | None:
    """Every template's outcome as :func:`~counterfactory.flows.engine.template.process_template` would
    return it with zero editor calls, or None when a run has work to do (the resuming policy
    over :func:`~counterfactory.manifests.lifecycle.fill_cells`).

    Work to do: a planned attempt that is not in the ledger or not finished (``ok``/``refused``),
    an output or aligned image missing from the store, a candidate judged with other settings
    (or not judged), or a cell that is not filled while it has attempts left. Attempts are
    planned exactly as the run plans them, every template's at once, and read a round at a time
    in a few queries.
    """
    lineage = editor.lineage()
    jkey = execute.judge_key(spec)
    by_id = {p.id: p for p in prepared}

    def plan(open_cells: Sequence[Cell], attempt_no: int) -> list[PlannedAttempt]:
        by_template: dict[str, list[Cell]] = {}
        for cell in open_cells:
            by_template.setdefault(cell.source_id, []).append(cell)
        return [
            planned
            for tid, cells in by_template.items()
            for planned in plan_attempts(spec, by_id[tid], cells, editor, lineage, attempt_no)
        ]

    def settle(plans: Sequence[PlannedAttempt]) -> dict[str, Settled]:
        ids = [planned.attempt_id for planned in plans]
        states = ws.ledger.settled_states(ids)  # attempts and candidates, the columns read here only
        settled = {}
        for aid in ids:
            state = states.get(aid)
            if state is None or not attempt_finished(state):
                raise _WorkToDo
            if state.status == FAILED:  # final: its backend said running it again cannot change it
                settled[aid] = Settled(FAILED, [state.reason or "editor_failed"])
                continue
            if state.status == OK and not ws.store.has(state.output_sha256):
                raise _WorkToDo
            if state.judge_key is None or state.judge_key != jkey:
                raise _WorkToDo
            if state.image_sha256 and not ws.store.has(state.image_sha256):
                raise _WorkToDo
            settled[aid] = Settled(state.verdict, state.reasons)
        return settled

    try:
        outcomes = fill_cells(cells, spec.editor.max_attempts, plan, settle)
    except _WorkToDo:
        return None
    by_template: dict[str, list[CellOutcome]] = {}
    for outcome in outcomes.values():
        by_template.setdefault(outcome.cell.source_id, []).append(outcome)
    return [TemplateOutcome(template_id=tid, cells=cells, editor_calls=0) for tid, cells in sorted(by_template.items())]


def run_settled(
    spec: Spec, ws: run_folder.Workspace, *, publish: bool = False, allow_incomplete: bool = False
) -> RunSummary | None:
    """Finish a run whose every cell is settled in the ledger, without Prefect (None: there is
    work to do, and nothing was written but the sources' rows, as any run writes them).

    The run is recorded in the ledger's ``runs`` table with zero editor calls; with
    ``publish`` the release is sealed, or left as it is when it was built from the same inputs.
    """
    if not ws.ledger.has_attempts():
        return None  # a first run: there is nothing to settle, so nothing is read twice
    prepared, failed = sources.prepare_sources(spec, ws.ledger, ws.store)
    grid = sources.plan_grid(spec, prepared)
    outcomes: list[TemplateOutcome] = []
    for view, cells in sources.editor_runs(spec, grid):
        # the lineage alone decides attempt ids: the backend is not prepared (no model is loaded)
        editor = make_editor(view.editor.backend, view.editor.options())
        found = settled_outcomes(view, ws, prepared, cells, editor)
        if found is None:
            return None
        outcomes += found
    run_id = os.urandom(8).hex()
    ws.ledger.start_run(run_id, spec_name=spec.name, spec_hash=spec.spec_hash())
    sealed = (
        publish_release(spec, ws, prepared, failed, outcomes, grid, allow_incomplete=allow_incomplete)
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
    spec: Spec | str | Path,
    out: str | Path,
    *,
    workers: int = 2,
    progress: bool = True,
    publish: bool = False,
    allow_incomplete: bool = False,
    ray: str | None = None,
    check_setup: Callable[[Spec, bool], None] | None = None,
    locked: bool = False,
) -> RunSummary:
    """Run ``spec`` into ``out`` with ``workers`` templates at a time; with ``publish``,
    seal the release at the end (refused up front when its version is taken by another spec).
    The one entry point of a run: the command line, the scheduler and Ray all come here.

    ``spec`` is the parsed spec (the command line and the scheduler parse it once and hand it
    here), or its file, parsed here once. The release-version conflict
    (:func:`check_release_version`) and the Ray decision are made here once, before anything
    is paid for. ``check_setup(spec, on_ray)`` is the command line's check of the editor and
    gate models: a first run (no ledger in ``out`` yet) is checked before ``out`` is even
    created; a re-run only once the ledger says there is work (a settled re-run loads no
    model). The run holds ``out``'s lock throughout (``locked``: the caller holds it, as the
    scheduler does around its run and publish), so a second run on the same folder is refused
    (:class:`~counterfactory.manifests.runlock.RunFolderError`); the ledger is opened before
    anything else, so a damaged one is refused with one message
    (:class:`~counterfactory.manifests.ledger.LedgerError`). A spec whose cells are all settled
    in the ledger finishes here (:func:`run_settled`) without importing Prefect; otherwise the
    Prefect flow (:func:`counterfactory.flows.run.run_locked`). On Ray (``ray`` or the spec's
    ``run.ray``) the cluster is checked before the folder is touched
    (:func:`~counterfactory.flows.ray.check_ray_target`), and the flow always runs.
    """
    if not isinstance(spec, Spec):
        spec = load_spec(spec)
    spec_path = spec.source_path
    folder = RunFolder(out)
    spec.bind_run_folder(out)
    if publish:
        check_release_version(spec, folder.releases)
    # the Ray decision, made once: the model checks skip the editor on Ray (it loads on a GPU
    # node of the cluster, which checks it there before any work)
    wants_ray = ray is not None or spec.run.ray is not None
    deferred = None
    if check_setup is not None:
        if folder.has_own_ledger(spec):
            deferred = functools.partial(check_setup, on_ray=wants_ray)
        else:
            check_setup(spec, on_ray=wants_ray)
    on_ray = address = None
    if wants_ray:
        if spec.editors is not None:
            raise SpecError(
                f"{spec_path}: field `editors`: comparing editors runs on this machine only for now; "
                "remove `run.ray` (and --ray), or run each editor's spec on Ray separately"
            )
        from prefect.settings import PREFECT_API_URL

        from counterfactory.flows.ray import check_ray_target, ray_target

        on_ray = ray_target(spec, ray)
        # before the folder lock or the ledger: a cluster that cannot run this costs nothing
        address = check_ray_target(on_ray, spec, prefect_api_url=PREFECT_API_URL.value() or None) if on_ray else None
    with contextlib.nullcontext() if locked else folder.lock():
        ws = folder.open(spec)
        try:
            missing = run_folder.count_missing_outputs(ws)
            settled = (
                None
                if missing or on_ray is not None
                else run_settled(spec, ws, publish=publish, allow_incomplete=allow_incomplete)
            )
        finally:
            ws.ledger.close()
        if settled is not None:
            folder.record_spec(spec_path)
            return settled
        from counterfactory.flows.run import run_locked

        return run_locked(
            spec,
            spec_path,
            out,
            workers=workers,
            progress=progress,
            publish=publish,
            allow_incomplete=allow_incomplete,
            on_ray=on_ray,
            address=address,
            missing=missing,
            check_setup=deferred,
        )
