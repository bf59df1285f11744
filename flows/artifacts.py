"""Progress and results as Prefect artifacts, beside the command line's progress bar.

A run shows in the Prefect UI (or through its API) as:

- ``<spec>-progress``: a progress artifact, the share of cells done, updated as templates finish;
- ``<spec>-cells``: a table of cells per condition group and status (``accepted``,
  ``needs_review``, ``rejected``, ``failed``), one row per group and one for all cells;
- ``<spec>-report``: a link to the release's ``report.html`` when the run published one;
- ``<spec>-summary``: a short markdown summary (counts, editor calls, release path).

The tables are plain functions of the run's outcomes (:func:`counts_table`), so the artifact
and the ledger agree by construction.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from counterfactory.manifests.lifecycle import TemplateOutcome
from counterfactory.validation.gates.base import VERDICTS

#: seconds between two updates of the progress artifact (each is one API call)
PROGRESS_EVERY_S = 2.0


def artifact_key(spec_name: str, what: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) for ``what`` of a spec."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{spec_name}-{what}".lower()).strip("-")
    return slug or what


def group_label(condition: dict[str, str]) -> str:
    """``race=Black|gender=female``: a condition group as the release's stats name it."""
    return "|".join(f"{k}={v}" for k, v in condition.items())


def counts_table(outcomes: Sequence[TemplateOutcome]) -> list[dict[str, Any]]:
    """One row per condition group (in first-seen order) and a last row ``all``: the group,
    ``cells``, and the number of cells in each verdict (``accepted``, ``needs_review``,
    ``rejected``, ``failed``)."""
    rows: dict[str, dict[str, Any]] = {}
    total = {"group": "all", "cells": 0, **{v: 0 for v in VERDICTS}}
    for outcome in outcomes:
        for cell in outcome.cells:
            label = group_label(dict(cell.cell.condition))
            row = rows.setdefault(label, {"group": label, "cells": 0, **{v: 0 for v in VERDICTS}})
            for slot in (row, total):
                slot["cells"] += 1
                slot[cell.verdict] = slot.get(cell.verdict, 0) + 1
    return [*rows.values(), total]


def summary_markdown(
    spec_name: str, table: Sequence[dict[str, Any]], *, editor_calls: int, release_path: Path | None
) -> str:
    """A short markdown summary of a run: counts per verdict, editor calls, where the release is."""
    total = table[-1]
    lines = [f"# {spec_name}", ""]
    lines.append(" | ".join(f"{v}: {total.get(v, 0)}" for v in VERDICTS) + f" | cells: {total['cells']}")
    lines.append("")
    lines.append(f"editor calls this run: {editor_calls}")
    lines.append("")
    if release_path is None:
        lines.append("not published")
    else:
        lines.append(f"release: `{release_path}` ([report]({(release_path / 'report.html').as_uri()}))")
    return "\n".join(lines) + "\n"


class ProgressArtifact:
    """A Prefect progress artifact for one run's cells; :meth:`advance` as templates finish.

    Updates are throttled to one every :data:`PROGRESS_EVERY_S` seconds (and always the last),
    so a run of many small templates does not spend its time on API calls.
    """

    def __init__(self, spec_name: str, total_cells: int) -> None:
        from prefect.artifacts import create_progress_artifact

        self.total = max(1, total_cells)
        self.done = 0
        self._last = time.monotonic()
        self.id = create_progress_artifact(
            0.0, key=artifact_key(spec_name, "progress"), description=f"cells done of {total_cells}"
        )

    def advance(self, cells: int) -> None:
        self.done += cells
        now = time.monotonic()
        if self.done >= self.total or now - self._last >= PROGRESS_EVERY_S:
            from prefect.artifacts import update_progress_artifact

            self._last = now
            update_progress_artifact(self.id, min(100.0, 100.0 * self.done / self.total))


def publish_artifacts(
    spec_name: str,
    outcomes: Sequence[TemplateOutcome],
    *,
    editor_calls: int,
    release_path: Path | None,
) -> list[dict[str, Any]]:
    """Create the run's table, summary and (when a release was sealed) report-link artifacts
    on the current flow run; returns the table's rows."""
    from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

    table = counts_table(outcomes)
    create_table_artifact(
        table, key=artifact_key(spec_name, "cells"), description="cells per condition group and verdict"
    )
    create_markdown_artifact(
        summary_markdown(spec_name, table, editor_calls=editor_calls, release_path=release_path),
        key=artifact_key(spec_name, "summary"),
        description="what this run did",
    )
    if release_path is not None:
        create_link_artifact(
            (release_path / "report.html").as_uri(),
            link_text=f"report: {release_path.parent.name} {release_path.name}",
            key=artifact_key(spec_name, "report"),
            description="the release's report",
        )
    return table
