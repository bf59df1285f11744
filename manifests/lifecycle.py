"""A cell's life: attempt 1, 2, ... until one fills it or its attempts run out.

This module owns the one loop over attempt numbers and the one rule for a cell. It sits in the
bottom layer so that every reader of the ledger derives a cell's final attempt from it: the run
(``flows/``) and the review queue (:func:`counterfactory.manifests.review.final_attempts`) alike. Each round plans the next attempt of
every open cell (:func:`~counterfactory.generation.attempts.plan_attempts`: seed
``editor.seed + n - 1``), asks a *policy* what each planned attempt came to, and decides per
cell with :func:`needs_next_attempt`. The three policies are short and live with their callers:

- running (:func:`counterfactory.flows.engine.template.process_template`): claim, edit, commit and judge
  each attempt (in this process or on Ray);
- resuming (:func:`counterfactory.flows.resume.settled_outcomes`): read each attempt and its
  candidate from the ledger, and stop at the first one that still needs work;
- publishing (:func:`counterfactory.flows.engine.outcomes.collect_outcomes`): read them from the ledger,
  with a cell the run never reached kept as ``not_run``;
- reviewing (:func:`counterfactory.manifests.review.final_attempts`): the ledger's attempts of
  each cell, numbered as the run numbered them.

Pure: no ledger, no store, no Prefect. Cells and planned attempts are whatever has a ``cell_id``
(and an ``editor`` label) and an ``attempt_id`` with its ``cell``
(:class:`~counterfactory.generation.sampling.Cell`,
:class:`~counterfactory.generation.attempts.PlannedAttempt`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from counterfactory.manifests.vocabulary import FAILED, FILLING_VERDICTS, FINISHED_ATTEMPT, RUNNING

# the words (spelled in manifests/vocabulary.py), kept importable from here
FILLED = FILLING_VERDICTS


class CellLike(Protocol):
    """What the lifecycle reads of a grid cell."""

    @property
    def cell_id(self) -> str: ...

    @property
    def editor(self) -> str | None: ...


class AttemptLike(Protocol):
    """What the lifecycle reads of a planned attempt."""

    @property
    def attempt_id(self) -> str: ...

    @property
    def cell(self) -> CellLike: ...


@dataclass
class CellOutcome:
    """Where a cell stands: its attempts in order, the last one, and that one's verdict."""

    cell: CellLike
    attempt_ids: list[str] = field(default_factory=list)
    final_attempt: str | None = None
    verdict: str = FAILED
    reasons: list[str] = field(default_factory=list)


@dataclass
class TemplateOutcome:
    template_id: str
    cells: list[CellOutcome]
    editor_calls: int = 0
    #: of ``editor_calls``, the template's noise-floor request ("return this photo unchanged")
    floor_calls: int = 0

    @property
    def editor(self) -> str | None:
        """The label of the editor that filled these cells (None: a one-editor spec's)."""
        return self.cells[0].cell.editor if self.cells else None

    @property
    def complete(self) -> bool:
        return all(c.verdict in FILLED for c in self.cells)


@dataclass(frozen=True)
class Settled:
    """What one planned attempt came to, as a policy found it.

    Attributes:
        verdict: the candidate's verdict, or ``failed`` (the editor failed, refused nothing).
        reasons: its reason codes.
        pending: its outcome is still coming (another run is executing it, or a paid remote
            request is journalled and will be fetched): the cell waits for it, no next seed.
    """

    verdict: str
    reasons: Sequence[str] = ()
    pending: bool = False


class AttemptStatus(Protocol):
    """What the lifecycle reads of a ledger attempt (:class:`~counterfactory.manifests.ledger.Attempt`)."""

    @property
    def status(self) -> str: ...

    @property
    def meta(self) -> dict | None: ...


def attempt_finished(attempt: AttemptStatus) -> bool:
    """Whether ``attempt`` is never run again: ``ok`` or ``refused`` (:data:`FINISHED_ATTEMPT`),
    or ``failed`` where its backend said running it again cannot change it (``meta["final"]``:
    the ``import`` backend's missing or unreadable candidate file, whose attempt id hashes the
    table as read)."""
    return attempt.status in FINISHED_ATTEMPT or (attempt.status == FAILED and bool((attempt.meta or {}).get("final")))


def attempt_pending(attempt: AttemptStatus) -> bool:
    """Whether ``attempt``'s outcome is still coming: another run is executing it (``running``),
    or it failed with its paid remote request journalled (``meta["pending_request_id"]``), so a
    later run fetches that request instead of buying the next seed."""
    return attempt.status == RUNNING or (
        attempt.status == FAILED and bool((attempt.meta or {}).get("pending_request_id"))
    )


def needs_next_attempt(settled: Settled) -> bool:
    """The one rule for a cell after an attempt: it is filled (accepted, or waiting for a
    person's review), it waits for an outcome still coming, or it gets the next seed."""
    return settled.verdict not in FILLED and not settled.pending


#: plans a round: ``(open cells, attempt number) -> planned attempts``
PlanRound = Callable[[Sequence[CellLike], int], Sequence[AttemptLike]]
#: settles a round: ``planned attempts -> {attempt id: Settled, or None}``; None: the attempt
#: was never made (a ledger without it), the cell stays as it is and gets no further attempt
SettleRound = Callable[[Sequence[AttemptLike]], Mapping[str, Settled | None]]


def fill_cells(
    cells: Sequence[CellLike],
    max_attempts: int,
    plan: PlanRound,
    settle: SettleRound,
    *,
    initial: Callable[[CellLike], CellOutcome] = CellOutcome,
) -> dict[str, CellOutcome]:
    """Every cell's outcome (by cell id, in ``cells``' order) after up to ``max_attempts`` rounds.

    ``plan`` makes the round's attempts for the cells still open; ``settle`` says what each
    came to (a policy may raise to stop early). A cell's attempt ids are listed once each (a
    seedless editor repeats its id), and its verdict is its last attempt's.
    """
    outcomes = {cell.cell_id: initial(cell) for cell in cells}
    open_cells = list(cells)
    for attempt_no in range(1, max_attempts + 1):
        if not open_cells:
            break
        plans = plan(open_cells, attempt_no)
        settled = settle(plans)
        open_cells = []
        for planned in plans:
            found = settled.get(planned.attempt_id)
            if found is None:
                continue
            out = outcomes[planned.cell.cell_id]
            if planned.attempt_id not in out.attempt_ids:
                out.attempt_ids.append(planned.attempt_id)
            out.final_attempt, out.verdict, out.reasons = planned.attempt_id, found.verdict, list(found.reasons)
            if needs_next_attempt(found):
                open_cells.append(planned.cell)
    return outcomes
