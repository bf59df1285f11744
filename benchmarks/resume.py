"""Resume cost: the demo's first run vs its re-run, and a finished ~1,000-cell spec's re-run.

Every run is the command a user types (``counterfactory run SPEC --out DIR --publish
--allow-incomplete``) in a fresh interpreter, timed from the outside, imports included; the
large spec's runs go through a tiny wrapper that registers an instant editor (returns its
input) first, because a plug-in backend must be imported before the command runs. The large
spec has 100 templates x 10 conditions on distinct copies of the bundled photos, every gate off
and ``align.method: none`` (so that its first run takes minutes, not hours; a settled re-run
never judges). It prints:

- the demo's re-run / first run (target <= 0.25): a re-run of a finished spec is a resume;
- the large spec's re-run / the demo's re-run (target <= 2): resume cost must not grow with
  the work already done.

Usage (from the repository root)::

    .venv/bin/python benchmarks/resume.py [--templates 100] [--conditions 10]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--templates", type=int, default=100)
    parser.add_argument("--conditions", type=int, default=10)
    args = parser.parse_args()
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

        cells = args.templates * args.conditions
        metadata = synthetic.make_photos(root / "photos", args.templates, side=256)
        spec = synthetic.write_spec(
            root / "large.yaml",
            photos=root / "photos",
            metadata=metadata,
            conditions=args.conditions,
            templates=args.templates,
            gates=synthetic.NO_GATES,
            align={"method": "none"},
            name="large",
        )
        large_first, _ = timed_run(spec, root / "large", env=env, instant=True)
        print(f"{cells}-cell first run (instant editor, gates off): {large_first:.1f} s", flush=True)
        large_rerun, stdout = timed_run(spec, root / "large", env=env, instant=True)
        assert "editor calls: 0" in stdout, stdout
        print(f"{cells}-cell re-run: {large_rerun:.1f} s", flush=True)
        print(f"demo re-run / first run: {rerun / first:.3f} (target <= 0.25)")
        print(f"{cells}-cell re-run / demo re-run: {large_rerun / rerun:.2f} (target <= 2)")


if __name__ == "__main__":
    main()
