"""A template task's content key follows exactly what decides the template's outcome."""

from __future__ import annotations

import pytest

from counterfactory.flows.engine import run_folder, sources
from counterfactory.flows.engine.spec import RunConfig, load_spec
from counterfactory.flows.keys import template_key
from counterfactory.generation.sources import PreparedSource
from tests.flows.fake_editor import FakeEditor

pytestmark = pytest.mark.slow  # the real face model checks the sources


@pytest.fixture(scope="module")
def spec(specs_dir):
    return load_spec(specs_dir / "demo-face.yaml")


@pytest.fixture(scope="module")
def astronaut(spec, tmp_path_factory):
    ws = run_folder.open_workspace(spec, tmp_path_factory.mktemp("keys"))
    usable, _ = sources.prepare_sources(spec, ws.ledger)
    ws.ledger.close()
    return next(p for p in usable if p.id == "astronaut")


def _with(spec, **sections):
    return spec.model_copy(update=sections)


def test_the_key_changes_with_what_decides_the_outcome_only(spec, astronaut):
    cells = sources.plan_grid(spec, [astronaut]).cells_of("astronaut")
    editor = FakeEditor()
    key = template_key(spec, astronaut, cells, editor)
    assert len(key) == 64 and key == template_key(spec, astronaut, list(cells), FakeEditor())
    different = {
        "editor lineage": template_key(spec, astronaut, cells, FakeEditor(lift=13)),
        "cells": template_key(spec, astronaut, cells[:-1], editor),
        "seed": template_key(_with(spec, editor=spec.editor.model_copy(update={"seed": 1})), astronaut, cells, editor),
        "retry budget": template_key(
            _with(spec, editor=spec.editor.model_copy(update={"max_attempts": 3})), astronaut, cells, editor
        ),
        "alignment": template_key(
            _with(spec, align=spec.align.model_copy(update={"composite": not spec.align.composite})),
            astronaut,
            cells,
            editor,
        ),
        "edit region": template_key(
            spec,
            PreparedSource(astronaut.source, 255 - astronaut.region, astronaut.face_size_px, astronaut.meta),
            cells,
            editor,
        ),
    }
    for what, other in different.items():
        assert other != key, what
    # where and how it runs, and the version it will be published as, decide nothing
    same = [
        _with(spec, run=RunConfig(gpu_slots=1, fal_max_concurrency=4)),
        _with(spec, ledger_url="sqlite:////tmp/elsewhere.sqlite"),
        _with(spec, release=spec.release.model_copy(update={"version": "9.9.9"})),
    ]
    for other in same:
        assert template_key(other, astronaut, cells, editor) == key
