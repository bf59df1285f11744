"""What auditing a set through the ``import`` backend costs over measuring its pairs.

Builds one set of real pairs (the Face Research Lab London Set: each person's neutral photo as
the source; as candidates the same person smiling, that photo re-encoded as JPEG, and the
neutral photo re-encoded: three cells per source, as a template has several), then in one
process, after a warm-up of each side (models loaded, caches filled):

- ``import``: ``counterfactory run`` in-process (:func:`counterfactory.flows.resume.run_spec`,
  one template at a time, no publish) into a fresh folder: table read, ledger, store, alignment,
  gates, candidates recorded;
- ``measure``: :func:`counterfactory.flows.audit.measure_batch` over the same table with the same
  spec (align and gates, nothing recorded): the spec's edit region, alignment and gates, so both
  sides judge the same problem and give the same verdicts.

Each side runs ``--repeat`` times, interleaved; the figure is the median seconds per pair of
each and their ratio (target: import <= 1.10 x measure). ``--profile FILE`` writes a cProfile
of one more import run (``python -m pstats FILE``; the template threads' work in
``FILE.templates``).

    .venv/bin/python benchmarks/import_vs_measure.py --people 4 --repeat 3
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
LONDON = REPO.parent / "shared" / "photos" / "london"
AXES = {"race": ["Black", "East Asian", "Middle Eastern", "White"], "gender": ["female", "male"]}


def build_set(folder: Path, people: int, side: int) -> tuple[Path, Path, int]:
    """Write photos, metadata, ``pairs.csv`` and ``spec.yaml``; return (spec, table, pairs)."""
    (folder / "photos").mkdir(parents=True)
    (folder / "candidates").mkdir()
    with (LONDON / "london_info.csv").open() as f:
        ids = [r["face_id"] for r in csv.DictReader(f) if (LONDON / "smiling" / f"{r['face_id']}.jpg").is_file()]
    conditions = [(race, gender) for race in AXES["race"] for gender in AXES["gender"]]
    metadata, rows = [], []
    for face_id in ids[:people]:
        neutral = Image.open(LONDON / "neutral" / f"{face_id}.jpg").convert("RGB")
        smiling = Image.open(LONDON / "smiling" / f"{face_id}.jpg").convert("RGB")
        neutral.thumbnail((side, side))
        smiling.thumbnail((side, side))
        neutral.save(folder / "photos" / f"{face_id}.png")
        metadata.append({"id": f"p{face_id}", "path": f"{face_id}.png", "licence": "CC BY 4.0"})
        forms = [
            (smiling, "png", f"{face_id}_smiling.png"),
            (smiling, "jpeg", f"{face_id}_smiling.jpg"),
            (neutral, "jpeg", f"{face_id}_neutral.jpg"),
        ]
        for (image, fmt, name), (race, gender) in zip(forms, conditions):
            image.save(folder / "candidates" / name, **({"quality": 85} if fmt == "jpeg" else {}))
            rows.append([f"p{face_id}", f"candidates/{name}", race, gender])
    (folder / "photos" / "metadata.yaml").write_text(yaml.safe_dump({"sources": metadata}))
    table = folder / "pairs.csv"
    with table.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["source", "candidate", "race", "gender"])
        writer.writerows(rows)
    spec = {
        "name": "import-bench",
        "sources": {"photos": "photos", "metadata": "photos/metadata.yaml"},
        "design": {"kind": "face", "axes": AXES, "strata": [], "templates_per_stratum": 1},
        "prompts": {"face": "face_only_v1"},
        "editor": {"backend": "import", "import": {"table": "pairs.csv"}},
        "release": {"name": "import-bench", "version": "0.1.0"},
    }
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    # measure --batch reads paths relative to the table: the sources by their photo path
    batch = folder / "batch.csv"
    with batch.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["source", "candidate", "race", "gender"])
        writer.writerows([[f"photos/{r[0][1:]}.png", r[1], r[2], r[3]] for r in rows])
    return folder / "spec.yaml", batch, len(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--people", type=int, default=4, help="sources (three pairs each)")
    parser.add_argument("--side", type=int, default=512, help="longest side of every image, px")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", type=Path, help="write a cProfile of one more import run here")
    args = parser.parse_args(argv)
    if not LONDON.is_dir():
        print(f"{LONDON} (the Face Research Lab London Set) is not here", file=sys.stderr)
        return 2
    from counterfactory.flows.audit import measure_batch
    from counterfactory.flows.resume import run_spec

    work = Path(tempfile.mkdtemp(prefix="import-bench-"))
    spec, batch, pairs = build_set(work / "set", args.people, args.side)
    runs = iter(range(10**6))

    def run_import() -> float:
        start = time.perf_counter()
        summary = run_spec(spec, work / f"out{next(runs)}", workers=1, progress=False)
        took = time.perf_counter() - start
        assert sum(summary.counts.values()) >= pairs, summary.counts
        return took

    def run_measure() -> float:
        start = time.perf_counter()
        reports = list(measure_batch(batch, spec_path=spec))
        took = time.perf_counter() - start
        assert len(reports) == pairs and not [r for r in reports if r["verdict"] == "failed"], reports
        return took

    run_import(), run_measure()  # warm-up: models loaded, caches filled
    imports, measures = [], []
    for _ in range(args.repeat):
        imports.append(run_import())
        measures.append(run_measure())
    imp, mea = statistics.median(imports) / pairs, statistics.median(measures) / pairs
    print(f"pairs: {pairs} ({args.people} sources, {args.side} px), repeats: {args.repeat}")
    print(f"import:  {imp:.3f} s/pair (runs: {', '.join(f'{t:.2f}' for t in imports)} s)")
    print(f"measure: {mea:.3f} s/pair (runs: {', '.join(f'{t:.2f}' for t in measures)} s)")
    print(f"ratio import / measure: {imp / mea:.3f} (target <= 1.10)")
    if args.profile is not None:
        # the run's template work runs in Prefect's task threads, which the main thread's
        # profile only sees as waits: each template is profiled in its thread, and the whole run
        # in the main one (FILE and FILE.templates)
        from counterfactory.flows.engine import template

        templates = cProfile.Profile()
        plain = template.process_template

        def profiled(*a, **k):
            return templates.runcall(plain, *a, **k)

        template.process_template = profiled
        profiler = cProfile.Profile()
        try:
            profiler.runcall(run_import)
        finally:
            template.process_template = plain
        profiler.dump_stats(args.profile)
        templates.dump_stats(f"{args.profile}.templates")
        print(f"profile of one import run: {args.profile} (the template threads: {args.profile}.templates)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
