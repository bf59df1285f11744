"""Peak memory of one template against its number of cells, with an instant editor.

Two stages of :func:`~counterfactory.flows.engine.template.process_template`, each run by the flow's own
code in a fresh process per size, so each reports its own peak RSS:

- edit: the template's attempts are planned and edited
  (:func:`~counterfactory.generation.attempts.plan_attempts`, :func:`~counterfactory.flows.engine.execute.run_edits`);
  the editor returns a fresh copy of its input at once, so what grows with the cell count is
  the orchestration's own memory (the issue this answers: a 3000 x 2 grid reached 11.6 GB);
- judge: every stored output of that template is aligned (SIFT + RANSAC + ECC, the real
  registration) and judged (:func:`~counterfactory.flows.engine.execute.judge_attempts`), one at a time,
  and its candidate recorded. Gates are off unless ``--gates`` (then every default face gate
  runs: about a second per cell on 2 cores).

The script prints each size's peaks and the ratio of the largest size's to the smallest's per
stage (target: 1.0 within 10 %).

The photo is the bundled ``grace_hopper.jpg``; the design has one axis with N values, so one
template gets N cells.

Usage (from the repository root)::

    .venv/bin/python benchmarks/template_memory.py [--cells 100 3000] [--gates]
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


def one_size(cells: int, stage: str, root: Path, gates: bool) -> dict:
    """Run one stage of one template of ``cells`` cells in this process, in ``root`` (the
    judge stage reads what the edit stage left there); returns peak RSS and timings."""
    import yaml

    from counterfactory.flows.engine import execute, run_folder, sources
    from counterfactory.flows.engine.spec import load_spec
    from counterfactory.generation.attempts import plan_attempts

    photos = REPO / "assets" / "photos"
    if stage == "edit":
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
            "release": {"name": "memory"},
        }
        if not gates:
            off = ("face", "identity", "expression", "locality", "skin")
            spec_data["gates"] = {"face": dict.fromkeys(off)}
        (root / "spec.yaml").write_text(yaml.safe_dump(spec_data, sort_keys=False))
    spec = load_spec(root / "spec.yaml")
    ws = run_folder.open_workspace(spec, root / "out")
    prepared, _ = sources.prepare_sources(spec, ws.ledger)
    grid = sources.plan_grid(spec, prepared)
    template_cells = grid.cells_of(prepared[0].id)
    assert len(template_cells) == cells, len(template_cells)
    editor = InstantEditor()
    stack = execute.build_gate_stack(spec) if stage == "judge" else None
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    plans = plan_attempts(spec, prepared[0], template_cells, editor, editor.lineage(), 1)
    if stage == "edit":
        calls = execute.run_edits(ws, editor, plans, editor.lineage())
        verdicts = {}
    else:
        calls = 0
        judged = execute.judge_attempts(spec, ws, prepared[0], plans, stack, execute.judge_key(spec))
        verdicts = {}
        for verdict, _ in judged:
            verdicts[verdict] = verdicts.get(verdict, 0) + 1
    seconds = time.perf_counter() - started
    ws.ledger.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "cells": cells,
        "stage": stage,
        "editor_calls": calls,
        "verdicts": verdicts,
        "peak_rss_mb": round(peak / 1024, 1),
        "baseline_rss_mb": round(baseline / 1024, 1),
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, nargs="+", default=[100, 3000])
    parser.add_argument("--gates", action="store_true", help="judge with every default face gate")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--stage", choices=("edit", "judge"), help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one_size(args.one, args.stage, Path(args.root), args.gates)))
        return
    rows: dict[str, list[dict]] = {"edit": [], "judge": []}
    for cells in args.cells:
        with tempfile.TemporaryDirectory(prefix="cf-memory-") as tmp:
            for stage in ("edit", "judge"):
                command = [sys.executable, __file__, "--one", str(cells), "--stage", stage, "--root", tmp]
                out = subprocess.run(
                    command + (["--gates"] if args.gates else []), cwd=REPO, capture_output=True, text=True, check=True
                )
                row = json.loads(out.stdout.strip().splitlines()[-1])
                rows[stage].append(row)
                print(
                    f"{row['cells']:>6} cells, {stage:>5} stage: peak RSS {row['peak_rss_mb']:8.1f} MB "
                    f"(before the stage {row['baseline_rss_mb']:.1f} MB), {row['seconds']:.1f} s"
                    + (f", verdicts {row['verdicts']}" if stage == "judge" else ""),
                    flush=True,
                )
    for stage, measured in rows.items():
        small, large = measured[0], measured[-1]
        print(
            f"{stage} stage peak ratio {large['cells']} / {small['cells']} cells: "
            f"{large['peak_rss_mb'] / small['peak_rss_mb']:.3f} (target 1.00 +- 0.10)"
        )


if __name__ == "__main__":
    main()
