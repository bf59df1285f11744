"""Judging one editor output: register it to its source, run the gates, record the candidate.

:func:`judge_output` is the one judging path of ``counterfactory run`` and ``counterfactory
measure``; :class:`TemplateJudge` judges the attempts of one template during a run (from the
array an editor just returned, or from the store) and records each candidate in the ledger.
Plain functions and classes: no Prefect.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from counterfactory.generation.align import AlignConfig, align_candidate
from counterfactory.generation.attempts import FINISHED_ATTEMPT
from counterfactory.generation.sampling import Cell
from counterfactory.manifests.ledger import Attempt, Candidate
from counterfactory.manifests.store import ImageStore
from counterfactory.validation.gates.locality import FLOOR_IMAGE
from counterfactory.validation.judge import GateStack

if TYPE_CHECKING:
    from counterfactory.generation.sources import PreparedSource
    from counterfactory.manifests.spec import Spec

#: the cell id suffix and the candidate verdict of a template's noise-floor request: not a
#: cell of the grid, never reviewed or published as an item
FLOOR_VERDICT = "floor"


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

    ``ws`` is the run's workspace (:class:`counterfactory.flows.steps.Workspace`: its ``ledger``
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
                return "failed", [reason or "editor_failed"]
            aligned_missing = existing is not None and existing.image_sha256 and not ws.store.has(existing.image_sha256)
            if existing is not None and existing.judge_key == self.jkey and not aligned_missing:
                return existing.verdict, list(existing.reasons)
        if attempt is not None and attempt.status == "refused":
            judged = Judged("rejected", [f"editor_refused: {attempt.reason}"], None, {}, {})
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
                },
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
    if verdict == "accepted" and skipped and not accept:
        verdict, reasons = "needs_review", [SOURCE_GATES_SKIPPED]
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
    return Judged(
        judgement.verdict, list(judgement.reasons), sha, record, judgement.to_dict()["gates"], alignment.image
    )
