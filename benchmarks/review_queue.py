"""How the review queue scales: building the queue and recording one decision, against reading
every candidate row with ``Ledger.candidates()`` (the floor any queue over the ledger pays),
measured on the same synthetic ledger in the same run.

A reviewer works item by item, so recording a decision must not grow with the ledger: its
ratio to the full read should fall as the ledger grows (target: well under 1 at 5000
candidates). Building the queue reads every candidate once, plus the decisions table; its
ratio should stay near 1.

Usage (from the repository root)::

    .venv/bin/python benchmarks/review_queue.py [--sizes 500 5000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

from counterfactory.manifests.ledger import AttemptRow, CandidateRow, Ledger
from counterfactory.manifests.review import (
    ReviewOptions,
    add_reviewer,
    record_decision,
    review_queue,
    reviewer_for_token,
)

VERDICTS = ("accepted", "needs_review", "rejected")


def synthetic_ledger(path: Path, n: int) -> Ledger:
    """``n`` candidates, a third in each verdict, six conditions per template, with gate records
    the size of a real face cell's (about 30 metrics)."""
    ledger = Ledger(f"sqlite:///{path}")
    gates = {
        name: {"passed": True, "metrics": {f"m{i}": 0.5 for i in range(8)}, "thresholds": {"t": 1.0}, "reasons": []}
        for name in ("face", "identity", "expression", "locality")
    }
    with ledger.session() as s, s.begin():
        for i in range(n):
            aid = hashlib.sha256(f"bench-{i}".encode()).hexdigest()
            cell = f"t{i // 6}|race=r{i % 6}"
            s.add(
                AttemptRow(
                    attempt_id=aid,
                    cell_id=cell,
                    attempt_no=1,
                    seed=0,
                    backend="classical",
                    lineage={},
                    prompt="p",
                    status="ok",
                    cost_usd=0.0,
                    calls=1,
                    meta={},
                )
            )
            s.add(
                CandidateRow(
                    attempt_id=aid,
                    cell_id=cell,
                    judge_key="k",
                    image_sha256=aid,
                    alignment={"ok": True},
                    verdict=VERDICTS[i % 3],
                    reasons=[],
                    gates=gates,
                )
            )
    return ledger


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(n: int, repeat: int, options: ReviewOptions) -> tuple[float, float, float]:
    """Median seconds: read every candidate, build the queue, record one decision."""
    with tempfile.TemporaryDirectory() as tmp:
        ledger = synthetic_ledger(Path(tmp) / "ledger.sqlite", n)
        try:
            reviewer = reviewer_for_token(ledger, add_reviewer(ledger, "bench"))
            read = timed(ledger.candidates, repeat)
            queue = timed(lambda: review_queue(ledger, options), repeat)
            # every decision is a new one, so each repeat decides a different queued item
            todo = iter([i.attempt_id for i in review_queue(ledger, options) if i.mode == "queue"])
            decide = timed(
                lambda: record_decision(
                    ledger, options, attempt_id=next(todo), reviewer=reviewer, decision="accept", seen=0
                ),
                repeat,
            )
        finally:
            ledger.close()
    return read, queue, decide


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 5000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    options = ReviewOptions()
    print(
        f"{'candidates':>10} {'read all s':>10} {'queue s':>9} {'queue/read':>10} {'decide s':>9} {'decide/read':>11}"
    )
    for n in args.sizes:
        read, queue, decide = measure(n, args.repeat, options)
        print(f"{n:>10} {read:>10.3f} {queue:>9.3f} {queue / read:>10.2f} {decide:>9.3f} {decide / read:>11.3f}")


if __name__ == "__main__":
    main()
