"""Gates are plug-ins written as one module: ``tests/validation/plugin_gate.py`` defines a gate
and registers it with one line; a spec configures it under ``gates.face.tint``, the stack runs it
in its registered place and its reason codes reach the verdict, in a judge call and in a demo run.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import yaml

from counterfactory.flows.engine import execute, run_folder, sources, template
from counterfactory.flows.engine.spec import SpecError, load_spec
from counterfactory.validation.gate_stack import GatesConfig, GateStack
from counterfactory.validation.gates.registry import GATES


@pytest.fixture
def tint_gate():
    """The plug-in registered for one test, unregistered after it."""
    module = importlib.import_module("tests.validation.plugin_gate")
    if "tint" not in GATES:  # imported by an earlier test, whose teardown unregistered it
        module = importlib.reload(module)
    yield module
    GATES.unregister("tint")


def _demo_with(tmp_path, specs_dir, gates: dict, **editor) -> str:
    data = yaml.safe_load((specs_dir / "demo-face.yaml").read_text())
    data["sources"] = {k: str((specs_dir / v).resolve()) for k, v in data["sources"].items()}
    data["gates"]["face"].update(gates)
    data["editor"].update(editor)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_gate_written_in_one_module_joins_the_stack_and_the_verdict(tint_gate, photo):
    assert GatesConfig().face.tint is None  # opt-in: off unless the spec configures it
    config = GatesConfig(face={"tint": {"max_face_change": 5.0}})
    stack = GateStack.from_config(config, "face")
    assert [g.name for g in stack.gates] == ["face", "identity", "expression", "locality", "skin", "tint"]
    source = np.array(photo("biden_portrait.jpg"), copy=True)
    source[..., 0] //= 2  # room for +20 everywhere: no clipping
    candidate = source.copy()
    candidate[..., 0] += 20
    judged = stack.evaluate(source, candidate)
    tint = next(r for r in judged.results if r.gate == "tint")
    # +20 on one channel of three, everywhere: a mean absolute change of 20/3 levels on any mask
    assert tint.metrics["face_change"] == pytest.approx(20 / 3, abs=1e-9)
    assert judged.verdict == "rejected" and "tint_face_change_above_max" in judged.reasons
    assert judged.to_dict()["gates"]["tint"]["thresholds"] == {"max_face_change": 5.0}
    same = stack.evaluate(source, source.copy())
    assert next(r for r in same.results if r.gate == "tint").metrics["face_change"] == 0.0
    assert "tint_face_change_above_max" not in same.reasons


def test_plugin_gate_errors_name_the_field(tint_gate, tmp_path, specs_dir):
    with pytest.raises(SpecError, match=r"`gates\.face\.tint\.max_face_change`: expected input should be greater"):
        load_spec(_demo_with(tmp_path, specs_dir, {"tint": {"max_face_change": -1}}))
    with pytest.raises(SpecError, match=r"`gates\.face\.tint\.max_face_change`: required"):
        load_spec(_demo_with(tmp_path, specs_dir, {"tint": {}}))
    with pytest.raises(SpecError, match=r"`gates\.face\.tnit`: expected one of the registered gates \(.*tint"):
        load_spec(_demo_with(tmp_path, specs_dir, {"tnit": {"max_face_change": 1}}))


def test_an_unregistered_gate_is_an_unknown_field(tmp_path, specs_dir):
    GATES.unregister("tint")  # whatever an earlier test left
    with pytest.raises(SpecError, match=r"`gates\.face\.tint`"):
        load_spec(_demo_with(tmp_path, specs_dir, {"tint": {"max_face_change": 1}}))


@pytest.mark.slow
def test_plugin_gate_reasons_reach_the_demo_runs_verdicts(tint_gate, tmp_path, specs_dir):
    # the classical editor paints a visible tone inside the face mask: far more than half a level
    spec = load_spec(_demo_with(tmp_path, specs_dir, {"tint": {"max_face_change": 0.5}}, max_attempts=1))
    assert spec.canonical()["gates"]["face"]["tint"] == {"max_face_change": 0.5}
    ws = run_folder.open_workspace(spec, tmp_path / "out")
    editor = execute.build_editor(spec)
    stack = execute.build_gate_stack(spec)
    assert stack.has("tint")
    prepared, _ = sources.prepare_sources(spec, ws.ledger)
    grid = sources.plan_grid(spec, prepared)
    first = next(p for p in prepared if grid.cells_of(p.id))
    outcome = template.process_template(spec, ws, first, grid.cells_of(first.id), editor, stack)
    assert len(outcome.cells) == 6
    assert all(c.verdict == "rejected" and "tint_face_change_above_max" in c.reasons for c in outcome.cells)
    # the six cells (the template's noise-floor candidate is no cell)
    stored = [c for c in ws.ledger.candidates() if not c.cell_id.endswith("|floor")]
    assert len(stored) == 6
    for candidate in stored:
        assert "tint_face_change_above_max" in candidate.reasons
        assert candidate.gates["tint"]["metrics"]["face_change"] > 0.5
    ws.ledger.close()
