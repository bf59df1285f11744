"""Attempts: what one editor request for one cell is, and its content-addressed id.

An attempt id is the sha256 of everything that decides the attempt's output (DESIGN.md,
"Attempt"): the source's bytes, the cell's condition, the design's kind, the editor's lineage
and the request inputs the backend reads (prompt, negative prompt, seed, edit mask). The ledger
keys every attempt by it, so a finished attempt is never run (or paid for) again.

Pure functions over their arguments: no ledger, no store, no Prefect.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from counterfactory.generation.editors import Editor, EditRequest
from counterfactory.generation.prompts import RenderedPrompt, render_prompt
from counterfactory.generation.sampling import Cell

# what a ledger attempt's status means lives with the cell lifecycle (the bottom layer);
# named here too for the modules that read it with the attempts
from counterfactory.manifests.lifecycle import FINISHED_ATTEMPT, attempt_finished, attempt_pending  # noqa: F401

if TYPE_CHECKING:
    from counterfactory.generation.sources import PreparedSource, Source

    # the study spec is the engine's (flows/engine/spec.py), which this layer does not name
    Spec = Any

#: what an editor may read from an :class:`EditRequest` besides the source, kind and condition
#: (always hashed); :meth:`Editor.consumes` names the subset a backend uses for a kind
EDITOR_INPUTS = frozenset({"prompt", "negative_prompt", "seed", "mask"})


@dataclass(frozen=True)
class PlannedAttempt:
    """One cell's attempt number ``attempt_no``: its id, the editor request and the rendered prompt.

    The request is built when first asked for (``build_request``, a :func:`source_request`
    partial): its image is the source's pixels, and a caller that needs the ids alone (a settled
    re-run, publishing from the ledger) decodes no photo.
    """

    cell: Cell
    attempt_no: int
    attempt_id: str
    build_request: Callable[[], EditRequest] = field(repr=False, compare=False)
    prompt: RenderedPrompt

    @functools.cached_property
    def request(self) -> EditRequest:
        return self.build_request()


def source_request(source: Source, **fields: Any) -> EditRequest:
    """The :class:`EditRequest` of ``fields`` with ``source``'s pixels as its image."""
    return EditRequest(image=source.pixels, **fields)


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


def region_sha256(region: np.ndarray) -> str:
    """The edit region's hash, as attempt ids take it."""
    return hashlib.sha256(np.ascontiguousarray(region).tobytes()).hexdigest()


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
    region_sha = region_sha256(region)
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
        request = functools.partial(
            source_request,
            prepared.source,
            attempt_id=aid,
            prompt=prompt.text,
            seed=seed,
            kind=kind,
            mask=region,
            condition=dict(cell.condition),
            negative_prompt=spec.prompts.negative,
        )
        plans.append(PlannedAttempt(cell, attempt_no, aid, request, prompt))
    return plans
