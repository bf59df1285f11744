"""The demo run with an empty re-render cache against the same run with the cache its first run
filled (``COUNTERFACTORY_RERENDER_CACHE``, :class:`counterfactory.generation.rerender.RerenderCache`):
CPU and wall seconds of each, and whether the two releases hold the same items.

    python benchmarks/rerender_cache.py [--spec assets/specs/demo-face.yaml] [--json]

Runs ``counterfactory run SPEC --out OUT --publish --allow-incomplete`` twice in fresh folders, each
in its own process (the CPU figures are the child's user + system time), the second reading the
round trips the first kept. What the cache saves is what every repeat of the same edits costs:
a second ``calibrate`` on the same corpus, the test suite's dozens of demo-shaped runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(spec: Path, out: Path, env: dict[str, str]) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "counterfactory", "run", str(spec), "--out", str(out), "--publish",
         "--allow-incomplete", "--no-progress"],
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"error: the run failed:\n{done.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": round(cpu, 1), "wall_s": round(wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=REPO / "assets" / "specs" / "demo-face.yaml")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cf-rerender-bench-") as tmp:
        root = Path(tmp)
        env = {
            **os.environ,
            "COUNTERFACTORY_RERENDER_CACHE": str(root / "cache"),
            "PREFECT_HOME": str(root / "prefect"),
        }
        env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        cold = _run(args.spec, root / "cold", env)
        warm = _run(args.spec, root / "warm", env)
        items = [next((root / side / "releases").glob("*/*/items.jsonl")).read_bytes() for side in ("cold", "warm")]
        kept = sum(1 for _ in (root / "cache").glob("*/*.npy"))
    result = {
        "spec": str(args.spec),
        "cold": cold,
        "warm": warm,
        "round_trips_kept": kept,
        "cpu_ratio": round(warm["cpu_s"] / cold["cpu_s"], 3),
        "wall_ratio": round(warm["wall_s"] / cold["wall_s"], 3),
        "same_items": items[0] == items[1],
    }
    if args.json:
        print(json.dumps(result))
        return
    for name in ("cold", "warm"):
        print(f"{name} cache: {result[name]['cpu_s']:.1f} s CPU, {result[name]['wall_s']:.1f} s wall")
    print(f"warm / cold: CPU {result['cpu_ratio']:.2f}, wall {result['wall_ratio']:.2f} ({kept} round trips kept)")
    print(f"same items: {result['same_items']}")


if __name__ == "__main__":
    main()
