"""A FOCUS-size run: 48 templates x 10 conditions (480 cells) with the classical editor.

``assets/specs/focus.yaml``'s shape (5 races x 2 genders, its prompt, every default gate) on
distinct copies of the bundled one-face photos at 512 px, with the CPU ``classical`` editor
instead of Qwen-Image-Edit. Each size runs ``counterfactory run SPEC --out DIR --publish
--allow-incomplete`` in a fresh interpreter (imports, Prefect, sources, editing, alignment,
gates, the release with its contact sheets). Prints wall time and cells per second per size,
and the ratio of time per cell at the largest size to time per cell at the smallest (target
<= 1.1: nothing grows faster than the work). The small size defaults to 8 templates (80
cells), one copy of each bundled photo, so both sizes have the same mix of photos.

Usage (from the repository root; the 480-cell run takes tens of minutes on 2 cores)::

    .venv/bin/python benchmarks/focus_scale.py [--templates 8 48] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synthetic  # noqa: E402
from workers_scaling import focus_like_spec  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--templates", type=int, nargs="+", default=[8, 48])
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cf-focus-") as tmp:
        root = Path(tmp)
        env = {**os.environ, "PREFECT_HOME": str(root / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        per_cell = {}
        for templates in args.templates:
            folder = root / f"t{templates}"
            spec = focus_like_spec(folder, templates, name="focus-bench")
            command = [sys.executable, "-m", "counterfactory", "run", str(spec), "--out", str(folder / "out")]
            command += ["--no-progress", "--publish", "--allow-incomplete", "--workers", str(args.workers)]
            started = time.perf_counter()
            done = subprocess.run(command, cwd=synthetic.REPO, capture_output=True, text=True, env=env, check=False)
            seconds = time.perf_counter() - started
            if done.returncode != 0:
                raise RuntimeError(f"{templates} templates failed ({done.returncode}):\n{done.stderr[-4000:]}")
            cells = templates * 10
            per_cell[templates] = seconds / cells
            counts = next(line for line in done.stdout.splitlines() if line.startswith("cells:"))
            print(f"{cells} cells: {seconds:.1f} s, {cells / seconds:.2f} cells/s ({counts})", flush=True)
        small, large = min(args.templates), max(args.templates)
        print(
            f"time per cell at {large * 10} cells / at {small * 10} cells: {per_cell[large] / per_cell[small]:.2f} "
            "(target <= 1.1)"
        )


if __name__ == "__main__":
    main()
