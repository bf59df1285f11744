"""The factory's steps as plain functions; Prefect wraps them in :mod:`counterfactory.flows.run`.

Read top to bottom, this is the run:

1. :func:`open_workspace` - the ledger, the image store and the releases folder of ``--out``;
2. :func:`prepare_sources` - load the photos, check each can serve the design (one face, a limb
   mask), record every source in the ledger;
3. :func:`plan_grid` - the stratified templates x conditions (cells);
4. :func:`process_template` - per template, the running policy over the cell lifecycle
   (:func:`~counterfactory.manifests.lifecycle.fill_cells`): the noise floor first, then each
   round's attempts (:func:`~counterfactory.generation.attempts.plan_attempts`, pure) edited
   (:func:`run_edits`: the attempts the ledger has not finished, outputs committed at once) and
   judged (:class:`~counterfactory.validation.judging.TemplateJudge`, the same path
   ``counterfactory measure`` uses), where an executor says (:class:`LocalExecutor`, or Ray's).

Every function runs and is tested without Prefect. Per-item problems end as values in the ledger
(``failed`` sources, ``refused``/``failed`` attempts, ``rejected`` candidates with reason
codes); only problems that make the whole run impossible raise.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from counterfactory.generation.attempts import (
    PlannedAttempt,
    attempt_id,
    editor_inputs,
    plan_attempts,
    region_sha256,
)
from counterfactory.generation.editors import Editor, EditRequest, EditResult, make_editor
from counterfactory.generation.editors.base import EditJournal
from counterfactory.generation.masks import apply_mask_options, mask_from_record
from counterfactory.generation.prompts import RenderedPrompt, face_region, load_template
from counterfactory.generation.sampling import Cell, Grid, expand_grid, for_editor
from counterfactory.generation.sources import FailedSource, PreparedSource, Source, SourceError, iter_sources
from counterfactory.manifests.errors import SetupError
from counterfactory.manifests.ledger import Ledger
from counterfactory.manifests.lifecycle import (
    CellOutcome,
    Settled,
    TemplateOutcome,
    attempt_finished,
    attempt_pending,
    fill_cells,
)
from counterfactory.manifests.spec import Spec
from counterfactory.manifests.store import ImageStore
from counterfactory.validation.faces import get_face_landmarker
from counterfactory.validation.gates.attribute import AttributeGate, check_label_map
from counterfactory.validation.judge import GateStack
from counterfactory.validation.judging import FLOOR_VERDICT, TemplateJudge, no_source_mode
from counterfactory.validation.skin import source_edit_region

#: bump when the meaning of a judgement changes, so stored verdicts are recomputed
JUDGE_VERSION = 5
#: seconds to wait before each re-fetch of a paid remote request that did not come back
#: (its editor already retried each HTTP call); after the last, the next run fetches it
RESUME_WAITS_S = (1.0, 4.0, 16.0)


@dataclass
class Workspace:
    """Where one study's state lives: ``out/ledger.sqlite``, ``out/store/``, ``out/releases/``."""

    out: Path
    ledger: Ledger
    store: ImageStore
    #: the run using it (its claims on attempts); None outside a run
    run_id: str | None = None

    @property
    def releases(self) -> Path:
        return self.out / "releases"


def open_workspace(spec: Spec, out: str | Path) -> Workspace:
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    url = spec.ledger_url or f"sqlite:///{out / 'ledger.sqlite'}"
    return Workspace(out=out, ledger=Ledger(url), store=ImageStore(store_dir(spec, out)))


def store_dir(spec: Spec, out: str | Path) -> Path:
    """The image store's folder: the spec's ``store_dir`` (shared by workers on one ledger),
    else ``<out>/store``."""
    return spec.store_dir if spec.store_dir is not None else Path(out).resolve() / "store"


def count_missing_outputs(ws: Workspace) -> int:
    """Finished attempts whose output image is gone from the store (each will run once more)."""
    return sum(
        1 for a in ws.ledger.attempts() if a.status == "ok" and a.output_sha256 and not ws.store.has(a.output_sha256)
    )


def _record_meta(source: Source | FailedSource) -> dict[str, Any]:
    record = source.record
    if record is None:
        return {}
    return record.model_dump(mode="json")


#: bump when a face source's check (face count, face mask, face size) is computed differently
SOURCE_CHECK_VERSION = 2


@functools.cache
def _landmarker_identity() -> str:
    """sha256 of the face landmarker model file: a new model may find other faces and masks."""
    from counterfactory.manifests.store import sha256_file
    from counterfactory.validation.faces import FACE_LANDMARKER

    return sha256_file(Path(FACE_LANDMARKER))


def source_check_key(spec: Spec, source: Source) -> str | None:
    """sha256 of what decides a face source's check: the photo's bytes, the face-mask mode and
    the landmarker model (None for limb designs, whose masks are read from files every run)."""
    if spec.design.kind != "face" or no_source_mode(spec) is not None:
        return None  # (a set without source photos checks no face in the scene's image)
    payload = {
        "version": SOURCE_CHECK_VERSION,
        "photo_sha256": source.sha256,
        "shape": list(source.pixels.shape),
        "face_mask": spec.gates.face_mask,
        "edit_region": edit_region(spec),
        "landmarker": _landmarker_identity(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def edit_region(spec: Spec) -> str:
    """The edit region a face design's gates measure around: ``gates.edit_region``, else the
    one its prompt names (:func:`~counterfactory.generation.prompts.face_region`)."""
    return spec.gates.edit_region or face_region(spec.prompts)


def prepare_sources(
    spec: Spec, ledger: Ledger, store: ImageStore | None = None
) -> tuple[list[PreparedSource], list[FailedSource]]:
    """Load every source, check it can serve the design, and record each in the ledger.

    Face designs need exactly one face in the source; limb designs need a limb mask.
    A source that cannot serve becomes a :class:`FailedSource` with its reason, and so does a
    second id for the same photo with the same edit region (``source_duplicate``).

    With a ``store``, a face source's check is kept (its face mask in the store, its face size
    and its reason in the ledger's ``sources`` row, under :func:`source_check_key`), and a later
    run with the same key reads it back instead of running the face landmarker again: a
    resumed run then costs what loading the photos and the ledger costs.
    """
    # one photo decoded at a time: each usable source is kept released (its pixels are decoded
    # again when its template runs), so the run's memory does not grow with the photos
    loaded = iter_sources(spec.sources.photos, spec.sources.metadata, max_pixels=spec.sources.max_pixels)
    kept = {row.source_id: (row.meta or {}).get("check") for row in ledger.sources()} if store is not None else {}
    landmarker = None
    checks: dict[str, dict[str, Any]] = {}
    usable: list[PreparedSource] = []
    failed: list[FailedSource] = []
    # (photo sha256, region sha256) -> first id: two ids with both equal would make the same
    # attempts (the same item ids) twice, so the later one fails as a duplicate
    first_by_content: dict[tuple[str, str], str] = {}
    for item in loaded:
        if isinstance(item, FailedSource):
            failed.append(item)
            continue
        key = source_check_key(spec, item) if store is not None else None
        reason, prepared = _kept_check(item, kept.get(item.record.id), key, store)
        if no_source_mode(spec) is not None:
            # an imported set without source photos: the scene's image stands for the scene in
            # the release and is never compared with, so it needs no face and no edit region
            reason, prepared = (
                None,
                PreparedSource(item, np.zeros(item.pixels.shape[:2], np.uint8), None, _record_meta(item)),
            )
        elif key is None or reason is _NOT_KEPT:
            landmarker = landmarker or get_face_landmarker()
            reason, prepared = _check_source(spec, item, landmarker)
            if key is not None:
                checks[item.record.id] = {
                    "key": key,
                    "reason": reason,
                    "region_sha256": store.put(prepared.region) if prepared is not None else None,
                    "face_size_px": prepared.face_size_px if prepared is not None else None,
                    **({k: prepared.meta[k] for k in _REGION_FLAGS if k in prepared.meta} if prepared else {}),
                }
        elif key is not None:
            checks[item.record.id] = kept[item.record.id]
        if reason is None:
            key = (item.sha256, hashlib.sha256(np.ascontiguousarray(prepared.region).tobytes()).hexdigest())
            if key in first_by_content:
                reason = (
                    f"source_duplicate: {item.path.name} is the same photo (sha256 {item.sha256[:12]}) with the "
                    f"same edit region as source {first_by_content[key]!r}; list each photo once in the metadata"
                )
            else:
                first_by_content[key] = item.record.id
        if reason is not None:
            failed.append(FailedSource(id=item.record.id, path=item.path, reason=reason, record=item.record))
        else:
            usable.append(prepared.released())
    for ok in usable:
        check = {"check": checks[ok.id]} if ok.id in checks else {}
        ledger.record_source(
            ok.id,
            str(ok.source.path),
            sha256=ok.source.sha256,
            status="ok",
            meta={**ok.meta, "normalisation": list(ok.source.notes), **check},
        )
    for bad in failed:
        check = {"check": checks[bad.id]} if bad.id in checks else {}
        ledger.record_source(
            bad.id,
            str(bad.path),
            sha256=None,
            status="failed",
            reason=bad.reason,
            meta={**_record_meta(bad), **check},
        )
    return usable, failed


#: :func:`_kept_check`'s answer when there is no usable kept check
_NOT_KEPT = "not kept"


def _kept_check(
    source: Source, kept: dict[str, Any] | None, key: str | None, store: ImageStore | None
) -> tuple[str | None, PreparedSource | None]:
    """A face source's check as an earlier run recorded it under the same ``key``, or
    ``(_NOT_KEPT, None)`` (no record, another key, or its mask gone from the store)."""
    if key is None or store is None or not isinstance(kept, dict) or kept.get("key") != key:
        return _NOT_KEPT, None
    if kept.get("reason") is not None:
        return kept["reason"], None
    sha = kept.get("region_sha256")
    if not sha or not store.has(sha):
        return _NOT_KEPT, None
    region = store.get(sha)
    if region.shape != source.pixels.shape[:2]:
        return _NOT_KEPT, None
    flags = {k: kept[k] for k in _REGION_FLAGS if k in kept}
    return None, PreparedSource(source, region, kept.get("face_size_px"), {**_record_meta(source), **flags})


#: what a face source's check records about its edit region (kept with the check)
_REGION_FLAGS = ("edit_region", "source_body_skin_visible", "source_body_skin_px")


def _check_source(spec: Spec, source: Source, landmarker) -> tuple[str | None, PreparedSource | None]:
    pixels = source.pixels
    faces = landmarker.detect(pixels)
    shape = pixels.shape[:2]
    meta = _record_meta(source)
    if spec.design.kind == "face":
        if len(faces) != 1:
            what = "no face" if not faces else f"{len(faces)} faces"
            return (
                f"source_face_count: found {what} in {source.path.name}; face edits need exactly one "
                "face (crop the photo to one person, or remove it from the metadata)",
                None,
            )
        # the region the prompt names; a source that shows body skin outside it is flagged
        # (recorded, not a failure: a face-only edit leaves face and hands apart by design)
        region, flags = source_edit_region(pixels, faces[0].landmarks, edit_region(spec), mode=spec.gates.face_mask)
        return None, PreparedSource(source, region, faces[0].size_px, {**meta, **flags})
    if source.record.limb_mask is None:
        return (
            f"source_no_limb_mask: {source.record.id} has no limb_mask in the metadata; limb designs "
            "need polygons, an RLE or a mask file for every source",
            None,
        )
    try:
        region = mask_from_record(source.record, spec.sources.photos, shape)
    except (OSError, ValueError) as exc:
        return f"source_bad_limb_mask: {exc}", None
    region = apply_mask_options(region, spec.masks)
    if not region.any():
        return f"source_empty_limb_mask: the limb mask of {source.record.id} is empty", None
    return None, PreparedSource(source, region, faces[0].size_px if faces else None, meta)


def plan_grid(spec: Spec, sources: Sequence[PreparedSource]) -> Grid:
    """The stratified templates x conditions of ``sources`` (:func:`~counterfactory.generation.sampling.expand_grid`),
    or, for a backend whose input fixes the cells (the ``import`` backend: one per row of its
    table), the grid its options plan (``plan_grid(records, design)``)."""
    records = [s.source.record for s in sources]
    given = getattr(spec.editor.options(), "plan_grid", None)
    return given(records, spec.design) if callable(given) else expand_grid(records, spec.design)


def editor_runs(spec: Spec, grid: Grid) -> list[tuple[Spec, list[Cell]]]:
    """``(editor view, its cells)`` per editor the grid runs with
    (:meth:`~counterfactory.manifests.spec.Spec.editor_views`): one pair, ``(spec, grid's
    cells)``, for a one-editor spec; with ``editors``, each editor's view and the grid's cells
    labelled with its name (:func:`~counterfactory.generation.sampling.for_editor`)."""
    return [(view, for_editor(grid.cells, view.editor_name)) for view in spec.editor_views()]


#: the prompt template of the noise-floor request (``assets/prompts/``)
NOISE_FLOOR_PROMPT = "noise_floor_v1"


def uses_noise_floor(spec: Spec) -> bool:
    """Whether the spec's cells are judged relative to a noise-floor request (face designs
    with ``gates.noise_floor``)."""
    return spec.design.kind == "face" and spec.gates.noise_floor and no_source_mode(spec) is None


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
    request = EditRequest(
        attempt_id=aid,
        image=prepared.source.pixels,
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
    executor: LocalExecutor | Any = None,
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
    if attempt is None or attempt.status != "ok" or not ws.store.has(attempt.output_sha256):
        return None, calls
    # judged where the cells are (this process, or a worker on Ray), recorded as a floor
    executor.judge(spec, ws, prepared, [plan], stack, jkey, None, True)
    known = ws.ledger.candidate(plan.attempt_id)
    if known is None or known.verdict != FLOOR_VERDICT:
        return None, calls
    return floor_metrics(known.gates, plan.attempt_id, known.image_sha256), calls


def uses_cohort_floor(spec: Spec, floor: Mapping[str, Any] | None) -> bool:
    """Whether a template's cells are judged together against each other (the cohort floor,
    :meth:`~counterfactory.validation.judging.TemplateJudge.cohort`): a face design with a
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
            "edit_region": edit_region(spec) if kind == "face" else None,
            "masks": spec.masks.model_dump(mode="json") if kind == "limb" else None,
            "noise_floor": NOISE_FLOOR_PROMPT if uses_noise_floor(spec) else None,
            "cohort_floor": spec.gates.cohort_floor,
            "version": JUDGE_VERSION,
            # judged without a source (and whether a pass of the rest is accepted); absent
            # otherwise, so every other spec's key is as it was
            **({"no_source": alone} if (alone := no_source_mode(spec)) is not None else {}),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


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


# --------------------------------------------------------------------------- one template


class LocalExecutor:
    """Edits and judgements in this process: each output judged from the array the editor
    returned, as soon as it is committed (one template's outputs are never all held, and
    nothing is read back from the store).

    The executor interface (:class:`counterfactory.flows.ray.RayExecutor` is the other one):
    ``edit(ws, editor, plans, lineage, on_output=None) -> editor calls`` and ``judge(spec, ws,
    prepared, plans, stack, jkey, floor=None, as_floor=False) -> [(verdict, reasons)]``, with
    ``inline`` saying whether ``edit`` hands each output to ``on_output`` (then the template's
    :class:`TemplateJudge` judges it there).
    """

    inline = True

    def edit(self, ws, editor, plans, lineage, *, on_output=None) -> int:
        return run_edits(ws, editor, plans, lineage, on_output=on_output)

    def judge(self, spec, ws, prepared, plans, stack, jkey, floor=None, as_floor=False):
        return judge_attempts(spec, ws, prepared, plans, stack, jkey, floor, as_floor)


#: the executor of a run on one machine
LOCAL = LocalExecutor()


def process_template(
    spec: Spec,
    ws: Workspace,
    prepared: PreparedSource,
    cells: Sequence[Cell],
    editor: Editor,
    stack: GateStack | None,
    *,
    executor: LocalExecutor | Any = LOCAL,
) -> TemplateOutcome:
    """Fill every cell of one template: plan, edit, judge, and retry the open cells with the next
    seed (the running policy over :func:`~counterfactory.manifests.lifecycle.fill_cells`).

    Finished attempts (``ok`` or ``refused`` in the ledger) are never run again; their stored
    output is re-judged only when the alignment or gate settings changed. ``executor`` decides
    where edits and judgements run (:class:`LocalExecutor`; on a Ray cluster
    :class:`counterfactory.flows.ray.RayExecutor` sends each batch of attempts to a GPU task and
    each judgement to a CPU task, and ``stack`` may then be None).
    """
    # the run keeps its sources released; this template holds its photo and region while it runs
    try:
        prepared = prepared.held()
    except SourceError as exc:
        # the photo changed (or went) since the run checked it: its cells fail with the
        # reason, nothing is edited, and the other templates go on
        reasons = [exc.reason]
        failed = [CellOutcome(cell=c, verdict="failed", reasons=list(reasons)) for c in cells]
        return TemplateOutcome(template_id=prepared.id, cells=failed, editor_calls=0)
    lineage = editor.lineage()
    jkey = judge_key(spec)
    calls = 0
    floor = None
    # a backend that cannot make the floor (the import backend: its outputs exist already)
    # answers the request failed; the template's cells are then judged as measured
    if uses_noise_floor(spec):
        floor, calls = noise_floor(spec, ws, prepared, editor, lineage, stack, jkey, executor=executor)
    # without a floor output the template's outputs are judged together, each against the
    # others (the cohort floor), after the round's edits: not one at a time as they return
    inline = executor.inline and not uses_cohort_floor(spec, floor)
    template_judge = TemplateJudge(spec, ws, prepared, stack, jkey, floor=floor) if inline else None

    def plan(open_cells: Sequence[Cell], attempt_no: int) -> list[PlannedAttempt]:
        return plan_attempts(spec, prepared, open_cells, editor, lineage, attempt_no)

    def settle(plans: Sequence[PlannedAttempt]) -> dict[str, Settled]:
        nonlocal calls
        judged: dict[str, tuple[str, list[str]]] = {}
        by_id = {planned.attempt_id: planned for planned in plans}

        def judge_now(aid: str, image: np.ndarray) -> None:
            judged[aid] = template_judge.attempt(by_id[aid].cell, aid, output=image, fresh=True)

        def edit_round(chosen: Sequence[PlannedAttempt]) -> int:
            if inline:
                return executor.edit(ws, editor, chosen, lineage, on_output=judge_now)
            return executor.edit(ws, editor, chosen, lineage)

        calls += edit_round(plans)
        # a paid remote request that failed to come back (status outage, download error) is
        # fetched again, never replaced by the next seed: that would pay twice
        for wait_s in RESUME_WAITS_S:
            waiting = pending_ids(ws, [aid for aid in by_id if aid not in judged])
            if not waiting:
                break
            time.sleep(wait_s)
            calls += edit_round([planned for planned in plans if planned.attempt_id in waiting])
        # what was finished before this run (or did not come back) is judged from the ledger,
        # read in a few queries for the whole round
        rest = [planned for planned in plans if planned.attempt_id not in judged]
        rest_ids = [planned.attempt_id for planned in rest]
        if inline:
            attempts, candidates = ws.ledger.attempts_by_id(rest_ids), ws.ledger.candidates_by_id(rest_ids)
            for planned in rest:
                known = (attempts.get(planned.attempt_id), candidates.get(planned.attempt_id))
                judged[planned.attempt_id] = template_judge.attempt(planned.cell, planned.attempt_id, known=known)
        else:
            verdicts = executor.judge(spec, ws, prepared, rest, stack, jkey, floor)
            for planned, verdict in zip(rest, verdicts, strict=True):
                judged[planned.attempt_id] = verdict
        # still pending after the waits: the cell stays failed in this run and the next run
        # fetches the journalled request; no new seed is bought for it
        still_pending = pending_ids(ws, rest_ids)
        return {
            aid: Settled(verdict, reasons, pending=aid in still_pending) for aid, (verdict, reasons) in judged.items()
        }

    outcomes = fill_cells(cells, spec.editor.max_attempts, plan, settle)
    return TemplateOutcome(template_id=prepared.id, cells=list(outcomes.values()), editor_calls=calls)


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
    if done is not None and done.status == "ok" and not ws.store.has(done.output_sha256):
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
    from counterfactory.manifests.registry import EDITORS

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
    return [judge.attempt(plan.cell, plan.attempt_id) for plan in plans]


# --------------------------------------------------------------------------- the parts


def _edit_safely(editor: Editor, requests: list[EditRequest], journal) -> list[EditResult]:
    """Run a batch; a per-item exception a backend let through becomes that item's failure."""
    try:
        results = editor.edit_many(requests, journal)
    except SetupError:
        # a key rejected mid-run, an unknown endpoint or model: no item can succeed, so the
        # whole run stops here with the backend's one message, before anything is sealed
        raise
    except Exception as exc:  # noqa: BLE001 - a broken batch is recorded per item, the run goes on
        return [
            EditResult(r.attempt_id, "failed", reason=f"editor_error: {type(exc).__name__}: {exc}") for r in requests
        ]
    by_id = {r.attempt_id: r for r in results}
    return [
        by_id.get(r.attempt_id) or EditResult(r.attempt_id, "failed", reason="editor_error: no result returned")
        for r in requests
    ]


def _store_result(ws: Workspace, result: EditResult) -> bool:
    """Commit one result to the ledger (its image to the store); True when it is a usable output."""
    meta = dict(result.metadata)
    if result.status == "ok":
        image = result.image
        if image is None or image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            shape = None if image is None else (image.shape, str(image.dtype))
            ws.ledger.finish_attempt(
                result.attempt_id,
                status="failed",
                cost_usd=result.cost_usd,
                meta=meta,
                reason=f"editor_bad_output: expected (h, w, 3) uint8 RGB, got {shape}",
            )
            return False
        sha = ws.store.put(image)
        ws.ledger.finish_attempt(result.attempt_id, status="ok", output_sha256=sha, cost_usd=result.cost_usd, meta=meta)
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
    stack = GateStack.from_config(spec.gates, spec.design.kind, region=edit_region(spec))
    if journal is not None:
        for gate in stack.gates:
            if isinstance(gate, AttributeGate):
                gate.journal = journal
    return stack


def prepare_source(spec: Spec, source: Source) -> PreparedSource:
    """One source's edit region and face size, exactly as the run computed them.

    The review site calls this to show the mask a candidate was edited inside.

    Raises:
        ValueError: the source cannot serve the design (the reason the run gave it).
    """
    reason, prepared = _check_source(spec, source, get_face_landmarker())
    if prepared is None:
        raise ValueError(reason)
    return prepared
