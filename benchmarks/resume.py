"""Resume cost: the demo's first run vs its re-run, and finished 1,000- and 10,000-cell specs' re-runs.

Every run is the command a user types (``counterfactory run SPEC --out DIR --publish
--allow-incomplete``) in a fresh interpreter, timed from the outside, imports included; the
large specs' runs go through a tiny wrapper that registers an instant editor (returns its
input) first, because a plug-in backend must be imported before the command runs. A large spec
has ``--templates`` templates (each a distinct copy of a bundled photo) x ``--conditions``
conditions, every gate off and ``align.method: none`` (so that its first run takes minutes, not
hours; a settled re-run never judges). It prints:

- the demo's re-run / first run (target <= 0.25): a re-run of a finished spec is a resume;
- each large spec's re-run / the demo's re-run (targets: 1,000 cells <= 1.15, 10,000 cells <=
  1.3): resume cost must not grow with the work already done.

Usage (from the repository root)::

    .venv/bin/python benchmarks/resume.py [--templates 100 1000] [--conditions 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synthetic  # noqa: E402

WRAPPER = """
import sys
sys.path.insert(0, {bench!r})
import synthetic
synthetic.register_instant_editor()
from counterfactory.flows.cli import main
main(sys.argv[1:], prog_name="counterfactory")
"""


def timed_run(spec: Path, out: Path, *, env: dict[str, str], instant: bool = False) -> tuple[float, str]:
    """Wall seconds of one ``counterfactory run`` in a fresh interpreter, and its stdout."""
    args = ["run", str(spec), "--out", str(out), "--no-progress", "--publish", "--allow-incomplete"]
    if instant:
        command = [sys.executable, "-c", WRAPPER.format(bench=str(Path(__file__).resolve().parent)), *args]
    else:
        command = [sys.executable, "-m", "counterfactory", *args]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=synthetic.REPO, capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return seconds, done.stdout


#: re-run / demo re-run targets by cell count (issue 45)
TARGETS = {1_000: 1.15, 10_000: 1.3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--templates", type=int, nargs="+", default=[100, 1000], help="one large spec per value")
    parser.add_argument("--conditions", type=int, default=10)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    figures: dict = {"conditions": args.conditions, "large": []}
    with tempfile.TemporaryDirectory(prefix="cf-resume-") as tmp:
        root = Path(tmp)
        env = {
            **os.environ,
            "PREFECT_HOME": str(root / "prefect-home"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        }
        demo = synthetic.REPO / "assets" / "specs" / "demo-face.yaml"
        first, _ = timed_run(demo, root / "demo", env=env)
        print(f"demo first run: {first:.1f} s", flush=True)
        rerun, stdout = timed_run(demo, root / "demo", env=env)
        assert "editor calls: 0" in stdout, stdout
        print(f"demo re-run:    {rerun:.1f} s", flush=True)
        figures.update(demo_first_s=round(first, 2), demo_rerun_s=round(rerun, 2), demo_ratio=round(rerun / first, 3))

        for templates in args.templates:
            cells = templates * args.conditions
            folder = root / f"large-{templates}"
            metadata = synthetic.make_photos(folder / "photos", templates, side=256)
            spec = synthetic.write_spec(
                folder / "large.yaml",
                photos=folder / "photos",
                metadata=metadata,
                conditions=args.conditions,
                templates=templates,
                gates=synthetic.NO_GATES,
                align={"method": "none"},
                name="large",
            )
            large_first, _ = timed_run(spec, folder / "out", env=env, instant=True)
            print(f"{cells}-cell first run (instant editor, gates off): {large_first:.1f} s", flush=True)
            large_rerun, stdout = timed_run(spec, folder / "out", env=env, instant=True)
            assert "editor calls: 0" in stdout, stdout
            print(f"{cells}-cell re-run: {large_rerun:.1f} s", flush=True)
            target = TARGETS.get(cells)
            ratio = large_rerun / rerun
            print(f"{cells}-cell re-run / demo re-run: {ratio:.2f}" + (f" (target <= {target})" if target else ""))
            figures["large"].append(
                {"templates": templates, "cells": cells, "first_s": round(large_first, 2),
                 "rerun_s": round(large_rerun, 2), "rerun_over_demo_rerun": round(ratio, 3), "target": target}
            )  # fmt: skip
    print(f"demo re-run / first run: {rerun / first:.3f} (target <= 0.25)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
