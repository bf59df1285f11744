"""Judging a template's attempts during a run: :class:`TemplateJudge` reads the attempts from the
ledger and the store, judges each with the validation layer's one path
(:func:`~counterfactory.validation.judging.judge_output`, ``judge_alone`` for a set with no source
photo, ``judge_cohort`` for the cohort floor) and records each candidate in the ledger."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from counterfactory.flows.engine.run_folder import Workspace
from counterfactory.flows.engine.spec import Spec
from counterfactory.generation.attempts import FINISHED_ATTEMPT
from counterfactory.generation.sampling import Cell
from counterfactory.generation.sources import PreparedSource
from counterfactory.manifests.ledger import Attempt, Candidate
from counterfactory.manifests.vocabulary import FAILED, OK, REFUSED, REJECTED
from counterfactory.validation.gate_stack import GateStack
from counterfactory.validation.gates.locality import FLOOR_CONTEXT, FLOOR_IMAGE, FloorContext
from counterfactory.validation.judging import (
    FLOOR_VERDICT,
    Judged,
    judge_alone,
    judge_cohort,
    judge_output,
    no_source_mode,
)


def floor_image(ws: Workspace, floor: Mapping[str, Any] | None) -> np.ndarray | None:
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

    ``ws`` is the run's workspace (its ``ledger`` and ``store``). It lives in the engine: it writes
    to the ledger; what it judges with (:func:`~counterfactory.validation.judging.judge_output`,
    ``judge_alone``, ``judge_cohort``) is the validation layer's, which writes nothing."""

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
        #: the floor output itself (registered to the source), read once from the store: the
        #: locality gate compares every cell's output with it pixel by pixel
        self.floor_image = floor_image(ws, self.floor)
        #: what the locality gate derives from that output, made once for the template's cells
        #: (the caller's context object: no measure keeps a cache of its own)
        self.floor_context = FloorContext(self.floor_image) if self.floor_image is not None else None
        self.as_floor = as_floor
        #: None: judged against the source; else the set has no source photo
        #: (:func:`~counterfactory.validation.judging.judge_alone`), and this says whether a pass of the remaining gates is accepted
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
        the cohort floor (:func:`~counterfactory.validation.judging.judge_cohort`): each output against the median of the other
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
