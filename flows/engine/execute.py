"""The work an executor runs: a batch of attempts edited and committed, a batch judged.

:func:`run_edits` claims each unfinished attempt in the ledger one backend batch at a time,
edits it and commits its output at once (a kill loses only the batch in flight);
:func:`judge_attempts` aligns, measures and judges a batch, recording each candidate.
:func:`judge_key` hashes what decides a verdict (bump :data:`JUDGE_VERSION` for a new meaning).
Also the editor and the gate stack a run builds before any work. Plain functions, no Prefect.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from counterfactory.flows.engine.judge import TemplateJudge
from counterfactory.flows.engine.run_folder import Workspace
from counterfactory.flows.engine.sources import edit_region_name
from counterfactory.flows.engine.spec import Spec
from counterfactory.generation.attempts import (
    PlannedAttempt,
)
from counterfactory.generation.editors import Editor, EditRequest, EditResult, make_editor
from counterfactory.generation.editors.base import EditJournal
from counterfactory.generation.sources import PreparedSource
from counterfactory.manifests.errors import SetupError
from counterfactory.manifests.lifecycle import (
    attempt_finished,
    attempt_pending,
)
from counterfactory.manifests.vocabulary import FAILED, OK
from counterfactory.validation.gate_stack import GateStack
from counterfactory.validation.gates.attribute import AttributeGate, check_label_map
from counterfactory.validation.judging import (
    no_source_mode,
)

#: bump when the meaning of a judgement changes, so stored verdicts are recomputed
JUDGE_VERSION = 10  # 10: glasses added or removed are face_accessory_changed and brows under a frame are not judged; an unregistrable output carries the face, identity and expression reasons beside the alignment's; 9: a limb design's same-cue control whose region changed less than min_diff_inside_edit goes to review, no longer rejected (locality control_conditions), and is not judged by skin_inpaint_mismatch (a treatment's rule); 8: the largest connected area of per-pixel change away from the face is judged (max_largest_change_share); 7: the hair around the head is judged (max_hair_delta_e); 6: a shift above a floor output is measured against it, and per third by lightness


#: the prompt template of the noise-floor request (``assets/prompts/``)
NOISE_FLOOR_PROMPT = "noise_floor_v1"


def uses_noise_floor(spec: Spec) -> bool:
    """Whether the spec's cells are judged relative to a noise-floor request (face designs
    with ``gates.noise_floor``)."""
    return spec.design.kind == "face" and spec.gates.noise_floor and no_source_mode(spec) is None


def uses_cohort_floor(spec: Spec, floor: Mapping[str, Any] | None) -> bool:
    """Whether a template's cells are judged together against each other (the cohort floor,
    :meth:`~counterfactory.flows.engine.judge.TemplateJudge.cohort`): a face design with a
    source photo, ``gates.cohort_floor`` on, and no floor request's output for the template
    (an imported set without a ``floor`` column, ``gates.noise_floor: false``, a floor request
    that failed)."""
    return floor is None and spec.design.kind == "face" and spec.gates.cohort_floor and no_source_mode(spec) is None


def judge_key(spec: Spec) -> str:
    """Hash of what decides a verdict for a stored output: alignment, the active kind's gates,
    the face-mask mode the gates draw, and the limb-mask growth (limb cells only)."""
    kind = spec.design.kind
    blob = json.dumps(
        {
            "kind": kind,
            "align": spec.align.model_dump(mode="json"),
            "gates": spec.gates.for_kind(kind).model_dump(mode="json"),
            "face_mask": spec.gates.face_mask,
            "edit_region": edit_region_name(spec) if kind == "face" else None,
            "masks": spec.masks.model_dump(mode="json") if kind == "limb" else None,
            "noise_floor": NOISE_FLOOR_PROMPT if uses_noise_floor(spec) else None,
            "cohort_floor": spec.gates.cohort_floor,
            "version": JUDGE_VERSION,
            # a pinned calibration (gates.calibration): its bytes decide the thresholds the spec
            # leaves out; absent otherwise, so every other spec's key is as it was
            **({"calibration": sha} if (sha := spec.calibration_sha256()) is not None else {}),
            # judged without a source (and whether a pass of the rest is accepted); absent
            # otherwise, so every other spec's key is as it was
            **({"no_source": alone} if (alone := no_source_mode(spec)) is not None else {}),
            # the raw_* diagnostics recorded (gates.diagnostics); absent otherwise, so every
            # other spec's key is as it was
            **({"diagnostics": True} if spec.gates.diagnostics else {}),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def run_edits(
    ws: Workspace,
    editor: Editor,
    plans: Sequence[PlannedAttempt],
    lineage: dict[str, Any],
    *,
    on_output: Callable[[str, np.ndarray], None] | None = None,
) -> int:
    """Run the planned attempts the ledger has not finished and store what they returned.

    ``on_output(attempt_id, image)`` is called with each ``ok`` output (``(h, w, 3)`` uint8 RGB)
    right after it is committed, before the next batch is requested, so a caller can judge it
    from memory. Returns the number of editor calls made (0 when every attempt was already
    finished).
    """
    # Claimed one backend batch at a time, just before it is edited: a worker sharing the
    # ledger takes the attempts this one has not reached yet instead of waiting for them. Each
    # result is committed as soon as its batch returns: a kill loses only the batch in flight,
    # and memory holds one batch of outputs, not a template's.
    size = editor_batch_size(editor)
    journal = ws.ledger.journal(editor.name)
    calls = 0
    batch: list[EditRequest] = []
    for plan in plans:
        if _claim(ws, editor, plan, lineage):
            batch.append(plan.request)
        if len(batch) == size:
            calls += _edit_batch(ws, editor, batch, journal, on_output)
            batch = []
    if batch:
        calls += _edit_batch(ws, editor, batch, journal, on_output)
    return calls


def _claim(ws: Workspace, editor: Editor, plan: PlannedAttempt, lineage: dict[str, Any]) -> bool:
    """Whether this run is to edit ``plan`` now: unfinished, and claimed in the ledger."""
    done = ws.ledger.attempt(plan.attempt_id)
    if done is not None and done.status == OK and not ws.store.has(done.output_sha256):
        # the store lost this output (deleted blob or store): rebuild only this attempt
        ws.ledger.reopen_attempt(plan.attempt_id, reason="store_blob_missing")
        done = None
    if done is not None and attempt_finished(done):
        return False
    # False when another live run on the same database is editing it right now, or finished it
    return ws.ledger.start_attempt(
        plan.attempt_id,
        cell_id=plan.cell.cell_id,
        attempt_no=plan.attempt_no,
        seed=plan.request.seed,
        backend=editor.name,
        lineage=lineage,
        prompt=plan.prompt.text,
        run_id=ws.run_id,
    )


def _edit_batch(
    ws: Workspace,
    editor: Editor,
    batch: list[EditRequest],
    journal,
    on_output: Callable[[str, np.ndarray], None] | None = None,
) -> int:
    for result in _edit_safely(editor, batch, journal):
        if _store_result(ws, result) and on_output is not None:
            on_output(result.attempt_id, result.image)
    return len(batch)


def editor_batch_size(editor: Editor) -> int:
    """How many requests to hand the backend at once: its ``batch_size``, else what its backend
    declared at registration (``EditorCapabilities.batch_size``, ``1`` by default)."""
    from counterfactory.generation.editors.registry import EDITORS

    return EDITORS.batch_size_of(editor)


def pending_ids(ws: Workspace, attempt_ids: Sequence[str]) -> set[str]:
    """The ids among ``attempt_ids`` whose outcome is still coming
    (:func:`~counterfactory.manifests.lifecycle.attempt_pending`; one read for all of them)."""
    return {aid for aid, attempt in ws.ledger.attempts_by_id(attempt_ids).items() if attempt_pending(attempt)}


def judge_attempts(
    spec: Spec,
    ws: Workspace,
    prepared: PreparedSource,
    plans: Sequence[PlannedAttempt],
    stack: GateStack,
    jkey: str,
    floor: Mapping[str, Any] | None = None,
    as_floor: bool = False,
) -> list[tuple[str, list[str]]]:
    """``(verdict, reasons)`` per planned attempt, recording each new candidate in the ledger.

    A candidate already judged under ``jkey`` is not judged again. ``floor``: the template's
    noise floor (:func:`noise_floor`), or None. ``as_floor``: these are noise-floor requests,
    recorded with the verdict :data:`FLOOR_VERDICT`.
    """
    judge = TemplateJudge(spec, ws, prepared, stack, jkey, floor=floor, as_floor=as_floor)
    if not as_floor and uses_cohort_floor(spec, floor):
        return judge.cohort([(plan.cell, plan.attempt_id) for plan in plans])
    # the batch's attempts and candidates read in two queries, not two per attempt
    ids = [plan.attempt_id for plan in plans]
    attempts, candidates = ws.ledger.attempts_by_id(ids), ws.ledger.candidates_by_id(ids)
    return [
        judge.attempt(plan.cell, aid, known=(attempts.get(aid), candidates.get(aid))) for plan, aid in zip(plans, ids)
    ]


def _edit_safely(editor: Editor, requests: list[EditRequest], journal) -> list[EditResult]:
    """Run a batch; a per-item exception a backend let through becomes that item's failure."""
    try:
        results = editor.edit_many(requests, journal)
    except SetupError:
        # a key rejected mid-run, an unknown endpoint or model: no item can succeed, so the
        # whole run stops here with the backend's one message, before anything is sealed
        raise
    except Exception as exc:  # noqa: BLE001 - a broken batch is recorded per item, the run goes on
        return [EditResult(r.attempt_id, FAILED, reason=f"editor_error: {type(exc).__name__}: {exc}") for r in requests]
    by_id = {r.attempt_id: r for r in results}
    return [
        by_id.get(r.attempt_id) or EditResult(r.attempt_id, FAILED, reason="editor_error: no result returned")
        for r in requests
    ]


def _store_result(ws: Workspace, result: EditResult) -> bool:
    """Commit one result to the ledger (its image to the store); True when it is a usable output."""
    meta = dict(result.metadata)
    if result.status == OK:
        image = result.image
        if image is None or image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            shape = None if image is None else (image.shape, str(image.dtype))
            ws.ledger.finish_attempt(
                result.attempt_id,
                status=FAILED,
                cost_usd=result.cost_usd,
                meta=meta,
                reason=f"editor_bad_output: expected (h, w, 3) uint8 RGB, got {shape}",
            )
            return False
        sha = ws.store.put(image)
        ws.ledger.finish_attempt(result.attempt_id, status=OK, output_sha256=sha, cost_usd=result.cost_usd, meta=meta)
        return True
    ws.ledger.finish_attempt(
        result.attempt_id, status=result.status, reason=result.reason, cost_usd=result.cost_usd, meta=meta
    )
    return False


def build_editor(spec: Spec) -> Editor:
    """The spec's backend, prepared (heavy parts loaded, setup problems raised) before any work."""
    editor = make_editor(spec.editor.backend, spec.editor.options())
    editor.prepare()
    return editor


def build_gate_stack(spec: Spec, *, journal: EditJournal | None = None) -> GateStack:
    """The gates for the design's kind; an attribute gate's label map must cover the design's
    conditions (``ValueError`` naming the missing labels otherwise), checked before any work.

    ``journal`` (the ledger's, in a run) records paid gate calls (the ``vlm`` attribute
    backend) so that a resumed run fetches their answers instead of paying again.
    """
    attribute = spec.gates.for_kind(spec.design.kind).attribute
    if attribute is not None:
        check_label_map(attribute, spec.design.axes)
    stack = GateStack.from_config(spec.gates, spec.design.kind, region=edit_region_name(spec))
    if journal is not None:
        for gate in stack.gates:
            if isinstance(gate, AttributeGate):
                gate.journal = journal
    return stack
