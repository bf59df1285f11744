"""Editor backends' optional hooks are declared once, on ``EditorOptions`` (issue 46): the
built-in backends' options derive from it, the defaults do nothing, and a plug-in's options
model that does not derive from it still works through ``hooks_of``, the one place a hook is
looked up by name."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from counterfactory.generation.editors import EDITORS
from counterfactory.generation.editors.base import EditorOptions, hooks_of
from tests.conftest import REPO

HOOKS = ("bind_spec", "bind_run_folder", "named_files", "plan_grid", "release_caveat", "audits_imported_set")


def test_every_built_in_backend_declares_its_hooks_on_editor_options():
    for name in ("classical", "fal", "import", "qwen"):
        options = EDITORS.get(name).options
        assert issubclass(options, EditorOptions), name
        assert hooks_of(options) is options
    assert EDITORS.get("import").options.plan_grid is not None
    assert EDITORS.get("import").options.audits_imported_set
    assert EDITORS.get("classical").options.release_caveat


def test_the_defaults_do_nothing():
    class Plain(EditorOptions):
        model_config = ConfigDict(extra="forbid")
        strength: float = 1.0

    options = Plain()
    assert options.plan_grid is None and options.release_caveat is None and not options.audits_imported_set
    assert options.bind_spec(object()) is None and options.bind_run_folder("/tmp/out") is None
    assert options.named_files() == {}
    assert options.model_dump() == {"strength": 1.0}  # the hooks are no fields: the spec's bytes keep their hash


def test_a_plug_ins_options_that_do_not_derive_get_the_defaults_for_what_they_lack():
    class Bare(BaseModel):
        strength: float = 1.0

    bare = hooks_of(Bare())
    assert bare.plan_grid is None and bare.release_caveat is None and not bare.audits_imported_set
    bare.bind_spec(object())
    bare.bind_run_folder("/tmp/out")
    assert bare.named_files() == {}

    seen: list[object] = []

    class Declaring(BaseModel):
        release_caveat: str = "a caveat"

        def plan_grid(self, records, design):
            return ("grid", records, design)

        def bind_spec(self, spec):
            seen.append(spec)

        def named_files(self):
            return {"editor.x.table": Path("/t.csv")}

    hooks = hooks_of(Declaring())
    assert hooks.plan_grid([1], "design") == ("grid", [1], "design")
    assert hooks.release_caveat == "a caveat"
    hooks.bind_spec("spec")
    assert seen == ["spec"]
    assert hooks.named_files() == {"editor.x.table": Path("/t.csv")}


def test_no_layer_above_manifests_probes_a_hook_by_name():
    """Above the bottom layer, hooks are plain calls (through hooks_of); manifests/ cannot import
    generation/, so its readers keep theirs."""
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    probe = re.compile(r"getattr\(.*[\"'](" + "|".join(HOOKS) + r")[\"']")
    found = [
        f"{p}:{n}"
        for p in out.split()
        if p.startswith(("flows/", "generation/", "validation/")) and p != "generation/editors/base.py"
        for n, line in enumerate((REPO / p).read_text().splitlines(), start=1)
        if probe.search(line)
    ]
    assert not found, f"hooks probed by name outside generation/editors/base.py::hooks_of: {found}"
