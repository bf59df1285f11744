"""The factory's words for what became of an attempt and of its candidate, spelled once.

Every module compares and writes verdicts and statuses through these names; the strings are what
ledgers, releases, reports and JSON schemas store, unchanged (a release written before this module
existed reads the same). Plain ``str`` constants, not an enum: they pass through SQL, Parquet,
YAML and JSON as the very strings they always were. ``tests/manifests/test_vocabulary.py`` checks
that no other module spells one of them in a comparison.

Verdicts (a candidate's, :class:`~counterfactory.manifests.ledger.Candidate`, and a released
item's ``status``):

- :data:`ACCEPTED`: every gate passed; the cell is filled and the item released.
- :data:`NEEDS_REVIEW`: the gates doubt; the cell is filled and a person decides.
- :data:`REJECTED`: a gate failed; the cell's next attempt is run.
- :data:`FAILED`: nothing could be judged (the editor failed, or a gate could not measure).
- :data:`NOT_RUN`: a cell the run never reached (publishing only).
- :data:`FLOOR`: the candidate of a template's noise-floor request, never an item.

Attempt statuses (a ledger attempt's, and a paid answer's): :data:`OK` (an output came back),
:data:`REFUSED` (the backend declined), :data:`FAILED`, :data:`RUNNING` (claimed, not finished).

Review: a person's :data:`ACCEPT` or :data:`REJECT` makes the item :data:`ACCEPTED` or
:data:`REJECTED` (:data:`OUTCOME`); :data:`SKIP` decides nothing.
"""

from __future__ import annotations

from typing import Final, Literal

ACCEPTED: Final = "accepted"
NEEDS_REVIEW: Final = "needs_review"
REJECTED: Final = "rejected"
FAILED: Final = "failed"
NOT_RUN: Final = "not_run"
FLOOR: Final = "floor"

#: a candidate's verdict
Verdict = Literal["accepted", "rejected", "needs_review", "failed"]
#: every verdict a gate stack gives, in report order
VERDICTS: Final[tuple[Verdict, ...]] = (ACCEPTED, NEEDS_REVIEW, REJECTED, FAILED)
#: verdicts that fill a cell (review is a person's job, not another seed's)
FILLING_VERDICTS: Final[tuple[str, ...]] = (ACCEPTED, NEEDS_REVIEW)

OK: Final = "ok"
REFUSED: Final = "refused"
RUNNING: Final = "running"
#: attempt statuses that are final: never run again
FINISHED_ATTEMPT: Final[tuple[str, ...]] = (OK, REFUSED)

ACCEPT: Final = "accept"
REJECT: Final = "reject"
SKIP: Final = "skip"
#: a reviewer's decisions
DECISIONS: Final[tuple[str, ...]] = (ACCEPT, REJECT, SKIP)
#: what a standing decision makes of the item
OUTCOME: Final = {ACCEPT: ACCEPTED, REJECT: REJECTED}

#: the words :mod:`tests.manifests.test_vocabulary` finds spelled in comparisons elsewhere
WORDS: Final[frozenset[str]] = frozenset((*VERDICTS, NOT_RUN, OK, REFUSED, RUNNING))
