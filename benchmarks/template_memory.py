"""Peak memory of one template against its number of cells, with an instant editor.

A template's attempts are planned and edited by the flow's own code
(:func:`counterfactory.flows.steps.plan_attempts` and :func:`~counterfactory.flows.steps.run_edits`,
the stage of :func:`~counterfactory.flows.steps.process_template` that held every output of a
template until all were done); the editor returns a fresh copy of its input at once, so what
grows with the cell count is the orchestration's own memory. The issue this answers: a
3000 x 2 grid reached 11.6 GB. Each size runs in a fresh process and reports its peak RSS;
the script prints each size's peak and the ratio of the largest to the smallest (target: 1.0
within 10 %).

The photo is the bundled ``grace_hopper.jpg``; the design has one axis with N values, so one
template gets N cells. Judging is left out: it aligns one stored output at a time (seconds per
cell on a loaded CPU), which would make 3000 cells take hours without adding memory.

Usage (from the repository root)::

    .venv/bin/python benchmarks/template_memory.py [--cells 100 3000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class InstantEditor:
    """Returns the source unchanged, at once: an editor that costs nothing."""

    name = "instant"
    batch_size = 1

    def lineage(self):
        return {"backend": self.name}

    def prepare(self):
        return None

    def edit(self, request):
        from counterfactory.generation.editors.base import EditResult

        # a fresh array per call, as a real editor returns: holding them all is what grew
        return EditResult(request.attempt_id, "ok", image=request.image.copy())

    def edit_many(self, requests, journal=None):
        return [self.edit(r) for r in requests]


def one_size(cells: int) -> dict:
    """Run one template of ``cells`` cells in this process; returns peak RSS and timings."""
    import yaml

    from counterfactory.flows import steps
    from counterfactory.manifests.spec import load_spec

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        photos = REPO / "assets" / "photos"
        (root / "meta.yaml").write_text(
            yaml.safe_dump(
                {"sources": [{"id": "grace", "path": "grace_hopper.jpg", "licence": "PD", "occupation": "officer"}]}
            )
        )
        spec_data = {
            "name": "memory",
            "sources": {"photos": str(photos), "metadata": str(root / "meta.yaml")},
            "design": {
                "kind": "face",
                "axes": {"race": [f"group{i}" for i in range(cells)]},
                "strata": [],
                "templates_per_stratum": 1,
            },
            "prompts": {"target_group": "{article} {race} person"},
            "editor": {"max_attempts": 1},
            "gates": {"face": {"face": None, "identity": None, "expression": None, "locality": None}},
            "release": {"name": "memory"},
        }
        (root / "spec.yaml").write_text(yaml.safe_dump(spec_data, sort_keys=False))
        spec = load_spec(root / "spec.yaml")
        ws = steps.open_workspace(spec, root / "out")
        prepared, _ = steps.prepare_sources(spec, ws.ledger)
        grid = steps.plan_grid(spec, prepared)
        template_cells = grid.cells_of(prepared[0].id)
        assert len(template_cells) == cells, len(template_cells)
        baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        editor = InstantEditor()
        plans = steps.plan_attempts(spec, prepared[0], template_cells, editor, editor.lineage(), 1)
        calls = steps.run_edits(ws, editor, plans, editor.lineage())
        seconds = time.perf_counter() - started
        ws.ledger.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "cells": cells,
        "editor_calls": calls,
        "peak_rss_mb": round(peak / 1024, 1),
        "baseline_rss_mb": round(baseline / 1024, 1),
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, nargs="+", default=[100, 3000])
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one_size(args.one)))
        return
    rows = []
    for cells in args.cells:
        out = subprocess.run(
            [sys.executable, __file__, "--one", str(cells)], cwd=REPO, capture_output=True, text=True, check=True
        )
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(
            f"{row['cells']:>6} cells: peak RSS {row['peak_rss_mb']:8.1f} MB "
            f"(before the template {row['baseline_rss_mb']:.1f} MB), {row['seconds']:.1f} s"
        )
    small, large = rows[0], rows[-1]
    print(
        f"peak ratio {large['cells']} / {small['cells']} cells: {large['peak_rss_mb'] / small['peak_rss_mb']:.3f} "
        "(target 1.00 +- 0.10)"
    )


if __name__ == "__main__":
    main()
