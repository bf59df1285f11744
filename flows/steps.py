"""The factory's steps as plain functions: spec, sources, grid, edit, align, measure, judge.

Prefect wraps these in :mod:`counterfactory.flows.run` (one task per template); every function here runs and
is tested without Prefect. Per-item problems end as values in the ledger (``failed`` sources,
``refused``/``failed`` attempts, ``rejected`` candidates with reason codes); only problems that
make the whole run impossible raise.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from counterfactory.generation.align import align_candidate
from counterfactory.generation.editors import Editor, EditRequest, EditResult, make_editor
from counterfactory.generation.masks import dilate, mask_from_record
from counterfactory.generation.prompts import RenderedPrompt, render_prompt
from counterfactory.generation.sampling import Cell, Grid, expand_grid
from counterfactory.generation.sources import FailedSource, Source, load_sources
from counterfactory.manifests.ledger import Ledger
from counterfactory.manifests.spec import Spec
from counterfactory.manifests.store import ImageStore
from counterfactory.validation.faces import face_mask, get_face_landmarker
from counterfactory.validation.judge import GateStack

#: bump when the meaning of a judgement changes, so stored verdicts are recomputed
JUDGE_VERSION = 1
#: attempt statuses that are final: never run again
FINISHED_ATTEMPT = ("ok", "refused")
#: verdicts that fill a cell (review is a person's job, not another seed's)
FILLED = ("accepted", "needs_review")


@dataclass
class Workspace:
    """Where one study's state lives: ``out/ledger.sqlite``, ``out/store/``, ``out/releases/``."""

    out: Path
    ledger: Ledger
    store: ImageStore

    @property
    def releases(self) -> Path:
        return self.out / "releases"


def open_workspace(spec: Spec, out: str | Path) -> Workspace:
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    url = spec.ledger_url or f"sqlite:///{out / 'ledger.sqlite'}"
    return Workspace(out=out, ledger=Ledger(url), store=ImageStore(out / "store"))


@dataclass(frozen=True)
class PreparedSource:
    """A usable source with what every cell of its template needs."""

    source: Source
    #: ``(H, W)`` uint8 {0, 255}: face mask (face designs) or limb mask (limb designs)
    region: np.ndarray
    face_size_px: float | None
    meta: dict[str, Any]

    @property
    def id(self) -> str:
        return self.source.record.id


def _record_meta(source: Source | FailedSource) -> dict[str, Any]:
    record = source.record
    if record is None:
        return {}
    return record.model_dump(mode="json")


def prepare_sources(spec: Spec, ledger: Ledger) -> tuple[list[PreparedSource], list[FailedSource]]:
    """Load every source, check it can serve the design, and record each in the ledger.

    Face designs need exactly one face in the source; limb designs need a limb mask.
    A source that cannot serve becomes a :class:`FailedSource` with its reason.
    """
    loaded = load_sources(spec.sources.photos, spec.sources.metadata, max_pixels=spec.sources.max_pixels)
    landmarker = get_face_landmarker()
    usable: list[PreparedSource] = []
    failed: list[FailedSource] = []
    for item in loaded:
        if isinstance(item, FailedSource):
            failed.append(item)
            continue
        reason, prepared = _check_source(spec, item, landmarker)
        if reason is not None:
            failed.append(FailedSource(id=item.record.id, path=item.path, reason=reason, record=item.record))
        else:
            usable.append(prepared)
    for ok in usable:
        ledger.record_source(
            ok.id,
            str(ok.source.path),
            sha256=ok.source.sha256,
            status="ok",
            meta={**ok.meta, "normalisation": list(ok.source.notes)},
        )
    for bad in failed:
        ledger.record_source(
            bad.id,
            str(bad.path),
            sha256=None,
            status="failed",
            reason=bad.reason,
            meta=_record_meta(bad),
        )
    return usable, failed


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
        region = face_mask(faces[0].landmarks, shape, mode=spec.gates.face_mask)
        return None, PreparedSource(source, region, faces[0].size_px, meta)
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
    if spec.masks.dilate_px:
        region = dilate(region, spec.masks.dilate_px)
    if not region.any():
        return f"source_empty_limb_mask: the limb mask of {source.record.id} is empty", None
    return None, PreparedSource(source, region, faces[0].size_px if faces else None, meta)


def plan_grid(spec: Spec, sources: Sequence[PreparedSource]) -> Grid:
    return expand_grid([s.source.record for s in sources], spec.design)


def attempt_id(
    *,
    source_sha256: str,
    cell: Cell,
    kind: str,
    lineage: dict[str, Any],
    prompt: RenderedPrompt,
    negative_prompt: str | None,
    seed: int,
    region_sha256: str,
) -> str:
    """sha256 of everything that decides an attempt's output (DESIGN.md, "Attempt")."""
    payload = {
        "source_sha256": source_sha256,
        "condition": dict(sorted(cell.condition.items())),
        "kind": kind,
        "editor": lineage,
        "prompt": prompt.lineage(),
        "negative_prompt": negative_prompt,
        "seed": seed,
        "region_sha256": region_sha256,
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def judge_key(spec: Spec) -> str:
    """Hash of what decides a verdict for a stored output: alignment and gate settings."""
    blob = json.dumps(
        {
            "align": spec.align.model_dump(mode="json"),
            "gates": spec.gates.model_dump(mode="json"),
            "masks": spec.masks.model_dump(mode="json"),
            "version": JUDGE_VERSION,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class CellOutcome:
    cell: Cell
    attempt_ids: list[str] = field(default_factory=list)
    final_attempt: str | None = None
    verdict: str = "failed"
    reasons: list[str] = field(default_factory=list)


@dataclass
class TemplateOutcome:
    template_id: str
    cells: list[CellOutcome]
    editor_calls: int = 0

    @property
    def complete(self) -> bool:
        return all(c.verdict in FILLED for c in self.cells)


def _planned(
    spec: Spec, prepared: PreparedSource, cell: Cell, lineage: dict[str, Any], attempt_no: int, region_sha: str
) -> tuple[str, EditRequest, RenderedPrompt]:
    prompt = render_prompt(spec.prompts, kind=spec.design.kind, condition=cell.condition, source_meta=prepared.meta)
    seed = spec.editor.seed + attempt_no - 1
    aid = attempt_id(
        source_sha256=prepared.source.sha256,
        cell=cell,
        kind=spec.design.kind,
        lineage=lineage,
        prompt=prompt,
        negative_prompt=spec.prompts.negative,
        seed=seed,
        region_sha256=region_sha,
    )
    request = EditRequest(
        attempt_id=aid,
        image=prepared.source.pixels,
        prompt=prompt.text,
        seed=seed,
        kind=spec.design.kind,
        mask=prepared.region,
        condition=dict(cell.condition),
        negative_prompt=spec.prompts.negative,
    )
    return aid, request, prompt


def process_template(
    spec: Spec,
    ws: Workspace,
    prepared: PreparedSource,
    cells: Sequence[Cell],
    editor: Editor,
    stack: GateStack,
) -> TemplateOutcome:
    """Fill every cell of one template: edit, align, measure, judge, retrying with the next seed.

    Finished attempts (``ok`` or ``refused`` in the ledger) are never run again; their stored
    output is re-judged only when the alignment or gate settings changed.
    """
    region_sha = hashlib.sha256(np.ascontiguousarray(prepared.region).tobytes()).hexdigest()
    jkey = judge_key(spec)
    journal = ws.ledger.journal(editor.name)
    lineage = editor.lineage()
    outcomes = {c.cell_id: CellOutcome(cell=c) for c in cells}
    open_cells = list(cells)
    calls = 0
    for attempt_no in range(1, spec.editor.max_attempts + 1):
        if not open_cells:
            break
        plans = [(c, *_planned(spec, prepared, c, lineage, attempt_no, region_sha)) for c in open_cells]
        to_run = []
        for cell, aid, request, prompt in plans:
            outcomes[cell.cell_id].attempt_ids.append(aid)
            done = ws.ledger.attempt(aid)
            if done is None or done.status not in FINISHED_ATTEMPT:
                ws.ledger.start_attempt(
                    aid,
                    cell_id=cell.cell_id,
                    attempt_no=attempt_no,
                    seed=request.seed,
                    backend=editor.name,
                    lineage=lineage,
                    prompt=prompt.text,
                )
                to_run.append(request)
        if to_run:
            calls += len(to_run)
            results = _edit_safely(editor, to_run, journal)
            for result in results:
                _store_result(ws, result)
        still_open = []
        for cell, aid, _request, _prompt in plans:
            verdict, reasons = _judge_attempt(spec, ws, prepared, cell, aid, stack, jkey)
            out = outcomes[cell.cell_id]
            out.final_attempt, out.verdict, out.reasons = aid, verdict, reasons
            if verdict not in FILLED:
                still_open.append(cell)
        open_cells = still_open
    return TemplateOutcome(template_id=prepared.id, cells=list(outcomes.values()), editor_calls=calls)


def _edit_safely(editor: Editor, requests: list[EditRequest], journal) -> list[EditResult]:
    """Run a batch; a per-item exception a backend let through becomes that item's failure."""
    try:
        results = editor.edit_many(requests, journal)
    except Exception as exc:  # noqa: BLE001 - a broken batch is recorded per item, the run goes on
        return [
            EditResult(r.attempt_id, "failed", reason=f"editor_error: {type(exc).__name__}: {exc}") for r in requests
        ]
    by_id = {r.attempt_id: r for r in results}
    return [
        by_id.get(r.attempt_id) or EditResult(r.attempt_id, "failed", reason="editor_error: no result returned")
        for r in requests
    ]


def _store_result(ws: Workspace, result: EditResult) -> None:
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
            return
        sha = ws.store.put(image)
        ws.ledger.finish_attempt(result.attempt_id, status="ok", output_sha256=sha, cost_usd=result.cost_usd, meta=meta)
    else:
        ws.ledger.finish_attempt(
            result.attempt_id, status=result.status, reason=result.reason, cost_usd=result.cost_usd, meta=meta
        )


def _judge_attempt(
    spec: Spec, ws: Workspace, prepared: PreparedSource, cell: Cell, aid: str, stack: GateStack, jkey: str
) -> tuple[str, list[str]]:
    attempt = ws.ledger.attempt(aid)
    if attempt is None or attempt.status not in FINISHED_ATTEMPT:
        reason = attempt.reason if attempt is not None else "editor_not_run"
        return "failed", [reason or "editor_failed"]
    existing = ws.ledger.candidate(aid)
    if existing is not None and existing.judge_key == jkey:
        return existing.verdict, list(existing.reasons)
    if attempt.status == "refused":
        verdict, reasons, sha, alignment, gates = "rejected", [f"editor_refused: {attempt.reason}"], None, {}, {}
    else:
        verdict, reasons, sha, alignment, gates = judge_output(
            spec, ws, prepared, ws.store.get(attempt.output_sha256), stack
        )
    ws.ledger.record_candidate(
        aid,
        cell_id=cell.cell_id,
        judge_key=jkey,
        image_sha256=sha,
        alignment=alignment,
        verdict=verdict,
        reasons=reasons,
        gates=gates,
    )
    return verdict, reasons


def judge_output(
    spec: Spec, ws: Workspace | None, prepared: PreparedSource, output: np.ndarray, stack: GateStack
) -> tuple[str, list[str], str | None, dict, dict]:
    """Align one editor output to its source and run the gates on it.

    Returns ``(verdict, reasons, aligned image sha256 or None, alignment record, gate record)``.
    """
    source = prepared.source.pixels
    alignment = align_candidate(
        source,
        output,
        mask=prepared.region,
        kind=spec.design.kind,
        face_size_px=prepared.face_size_px,
        config=spec.align,
    )
    record = alignment.record()
    if not alignment.ok:
        return "rejected", [alignment.reason or "align_failed"], None, record, {}
    sha = ws.store.put(alignment.image) if ws is not None else None
    edit_mask = prepared.region if spec.design.kind == "limb" else None
    judgement = stack.evaluate(source, alignment.image, edit_mask=edit_mask)
    return judgement.verdict, list(judgement.reasons), sha, record, judgement.to_dict()["gates"]


def build_editor(spec: Spec) -> Editor:
    """The spec's backend, prepared (heavy parts loaded, setup problems raised) before any work."""
    editor = make_editor(spec.editor.backend, spec.editor.options())
    editor.prepare()
    return editor


def build_gate_stack(spec: Spec) -> GateStack:
    return GateStack.from_config(spec.gates, spec.design.kind)


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
