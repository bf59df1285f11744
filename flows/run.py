"""The Prefect flow: spec, sources, grid, then one task per template (edit, align, measure,
judge), then the release. Each task wraps a plain function of the engine (:mod:`counterfactory.flows.engine`).

One task handles a template with all its cells, not one image: Prefect's database struggles
with tens of thousands of task runs, and the ledger already holds the per-image state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NONE  # noqa: E402
from prefect.futures import as_completed  # noqa: E402
from prefect.task_runners import ThreadPoolTaskRunner  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from counterfactory.flows.artifacts import ProgressArtifact, publish_artifacts  # noqa: E402
from counterfactory.flows.engine import execute, run_folder, sources, template  # noqa: E402
from counterfactory.flows.engine.outcomes import (  # noqa: E402
    PublishError,
    RunSummary,  # noqa: E402
    outcome_order,
)
from counterfactory.flows.engine.release import publish_release  # noqa: E402
from counterfactory.flows.engine.spec import Spec  # noqa: E402
from counterfactory.flows.keys import template_key  # noqa: E402
from counterfactory.flows.limits import apply_limits, limited_editor, limited_gates, spec_limits  # noqa: E402
from counterfactory.flows.ray import RayTarget, ray_cluster, templates_on_ray  # noqa: E402
from counterfactory.flows.retries import RETRIES, RETRY_DELAYS_S, retry_transient  # noqa: E402
from counterfactory.flows.server import prefect_api  # noqa: E402
from counterfactory.flows.stopping import reinstall_stop_handlers  # noqa: E402
from counterfactory.manifests.errors import CounterfactoryError  # noqa: E402
from counterfactory.manifests.lifecycle import TemplateOutcome  # noqa: E402
from counterfactory.manifests.release import ReleaseExistsError  # noqa: E402

# Prefect's caching stays off (cache_policy=NONE: it would hash photos as arrays, and the ledger,
# not a cached task result, decides what is done); template tasks are named by their content key
# (flows/keys.py). Retries are for transient failures only (flows/retries.py): a retried task
# pays for nothing twice, its finished attempts are in the ledger.
_TRANSIENT_RETRIES = {"retries": RETRIES, "retry_delay_seconds": RETRY_DELAYS_S, "retry_condition_fn": retry_transient}


@task(name="prepare-sources", cache_policy=NONE, **_TRANSIENT_RETRIES)
def prepare_sources_task(spec, ws):
    return sources.prepare_sources(spec, ws.ledger, ws.store)


@task(name="grid", cache_policy=NONE)
def grid_task(spec, prepared):
    return sources.plan_grid(spec, prepared)


@task(name="template", cache_policy=NONE, task_run_name="template-{prepared.id}-{key:.16}", **_TRANSIENT_RETRIES)
def template_task(spec, ws, prepared, cells, editor, stack, key):
    return template.process_template(spec, ws, prepared, cells, editor, stack)


@dataclasses.dataclass(frozen=True)
class _Refused:
    """The publishing policy refused the release (nothing to publish, an incomplete grid, a
    version taken): the release task's value, not its exception, and :func:`run_locked` raises
    it once the flow has ended. Raised inside the flow, Prefect would log it as a failed task
    and a failed flow run, with its traceback, before the command line's one ``error:`` line."""

    error: CounterfactoryError


@task(name="release", cache_policy=NONE, **_TRANSIENT_RETRIES)
def release_task(spec, ws, prepared, failed, outcomes, grid, allow_incomplete):
    try:
        return publish_release(spec, ws, prepared, failed, outcomes, grid, allow_incomplete=allow_incomplete)
    except (PublishError, ReleaseExistsError) as exc:
        return _Refused(exc)


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    run_id = flow_run.id
    return str(run_id).replace("-", "") if run_id else None


def _template_key(cell) -> str:
    return cell.source_id


#: runs every ``(editor view, [(prepared source, its cells), ...])`` pair's templates; yields
#: each template's outcome as it finishes
TemplatesRun = Callable[[Any, Sequence[tuple[Spec, Sequence[tuple[Any, Sequence[Any]]]]]], Iterator[TemplateOutcome]]


def templates_on_this_machine(spec: Spec, ws: Any) -> TemplatesRun:
    """Each template a task on the flow's thread pool, its edits and judgements in this process
    (:data:`~counterfactory.flows.engine.executors.LOCAL`). The editors (one per view) and the
    gate stack are built now, before any source is read: a setup problem stops the run here."""
    editors = {view.editor_name: limited_editor(execute.build_editor(view), view) for view in spec.editor_views()}
    stack = limited_gates(execute.build_gate_stack(spec, journal=ws.ledger.journal("fal_vlm")), spec)

    def run(ws, work):
        futures = [
            template_task.submit(
                view, ws, prepared, cells, editors[view.editor_name], stack,
                template_key(view, prepared, cells, editors[view.editor_name]),
            )
            for view, templates in work
            for prepared, cells in templates
        ]  # fmt: skip
        return (future.result() for future in as_completed(futures))

    return run


def where_templates_run(spec: Spec, ws: Any, on_ray: RayTarget | None, workers: int) -> TemplatesRun:
    """Where the flow's templates run: this machine, or the Ray cluster ``on_ray`` names
    (:func:`~counterfactory.flows.ray.templates_on_ray`). The one place a run chooses."""
    return templates_on_this_machine(spec, ws) if on_ray is None else templates_on_ray(on_ray, workers=workers)


@flow(name="counterfactory-run", log_prints=True)
def run_flow(
    spec: Any,
    spec_path: str,
    out: str,
    progress: bool = True,
    publish: bool = False,
    allow_incomplete: bool = False,
    on_ray: Any = None,
    workers: int = 2,
) -> RunSummary | _Refused:
    """Run one spec (parsed from ``spec_path``) end to end into ``out``; with ``publish``, seal
    its release too. Started by :func:`run_locked`, which has checked everything that could
    refuse the run; a release the publishing policy refuses ends the flow with :class:`_Refused`
    (the run's cells are in the ledger all the same).

    Templates run concurrently, where :func:`where_templates_run` says: each a task on the
    flow's thread pool, or, on Ray (``on_ray``, the checked target), with edits and judgements
    as tasks on the cluster (:mod:`counterfactory.flows.ray`); the flow is the same either way.
    """
    reinstall_stop_handlers()
    ws = run_folder.open_workspace(spec, out)
    ws.folder.record_spec(spec_path)
    # the ledger's run is Prefect's flow run: the same id in both views
    run_id = _flow_run_id() or os.urandom(8).hex()
    ws.ledger.start_run(run_id, spec_name=spec.name, spec_hash=spec.spec_hash())
    ws.run_id = run_id
    apply_limits(spec_limits(spec))
    templates_run = where_templates_run(spec, ws, on_ray, workers)

    prepared, failed = prepare_sources_task(spec, ws)
    grid = grid_task(spec, prepared)
    by_id = {p.id: p for p in prepared}
    # one pass of the grid per editor (one, unless the spec compares `editors`), in one ledger
    runs = sources.editor_runs(spec, grid)
    total = sum(len(cells) for _, cells in runs)
    work = []
    for view, view_cells in runs:
        cells_by_template: dict[str, list] = {}
        for cell in view_cells:
            cells_by_template.setdefault(_template_key(cell), []).append(cell)
        # largest templates first, so the last ones to finish are small and the workers end together
        largest_first = sorted(cells_by_template.items(), key=lambda item: -len(item[1]))
        work.append((view, [(by_id[tid], cells) for tid, cells in largest_first]))
    finished = templates_run(ws, work)
    outcomes = []
    shown = ProgressArtifact(spec.name, total)
    with tqdm(total=total, desc="cells", unit="cell", disable=not progress) as bar:
        for outcome in finished:
            outcomes.append(outcome)
            bar.update(len(outcome.cells))
            shown.advance(len(outcome.cells))
    outcomes.sort(key=outcome_order(spec))
    calls = sum(o.editor_calls for o in outcomes)
    ws.ledger.finish_run(run_id, editor_calls=calls)
    sealed = release_task(spec, ws, prepared, failed, outcomes, grid, allow_incomplete) if publish else None
    if isinstance(sealed, _Refused):
        ws.ledger.close()
        return sealed
    publish_artifacts(spec.name, outcomes, editor_calls=calls, release_path=sealed.path if sealed else None)

    counts: dict[str, int] = {}
    for o in outcomes:
        for c in o.cells:
            counts[c.verdict] = counts.get(c.verdict, 0) + 1
    summary = RunSummary(
        release_path=sealed.path if sealed else None,
        release_created=bool(sealed and sealed.created),
        counts=counts,
        failed_sources=len(failed),
        templates=len(outcomes),
        complete_templates=sum(o.complete for o in outcomes),
        editor_calls=calls,
        floor_calls=sum(o.floor_calls for o in outcomes),
    )
    ws.ledger.close()
    return summary


def run_locked(
    spec: Spec,
    spec_path: str | Path,
    out: str | Path,
    *,
    workers: int = 2,
    progress: bool = True,
    publish: bool = False,
    allow_incomplete: bool = False,
    on_ray: RayTarget | None = None,
    address: str | None = None,
    missing: int = 0,
    check_setup: Callable[[Any], None] | None = None,
) -> RunSummary:
    """The Prefect flow for :func:`counterfactory.flows.resume.run_spec`, once it holds ``out``'s
    lock, has checked the release version and the Ray target (``on_ray``, ``address``) and found
    work to do: ``check_setup(spec)`` (the command line's model checks), then the flow, on
    threads (``workers`` templates at a time) or on prefect-ray's runner. Prefect's API is served
    from this process (:func:`~counterfactory.flows.server.prefect_api`), so no server outlives
    the run. ``missing``: finished attempts whose output was gone from the store at the start."""
    from prefect.settings import PREFECT_API_URL

    user_api = PREFECT_API_URL.value() or None
    if check_setup is not None:
        check_setup(spec)
    with contextlib.ExitStack() as stack:
        if on_ray is None:
            runner = ThreadPoolTaskRunner(max_workers=max(1, workers))
        else:
            runner = stack.enter_context(
                ray_cluster(on_ray, address, spec, Path(out).resolve(), prefect_api_url=user_api)
            )
        stack.enter_context(prefect_api())
        summary = run_flow.with_options(task_runner=runner)(
            spec,
            str(spec_path),
            str(out),
            progress=progress,
            publish=publish,
            allow_incomplete=allow_incomplete,
            on_ray=on_ray,
            workers=workers,
        )
    if isinstance(summary, _Refused):
        raise summary.error
    return dataclasses.replace(summary, missing_outputs=missing)
