"""``stats.json`` in the engine (``flows/engine/stats.py``): the release, the spec hash, the failed
sources, the cost rounded to a hundredth of a cent and the floors as given; no audit for a spec
whose editor does not import a set; a source's own group read from its metadata."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from counterfactory.flows.engine.spec import load_spec
from counterfactory.flows.engine.stats import _own_group, audit_stats, build_stats
from counterfactory.generation.sampling import expand_grid


@pytest.fixture(scope="module")
def face(specs_dir):
    return load_spec(specs_dir / "demo-face.yaml")


def test_the_run_facts_of_stats_json(face):
    failed = [SimpleNamespace(id="s9", path=Path("/photos/london/s9.jpg"), reason="no face found")]
    grid = expand_grid([], face.design)
    stats = build_stats(face, [], failed, grid, total_cost_usd=0.123456, floors={})
    assert stats["release"] == {"name": face.release.name, "version": face.release.version}
    assert stats["spec_hash"] == face.spec_hash()
    assert stats["failed_sources"] == [{"source_id": "s9", "path": "s9.jpg", "reason": "no face found"}]
    assert stats["cost_usd_total"] == 0.1235 and stats["noise_floor"] == {}
    assert stats["grid"]["n_cells"] == 0


def test_no_audit_without_an_imported_set_and_the_sources_own_group(face):
    assert audit_stats(face, [], []) is None  # the classical editor imports nothing
    assert _own_group(face, {"race": "White"}) == "White"
    assert _own_group(face, {"extra": {"race": "Black"}}) == "Black"
    assert _own_group(face, {"presented_gender": "female"}) is None
