"""The factory's steps as plain functions; Prefect wraps them in :mod:`counterfactory.flows.run`.

Read top to bottom, this is the run:

1. :func:`open_workspace` - the ledger, the image store and the releases folder of ``--out``;
2. :func:`prepare_sources` - load the photos, check each can serve the design (one face, a limb
   mask), record every source in the ledger;
3. :func:`plan_grid` - the stratified templates x conditions (cells);
4. :func:`process_template` - per template, until every cell is filled or out of attempts:

   a. :func:`plan_attempts` - rendered prompt, seed, editor request and attempt id per open cell
      (pure);
   b. :func:`run_edits` - run the attempts the ledger has not finished and store their outputs;
   c. :func:`judge_attempts` - align, measure and judge each output (:func:`judge_output`, the
      same path ``counterfactory measure`` uses) and record the candidate.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from counterfactory.generation.align import AlignConfig, align_candidate
from counterfactory.generation.editors import Editor, EditRequest, EditResult, make_editor
from counterfactory.generation.editors.base import EditJournal
from counterfactory.generation.masks import apply_mask_options, mask_from_record
from counterfactory.generation.prompts import RenderedPrompt, face_region, load_template, render_prompt
from counterfactory.generation.sampling import Cell, Grid, expand_grid
from counterfactory.generation.sources import FailedSource, Source, SourceError, iter_sources
from counterfactory.manifests.errors import SetupError
from counterfactory.manifests.ledger import Attempt, Candidate, Ledger
from counterfactory.manifests.spec import Spec
from counterfactory.manifests.store import ImageStore
from counterfactory.validation.faces import get_face_landmarker
from counterfactory.validation.gates.attribute import AttributeGate, check_label_map
from counterfactory.validation.gates.base import FILLING_VERDICTS
from counterfactory.validation.judge import GateStack
from counterfactory.validation.skin import source_edit_region

#: bump when the meaning of a judgement changes, so stored verdicts are recomputed
JUDGE_VERSION = 2
#: attempt statuses that are final: never run again
FINISHED_ATTEMPT = ("ok", "refused")
#: verdicts that fill a cell (review is a person's job, not another seed's)
FILLED = FILLING_VERDICTS
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


class PreparedSource:
    """A usable source with what every cell of its template needs.

    Attributes:
        source: the :class:`~counterfactory.generation.sources.Source`.
        region: ``(H, W)`` uint8 {0, 255}: face mask (face designs) or limb mask (limb designs).
        face_size_px: the face's size, or None.
        meta: the source's metadata record as JSON.

    A run keeps every template's source for its whole length, so it keeps them
    :meth:`released`: the photo's pixels are not held (decoded again when asked for) and the
    region is packed to one bit a pixel. :func:`process_template` works on a :meth:`held`
    copy for as long as the template runs.
    """

    __slots__ = ("source", "face_size_px", "meta", "_region", "_bits", "_shape")

    def __init__(self, source: Source, region: np.ndarray, face_size_px: float | None, meta: dict[str, Any]) -> None:
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "face_size_px", face_size_px)
        object.__setattr__(self, "meta", meta)
        object.__setattr__(self, "_region", region)
        object.__setattr__(self, "_bits", None)
        object.__setattr__(self, "_shape", tuple(region.shape))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"PreparedSource is read-only (tried to set {name!r})")

    def __repr__(self) -> str:
        return f"PreparedSource(id={self.id!r}, face_size_px={self.face_size_px!r}, {self.source!r})"

    def __getstate__(self) -> dict:
        return {"source": self.source, "region": self.region, "face_size_px": self.face_size_px, "meta": self.meta}

    def __setstate__(self, state: dict) -> None:
        PreparedSource.__init__(self, state["source"], state["region"], state["face_size_px"], state["meta"])

    @property
    def id(self) -> str:
        return self.source.record.id

    @property
    def region(self) -> np.ndarray:
        if self._region is not None:
            return self._region
        flat = np.unpackbits(self._bits, count=int(np.prod(self._shape)))
        return (flat.reshape(self._shape) * np.uint8(255)).astype(np.uint8, copy=False)

    def released(self) -> PreparedSource:
        """A copy holding neither the photo's pixels nor the unpacked region (see the class
        docstring); a region that is not exactly {0, 255} stays unpacked."""
        region, bits = self._region, self._bits
        if region is not None and region.dtype == np.uint8 and not np.any((region != 0) & (region != 255)):
            region, bits = None, np.packbits(region.reshape(-1) == 255)
        copy = PreparedSource.__new__(PreparedSource)
        for name, value in (
            ("source", self.source.released()),
            ("face_size_px", self.face_size_px),
            ("meta", self.meta),
            ("_region", region),
            ("_bits", bits),
            ("_shape", self._shape),
        ):
            object.__setattr__(copy, name, value)
        return copy

    def held(self) -> PreparedSource:
        """A copy with the photo's pixels decoded and the region unpacked."""
        if self._region is not None and self.source.holds_pixels:
            return self
        return PreparedSource(self.source.held(), self.region, self.face_size_px, self.meta)


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
    if spec.design.kind != "face":
        return None
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
        if key is None or reason is _NOT_KEPT:
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


#: what an editor may read from an :class:`EditRequest` besides the source, kind and condition
#: (always hashed); :meth:`Editor.consumes` names the subset a backend uses for a kind.
EDITOR_INPUTS = frozenset({"prompt", "negative_prompt", "seed", "mask"})


def editor_inputs(editor: Editor, kind: str) -> frozenset[str]:
    """The request inputs ``editor`` reads for ``kind`` cells; every input when it does not say."""
    consumes = getattr(editor, "consumes", None)
    if consumes is None:
        return EDITOR_INPUTS
    chosen = frozenset(consumes(kind))
    unknown = chosen - EDITOR_INPUTS
    if unknown:
        raise ValueError(f"{editor.name}.consumes({kind!r}) names unknown inputs {sorted(unknown)}")
    return chosen


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
    inputs: frozenset[str] = EDITOR_INPUTS,
) -> str:
    """sha256 of everything that decides an attempt's output (DESIGN.md, "Attempt").

    Only the request inputs the backend reads (``inputs``, from :func:`editor_inputs`) are
    hashed: a mask the editor never sees must not re-buy its edits when the mask changes.
    The condition is always in: it names the cell the attempt belongs to.
    """
    payload: dict[str, Any] = {
        "source_sha256": source_sha256,
        "condition": dict(sorted(cell.condition.items())),
        "kind": kind,
        "editor": lineage,
    }
    optional = {
        "prompt": prompt.lineage(),
        "negative_prompt": negative_prompt,
        "seed": seed,
        "mask": region_sha256,
    }
    payload.update({name: value for name, value in optional.items() if name in inputs})
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


#: the prompt template of the noise-floor request (``assets/prompts/``)
NOISE_FLOOR_PROMPT = "noise_floor_v1"
#: the cell id suffix and the candidate verdict of a template's noise-floor request: not a
#: cell of the grid, never reviewed or published as an item
FLOOR_VERDICT = "floor"


def uses_noise_floor(spec: Spec) -> bool:
    """Whether the spec's cells are judged relative to a noise-floor request (face designs
    with ``gates.noise_floor``)."""
    return spec.design.kind == "face" and spec.gates.noise_floor


def plan_noise_floor(spec: Spec, prepared: PreparedSource, editor: Editor, lineage: dict[str, Any]) -> PlannedAttempt:
    """The template's noise-floor request: the photo, the prompt "return this photo unchanged",
    no condition, the spec's first seed. Its id hashes what decides its output, like a cell's."""
    text, sha = load_template(NOISE_FLOOR_PROMPT)
    prompt = RenderedPrompt(template=NOISE_FLOOR_PROMPT, template_sha256=sha, text=text.strip())
    region = prepared.region
    cell = Cell(source_id=prepared.id, condition={}, cell_id=f"{prepared.id}|{FLOOR_VERDICT}", gender_match=None)
    aid = attempt_id(
        source_sha256=prepared.source.sha256,
        cell=cell,
        kind=spec.design.kind,
        lineage=lineage,
        prompt=prompt,
        negative_prompt=None,
        seed=spec.editor.seed,
        region_sha256=hashlib.sha256(np.ascontiguousarray(region).tobytes()).hexdigest(),
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


def floor_metrics(gates: Mapping[str, Any], attempt: str) -> dict[str, Any] | None:
    """The measures a floor output gives the locality gate (``{metric: value, "attempt_id"}``),
    from its candidate's gate records; None when locality could not measure it."""
    from counterfactory.validation.gates.locality import FLOOR_RELATIVE

    metrics = ((gates or {}).get("locality") or {}).get("metrics") or {}
    floor = {k: metrics[k] for k in FLOOR_RELATIVE if isinstance(metrics.get(k), (int, float))}
    return {**floor, "attempt_id": attempt} if floor else None


def noise_floor(
    spec: Spec,
    ws: Workspace,
    prepared: PreparedSource,
    editor: Editor,
    lineage: dict[str, Any],
    stack: GateStack | None,
    jkey: str,
    *,
    edit: Callable[..., int] | None = None,
    judge: Callable[..., list[tuple[str, list[str]]]] | None = None,
) -> tuple[dict[str, Any] | None, int]:
    """``(floor, editor calls)``: run (once, ever: it is an attempt like any other, committed
    to the ledger and never paid again) and measure the template's noise-floor request.

    The output is measured like a candidate (aligned, every gate) and recorded as a candidate
    with verdict ``floor``; what its locality gate measured is the floor. None when the
    request failed, is still pending, or could not be registered: the template's cells are
    then judged as measured (the ``floor_*`` fields are absent from their records).
    """
    plan = plan_noise_floor(spec, prepared, editor, lineage)
    calls = (edit or run_edits)(ws, editor, [plan], lineage)
    attempt = ws.ledger.attempt(plan.attempt_id)
    if attempt is None or attempt.status != "ok" or not ws.store.has(attempt.output_sha256):
        return None, calls
    # judged where the cells are (this process, or a worker on Ray), recorded as a floor
    (judge or judge_attempts)(spec, ws, prepared, [plan], stack, jkey, None, True)
    known = ws.ledger.candidate(plan.attempt_id)
    if known is None or known.verdict != FLOOR_VERDICT:
        return None, calls
    return floor_metrics(known.gates, plan.attempt_id), calls


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


@dataclass(frozen=True)
class PlannedAttempt:
    """One cell's attempt number ``attempt_no``: its id, the editor request and the rendered prompt."""

    cell: Cell
    attempt_no: int
    attempt_id: str
    request: EditRequest
    prompt: RenderedPrompt


@dataclass(frozen=True)
class Judged:
    """One stored output after alignment and the gates.

    Attributes:
        verdict: ``accepted``, ``rejected``, ``needs_review`` or ``failed``.
        reasons: stable reason codes (``align_...``, ``<gate>_...``).
        image_sha256: the aligned image in the store, or None (not aligned, or no store).
        alignment: :meth:`~counterfactory.generation.align.Alignment.record`.
        gates: per-gate metrics, thresholds and reasons (``Judgement.to_dict()["gates"]``).
    """

    verdict: str
    reasons: list[str]
    image_sha256: str | None
    alignment: dict[str, Any]
    gates: dict[str, Any]


# --------------------------------------------------------------------------- one template


def process_template(
    spec: Spec,
    ws: Workspace,
    prepared: PreparedSource,
    cells: Sequence[Cell],
    editor: Editor,
    stack: GateStack | None,
    *,
    edit: Callable[..., int] | None = None,
    judge: Callable[..., list[tuple[str, list[str]]]] | None = None,
) -> TemplateOutcome:
    """Fill every cell of one template: plan, edit, judge, and retry the open cells with the next seed.

    Finished attempts (``ok`` or ``refused`` in the ledger) are never run again; their stored
    output is re-judged only when the alignment or gate settings changed. In this process,
    each output is judged as soon as it is committed, from the array the editor returned (one
    template's outputs are never all held, and nothing is read back from the store).

    ``edit`` and ``judge`` replace :func:`run_edits` and :func:`judge_attempts` (same
    arguments and results) where the work runs elsewhere: on a Ray cluster they send each
    batch of attempts to a GPU task and each judgement to a CPU task
    (:mod:`counterfactory.flows.ray`), and ``stack`` may then be None.
    """
    here = edit is None and judge is None
    # the run keeps its sources released; this template holds its photo and region while it runs
    try:
        prepared = prepared.held()
    except SourceError as exc:
        # the photo changed (or went) since the run checked it: its cells fail with the
        # reason, nothing is edited, and the other templates go on
        reasons = [exc.reason]
        failed = [CellOutcome(cell=c, verdict="failed", reasons=list(reasons)) for c in cells]
        return TemplateOutcome(template_id=prepared.id, cells=failed, editor_calls=0)
    edit = edit or run_edits
    judge = judge or judge_attempts
    lineage = editor.lineage()
    jkey = judge_key(spec)
    outcomes = {c.cell_id: CellOutcome(cell=c) for c in cells}
    open_cells = list(cells)
    calls = 0
    floor = None
    # a backend that cannot make the floor (the import backend: its outputs exist already)
    # answers the request failed; the template's cells are then judged as measured
    if uses_noise_floor(spec):
        floor, calls = noise_floor(
            spec, ws, prepared, editor, lineage, stack, jkey, edit=None if here else edit, judge=None if here else judge
        )
    template_judge = TemplateJudge(spec, ws, prepared, stack, jkey, floor=floor) if here else None
    for attempt_no in range(1, spec.editor.max_attempts + 1):
        if not open_cells:
            break
        plans = plan_attempts(spec, prepared, open_cells, editor, lineage, attempt_no)
        judged: dict[str, tuple[str, list[str]]] = {}
        by_id = {plan.attempt_id: plan for plan in plans}

        def judge_now(aid: str, image: np.ndarray, by_id=by_id, judged=judged) -> None:
            judged[aid] = template_judge.attempt(by_id[aid].cell, aid, output=image, fresh=True)

        def edit_round(chosen: Sequence[PlannedAttempt]) -> int:
            if here:
                return run_edits(ws, editor, chosen, lineage, on_output=judge_now)
            return edit(ws, editor, chosen, lineage)

        calls += edit_round(plans)
        # a paid remote request that failed to come back (status outage, download error) is
        # fetched again, never replaced by the next seed: that would pay twice
        for wait_s in RESUME_WAITS_S:
            waiting = pending_ids(ws, [plan.attempt_id for plan in plans if plan.attempt_id not in judged])
            if not waiting:
                break
            time.sleep(wait_s)
            calls += edit_round([plan for plan in plans if plan.attempt_id in waiting])
        # what was finished before this run (or did not come back) is judged from the ledger,
        # read in a few queries for the whole round
        rest = [plan for plan in plans if plan.attempt_id not in judged]
        rest_ids = [plan.attempt_id for plan in rest]
        if here:
            attempts, candidates = ws.ledger.attempts_by_id(rest_ids), ws.ledger.candidates_by_id(rest_ids)
            for plan in rest:
                known = (attempts.get(plan.attempt_id), candidates.get(plan.attempt_id))
                judged[plan.attempt_id] = template_judge.attempt(plan.cell, plan.attempt_id, known=known)
        else:
            for plan, verdict in zip(rest, judge(spec, ws, prepared, rest, stack, jkey, floor), strict=True):
                judged[plan.attempt_id] = verdict
        still_pending = pending_ids(ws, rest_ids)
        open_cells = []
        for plan in plans:
            verdict, reasons = judged[plan.attempt_id]
            out = outcomes[plan.cell.cell_id]
            if plan.attempt_id not in out.attempt_ids:  # a seedless editor repeats its id
                out.attempt_ids.append(plan.attempt_id)
            out.final_attempt, out.verdict, out.reasons = plan.attempt_id, verdict, reasons
            # still pending after the waits: the cell stays failed in this run and the next
            # run fetches the journalled request; no new seed is bought for it
            if verdict not in FILLED and plan.attempt_id not in still_pending:
                open_cells.append(plan.cell)
    return TemplateOutcome(template_id=prepared.id, cells=list(outcomes.values()), editor_calls=calls)


def plan_attempts(
    spec: Spec,
    prepared: PreparedSource,
    cells: Sequence[Cell],
    editor: Editor,
    lineage: dict[str, Any],
    attempt_no: int,
) -> list[PlannedAttempt]:
    """Attempt ``attempt_no`` of each cell: the rendered prompt, the seed, the request and its id.

    Pure: reads nothing but its arguments. The seed is ``editor.seed + attempt_no - 1``.
    """
    kind = spec.design.kind
    inputs = editor_inputs(editor, kind)
    region = prepared.region  # once: a released source unpacks its region on each access
    region_sha = hashlib.sha256(np.ascontiguousarray(region).tobytes()).hexdigest()
    seed = spec.editor.seed + attempt_no - 1
    plans = []
    for cell in cells:
        prompt = render_prompt(spec.prompts, kind=kind, condition=cell.condition, source_meta=prepared.meta)
        aid = attempt_id(
            source_sha256=prepared.source.sha256,
            cell=cell,
            kind=kind,
            lineage=lineage,
            prompt=prompt,
            negative_prompt=spec.prompts.negative,
            seed=seed,
            region_sha256=region_sha,
            inputs=inputs,
        )
        request = EditRequest(
            attempt_id=aid,
            image=prepared.source.pixels,
            prompt=prompt.text,
            seed=seed,
            kind=kind,
            mask=region,
            condition=dict(cell.condition),
            negative_prompt=spec.prompts.negative,
        )
        plans.append(PlannedAttempt(cell, attempt_no, aid, request, prompt))
    return plans


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


def attempt_finished(attempt: Attempt) -> bool:
    """Whether ``attempt`` is never run again: ``ok`` or ``refused`` (:data:`FINISHED_ATTEMPT`),
    or ``failed`` where its backend said running it again cannot change it (``meta["final"]``:
    the ``import`` backend's missing or unreadable candidate file, whose attempt id hashes the
    table as read)."""
    return attempt.status in FINISHED_ATTEMPT or (
        attempt.status == "failed" and bool((attempt.meta or {}).get("final"))
    )


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
    """The ids among ``attempt_ids`` that :func:`is_pending` (one read for all of them)."""
    return {
        aid
        for aid, attempt in ws.ledger.attempts_by_id(attempt_ids).items()
        if attempt.status == "running" or (attempt.status == "failed" and bool(attempt.meta.get("pending_request_id")))
    }


def is_pending(ws: Workspace, attempt_id: str) -> bool:
    """An attempt whose outcome is still coming: a failed one whose paid remote request is
    journalled and may still be fetched, or one another run is executing (still ``running``)."""
    attempt = ws.ledger.attempt(attempt_id)
    if attempt is None:
        return False
    return attempt.status == "running" or (attempt.status == "failed" and bool(attempt.meta.get("pending_request_id")))


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


class TemplateJudge:
    """Judges the attempts of one template: from the array an editor just returned, or from
    the store; the source's analysis is shared through the photo's sha256 (``source_key``)."""

    def __init__(
        self,
        spec: Spec,
        ws: Workspace,
        prepared: PreparedSource,
        stack: GateStack,
        jkey: str,
        *,
        floor: Mapping[str, Any] | None = None,
        as_floor: bool = False,
    ) -> None:
        self.spec, self.ws, self.prepared, self.stack, self.jkey = spec, ws, prepared, stack, jkey
        self.floor = dict(floor) if floor else None
        self.as_floor = as_floor

    def attempt(
        self,
        cell: Cell,
        aid: str,
        *,
        output: np.ndarray | None = None,
        fresh: bool = False,
        known: tuple[Attempt | None, Candidate | None] | None = None,
    ) -> tuple[str, list[str]]:
        """``(verdict, reasons)`` of attempt ``aid``, recording a new candidate in the ledger.

        ``output`` is the attempt's image as the editor returned it, when the caller still holds
        it (the same pixels as its stored PNG); otherwise it is read from the store. ``fresh``:
        the caller has just committed ``output`` as this attempt's ``ok`` result (so it has no
        candidate yet and the ledger need not be read). ``known``: the attempt's and candidate's
        rows, when the caller read them already.
        """
        spec, ws, prepared = self.spec, self.ws, self.prepared
        if fresh and output is not None:
            attempt, existing = None, None
        else:
            attempt, existing = known if known is not None else (ws.ledger.attempt(aid), ws.ledger.candidate(aid))
            if attempt is None or attempt.status not in FINISHED_ATTEMPT:
                reason = attempt.reason if attempt is not None else "editor_not_run"
                return "failed", [reason or "editor_failed"]
            aligned_missing = existing is not None and existing.image_sha256 and not ws.store.has(existing.image_sha256)
            if existing is not None and existing.judge_key == self.jkey and not aligned_missing:
                return existing.verdict, list(existing.reasons)
        if attempt is not None and attempt.status == "refused":
            judged = Judged("rejected", [f"editor_refused: {attempt.reason}"], None, {}, {})
        else:
            judged = judge_output(
                prepared.source.pixels,
                output if output is not None else ws.store.get(attempt.output_sha256),
                kind=spec.design.kind,
                region=prepared.region,
                face_size_px=prepared.face_size_px,
                align=spec.align,
                stack=self.stack,
                store=ws.store,
                extras={"condition": dict(cell.condition), "source": prepared.meta, "noise_floor": self.floor},
                source_key=prepared.source.sha256,
            )
        ws.ledger.record_candidate(
            aid,
            cell_id=cell.cell_id,
            judge_key=self.jkey,
            image_sha256=judged.image_sha256,
            alignment=judged.alignment,
            verdict=FLOOR_VERDICT if self.as_floor else judged.verdict,
            reasons=judged.reasons,
            gates=judged.gates,
        )
        return judged.verdict, judged.reasons


#: the gates whose metrics need a registered candidate (skin measures both images on the
#: source's body mask); the others measure faces, which an unregistered candidate still has
PIXEL_GATES = ("locality", "skin")


def judge_output(
    source: np.ndarray,
    output: np.ndarray,
    *,
    kind: str,
    region: np.ndarray | None,
    face_size_px: float | None,
    align: AlignConfig,
    stack: GateStack,
    store: ImageStore | None = None,
    extras: Mapping[str, Any] | None = None,
    source_key: str | None = None,
) -> Judged:
    """Align one editor output to its source and run the gates on it: the one judging path of
    ``run`` and ``measure``.

    Args:
        source: ``(H, W, 3)`` uint8 RGB.
        output: ``(h, w, 3)`` uint8 RGB as the editor returned it, any size.
        kind: ``"face"`` or ``"limb"``.
        region: ``(H, W)`` uint8 {0, 255}, the region the study varies (face or limb mask), or None.
        face_size_px: the source face's size in pixels, or None.
        align: alignment settings.
        stack: the gates for ``kind``.
        store: where the aligned image is put (None: not stored).
        extras: the cell's ``condition`` (axis -> value) and the ``source`` metadata record,
            for the gates that judge the requested change (skin tone).
        source_key: names the source's pixels (the photo file's sha256) for the stack's
            source cache, so every cell of a template reuses one analysis of its source
            (:meth:`~counterfactory.validation.judge.GateStack.analysis_for`); None: hashed.

    When registration fails the verdict is ``rejected`` with the ``align_...`` reason, and the
    gates that do not need pixel registration (face, identity, expression) still measure the
    unregistered candidate, so an audit sees them; ``locality`` is recorded as not measurable.
    """
    alignment = align_candidate(source, output, mask=region, kind=kind, face_size_px=face_size_px, config=align)
    record = alignment.record()
    edit_mask = region if kind == "limb" else None
    if not alignment.ok:
        reasons = [alignment.reason or "align_failed"]
        gates: dict[str, Any] = {}
        if alignment.image is not None and alignment.image.shape == source.shape:
            gates = (
                stack.without(*PIXEL_GATES)
                .evaluate(source, alignment.image, edit_mask=edit_mask, extras=extras, source_key=source_key)
                .to_dict()["gates"]
            )
        for name in PIXEL_GATES:
            if stack.has(name):
                gates[name] = {
                    "passed": False,
                    "measurable": False,
                    "metrics": {},
                    "reasons": [],
                    "review": [],
                    "thresholds": {},
                    "note": "not measurable: the candidate could not be registered to the source",
                }
        return Judged("rejected", reasons, None, record, gates)
    sha = store.put(alignment.image) if store is not None else None
    judgement = stack.evaluate(
        source,
        alignment.image,
        edit_mask=edit_mask,
        extras=extras,
        covered=alignment.covered,
        raw_candidate=alignment.raw,
        unregistered=output,
        source_key=source_key,
    )
    return Judged(judgement.verdict, list(judgement.reasons), sha, record, judgement.to_dict()["gates"])


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
