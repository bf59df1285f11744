"""The engine's behaviour is what it was when the fingerprints were recorded.

Each scenario runs the real command line into a fresh folder (the demo's is the session's
``demo_run``, the README's command) and its fingerprint (ledger attempts
and candidates, release checksums: :mod:`tests.flows.unchanged`) must equal the one recorded
under ``tests/data/unchanged/``. A refactor that keeps behaviour passes untouched; a change that is
meant to change results re-records with ``python -m tests.flows.unchanged record`` and says so.
"""

from __future__ import annotations

import re
import sqlite3

import pytest

from tests.flows.unchanged import (
    KILLED,
    RE_RECORD,
    SCENARIOS,
    differences,
    editor_calls,
    fingerprint,
    load_record,
    run_cli,
)

# one demo-sized run each (about a minute on an idle 2-core machine); the timeout leaves room for a busy one
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _assert_unchanged(live: dict, name: str, how: str) -> None:
    recorded = load_record(SCENARIOS[name])
    shown = differences(live, recorded["fingerprint"])
    assert not shown, (
        f"{how} no longer gives the fingerprint recorded from {recorded['commit'][:12]} on "
        f"{recorded['recorded_at']} ({SCENARIOS[name].record_path.name}):\n"
        + "\n".join(shown)
        + f"\nIf (and only if) this change of behaviour is intended, re-record with `{RE_RECORD}` and say why in "
        "the commit."
    )


# the demo's scenario reads the session's demo run: it runs in that run's group (tests/conftest.py),
# in the worker that built it, not in a second worker that would build the demo again
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=[pytest.mark.xdist_group("demo")] if n == "demo-face" else []) for n in sorted(SCENARIOS)],
)
def test_a_run_gives_the_recorded_fingerprint(name, tmp_path, request):
    scenario = SCENARIOS[name]
    recorded = load_record(scenario)["editor_calls"]
    if name == "demo-face":
        # the session's demo run is this scenario's command; its folder also holds the 0.2.0
        # release published after it (no attempt, no candidate, no editor call)
        demo = request.getfixturevalue("demo_run")
        out = demo.out
        calls = int(re.search(r"editor calls: (\d+)", demo.run_stdout).group(1))
    else:
        out = tmp_path / "out"
        run_cli(scenario.spec, out)
        calls = editor_calls(out, scenario)
    _assert_unchanged(fingerprint(out, scenario), name, f"`counterfactory run {scenario.spec.name}`")
    assert calls == recorded, f"editor calls: recorded {recorded}; {RE_RECORD} if intended"
    # two conditions of one source never come back as one image (the classical editor once gave
    # FOCUS's Asian, Latino and Middle Eastern cells, of both genders, one shared donor's tone)
    with sqlite3.connect(f"file:{out / 'ledger.sqlite'}?mode=ro", uri=True) as db:
        outputs = db.execute(
            "select cell_id, seed, output_sha256 from attempts where output_sha256 is not null"
        ).fetchall()
    cells: dict[tuple[str, int, str], set[str]] = {}
    for cell, seed, sha in outputs:
        cells.setdefault((cell.split("|", 1)[0], seed, sha), set()).add(cell)
    # (the classical editor also inpainted a limb cell's same-cue control, cue=kept, like its
    # treatment, until it re-rendered the control instead: lineage version 4)
    shared = sorted(sorted(c) for c in cells.values() if len(c) > 1)
    assert shared == [], f"conditions of one source returned one image: {shared}"


def test_a_run_killed_half_way_and_resumed_gives_the_uninterrupted_fingerprint(killed_demo):
    scenario = SCENARIOS[KILLED]
    finished = killed_demo.killed.finished
    live = fingerprint(killed_demo.out, scenario)
    assert 0 < finished < len(live["attempts"])
    _assert_unchanged(live, KILLED, f"`counterfactory run {scenario.spec.name}` SIGKILLed after {finished} attempts")
