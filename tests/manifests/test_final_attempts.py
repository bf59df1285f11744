"""The review queue's "final attempt" is the lifecycle's: ``final_attempts`` over a ledger agrees
with :func:`~counterfactory.manifests.lifecycle.fill_cells` over the attempts that ledger holds.

Every attempt history the lifecycle can produce is written to one ledger as a run writes it
(attempts, their status, a candidate per judged attempt): filled at once or later, waiting for
review, exhausted, pending (a journalled paid request, or another run's attempt still running),
and attempts the ledger holds past the one that settled the cell (a later seed made before a
re-judgement filled an earlier one, or under an earlier, larger ``max_attempts``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from counterfactory.manifests.ledger import Ledger
from counterfactory.manifests.lifecycle import Settled, fill_cells
from counterfactory.manifests.review import final_attempts
from tests.manifests.review_fixtures import attempt_id

#: an attempt as the ledger ends up holding it
ACCEPTED, REJECTED, REVIEW, FAILED = "accepted", "rejected", "needs_review", "failed"
PENDING = "pending"  # failed with its paid request journalled: a later run fetches it
RUNNING = "running"  # another run is executing it

#: cell id -> the ledger's attempts 1, 2, ... of that cell
HISTORIES = {
    "a|race=Black|gender=male": [ACCEPTED],  # filled
    "a|race=White|gender=male": [REJECTED, ACCEPTED],  # filled by the next seed
    "a|race=Black|gender=female": [FAILED, REVIEW],  # waiting for a person
    "a|race=White|gender=female": [REJECTED, FAILED, REJECTED],  # exhausted
    "b|race=Black|gender=male": [PENDING],  # waits on its request, no next seed
    "b|race=White|gender=male": [REJECTED, PENDING, ACCEPTED],  # a seed past a pending one
    "b|race=Black|gender=female": [RUNNING],  # another run holds it
    "b|race=White|gender=female": [ACCEPTED, REJECTED],  # a later seed, then attempt 1 re-judged
    "c|race=Black|gender=male": [REVIEW, ACCEPTED, ACCEPTED],  # review fills: later seeds are not final
    "c|race=White|gender=male": [REJECTED, REJECTED, REJECTED, ACCEPTED],  # past the budget
    "c|race=Black|gender=female|editor=fal": [REJECTED, ACCEPTED],  # an editor with a budget of 1
    "c|race=White|gender=female|editor=fal": [PENDING, ACCEPTED],
}
BUDGET = {None: 3, "fal": 1}


def _write(ledger: Ledger) -> None:
    for cell_id, history in HISTORIES.items():
        for no, what in enumerate(history, start=1):
            aid = attempt_id(cell_id, no)
            ledger.start_attempt(aid, cell_id=cell_id, attempt_no=no, seed=no, backend="x", lineage={}, prompt="p")
            if what == RUNNING:
                continue
            status = "ok" if what in (ACCEPTED, REJECTED, REVIEW) else "failed"
            meta = {"pending_request_id": "req-1"} if what == PENDING else {}
            ledger.finish_attempt(aid, status=status, output_sha256="0" * 64 if status == "ok" else None, meta=meta)
            verdict = FAILED if what == PENDING else what
            ledger.record_candidate(
                aid, cell_id=cell_id, judge_key="k", image_sha256=aid if status == "ok" else None,
                alignment={}, verdict=verdict, reasons=[] if verdict == ACCEPTED else ["r"], gates={},
            )  # fmt: skip


def _what_the_lifecycle_ends_with() -> set[str]:
    """Each cell's final attempt by fill_cells over the histories themselves (not the ledger)."""

    def settled(what: str) -> Settled:
        if what in (PENDING, RUNNING):
            return Settled(FAILED, ["r"], pending=True)
        return Settled(what, [] if what == ACCEPTED else ["r"])

    finals = set()
    for label, budget in BUDGET.items():
        cells = [
            SimpleNamespace(cell_id=c, editor=label)
            for c in HISTORIES
            if (c.rsplit("|editor=", 1)[1] if "|editor=" in c else None) == label
        ]

        def plan(open_cells, attempt_no):
            return [
                SimpleNamespace(attempt_id=attempt_id(c.cell_id, attempt_no), cell=c, attempt_no=attempt_no)
                for c in open_cells
                if attempt_no <= len(HISTORIES[c.cell_id])
            ]

        def settle(plans):
            return {p.attempt_id: settled(HISTORIES[p.cell.cell_id][p.attempt_no - 1]) for p in plans}

        finals |= {o.final_attempt for o in fill_cells(cells, budget, plan, settle).values()}
    return finals


@pytest.fixture
def ledger(tmp_path):
    led = Ledger(f"sqlite:///{tmp_path / 'l.sqlite'}")
    yield led
    led.close()


def test_final_attempts_agree_with_the_lifecycle_for_every_history(ledger):
    _write(ledger)
    expected = _what_the_lifecycle_ends_with()
    assert final_attempts(ledger, max_attempts=BUDGET) == expected
    # the histories reach every way a cell ends
    assert attempt_id("b|race=Black|gender=male", 1) in expected  # pending: no next seed
    assert attempt_id("b|race=White|gender=male", 2) in expected  # pending after a rejection
    assert attempt_id("b|race=Black|gender=female", 1) in expected  # running elsewhere
    assert attempt_id("b|race=White|gender=female", 1) in expected  # filled, a later seed held
    assert attempt_id("c|race=Black|gender=male", 1) in expected  # review fills the cell
    assert attempt_id("a|race=White|gender=female", 3) in expected  # exhausted: the last one
    assert attempt_id("c|race=White|gender=male", 3) in expected  # the budget, not the ledger
    assert attempt_id("c|race=Black|gender=female|editor=fal", 1) in expected  # that editor's budget


def test_one_cells_answer_is_the_same_read_alone(ledger):
    _write(ledger)
    everything = final_attempts(ledger, max_attempts=BUDGET)
    for cell_id in HISTORIES:
        alone = final_attempts(ledger, [cell_id], max_attempts=BUDGET)
        assert alone == {a for a in everything if a in {attempt_id(cell_id, n) for n in range(1, 6)}}


def test_without_a_budget_every_attempt_the_ledger_holds_counts(ledger):
    _write(ledger)
    assert attempt_id("c|race=White|gender=male", 4) in final_attempts(ledger)
