"""Where a template's edits and judgements run: one small interface, two places.

An executor is :class:`Executor`: ``edit(ws, editor, plans, lineage, on_output)`` returns the
editor calls it made and commits every result to the ledger and the store; ``judge(spec, ws,
prepared, plans, stack, jkey, floor, as_floor)`` returns ``(verdict, reasons)`` per planned
attempt. An executor that can hand each committed output to ``on_output`` as it returns (this
process) does, and then returns no verdict for it from ``judge``'s caller's point of view: the
template judges it from memory; one that cannot (Ray: outputs stay on the worker) leaves it to
``judge``. :func:`~counterfactory.flows.engine.template.process_template` calls the same two
methods whichever runs it. :class:`LocalExecutor` is this process; :class:`counterfactory.flows.ray.RayExecutor`
sends each batch to a Ray task.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from counterfactory.flows.engine import execute

#: ``on_output(attempt_id, image)``: an ``ok`` output, committed, handed back while still in memory
OnOutput = Callable[[str, np.ndarray], None]


class Executor(Protocol):
    """Where a template's edits and judgements run; the rest of the run is the same everywhere."""

    def edit(
        self, ws: Any, editor: Any, plans: Sequence[Any], lineage: dict[str, Any], *, on_output: OnOutput | None = None
    ) -> int:
        """Edit the planned attempts the ledger has not finished, committing each result to the
        ledger and the store (:func:`~counterfactory.flows.engine.execute.run_edits`); the
        number of editor calls. ``on_output`` is called with each output this process holds
        after it is committed (an executor whose outputs stay on another machine calls it never)."""
        ...

    def judge(
        self,
        spec: Any,
        ws: Any,
        prepared: Any,
        plans: Sequence[Any],
        stack: Any,
        jkey: str,
        floor: Mapping[str, Any] | None = None,
        as_floor: bool = False,
    ) -> list[tuple[str, list[str]]]:
        """``(verdict, reasons)`` per planned attempt, from the ledger and the store, recording each
        new candidate (:func:`~counterfactory.flows.engine.execute.judge_attempts`)."""
        ...


class LocalExecutor:
    """Edits and judgements in this process: each output is handed back as soon as it is
    committed, so the template judges it from the array the editor returned (one template's
    outputs are never all held, and nothing is read back from the store)."""

    def edit(self, ws, editor, plans, lineage, *, on_output: OnOutput | None = None) -> int:
        return execute.run_edits(ws, editor, plans, lineage, on_output=on_output)

    def judge(self, spec, ws, prepared, plans, stack, jkey, floor=None, as_floor=False):
        return execute.judge_attempts(spec, ws, prepared, plans, stack, jkey, floor, as_floor)


#: the executor of a run on one machine
LOCAL = LocalExecutor()
