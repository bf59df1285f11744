"""A template's attempts: the noise floor, then every round of its cells' lifecycle.

:func:`process_template` is the running policy over
:func:`~counterfactory.manifests.lifecycle.fill_cells`: each round's attempts are planned
(:func:`~counterfactory.generation.attempts.plan_attempts`, pure), edited and judged by the
executor it is given (:mod:`.executors`), and the open cells get the next seed. The template's
noise-floor request (:func:`noise_floor`) comes first. Plain functions, no Prefect.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from counterfactory.flows.engine.execute import (
    NOISE_FLOOR_PROMPT,
    judge_key,
    pending_ids,
    uses_cohort_floor,
    uses_noise_floor,
)
from counterfactory.flows.engine.executors import LOCAL, Executor
from counterfactory.flows.engine.judge import TemplateJudge
from counterfactory.flows.engine.run_folder import Workspace
from counterfactory.flows.engine.spec import Spec
from counterfactory.generation.attempts import (
    PlannedAttempt,
    attempt_id,
    editor_inputs,
    plan_attempts,
    region_sha256,
    source_request,
)
from counterfactory.generation.editors import Editor
from counterfactory.generation.prompts import RenderedPrompt, load_template
from counterfactory.generation.sampling import Cell, for_editor
from counterfactory.generation.sources import PreparedSource, SourceError
from counterfactory.manifests.lifecycle import (
    CellOutcome,
    Settled,
    TemplateOutcome,
    fill_cells,
)
from counterfactory.manifests.vocabulary import FAILED, OK
from counterfactory.validation.gate_stack import GateStack
from counterfactory.validation.judging import (
    FLOOR_VERDICT,
)

#: seconds to wait before each re-fetch of a paid remote request that did not come back
#: (its editor already retried each HTTP call); after the last, the next run fetches it
RESUME_WAITS_S = (1.0, 4.0, 16.0)


def plan_noise_floor(spec: Spec, prepared: PreparedSource, editor: Editor, lineage: dict[str, Any]) -> PlannedAttempt:
    """The template's noise-floor request: the photo, the prompt "return this photo unchanged",
    no condition, the spec's first seed. Its id hashes what decides its output, like a cell's."""
    text, sha = load_template(NOISE_FLOOR_PROMPT)
    prompt = RenderedPrompt(template=NOISE_FLOOR_PROMPT, template_sha256=sha, text=text.strip())
    region = prepared.region
    # one floor per template and editor: a spec comparing editors labels each editor's
    cell = for_editor(
        [Cell(source_id=prepared.id, condition={}, cell_id=f"{prepared.id}|{FLOOR_VERDICT}", gender_match=None)],
        spec.editor_name,
    )[0]
    aid = attempt_id(
        source_sha256=prepared.source.sha256,
        cell=cell,
        kind=spec.design.kind,
        lineage=lineage,
        prompt=prompt,
        negative_prompt=None,
        seed=spec.editor.seed,
        region_sha256=region_sha256(region),
        inputs=editor_inputs(editor, spec.design.kind),
    )
    request = functools.partial(
        source_request,
        prepared.source,
        attempt_id=aid,
        prompt=prompt.text,
        seed=spec.editor.seed,
        kind=spec.design.kind,
        mask=region,
        condition={},
    )
    return PlannedAttempt(cell, 1, aid, request, prompt)


def floor_metrics(gates: Mapping[str, Any], attempt: str, image_sha256: str | None = None) -> dict[str, Any] | None:
    """The measures a floor output gives the locality gate (``{metric: value, "attempt_id"}``,
    and ``image_sha256``, its registered image in the store, when given), from its candidate's
    gate records; None when locality could not measure it."""
    from counterfactory.validation.gates.locality import FLOOR_RELATIVE

    metrics = ((gates or {}).get("locality") or {}).get("metrics") or {}
    floor = {k: metrics[k] for k in FLOOR_RELATIVE if isinstance(metrics.get(k), (int, float))}
    if not floor:
        return None
    return {**floor, "attempt_id": attempt, **({"image_sha256": image_sha256} if image_sha256 else {})}


def noise_floor(
    spec: Spec,
    ws: Workspace,
    prepared: PreparedSource,
    editor: Editor,
    lineage: dict[str, Any],
    stack: GateStack | None,
    jkey: str,
    *,
    executor: Executor | None = None,
) -> tuple[dict[str, Any] | None, int]:
    """``(floor, editor calls)``: run (once, ever: it is an attempt like any other, committed
    to the ledger and never paid again) and measure the template's noise-floor request.

    The output is measured like a candidate (aligned, every gate) and recorded as a candidate
    with verdict ``floor``; what its locality gate measured is the floor. None when the
    request failed, is still pending, or could not be registered: the template's cells are
    then judged as measured (the ``floor_*`` fields are absent from their records).
    """
    executor = executor or LOCAL
    plan = plan_noise_floor(spec, prepared, editor, lineage)
    calls = executor.edit(ws, editor, [plan], lineage)
    attempt = ws.ledger.attempt(plan.attempt_id)
    if attempt is None or attempt.status != OK or not ws.store.has(attempt.output_sha256):
        return None, calls
    # judged where the cells are (this process, or a worker on Ray), recorded as a floor
    executor.judge(spec, ws, prepared, [plan], stack, jkey, None, True)
    known = ws.ledger.candidate(plan.attempt_id)
    if known is None or known.verdict != FLOOR_VERDICT:
        return None, calls
    return floor_metrics(known.gates, plan.attempt_id, known.image_sha256), calls


def process_template(
    spec: Spec,
    ws: Workspace,
    prepared: PreparedSource,
    cells: Sequence[Cell],
    editor: Editor,
    stack: GateStack | None,
    *,
    executor: Executor = LOCAL,
) -> TemplateOutcome:
    """Fill every cell of one template: plan, edit, judge, and retry the open cells with the next
    seed (the running policy over :func:`~counterfactory.manifests.lifecycle.fill_cells`).

    Finished attempts (``ok`` or ``refused`` in the ledger) are never run again; their stored
    output is re-judged only when the alignment or gate settings changed. ``executor`` decides
    where edits and judgements run (:class:`~counterfactory.flows.engine.executors.Executor`:
    this process, or a Ray cluster, where ``stack`` may be None); this function calls the same
    two methods whichever it is. An output the executor hands back as it is committed is judged
    at once, from memory; every other attempt of the round by the executor's ``judge``.
    """
    # the run keeps its sources released; this template holds its photo and region while it runs
    try:
        prepared = prepared.held()
    except SourceError as exc:
        # the photo changed (or went) since the run checked it: its cells fail with the
        # reason, nothing is edited, and the other templates go on
        reasons = [exc.reason]
        failed = [CellOutcome(cell=c, verdict=FAILED, reasons=list(reasons)) for c in cells]
        return TemplateOutcome(template_id=prepared.id, cells=failed, editor_calls=0)
    lineage = editor.lineage()
    jkey = judge_key(spec)
    calls = 0
    floor = None
    # a backend that cannot make the floor (the import backend: its outputs exist already)
    # answers the request failed; the template's cells are then judged as measured
    if uses_noise_floor(spec):
        floor, calls = noise_floor(spec, ws, prepared, editor, lineage, stack, jkey, executor=executor)
    floor_calls = calls
    # without a floor output the template's outputs are judged together, each against the
    # others (the cohort floor), after the round's edits: not one at a time as they return
    one_at_a_time = not uses_cohort_floor(spec, floor)
    # made at the first output handed back (an executor that keeps its outputs hands none)
    held_judge = functools.cache(lambda: TemplateJudge(spec, ws, prepared, stack, jkey, floor=floor))

    def plan(open_cells: Sequence[Cell], attempt_no: int) -> list[PlannedAttempt]:
        return plan_attempts(spec, prepared, open_cells, editor, lineage, attempt_no)

    def settle(plans: Sequence[PlannedAttempt]) -> dict[str, Settled]:
        nonlocal calls
        judged: dict[str, tuple[str, list[str]]] = {}
        by_id = {planned.attempt_id: planned for planned in plans}

        def judge_now(aid: str, image: np.ndarray) -> None:
            judged[aid] = held_judge().attempt(by_id[aid].cell, aid, output=image, fresh=True)

        def edit_round(chosen: Sequence[PlannedAttempt]) -> int:
            return executor.edit(ws, editor, chosen, lineage, on_output=judge_now if one_at_a_time else None)

        calls += edit_round(plans)
        # a paid remote request that failed to come back (status outage, download error) is
        # fetched again, never replaced by the next seed: that would pay twice
        for wait_s in RESUME_WAITS_S:
            waiting = pending_ids(ws, [aid for aid in by_id if aid not in judged])
            if not waiting:
                break
            time.sleep(wait_s)
            calls += edit_round([planned for planned in plans if planned.attempt_id in waiting])
        # what was finished before this run, did not come back, or was not handed back (the
        # cohort floor, an executor that keeps its outputs) is judged by the executor, from the
        # ledger and the store
        rest = [planned for planned in plans if planned.attempt_id not in judged]
        rest_ids = [planned.attempt_id for planned in rest]
        verdicts = executor.judge(spec, ws, prepared, rest, stack, jkey, floor) if rest else []
        for planned, verdict in zip(rest, verdicts, strict=True):
            judged[planned.attempt_id] = verdict
        # still pending after the waits: the cell stays failed in this run and the next run
        # fetches the journalled request; no new seed is bought for it
        still_pending = pending_ids(ws, rest_ids)
        return {
            aid: Settled(verdict, reasons, pending=aid in still_pending) for aid, (verdict, reasons) in judged.items()
        }

    outcomes = fill_cells(cells, spec.editor.max_attempts, plan, settle)
    return TemplateOutcome(
        template_id=prepared.id, cells=list(outcomes.values()), editor_calls=calls, floor_calls=floor_calls
    )
