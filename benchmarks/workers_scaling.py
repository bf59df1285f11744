"""``--workers 2`` vs ``--workers 1`` on the same 90-cell spec, measured in one run.

The spec: 9 templates x 10 conditions (FOCUS's 5 races x 2 genders and its prompt) on distinct
copies of the bundled one-face photos at 512 px, the ``classical`` editor and every default
gate: the real per-cell work (edit, align, five gates, two PNG writes, the ledger). Each
setting runs ``counterfactory run SPEC --out DIR --workers N`` in a fresh interpreter into its
own folder, timed from the outside (imports, Prefect's start-up and the serial source checks
included, as a user sees them). Prints both wall times, cells per second and the speed-up
``t(1) / t(2)`` (target >= 1.7 on an otherwise idle 2-core machine), and the cores each run
kept busy (CPU seconds / wall seconds).

Then the template work alone, in a fresh interpreter with the models loaded and the sources
checked (no Prefect, no start-up): every template one after another on one thread, then the
same templates on two threads, then on two processes, each into a fresh run folder. It prints
the cores one template worker keeps busy by itself (OpenCV runs SIFT, ECC and the warps on
every core) and so the most a second worker can add on this machine (cores / that figure),
next to what two threads and two processes achieve. This separates what the machine allows
from what the run's serial start-up (imports, Prefect's API, the model checks) costs.

Usage (from the repository root)::

    .venv/bin/python benchmarks/workers_scaling.py [--templates 9] [--workers 1 2] [--skip-template-work]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
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


def focus_like_spec(
    root: Path, templates: int, *, side: int = 512, name: str = "bench", axes: dict[str, list[str]] | None = None
) -> Path:
    """FOCUS's axes (or ``axes``), prompt and gates with the classical editor on ``templates``
    distinct photos of ``side`` pixels."""
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
    data["design"]["axes"] = axes or FOCUS_AXES
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


def _templates_of(spec_path: str, out: str):
    """The run's steps up to the templates: (spec, workspace, editor, stack, [(source, cells)])."""
    from counterfactory.flows.engine import execute, run_folder, sources
    from counterfactory.flows.engine.spec import load_spec

    spec = load_spec(spec_path)
    editor, stack = execute.build_editor(spec), execute.build_gate_stack(spec)
    ws = run_folder.open_workspace(spec, out)
    prepared, _ = sources.prepare_sources(spec, ws.ledger, ws.store)
    grid = sources.plan_grid(spec, prepared)
    return spec, ws, editor, stack, [(source, grid.cells_of(source.id)) for source in prepared]


def _fill(spec, ws, editor, stack, templates) -> None:
    from counterfactory.flows.engine import template

    for source, cells in templates:
        template.process_template(spec, ws, source, cells, editor, stack)


def _process_share(args: tuple[str, str, int, int]) -> float:
    """One of two worker processes: its share of the templates (every other one); its seconds."""
    spec_path, out, index, of = args
    spec, ws, editor, stack, templates = _templates_of(spec_path, out)
    started = time.perf_counter()
    _fill(spec, ws, editor, stack, templates[index::of])
    return time.perf_counter() - started


def template_work(spec_path: str, root: Path) -> dict[str, float]:
    """The template phase alone: one thread, two threads, two processes (see the docstring)."""
    import threading

    spec, ws, editor, stack, templates = _templates_of(spec_path, str(root / "one"))
    cpu, started = time.process_time(), time.perf_counter()
    _fill(spec, ws, editor, stack, templates)
    one = time.perf_counter() - started
    cores = (time.process_time() - cpu) / one
    spec, ws, editor, stack, templates = _templates_of(spec_path, str(root / "threads"))
    started = time.perf_counter()
    threads = [threading.Thread(target=_fill, args=(spec, ws, editor, stack, templates[i::2])) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    two_threads = time.perf_counter() - started
    # each process loads its models and checks its sources before its clock starts
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        two_processes = max(pool.map(_process_share, [(spec_path, str(root / "processes"), i, 2) for i in range(2)]))
    return {"one_s": one, "one_cores": cores, "two_threads_s": two_threads, "two_processes_s": two_processes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--templates", type=int, default=9)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--skip-template-work", action="store_true", help="only the two command-line runs")
    parser.add_argument("--template-work", metavar="SPEC", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.template_work:
        print(json.dumps(template_work(args.template_work, Path(args.root))))
        return
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
        if args.skip_template_work:
            return
        row, _ = synthetic.run_child(
            Path(__file__), ["--template-work", str(spec), "--root", str(root / "template-work")], env=env
        )
        cores = os.cpu_count() or 1
        print(
            f"template work alone ({cells} cells, no start-up): one thread {row['one_s']:.1f} s keeping "
            f"{row['one_cores']:.2f} cores busy, so a second worker can add at most {cores / row['one_cores']:.2f}x "
            f"on {cores} cores; two threads {row['two_threads_s']:.1f} s ({row['one_s'] / row['two_threads_s']:.2f}x), "
            f"two processes {row['two_processes_s']:.1f} s ({row['one_s'] / row['two_processes_s']:.2f}x)"
        )


if __name__ == "__main__":
    main()
