"""``--workers 2`` vs ``--workers 1`` on the same 90-cell spec, measured in one run.

The spec: 9 templates x 10 conditions (FOCUS's 5 races x 2 genders and its prompt) on distinct
copies of the bundled one-face photos at 512 px, the ``classical`` editor and every default
gate: the real per-cell work (edit, align, five gates, two PNG writes, the ledger). Each
setting runs ``counterfactory run SPEC --out DIR --workers N`` in a fresh interpreter into its
own folder, timed from the outside (imports, Prefect's start-up and the serial source checks
included, as a user sees them). Prints both wall times, cells per second and the speed-up
``t(1) / t(2)`` (target >= 1.7 on an otherwise idle 2-core machine), and the cores each run
kept busy (CPU seconds / wall seconds).

Usage (from the repository root)::

    .venv/bin/python benchmarks/workers_scaling.py [--templates 9] [--workers 1 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synthetic  # noqa: E402

FOCUS_AXES = {"race": ["White", "Black", "East Asian", "South Asian", "Latino"], "gender": ["male", "female"]}


def focus_like_spec(root: Path, templates: int, *, side: int = 512, name: str = "bench") -> Path:
    """FOCUS's axes, prompt and gates with the classical editor on ``templates`` distinct photos."""
    import yaml

    metadata = synthetic.make_photos(root / "photos", templates, side=side)
    spec = synthetic.write_spec(
        root / "spec.yaml",
        photos=root / "photos",
        metadata=metadata,
        conditions=10,
        templates=templates,
        backend="classical",
        name=name,
    )
    data = yaml.safe_load(spec.read_text())
    data["design"]["axes"] = FOCUS_AXES
    data["prompts"] = {"face": "face_only_v1"}
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    return spec


def timed_run(spec: Path, out: Path, workers: int, env: dict[str, str]) -> tuple[float, str, float]:
    """Wall seconds, stdout and CPU seconds (user + system) of one ``counterfactory run``."""
    command = [sys.executable, "-m", "counterfactory", "run", str(spec), "--out", str(out), "--no-progress"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [*command, "--workers", str(workers)], cwd=synthetic.REPO, capture_output=True, text=True, env=env, check=False
    )
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"--workers {workers} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, done.stdout, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--templates", type=int, default=9)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cf-workers-") as tmp:
        root = Path(tmp)
        env = {**os.environ, "PREFECT_HOME": str(root / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        spec = focus_like_spec(root, args.templates)
        cells = args.templates * 10
        # a one-template warm-up, not timed: Prefect's database is created and migrated once, as
        # on any machine that has run a flow before
        timed_run(focus_like_spec(root / "warm-up", 1), root / "warm-up" / "out", 1, env)
        seconds = {}
        for workers in args.workers:
            seconds[workers], stdout, cpu = timed_run(spec, root / f"out-{workers}", workers, env)
            calls = next(line for line in stdout.splitlines() if line.startswith("editor calls"))
            # cores used = CPU seconds / wall seconds: a --workers 1 run near 2 already keeps both
            # cores busy (library threads), which bounds what a second worker can add
            print(
                f"--workers {workers}: {seconds[workers]:.1f} s, {cells / seconds[workers]:.2f} cells/s, "
                f"cores used {cpu / seconds[workers]:.2f} of {os.cpu_count()} ({calls})"
            )
        base = min(args.workers)
        for workers in args.workers:
            if workers != base:
                print(f"speed-up --workers {workers} vs {base}: {seconds[base] / seconds[workers]:.2f} (target >= 1.7)")


if __name__ == "__main__":
    main()
