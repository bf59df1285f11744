"""Judging one editor output: register it to its source, run the gates, record the candidate.

:func:`judge_output` is the one judging path of ``counterfactory run`` and ``counterfactory
measure``; :class:`TemplateJudge` judges the attempts of one template during a run (from the
array an editor just returned, or from the store) and records each candidate in the ledger.
Plain functions and classes: no Prefect.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from counterfactory.generation.align import AlignConfig, Alignment, align_candidate
from counterfactory.generation.attempts import FINISHED_ATTEMPT
from counterfactory.generation.sampling import Cell
from counterfactory.manifests.ledger import Attempt, Candidate
from counterfactory.manifests.store import ImageStore
from counterfactory.manifests.vocabulary import ACCEPTED, FAILED, FLOOR, NEEDS_REVIEW, OK, REFUSED, REJECTED
from counterfactory.validation.gate_stack import GateStack
from counterfactory.validation.gates.base import REGISTRATION_FAILED
from counterfactory.validation.gates.locality import FLOOR_CONTEXT, FLOOR_IMAGE, FloorContext

if TYPE_CHECKING:
    from counterfactory.generation.sources import PreparedSource

    # the study spec is the engine's (flows/engine/spec.py), which this layer does not name
    Spec = Any

#: the cell id suffix and the candidate verdict of a template's noise-floor request: not a
#: cell of the grid, never reviewed or published as an item
FLOOR_VERDICT = FLOOR


@dataclass(frozen=True)
class Judged:
    """One stored output after alignment and the gates.

    Attributes:
        verdict: ``accepted``, ``rejected``, ``needs_review`` or ``failed``.
        reasons: stable reason codes (``align_...``, ``<gate>_...``).
        image_sha256: the aligned image in the store, or None (not aligned, or no store).
        alignment: :meth:`~counterfactory.generation.align.Alignment.record`.
        gates: per-gate metrics, thresholds and reasons (``Judgement.to_dict()["gates"]``).
        image: the aligned image itself (``(H, W, 3)`` uint8), or None when not aligned.
    """

    verdict: str
    reasons: list[str]
    image_sha256: str | None
    alignment: dict[str, Any]
    gates: dict[str, Any]
    image: np.ndarray | None = None


def floor_path_of(gates: Mapping[str, Any] | None) -> str | None:
    """Which floor judged an output: ``request`` (the run's "return this photo unchanged"
    output), ``cohort`` (the median of the same source's other outputs) or ``none``, from its
    locality record (``metrics.floor_path``); None where locality did not measure it (limb
    cells, a registration that failed, a set with no source photo)."""
    return (((gates or {}).get("locality") or {}).get("metrics") or {}).get("floor_path")


def no_source_mode(spec: Any) -> bool | None:
    """None when the spec's cells are judged against their source; else (the editor's options
    say ``no_source``) whether a candidate that passes every gate that can run alone is
    accepted (``accept_on_remaining``)."""
    options = spec.editor.options()
    if not getattr(options, "no_source", False):
        return None
    return bool(getattr(options, "accept_on_remaining", False))


def floor_image(ws: Any, floor: Mapping[str, Any] | None) -> np.ndarray | None:
    """The registered floor output a noise floor names (``floor["image_sha256"]``, the floor
    candidate's aligned image), read from ``ws.store``; None without one or when it is gone
    (the cells are then judged on the floor's measures alone)."""
    sha = (floor or {}).get("image_sha256")
    if not sha or not ws.store.has(sha):
        return None
    return ws.store.get(sha)


class TemplateJudge:
    """Judges the attempts of one template: from the array an editor just returned, or from
    the store; the source's analysis is shared through the photo's sha256 (``source_key``).

    ``ws`` is the run's workspace (:class:`counterfactory.flows.engine.run_folder.Workspace`: its ``ledger``
    and ``store``)."""

    def __init__(
        self,
        spec: Spec,
        ws: Any,
        prepared: PreparedSource,
        stack: GateStack,
        jkey: str,
        *,
        floor: Mapping[str, Any] | None = None,
        as_floor: bool = False,
    ) -> None:
        self.spec, self.ws, self.prepared, self.stack, self.jkey = spec, ws, prepared, stack, jkey
        self.floor = dict(floor) if floor else None
        #: the floor output itself (registered to the source), read once from the store: the
        #: locality gate compares every cell's output with it pixel by pixel
        self.floor_image = floor_image(ws, self.floor)
        #: what the locality gate derives from that output, made once for the template's cells
        #: (the caller's context object: no measure keeps a cache of its own)
        self.floor_context = FloorContext(self.floor_image) if self.floor_image is not None else None
        self.as_floor = as_floor
        #: None: judged against the source; else the set has no source photo
        #: (:func:`judge_alone`), and this says whether a pass of the remaining gates is accepted
        self.alone = no_source_mode(spec)

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
                return FAILED, [reason or "editor_failed"]
            aligned_missing = existing is not None and existing.image_sha256 and not ws.store.has(existing.image_sha256)
            if existing is not None and existing.judge_key == self.jkey and not aligned_missing:
                return existing.verdict, list(existing.reasons)
        if attempt is not None and attempt.status == REFUSED:
            judged = Judged(REJECTED, [f"editor_refused: {attempt.reason}"], None, {}, {})
        elif self.alone is not None:
            judged = judge_alone(
                output if output is not None else ws.store.get(attempt.output_sha256),
                kind=spec.design.kind,
                stack=self.stack,
                store=ws.store,
                extras={"condition": dict(cell.condition), "source": prepared.meta},
                accept=self.alone,
            )
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
                extras={
                    "condition": dict(cell.condition),
                    "source": prepared.meta,
                    "noise_floor": self.floor,
                    FLOOR_IMAGE: self.floor_image,
                    FLOOR_CONTEXT: self.floor_context,
                },
                source_key=prepared.source.sha256,
            )
        return self._record(cell, aid, judged)

    def _record(self, cell: Cell, aid: str, judged: Judged) -> tuple[str, list[str]]:
        self.ws.ledger.record_candidate(
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

    def cohort(self, items: Sequence[tuple[Cell, str]]) -> list[tuple[str, list[str]]]:
        """``(verdict, reasons)`` per ``(cell, attempt id)``, the attempts judged together with
        the cohort floor (:func:`judge_cohort`): each output against the median of the other
        outputs of this template, as a set with no floor request is judged.

        Attempts already judged under this judge key keep their verdicts; their registered
        images still join the others' medians. A failed or refused attempt is judged as
        :meth:`attempt` judges it and joins no median."""
        ws = self.ws
        ids = [aid for _, aid in items]
        attempts, candidates = ws.ledger.attempts_by_id(ids), ws.ledger.candidates_by_id(ids)
        out: dict[str, tuple[str, list[str]]] = {}
        todo: list[tuple[Cell, str, np.ndarray]] = []
        members: list[np.ndarray] = []
        for cell, aid in items:
            attempt, existing = attempts.get(aid), candidates.get(aid)
            if attempt is None or attempt.status != OK or not ws.store.has(attempt.output_sha256 or ""):
                out[aid] = self.attempt(cell, aid, known=(attempt, existing))
                continue
            settled = (
                existing is not None
                and existing.judge_key == self.jkey
                and (not existing.image_sha256 or ws.store.has(existing.image_sha256))
            )
            if settled:
                out[aid] = (existing.verdict, list(existing.reasons))
                if existing.image_sha256:
                    members.append(ws.store.get(existing.image_sha256))
                continue
            todo.append((cell, aid, ws.store.get(attempt.output_sha256)))
        if todo:
            prepared = self.prepared
            judged = judge_cohort(
                prepared.source.pixels,
                [image for _, _, image in todo],
                kind=self.spec.design.kind,
                region=prepared.region,
                face_size_px=prepared.face_size_px,
                align=self.spec.align,
                stack=self.stack,
                store=ws.store,
                extras=[{"condition": dict(cell.condition), "source": prepared.meta} for cell, _, _ in todo],
                source_key=prepared.source.sha256,
                members=members,
            )
            for (cell, aid, _), result in zip(todo, judged, strict=True):
                out[aid] = self._record(cell, aid, result)
        return [out[aid] for aid in ids]


#: the gates that judge a candidate alone (its faces, its perceived labels): the only ones run
#: when a set has no source photo (:func:`judge_alone`); every other gate compares with a source
SOURCE_FREE_GATES = ("face", "attribute")
#: the review reason of a candidate judged without a source that passed every gate that ran
SOURCE_GATES_SKIPPED = "import_source_gates_skipped"
#: why :func:`judge_alone` skips a gate (recorded on the candidate, shown in the report)
SKIPPED_WHY = "no source photo: the gate compares the candidate with its source"


def judge_alone(
    output: np.ndarray,
    *,
    kind: str,
    stack: GateStack,
    store: ImageStore | None = None,
    extras: Mapping[str, Any] | None = None,
    accept: bool = False,
) -> Judged:
    """Judge an output that has no source photo (an imported set like PAIRS: one scene, several
    generated people): nothing is registered, and only :data:`SOURCE_FREE_GATES` run, on the
    candidate alone (the face gate counts and scores its faces; the attribute gate reads its
    labels). The gates skipped are listed in the alignment record (``skipped_gates``).

    The verdict is the remaining gates' (``rejected``, ``failed`` and ``needs_review`` as they
    say); one that passes all of them is ``needs_review`` with :data:`SOURCE_GATES_SKIPPED`
    (a person judges what no gate could), unless ``accept``: then ``accepted``, judged on the
    remaining gates, its skipped gates listed on the item.
    """
    from counterfactory.validation.gates.face import NO_SOURCE

    skipped = [g.name for g in stack.gates if g.name not in SOURCE_FREE_GATES]
    kept = stack.without(*skipped)
    image = np.ascontiguousarray(output)
    sha = store.put(image) if store is not None else None
    judgement = kept.evaluate(image, image, extras={**(extras or {}), NO_SOURCE: True}, source_key=sha)
    verdict, reasons = judgement.verdict, list(judgement.reasons)
    if verdict == ACCEPTED and skipped and not accept:
        verdict, reasons = NEEDS_REVIEW, [SOURCE_GATES_SKIPPED]
    record = {"ok": None, "no_source": True, "note": SKIPPED_WHY, "skipped_gates": skipped}
    return Judged(verdict, reasons, sha, record, judgement.to_dict()["gates"])


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
            (:meth:`~counterfactory.validation.gate_stack.GateStack.analysis_for`); None: hashed.

    When registration fails the verdict is ``rejected`` with the ``align_...`` reason first, and
    the gates that do not need pixel registration (face, identity, expression) still measure the
    unregistered candidate on its own landmarks (``extras[REGISTRATION_FAILED]``: the expression gate
    reads the mesh and the AUs, not the pixel shifts, which need the pair registered); their
    rejection reasons follow the alignment's, so a smile or a new framing is named beside it.
    ``locality`` and ``skin`` are recorded as not measurable.
    """
    alignment = align_candidate(source, output, mask=region, kind=kind, face_size_px=face_size_px, config=align)
    return judge_aligned(
        source,
        output,
        alignment,
        kind=kind,
        region=region,
        stack=stack,
        store=store,
        extras=extras,
        source_key=source_key,
    )


def judge_aligned(
    source: np.ndarray,
    output: np.ndarray,
    alignment: Alignment,
    *,
    kind: str,
    region: np.ndarray | None,
    stack: GateStack,
    store: ImageStore | None = None,
    extras: Mapping[str, Any] | None = None,
    source_key: str | None = None,
) -> Judged:
    """:func:`judge_output` after its alignment: the gates on ``output`` registered as
    ``alignment`` says (the same arguments; a cohort aligns all its members first,
    :func:`judge_cohort`)."""
    record = alignment.record()
    edit_mask = region if kind == "limb" else None
    if not alignment.ok:
        reasons = [alignment.reason or "align_failed"]
        gates: dict[str, Any] = {}
        if alignment.image is not None and alignment.image.shape == source.shape:
            # what the editor did, read on the unregistered candidate's own landmarks (faces,
            # pose, framing, expression on the mesh; nothing that compares pixels in place):
            # its reasons stand beside the alignment's, so a smile or a zoom is named as such
            unregistered = {**(extras or {}), REGISTRATION_FAILED: True}
            judgement = stack.without(*PIXEL_GATES).evaluate(
                source, alignment.image, edit_mask=edit_mask, extras=unregistered, source_key=source_key
            )
            gates = judgement.to_dict()["gates"]
            if judgement.verdict == REJECTED:
                reasons += [r for r in judgement.reasons if r not in reasons]
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
        return Judged(REJECTED, reasons, None, record, gates)
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
    return Judged(
        judgement.verdict, list(judgement.reasons), sha, record, judgement.to_dict()["gates"], alignment.image
    )


def judge_cohort(
    source: np.ndarray,
    outputs: Sequence[np.ndarray],
    *,
    kind: str,
    region: np.ndarray | None,
    face_size_px: float | None,
    align: AlignConfig,
    stack: GateStack,
    store: ImageStore | None = None,
    extras: Sequence[Mapping[str, Any] | None] | None = None,
    source_key: str | None = None,
    members: Sequence[np.ndarray] = (),
) -> list[Judged]:
    """Judge several outputs of one source against each other: the cohort floor.

    Every output is registered to the source first; then each is judged with, as its floor,
    the pixelwise median of the *other* registered outputs (and of ``members``: more outputs
    of the same source already registered, e.g. earlier rounds' cells) on the gates' working
    grid (:func:`~counterfactory.validation.cohort.cohort_floors`): what the editor rendered
    alike in all of them outside the edit region is its re-rendering of unchanged content,
    and what one output alone changed stands out. With fewer than
    :data:`~counterfactory.validation.cohort.COHORT_MIN_OTHERS` others registered, an output
    is judged with no floor (``floor_path: none``). Same arguments as :func:`judge_output`,
    ``extras`` one per output.
    """
    from counterfactory.validation.cohort import cohort_floors
    from counterfactory.validation.gates.locality import FLOOR_WORK_IMAGE
    from counterfactory.validation.segment import work_stride

    extras = list(extras) if extras is not None else [None] * len(outputs)
    alignments = [
        align_candidate(source, out, mask=region, kind=kind, face_size_px=face_size_px, config=align) for out in outputs
    ]
    k = work_stride(source.shape)
    grid = [a.image[::k, ::k] if a.ok and a.image is not None else None for a in alignments]
    floors = cohort_floors(grid, [m[::k, ::k] for m in members])
    judged = []
    for out, alignment, extra, floor in zip(outputs, alignments, extras, floors, strict=True):
        extra = dict(extra or {})
        if floor is not None:
            extra["noise_floor"] = {"path": "cohort", "members": floor.members}
            extra[FLOOR_WORK_IMAGE] = floor.image
        judged.append(
            judge_aligned(
                source,
                out,
                alignment,
                kind=kind,
                region=region,
                stack=stack,
                store=store,
                extras=extra,
                source_key=source_key,
            )
        )
    return judged
