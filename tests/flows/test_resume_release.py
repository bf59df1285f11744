"""A release is a function of its inputs: the demo run SIGKILLed half way and resumed seals a
release byte-identical to the uninterrupted run's, but for the documented timestamp
(``release.json``'s ``created_at``, the time of sealing, and so the ``release.json`` line of
``checksums.sha256``). The run's own editor calls are in its printed summary, not the release.
"""

from __future__ import annotations

import json

import pytest

from tests.flows.unchanged import KILLED, SCENARIOS

# two demo-sized runs (the session's uninterrupted one, and its killed one)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def _files(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_killed_and_resumed_run_seals_the_uninterrupted_release_byte_for_byte(demo_run, killed_demo):
    scenario = SCENARIOS[KILLED]
    assert scenario.spec.name == "demo-face.yaml"
    out = killed_demo.out
    assert killed_demo.killed.finished > 0
    resumed, whole = _files(out / scenario.release), _files(demo_run.release)
    assert sorted(resumed) == sorted(whole)
    differ = sorted(name for name in whole if resumed[name] != whole[name])
    assert differ == ["checksums.sha256", "release.json"], differ
    a, b = (json.loads(files["release.json"]) for files in (resumed, whole))
    assert a.pop("created_at") != b.pop("created_at") and a == b
    lines = [[line for line in files["checksums.sha256"].splitlines() if not line.endswith(b"  release.json")]
             for files in (resumed, whole)]  # fmt: skip
    assert lines[0] == lines[1]
    stats = json.loads(whole["stats.json"])
    assert "editor_calls_this_run" not in stats
    assert b"Editor calls" not in whole["report.html"]
    assert "editor calls: " in demo_run.run_stdout  # the run's own summary says what it spent
