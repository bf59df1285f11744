"""Plug-ins by writing one module: an editor backend defined in tests/ runs the demo spec end to
end (the flow's own step functions and release writer, without Prefect)."""

from __future__ import annotations

import json

import pytest
import yaml

from counterfactory.flows.engine import execute, run_folder, sources, template
from counterfactory.flows.engine.release import publish_release
from counterfactory.flows.engine.spec import SpecError, load_spec
from counterfactory.generation.editors.registry import EDITORS
from counterfactory.manifests.errors import SetupError

pytestmark = pytest.mark.slow


def _demo_with(tmp_path, specs_dir, editor: dict) -> str:
    data = yaml.safe_load((specs_dir / "demo-face.yaml").read_text())
    data["sources"] = {k: str((specs_dir / v).resolve()) for k, v in data["sources"].items()}
    data["editor"] = editor
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_backend_written_in_one_module_runs_the_demo_spec(tmp_path, specs_dir):
    import tests.flows.plugin_editor  # noqa: F401 - importing it is what registers it

    spec = load_spec(_demo_with(tmp_path, specs_dir, {"backend": "warm", "warm": {"shift": 20}, "max_attempts": 1}))
    assert spec.editor.options().shift == 20 and spec.canonical()["editor"]["warm"] == {"shift": 20}
    ws = run_folder.open_workspace(spec, tmp_path / "out")
    editor = execute.build_editor(spec)
    stack = execute.build_gate_stack(spec)
    prepared, failed = sources.prepare_sources(spec, ws.ledger)
    grid = sources.plan_grid(spec, prepared)
    outcomes = [
        template.process_template(spec, ws, p, grid.cells_of(p.id), editor, stack)
        for p in prepared
        if grid.cells_of(p.id)
    ]
    sealed = publish_release(spec, ws, prepared, failed, outcomes, grid, allow_incomplete=True)
    # every cell, and one noise-floor request per template
    assert len(grid.cells) == 18 and editor.calls == len(grid.cells) + len(outcomes)
    items = [json.loads(line) for line in (sealed.path / "items.jsonl").read_text().splitlines()]
    assert len(items) == 18
    attempts = ws.ledger.attempts()
    assert len(attempts) == editor.calls and {a.backend for a in attempts} == {"warm"}
    assert {a.status for a in attempts} == {"ok"}
    ws.ledger.close()


def test_unknown_backend_and_bad_plugin_options_name_the_field(tmp_path, specs_dir):
    import tests.flows.plugin_editor  # noqa: F401

    with pytest.raises(SpecError, match=r"`editor.warm.shift`"):
        load_spec(_demo_with(tmp_path, specs_dir, {"backend": "warm", "warm": {"shift": 999}}))
    with pytest.raises(SpecError, match=r"`editor.wram`"):
        load_spec(_demo_with(tmp_path, specs_dir, {"backend": "warm", "wram": {}}))
    with pytest.raises(SetupError) as caught:
        EDITORS.get("nope")
    # the built-ins and the plug-in (and the faulty editor, which collecting the pilot tests registers)
    listed = {n.strip(" .;") for n in str(caught.value).rsplit("valid:", 1)[-1].split(",")}
    assert {"classical", "fal", "import", "qwen", "warm"} <= listed, str(caught.value)
