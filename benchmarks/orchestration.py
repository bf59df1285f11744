"""The orchestration alone: a synthetic spec under Prefect vs a plain loop over the same steps.

A face spec of N cells (templates x ``--conditions``) on distinct copies of the bundled
one-face photos, with an instant editor (returns its input), every gate off and alignment
``method: none``, so what is left is the run's own machinery: planning, the ledger, the image
store, and, in the Prefect run, the flow, its tasks and its API server. Each size runs twice in
fresh processes: once through ``counterfactory.flows.resume.run_spec`` (Prefect, ``--workers``
threads; it starts Prefect's API in the process, as ``counterfactory run`` does) and once as a
plain Python loop calling the same step functions (``prepare_sources``, ``plan_grid``,
``process_template`` per template). It prints, per size, both wall times and their ratio
(target <= 1.5), the Prefect run's peak RSS at each size and their ratio (target: flat), and
the number of database-lock errors in the Prefect run's logs (target 0; the script exits 1
otherwise).

Usage (from the repository root)::

    .venv/bin/python benchmarks/orchestration.py [--cells 1000 10000] [--conditions 50] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synthetic  # noqa: E402

SIDE_PX = 256


def child(args: argparse.Namespace) -> dict:
    """One measured run in this (fresh) process."""
    from counterfactory.flows.engine import execute, run_folder, sources, template
    from counterfactory.flows.engine.spec import load_spec

    synthetic.register_instant_editor()
    spec_path, out = Path(args.spec), Path(args.out)
    started = time.perf_counter()
    if args.mode == "prefect":
        from counterfactory.flows.resume import run_spec

        summary = run_spec(spec_path, out, workers=args.workers, progress=False)
        cells, calls = sum(summary.counts.values()), summary.editor_calls
    else:
        spec = load_spec(spec_path)
        ws = run_folder.open_workspace(spec, out)
        prepared, _ = sources.prepare_sources(spec, ws.ledger, ws.store)
        grid = sources.plan_grid(spec, prepared)
        editor, stack = execute.build_editor(spec), execute.build_gate_stack(spec)
        cells = calls = 0
        for source in prepared:
            outcome = template.process_template(spec, ws, source, grid.cells_of(source.id), editor, stack)
            cells, calls = cells + len(outcome.cells), calls + outcome.editor_calls
        ws.ledger.close()
    return {
        "mode": args.mode,
        "cells": cells,
        "editor_calls": calls,
        "seconds": round(time.perf_counter() - started, 2),
        "peak_rss_mb": round(synthetic.peak_rss_mb(), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--conditions", type=int, default=50, help="cells per template")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--mode", choices=("prefect", "plain"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(child(args)))
        return
    with tempfile.TemporaryDirectory(prefix="cf-orchestration-") as tmp:
        root = Path(tmp)
        env = {"PREFECT_HOME": str(root / "prefect-home"), "PREFECT_LOGGING_LEVEL": "WARNING"}
        rows, lock_errors = [], 0
        for cells in args.cells:
            templates = max(1, cells // args.conditions)
            folder = root / f"n{cells}"
            metadata = synthetic.make_photos(folder / "photos", templates, side=SIDE_PX)
            spec = synthetic.write_spec(
                folder / "spec.yaml",
                photos=folder / "photos",
                metadata=metadata,
                conditions=args.conditions,
                templates=templates,
                gates=synthetic.NO_GATES,
                align={"method": "none"},
            )
            measured = {}
            for mode in ("plain", "prefect"):
                common = ["--spec", str(spec), "--workers", str(args.workers)]
                row, stderr = synthetic.run_child(
                    Path(__file__), ["--mode", mode, *common, "--out", str(folder / f"out-{mode}")], env=env
                )
                if mode == "prefect":
                    row["lock_errors"] = len(synthetic.LOCK_ERRORS.findall(stderr))
                    lock_errors += row["lock_errors"]
                measured[mode] = row
            plain, prefect = measured["plain"], measured["prefect"]
            assert plain["cells"] == prefect["cells"] == templates * args.conditions, (plain, prefect)
            rows.append((templates * args.conditions, plain, prefect))
            print(
                f"{templates * args.conditions:>6} cells ({templates} templates): plain loop {plain['seconds']:7.1f} s, "
                f"Prefect {prefect['seconds']:7.1f} s, ratio {prefect['seconds'] / plain['seconds']:.2f} "
                f"(target <= 1.5); Prefect peak RSS {prefect['peak_rss_mb']:.0f} MB "
                f"(plain {plain['peak_rss_mb']:.0f} MB); database-lock errors {prefect['lock_errors']}",
                flush=True,
            )
        if len(rows) > 1:
            small, large = rows[0][2], rows[-1][2]
            print(
                f"Prefect peak RSS {rows[-1][0]} / {rows[0][0]} cells: {large['peak_rss_mb'] / small['peak_rss_mb']:.3f} "
                "(target: flat, 1.00 +- 0.10)"
            )
        print(f"database-lock errors in the Prefect runs' logs: {lock_errors} (target 0)")
        if lock_errors:
            sys.exit(1)


if __name__ == "__main__":
    main()
