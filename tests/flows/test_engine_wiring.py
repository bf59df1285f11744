"""The engine composes what the bottom layer cannot name (issue 46): the spec's upper sections
typed with their owners' models, the editor registry the ``editor`` section validates against,
the derived-file check every verifying command passes to ``verify``, and the list of registries."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from counterfactory.flows.engine import verify as engine_verify
from counterfactory.flows.engine.plugins import REGISTRIES
from counterfactory.flows.engine.spec import EditorConfig, NamedEditorConfig, Spec
from counterfactory.generation.align import AlignConfig
from counterfactory.generation.editors import EDITORS
from counterfactory.generation.masks import MaskOptions
from counterfactory.generation.prompts import PromptConfig
from counterfactory.generation.sampling import DesignConfig
from counterfactory.generation.sources import SourcesConfig
from counterfactory.manifests import hub
from counterfactory.manifests import spec as bottom
from counterfactory.manifests.release_files import RELEASE_FILES
from counterfactory.manifests.release_verify import verify_release
from counterfactory.manifests.trials import TRIAL_PROTOCOLS
from counterfactory.validation.gate_stack import GatesConfig
from counterfactory.validation.gates import GATES
from counterfactory.validation.release_derived import check_derived
from counterfactory.validation.scoring.registry import ANSWER_BACKENDS
from tests.manifests.hub_release import make_release


def test_the_spec_types_its_upper_sections_with_their_owners_models():
    owners = {
        "sources": SourcesConfig,
        "design": DesignConfig,
        "prompts": PromptConfig,
        "masks": MaskOptions,
        "align": AlignConfig,
        "gates": GatesConfig,
    }
    assert {name: Spec.model_fields[name].annotation for name in owners} == owners
    assert Spec.model_fields["editor"].annotation is EditorConfig
    assert EditorConfig.backends is EDITORS and NamedEditorConfig.backends is EDITORS


def test_the_editor_section_validates_backends_only_against_the_registry_it_is_given():
    # the bottom layer's own section knows no backend: it keeps what was written
    assert bottom.EditorConfig.backends is None
    assert bottom.EditorConfig.model_validate({"backend": "nowhere", "nowhere": {"x": 1}}).backend == "nowhere"
    with pytest.raises(ValidationError, match="one of the registered editor backends: "):
        EditorConfig.model_validate({"backend": "nowhere"})
    with pytest.raises(ValidationError, match="not a known field or registered editor backend"):
        EditorConfig.model_validate({"backend": "classical", "nowhere": {}})
    assert type(EditorConfig.model_validate({}).options()) is EDITORS.get("classical").options


def test_every_registry_is_listed_once():
    assert REGISTRIES == (EDITORS, GATES, TRIAL_PROTOCOLS, RELEASE_FILES, ANSWER_BACKENDS)
    assert {"classical", "qwen", "fal", "import"} <= set(EDITORS.names())
    assert {"openai", "fal", "transformers"} <= set(ANSWER_BACKENDS.names())
    assert {"2afc", "salary"} <= set(TRIAL_PROTOCOLS.names())


@pytest.mark.slow  # a release built and verified three times: ~3 s
def test_verify_runs_the_checks_it_is_handed_and_the_engine_hands_it_the_derived_one(tmp_path, monkeypatch):
    release = make_release(tmp_path)
    seen: list[tuple[Path, str]] = []

    def spy(path: Path, info: dict, written: dict) -> list[str]:
        seen.append((Path(path), str(info["name"])))
        return ["spy: a problem"]

    assert "spy: a problem" in verify_release(release, checks=[spy])
    assert seen == [(release, "study")]
    assert "spy: a problem" not in verify_release(release)
    assert engine_verify.DERIVED_CHECKS == (check_derived,)
    assert engine_verify.verify_release(release) == []
    # export, push and pull pass the same checks (and the card its editors' caveats)
    handed: dict[str, dict] = {}
    for name in ("export_release", "push_release", "pull_release"):
        monkeypatch.setattr(hub, name, lambda *a, _n=name, **kw: handed.setdefault(_n, kw))
    engine_verify.export_release(release, tmp_path / "x", repo_id="o/n")
    engine_verify.push_release(release, "o/n")
    engine_verify.pull_release("o/n@1.0.0", tmp_path / "y")
    assert {n: kw["checks"] for n, kw in handed.items()} == dict.fromkeys(handed, (check_derived,))
    assert len(handed) == 3
    assert handed["export_release"]["caveat_of"] is engine_verify.editor_caveat
    assert handed["push_release"]["caveat_of"] is engine_verify.editor_caveat
