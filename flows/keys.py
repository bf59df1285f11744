"""Content keys Prefect sees: a template task is named by what decides its outcome.

Prefect's default task cache key hashes every argument, here photos and masks as arrays (slow,
and a key of pixels says nothing a person can check). The flow keeps Prefect's caching off
(the ledger decides what is done: an image lost from the store is rebuilt, which a cached task
result would hide) and names each template task by :func:`template_key` instead: the hash of
its cells' first attempt ids (each already hashes the source's sha256, the condition, the
editor's lineage, the prompt, the seed and the edit region), the retry budget and the judge
settings. Two task runs with the same name did the same work; the ledger holds the same ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from counterfactory.flows.engine.execute import judge_key
from counterfactory.flows.engine.spec import Spec
from counterfactory.generation.attempts import plan_attempts
from counterfactory.generation.sampling import Cell
from counterfactory.generation.sources import PreparedSource


def template_key(spec: Spec, prepared: PreparedSource, cells: Sequence[Cell], editor: Any) -> str:
    """sha256 hex of everything that decides one template's outcome (no pixels are hashed
    here: the attempt ids carry the source's and the region's sha256).

    Equal keys mean equal attempts (ids, seeds), equal ``editor.max_attempts`` and equal judge
    settings (:func:`~counterfactory.flows.engine.execute.judge_key`).
    """
    plans = plan_attempts(spec, prepared, cells, editor, editor.lineage(), 1)
    parts = sorted(p.attempt_id for p in plans)
    parts += [f"max_attempts={spec.editor.max_attempts}", f"judge={judge_key(spec)}"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
