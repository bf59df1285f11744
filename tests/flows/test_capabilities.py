"""What an editor declares at registration is what limits, Ray, the stop handler and batching
read; the registries load installed packages' entry points once, and name a broken one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml
from pydantic import BaseModel, ConfigDict

from counterfactory.flows import stopping
from counterfactory.flows.engine.execute import editor_batch_size
from counterfactory.flows.engine.spec import SpecError, load_spec
from counterfactory.flows.limits import FAL_LIMIT, GPU_LIMIT, LimitedEditor, limited_editor
from counterfactory.flows.ray import ray_target
from counterfactory.generation.editors.registry import EDITORS, EditorCapabilities
from counterfactory.manifests import registry
from counterfactory.manifests.registry import PluginError


class ProbeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    size: int = 5


class ProbeEditor:
    name = "probe"

    def __init__(self, options: ProbeOptions) -> None:
        self.options = options


cancelled_with: list[float] = []


def _cancel(timeout_s: float) -> list[str]:
    cancelled_with.append(timeout_s)
    return ["req-1", "req-2"]


@pytest.fixture
def probe():
    EDITORS.register(
        "probe",
        ProbeOptions,
        ProbeEditor,
        capabilities=EditorCapabilities(
            batch_size=lambda options: options.size,
            limit="fal",
            per_request=True,
            paid=True,
            resources=lambda options: {"num_gpus": 0.25},
            cancel_in_flight=_cancel,
        ),
    )
    yield
    EDITORS.unregister("probe")


def _spec(tmp_path, specs_dir, **changes):
    data = yaml.safe_load((specs_dir / "demo-face.yaml").read_text())
    data["sources"] = {k: str((specs_dir / v).resolve()) for k, v in data["sources"].items()}
    data.update(changes)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_spec(path)


def test_limits_ray_batches_and_stop_read_the_declared_capabilities(probe, tmp_path, specs_dir):
    spec = _spec(
        tmp_path,
        specs_dir,
        editor={"backend": "probe", "probe": {"size": 7}},
        run={"fal_max_concurrency": 3, "gpu_slots": 1, "ray": {"address": "local"}},
    )
    editor = ProbeEditor(spec.editor.options())
    limited = limited_editor(editor, spec)
    assert isinstance(limited, LimitedEditor) and limited.limit == FAL_LIMIT and limited.occupy_per_request
    assert editor_batch_size(editor) == 7 and limited.batch_size == 3  # one slot per request in flight
    assert ray_target(spec).num_gpus == 0.25
    cancelled_with.clear()
    assert stopping.cancel_in_flight(2.0)["probe"] == 2 and 0 < cancelled_with[0] <= 2.0
    # a GPU backend holds one slot per batch; the built-ins declare theirs
    assert EDITORS.capabilities("qwen").limit == "gpu" and not EDITORS.capabilities("qwen").per_request
    assert EDITORS.capabilities("fal").paid and EDITORS.capabilities("fal").cancel_in_flight is not None
    assert EDITORS.capabilities("classical") == EditorCapabilities()
    qwen_like = _spec(tmp_path, specs_dir, run={"gpu_slots": 2})
    assert limited_editor(editor, qwen_like) is editor  # classical holds no limit
    assert GPU_LIMIT != FAL_LIMIT


def test_a_bad_limit_is_refused_at_registration():
    with pytest.raises(ValueError, match="capabilities.limit"):
        EDITORS.register("odd", ProbeOptions, ProbeEditor, capabilities=EditorCapabilities(limit="tpu"))


def test_entry_points_load_once_and_a_failing_one_names_its_distribution(monkeypatch):
    dist = SimpleNamespace(name="broken-plugins", version="9.9")
    point = SimpleNamespace(name="oops", value="tests.flows.no_such_plugin_module", dist=dist)
    calls = []

    def entry_points(group):
        calls.append(group)
        return [point]

    monkeypatch.setattr("importlib.metadata.entry_points", entry_points)
    monkeypatch.setattr(registry, "_entry_state", {"loaded": False, "error": None})
    with pytest.raises(PluginError, match=r"broken-plugins 9\.9.*tests\.flows\.no_such_plugin_module"):
        EDITORS.get("classical")
    with pytest.raises(PluginError, match="broken-plugins"):  # still refused, not imported again
        EDITORS.names()
    assert calls == [registry.ENTRY_POINT_GROUP]


def test_an_entry_point_module_registers_with_its_distribution_as_origin(monkeypatch):
    dist = SimpleNamespace(name="probe-plugins", version="1.2")
    point = SimpleNamespace(name="probe", value="tests.flows.plugin_editor", dist=dist)
    monkeypatch.setattr("importlib.metadata.entry_points", lambda group: [point])
    monkeypatch.setattr(registry, "_entry_state", {"loaded": False, "error": None})
    import sys

    before = next((p for p in EDITORS.registered() if p.name == "warm"), None)
    monkeypatch.delitem(sys.modules, "tests.flows.plugin_editor", raising=False)
    EDITORS.unregister("warm")
    try:
        assert EDITORS.get("warm").origin == "probe-plugins 1.2 (tests.flows.plugin_editor)"
        assert EDITORS.get("classical").origin == "built-in counterfactory.generation.editors.classical"
    finally:
        EDITORS.unregister("warm")
        if before is not None:  # as another test's import left it
            EDITORS._add(before)
        else:  # as if never imported: a later test's import registers it again
            sys.modules.pop("tests.flows.plugin_editor", None)


def test_plugin_sections_stay_out_of_the_study_hash_when_empty(tmp_path, specs_dir):
    spec = _spec(tmp_path, specs_dir)
    canonical = spec.canonical()
    assert "options" not in canonical["trials"] and "files" not in canonical["release"]
    with pytest.raises(SpecError, match="registered trial protocols.*'2afc'"):
        _spec(tmp_path, specs_dir, trials={"protocols": ["nope"]})
    with pytest.raises(SpecError, match="not one of trials.protocols"):
        _spec(tmp_path, specs_dir, trials={"protocols": ["mcq"], "options": {"2afc": {}}})
    with pytest.raises(SpecError, match="not a registered release file"):
        _spec(tmp_path, specs_dir, release={"name": "x", "files": {"nope.jsonl": {}}})
