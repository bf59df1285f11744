"""The pilot loop at the issue's scale: a pilot run of the faulty editor on London people, a
simulated reviewer voting on every queued item through the review site's HTTP API,
``counterfactory calibrate --from-review``, and a full run on other people judged with the
shipped thresholds and then pinned to the fitted calibration (a re-judge: zero editor calls).

Must show (issue 43): >= 300 reviewed items over >= 30 sources; on held-out sources and the
random share of the audit sample, agreement >= 90 % and Cohen's kappa >= 0.75 with the votes;
per-group intervals; the pinned full run agreeing with the votes better than the shipped
thresholds.

Usage (from the repository root; about an hour on 2 busy cores)::

    .venv/bin/python benchmarks/pilot_from_review.py --work /tmp/pilot-bench [--sources 32] [--full-sources 8]

Each phase is skipped when its output exists in ``--work`` (a re-run continues).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from counterfactory.flows.engine.spec import load_spec  # noqa: E402
from counterfactory.manifests.ledger import Ledger  # noqa: E402
from counterfactory.manifests.review import add_reviewer  # noqa: E402
from tests.flows.pilot_setup import london_study, review_all, truth, vote_of, write_pilot_spec  # noqa: E402
from tests.flows.review_setup import run_and_publish, serving  # noqa: E402

#: ``counterfactory`` with the test-side faulty editor registered
CLI = "import sys, tests.flows.faulty_editor; from counterfactory.flows.cli import main; main(sys.argv[1:])"
RACES = ("Black", "East Asian", "South Asian", "White", "Middle Eastern")


def _agreement(spec_path: Path, out: Path, error_rate: float) -> tuple[int, int, list[tuple[bool, bool]]]:
    """(agreeing, n, pairs) of the run's stored verdicts (accepted or not) with a simulated
    reviewer's votes on every judged cell."""
    spec = load_spec(spec_path)
    ledger = Ledger(f"sqlite:///{out / 'ledger.sqlite'}")
    try:
        classes = {a.attempt_id: (a.meta or {}).get("faulty_class", "") for a in ledger.attempts()}
        pairs = []
        for cand in ledger.candidates():
            made = classes.get(cand.attempt_id, "")
            if made in ("", "floor") or cand.verdict == "floor":
                continue
            decision, _ = vote_of("sim", cand.attempt_id, made, error_rate)
            pairs.append((cand.verdict == "accepted", decision == "accept"))
    finally:
        ledger.close()
    del spec
    return sum(a == b for a, b in pairs), len(pairs), pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--sources", type=int, default=32)
    ap.add_argument("--full-sources", type=int, default=8)
    ap.add_argument("--side", type=int, default=320)
    ap.add_argument("--error-rate", type=float, default=0.05)
    args = ap.parse_args()
    work = args.work.resolve()
    pilot = work / "pilot"
    n_all = args.sources + args.full_sources
    meta, donors = london_study(work / "all", n_all, n_donors=6, side=args.side)

    # the pilot's and the full run's people: disjoint
    import yaml

    records = yaml.safe_load(meta.read_text())["sources"]
    for name, chosen in (("pilot", records[: args.sources]), ("full", records[args.sources :])):
        (work / name).mkdir(parents=True, exist_ok=True)
        (work / name / "meta.yaml").write_text(yaml.safe_dump({"sources": chosen}))
    spec = write_pilot_spec(
        pilot, n_sources=args.sources, donors=donors, races=RACES, genders=("female", "male"), photos="../all/photos"
    )
    out = pilot / "out"
    t0 = time.time()
    if not (out / "releases").is_dir():
        _, calls = run_and_publish(spec, out)
        print(f"pilot run: {calls} editor calls in {time.time() - t0:.0f} s", flush=True)
    url = f"sqlite:///{out / 'ledger.sqlite'}"
    classes = truth(url)
    ledger = Ledger(url)
    with ledger.engine.connect() as c:
        from sqlalchemy import text

        voted = c.execute(text("SELECT count(*) FROM review_decisions")).scalar_one()
    token = None if voted else add_reviewer(ledger, "sim")
    ledger.close()
    if token is not None:
        t1 = time.time()
        with serving(out, spec) as base:
            votes = review_all(base, token, "sim", classes, error_rate=args.error_rate)
        print(f"review: {votes} votes through the HTTP API in {time.time() - t1:.0f} s", flush=True)
    cal_dir = pilot / "calibration"
    # the command line with the faulty editor registered (a plug-in package's entry point would do it)
    done = subprocess.run(
        [sys.executable, "-c", CLI, "calibrate", "--from-review", str(out), "--out", str(cal_dir)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    print("$ counterfactory calibrate --from-review", out, "--out", cal_dir)
    print(done.stdout + done.stderr, flush=True)
    if done.returncode != 0 or args.full_sources == 0:
        return

    # the full run on other people: judged with the shipped thresholds, then pinned (re-judged)
    full = work / "full"
    shipped = write_pilot_spec(
        full,
        n_sources=args.full_sources,
        donors=donors,
        races=RACES,
        genders=("female", "male"),
        name="full",
        photos="../all/photos",
    )
    fout = full / "out"
    t2 = time.time()
    _, calls = run_and_publish(shipped, fout)
    print(f"full run, shipped thresholds: {calls} editor calls in {time.time() - t2:.0f} s")
    a, n, _ = _agreement(shipped, fout, args.error_rate)
    print(f"  agreement with a simulated reviewer's votes: {a}/{n} = {a / n:.1%}")
    pinned = write_pilot_spec(
        full,
        n_sources=args.full_sources,
        donors=donors,
        races=RACES,
        genders=("female", "male"),
        name="full",
        photos="../all/photos",
        version="0.2.0",
        calibration=str(cal_dir / "calibration.json"),
    )
    t3 = time.time()
    sealed, calls = run_and_publish(pinned, fout)
    print(f"full run pinned to the calibration: {calls} editor calls in {time.time() - t3:.0f} s")
    b, n2, _ = _agreement(pinned, fout, args.error_rate)
    print(f"  agreement with the same votes: {b}/{n2} = {b / n2:.1%}")
    import json

    release = json.loads((sealed.path / "release.json").read_text())
    print("  release.json calibration:", json.dumps(release.get("calibration"), sort_keys=True)[:400])


if __name__ == "__main__":
    main()
